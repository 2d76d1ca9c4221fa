/**
 * The sim worker's pooling tasks, as vLLM serves them for embedding and reranker
 * models: `POST /v1/embeddings` (OpenAI's shape), `POST /rerank` and `POST /score`
 * (vLLM's shapes). Deterministic, so tests and benchmarks need no model.
 *
 * Embeddings (`embedText`, `embedTokens`): feature hashing into `dim` dimensions
 * (default 64), then L2-normalised. A text's features are its lowercased words
 * (runs of letters and digits, weight 1) and its lowercased character trigrams
 * (weight 0.5); token-id input uses each id (weight 1) and each adjacent pair of
 * ids (weight 0.5). Feature f lands on dimension `hash53(f) % dim` with sign
 * `+1` when `floor(hash53(f) / dim)` is even, else `-1`. Texts that share words
 * get a high cosine similarity; equal inputs get equal vectors. An input without
 * features (nothing but punctuation or spaces, or all features cancelling) gets a
 * mulberry32 vector seeded by the input's hash instead, never a zero vector.
 * `dimensions` acts as on a Matryoshka model: the first `dimensions` values,
 * normalised again; more than `dim` is a 400.
 *
 * Scores (`similarity`): the Jaccard index of the two texts' sets of lowercased
 * character trigrams (a text shorter than three characters is one gram), in
 * [0, 1]: 1 for equal texts, 0 for texts without a common trigram.
 *
 * Token counts (usage): the sim tokenizer's (tokenizer.ts) count of each text, or
 * the length of a token-id list; a rerank or score pair counts both texts.
 *
 * Error bodies follow the imitated engine (errors.ts); an input longer than the
 * context window is vLLM's "maximum context length" 400.
 */
import { mulberry32 } from '../../runtime/prng.js';
import { simError, type ErrorStyle, type SimHttpError } from './errors.js';
import { countTokens, hash53 } from './tokenizer.js';

export const DEFAULT_EMBEDDING_DIM = 64;

// ---------------------------------------------------------------- vectors

const WORD = /[\p{L}\p{N}]+/gu;

function hashInto(v: Float64Array, feature: string, weight: number): void {
  const h = hash53(feature);
  const dim = v.length;
  const sign = Math.floor(h / dim) % 2 === 0 ? 1 : -1;
  v[h % dim]! += sign * weight;
}

/** `v` scaled to unit length; a zero vector becomes the seeded fallback for `key`. */
function unit(v: Float64Array, key: string): number[] {
  let norm = 0;
  for (const x of v) norm += x * x;
  if (norm < 1e-12) {
    const rng = mulberry32(hash53(key) % 4294967296);
    for (let i = 0; i < v.length; i++) v[i] = rng() * 2 - 1;
    norm = 0;
    for (const x of v) norm += x * x;
  }
  const s = 1 / Math.sqrt(norm);
  const out = new Array<number>(v.length);
  for (let i = 0; i < v.length; i++) out[i] = v[i]! * s;
  return out;
}

export function embedText(text: string, dim = DEFAULT_EMBEDDING_DIM): number[] {
  const v = new Float64Array(dim);
  const t = text.toLowerCase();
  for (const m of t.matchAll(WORD)) hashInto(v, `w:${m[0]}`, 1);
  for (let i = 0; i + 3 <= t.length; i++) hashInto(v, `g:${t.slice(i, i + 3)}`, 0.5);
  return unit(v, `text:${text}`);
}

export function embedTokens(ids: readonly number[], dim = DEFAULT_EMBEDDING_DIM): number[] {
  const v = new Float64Array(dim);
  for (let i = 0; i < ids.length; i++) {
    hashInto(v, `t:${ids[i]}`, 1);
    if (i > 0) hashInto(v, `b:${ids[i - 1]},${ids[i]}`, 0.5);
  }
  return unit(v, `tokens:${ids.join(',')}`);
}

/** The first `dimensions` values of a unit vector, normalised again (Matryoshka). */
export function shorten(v: readonly number[], dimensions: number): number[] {
  const head = new Float64Array(v.slice(0, dimensions));
  return unit(head, v.join(','));
}

function trigrams(text: string): Set<string> {
  const t = text.toLowerCase();
  const out = new Set<string>();
  if (t.length > 0 && t.length < 3) out.add(t);
  for (let i = 0; i + 3 <= t.length; i++) out.add(t.slice(i, i + 3));
  return out;
}

/** Jaccard index of the two texts' character-trigram sets (see the module comment). */
export function similarity(a: string, b: string): number {
  const ga = trigrams(a);
  const gb = trigrams(b);
  if (ga.size === 0 && gb.size === 0) return 0;
  let common = 0;
  for (const g of ga) if (gb.has(g)) common++;
  return common / (ga.size + gb.size - common);
}

/** Little-endian float32 bytes, base64: OpenAI's `encoding_format: "base64"`. */
export function float32Base64(v: readonly number[]): string {
  const buf = Buffer.allocUnsafe(v.length * 4);
  for (let i = 0; i < v.length; i++) buf.writeFloatLE(v[i]!, i * 4);
  return buf.toString('base64');
}

// ---------------------------------------------------------------- requests

export type Checked<T> = { ok: true; value: T } | { ok: false; error: SimHttpError };

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function isTokenList(v: unknown): v is number[] {
  return Array.isArray(v) && v.every((x) => Number.isInteger(x) && (x as number) >= 0);
}

function isStringList(v: unknown): v is string[] {
  return Array.isArray(v) && v.every((x) => typeof x === 'string');
}

export type EmbeddingInput = { kind: 'text'; text: string } | { kind: 'tokens'; ids: number[] };

export interface EmbeddingsJob {
  inputs: EmbeddingInput[];
  base64: boolean;
  dimensions: number | undefined;
  promptTokens: number;
}

function inputTokens(i: EmbeddingInput): number {
  return i.kind === 'text' ? countTokens(i.text) : i.ids.length;
}

function tooLong(style: ErrorStyle, tokens: number, contextWindow: number): SimHttpError {
  return simError(
    style,
    400,
    `This model's maximum context length is ${contextWindow} tokens. However, you requested ${tokens} tokens in the input for embedding generation. Please reduce the length of the input.`,
  );
}

export function checkEmbeddings(
  body: unknown,
  o: { style: ErrorStyle; dim: number; contextWindow: number },
): Checked<EmbeddingsJob> {
  const bad = (message: string, param: string | null = null): Checked<EmbeddingsJob> => ({
    ok: false,
    error: simError(o.style, 400, message, param),
  });
  if (!isObject(body)) return bad('The request body must be a JSON object.');
  const raw = body.input;
  let inputs: EmbeddingInput[];
  if (typeof raw === 'string') inputs = [{ kind: 'text', text: raw }];
  else if (isStringList(raw) && raw.length > 0)
    inputs = raw.map((text) => ({ kind: 'text', text }));
  else if (isTokenList(raw) && raw.length > 0) inputs = [{ kind: 'tokens', ids: raw }];
  else if (Array.isArray(raw) && raw.length > 0 && raw.every(isTokenList))
    inputs = raw.map((ids) => ({ kind: 'tokens', ids }));
  else return bad('input must be a string, a list of strings or token ids', 'input');
  // As vLLM's request model: absent is the default, null is not a format.
  const format = body.encoding_format === undefined ? 'float' : body.encoding_format;
  if (format !== 'float' && format !== 'base64') {
    return bad("encoding_format must be 'float' or 'base64'", 'encoding_format');
  }
  const dims = body.dimensions ?? undefined;
  if (dims !== undefined) {
    if (!Number.isInteger(dims) || (dims as number) < 1) {
      return bad('dimensions must be a positive integer', 'dimensions');
    }
    if ((dims as number) > o.dim) {
      return bad(
        `dimensions ${String(dims)} is more than the model's embedding size ${o.dim}`,
        'dimensions',
      );
    }
  }
  let promptTokens = 0;
  for (const i of inputs) {
    const n = inputTokens(i);
    if (n > o.contextWindow) return { ok: false, error: tooLong(o.style, n, o.contextWindow) };
    promptTokens += n;
  }
  return {
    ok: true,
    value: {
      inputs,
      base64: format === 'base64',
      dimensions: dims as number | undefined,
      promptTokens,
    },
  };
}

export interface RerankJob {
  query: string;
  documents: string[];
  topN: number;
  promptTokens: number;
}

export function checkRerank(body: unknown, style: ErrorStyle): Checked<RerankJob> {
  const bad = (message: string, param: string | null = null): Checked<RerankJob> => ({
    ok: false,
    error: simError(style, 400, message, param),
  });
  if (!isObject(body)) return bad('The request body must be a JSON object.');
  if (typeof body.query !== 'string') return bad('query must be a string', 'query');
  if (!isStringList(body.documents) || body.documents.length === 0) {
    return bad('documents must be a non-empty list of strings', 'documents');
  }
  // As vLLM's request model: absent is 0 (all), null is not a count.
  const topN = body.top_n === undefined ? 0 : body.top_n;
  if (!Number.isInteger(topN) || (topN as number) < 0) {
    return bad('top_n must be a non-negative integer', 'top_n');
  }
  const q = countTokens(body.query);
  let promptTokens = 0;
  for (const d of body.documents) promptTokens += q + countTokens(d);
  return {
    ok: true,
    value: { query: body.query, documents: body.documents, topN: topN as number, promptTokens },
  };
}

export interface ScoreJob {
  pairs: Array<[string, string]>;
  promptTokens: number;
}

/** vLLM's pairing rule: 1:1, 1:N (text_1 broadcast) or N:N. */
export function checkScore(body: unknown, style: ErrorStyle): Checked<ScoreJob> {
  const bad = (message: string, param: string | null = null): Checked<ScoreJob> => ({
    ok: false,
    error: simError(style, 400, message, param),
  });
  if (!isObject(body)) return bad('The request body must be a JSON object.');
  const list = (v: unknown): string[] | null =>
    typeof v === 'string' ? [v] : isStringList(v) ? v : null;
  const a = list(body.text_1);
  const b = list(body.text_2);
  if (a === null) return bad('text_1 must be a string or a list of strings', 'text_1');
  if (b === null) return bad('text_2 must be a string or a list of strings', 'text_2');
  if (a.length === 0) return bad('At least one text element must be given', 'text_1');
  if (b.length === 0) return bad('At least one text_pair element must be given', 'text_2');
  if (a.length > 1 && a.length !== b.length) {
    return bad('Input lengths must be either 1:1, 1:N or N:N', 'text_1');
  }
  const pairs = b.map((t2, i): [string, string] => [a.length === 1 ? a[0]! : a[i]!, t2]);
  let promptTokens = 0;
  for (const [x, y] of pairs) promptTokens += countTokens(x) + countTokens(y);
  return { ok: true, value: { pairs, promptTokens } };
}

// ---------------------------------------------------------------- responses

export interface PoolingMeta {
  /** Request id without its prefix (the worker adds `embd-`, `rerank-`, `score-`). */
  id: string;
  created: number;
  model: string;
}

function poolingUsage(promptTokens: number) {
  return {
    prompt_tokens: promptTokens,
    total_tokens: promptTokens,
    completion_tokens: 0,
    prompt_tokens_details: null,
  };
}

/** vLLM's EmbeddingResponse. */
export function embeddingsResponse(job: EmbeddingsJob, dim: number, meta: PoolingMeta) {
  return {
    id: `embd-${meta.id}`,
    object: 'list',
    created: meta.created,
    model: meta.model,
    data: job.inputs.map((input, index) => {
      let v = input.kind === 'text' ? embedText(input.text, dim) : embedTokens(input.ids, dim);
      if (job.dimensions !== undefined && job.dimensions < dim) v = shorten(v, job.dimensions);
      return {
        index,
        object: 'embedding',
        embedding: job.base64 ? float32Base64(v) : v,
      };
    }),
    usage: poolingUsage(job.promptTokens),
  };
}

/** vLLM's RerankResponse: every document scored, best first, cut to `top_n` when > 0. */
export function rerankResponse(job: RerankJob, meta: PoolingMeta) {
  const results = job.documents
    .map((text, index) => ({
      index,
      document: { text },
      relevance_score: similarity(job.query, text),
    }))
    .sort((x, y) => y.relevance_score - x.relevance_score || x.index - y.index);
  return {
    id: `rerank-${meta.id}`,
    model: meta.model,
    usage: { total_tokens: job.promptTokens },
    results: job.topN > 0 ? results.slice(0, job.topN) : results,
  };
}

/** vLLM's ScoreResponse: one score per pair, in request order. */
export function scoreResponse(job: ScoreJob, meta: PoolingMeta) {
  return {
    id: `score-${meta.id}`,
    object: 'list',
    created: meta.created,
    model: meta.model,
    data: job.pairs.map(([a, b], index) => ({ index, object: 'score', score: similarity(a, b) })),
    usage: poolingUsage(job.promptTokens),
  };
}
