/**
 * The OpenAI chat-completions wire format as the llama worker reads and writes it,
 * and the boundary check that turns an untrusted JSON body into a typed `ChatRequest`.
 *
 * The check covers every field the engine acts on (types, ranges, enumerations) and
 * rejects with the spec's error envelope (`ServiceError`: 400, a stable `code`, `param`
 * naming the field path). Fields the engine does not act on (`user`, `metadata`,
 * `store`, `service_tier`, `reasoning_effort`, …) pass through untouched, as they do in
 * llama.cpp's server and vLLM; the router validates those.
 */
import type {
  ChoiceLogprobs,
  FinishReason,
  Usage,
  ChunkChoiceOf,
  ChatCompletionChunkOf,
} from '../wire-common.js';
import { ServiceError } from '../../errors/index.js';

// ---------------------------------------------------------------- request

export interface ContentPart {
  type: string;
  text?: string;
}

export type MessageContent = string | ContentPart[] | null;

export interface WireToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export type Role = 'system' | 'developer' | 'user' | 'assistant' | 'tool';

export interface ChatMessage {
  role: Role;
  content?: MessageContent;
  name?: string;
  tool_call_id?: string;
  tool_calls?: WireToolCall[] | null;
}

/** A JSON Schema as the client sent it; the grammar compiler decides what it supports. */
export type JsonSchema = Record<string, unknown>;

export interface ToolDefinition {
  type: 'function';
  function: { name: string; description?: string; parameters?: JsonSchema; strict?: boolean };
}

export type ToolChoice =
  'auto' | 'none' | 'required' | { type: 'function'; function: { name: string } };

export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  | { type: 'json_schema'; json_schema: { name?: string; schema?: JsonSchema; strict?: boolean } };

export interface ChatRequest {
  model?: string;
  messages: ChatMessage[];
  max_tokens?: number | null;
  max_completion_tokens?: number | null;
  temperature?: number | null;
  top_p?: number | null;
  stream?: boolean | null;
  stream_options?: { include_usage?: boolean | null } | null;
  stop?: string | string[] | null;
  frequency_penalty?: number | null;
  presence_penalty?: number | null;
  n?: number | null;
  seed?: number | null;
  logprobs?: boolean | null;
  top_logprobs?: number | null;
  logit_bias?: Record<string, number> | null;
  tools?: ToolDefinition[] | null;
  tool_choice?: ToolChoice | null;
  parallel_tool_calls?: boolean | null;
  response_format?: ResponseFormat | null;
  prediction?: { type: 'content'; content: string | ContentPart[] } | null;
  /** vLLM extension: keep generating past end-of-generation tokens (benchmarks use it). */
  ignore_eos?: boolean | null;
}

// ---------------------------------------------------------------- response

export type {
  ChoiceLogprobs,
  FinishReason,
  LogprobEntry,
  TopLogprob,
  Usage,
} from '../wire-common.js';

export interface ResponseMessage {
  role: 'assistant';
  content: string | null;
  refusal: null;
  tool_calls?: WireToolCall[];
  annotations: [];
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: Array<{
    index: number;
    message: ResponseMessage;
    logprobs: ChoiceLogprobs | null;
    finish_reason: FinishReason;
  }>;
  usage: Usage;
  system_fingerprint: string | null;
}

export interface ToolCallDelta {
  index: number;
  id?: string;
  type?: 'function';
  function: { name?: string; arguments: string };
}

export interface ChunkDelta {
  role?: 'assistant';
  content?: string | null;
  tool_calls?: ToolCallDelta[];
}

export type ChunkChoice = ChunkChoiceOf<ChunkDelta>;

export type ChatCompletionChunk = ChatCompletionChunkOf<ChunkDelta>;

// ---------------------------------------------------------------- boundary check

const ROLES: ReadonlySet<string> = new Set(['system', 'developer', 'user', 'assistant', 'tool']);

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function absent(v: unknown): v is undefined | null {
  return v === undefined || v === null;
}

function typeError(param: string, expected: string): ServiceError {
  return new ServiceError('invalid_type', { message: `${param} must be ${expected}`, param });
}

function rangeError(param: string, message: string): ServiceError {
  return new ServiceError('invalid_value', { message: `${param} ${message}`, param });
}

function checkNumber(body: Record<string, unknown>, key: string, min: number, max: number): void {
  const v = body[key];
  if (absent(v)) return;
  if (typeof v !== 'number' || !Number.isFinite(v)) throw typeError(key, 'a number');
  if (v < min || v > max) throw rangeError(key, `must be between ${min} and ${max}, got ${v}`);
}

function checkInt(body: Record<string, unknown>, key: string, min: number, max: number): void {
  const v = body[key];
  if (absent(v)) return;
  if (typeof v !== 'number' || !Number.isInteger(v)) throw typeError(key, 'an integer');
  if (v < min || v > max) throw rangeError(key, `must be between ${min} and ${max}, got ${v}`);
}

function checkBool(body: Record<string, unknown>, key: string): void {
  const v = body[key];
  if (!absent(v) && typeof v !== 'boolean') throw typeError(key, 'a boolean');
}

function checkContent(c: unknown, param: string): void {
  if (absent(c) || typeof c === 'string') return;
  if (!Array.isArray(c)) throw typeError(param, 'a string or an array of content parts');
  c.forEach((part: unknown, j) => {
    if (!isObject(part) || typeof part.type !== 'string') {
      throw typeError(`${param}[${j}]`, 'an object with a string `type`');
    }
    if (part.type === 'text' && typeof part.text !== 'string') {
      throw typeError(`${param}[${j}].text`, 'a string');
    }
  });
}

function checkMessages(messages: unknown): void {
  if (absent(messages)) {
    throw new ServiceError('missing_required_parameter', {
      message: 'messages is required',
      param: 'messages',
    });
  }
  if (!Array.isArray(messages)) throw typeError('messages', 'an array');
  if (messages.length === 0) throw rangeError('messages', 'must not be empty');
  messages.forEach((m: unknown, i) => {
    const p = `messages[${i}]`;
    if (!isObject(m)) throw typeError(p, 'an object');
    if (typeof m.role !== 'string' || !ROLES.has(m.role)) {
      throw new ServiceError('invalid_value', {
        message: `${p}.role must be one of system, developer, user, assistant, tool`,
        param: `${p}.role`,
      });
    }
    checkContent(m.content, `${p}.content`);
    if (m.role === 'tool' && typeof m.tool_call_id !== 'string') {
      throw new ServiceError('missing_required_parameter', {
        message: `${p}.tool_call_id is required for tool messages`,
        param: `${p}.tool_call_id`,
      });
    }
    if (!absent(m.tool_calls)) {
      if (!Array.isArray(m.tool_calls)) throw typeError(`${p}.tool_calls`, 'an array');
      m.tool_calls.forEach((tc: unknown, k) => {
        const q = `${p}.tool_calls[${k}]`;
        if (!isObject(tc) || !isObject(tc.function)) throw typeError(q, 'a tool call object');
        if (typeof tc.function.name !== 'string') throw typeError(`${q}.function.name`, 'a string');
        if (typeof tc.function.arguments !== 'string') {
          throw typeError(`${q}.function.arguments`, 'a string holding JSON');
        }
        if (typeof tc.id !== 'string') throw typeError(`${q}.id`, 'a string');
      });
    }
  });
}

function checkTools(body: Record<string, unknown>): Set<string> {
  const names = new Set<string>();
  const tools = body.tools;
  if (absent(tools)) return names;
  if (!Array.isArray(tools)) throw typeError('tools', 'an array');
  tools.forEach((t: unknown, i) => {
    const p = `tools[${i}]`;
    if (!isObject(t) || t.type !== 'function' || !isObject(t.function)) {
      throw typeError(p, 'an object with type "function" and a `function` object');
    }
    if (typeof t.function.name !== 'string' || t.function.name.length === 0) {
      throw typeError(`${p}.function.name`, 'a non-empty string');
    }
    // node-llama-cpp's function-call syntax cannot hold them (it throws; a 500 before).
    if (/\s/.test(t.function.name)) {
      throw rangeError(`${p}.function.name`, 'must not contain spaces, tabs or new lines');
    }
    if (!absent(t.function.parameters) && !isObject(t.function.parameters)) {
      throw typeError(`${p}.function.parameters`, 'a JSON Schema object');
    }
    if (isObject(t.function.parameters))
      checkSchemaSize(t.function.parameters, `${p}.function.parameters`);
    names.add(t.function.name);
  });
  return names;
}

function checkToolChoice(choice: unknown, toolNames: Set<string>): void {
  if (absent(choice)) return;
  if (typeof choice === 'string') {
    if (!['auto', 'none', 'required'].includes(choice)) {
      throw new ServiceError('unsupported_value', {
        message: `tool_choice '${choice}' is not supported; use auto, none, required or a named function`,
        param: 'tool_choice',
      });
    }
    if (choice === 'required' && toolNames.size === 0) {
      throw rangeError('tool_choice', 'is "required" but no tools were given');
    }
    return;
  }
  if (!isObject(choice) || !isObject(choice.function) || typeof choice.function.name !== 'string') {
    throw typeError('tool_choice', 'a string or {type: "function", function: {name}}');
  }
  if (!toolNames.has(choice.function.name)) {
    throw rangeError('tool_choice.function.name', `names a tool that is not in tools`);
  }
}

function checkResponseFormat(rf: unknown): void {
  if (absent(rf)) return;
  if (!isObject(rf)) throw typeError('response_format', 'an object');
  if (rf.type === 'text' || rf.type === 'json_object') return;
  if (rf.type !== 'json_schema') {
    throw new ServiceError('unsupported_value', {
      message: 'response_format.type must be text, json_object or json_schema',
      param: 'response_format.type',
    });
  }
  if (!isObject(rf.json_schema)) {
    throw new ServiceError('missing_required_parameter', {
      message: 'response_format.json_schema is required for type json_schema',
      param: 'response_format.json_schema',
    });
  }
  if (!absent(rf.json_schema.schema) && !isObject(rf.json_schema.schema)) {
    throw typeError('response_format.json_schema.schema', 'a JSON Schema object');
  }
  if (isObject(rf.json_schema.schema)) {
    checkSchemaSize(rf.json_schema.schema, 'response_format.json_schema.schema');
  }
}

/**
 * OpenAI's limits on a structured-output schema: at most 5,000 object properties,
 * 10 levels of nesting and 1,000 enum values in all. A schema is compiled into a
 * grammar on the event loop before generation starts: one with 20,000 enum values
 * held the worker (its other requests and its /metrics health check) for 13 s.
 */
const SCHEMA_LIMITS = { properties: 5000, depth: 10, enumValues: 1000 };

function checkSchemaSize(schema: Record<string, unknown>, param: string): void {
  let properties = 0;
  let enumValues = 0;
  // An explicit stack: a schema may be nested deeper than the call stack allows.
  const stack: Array<[unknown, number]> = [[schema, 1]];
  while (stack.length > 0) {
    const [node, depth] = stack.pop()!;
    if (Array.isArray(node)) {
      for (const x of node) stack.push([x, depth]);
      continue;
    }
    if (!isObject(node)) continue;
    if (depth > SCHEMA_LIMITS.depth) {
      throw rangeError(param, `nests more than ${SCHEMA_LIMITS.depth} levels`);
    }
    if (Array.isArray(node.enum)) enumValues += node.enum.length;
    if (isObject(node.properties)) properties += Object.keys(node.properties).length;
    if (enumValues > SCHEMA_LIMITS.enumValues) {
      throw rangeError(param, `has more than ${SCHEMA_LIMITS.enumValues} enum values`);
    }
    if (properties > SCHEMA_LIMITS.properties) {
      throw rangeError(param, `has more than ${SCHEMA_LIMITS.properties} object properties`);
    }
    for (const [k, v] of Object.entries(node)) {
      if (k === 'enum' || k === 'const' || k === 'default' || k === 'examples') continue;
      // Sub-schemas one level down: under properties/$defs the map itself is not a level.
      const mapOfSchemas = k === 'properties' || k === '$defs' || k === 'definitions';
      if (mapOfSchemas && isObject(v))
        for (const sub of Object.values(v)) stack.push([sub, depth + 1]);
      else stack.push([v, depth + 1]);
    }
  }
}

function checkLogitBias(v: unknown): void {
  if (absent(v)) return;
  if (!isObject(v)) throw typeError('logit_bias', 'an object mapping token ids to numbers');
  for (const [key, bias] of Object.entries(v)) {
    if (!/^\d+$/.test(key)) {
      throw typeError(`logit_bias.${key}`, 'keyed by a token id (a non-negative integer)');
    }
    if (typeof bias !== 'number' || !Number.isFinite(bias)) {
      throw typeError(`logit_bias.${key}`, 'a number');
    }
    if (bias < -100 || bias > 100) {
      throw rangeError(`logit_bias.${key}`, `must be between -100 and 100, got ${bias}`);
    }
  }
}

/** Validates a request body; throws a `ServiceError` (400) naming the offending field. */
export function parseChatRequest(body: unknown): ChatRequest {
  if (!isObject(body)) {
    throw new ServiceError('invalid_body', { message: 'The request body must be a JSON object.' });
  }
  checkMessages(body.messages);
  if (!absent(body.model) && typeof body.model !== 'string') throw typeError('model', 'a string');
  checkInt(body, 'max_tokens', 1, Number.MAX_SAFE_INTEGER);
  checkInt(body, 'max_completion_tokens', 1, Number.MAX_SAFE_INTEGER);
  checkInt(body, 'n', 1, 128);
  checkInt(body, 'seed', -(2 ** 63), 2 ** 63); // int64, as the router
  checkInt(body, 'top_logprobs', 0, 20);
  checkNumber(body, 'temperature', 0, 2);
  checkNumber(body, 'top_p', 0, 1);
  checkNumber(body, 'frequency_penalty', -2, 2);
  checkNumber(body, 'presence_penalty', -2, 2);
  for (const key of ['stream', 'logprobs', 'parallel_tool_calls', 'ignore_eos'])
    checkBool(body, key);
  if (typeof body.top_logprobs === 'number' && body.top_logprobs > 0 && body.logprobs !== true) {
    throw rangeError('top_logprobs', 'requires logprobs to be true');
  }
  const stop = body.stop;
  if (!absent(stop)) {
    if (
      typeof stop !== 'string' &&
      !(Array.isArray(stop) && stop.every((s) => typeof s === 'string'))
    ) {
      throw typeError('stop', 'a string or an array of strings');
    }
    if (Array.isArray(stop) && stop.length > 4)
      throw rangeError('stop', 'allows at most 4 sequences');
  }
  if (!absent(body.stream_options)) {
    if (!isObject(body.stream_options)) throw typeError('stream_options', 'an object');
    checkBool(body.stream_options, 'include_usage');
  }
  checkLogitBias(body.logit_bias);
  checkToolChoice(body.tool_choice, checkTools(body));
  checkResponseFormat(body.response_format);
  const pred = body.prediction;
  if (!absent(pred)) {
    if (!isObject(pred) || pred.type !== 'content') {
      throw typeError('prediction', '{type: "content", content}');
    }
    if (typeof pred.content !== 'string') checkContent(pred.content, 'prediction.content');
  }
  // Every field the engine reads has now been checked against its declared type.
  return body as unknown as ChatRequest;
}

/** Text of a content value: text parts concatenated (non-text parts are rejected earlier). */
export function contentText(content: MessageContent | undefined): string {
  if (content === undefined || content === null) return '';
  if (typeof content === 'string') return content;
  let out = '';
  for (const part of content) if (part.type === 'text') out += part.text ?? '';
  return out;
}
