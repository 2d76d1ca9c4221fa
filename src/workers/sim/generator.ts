/**
 * The sim worker's "model": a pure function from a chat request to the exact tokens
 * each choice will produce. Planning the whole output up front keeps generation
 * deterministic and lets the engine spend its time only on the timing model.
 *
 * Determinism: choice i draws from a mulberry32 PRNG seeded by the request `seed`
 * (when given) or a hash of the rendered prompt, mixed with i. `temperature` is
 * ignored, so equal requests always get equal text (temperature 0 included).
 *
 * Behaviour, decided in this order (markers are read from the last user message):
 * - reasoning (`[sim:reasoning]` or `reasoning_effort`): reasoning tokens come first
 *   (16/32/64 for low/medium/high, 32 for the marker alone).
 * - refusal (`[sim:refusal]`): a fixed refusal sentence; content null.
 * - tool calls (`tools` present, `tool_choice` not `none`, and either `tool_choice`
 *   `required`/named or `[sim:tool_call]` while the last message is not a tool
 *   result): one call to the named or first tool, two with `[sim:parallel]` unless
 *   `parallel_tool_calls` is false; arguments are placeholders satisfying the
 *   tool's `parameters` schema; finish_reason `tool_calls`.
 * - content otherwise: English-like sentences from a small word list; a JSON object
 *   under `response_format`; after a tool result, text quoting it; with
 *   `prediction`, the first half of the predicted tokens then new text;
 *   `[sim:emoji]` prefixes multi-byte text; `[sim:len=N]` makes exactly N content
 *   tokens; `ignore_eos` fills the whole budget.
 * - `stop` cuts content at the earliest stop string (finish_reason `stop`, the token
 *   holding the end of the stop string still counts); the token budget cuts
 *   everything after `max_tokens` tokens (finish_reason `length`).
 */
import { Buffer } from 'node:buffer';
import { hash53, tokenize } from './tokenizer.js';
import {
  contentText,
  type ChatMessage,
  type ChatRequest,
  type FinishReason,
  type JsonSchema,
  type LogprobEntry,
  type ToolDefinition,
  type TopLogprob,
} from './wire.js';
import { mulberry32 } from '../../runtime/prng.js';

export type TokenKind = 'content' | 'reasoning' | 'refusal' | 'tool';

export interface PlannedToken {
  kind: TokenKind;
  /** Text of the token; may be empty for a token trimmed by a stop string. */
  text: string;
  /** For `tool` tokens: index of the tool call. */
  tool?: number;
  /** For `tool` tokens: the first token of a call, carrying its id and name. */
  header?: boolean;
  logprob?: LogprobEntry;
}

export interface PlannedToolCall {
  index: number;
  id: string;
  name: string;
  arguments: string;
}

export interface ChoicePlan {
  index: number;
  tokens: PlannedToken[];
  finishReason: FinishReason;
  content: string | null;
  reasoning: string | null;
  refusal: string | null;
  toolCalls: PlannedToolCall[];
  reasoningTokens: number;
  acceptedPredictionTokens: number | null;
  rejectedPredictionTokens: number | null;
  /** Logprob entries of content and refusal tokens, when the request asked for them. */
  logprobs: { content: LogprobEntry[] | null; refusal: LogprobEntry[] | null } | null;
}

export interface PlanInput {
  request: ChatRequest;
  /** The rendered prompt, hashed for the seed when the request has none. */
  promptText: string;
  /** Completion budget in tokens (already resolved against the context window). */
  maxTokens: number;
}

export const REFUSAL_TEXT = "I'm sorry, but I can't help with that request.";
export const EMOJI_TEXT = 'héllo 🚀 世界!';

const WORDS = [
  'the',
  'quick',
  'model',
  'answers',
  'every',
  'question',
  'with',
  'care',
  'and',
  'a',
  'simple',
  'plan',
  'river',
  'stone',
  'light',
  'garden',
  'signal',
  'window',
  'bright',
  'calm',
  'system',
  'router',
  'token',
  'stream',
  'cache',
  'prefix',
  'worker',
  'queue',
  'request',
  'reply',
  'under',
  'over',
  'near',
  'far',
  'green',
  'silver',
  'morning',
  'evening',
  'paper',
  'engine',
  'moves',
  'waits',
  'builds',
  'reads',
  'writes',
  'sends',
  'keeps',
  'finds',
  'makes',
  'shows',
  'small',
  'large',
  'early',
  'late',
  'clear',
  'steady',
  'open',
  'quiet',
  'north',
  'south',
  'of',
  'to',
  'in',
  'on',
];

export function requestSeed(request: ChatRequest, promptText: string): number {
  if (typeof request.seed === 'number') return hash53(`seed:${request.seed}`) % 4294967296;
  return hash53(promptText) % 4294967296;
}

export interface Markers {
  toolCall: boolean;
  parallel: boolean;
  refusal: boolean;
  reasoning: boolean;
  emoji: boolean;
  len: number | undefined;
}

export function readMarkers(text: string): Markers {
  const len = /\[sim:len=(\d+)\]/.exec(text);
  return {
    toolCall: text.includes('[sim:tool_call]'),
    parallel: text.includes('[sim:parallel]'),
    refusal: text.includes('[sim:refusal]'),
    reasoning: text.includes('[sim:reasoning]'),
    emoji: text.includes('[sim:emoji]'),
    len: len ? Number(len[1]) : undefined,
  };
}

function pick<T>(rng: () => number, items: readonly T[]): T {
  return items[Math.floor(rng() * items.length)]!;
}

function sentence(rng: () => number): string {
  const n = 5 + Math.floor(rng() * 10);
  let s = '';
  for (let i = 0; i < n; i++) {
    const w = pick(rng, WORDS);
    s += i === 0 ? w[0]!.toUpperCase() + w.slice(1) : ` ${w}`;
  }
  return `${s}.`;
}

/**
 * Tokens of `lead` followed by sentences, exactly `target` tokens when given, else
 * 1-3 whole sentences. Segments after the first start with a space, so tokenizing
 * them one by one equals tokenizing the joined text.
 */
function textTokens(rng: () => number, lead: string, target: number | undefined): string[] {
  const out = lead ? tokenize(lead) : [];
  if (target === undefined) {
    const sentences = 1 + Math.floor(rng() * 3);
    for (let i = 0; i < sentences; i++)
      out.push(...tokenize(out.length ? ` ${sentence(rng)}` : sentence(rng)));
    return out;
  }
  while (out.length < target)
    out.push(...tokenize(out.length ? ` ${sentence(rng)}` : sentence(rng)));
  out.length = target;
  return out;
}

/**
 * The most characters (`minLength`) or items (`minItems`) a placeholder gets: the
 * answer is cut at `max_tokens` anyway, and a schema asking for 10^9 used to build
 * the whole value first (a stalled worker, then a RangeError).
 */
const FILL_CAP = 256;

/** A value satisfying simple JSON schemas: required properties only, typed placeholders. */
export function fillSchema(schema: JsonSchema | undefined, depth = 0): unknown {
  if (!schema || depth > 8) return {};
  if ('const' in schema) return schema.const;
  if (schema.default !== undefined) return schema.default;
  if (schema.enum && schema.enum.length > 0) return schema.enum[0];
  const alternatives = schema.anyOf ?? schema.oneOf;
  if (alternatives && alternatives.length > 0) {
    const nonNull = alternatives.find((s) => s.type !== 'null') ?? alternatives[0];
    return fillSchema(nonNull, depth + 1);
  }
  if (schema.allOf && schema.allOf.length > 0) {
    const merged: Record<string, unknown> = {};
    for (const part of schema.allOf) {
      const v = fillSchema(part, depth + 1);
      if (typeof v === 'object' && v !== null && !Array.isArray(v)) Object.assign(merged, v);
    }
    return merged;
  }
  let type = Array.isArray(schema.type)
    ? (schema.type.find((t) => t !== 'null') ?? 'null')
    : schema.type;
  if (type === undefined) type = schema.properties ? 'object' : schema.items ? 'array' : 'string';
  switch (type) {
    case 'string': {
      const byFormat: Record<string, string> = {
        'date-time': '2026-01-01T00:00:00Z',
        date: '2026-01-01',
        time: '00:00:00',
        email: 'sim@example.com',
        uri: 'https://example.com/sim',
        uuid: '00000000-0000-4000-8000-000000000000',
      };
      const s = (schema.format && byFormat[schema.format]) || 'sim';
      const min = Math.min(schema.minLength ?? 0, FILL_CAP);
      return s.length >= min ? s : s.padEnd(min, 'm');
    }
    case 'integer':
    case 'number': {
      let n = 1;
      if (schema.minimum !== undefined && n < schema.minimum) n = schema.minimum;
      if (schema.exclusiveMinimum !== undefined && n <= schema.exclusiveMinimum)
        n = schema.exclusiveMinimum + 1;
      if (schema.maximum !== undefined && n > schema.maximum) n = schema.maximum;
      return type === 'integer' ? Math.ceil(n) : n;
    }
    case 'boolean':
      return true;
    case 'null':
      return null;
    case 'array': {
      const count = Math.min(Math.max(1, schema.minItems ?? 1), FILL_CAP);
      return Array.from({ length: count }, () =>
        fillSchema(schema.items ?? { type: 'string' }, depth + 1),
      );
    }
    case 'object': {
      const out: Record<string, unknown> = {};
      for (const key of schema.required ?? []) {
        out[key] = fillSchema(schema.properties?.[key] ?? { type: 'string' }, depth + 1);
      }
      return out;
    }
    default:
      return 'sim';
  }
}

function hex(rng: () => number, chars: number): string {
  let s = '';
  while (s.length < chars)
    s += Math.floor(rng() * 4294967296)
      .toString(16)
      .padStart(8, '0');
  return s.slice(0, chars);
}

function toolTargets(req: ChatRequest, last: ChatMessage, markers: Markers): ToolDefinition[] {
  const tools = req.tools ?? [];
  const choice = req.tool_choice;
  if (tools.length === 0 || choice === 'none') return [];
  const named =
    typeof choice === 'object' && choice !== null
      ? tools.find((t) => t.function.name === choice.function.name)
      : undefined;
  const forced = choice === 'required' || named !== undefined;
  // The marker only asks for a call on a fresh turn; after a tool result the model
  // answers in text, so a tool round trip terminates.
  const asked = markers.toolCall && last.role !== 'tool';
  if (!forced && !asked) return [];
  const first = named ?? tools[0]!;
  if (markers.parallel && req.parallel_tool_calls !== false) {
    return [first, named ?? tools[1] ?? first];
  }
  return [first];
}

/** Cuts content at the earliest stop string; returns null when none occurs. */
function cutAtStop(tokens: string[], stops: string[]): string[] | null {
  if (stops.length === 0) return null;
  const text = tokens.join('');
  let cut = -1;
  let end = -1;
  for (const s of stops) {
    if (s === '') continue;
    const i = text.indexOf(s);
    if (i >= 0 && (cut < 0 || i < cut)) {
      cut = i;
      end = i + s.length;
    }
  }
  if (cut < 0) return null;
  // Keep every token up to the one completing the stop string (the engine had to
  // generate it to see the stop), but only the text before the stop string.
  const out: string[] = [];
  let off = 0;
  for (const t of tokens) {
    if (off >= end) break;
    out.push(off >= cut ? '' : off + t.length <= cut ? t : t.slice(0, cut - off));
    off += t.length;
  }
  return out;
}

function utf8Bytes(s: string): number[] {
  return Array.from(Buffer.from(s, 'utf8'));
}

function round4(x: number): number {
  return Math.round(x * 10000) / 10000;
}

function logprobEntry(token: string, rng: () => number, top: number): LogprobEntry {
  // rng()*rng() skews toward 0: most sampled tokens are confident, a few are not.
  const logprob = -round4(rng() * rng() * 3);
  const entry: LogprobEntry = { token, logprob, bytes: utf8Bytes(token), top_logprobs: [] };
  if (top <= 0) return entry;
  entry.top_logprobs.push({ token, logprob, bytes: entry.bytes });
  const seen = new Set([token]);
  for (let j = 1; j < top; j++) {
    let alt = ` ${pick(rng, WORDS).slice(0, 3)}`;
    while (seen.has(alt)) alt += 's';
    seen.add(alt);
    const alp: TopLogprob = {
      token: alt,
      logprob: round4(logprob - 0.5 - 0.75 * j - rng() * 0.25),
      bytes: utf8Bytes(alt),
    };
    entry.top_logprobs.push(alp);
  }
  return entry;
}

function lastUserText(messages: ChatMessage[]): string {
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i]!.role === 'user') return contentText(messages[i]!.content);
  }
  return '';
}

const REASONING_BUDGET: Record<string, number> = { low: 16, medium: 32, high: 64 };

function planChoice(input: PlanInput, index: number, seed: number): ChoicePlan {
  const req = input.request;
  const rng = mulberry32((seed + Math.imul(index, 0x9e3779b9)) >>> 0);
  const messages = req.messages;
  const last = messages[messages.length - 1]!;
  const markers = readMarkers(lastUserText(messages));

  const reasoningWanted = markers.reasoning || typeof req.reasoning_effort === 'string';
  const reasoningTarget = REASONING_BUDGET[req.reasoning_effort ?? ''] ?? 32;
  const reasoning = reasoningWanted
    ? textTokens(rng, 'Let me think this through step by step.', reasoningTarget)
    : [];

  let finishReason: FinishReason = 'stop';
  let body: PlannedToken[];
  const targets = markers.refusal ? [] : toolTargets(req, last, markers);
  const calls: PlannedToolCall[] = targets.map((t, i) => ({
    index: i,
    id: `chatcmpl-tool-${hex(rng, 32)}`,
    name: t.function.name,
    arguments: JSON.stringify(fillSchema(t.function.parameters ?? { type: 'object' })),
  }));

  if (markers.refusal) {
    body = tokenize(REFUSAL_TEXT).map((text) => ({ kind: 'refusal', text }));
  } else if (calls.length > 0) {
    finishReason = 'tool_calls';
    body = [];
    for (const c of calls) {
      body.push({ kind: 'tool', text: c.name, tool: c.index, header: true });
      for (const text of tokenize(c.arguments)) body.push({ kind: 'tool', text, tool: c.index });
    }
  } else {
    const budget = Math.max(0, input.maxTokens - reasoning.length);
    let content: string[];
    const format = req.response_format?.type;
    if (format === 'json_object') {
      content = tokenize(JSON.stringify({ answer: sentence(rng) }));
    } else if (req.response_format?.type === 'json_schema') {
      content = tokenize(JSON.stringify(fillSchema(req.response_format.json_schema.schema)));
    } else {
      const leads: string[] = [];
      if (markers.emoji) leads.push(EMOJI_TEXT);
      if (last.role === 'tool') leads.push(`Tool result: ${contentText(last.content)}.`);
      // `[sim:len=N]` past the budget is cut there like any answer (budget + 1 keeps
      // the finish reason `length`); a marker of 10^11 used to build all of it first.
      const target =
        markers.len !== undefined
          ? Math.min(markers.len, budget + 1)
          : req.ignore_eos
            ? budget
            : undefined;
      if (req.prediction) {
        // Half the prediction is "accepted" verbatim, then the model diverges; the
        // continuation starts with a space so its tokens stand alone.
        const predicted = tokenize(contentText(req.prediction.content));
        const kept = predicted.slice(0, Math.ceil(predicted.length / 2));
        const rest = tokenize(` ${textTokens(rng, '', undefined).join('')}`);
        content = [...kept, ...rest];
        if (target !== undefined) {
          while (content.length < target) content.push(...tokenize(` ${sentence(rng)}`));
          content.length = target;
        }
      } else {
        content = textTokens(rng, leads.join(' '), target);
      }
    }
    const stops =
      req.stop === undefined || req.stop === null
        ? []
        : typeof req.stop === 'string'
          ? [req.stop]
          : req.stop;
    content = cutAtStop(content, stops) ?? content;
    body = content.map((text) => ({ kind: 'content', text }));
  }

  let tokens: PlannedToken[] = [
    ...reasoning.map((text): PlannedToken => ({ kind: 'reasoning', text })),
    ...body,
  ];
  if (tokens.length > input.maxTokens) {
    tokens = tokens.slice(0, input.maxTokens);
    finishReason = 'length';
  } else if (req.ignore_eos && finishReason === 'stop' && tokens.length === input.maxTokens) {
    finishReason = 'length';
  }

  // Assemble the message fields from the surviving tokens.
  let contentOut = '';
  let reasoningText = '';
  let refusalText = '';
  let reasoningTokens = 0;
  const args = new Map<number, string>();
  for (const t of tokens) {
    if (t.kind === 'content') {
      contentOut += t.text;
    } else if (t.kind === 'reasoning') {
      reasoningText += t.text;
      reasoningTokens++;
    } else if (t.kind === 'refusal') {
      refusalText += t.text;
    } else if (t.tool !== undefined) {
      args.set(t.tool, t.header ? '' : (args.get(t.tool) ?? '') + t.text);
    }
  }
  const toolCalls = calls
    .filter((c) => args.has(c.index))
    .map((c) => ({ ...c, arguments: args.get(c.index)! }));
  const isRefusal = markers.refusal;
  const isTools = calls.length > 0;

  let logprobs: ChoicePlan['logprobs'] = null;
  if (req.logprobs) {
    const lrng = mulberry32((seed ^ 0x5bd1e995) + index);
    const top = req.top_logprobs ?? 0;
    const content: LogprobEntry[] = [];
    const refusal: LogprobEntry[] = [];
    for (const t of tokens) {
      if ((t.kind !== 'content' && t.kind !== 'refusal') || t.text === '') continue;
      t.logprob = logprobEntry(t.text, lrng, top);
      (t.kind === 'content' ? content : refusal).push(t.logprob);
    }
    logprobs = {
      content: content.length > 0 ? content : null,
      refusal: refusal.length > 0 ? refusal : null,
    };
  }

  let accepted: number | null = null;
  let rejected: number | null = null;
  if (req.prediction) {
    const predicted = tokenize(contentText(req.prediction.content));
    const produced = tokens.filter((t) => t.kind === 'content');
    let n = 0;
    while (n < predicted.length && n < produced.length && produced[n]!.text === predicted[n]) n++;
    accepted = n;
    rejected = predicted.length - n;
  }

  return {
    index,
    tokens,
    finishReason,
    content: isRefusal || isTools ? null : contentOut,
    reasoning: reasoningWanted ? reasoningText : null,
    refusal: isRefusal ? refusalText : null,
    toolCalls,
    reasoningTokens,
    acceptedPredictionTokens: accepted,
    rejectedPredictionTokens: rejected,
    logprobs,
  };
}

/** Plans every choice of a request (`n` of them). */
export function planChoices(input: PlanInput): ChoicePlan[] {
  const seed = requestSeed(input.request, input.promptText);
  const n = input.request.n ?? 1;
  const plans: ChoicePlan[] = [];
  for (let i = 0; i < n; i++) plans.push(planChoice(input, i, seed));
  return plans;
}
