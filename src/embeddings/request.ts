/**
 * Request bodies of the pooling routes: embeddings (OpenAI's shape), rerank and
 * score (the shapes vLLM serves, which Cohere- and Jina-style clients also speak).
 *
 * Limits, as OpenAI's embeddings API sets them: `input` is a non-empty string, a
 * non-empty list of at most 2,048 non-empty strings, a list of token ids (one input,
 * however long: the engine checks it against the context), or at most 2,048 such lists; `encoding_format` is `float` or `base64`; `dimensions` a positive
 * integer. Rerank: a non-empty `query`, 1–1,000 `documents` (strings, or objects
 * with a `text` string, as Cohere sends them), `top_n` ≥ 1, `return_documents`
 * boolean (default true: vLLM's and Jina's answer carries them). Score: `text_1` and
 * `text_2`, each a string or a non-empty list of strings, paired 1:1, 1:N or N:N.
 *
 * Every rejection is a 400 `invalid_request_error` whose `param` names the field
 * path (`input[3]`, `documents[0].text`). Whether the input fits the model's
 * context window is the engine's call (its exact count, not our estimate): its
 * 400 comes back as `upstream_rejected` with the engine's message.
 */
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { parseField } from '../http/validate.js';

export const MAX_EMBEDDING_INPUTS = 2048;
export const MAX_RERANK_DOCUMENTS = 1000;

/**
 * Fields the router keeps; every other field is forwarded to the worker unchanged.
 * `priority` orders a vLLM worker's queue: one tenant's own would jump the others'.
 */
export const ROUTER_ONLY_FIELDS = ['user', 'metadata', 'priority'] as const;

const nonEmpty = z.string().min(1, 'must not be empty');

const embeddingsSchema = z.looseObject({
  // Checked by `inputIssue` first (zod's union names no element and mixes up codes).
  input: z.union([z.string(), z.array(z.unknown())]),
  model: z.string().optional(),
  encoding_format: z.enum(['float', 'base64']).nullish(),
  dimensions: z.number().int().min(1).nullish(),
  user: z.string().nullish(),
});

export type EmbeddingInput = { text: string } | { ids: readonly number[] };

export interface EmbeddingsRequest {
  body: Record<string, unknown>;
  inputs: EmbeddingInput[];
  base64: boolean;
  dimensions: number | null;
  user: string | null;
}

/** One token id: a wrong type and a wrong value read differently. */
function tokenIssue(v: unknown, param: string): ServiceError | null {
  if (typeof v !== 'number') return invalid('invalid_type', param, 'expected an integer token id');
  if (!Number.isInteger(v) || v < 0) {
    return invalid('invalid_value', param, 'expected a non-negative integer token id');
  }
  return null;
}

const INPUT_KINDS =
  'a string, an array of strings, an array of token ids or an array of such arrays';

/**
 * `input` checked by hand, so that `param` names the first bad element and a wrong
 * type is `invalid_type`, a bad value `invalid_value`. The 2,048 cap counts inputs:
 * a flat list of token ids is one input, however long (OpenAI's limit on one input
 * is the model's context, which the engine checks).
 */
function inputIssue(input: unknown): ServiceError | null {
  if (input === undefined) return null; // zod: missing_required_parameter
  if (typeof input === 'string') {
    return input.length === 0 ? invalid('invalid_value', 'input', 'must not be empty') : null;
  }
  if (!Array.isArray(input)) return invalid('invalid_type', 'input', `expected ${INPUT_KINDS}`);
  if (input.length === 0) return invalid('invalid_value', 'input', 'must not be empty');
  const first: unknown = input[0];
  if (typeof first === 'number') {
    for (let i = 0; i < input.length; i++) {
      const bad = tokenIssue(input[i], `input[${i}]`);
      if (bad) return bad;
    }
    return null;
  }
  const strings = typeof first === 'string';
  if (!strings && !Array.isArray(first)) {
    return invalid(
      'invalid_type',
      'input[0]',
      'expected a string, a token id or an array of token ids',
    );
  }
  for (let i = 0; i < input.length; i++) {
    const v: unknown = input[i];
    const param = `input[${i}]`;
    if (strings) {
      if (typeof v !== 'string') return invalid('invalid_type', param, 'expected a string');
      if (v.length === 0) return invalid('invalid_value', param, 'must not be empty');
      continue;
    }
    if (!Array.isArray(v)) return invalid('invalid_type', param, 'expected an array of token ids');
    if (v.length === 0) return invalid('invalid_value', param, 'must not be empty');
    for (let j = 0; j < v.length; j++) {
      const bad = tokenIssue(v[j], `${param}[${j}]`);
      if (bad) return bad;
    }
  }
  if (input.length > MAX_EMBEDDING_INPUTS) {
    return invalid('invalid_value', 'input', `must have at most ${MAX_EMBEDDING_INPUTS} items`);
  }
  return null;
}

/** `text_1` / `text_2` of score: a non-empty string or a non-empty list of them. */
function textsIssue(v: unknown, name: string): ServiceError | null {
  if (v === undefined) return null; // zod: missing_required_parameter
  if (typeof v === 'string') {
    return v.length === 0 ? invalid('invalid_value', name, 'must not be empty') : null;
  }
  if (!Array.isArray(v))
    return invalid('invalid_type', name, 'expected a string or an array of strings');
  if (v.length === 0) return invalid('invalid_value', name, 'must not be empty');
  for (let i = 0; i < v.length; i++) {
    const t: unknown = v[i];
    if (typeof t !== 'string') return invalid('invalid_type', `${name}[${i}]`, 'expected a string');
    if (t.length === 0) return invalid('invalid_value', `${name}[${i}]`, 'must not be empty');
  }
  return null;
}

function invalid(
  code: 'invalid_type' | 'invalid_value',
  param: string,
  what: string,
): ServiceError {
  return new ServiceError(code, { message: `Invalid '${param}': ${what}.`, param });
}

/**
 * The body without the optional fields a client sent as null: they mean absent here,
 * and the worker gets its default rather than a null it refuses (vLLM's request
 * models type `encoding_format` and `top_n` without one: a 400).
 */
function withoutNulls(d: object, fields: readonly string[]): Record<string, unknown> {
  const body: Record<string, unknown> = { ...d };
  for (const f of fields) if (body[f] === null) delete body[f];
  return body;
}

export function parseEmbeddingsRequest(body: unknown): EmbeddingsRequest {
  const input = (body as { input?: unknown } | null)?.input;
  if (body !== null && typeof body === 'object' && !Array.isArray(body)) {
    const bad = inputIssue(input);
    if (bad) throw bad;
  }
  const d = parseField(embeddingsSchema, body);
  const raw = d.input;
  let inputs: EmbeddingInput[];
  if (typeof raw === 'string') inputs = [{ text: raw }];
  else if (typeof raw[0] === 'number') inputs = [{ ids: raw as number[] }];
  else if (typeof raw[0] === 'string') inputs = (raw as string[]).map((text) => ({ text }));
  else inputs = (raw as number[][]).map((ids) => ({ ids }));
  return {
    body: withoutNulls(d, ['encoding_format', 'dimensions']),
    inputs,
    base64: d.encoding_format === 'base64',
    dimensions: d.dimensions ?? null,
    user: d.user ?? null,
  };
}

const document = z.union([nonEmpty, z.looseObject({ text: nonEmpty })]);

const rerankSchema = z.looseObject({
  model: z.string().optional(),
  query: nonEmpty,
  documents: z
    .array(document)
    .min(1, 'must not be empty')
    .max(MAX_RERANK_DOCUMENTS, `must have at most ${MAX_RERANK_DOCUMENTS} items`),
  top_n: z.number().int().min(1).nullish(),
  return_documents: z.boolean().nullish(),
  user: z.string().nullish(),
});

export interface RerankRequest {
  body: Record<string, unknown>;
  query: string;
  documents: string[];
  topN: number | null;
  returnDocuments: boolean;
  user: string | null;
}

export function parseRerankRequest(body: unknown): RerankRequest {
  const docs = (body as { documents?: unknown } | null)?.documents;
  if (Array.isArray(docs)) {
    // Name the element (and its `text`) rather than the union as a whole.
    for (let i = 0; i < docs.length && i < MAX_RERANK_DOCUMENTS; i++) {
      const v: unknown = docs[i];
      if (typeof v === 'string') {
        if (v.length === 0) throw invalid('invalid_value', `documents[${i}]`, 'must not be empty');
      } else if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
        const text = (v as { text?: unknown }).text;
        if (typeof text !== 'string' || text.length === 0) {
          throw invalid(
            text === undefined || typeof text === 'string' ? 'invalid_value' : 'invalid_type',
            `documents[${i}].text`,
            'expected a non-empty string',
          );
        }
      } else {
        throw invalid('invalid_type', `documents[${i}]`, 'expected a string or {"text": string}');
      }
    }
  }
  const d = parseField(rerankSchema, body);
  const documents = d.documents.map((x) => (typeof x === 'string' ? x : x.text));
  return {
    // Workers take plain strings (vLLM's documents are strings or multimodal parts).
    body: { ...withoutNulls(d, ['top_n', 'return_documents']), documents },
    query: d.query,
    documents,
    topN: d.top_n ?? null,
    returnDocuments: d.return_documents ?? true,
    user: d.user ?? null,
  };
}

// Checked by `textsIssue` first; this only types the result.
const texts = z.union([z.string(), z.array(z.string())]);

const scoreSchema = z.looseObject({
  model: z.string().optional(),
  text_1: texts,
  text_2: texts,
  user: z.string().nullish(),
});

export interface ScoreRequest {
  body: Record<string, unknown>;
  pairs: Array<[string, string]>;
  user: string | null;
}

export function parseScoreRequest(body: unknown): ScoreRequest {
  if (body !== null && typeof body === 'object' && !Array.isArray(body)) {
    const b = body as { text_1?: unknown; text_2?: unknown };
    const bad = textsIssue(b.text_1, 'text_1') ?? textsIssue(b.text_2, 'text_2');
    if (bad) throw bad;
  }
  const d = parseField(scoreSchema, body);
  const a = typeof d.text_1 === 'string' ? [d.text_1] : d.text_1;
  const b = typeof d.text_2 === 'string' ? [d.text_2] : d.text_2;
  if (a.length > 1 && a.length !== b.length) {
    throw new ServiceError('invalid_value', {
      message: `Invalid 'text_2': ${a.length} texts in text_1 need as many in text_2 (1:1, 1:N or N:N), got ${b.length}.`,
      param: 'text_2',
    });
  }
  if (b.length > MAX_RERANK_DOCUMENTS) {
    throw invalid('invalid_value', 'text_2', `must have at most ${MAX_RERANK_DOCUMENTS} items`);
  }
  const pairs = b.map((t2, i): [string, string] => [a.length === 1 ? a[0]! : a[i]!, t2]);
  return { body: d as Record<string, unknown>, pairs, user: d.user ?? null };
}
