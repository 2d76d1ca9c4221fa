/**
 * The chat request's common case, checked in one pass of plain code.
 *
 * `parseChatRequest` (request.ts) judges a body with one zod schema, and for a body
 * that fails it turns zod's first issue into the error clients see. Nearly every
 * body passes, and for those the schema's generic per-field machinery (a closure
 * and a result object per field, a stripped copy of every nested object) was one of
 * the larger steps of the router's own work before a request left for its worker:
 * 27 µs of the 171 µs between a stream's arrival and its upstream send, stamped when
 * requests come one at a time, and 3.5 of the 50 KB each request allocated. With this
 * check the router served 2.7 % more requests a second on one core (3.1 % more
 * streams) in an A/B of the two builds (docs/BENCHMARKS.md, "Results, 2026-11-27").
 *
 * `conforms(body)` answers one question: would the schema accept this body and
 * return the same values? It is true only when
 * - every field the schema knows meets the schema's type, range, length and
 *   enumeration, exactly as zod checks it (`z.int()` is a safe integer, `max_tokens`
 *   any positive integer, `.optional()` fields may not be null, ...), and
 * - every nested object it accepts (a message, a content part, a tool, a format)
 *   holds only keys the schema declares: zod strips unknown keys from its copy, so
 *   with none the body itself is what zod would return. Unknown top-level keys are
 *   allowed (zod strips them, and nothing reads them from the parsed data; the body
 *   is forwarded as received either way).
 * It covers the shapes clients send (string or text/image/refusal content, tool
 * calls and results, tools, tool_choice, every response_format, prediction,
 * metadata, logit_bias, stop, stream_options). For anything else (an invalid body, an
 * audio or file part, an unknown nested key) it says false and the zod schema
 * decides, so every error, its code and its param, is still the schema's.
 *
 * Written by hand because no validator library does the one thing needed here:
 * zod's exact semantics at the cost of a few type checks. The contract (true ⇒ the
 * schema accepts the body and its output equals the body) is property-tested against
 * the schema itself (request-fast.test.ts).
 */
import {
  MAX_METADATA_KEY_CHARS,
  MAX_METADATA_PAIRS,
  MAX_METADATA_VALUE_CHARS,
  MAX_N,
  MAX_STOP_SEQUENCES,
  MAX_TOP_LOGPROBS,
  SEED_BOUND,
  type RequestData,
} from './request.js';

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** `z.string().nullish()` */
function optString(v: unknown): boolean {
  return v == null || typeof v === 'string';
}

/** `z.boolean().nullish()` */
function optBool(v: unknown): boolean {
  return v == null || typeof v === 'boolean';
}

/** `z.number().min(lo).max(hi).nullish()` (NaN fails both comparisons). */
function optNumber(v: unknown, lo: number, hi: number): boolean {
  return v == null || (typeof v === 'number' && v >= lo && v <= hi);
}

/** `z.int().min(lo).max(hi).nullish()`: zod's int is a safe integer. */
function optInt(v: unknown, lo: number, hi: number): boolean {
  return v == null || (typeof v === 'number' && Number.isSafeInteger(v) && v >= lo && v <= hi);
}

/** request.ts's `positiveInt.nullish()`: any integer from 1 up, safe or not. */
function optPositiveInt(v: unknown): boolean {
  return v == null || (typeof v === 'number' && Number.isInteger(v) && v >= 1);
}

/** `{type: 'text', text: string}` and nothing else. */
function textPart(p: Obj): boolean {
  for (const k in p) if (k !== 'type' && k !== 'text') return false;
  return typeof p.text === 'string';
}

/** A content array: text, image_url and refusal parts (others: the schema decides). */
function contentParts(v: unknown): boolean {
  if (!Array.isArray(v) || v.length === 0) return false;
  for (const p of v as unknown[]) {
    if (!isObj(p)) return false;
    switch (p.type) {
      case 'text':
        if (!textPart(p)) return false;
        break;
      case 'refusal':
        for (const k in p) if (k !== 'type' && k !== 'refusal') return false;
        if (typeof p.refusal !== 'string') return false;
        break;
      case 'image_url': {
        for (const k in p) if (k !== 'type' && k !== 'image_url') return false;
        const img = p.image_url;
        if (!isObj(img) || typeof img.url !== 'string') return false;
        for (const k in img) {
          if (k === 'detail') {
            if (typeof img.detail !== 'string') return false;
          } else if (k !== 'url') return false;
        }
        break;
      }
      default:
        return false;
    }
  }
  return true;
}

function toolCalls(v: unknown): boolean {
  if (!Array.isArray(v)) return false;
  for (const c of v as unknown[]) {
    if (!isObj(c) || typeof c.id !== 'string' || c.type !== 'function') return false;
    for (const k in c) if (k !== 'id' && k !== 'type' && k !== 'function') return false;
    const f = c.function;
    if (!isObj(f) || typeof f.name !== 'string' || typeof f.arguments !== 'string') return false;
    for (const k in f) if (k !== 'name' && k !== 'arguments') return false;
  }
  return true;
}

function message(m: unknown): boolean {
  if (!isObj(m)) return false;
  switch (m.role) {
    case 'system':
    case 'user':
    case 'assistant':
    case 'tool':
    case 'developer':
      break;
    default:
      return false;
  }
  for (const k in m) {
    const v = m[k];
    switch (k) {
      case 'role':
        break;
      case 'content':
        if (!(v == null || typeof v === 'string' || contentParts(v))) return false;
        break;
      case 'name':
      case 'tool_call_id':
        if (!optString(v)) return false;
        break;
      case 'tool_calls':
        if (!(v == null || toolCalls(v))) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

function messages(v: unknown): boolean {
  if (!Array.isArray(v) || v.length === 0) return false;
  for (const m of v as unknown[]) if (!message(m)) return false;
  return true;
}

/**
 * A tool's `function` or a format's `json_schema`: a `name` (at least `minName`
 * characters), an optional string `description`, an optional JSON-schema object under
 * `objectKey`, and `strict`.
 */
function namedSchema(o: unknown, objectKey: 'parameters' | 'schema', minName: number): boolean {
  if (!isObj(o) || typeof o.name !== 'string' || o.name.length < minName) return false;
  for (const k in o) {
    const x = o[k];
    if (k === 'name') continue;
    if (k === 'description') {
      if (typeof x !== 'string') return false;
    } else if (k === objectKey) {
      if (!isObj(x)) return false;
    } else if (k === 'strict') {
      if (!optBool(x)) return false;
    } else {
      return false;
    }
  }
  return true;
}

function tools(v: unknown): boolean {
  if (!Array.isArray(v)) return false;
  for (const t of v as unknown[]) {
    if (!isObj(t) || t.type !== 'function') return false;
    for (const k in t) if (k !== 'type' && k !== 'function') return false;
    // Not held to OpenAI's name pattern, as in the schema; but not empty, no whitespace.
    if (!namedSchema(t.function, 'parameters', 1)) return false;
    if (/\s/.test((t.function as { name: string }).name)) return false;
  }
  return true;
}

function toolChoice(v: unknown): boolean {
  if (v === 'auto' || v === 'none' || v === 'required') return true;
  if (!isObj(v) || v.type !== 'function') return false;
  for (const k in v) if (k !== 'type' && k !== 'function') return false;
  const f = v.function;
  if (!isObj(f) || typeof f.name !== 'string') return false;
  for (const k in f) if (k !== 'name') return false;
  return true;
}

function responseFormat(v: unknown): boolean {
  if (!isObj(v)) return false;
  if (v.type === 'text' || v.type === 'json_object') {
    for (const k in v) if (k !== 'type') return false;
    return true;
  }
  if (v.type !== 'json_schema') return false;
  for (const k in v) if (k !== 'type' && k !== 'json_schema') return false;
  return namedSchema(v.json_schema, 'schema', 0);
}

function prediction(v: unknown): boolean {
  if (!isObj(v) || v.type !== 'content') return false;
  for (const k in v) if (k !== 'type' && k !== 'content') return false;
  const c = v.content;
  if (typeof c === 'string') return true;
  if (!Array.isArray(c)) return false;
  for (const p of c as unknown[]) if (!isObj(p) || p.type !== 'text' || !textPart(p)) return false;
  return true;
}

function stop(v: unknown): boolean {
  if (typeof v === 'string') return true;
  if (!Array.isArray(v) || v.length > MAX_STOP_SEQUENCES) return false;
  for (const s of v as unknown[]) if (typeof s !== 'string') return false;
  return true;
}

function metadata(v: unknown): boolean {
  if (!isObj(v)) return false;
  let pairs = 0;
  for (const k in v) {
    const x = v[k];
    if (k.length > MAX_METADATA_KEY_CHARS) return false;
    if (typeof x !== 'string' || x.length > MAX_METADATA_VALUE_CHARS) return false;
    pairs++;
  }
  return pairs <= MAX_METADATA_PAIRS;
}

const TOKEN_ID = /^\d+$/;

function logitBias(v: unknown): boolean {
  if (!isObj(v)) return false;
  for (const k in v) {
    const x = v[k];
    if (!TOKEN_ID.test(k) || typeof x !== 'number' || !(x >= -100 && x <= 100)) return false;
  }
  return true;
}

function strings(v: unknown): boolean {
  if (!Array.isArray(v)) return false;
  for (const s of v as unknown[]) if (typeof s !== 'string') return false;
  return true;
}

/** Checks of the top-level fields that may be null or hold an array or an object. */
const NESTED = new Map<string, (v: unknown) => boolean>([
  ['stop', stop],
  ['logit_bias', logitBias],
  ['tools', tools],
  ['tool_choice', toolChoice],
  ['response_format', responseFormat],
  ['metadata', metadata],
  ['prediction', prediction],
  ['modalities', strings],
]);

/**
 * True only if the request schema accepts `body` and returns the same values for
 * every field it declares; false when unsure (the schema then decides).
 */
export function conforms(body: unknown): body is RequestData {
  if (!isObj(body)) return false;
  if (typeof body.model !== 'string' || body.model.length === 0) return false;
  if (!messages(body.messages)) return false;
  for (const k in body) {
    const v = body[k];
    switch (k) {
      case 'model':
      case 'messages':
        break;
      case 'max_tokens':
      case 'max_completion_tokens':
        if (!optPositiveInt(v)) return false;
        break;
      case 'temperature':
        if (!optNumber(v, 0, 2)) return false;
        break;
      case 'top_p':
        if (!optNumber(v, 0, 1)) return false;
        break;
      case 'frequency_penalty':
      case 'presence_penalty':
        if (!optNumber(v, -2, 2)) return false;
        break;
      case 'stream':
      case 'logprobs':
      case 'parallel_tool_calls':
      case 'store':
      case 'x_exec':
        if (!optBool(v)) return false;
        break;
      case 'stream_options':
        if (v != null) {
          if (!isObj(v)) return false;
          for (const o in v) if (o !== 'include_usage') return false;
          if (!optBool(v.include_usage)) return false;
        }
        break;
      case 'n':
        if (!optInt(v, 1, MAX_N)) return false;
        break;
      case 'seed':
        // request.ts's seedInt: any integer in [-2^63, 2^63), safe or not.
        if (
          v != null &&
          !(typeof v === 'number' && Number.isInteger(v) && v >= -SEED_BOUND && v < SEED_BOUND)
        ) {
          return false;
        }
        break;
      case 'top_logprobs':
        if (!optInt(v, 0, MAX_TOP_LOGPROBS)) return false;
        break;
      case 'user':
        if (!optString(v)) return false;
        break;
      case 'reasoning_effort':
        if (!(v == null || v === 'low' || v === 'medium' || v === 'high')) return false;
        break;
      case 'service_tier':
        if (!(v == null || v === 'flex' || v === 'priority' || v === 'auto' || v === 'default'))
          return false;
        break;
      default: {
        // The nullable fields that hold arrays or objects; any other key is unknown,
        // accepted and ignored, as by the schema.
        const check = NESTED.get(k);
        if (check !== undefined && v != null && !check(v)) return false;
      }
    }
  }
  return true;
}
