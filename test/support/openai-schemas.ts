/**
 * Validators for Switchyard's wire shapes, built from OpenAI's own component
 * schemas (`shared/reference/openai-chat-schemas.json`, OpenAPI 3.1) with the
 * service spec's deliberate differences applied on top. Tests call
 * `validateCompletion(body)` etc. and expect `[]`; each string names the JSON
 * pointer of a violation, so a failing `deepEqual` shows what is wrong.
 *
 * Conversion from OpenAPI to JSON Schema 2020-12 for Ajv: `nullable: true` becomes
 * `anyOf [schema, {type: null}]`; format `unixtime` becomes a non-negative integer;
 * other formats and annotation keywords (`x-*`, `discriminator`, `deprecated`,
 * descriptions) are dropped; `#/components/schemas/X` refs point into `$defs`.
 *
 * Where the service spec differs from OpenAI, the spec wins:
 *  - `service_tier` is the endpoint tier `free|cpu|gpu|self_hosted` (or null), and
 *    is present on completions and chunks, like `system_fingerprint` (string or null);
 *  - usage carries both detail objects with every spec field; details other than
 *    `cached_tokens` may be null; `total_tokens` is the sum (checked in code);
 *  - a response message always has `tool_calls` (array with calls, or null) and
 *    `annotations`; a completion always has `usage`;
 *  - finish_reason `tool_calls` implies tool calls (spec: present when finish_reason
 *    is tool_calls), and every `role` is `assistant`.
 * "Exactly the spec's shapes" is enforced by closing the objects we build
 * (completion, chunk, choice, message, delta, usage, logprob entry, tool call):
 * upstream leftovers such as `reasoning_content`, `stop_reason`, `timings` or a
 * logprob `id` fail validation. Error bodies stay open, because 429 adds
 * `retry_after` and `retry_strategy`.
 *
 * The schema file is found through `SWITCHYARD_SHARED_DIR` (the shared directory
 * holding `reference/`), else as `../shared/` beside the repository root.
 */
import { existsSync, readFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv2020, type ErrorObject, type ValidateFunction } from 'ajv/dist/2020.js';

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type JsonObject = { [key: string]: Json };

const SCHEMA_FILE = join('reference', 'openai-chat-schemas.json');

function isObject(v: unknown): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The repository root: the nearest ancestor of this file holding package.json. */
function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    const parent = dirname(dir);
    if (parent === dir) throw new Error('openai-schemas: no package.json above ' + import.meta.url);
    dir = parent;
  }
}

/**
 * The reference schemas: SWITCHYARD_SHARED_DIR if set, else the team's shared
 * directory beside the checkout, else the copy in test/fixtures/ (the same file,
 * OpenAI's MIT-licensed OpenAPI spec, its origin in its `$comment`), so a clone
 * anywhere runs the suite. Update the copy when the shared one changes.
 */
export function schemaFilePath(): string {
  const fromEnv = process.env.SWITCHYARD_SHARED_DIR;
  if (fromEnv) return resolve(fromEnv, SCHEMA_FILE);
  const shared = resolve(repoRoot(), '..', 'shared', SCHEMA_FILE);
  if (existsSync(shared)) return shared;
  return resolve(repoRoot(), 'test', 'fixtures', basename(SCHEMA_FILE));
}

// ---------------------------------------------------------------------------
// OpenAPI 3.1 -> JSON Schema 2020-12

const DROPPED_KEYWORDS = new Set([
  'description',
  'title',
  'example',
  'examples',
  'discriminator',
  'deprecated',
  'externalDocs',
  'xml',
]);

function convert(node: Json): Json {
  if (Array.isArray(node)) return node.map(convert);
  if (!isObject(node)) return node;
  const out: JsonObject = {};
  let nullable = false;
  for (const [key, value] of Object.entries(node)) {
    if (key.startsWith('x-') || DROPPED_KEYWORDS.has(key)) continue;
    if (key === 'nullable') {
      nullable = value === true;
    } else if (key === 'format') {
      // Ajv has no `unixtime`; the reference README defines it. Other formats
      // (uri, date) only annotate fields Switchyard never sends.
      if (value === 'unixtime') out.minimum = 0;
    } else if (key === '$ref' && typeof value === 'string') {
      out.$ref = value.replace('#/components/schemas/', '#/$defs/');
    } else if (key === 'properties' && isObject(value)) {
      const props: JsonObject = {};
      for (const [name, schema] of Object.entries(value)) props[name] = convert(schema);
      out.properties = props;
    } else {
      out[key] = convert(value);
    }
  }
  return nullable ? { anyOf: [out, { type: 'null' }] } : out;
}

// ---------------------------------------------------------------------------
// The spec's differences

const nullableInteger: JsonObject = { anyOf: [{ type: 'integer', minimum: 0 }, { type: 'null' }] };
const count: JsonObject = { type: 'integer', minimum: 0 };

function def(defs: JsonObject, name: string): JsonObject {
  const d = defs[name];
  if (!isObject(d)) throw new Error(`openai-schemas: no component ${name}`);
  return d;
}

function child(node: JsonObject, ...path: string[]): JsonObject {
  let cur: Json = node;
  for (const key of path) {
    if (!isObject(cur) || !isObject(cur[key])) {
      throw new Error(`openai-schemas: unexpected schema layout at ${path.join('.')}`);
    }
    cur = cur[key];
  }
  return cur as JsonObject;
}

function props(node: JsonObject): JsonObject {
  return child(node, 'properties');
}

/** Requires `keys` and closes the object to its declared properties. */
function close(node: JsonObject, keys: string[] = []): void {
  const required = Array.isArray(node.required) ? node.required : [];
  for (const k of keys) if (!required.includes(k)) required.push(k);
  node.required = required;
  node.additionalProperties = false;
}

/** The anyOf branch that is not `{type: null}` of a converted nullable schema. */
function nonNull(node: JsonObject): JsonObject {
  const branches = node.anyOf;
  if (!Array.isArray(branches)) return node;
  for (const b of branches) if (isObject(b) && b.type !== 'null') return b;
  throw new Error('openai-schemas: nullable schema without a non-null branch');
}

function applySpec(defs: JsonObject): void {
  defs.ServiceTier = {
    anyOf: [{ type: 'string', enum: ['free', 'cpu', 'gpu', 'self_hosted'] }, { type: 'null' }],
  };
  const fingerprint: JsonObject = { anyOf: [{ type: 'string' }, { type: 'null' }] };

  // Usage: every spec field present; details other than cached_tokens nullable.
  const usage = def(defs, 'CompletionUsage');
  const u = props(usage);
  u.prompt_tokens = count;
  u.completion_tokens = count;
  u.total_tokens = count;
  const ptd = child(u, 'prompt_tokens_details');
  const ptdProps = props(ptd);
  for (const k of Object.keys(ptdProps)) ptdProps[k] = nullableInteger;
  ptdProps.cached_tokens = count;
  close(ptd, ['cached_tokens', 'audio_tokens']);
  const ctd = child(u, 'completion_tokens_details');
  const ctdProps = props(ctd);
  for (const k of Object.keys(ctdProps)) ctdProps[k] = nullableInteger;
  close(ctd, [
    'reasoning_tokens',
    'audio_tokens',
    'accepted_prediction_tokens',
    'rejected_prediction_tokens',
  ]);
  close(usage, ['prompt_tokens_details', 'completion_tokens_details']);

  // Logprob entries and tool calls: exactly their documented fields.
  const logprob = def(defs, 'ChatCompletionTokenLogprob');
  close(logprob);
  close(child(props(logprob), 'top_logprobs', 'items'));
  const toolCall = def(defs, 'ChatCompletionMessageToolCall');
  close(toolCall);
  close(child(props(toolCall), 'function'));
  close(def(defs, 'ChatCompletionMessageToolCallChunk'));

  // Response message: role, content, refusal, tool_calls (array or null), annotations.
  const message = def(defs, 'ChatCompletionResponseMessage');
  const m = props(message);
  m.tool_calls = { anyOf: [{ $ref: '#/$defs/ChatCompletionMessageToolCalls' }, { type: 'null' }] };
  close(message, ['tool_calls', 'annotations']);

  const completion = def(defs, 'CreateChatCompletionResponse');
  const cp = props(completion);
  cp.system_fingerprint = fingerprint;
  close(completion, ['usage', 'service_tier', 'system_fingerprint']);
  const choice = child(cp, 'choices', 'items');
  close(choice);
  close(nonNull(child(props(choice), 'logprobs')));

  // Stream chunk: the delta carries role, content, refusal, tool_calls only.
  const delta = def(defs, 'ChatCompletionStreamResponseDelta');
  const dp = props(delta);
  delete dp.function_call;
  dp.role = { type: 'string', enum: ['assistant'] };
  close(delta);
  const chunk = def(defs, 'CreateChatCompletionStreamResponse');
  const kp = props(chunk);
  kp.system_fingerprint = fingerprint;
  close(chunk, ['service_tier', 'system_fingerprint']);
  const chunkChoice = child(kp, 'choices', 'items');
  close(chunkChoice);
  close(nonNull(child(props(chunkChoice), 'logprobs')));
}

// ---------------------------------------------------------------------------
// Compilation (lazy: importing this module costs nothing until first use)

interface Validators {
  completion: ValidateFunction;
  chunk: ValidateFunction;
  modelList: ValidateFunction;
  errorResponse: ValidateFunction;
}

let compiled: Validators | undefined;

function validators(): Validators {
  if (compiled) return compiled;
  const file = schemaFilePath();
  if (!existsSync(file)) {
    throw new Error(
      `openai-schemas: ${file} not found; set SWITCHYARD_SHARED_DIR to the shared dir`,
    );
  }
  const doc: unknown = JSON.parse(readFileSync(file, 'utf8'));
  if (!isObject(doc) || !isObject(doc.components) || !isObject(doc.components.schemas)) {
    throw new Error(`openai-schemas: ${file} has no components.schemas`);
  }
  const defs = convert(doc.components.schemas);
  if (!isObject(defs)) throw new Error('openai-schemas: conversion failed');
  applySpec(defs);
  // strict off: OpenAI's schemas omit `type: object` next to `properties` in places.
  const ajv = new Ajv2020({ allErrors: true, strict: false });
  ajv.addSchema({ $id: 'switchyard:openai', $defs: defs });
  const get = (name: string) => ajv.compile({ $ref: `switchyard:openai#/$defs/${name}` });
  compiled = {
    completion: get('CreateChatCompletionResponse'),
    chunk: get('CreateChatCompletionStreamResponse'),
    modelList: get('ListModelsResponse'),
    errorResponse: get('ErrorResponse'),
  };
  return compiled;
}

function describe(errors: ErrorObject[] | null | undefined): string[] {
  if (!errors) return [];
  const out: string[] = [];
  for (const e of errors) {
    const where = e.instancePath === '' ? '/' : e.instancePath;
    let what = e.message ?? e.keyword;
    if (e.keyword === 'additionalProperties') {
      what += ` (${String((e.params as { additionalProperty?: unknown }).additionalProperty)})`;
    } else if (e.keyword === 'enum') {
      what += ` (${JSON.stringify((e.params as { allowedValues?: unknown }).allowedValues)})`;
    }
    const line = `${where} ${what}`;
    if (!out.includes(line)) out.push(line);
  }
  return out;
}

function run(validate: ValidateFunction, obj: unknown): string[] {
  return validate(obj) ? [] : describe(validate.errors);
}

// ---------------------------------------------------------------------------
// Checks JSON Schema cannot express

function checkUsage(usage: unknown, at: string, out: string[]): void {
  if (!isObject(usage)) return;
  const { prompt_tokens: p, completion_tokens: c, total_tokens: t } = usage;
  if (typeof p === 'number' && typeof c === 'number' && t !== p + c) {
    out.push(`${at}/total_tokens must equal prompt_tokens + completion_tokens (${p} + ${c})`);
  }
  const ptd = usage.prompt_tokens_details;
  if (isObject(ptd) && typeof ptd.cached_tokens === 'number' && typeof p === 'number') {
    if (ptd.cached_tokens > p)
      out.push(`${at}/prompt_tokens_details/cached_tokens exceeds prompt_tokens`);
  }
}

export function validateCompletion(obj: unknown): string[] {
  const out = run(validators().completion, obj);
  if (!isObject(obj)) return out;
  checkUsage(obj.usage, '/usage', out);
  if (Array.isArray(obj.choices)) {
    obj.choices.forEach((choice, i) => {
      if (!isObject(choice) || !isObject(choice.message)) return;
      const calls = choice.message.tool_calls;
      if (Array.isArray(calls) && calls.length === 0) {
        out.push(`/choices/${i}/message/tool_calls must be null when there are no calls`);
      }
      if (choice.finish_reason === 'tool_calls' && !Array.isArray(calls)) {
        out.push(
          `/choices/${i}/message/tool_calls must be present when finish_reason is tool_calls`,
        );
      }
    });
  }
  return out;
}

export function validateChunk(obj: unknown): string[] {
  const out = run(validators().chunk, obj);
  if (isObject(obj) && obj.usage !== undefined && obj.usage !== null) {
    checkUsage(obj.usage, '/usage', out);
  }
  return out;
}

export function validateModelList(obj: unknown): string[] {
  return run(validators().modelList, obj);
}

/** An HTTP error body: `{error: {message, type, code, param}}` (extra fields allowed). */
export function validateErrorResponse(obj: unknown): string[] {
  return run(validators().errorResponse, obj);
}

/**
 * The data of a mid-stream SSE `error` event: the envelope, except that a
 * cancellation (code `cancelled`) carries no `type` and every other code must.
 */
export function validateStreamError(obj: unknown): string[] {
  if (!isObject(obj) || !isObject(obj.error)) return ['/ must have an object property error'];
  const e = obj.error;
  const out: string[] = [];
  if (typeof e.message !== 'string') out.push('/error/message must be string');
  if (typeof e.code !== 'string') out.push('/error/code must be string');
  if ('param' in e && e.param !== null && typeof e.param !== 'string') {
    out.push('/error/param must be string or null');
  }
  if (e.code === 'cancelled') {
    if ('type' in e) out.push('/error/type must be absent for a cancellation');
  } else if (typeof e.type !== 'string') {
    out.push('/error/type must be string');
  }
  return out;
}
