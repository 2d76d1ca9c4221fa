/**
 * Arrival traces for bench/routing, generated once per (workload, seed) from a seeded
 * PRNG and replayed unchanged under every policy. Open loop: every arrival time is
 * fixed in advance (a later chat round does not wait for the previous answer).
 *
 * Each request is tokenized once, the way the worker sees it (sim chat template and
 * tokenizer, 16-token block keys) and the way the router sees it (canonical messages
 * cut into 64- and 16-character blocks), so every policy pays the same prompt.
 */
import { PrefixIndex, renderForIndex, type PromptBlocks } from '../../src/routing/prefix-index.js';
import type { ServiceTierHint, SloTargets } from '../../src/routing/slo.js';
import { renderPrompt, tokenizePrompt } from '../../src/workers/sim/tokenizer.js';
import type { ChatMessage } from '../../src/workers/sim/wire.js';

import { mulberry32, type Rng } from '../../src/runtime/prng.js';

const exp = (rng: Rng, mean: number): number => -Math.log(1 - rng()) * mean;
const uniform = (rng: Rng, lo: number, hi: number): number => lo + rng() * (hi - lo);
const int = (rng: Rng, lo: number, hi: number): number => Math.floor(uniform(rng, lo, hi + 1));

const VOCAB: string[] = (() => {
  const rng = mulberry32(12345);
  const letters = 'abcdefghijklmnopqrstuvwxyz';
  const out: string[] = [];
  for (let i = 0; i < 4000; i++) {
    let w = '';
    const n = int(rng, 2, 9);
    for (let j = 0; j < n; j++) w += letters[Math.floor(rng() * 26)];
    out.push(w);
  }
  return out;
})();

/** Random words worth about `tokens` sim tokens. */
function text(rng: Rng, tokens: number): string {
  const words: string[] = [];
  let t = 0;
  while (t < tokens) {
    const w = VOCAB[Math.floor(rng() * VOCAB.length)]!;
    words.push(w);
    t += Math.ceil((w.length + 1) / 4);
  }
  return words.join(' ');
}

export interface TraceRequest {
  id: number;
  at: number;
  promptTokens: number;
  blockKeys: number[];
  /** 64-character blocks (Switchyard, llm-d) and 16-character blocks (SGLang's tree). */
  blocks64: PromptBlocks;
  blocks16: PromptBlocks;
  outTokens: number;
  slo: SloTargets;
  tier: ServiceTierHint;
  /** What goodput counts as success: the request's own SLO, else the workload's. */
  goal: { ttftMs: number; tpotMs: number };
}

export interface Workload {
  name: string;
  prefixHeavy: boolean;
  durationMs: number;
  requests: TraceRequest[];
}

/** Goodput targets for requests that send no SLO header (the router never sees these). */
export const DEFAULT_GOAL = { ttftMs: 1000, tpotMs: 60 };

const idx64 = new PrefixIndex({ blockChars: 64 });
const idx16 = new PrefixIndex({ blockChars: 16 });

interface Draft {
  at: number;
  messages: ChatMessage[];
  outTokens: number;
  slo?: SloTargets;
  tier?: ServiceTierHint;
}

function finish(name: string, prefixHeavy: boolean, durationMs: number, drafts: Draft[]): Workload {
  drafts.sort((a, b) => a.at - b.at);
  const requests = drafts
    .filter((d) => d.at < durationMs)
    .map((d, id): TraceRequest => {
      const tp = tokenizePrompt(renderPrompt(d.messages), 16);
      const indexText = renderForIndex(d.messages);
      const slo = d.slo ?? {};
      return {
        id,
        at: d.at,
        promptTokens: tp.tokens,
        blockKeys: tp.blockKeys,
        blocks64: idx64.blocks(indexText),
        blocks16: idx16.blocks(indexText),
        outTokens: d.outTokens,
        slo,
        tier: d.tier ?? 'default',
        goal: {
          ttftMs: slo.ttftMs ?? DEFAULT_GOAL.ttftMs,
          tpotMs: slo.tpotMs ?? DEFAULT_GOAL.tpotMs,
        },
      };
    });
  return { name, prefixHeavy, durationMs, requests };
}

interface ChatOptions {
  sessionRate: number;
  thinkMs: [number, number];
  bursty?: boolean;
  tiers?: boolean;
}

/** Multi-round chats sharing one 1,000-token system prompt. */
function chatSessions(rng: Rng, durationMs: number, o: ChatOptions, out: Draft[]): void {
  const system = text(rng, 1000);
  let t = 0;
  for (;;) {
    // Bursty: session starts at 4× the rate for 2 s in every 10 s, 0.25× otherwise.
    const rate = o.bursty ? (t % 10_000 < 2000 ? 4 : 0.25) * o.sessionRate : o.sessionRate;
    t += exp(rng, 1000 / rate);
    if (t >= durationMs) break;
    const rounds = int(rng, 2, 8);
    const messages: ChatMessage[] = [{ role: 'system', content: system }];
    const tier = o.tiers ? pickTier(rng) : 'default';
    const slo = o.tiers ? pickSlo(rng) : undefined;
    let at = t;
    for (let r = 0; r < rounds; r++) {
      messages.push({ role: 'user', content: text(rng, int(rng, 30, 200)) });
      const outTokens = int(rng, 50, 300);
      out.push({ at, messages: [...messages], outTokens, tier, ...(slo ? { slo } : {}) });
      messages.push({ role: 'assistant', content: text(rng, outTokens) });
      at += uniform(rng, o.thinkMs[0], o.thinkMs[1]);
    }
  }
}

/** Single requests from tenants with long system prompts, Zipf(1) popularity. */
function tenantRequests(
  rng: Rng,
  durationMs: number,
  rate: number,
  o: { tenants: number; tiers?: boolean },
  out: Draft[],
): void {
  const systems = Array.from({ length: o.tenants }, () => text(rng, int(rng, 1500, 4000)));
  const weights = systems.map((_, i) => 1 / (i + 1));
  const total = weights.reduce((a, b) => a + b, 0);
  let t = 0;
  for (;;) {
    t += exp(rng, 1000 / rate);
    if (t >= durationMs) break;
    let x = rng() * total;
    let k = 0;
    while (k < systems.length - 1 && x >= weights[k]!) x -= weights[k++]!;
    out.push({
      at: t,
      messages: [
        { role: 'system', content: systems[k]! },
        { role: 'user', content: text(rng, int(rng, 50, 300)) },
      ],
      outTokens: int(rng, 30, 200),
      ...(o.tiers ? { tier: pickTier(rng), slo: pickSlo(rng) } : {}),
    });
  }
}

/** 20 % priority, 30 % flex, 50 % default. */
function pickTier(rng: Rng): ServiceTierHint {
  const x = rng();
  return x < 0.2 ? 'priority' : x < 0.5 ? 'flex' : 'default';
}

/** 30 % send X-SLO-TTFT-Ms (250 or 500), 10 % X-SLO-TPOT-Ms 50. */
function pickSlo(rng: Rng): SloTargets {
  const slo: SloTargets = {};
  const x = rng();
  if (x < 0.15) slo.ttftMs = 250;
  else if (x < 0.3) slo.ttftMs = 500;
  if (rng() < 0.1) slo.tpotMs = 50;
  return slo;
}

export const WORKLOADS = ['chat', 'tenants', 'prefix-free', 'bursty', 'slo-mix'] as const;
export type WorkloadName = (typeof WORKLOADS)[number];

export function makeWorkload(name: WorkloadName, seed: number, durationMs: number): Workload {
  const rng = mulberry32(seed * 7919 + name.length * 104729 + name.charCodeAt(0));
  const drafts: Draft[] = [];
  switch (name) {
    case 'chat':
      chatSessions(rng, durationMs, { sessionRate: 2.8, thinkMs: [3000, 12_000] }, drafts);
      return finish(name, true, durationMs, drafts);
    case 'tenants':
      tenantRequests(rng, durationMs, 14, { tenants: 80 }, drafts);
      return finish(name, true, durationMs, drafts);
    case 'bursty':
      chatSessions(
        rng,
        durationMs,
        { sessionRate: 2.8, thinkMs: [1000, 4000], bursty: true },
        drafts,
      );
      return finish(name, true, durationMs, drafts);
    case 'slo-mix':
      chatSessions(
        rng,
        durationMs,
        { sessionRate: 1.4, thinkMs: [3000, 12_000], tiers: true },
        drafts,
      );
      tenantRequests(rng, durationMs, 7, { tenants: 80, tiers: true }, drafts);
      return finish(name, true, durationMs, drafts);
    case 'prefix-free': {
      let t = 0;
      for (;;) {
        t += exp(rng, 1000 / 10);
        if (t >= durationMs) break;
        drafts.push({
          at: t,
          messages: [{ role: 'user', content: text(rng, int(rng, 300, 2000)) }],
          outTokens: int(rng, 50, 300),
        });
      }
      return finish(name, false, durationMs, drafts);
    }
  }
}
