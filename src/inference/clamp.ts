/**
 * max_tokens auto-clamping (spec, Limits → "max_tokens auto-clamping").
 *
 * Invariants:
 * - A request is never rejected because max_tokens / max_completion_tokens exceeds the
 *   context window: the value is reduced to what fits, `context - prompt`, never below 1.
 * - An omitted value means "the rest of the window"; that is not a clamp, so no header.
 * - When a value was reduced, the response carries
 *   `X-Service-Max-Tokens-Clamped: <original> -> <clamped>`.
 *
 * Two stages:
 * 1. Before routing, the prompt size is estimated from character counts
 *    (`estimatePromptTokens`) and the requested value is clamped against it.
 * 2. The estimate can be wrong, so if the engine still answers with its exact token-count
 *    rejection, `parseTokenCountError` reads the engine's own numbers and returns the value
 *    that fits; the caller retries once with it.
 *
 * Estimation ratio: 3.5 characters per token for ASCII text. Tokenizers of the open models
 * we serve (Llama, Mistral, Qwen) average roughly 3.5–4.5 characters per token on English
 * prose and less on code or JSON; 3.5 errs slightly high on purpose, because an
 * overestimate only trims a few output tokens near the window's edge, while an
 * underestimate costs an upstream round trip. Non-ASCII text is denser in tokens: Greek,
 * Cyrillic, Arabic, Indic and other code units below U+3000 count as 2 characters
 * (≈0.6 token each); CJK, kana, Hangul and astral-plane code units (emoji) count as 3.5
 * (≈1 token each). Every message adds 8 tokens for the chat template's role markers and
 * separators, the reply adds 3 for the assistant header, and a non-text part (image,
 * audio, file) is counted as a flat 512 tokens instead of its (base64) length.
 *
 * Everything here is pure: plain data in, plain data out.
 */
import { ServiceError } from '../errors/index.js';

export const CLAMP_HEADER = 'X-Service-Max-Tokens-Clamped';

/** ASCII characters per token (see the module comment for why 3.5). */
export const CHARS_PER_TOKEN = 3.5;
/** Role markers and separators a chat template adds around each message. */
export const MESSAGE_OVERHEAD_TOKENS = 8;
/** The assistant header the template appends to prompt the reply. */
export const REPLY_PRIMING_TOKENS = 3;
/** Flat cost of an image, audio or file part; their encoded length says nothing useful. */
export const NON_TEXT_PART_TOKENS = 512;
/** Templates wrap tool definitions in an instruction preamble (≈100 tokens for Qwen/Hermes). */
export const TOOLS_PREAMBLE_TOKENS = 128;
/** Per-tool and per-tool-call framing (tags, separators). */
export const TOOL_OVERHEAD_TOKENS = 8;

/** The parts of a message that reach the prompt; `ChatMessage` from request.ts fits. */
export interface PromptMessage {
  readonly content?: string | ReadonlyArray<PromptContentPart> | null;
  readonly name?: string | null;
  readonly tool_call_id?: string | null;
  readonly tool_calls?: ReadonlyArray<{
    readonly function: { readonly name: string; readonly arguments: string };
  }> | null;
}

export interface PromptContentPart {
  readonly type: string;
  readonly text?: string;
  readonly refusal?: string;
}

/** Estimated prompt tokens for messages (and tool definitions), rounded up. */
export function estimatePromptTokens(
  messages: ReadonlyArray<PromptMessage>,
  tools?: ReadonlyArray<unknown> | null,
): number {
  let chars = 0;
  let tokens = REPLY_PRIMING_TOKENS;
  for (const m of messages) {
    tokens += MESSAGE_OVERHEAD_TOKENS;
    const content = m.content;
    if (typeof content === 'string') {
      chars += weightedLength(content);
    } else if (content != null) {
      for (const part of content) {
        if (typeof part.text === 'string') chars += weightedLength(part.text);
        else if (typeof part.refusal === 'string') chars += weightedLength(part.refusal);
        else tokens += NON_TEXT_PART_TOKENS;
      }
    }
    if (m.name != null) chars += weightedLength(m.name);
    if (m.tool_call_id != null) chars += weightedLength(m.tool_call_id);
    if (m.tool_calls != null) {
      for (const call of m.tool_calls) {
        tokens += TOOL_OVERHEAD_TOKENS;
        chars += weightedLength(call.function.name) + weightedLength(call.function.arguments);
      }
    }
  }
  if (tools != null && tools.length > 0) {
    // Templates render tool definitions as JSON, so their serialised length is the
    // closest cheap proxy for what the model actually reads.
    tokens += TOOLS_PREAMBLE_TOKENS + TOOL_OVERHEAD_TOKENS * tools.length;
    chars += weightedLength(JSON.stringify(tools));
  }
  return tokens + Math.ceil(chars / CHARS_PER_TOKEN);
}

/** Estimated tokens of a plain text (a `prediction`, say), rounded up. */
export function estimateTextTokens(text: string): number {
  return Math.ceil(weightedLength(text) / CHARS_PER_TOKEN);
}

/**
 * Length in "ASCII-equivalent" characters: scripts that tokenize more densely count more,
 * so dividing by CHARS_PER_TOKEN stays an overestimate for them too.
 */
export function weightedLength(s: string): number {
  let n = s.length;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) continue;
    // Each UTF-16 code unit is one of s.length already; add the extra weight.
    n += c < 0x3000 ? 1 : CHARS_PER_TOKEN - 1;
  }
  return n;
}

export interface ClampInput {
  /** max_completion_tokens ?? max_tokens as sent; undefined when omitted. */
  readonly requested: number | undefined;
  readonly promptTokens: number;
  readonly contextWindow: number;
}

export interface ClampResult {
  /** The max_tokens to send upstream. */
  readonly value: number;
  /** True only when a requested value was reduced. */
  readonly clamped: boolean;
  /** The requested value, unchanged (undefined when omitted). */
  readonly original: number | undefined;
}

/** Reduces a requested max_tokens to what fits in the window; omitted means "the rest". */
export function clampMaxTokens({
  requested,
  promptTokens,
  contextWindow,
}: ClampInput): ClampResult {
  // At least 1: a prompt that fills the window is the engine's to reject with its own
  // context-length error; sending 0 would only trade it for a less helpful one.
  const available = Math.max(1, Math.floor(contextWindow) - Math.ceil(promptTokens));
  if (requested === undefined) return { value: available, clamped: false, original: undefined };
  if (requested > available) return { value: available, clamped: true, original: requested };
  return { value: requested, clamped: false, original: requested };
}

/** The exact `X-Service-Max-Tokens-Clamped` value: `<original> -> <clamped>`. */
export function clampHeader(original: number, clamped: number): string {
  return `${integerText(original)} -> ${integerText(clamped)}`;
}

/** Digits, also past 2^53 where `String` switches to exponent form (1e21 → "1e+21"). */
function integerText(n: number): string {
  return Number.isInteger(n) && !Number.isSafeInteger(n) ? BigInt(n).toString() : String(n);
}

// ---------------------------------------------------------------------------------------
// The engine's token-count rejection.

/** What an engine's context-length rejection says, in its own numbers. */
export interface TokenCountRejection {
  readonly engine: 'vllm' | 'llama.cpp';
  readonly contextWindow: number | undefined;
  readonly promptTokens: number | undefined;
  /**
   * False when the engine reports a lower bound ("at least N input tokens"): newer vLLM
   * truncates tokenisation at the input limit + 1, so the true prompt may be longer and
   * `contextWindow - promptTokens` is not known to fit.
   */
  readonly promptTokensExact: boolean;
  /** The max_tokens the engine saw, when it says so. */
  readonly requested: number | undefined;
}

interface Wording {
  readonly engine: TokenCountRejection['engine'];
  readonly pattern: RegExp;
  readonly read: (m: RegExpExecArray) => Omit<TokenCountRejection, 'engine'>;
}

/** A captured count; absurd digit strings (beyond 2^53) count as unknown. */
function int(s: string | undefined): number | undefined {
  if (s === undefined) return undefined;
  const n = Number(s);
  return Number.isSafeInteger(n) ? n : undefined;
}

// Wordings copied from the engines' sources; see clamp.test.ts for one sample of each.
const WORDINGS: readonly Wording[] = [
  // vLLM ≥ 0.11 (serving_engine.py _validate_input, later score/serving preprocessors).
  {
    engine: 'vllm',
    pattern:
      /'max_tokens' or 'max_completion_tokens' is too large: (\d+)\. This model's maximum context length is (\d+) tokens and your request has (\d+) input tokens/,
    read: (m) => ({
      requested: int(m[1]),
      contextWindow: int(m[2]),
      promptTokens: int(m[3]),
      promptTokensExact: true,
    }),
  },
  // vLLM ≤ 0.10 (serving_engine.py _validate_input).
  {
    engine: 'vllm',
    pattern:
      /This model's maximum context length is (\d+) tokens\. However, you requested (\d+) tokens \((\d+) in the messages, (\d+) in the completion\)/,
    read: (m) => ({
      contextWindow: int(m[1]),
      promptTokens: int(m[3]),
      requested: int(m[4]),
      promptTokensExact: true,
    }),
  },
  // vLLM renderer (renderers/params.py): "... contains [at least] N input tokens, for a total of ...".
  {
    engine: 'vllm',
    pattern:
      /This model's maximum context length is (\d+) tokens\. However, you requested (\d+) output tokens and your prompt contains (at least )?(\d+) input tokens/,
    read: (m) => ({
      contextWindow: int(m[1]),
      requested: int(m[2]),
      promptTokens: int(m[4]),
      promptTokensExact: m[3] === undefined,
    }),
  },
  // vLLM renderer, intermediate wording (renderers/params.py _token_len_check). The count
  // comes from a tokenisation truncated at (window - requested + 1), so that value is a
  // lower bound rather than a measurement.
  {
    engine: 'vllm',
    pattern:
      /You passed (\d+) input tokens and requested (\d+) output tokens\. However, the model's context length is only (\d+) tokens/,
    read: (m) => {
      const prompt = int(m[1]);
      const requested = int(m[2]);
      const window = int(m[3]);
      const truncated =
        prompt !== undefined &&
        requested !== undefined &&
        window !== undefined &&
        prompt === window - requested + 1;
      return {
        promptTokens: prompt,
        requested,
        contextWindow: window,
        promptTokensExact: !truncated,
      };
    },
  },
  // vLLM: the prompt alone does not fit; no max_tokens can help.
  {
    engine: 'vllm',
    pattern:
      /This model's maximum context length is (\d+) tokens\. However, (?:your request has|you requested) (\d+) (?:input )?tokens(?: in the messages)?[.,]/,
    read: (m) => ({
      contextWindow: int(m[1]),
      promptTokens: int(m[2]),
      requested: undefined,
      promptTokensExact: true,
    }),
  },
  // llama.cpp server (tools/server/server-context.cpp, current).
  {
    engine: 'llama.cpp',
    pattern: /request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)/,
    read: (m) => ({
      promptTokens: int(m[1]),
      contextWindow: int(m[2]),
      requested: undefined,
      promptTokensExact: true,
    }),
  },
  // llama.cpp server, older wordings (numbers, when any, come from the error fields).
  {
    engine: 'llama.cpp',
    pattern:
      /the request exceeds the available context size|input \((\d+) tokens\) is larger than the max context size \((\d+) tokens\)|input is larger than the max context size/,
    read: (m) => ({
      promptTokens: int(m[1]),
      contextWindow: int(m[2]),
      requested: undefined,
      promptTokensExact: true,
    }),
  },
];

/**
 * The engine's rejection when the prompt alone does not fit its window: 400
 * `context_length_exceeded` naming `messages`, in words about the messages. (The
 * engine's own words describe the max_tokens it was sent, which may be the router's
 * choice, not the client's.) Null for any other response.
 */
export function promptTooLong(status: number, body: string): ServiceError | null {
  const r = readTokenCountError(status, body);
  if (r?.promptTokens === undefined || r.contextWindow === undefined) return null;
  if (r.promptTokens < r.contextWindow) return null;
  return new ServiceError('context_length_exceeded', {
    message: `This model's maximum context length is ${r.contextWindow} tokens; the messages alone are ${r.promptTokensExact ? '' : 'at least '}${r.promptTokens}. Shorten the messages.`,
    param: 'messages',
  });
}

/** Reads an engine's context-length rejection; null for any other response. */
export function readTokenCountError(status: number, body: string): TokenCountRejection | null {
  if (status !== 400) return null;
  const error = errorObject(body);
  const message = error?.message ?? body;

  for (const w of WORDINGS) {
    const m = w.pattern.exec(message);
    if (m === null) continue;
    const found = { engine: w.engine, ...w.read(m) };
    // llama.cpp's error object carries both counts as fields; they win over the prose.
    if (
      w.engine === 'llama.cpp' &&
      error?.nPromptTokens !== undefined &&
      error.nCtx !== undefined
    ) {
      return { ...found, promptTokens: error.nPromptTokens, contextWindow: error.nCtx };
    }
    return found;
  }
  // A llama.cpp error with the type and counts but an unfamiliar message.
  if (error?.type === 'exceed_context_size_error') {
    return {
      engine: 'llama.cpp',
      promptTokens: error.nPromptTokens,
      contextWindow: error.nCtx,
      requested: undefined,
      promptTokensExact: true,
    };
  }
  return null;
}

/**
 * The max_tokens that fits according to the engine's exact token-count rejection, or null
 * when the response is not one, the counts are not exact, or nothing fits (the prompt
 * alone fills the window, which is what llama.cpp rejects).
 */
export function parseTokenCountError(status: number, body: string): number | null {
  const r = readTokenCountError(status, body);
  if (r === null || !r.promptTokensExact) return null;
  if (r.contextWindow === undefined || r.promptTokens === undefined) return null;
  const fits = r.contextWindow - r.promptTokens;
  if (fits < 1) return null;
  // A "correction" that is not smaller than what was refused would fail the same way.
  if (r.requested !== undefined && fits >= r.requested) return null;
  return fits;
}

interface EngineError {
  readonly message: string | undefined;
  readonly type: string | undefined;
  readonly nPromptTokens: number | undefined;
  readonly nCtx: number | undefined;
}

/**
 * The error object from an engine's JSON body: `{error: {message, type, ...}}` (vLLM,
 * llama.cpp), `{error: "..."}`, or vLLM's older top-level `{object: "error", message}`.
 */
function errorObject(body: string): EngineError | undefined {
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch {
    // Not JSON (a proxy's text page, a truncated body): the caller matches the raw text.
    return undefined;
  }
  if (!isObject(json)) return undefined;
  const inner = json['error'];
  if (typeof inner === 'string')
    return { message: inner, type: undefined, nPromptTokens: undefined, nCtx: undefined };
  const e = isObject(inner) ? inner : json;
  return {
    message: typeof e['message'] === 'string' ? e['message'] : undefined,
    type: typeof e['type'] === 'string' ? e['type'] : undefined,
    nPromptTokens: count(e['n_prompt_tokens']),
    nCtx: count(e['n_ctx']),
  };
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function count(v: unknown): number | undefined {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : undefined;
}
