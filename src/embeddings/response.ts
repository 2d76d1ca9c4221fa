/**
 * Workers' pooling answers in the shapes Switchyard promises, whatever the engine:
 * vLLM adds `id`, `created` and `completion_tokens: 0`; llama.cpp's server answers
 * floats to a `base64` request and has no `/v1/score`; Cohere-style rerankers put
 * usage under `meta`. Anything that is not a usable answer (a count of vectors or
 * scores different from the inputs, a vector of another size than `dimensions` asked
 * for, a non-numeric score, an index out of range) is a
 * 502 `upstream_error`: a wrong answer must not pass for a right one.
 *
 * Token counts come from the worker's `usage`; without one, or with one larger than
 * any tokenizer makes of the inputs (`Meta.ceiling`), the router's estimate: an
 * impossible count would be billed as such, or refused by the usage table.
 */
import { ServiceError } from '../errors/index.js';
import type { EmbeddingsRequest, RerankRequest, ScoreRequest } from './request.js';
import type { Meta } from './routes.js';

function bad(what: string): ServiceError {
  return new ServiceError('upstream_error', {
    message: `The inference worker returned an unusable answer: ${what}.`,
  });
}

function object(v: unknown, what: string): Record<string, unknown> {
  if (v === null || typeof v !== 'object' || Array.isArray(v))
    throw bad(`${what} is not an object`);
  return v as Record<string, unknown>;
}

function list(v: unknown, what: string): unknown[] {
  if (!Array.isArray(v)) throw bad(`${what} is not a list`);
  return v;
}

function promptTokensOf(body: Record<string, unknown>, m: Meta): number {
  const u = body.usage as Record<string, unknown> | undefined;
  const billed = body.meta as { billed_units?: { search_units?: unknown } } | undefined;
  for (const n of [u?.prompt_tokens, u?.total_tokens, billed?.billed_units?.search_units]) {
    if (Number.isInteger(n) && (n as number) >= 0 && (n as number) <= m.ceiling) return n as number;
  }
  return m.estimate;
}

/** Little-endian float32 bytes as base64: OpenAI's `encoding_format: "base64"`. */
export function toBase64(v: readonly number[]): string {
  const f = new Float32Array(v);
  return Buffer.from(f.buffer, f.byteOffset, f.byteLength).toString('base64');
}

/** Standard base64, as OpenAI and vLLM send it (Buffer.from would skip other bytes). */
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** A worker's base64 vector: well-formed, non-empty, whole float32 values. */
function checkBase64(s: string, i: number): Buffer {
  const buf = BASE64.test(s) ? Buffer.from(s, 'base64') : null;
  if (buf === null || buf.length === 0 || buf.length % 4 !== 0) {
    throw bad(`data[${i}].embedding is not a base64 float32 vector`);
  }
  return buf;
}

/** The inverse of `toBase64`, for a worker's base64 answer to a `float` request. */
export function fromBase64(s: string, i = 0): number[] {
  const buf = checkBase64(s, i);
  const out = new Array<number>(buf.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = buf.readFloatLE(i * 4);
  return out;
}

function vector(v: unknown, i: number): number[] | string {
  if (typeof v === 'string') {
    checkBase64(v, i);
    return v;
  }
  if (!Array.isArray(v) || v.length === 0 || !v.every((x) => typeof x === 'number')) {
    throw bad(`data[${i}].embedding is not a vector`);
  }
  return v as number[];
}

export function normalizeEmbeddings(
  worker: unknown,
  r: EmbeddingsRequest,
  meta: Meta,
): { response: unknown; promptTokens: number } {
  const body = object(worker, 'the response');
  const data = list(body.data, 'data');
  if (data.length !== r.inputs.length) {
    throw bad(`${data.length} embeddings for ${r.inputs.length} inputs`);
  }
  const out = new Array<{ object: 'embedding'; index: number; embedding: number[] | string }>(
    data.length,
  );
  data.forEach((raw, pos) => {
    const item = object(raw, `data[${pos}]`);
    const index = item.index ?? pos;
    if (!Number.isInteger(index) || (index as number) < 0 || (index as number) >= data.length) {
      throw bad(`data[${pos}].index is out of range`);
    }
    if (out[index as number]) throw bad(`two embeddings for input ${String(index)}`);
    const v = vector(item.embedding, pos);
    // A worker that ignores `dimensions` (llama.cpp's server does) sends the model's
    // full vectors: the client asked for, and indexes by, that many values.
    const size = typeof v === 'string' ? Buffer.byteLength(v, 'base64') / 4 : v.length;
    if (r.dimensions !== null && size !== r.dimensions) {
      throw bad(`data[${pos}].embedding has ${size} values for dimensions ${r.dimensions}`);
    }
    let embedding: number[] | string;
    if (r.base64) embedding = typeof v === 'string' ? v : toBase64(v);
    else embedding = typeof v === 'string' ? fromBase64(v, pos) : v;
    out[index as number] = { object: 'embedding', index: index as number, embedding };
  });
  const promptTokens = promptTokensOf(body, meta);
  return {
    response: {
      object: 'list',
      data: out,
      model: meta.model,
      usage: { prompt_tokens: promptTokens, total_tokens: promptTokens },
    },
    promptTokens,
  };
}

function score(v: unknown, what: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v)) throw bad(`${what} is not a number`);
  return v;
}

export function normalizeRerank(
  worker: unknown,
  r: RerankRequest,
  meta: Meta,
): { response: unknown; promptTokens: number } {
  const body = object(worker, 'the response');
  const n = r.documents.length;
  const seen = new Set<number>();
  const results = list(body.results, 'results').map((raw, pos) => {
    const item = object(raw, `results[${pos}]`);
    const index = item.index;
    if (!Number.isInteger(index) || (index as number) < 0 || (index as number) >= n) {
      throw bad(`results[${pos}].index is out of range`);
    }
    if (seen.has(index as number)) throw bad(`two results for document ${String(index)}`);
    seen.add(index as number);
    return {
      index: index as number,
      relevance_score: score(item.relevance_score ?? item.score, `results[${pos}].relevance_score`),
    };
  });
  // A worker that ignored top_n answers every document; fewer than asked is wrong.
  const want = r.topN === null ? n : Math.min(r.topN, n);
  if (results.length < want) throw bad(`${results.length} results for ${want} documents`);
  results.sort((a, b) => b.relevance_score - a.relevance_score || a.index - b.index);
  const top = results.slice(0, want);
  const promptTokens = promptTokensOf(body, meta);
  return {
    response: {
      id: meta.id,
      model: meta.model,
      usage: { total_tokens: promptTokens },
      results: top.map((x) =>
        r.returnDocuments ? { ...x, document: { text: r.documents[x.index]! } } : x,
      ),
    },
    promptTokens,
  };
}

export function normalizeScore(
  worker: unknown,
  r: ScoreRequest,
  meta: Meta,
): { response: unknown; promptTokens: number } {
  const body = object(worker, 'the response');
  const data = list(body.data, 'data');
  if (data.length !== r.pairs.length)
    throw bad(`${data.length} scores for ${r.pairs.length} pairs`);
  const out = new Array<{ index: number; object: 'score'; score: number }>(data.length);
  data.forEach((raw, pos) => {
    const item = object(raw, `data[${pos}]`);
    const index = item.index ?? pos;
    if (!Number.isInteger(index) || (index as number) < 0 || (index as number) >= data.length) {
      throw bad(`data[${pos}].index is out of range`);
    }
    if (out[index as number]) throw bad(`two scores for pair ${String(index)}`);
    out[index as number] = {
      index: index as number,
      object: 'score',
      score: score(item.score, `data[${pos}].score`),
    };
  });
  const promptTokens = promptTokensOf(body, meta);
  return {
    response: {
      id: meta.id,
      object: 'list',
      created: meta.created,
      model: meta.model,
      data: out,
      usage: { prompt_tokens: promptTokens, total_tokens: promptTokens },
    },
    promptTokens,
  };
}
