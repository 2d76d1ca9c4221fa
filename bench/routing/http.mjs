/**
 * The routing policies over HTTP, end to end: the real router (`switchyard serve`)
 * in front of four real `sim` workers with prefix caches, once with
 * `SWITCHYARD_ROUTING_POLICY=least-loaded` and once with `score`, the same
 * request trace sent to both. Where bench/routing/run.ts simulates the decisions,
 * this measures what a client of the live router sees: time to first token (from
 * the send to the first content chunk, through the router), and the cache-hit ratio
 * from the workers' own `cached_tokens`.
 *
 * Workload: multi-turn conversations (3–8 rounds) under tenant system prompts
 * (`--tenants`, about 1,200 tokens each, Zipf-popular), opened at `--rate` requests
 * per second for `--duration` seconds (open loop, seeded; each conversation sends its
 * next round once the previous answer came back). Every request streams with
 * `include_usage`.
 *
 *   npm run build && node bench/routing/http.mjs                 # both policies, ~2 min
 *   node bench/routing/http.mjs --rate=12 --duration=60 --seed=7
 *   node bench/routing/http.mjs --policies=score,score+priority --max-running=2
 *
 * A policy `<name>+priority` starts the sims with `--scheduling-policy priority` and
 * registers them with `scheduling_policy: priority`, so the router sends each request
 * a `priority` (src/routing/prefill-order.ts) and the sims order their waiting queues
 * by it. `--max-running=N` limits each sim to N sequences at once, so that queues form
 * (without it, the sims run every request at once and order cannot matter);
 * `--prefill-concurrency=1` makes each sim's prefills share one lane instead, the
 * contention of an engine whose prefills share a compute budget. `--ttft-ms` (30) sets
 * the sims' base TTFT, and with it the prefill cost per uncached token (÷ 512).
 *
 * Workers: `--ttft-ms 30` (prefill 30/512 ms per uncached prompt token, so a cold
 * 1,200-token system prompt costs about 100 ms), `--tpot-ms 8`, a 40,000-token KV cache
 * each (room for about 30 tenants' prompts), all on CPU 1; the router on CPU 0.
 */
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs, TextDecoder } from 'node:util';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { fetch } from 'undici';
import { installCleanup, stopAll } from '../lib/procs.mjs';
import { startRouter, startSim } from '../lib/services.mjs';
import { admin, MODEL } from '../lib/setup.mjs';

const HERE = dirname(fileURLToPath(import.meta.url));
const { mulberry32 } = await import(join(HERE, '..', '..', 'dist', 'runtime', 'prng.js'));

const { values: opts } = parseArgs({
  options: {
    rate: { type: 'string', default: '10' },
    duration: { type: 'string', default: '45' },
    tenants: { type: 'string', default: '40' },
    workers: { type: 'string', default: '4' },
    seed: { type: 'string', default: '1' },
    policies: { type: 'string', default: 'least-loaded,score' },
    'max-running': { type: 'string', default: '' },
    'prefill-concurrency': { type: 'string', default: '' },
    'ttft-ms': { type: 'string', default: '30' },
  },
});
const RATE = Number(opts.rate);
const DURATION_S = Number(opts.duration);
const TENANTS = Number(opts.tenants);
const WORKERS = Number(opts.workers);
const SEED = Number(opts.seed);

const log = (m) => console.error(`bench: ${m}`);

/** A tenant's system prompt: distinct text of about 1,200 tokens. */
function systemPrompt(t) {
  let s = `You are the assistant of tenant ${t}. Follow these house rules. `;
  for (let i = 0; s.length < 4800; i++)
    s += `Rule ${t}.${i}: answer politely and cite policy ${(t * 131 + i * 17) % 997}. `;
  return s;
}

/** The trace: arrival times and, per arrival, a new conversation (tenant, rounds). */
function trace() {
  const rnd = mulberry32(SEED);
  const weights = Array.from({ length: TENANTS }, (_, i) => 1 / (i + 1));
  const total = weights.reduce((a, b) => a + b, 0);
  const pickTenant = () => {
    let x = rnd() * total;
    for (let i = 0; i < TENANTS; i++) if ((x -= weights[i]) <= 0) return i;
    return TENANTS - 1;
  };
  const out = [];
  // Conversations start at rate / mean rounds (5.5), so requests arrive at about `rate`.
  const startRate = RATE / 5.5;
  for (let t = 0; t < DURATION_S * 1000;) {
    t += (-Math.log(1 - rnd()) / startRate) * 1000;
    out.push({ at: t, tenant: pickTenant(), rounds: 3 + Math.floor(rnd() * 6), id: out.length });
  }
  return out;
}

async function register(routerUrl, token, sims, schedulingPolicy) {
  await admin(routerUrl, token, 'POST', '/models', { name: MODEL, context_window: 32768 });
  for (const [i, s] of sims.entries()) {
    await admin(routerUrl, token, 'POST', '/workers', {
      model: MODEL,
      tier: 'self_hosted',
      url: s.url,
      id: `w${i}`,
      scheduling_policy: schedulingPolicy,
    });
  }
  const p = await admin(routerUrl, token, 'POST', '/projects', {
    slug: 'rb',
    name: 'Routing bench',
    credit_cents: 1_000_000_000,
  });
  await admin(routerUrl, token, 'POST', `/projects/${p.id}/endpoints`, {
    slug: 'chat',
    name: 'Chat',
    model: MODEL,
    tier: 'self_hosted',
    max_requests_per_minute: 100_000_000,
    max_tokens_per_minute: 1_000_000_000,
  });
  const k = await admin(routerUrl, token, 'POST', `/projects/${p.id}/keys`, {
    scopes: ['inference'],
    quotaRequests: 1_000_000_000,
    quotaWindow: 60,
  });
  return { url: `${routerUrl}/${p.id}/chat/v1/chat/completions`, key: k.key };
}

/** One streamed request: TTFT (first content), usage, worker; never throws. */
async function stream(target, messages) {
  const t0 = performance.now();
  try {
    const r = await fetch(target.url, {
      method: 'POST',
      headers: { authorization: `Bearer ${target.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: MODEL,
        messages,
        max_tokens: 24,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
    if (r.status !== 200) return { ok: false, status: r.status };
    let ttft = null;
    let usage = null;
    let text = '';
    let buf = '';
    const dec = new TextDecoder();
    for await (const chunk of r.body) {
      buf += dec.decode(chunk, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = ev.startsWith('data: ') ? ev.slice(6) : null;
        if (!data || data === '[DONE]') continue;
        const j = JSON.parse(data);
        const c = j.choices?.[0]?.delta?.content;
        if (c) {
          if (ttft === null) ttft = performance.now() - t0;
          text += c;
        }
        if (j.usage) usage = j.usage;
      }
    }
    return { ok: true, ttft, usage, text, worker: r.headers.get('x-service-worker-id') };
  } catch (err) {
    return { ok: false, error: String(err) };
  }
}

async function runPolicy(policy, sims, conversations) {
  const dataDir = mkdtempSync(join(os.tmpdir(), 'switchyard-rbench-'));
  const token = randomBytes(24).toString('base64url');
  const [routing, order] = policy.split('+');
  const router = await startRouter({
    cpu: 0,
    dataDir,
    token,
    extraEnv: { SWITCHYARD_ROUTING_POLICY: routing },
  });
  const target = await register(
    router.url,
    token,
    sims,
    order === 'priority' ? 'priority' : 'fcfs',
  );
  const results = [];
  const t0 = performance.now();
  const convo = async (c) => {
    const messages = [{ role: 'system', content: systemPrompt(c.tenant) }];
    for (let round = 0; round < c.rounds; round++) {
      messages.push({ role: 'user', content: `Conversation ${c.id}, question ${round}.` });
      const r = await stream(target, messages);
      results.push({ ...r, round });
      if (!r.ok) return;
      messages.push({ role: 'assistant', content: r.text });
      await new Promise((res) => setTimeout(res, 200));
    }
  };
  const running = [];
  for (const c of conversations) {
    const wait = c.at - (performance.now() - t0);
    if (wait > 0) await new Promise((res) => setTimeout(res, wait));
    running.push(convo(c));
  }
  await Promise.all(running);
  const wall = (performance.now() - t0) / 1000;
  router.child.kill('SIGTERM');
  await new Promise((res) => router.child.once('exit', res));
  rmSync(dataDir, { recursive: true, force: true });
  return { results, wall };
}

function pct(sorted, p) {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

function summarize(policy, { results, wall }) {
  const ok = results.filter((r) => r.ok && r.ttft !== null);
  const ttfts = ok.map((r) => r.ttft).sort((a, b) => a - b);
  let prompt = 0;
  let cached = 0;
  for (const r of ok) {
    prompt += r.usage?.prompt_tokens ?? 0;
    cached += r.usage?.prompt_tokens_details?.cached_tokens ?? 0;
  }
  const perWorker = {};
  for (const r of ok) perWorker[r.worker] = (perWorker[r.worker] ?? 0) + 1;
  return {
    policy,
    requests: results.length,
    errors: results.length - ok.length,
    ttftP50: pct(ttfts, 50),
    ttftP90: pct(ttfts, 90),
    ttftP99: pct(ttfts, 99),
    cacheHit: prompt ? cached / prompt : 0,
    reqPerS: results.length / wall,
    perWorker,
  };
}

/** The sims' flags for a policy (`+priority`: ordered queues). */
function simArgs(policy) {
  return [
    ...['--ttft-ms', opts['ttft-ms'], '--tpot-ms', '8', '--kv-cache-tokens', '40000'],
    ...(opts['max-running'] ? ['--max-running', opts['max-running']] : []),
    ...(opts['prefill-concurrency'] ? ['--prefill-concurrency', opts['prefill-concurrency']] : []),
    ...(policy.endsWith('+priority') ? ['--scheduling-policy', 'priority'] : []),
  ];
}

installCleanup();
const started = new Date();
const conversations = trace();
log(
  `${conversations.length} conversations over ${DURATION_S} s, about ${RATE} req/s, ${TENANTS} tenants, seed ${SEED}`,
);
const rows = [];
try {
  for (const policy of opts.policies.split(',')) {
    // Fresh workers (empty caches, the policy's queue order) for each policy.
    await stopAll();
    log(`starting ${WORKERS} sim workers (CPU 1)`);
    const sims = [];
    for (let i = 0; i < WORKERS; i++) {
      sims.push(await startSim({ cpu: 1, simArgs: simArgs(policy) }));
    }
    log(`policy ${policy}`);
    rows.push(summarize(policy, await runPolicy(policy, sims, conversations)));
  }
} finally {
  await stopAll();
}

const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '–');
console.log(
  `\n| policy | requests | errors | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | cache hit | req/s | requests per worker |`,
);
console.log('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |');
for (const r of rows) {
  console.log(
    `| ${r.policy} | ${r.requests} | ${r.errors} | ${f(r.ttftP50)} | ${f(r.ttftP90)} | ${f(r.ttftP99)} | ${f(r.cacheHit * 100)} % | ${f(r.reqPerS)} | ${Object.entries(
      r.perWorker,
    )
      .sort()
      .map(([w, n]) => `${w} ${n}`)
      .join(', ')} |`,
  );
}
const out = join(
  HERE,
  '..',
  'results',
  `routing-http-${started.toISOString().replace(/[:.]/g, '-')}.json`,
);
mkdirSync(dirname(out), { recursive: true });
writeFileSync(
  out,
  JSON.stringify(
    {
      started,
      opts: {
        RATE,
        DURATION_S,
        TENANTS,
        WORKERS,
        SEED,
        maxRunning: opts['max-running'] || null,
        prefillConcurrency: opts['prefill-concurrency'] || null,
        ttftMs: Number(opts['ttft-ms']),
      },
      rows,
    },
    null,
    2,
  ),
);
log(`results written to ${out}`);
