/**
 * The OpenAI chat-completions wire shapes the sim worker reads and writes, and the
 * boundary check that turns an untrusted JSON body into a typed `ChatRequest`.
 *
 * The check is hand-written rather than a zod schema because the sim worker is the
 * benchmark baseline: it only verifies the fields the engine actually reads (types
 * and ranges vLLM itself rejects) and passes every other field through untouched,
 * the way an OpenAI-compatible engine ignores parameters it does not implement.
 */

import type {
  ChoiceLogprobs,
  FinishReason,
  Usage,
  ChunkChoiceOf,
  ChatCompletionChunkOf,
} from '../wire-common.js';

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

export interface ChatMessage {
  role: 'system' | 'developer' | 'user' | 'assistant' | 'tool';
  content?: MessageContent;
  name?: string;
  tool_call_id?: string;
  tool_calls?: WireToolCall[] | null;
}

/** The subset of JSON Schema the placeholder filler understands. */
export interface JsonSchema {
  type?: string | string[];
  properties?: Record<string, JsonSchema>;
  required?: string[];
  items?: JsonSchema;
  enum?: unknown[];
  const?: unknown;
  default?: unknown;
  anyOf?: JsonSchema[];
  oneOf?: JsonSchema[];
  allOf?: JsonSchema[];
  format?: string;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  minItems?: number;
  minLength?: number;
}

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

export interface Prediction {
  type: 'content';
  content: string | ContentPart[];
}

export interface ChatRequest {
  model?: string;
  messages: ChatMessage[];
  max_tokens?: number | null;
  max_completion_tokens?: number | null;
  stream?: boolean | null;
  stream_options?: { include_usage?: boolean | null } | null;
  stop?: string | string[] | null;
  n?: number | null;
  seed?: number | null;
  temperature?: number | null;
  logprobs?: boolean | null;
  top_logprobs?: number | null;
  tools?: ToolDefinition[] | null;
  tool_choice?: ToolChoice | null;
  parallel_tool_calls?: boolean | null;
  response_format?: ResponseFormat | null;
  reasoning_effort?: string | null;
  prediction?: Prediction | null;
  /** vLLM extension: keep generating until the token budget is spent (benchmarks use it). */
  ignore_eos?: boolean | null;
  /**
   * vLLM extension: queue order under `--scheduling-policy priority` (lower first, ties
   * by arrival); any value but 0 is an error under the default `fcfs`.
   */
  priority?: number | null;
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
  refusal: string | null;
  tool_calls?: WireToolCall[];
  /** vLLM's name for the reasoning text; the router strips it before clients see it. */
  reasoning_content?: string;
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
    stop_reason: null;
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
  reasoning_content?: string;
  refusal?: string;
  tool_calls?: ToolCallDelta[];
}

export type ChunkChoice = ChunkChoiceOf<ChunkDelta>;

export type ChatCompletionChunk = ChatCompletionChunkOf<ChunkDelta>;

// ---------------------------------------------------------------- boundary check

export type ParseResult =
  { ok: true; request: ChatRequest } | { ok: false; message: string; param: string | null };

const ROLES = new Set(['system', 'developer', 'user', 'assistant', 'tool']);

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function fail(message: string, param: string | null): ParseResult {
  return { ok: false, message, param };
}

function optionalInt(
  body: Record<string, unknown>,
  key: string,
  min: number,
  max: number,
): string | null {
  const v = body[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== 'number' || !Number.isInteger(v)) return `${key} must be an integer`;
  if (v < min || v > max) return `${key} must be between ${min} and ${max}, got ${v}`;
  return null;
}

function optionalBool(body: Record<string, unknown>, key: string): string | null {
  const v = body[key];
  if (v === undefined || v === null || typeof v === 'boolean') return null;
  return `${key} must be a boolean`;
}

function validContent(c: unknown): boolean {
  if (c === undefined || c === null || typeof c === 'string') return true;
  return Array.isArray(c) && c.every((p) => isObject(p) && typeof p.type === 'string');
}

/** Checks the fields the sim engine reads; everything else passes through untouched. */
export function parseChatRequest(body: unknown): ParseResult {
  if (!isObject(body)) return fail('The request body must be a JSON object.', null);
  const messages = body.messages;
  if (!Array.isArray(messages) || messages.length === 0) {
    return fail('messages must be a non-empty array', 'messages');
  }
  for (let i = 0; i < messages.length; i++) {
    const m: unknown = messages[i];
    if (!isObject(m) || typeof m.role !== 'string' || !ROLES.has(m.role)) {
      return fail(`messages[${i}].role is missing or unknown`, `messages[${i}].role`);
    }
    if (!validContent(m.content)) {
      return fail(`messages[${i}].content has an invalid type`, `messages[${i}].content`);
    }
  }
  if (body.model !== undefined && body.model !== null && typeof body.model !== 'string') {
    return fail('model must be a string', 'model');
  }
  const intErr =
    optionalInt(body, 'max_tokens', 1, Number.MAX_SAFE_INTEGER) ??
    optionalInt(body, 'max_completion_tokens', 1, Number.MAX_SAFE_INTEGER) ??
    optionalInt(body, 'n', 1, 128) ??
    // int64, as the router takes it
    optionalInt(body, 'seed', -(2 ** 63), 2 ** 63) ??
    optionalInt(body, 'top_logprobs', 0, 20) ??
    optionalInt(body, 'priority', Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
  if (intErr) return fail(intErr, intErr.split(' ')[0] ?? null);
  const boolErr =
    optionalBool(body, 'stream') ??
    optionalBool(body, 'logprobs') ??
    optionalBool(body, 'parallel_tool_calls') ??
    optionalBool(body, 'ignore_eos');
  if (boolErr) return fail(boolErr, boolErr.split(' ')[0] ?? null);
  // vLLM rejects top_logprobs without logprobs rather than silently ignoring it.
  if (typeof body.top_logprobs === 'number' && body.top_logprobs > 0 && body.logprobs !== true) {
    return fail('when using `top_logprobs`, `logprobs` must be set to true', 'top_logprobs');
  }
  const stop = body.stop;
  if (
    stop !== undefined &&
    stop !== null &&
    typeof stop !== 'string' &&
    !(Array.isArray(stop) && stop.every((s) => typeof s === 'string'))
  ) {
    return fail('stop must be a string or an array of strings', 'stop');
  }
  if (body.stream_options !== undefined && body.stream_options !== null) {
    if (!isObject(body.stream_options))
      return fail('stream_options must be an object', 'stream_options');
  }
  const tools = body.tools;
  const toolNames = new Set<string>();
  if (tools !== undefined && tools !== null) {
    if (!Array.isArray(tools)) return fail('tools must be an array', 'tools');
    for (let i = 0; i < tools.length; i++) {
      const t: unknown = tools[i];
      if (!isObject(t) || !isObject(t.function) || typeof t.function.name !== 'string') {
        return fail(`tools[${i}].function.name is required`, `tools[${i}].function.name`);
      }
      toolNames.add(t.function.name);
    }
  }
  const choice = body.tool_choice;
  if (choice !== undefined && choice !== null) {
    if (typeof choice === 'string') {
      if (!['auto', 'none', 'required'].includes(choice)) {
        return fail(`tool_choice '${choice}' is not supported`, 'tool_choice');
      }
      if (choice === 'required' && toolNames.size === 0) {
        return fail('tool_choice is required but no tools were given', 'tool_choice');
      }
    } else if (
      isObject(choice) &&
      isObject(choice.function) &&
      typeof choice.function.name === 'string'
    ) {
      if (!toolNames.has(choice.function.name)) {
        return fail(
          `Tool '${choice.function.name}' has not been passed in \`tools\`.`,
          'tool_choice',
        );
      }
    } else {
      return fail('tool_choice must be a string or a named function', 'tool_choice');
    }
  }
  const rf = body.response_format;
  if (rf !== undefined && rf !== null) {
    if (!isObject(rf) || !['text', 'json_object', 'json_schema'].includes(String(rf.type))) {
      return fail(
        'response_format.type must be text, json_object or json_schema',
        'response_format',
      );
    }
    if (rf.type === 'json_schema') {
      const js = rf.json_schema;
      if (!isObject(js)) {
        return fail(
          'response_format.json_schema is required for type json_schema',
          'response_format.json_schema',
        );
      }
      if (js.schema !== undefined && js.schema !== null && !isObject(js.schema)) {
        return fail(
          'response_format.json_schema.schema must be a JSON Schema object',
          'response_format.json_schema.schema',
        );
      }
    }
  }
  const pred = body.prediction;
  if (pred !== undefined && pred !== null) {
    if (!isObject(pred) || pred.type !== 'content' || !validContent(pred.content)) {
      return fail('prediction must be {type: "content", content}', 'prediction');
    }
  }
  if (
    body.reasoning_effort !== undefined &&
    body.reasoning_effort !== null &&
    typeof body.reasoning_effort !== 'string'
  ) {
    return fail('reasoning_effort must be a string', 'reasoning_effort');
  }
  // Every field the engine reads has now been checked against the declared type.
  return { ok: true, request: body as unknown as ChatRequest };
}

/** Text of a message's content: text parts concatenated, other parts as a placeholder. */
export function contentText(content: MessageContent | undefined): string {
  if (content === undefined || content === null) return '';
  if (typeof content === 'string') return content;
  let out = '';
  for (const part of content) out += part.type === 'text' ? (part.text ?? '') : `<${part.type}>`;
  return out;
}
