/**
 * Reframing: turns what an upstream OpenAI-compatible worker (vLLM, SGLang,
 * llama.cpp server, Ollama, our sim) returned into exactly the spec's shapes.
 *
 * Upstream payloads are `unknown` and narrowed field by field; only the spec's
 * fields are copied into fresh objects, so upstream extras (`reasoning_content`,
 * `reasoning`, `stop_reason`, `token_ids`, `timings`, logprob `id`s, tool-call
 * `index` in messages, ...) never reach a client. Invariants of the output:
 *  - `id`, `created`, `model` and `service_tier` are ours (request id, endpoint
 *    model and tier); `system_fingerprint` is upstream's or null; on every chunk;
 *  - a delta carries only `role`, `content`, `refusal`, `tool_calls`; reasoning
 *    text is dropped, and so are logprob entries that could spell it out;
 *  - usage always has every detail field, `total_tokens` is recomputed as the sum,
 *    `cached_tokens` is an integer, other details are null unless reported;
 *  - a response message has `content` null only next to tool calls or a refusal,
 *    `tool_calls` null unless there are calls, `annotations` [].
 *
 * Everything here is a pure function of its arguments except `StreamAccumulator`,
 * which holds one stream's running state (usage, time to first token, finish
 * reasons) so the caller can bill a stream even when the client disconnects. It
 * takes time as arguments instead of reading a clock.
 *
 * Hot path: this runs per chunk on thousands of streams, so there is no JSON
 * round trip, no spread or `Object.keys` over upstream objects, and arrays from
 * upstream (logprob `bytes`) are reused when already valid.
 */
import { ServiceError } from '../errors/index.js';

export type ServiceTierName = 'free' | 'cpu' | 'gpu' | 'self_hosted';
export type FinishReason = 'stop' | 'length' | 'tool_calls' | 'content_filter' | 'function_call';

/** Per-request facts the output takes from us rather than from the worker. */
export interface ReframeContext {
  /** Our request id; equals the `X-Request-ID` header. */
  readonly id: string;
  /** Unix seconds. */
  readonly created: number;
  /** The endpoint's configured model name. */
  readonly model: string;
  /** The endpoint's tier. */
  readonly serviceTier: ServiceTierName;
  /**
   * The request's `top_logprobs`; longer upstream lists are cut to it. Omitted
   * with `logprobs: true` it means 0 (OpenAI's default), whatever the engine's
   * own default is (llama.cpp's server sends 20).
   */
  readonly topLogprobs?: number;
  /**
   * The request's `logprobs: true`: a non-streaming choice then always carries the
   * logprobs object, `content` null when there are no content tokens (spec), even
   * when the worker sent none (an answer of tool calls only).
   */
  readonly logprobs?: boolean;
  /**
   * The request's `n`: a stream forwards choices 0 to n - 1 only (a worker's other
   * indexes are choices nobody asked for), a completion keeps its first n choices.
   * Unset: every choice.
   */
  readonly choices?: number;
  /** Whether the request carried `prediction`; prediction-token counts are null otherwise. */
  readonly predictionUsed?: boolean;
  /** Router-side prompt estimate, used only when the worker reports no usage. */
  readonly promptTokensEstimate?: number;
  /**
   * The request's `stream_options.include_usage`: every chunk but the final usage
   * chunk then carries `usage: null`, as OpenAI's do (its stream schema: "When
   * present, it contains a null value except for the last chunk"); without it no
   * chunk has the field.
   */
  readonly includeUsage?: boolean;
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: {
    cached_tokens: number;
    audio_tokens: number | null;
  };
  completion_tokens_details: {
    reasoning_tokens: number | null;
    audio_tokens: number | null;
    accepted_prediction_tokens: number | null;
    rejected_prediction_tokens: number | null;
  };
}

export interface TopLogprob {
  token: string;
  logprob: number;
  bytes: number[] | null;
}

export interface TokenLogprob extends TopLogprob {
  top_logprobs: TopLogprob[];
}

export interface ChoiceLogprobs {
  content: TokenLogprob[] | null;
  refusal: TokenLogprob[] | null;
}

export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export interface ToolCallDelta {
  index: number;
  id?: string;
  type?: 'function';
  function?: { name?: string; arguments?: string };
}

export interface ChunkDelta {
  role?: 'assistant';
  content?: string;
  refusal?: string;
  tool_calls?: ToolCallDelta[];
}

export interface ChunkChoice {
  index: number;
  delta: ChunkDelta;
  logprobs: ChoiceLogprobs | null;
  finish_reason: FinishReason | null;
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  service_tier: ServiceTierName;
  system_fingerprint: string | null;
  choices: ChunkChoice[];
  usage?: Usage | null;
}

export interface ResponseMessage {
  role: 'assistant';
  content: string | null;
  refusal: string | null;
  tool_calls: ToolCall[] | null;
  annotations: never[];
}

export interface CompletionChoice {
  index: number;
  message: ResponseMessage;
  finish_reason: FinishReason;
  logprobs: ChoiceLogprobs | null;
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: CompletionChoice[];
  usage: Usage;
  service_tier: ServiceTierName;
  system_fingerprint: string | null;
}

/**
 * What to do with `delta.role`. `forward`: emit `role: 'assistant'` where the
 * upstream delta had a role. `ensure`: emit it on this chunk whatever upstream
 * did (the first chunk of a stream). `drop`: never (the role was already sent;
 * Ollama repeats it on every chunk).
 */
export type RolePolicy = 'forward' | 'ensure' | 'drop';

type Obj = Record<string, unknown>;

function asObj(v: unknown): Obj | undefined {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Obj) : undefined;
}

function asString(v: unknown): string | undefined {
  return typeof v === 'string' ? v : undefined;
}

/** A token count: a finite number, truncated and floored at 0. */
/**
 * The largest token count taken from a worker: the usage table's integer columns
 * hold no more, and no model's context comes near it. A larger one is not a count.
 */
const MAX_COUNT = 2 ** 31 - 1;

function asCount(v: unknown): number | undefined {
  return typeof v === 'number' && Number.isFinite(v) && v <= MAX_COUNT
    ? v > 0
      ? Math.floor(v)
      : 0
    : undefined;
}

/** A number where a count belongs, but none a worker could have counted. */
function impossibleCount(v: unknown): boolean {
  return typeof v === 'number' && !(v <= MAX_COUNT);
}

/** A count that is only meaningful when positive (audio tokens of a text model). */
function positiveCount(v: unknown): number | null {
  const n = asCount(v);
  return n === undefined || n === 0 ? null : n;
}

function asIndex(v: unknown, fallback: number): number {
  return typeof v === 'number' && Number.isInteger(v) && v >= 0 ? v : fallback;
}

/** Message text: a string, or content parts (`[{type: 'text', text}]`) joined. */
function textOf(v: unknown): string | undefined {
  if (typeof v === 'string') return v;
  if (!Array.isArray(v)) return undefined;
  let s = '';
  for (let i = 0; i < v.length; i++) {
    const part = asObj(v[i]);
    const t = part === undefined ? undefined : asString(part.text);
    if (t !== undefined) s += t;
  }
  return s;
}

/** Length of the reasoning text a message or delta carried under any known name. */
function reasoningLength(m: Obj): number {
  const r = m.reasoning_content ?? m.reasoning ?? m.thinking;
  return typeof r === 'string' ? r.length : 0;
}

/** Tool-call arguments are a JSON string; some workers send the parsed object. */
function argumentsOf(v: unknown): string | undefined {
  if (typeof v === 'string') return v;
  if (v === undefined || v === null) return undefined;
  return JSON.stringify(v);
}

// ---------------------------------------------------------------------------
// finish_reason

/**
 * Maps a worker's finish reason onto the spec's vocabulary; null when absent.
 * llama.cpp's native names and Anthropic-style names are folded in; anything
 * else (vLLM's `abort`, `error`, ...) ended the generation, so it reads `stop`.
 */
export function normalizeFinishReason(v: unknown): FinishReason | null {
  switch (v) {
    case 'stop':
    case 'length':
    case 'tool_calls':
    case 'content_filter':
    case 'function_call':
      return v;
    case 'max_tokens':
    case 'limit':
      return 'length';
    case 'tool_call':
    case 'tool_use':
      return 'tool_calls';
    default:
      return typeof v === 'string' && v !== '' ? 'stop' : null;
  }
}

// ---------------------------------------------------------------------------
// logprobs

const FLOOR_LOGPROB = -9999;

/** vLLM floors -inf at -9999; llama.cpp may send `prob` instead of `logprob`. */
function logprobOf(e: Obj): number {
  const lp = e.logprob;
  if (typeof lp === 'number') return Number.isFinite(lp) ? lp : FLOOR_LOGPROB;
  const p = e.prob;
  if (typeof p === 'number' && p > 0 && p <= 1) return Math.log(p);
  return FLOOR_LOGPROB;
}

/** UTF-8 bytes of a token, reusing upstream's array when it is valid. */
function bytesOf(v: unknown): number[] | null {
  if (!Array.isArray(v)) return null;
  for (let i = 0; i < v.length; i++) {
    const b: unknown = v[i];
    if (typeof b !== 'number' || !Number.isInteger(b) || b < 0 || b > 255) return null;
  }
  return v as number[];
}

/** How many alternatives a token may keep: the request's `top_logprobs`, 0 when it omitted it. */
function topLimit(ctx: ReframeContext): number | undefined {
  return ctx.topLogprobs ?? (ctx.logprobs === true ? 0 : undefined);
}

function topLogprobsOf(v: unknown, limit: number | undefined): TopLogprob[] {
  if (!Array.isArray(v)) return [];
  const n = limit === undefined ? v.length : Math.min(v.length, limit);
  const out: TopLogprob[] = [];
  for (let i = 0; i < n; i++) {
    const e = asObj(v[i]);
    if (e === undefined) continue;
    const token = asString(e.token);
    if (token === undefined) continue;
    out.push({ token, logprob: logprobOf(e), bytes: bytesOf(e.bytes) });
  }
  return out;
}

function entriesOf(v: unknown, limit: number | undefined): TokenLogprob[] | null {
  if (!Array.isArray(v) || v.length === 0) return null;
  const out: TokenLogprob[] = [];
  for (let i = 0; i < v.length; i++) {
    const e = asObj(v[i]);
    if (e === undefined) continue;
    const token = asString(e.token);
    if (token === undefined) continue;
    out.push({
      token,
      logprob: logprobOf(e),
      bytes: bytesOf(e.bytes),
      top_logprobs: topLogprobsOf(e.top_logprobs ?? e.top_probs, limit),
    });
  }
  return out.length === 0 ? null : out;
}

/**
 * A choice's logprobs in the spec's shape `{content, refusal}`, or null when the
 * worker sent none. Accepts `{content: [...]}` without `refusal` (llama.cpp) and a
 * bare entry array. `topLogprobs` cuts each entry's alternatives to the request.
 */
export function normalizeLogprobs(v: unknown, topLogprobs?: number): ChoiceLogprobs | null {
  if (v === undefined || v === null) return null;
  let content: TokenLogprob[] | null;
  let refusal: TokenLogprob[] | null = null;
  if (Array.isArray(v)) {
    content = entriesOf(v, topLogprobs);
  } else {
    const o = asObj(v);
    if (o === undefined) return null;
    content = entriesOf(o.content, topLogprobs);
    refusal = entriesOf(o.refusal, topLogprobs);
  }
  return content === null && refusal === null ? null : { content, refusal };
}

/**
 * When a worker reported reasoning, its logprob list may also cover the reasoning
 * tokens (llama.cpp does), which would spell the reasoning out. Reasoning comes
 * first, so keep only the trailing entries whose tokens spell the end of the
 * visible content. A token that does not match (a partial UTF-8 byte, say) ends
 * the run: dropping a logprob is acceptable, leaking reasoning is not.
 */
function keepVisibleLogprobs(lp: ChoiceLogprobs | null, content: string): ChoiceLogprobs | null {
  if (lp === null || lp.content === null) return lp;
  const entries = lp.content;
  let pos = content.length;
  let start = entries.length;
  while (start > 0) {
    const token = entries[start - 1]!.token;
    const at = pos - token.length;
    if (at < 0 || !content.startsWith(token, at)) break;
    pos = at;
    start--;
  }
  if (start === 0) return lp;
  const kept = start === entries.length ? null : entries.slice(start);
  return kept === null && lp.refusal === null ? null : { content: kept, refusal: lp.refusal };
}

// ---------------------------------------------------------------------------
// usage

export interface NormalizeUsageOptions {
  /**
   * llama.cpp's `timings` object (a sibling of `usage`): `cache_n` gives cached
   * prompt tokens on builds without `prompt_tokens_details`, and `prompt_n`,
   * `cache_n`, `predicted_n` give the counts when no `usage` was sent at all.
   */
  timings?: unknown;
  /** See `ReframeContext.predictionUsed`. */
  predictionUsed?: boolean;
}

/**
 * The spec's Usage from a worker's `usage` object, tolerating the variants in
 * the wild: vLLM/SGLang `prompt_tokens_details.cached_tokens` (or null details),
 * llama.cpp `prompt_tokens_details` or `timings.cache_n`, Ollama's bare three
 * counts, a null `completion_tokens` (vLLM). `total_tokens` is always recomputed;
 * missing counts read 0, missing details read null (`cached_tokens` reads 0).
 */
export function normalizeUsage(usage: unknown, opts: NormalizeUsageOptions = {}): Usage {
  const u = asObj(usage);
  const t = asObj(opts.timings);
  const ptd = u === undefined ? undefined : asObj(u.prompt_tokens_details);
  const ctd = u === undefined ? undefined : asObj(u.completion_tokens_details);
  const cacheN = t === undefined ? undefined : asCount(t.cache_n);

  let prompt = u === undefined ? undefined : asCount(u.prompt_tokens);
  if (prompt === undefined && t !== undefined) {
    const processed = asCount(t.prompt_n);
    if (processed !== undefined || cacheN !== undefined) prompt = (processed ?? 0) + (cacheN ?? 0);
  }
  prompt ??= 0;
  let completion = u === undefined ? undefined : asCount(u.completion_tokens);
  if (completion === undefined && t !== undefined) completion = asCount(t.predicted_n);
  completion ??= 0;

  const cached = Math.min(asCount(ptd?.cached_tokens) ?? cacheN ?? 0, prompt);
  const reasoning = asCount(ctd?.reasoning_tokens) ?? asCount(u?.reasoning_tokens) ?? null;
  const predicted = opts.predictionUsed === true;

  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: {
      cached_tokens: cached,
      audio_tokens: positiveCount(ptd?.audio_tokens),
    },
    completion_tokens_details: {
      reasoning_tokens: reasoning,
      audio_tokens: positiveCount(ctd?.audio_tokens),
      accepted_prediction_tokens: predicted
        ? (asCount(ctd?.accepted_prediction_tokens) ?? null)
        : null,
      rejected_prediction_tokens: predicted
        ? (asCount(ctd?.rejected_prediction_tokens) ?? null)
        : null,
    },
  };
}

/**
 * The usage a worker reported in a response body or stream chunk (`usage`, or
 * llama.cpp `timings` alone), or null when it reported none.
 */
export function extractUsage(
  upstream: unknown,
  opts: { predictionUsed?: boolean } = {},
): Usage | null {
  const body = asObj(upstream);
  if (body === undefined) return null;
  let usage = asObj(body.usage);
  const timings = asObj(body.timings);
  // A worker that counts 1e20 tokens counted nothing: the router's estimate instead
  // (billed and limited as such, where the impossible count would lose the record).
  if (
    usage !== undefined &&
    (impossibleCount(usage.prompt_tokens) || impossibleCount(usage.completion_tokens))
  ) {
    return null;
  }
  if (
    usage !== undefined &&
    asCount(usage.prompt_tokens) === undefined &&
    asCount(usage.completion_tokens) === undefined
  ) {
    // `usage: {}`, or counts that are no numbers: nothing was counted, so the router's
    // estimate stands in (billed and shown), as when usage is absent, not zero tokens.
    usage = undefined;
  }
  if (usage === undefined) {
    // llama.cpp attaches timings to the last chunk even without include_usage;
    // `predicted_n` marks them as final counts rather than prompt progress.
    if (timings === undefined || asCount(timings.predicted_n) === undefined) return null;
  }
  return normalizeUsage(usage, { timings, predictionUsed: opts.predictionUsed });
}

/** Usage when the worker reported none: the router's prompt estimate and a completion count. */
export function estimatedUsage(promptTokens: number, completionTokens: number): Usage {
  const prompt = asCount(promptTokens) ?? 0;
  const completion = asCount(completionTokens) ?? 0;
  return normalizeUsage({ prompt_tokens: prompt, completion_tokens: completion });
}

/** Rough tokens for text when nothing better is known: ~4 characters per token. */
function charsToTokens(chars: number): number {
  return Math.ceil(chars / 4);
}

// ---------------------------------------------------------------------------
// streaming chunks

/** Per-chunk facts the accumulator needs, filled in by `reframeInto` when given. */
interface ChunkStats {
  /** Characters of generated text of any kind (content, refusal, reasoning, tool args). */
  generatedChars: number;
  /** Tokens seen in this chunk: logprob entries when present, else 1 per choice with text. */
  tokens: number;
  /** The emitted chunk carries content, refusal or tool calls. */
  visible: boolean;
  /**
   * The client's index for a tool-call delta of choice `choice`, given the worker's
   * index and the delta's id (see `StreamAccumulator`); the worker's index if unset.
   */
  toolIndex?: (choice: number, upstream: number, id: string | undefined) => number;
  /**
   * Whether choice `choice` may still stream (see `StreamAccumulator`); a closed
   * choice's delta is dropped before it is counted. Every choice when unset.
   */
  open?: (choice: number) => boolean;
}

function toolCallDeltas(
  v: unknown,
  choice: number,
  stats: ChunkStats | undefined,
): ToolCallDelta[] | undefined {
  if (!Array.isArray(v) || v.length === 0) return undefined;
  let out: ToolCallDelta[] | undefined;
  for (let i = 0; i < v.length; i++) {
    const t = asObj(v[i]);
    if (t === undefined) continue;
    const id = asString(t.id);
    const upstream = asIndex(t.index, i);
    const d: ToolCallDelta = {
      index: stats?.toolIndex ? stats.toolIndex(choice, upstream, id || undefined) : upstream,
    };
    if (id) d.id = id;
    // OpenAI sends `type` alongside the id, on the first fragment of a call.
    if (id || t.type === 'function') d.type = 'function';
    const f = asObj(t.function);
    if (f !== undefined) {
      const fn: { name?: string; arguments?: string } = {};
      const name = asString(f.name);
      if (name) fn.name = name;
      const args = argumentsOf(f.arguments);
      if (args !== undefined) fn.arguments = args;
      d.function = fn;
      if (stats !== undefined) stats.generatedChars += (name?.length ?? 0) + (args?.length ?? 0);
    }
    (out ??= []).push(d);
  }
  return out;
}

function reframeChunkChoice(
  raw: unknown,
  position: number,
  ctx: ReframeContext,
  role: RolePolicy,
  stats: ChunkStats | undefined,
): ChunkChoice | null {
  const c = asObj(raw);
  if (c === undefined) return null;
  const index = asIndex(c.index, position);
  if (stats?.open !== undefined && !stats.open(index)) return null;
  const d = asObj(c.delta);
  const content = d === undefined ? undefined : textOf(d.content);
  const refusal = d === undefined ? undefined : asString(d.refusal);
  const toolCalls = d === undefined ? undefined : toolCallDeltas(d.tool_calls, index, stats);
  const reasoningChars = d === undefined ? 0 : reasoningLength(d);
  const finish = normalizeFinishReason(c.finish_reason);

  const hasContent = content !== undefined && content.length > 0;
  const hasRefusal = refusal !== undefined && refusal.length > 0;
  const visible = hasContent || hasRefusal || toolCalls !== undefined;
  const withRole =
    role === 'ensure' ||
    (role === 'forward' && d !== undefined && d.role !== undefined && d.role !== null);

  let logprobs = normalizeLogprobs(c.logprobs, topLimit(ctx));
  if (stats !== undefined) {
    // Counted before reasoning entries are dropped: they are generated tokens too.
    const chars = (hasContent ? content.length : 0) + (refusal?.length ?? 0) + reasoningChars;
    stats.generatedChars += chars;
    if (logprobs?.content) stats.tokens += logprobs.content.length;
    else if (chars > 0 || toolCalls !== undefined) stats.tokens += 1;
    if (visible) stats.visible = true;
  }
  if (logprobs !== null && reasoningChars > 0) {
    logprobs = keepVisibleLogprobs(logprobs, hasContent ? content : '');
  }

  if (!visible && !withRole && finish === null && logprobs === null) return null;

  // Built in the order OpenAI serialises, so the bytes on the wire look familiar.
  const delta: ChunkDelta = {};
  if (withRole) delta.role = 'assistant';
  // A role-only delta carries `content: ""` as OpenAI's first chunk does.
  if (hasContent) delta.content = content;
  else if (withRole) delta.content = '';
  if (hasRefusal) delta.refusal = refusal;
  if (toolCalls !== undefined) delta.tool_calls = toolCalls;
  return { index, delta, logprobs, finish_reason: finish };
}

function reframeInto(
  upstream: unknown,
  ctx: ReframeContext,
  role: RolePolicy,
  stats: ChunkStats | undefined,
): ChatCompletionChunk | null {
  const body = asObj(upstream);
  if (body === undefined) return null;
  const raw = body.choices;
  if (!Array.isArray(raw) || raw.length === 0) return null;
  let choices: ChunkChoice[] | undefined;
  for (let i = 0; i < raw.length; i++) {
    const choice = reframeChunkChoice(raw[i], i, ctx, role, stats);
    if (choice !== null) (choices ??= []).push(choice);
  }
  if (choices === undefined) return null;
  const chunk: ChatCompletionChunk = {
    id: ctx.id,
    object: 'chat.completion.chunk',
    created: ctx.created,
    model: ctx.model,
    service_tier: ctx.serviceTier,
    system_fingerprint: asString(body.system_fingerprint) ?? null,
    choices,
  };
  if (ctx.includeUsage === true) chunk.usage = null;
  return chunk;
}

/**
 * One upstream stream chunk as the spec's `chat.completion.chunk`, or null when
 * nothing is left to forward: a usage-only chunk (`choices: []`; see
 * `extractUsage` and `usageChunk`), a reasoning-only delta, an empty keep-alive
 * delta, an error object, anything that is not a chunk. Choices that keep a role,
 * a finish reason or logprobs survive even with no text.
 */
export function reframeChunk(
  upstream: unknown,
  ctx: ReframeContext,
  role: RolePolicy = 'forward',
): ChatCompletionChunk | null {
  return reframeInto(upstream, ctx, role, undefined);
}

/** The final stream chunk for a client that asked `stream_options.include_usage`. */
export function usageChunk(
  usage: Usage,
  ctx: ReframeContext,
  systemFingerprint: string | null = null,
): ChatCompletionChunk {
  return {
    id: ctx.id,
    object: 'chat.completion.chunk',
    created: ctx.created,
    model: ctx.model,
    service_tier: ctx.serviceTier,
    system_fingerprint: systemFingerprint,
    choices: [],
    usage,
  };
}

/**
 * The message of an error object a worker sent instead of a chunk or completion
 * (`{"error": {...}}` mid-stream from vLLM and llama.cpp, or `{"error": "..."}`),
 * or null when the payload is not one.
 */
export function upstreamErrorMessage(upstream: unknown): string | null {
  const body = asObj(upstream);
  if (body === undefined || body.error === undefined || body.error === null) return null;
  if (typeof body.error === 'string') return body.error;
  const e = asObj(body.error);
  const msg = e === undefined ? undefined : asString(e.message);
  return msg ?? 'The inference worker reported an error.';
}

/**
 * The message of an SSE event a worker named `error`. Such an event ends the stream
 * whatever its data holds: an error envelope, a bare `{message, type}`, plain text.
 */
export function errorEventMessage(data: string): string {
  let payload: unknown;
  try {
    payload = JSON.parse(data);
  } catch {
    return data.trim() || 'The inference worker reported an error.';
  }
  const body = asObj(payload);
  return (
    upstreamErrorMessage(payload) ??
    (body === undefined ? undefined : asString(body.message)) ??
    'The inference worker reported an error.'
  );
}

// ---------------------------------------------------------------------------
// non-streaming completions

function toolCallsOf(v: unknown, ctx: ReframeContext, choiceIndex: number): ToolCall[] | null {
  if (!Array.isArray(v) || v.length === 0) return null;
  let out: ToolCall[] | null = null;
  for (let i = 0; i < v.length; i++) {
    const t = asObj(v[i]);
    const f = t === undefined ? undefined : asObj(t.function);
    const name = f === undefined ? undefined : asString(f.name);
    if (t === undefined || f === undefined || !name) continue;
    (out ??= []).push({
      // Clients echo the id back in the tool message, so one must exist; llama.cpp
      // builds without a tool-call parser can omit it.
      id: asString(t.id) || `call_${ctx.id}_${choiceIndex}_${i}`,
      type: 'function',
      function: { name, arguments: argumentsOf(f.arguments) ?? '{}' },
    });
  }
  return out;
}

/**
 * The index of each of the first `count` choices: the worker's own when they are
 * distinct and below `count`, else their positions (clients key choices by index,
 * and tool-call ids made up for a choice contain it).
 */
function choiceIndexes(raw: readonly unknown[], count: number): number[] {
  const out: number[] = [];
  let own = true;
  for (let i = 0; i < count; i++) {
    const c = asObj(raw[i]);
    const index = c === undefined ? i : asIndex(c.index, i);
    if (index >= count || out.includes(index)) own = false;
    out.push(index);
  }
  if (!own) for (let i = 0; i < count; i++) out[i] = i;
  return out;
}

function completionChoice(raw: unknown, index: number, ctx: ReframeContext): CompletionChoice {
  const c = asObj(raw) ?? {};
  const m = asObj(c.message) ?? {};
  const toolCalls = toolCallsOf(m.tool_calls, ctx, index);
  const refusalText = asString(m.refusal);
  const refusal = refusalText ? refusalText : null;
  let content = textOf(m.content) ?? null;
  if (toolCalls !== null || refusal !== null) {
    // Spec: content is null when the answer is only tool calls or a refusal.
    if (content === '') content = null;
  } else if (content === null) {
    // A reasoning model that spent its budget thinking answers with no text.
    content = '';
  }

  let finish =
    normalizeFinishReason(c.finish_reason) ?? (toolCalls !== null ? 'tool_calls' : 'stop');
  // Spec: tool_calls is present when finish_reason is tool_calls.
  if (finish === 'tool_calls' && toolCalls === null) finish = 'stop';

  let logprobs = normalizeLogprobs(c.logprobs, topLimit(ctx));
  if (logprobs !== null && reasoningLength(m) > 0) {
    logprobs = keepVisibleLogprobs(logprobs, content ?? '');
  }
  if (logprobs === null && ctx.logprobs) logprobs = { content: null, refusal: null };

  return {
    index,
    message: { role: 'assistant', content, refusal, tool_calls: toolCalls, annotations: [] },
    finish_reason: finish,
    logprobs,
  };
}

/**
 * A worker's non-streaming response as the spec's `chat.completion`. Usage comes
 * from the worker (see `normalizeUsage`); when it sent none, from
 * `ctx.promptTokensEstimate` and ~4 characters per generated token.
 * Throws `upstream_error` when the body is not a completion at all, or has no choice.
 */
export function normalizeCompletion(upstream: unknown, ctx: ReframeContext): ChatCompletion {
  const body = asObj(upstream);
  if (body === undefined || !Array.isArray(body.choices)) {
    throw new ServiceError('upstream_error', {
      message: 'The inference worker returned a malformed completion.',
    });
  }
  const raw = body.choices;
  if (raw.length === 0) {
    // No answer: clients read choices[0] (OpenAI's completions always have one).
    throw new ServiceError('upstream_error', {
      message: 'The inference worker answered without a single choice.',
    });
  }
  // Choices beyond the request's `n` are none the client asked for (as in a stream).
  const count = Math.min(raw.length, ctx.choices ?? raw.length);
  const indexes = choiceIndexes(raw, count);
  const choices: CompletionChoice[] = [];
  let chars = 0;
  for (let i = 0; i < count; i++) {
    const choice = completionChoice(raw[i], indexes[i]!, ctx);
    choices.push(choice);
    const msg = choice.message;
    chars += (msg.content?.length ?? 0) + (msg.refusal?.length ?? 0);
    if (msg.tool_calls !== null) {
      for (const t of msg.tool_calls) chars += t.function.name.length + t.function.arguments.length;
    }
  }
  const usage =
    extractUsage(body, { predictionUsed: ctx.predictionUsed }) ??
    estimatedUsage(ctx.promptTokensEstimate ?? 0, charsToTokens(chars));
  return {
    id: ctx.id,
    object: 'chat.completion',
    created: ctx.created,
    model: ctx.model,
    choices,
    usage,
    service_tier: ctx.serviceTier,
    system_fingerprint: asString(body.system_fingerprint) ?? null,
  };
}

// ---------------------------------------------------------------------------
// stream accounting

export interface StreamSummary {
  /** Worker-reported usage when there was any, else an estimate (see `usageReported`). */
  usage: Usage;
  /** False when `usage` is the router's estimate (the worker sent no usage or timings). */
  usageReported: boolean;
  /** Milliseconds from start to the first generated token of any kind (reasoning counts). */
  ttftMs: number | null;
  /** Milliseconds from start to the first forwarded content, refusal or tool call. */
  firstContentMs: number | null;
  /** Whether any content, refusal or tool call reached the client. */
  contentEmitted: boolean;
  /** Finish reason per choice index; null while a choice is unfinished. */
  finishReasons: (FinishReason | null)[];
  /** Whether every choice seen has a finish reason (the stream ran to its end). */
  finished: boolean;
  /** Chunks returned for forwarding. */
  chunksForwarded: number;
  /** The last fingerprint the worker sent. */
  systemFingerprint: string | null;
}

/** Choice indexes above this are not tracked (the request's `n` is at most 128). */
const MAX_TRACKED_CHOICES = 128;

/**
 * Running state of one stream. Feed every parsed upstream payload to `accept`
 * and forward what it returns; at the end, send `usageChunk()` if the client
 * asked for usage, and record `summary()` whether or not the stream completed.
 *
 * The role is sent once: on the first forwarded chunk (added if the worker did
 * not send one) and dropped from later chunks. A choice's finish_reason is sent
 * once: a second one, and any delta of that choice after it, is dropped; so is
 * a choice whose index the request's `n` did not ask for.
 */
export class StreamAccumulator {
  private readonly stats: ChunkStats = {
    generatedChars: 0,
    tokens: 0,
    visible: false,
    toolIndex: (choice, upstream, id) => this.toolIndex(choice, upstream, id),
    open: (choice) =>
      choice < (this.ctx.choices ?? MAX_TRACKED_CHOICES) && this.finishReasons[choice] == null,
  };
  /**
   * Per choice, the tool calls seen: the worker's index -> the client's index and
   * the call's id, and how many calls there were.
   */
  private readonly toolCalls = new Map<
    number,
    { byUpstream: Map<number, { index: number; id: string | undefined }>; count: number }
  >();
  private reported: Usage | null = null;
  private countedTokens = 0;
  private generatedChars = 0;
  private firstTokenAt: number | null = null;
  private firstContentAt: number | null = null;
  private roleSent = false;
  private forwarded = 0;
  private fingerprint: string | null = null;
  private readonly finishReasons: (FinishReason | null)[] = [];

  constructor(
    private readonly ctx: ReframeContext,
    /** Epoch milliseconds when the request started (the TTFT origin). */
    private readonly startedAtMs: number,
  ) {}

  /** Records one upstream payload; returns the chunk to forward, or null. */
  accept(upstream: unknown, nowMs: number): ChatCompletionChunk | null {
    const body = asObj(upstream);
    if (body === undefined) return null;
    const fp = asString(body.system_fingerprint);
    if (fp !== undefined) this.fingerprint = fp;
    // Usage is cumulative (vLLM continuous_usage_stats sends it on every chunk),
    // so the latest report wins.
    if (body.usage !== undefined || body.timings !== undefined) {
      const u = extractUsage(body, { predictionUsed: this.ctx.predictionUsed });
      if (u !== null) this.reported = u;
    }

    const stats = this.stats;
    stats.generatedChars = 0;
    stats.tokens = 0;
    stats.visible = false;
    const chunk = reframeInto(body, this.ctx, this.roleSent ? 'drop' : 'ensure', stats);

    if (stats.generatedChars > 0 || stats.tokens > 0) {
      this.generatedChars += stats.generatedChars;
      this.countedTokens += stats.tokens;
      this.firstTokenAt ??= nowMs;
    }
    if (chunk === null) return null;
    // One finish_reason per choice, and nothing of a choice after it (OpenAI's own
    // streams never do otherwise; the SDK's accumulator would take the last reason
    // and append the text): the `open` check dropped choices finished in earlier
    // chunks, this drops one finished earlier in this chunk.
    const choices = chunk.choices;
    let kept = 0;
    for (let k = 0; k < choices.length; k++) {
      const choice = choices[k]!;
      const i = choice.index;
      if (i < MAX_TRACKED_CHOICES) {
        if (this.finishReasons[i] != null) continue;
        while (this.finishReasons.length <= i) this.finishReasons.push(null);
        // Spec: tool_calls are present when finish_reason is tool_calls; with none
        // streamed it reads stop, as a non-streamed answer's does.
        if (choice.finish_reason === 'tool_calls' && !this.toolCalls.has(i)) {
          choice.finish_reason = 'stop';
        }
        if (choice.finish_reason !== null) this.finishReasons[i] = choice.finish_reason;
      }
      choices[kept++] = choice;
    }
    if (kept === 0) return null;
    choices.length = kept;
    // Keep one fingerprint across the stream when a worker sends it only sometimes.
    if (chunk.system_fingerprint === null) chunk.system_fingerprint = this.fingerprint;
    if (stats.visible) this.firstContentAt ??= nowMs;
    this.roleSent = true;
    this.forwarded++;
    return chunk;
  }

  /**
   * Clients assemble streamed tool calls by `index`, so each call needs its own.
   * Some workers reuse one: Ollama gives every call of a turn index 0 (one whole
   * call per chunk, each with its own id; ollama/ollama#15457), and builds before
   * 0.4.7 sent no index at all, so a client merged the calls into one with broken
   * arguments. A delta whose id differs from the id of the call the worker's index
   * names starts a new call; the client's indexes count calls in order from 0,
   * which is the worker's own numbering when it numbers them right.
   */
  private toolIndex(choice: number, upstream: number, id: string | undefined): number {
    let calls = this.toolCalls.get(choice);
    if (calls === undefined) {
      calls = { byUpstream: new Map(), count: 0 };
      this.toolCalls.set(choice, calls);
    }
    const known = calls.byUpstream.get(upstream);
    if (known !== undefined && (id === undefined || known.id === undefined || known.id === id)) {
      known.id ??= id;
      return known.index;
    }
    const call = { index: calls.count++, id };
    calls.byUpstream.set(upstream, call);
    return call.index;
  }

  /** Whether a generated token (reasoning included) has been seen: time to first token is over. */
  get firstTokenSeen(): boolean {
    return this.firstTokenAt !== null;
  }

  /** Whether the worker streamed any choice (a `[DONE]` alone answered nothing). */
  get choicesSeen(): boolean {
    return this.finishReasons.length > 0;
  }

  /**
   * Whether every choice has its finish_reason: choices 0 to n - 1 with the
   * request's `n`, else every choice seen (and at least one).
   */
  get finished(): boolean {
    const reasons = this.finishReasons;
    const n = Math.min(this.ctx.choices ?? reasons.length, MAX_TRACKED_CHOICES);
    if (n === 0 || reasons.length < n) return false;
    for (let i = 0; i < n; i++) if (reasons[i] == null) return false;
    return true;
  }

  /** Usage so far: the worker's latest report, else an estimate from what streamed. */
  get usage(): Usage {
    if (this.reported !== null) return this.reported;
    // Workers stream about one token per chunk (counted exactly when logprobs
    // are on); speculative decoding packs several, which the character estimate
    // catches. The larger of the two under-bills least.
    const completion = Math.max(this.countedTokens, charsToTokens(this.generatedChars));
    return estimatedUsage(this.ctx.promptTokensEstimate ?? 0, completion);
  }

  /**
   * At the stream's end (the worker's `[DONE]`), the chunk that gives `finish_reason:
   * stop` to each choice the worker left without one, as a non-streamed null
   * finish_reason reads (clients assemble a choice only once it has one); null when
   * every choice has one. A choice the worker never streamed gets its role too.
   * Recorded as if the worker had sent it.
   */
  closingChunk(): ChatCompletionChunk | null {
    const n = Math.min(this.ctx.choices ?? this.finishReasons.length, MAX_TRACKED_CHOICES);
    let choices: ChunkChoice[] | undefined;
    for (let i = 0; i < n; i++) {
      if (this.finishReasons[i] != null) continue;
      const seen = i < this.finishReasons.length && this.roleSent;
      (choices ??= []).push({
        index: i,
        delta: seen ? {} : { role: 'assistant', content: '' },
        logprobs: null,
        finish_reason: 'stop',
      });
    }
    if (choices === undefined) return null;
    while (this.finishReasons.length < n) this.finishReasons.push(null);
    for (const c of choices) this.finishReasons[c.index] = 'stop';
    this.roleSent = true;
    this.forwarded++;
    const chunk: ChatCompletionChunk = {
      id: this.ctx.id,
      object: 'chat.completion.chunk',
      created: this.ctx.created,
      model: this.ctx.model,
      service_tier: this.ctx.serviceTier,
      system_fingerprint: this.fingerprint,
      choices,
    };
    if (this.ctx.includeUsage === true) chunk.usage = null;
    return chunk;
  }

  /** The spec's final usage chunk (`choices: []`), for `stream_options.include_usage`. */
  usageChunk(): ChatCompletionChunk {
    return usageChunk(this.usage, this.ctx, this.fingerprint);
  }

  summary(): StreamSummary {
    const reasons = this.finishReasons.slice();
    return {
      usage: this.usage,
      usageReported: this.reported !== null,
      ttftMs: this.firstTokenAt === null ? null : this.firstTokenAt - this.startedAtMs,
      firstContentMs: this.firstContentAt === null ? null : this.firstContentAt - this.startedAtMs,
      contentEmitted: this.firstContentAt !== null,
      finishReasons: reasons,
      finished: this.finished,
      chunksForwarded: this.forwarded,
      systemFingerprint: this.fingerprint,
    };
  }
}
