/**
 * A Responses API request (OpenAI's `POST /v1/responses`) checked and turned into
 * the chat-completions body the endpoint's workers understand.
 *
 * Accepted: `input` (a string, or a list of items: messages with `role` user,
 * assistant, system or developer and string or part content — `input_text`,
 * `output_text`, `refusal` parts; `function_call` and `function_call_output` items),
 * `instructions`, `previous_response_id`, `max_output_tokens`, `temperature`,
 * `top_p`, `tools` (type `function`), `tool_choice`, `parallel_tool_calls`,
 * `text.format` (`text`, `json_object`, `json_schema`), `reasoning.effort`,
 * `metadata`, `user`, `service_tier`, `store`, `stream`, `truncation` (`disabled`),
 * `include` (accepted, nothing extra is produced), `model` (informational, as on chat),
 * `conversation` (an id, or `{id}`; not with `previous_response_id`).
 * Refused with 400 `unsupported_value`: `background: true`, built-in tools (web
 * search, file search, computer use…: the endpoint's model runs no such tool),
 * images, files and audio in input (chat's capability checks would refuse them in
 * another shape; a clear refusal here), `truncation: "auto"`.
 *
 * Every rejection names the field as the Responses API does: `input[2].content[0].text`,
 * `text.format.schema`, `tools[1].name`.
 */
import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { formatPath, parseField } from '../http/validate.js';
import { GRAMMAR_FORMATS, UNENFORCEABLE } from '../workers/llama/json-schema.js';

const text = z.string();
const inputText = z.object({ type: z.literal('input_text'), text });
const outputText = z.looseObject({ type: z.literal('output_text'), text });
const refusal = z.object({ type: z.literal('refusal'), refusal: text });

const message = z.object({
  type: z.literal('message').optional(),
  id: z.string().optional(),
  status: z.string().optional(),
  role: z.enum(['user', 'assistant', 'system', 'developer']),
  content: z.union([text, z.array(z.discriminatedUnion('type', [inputText, outputText, refusal]))]),
});
const functionCall = z.object({
  type: z.literal('function_call'),
  id: z.string().optional(),
  status: z.string().optional(),
  call_id: z.string().min(1),
  name: z.string().min(1),
  arguments: z.string(),
});
const functionCallOutput = z.object({
  type: z.literal('function_call_output'),
  id: z.string().optional(),
  status: z.string().optional(),
  call_id: z.string().min(1),
  // A string, or text parts (the SDK's ResponseFunctionCallOutputItemList; images and
  // files in it are refused in parseInputItem).
  output: z.union([text, z.array(inputText)]),
});

export type InputItem =
  z.output<typeof message> | z.output<typeof functionCall> | z.output<typeof functionCallOutput>;

const functionTool = z.object({
  type: z.literal('function'),
  name: z
    .string()
    .min(1)
    .max(64)
    .regex(/^[A-Za-z0-9_-]+$/, 'must be letters, digits, _ and -'),
  description: z.string().nullish(),
  parameters: z.record(z.string(), z.unknown()).nullish(),
  strict: z.boolean().nullish(),
});

const format = z.discriminatedUnion('type', [
  z.object({ type: z.literal('text') }),
  z.object({ type: z.literal('json_object') }),
  z.object({
    type: z.literal('json_schema'),
    name: z
      .string()
      .min(1)
      .max(64)
      .regex(/^[A-Za-z0-9_-]+$/, 'must be letters, digits, _ and -'),
    schema: z.record(z.string(), z.unknown()),
    description: z.string().optional(),
    strict: z.boolean().nullish(),
  }),
]);

const schema = z.looseObject({
  model: z.string().optional(),
  input: z.union([text, z.array(z.unknown())]),
  instructions: z.string().nullish(),
  previous_response_id: z.string().min(1).nullish(),
  max_output_tokens: z.number().int().min(16).nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().min(0).max(1).nullish(),
  tools: z.array(z.unknown()).nullish(),
  tool_choice: z
    .union([
      z.enum(['none', 'auto', 'required']),
      z.object({ type: z.literal('function'), name: z.string().min(1) }),
    ])
    .nullish(),
  parallel_tool_calls: z.boolean().nullish(),
  text: z.object({ format: format.optional() }).nullish(),
  reasoning: z.object({ effort: z.enum(['low', 'medium', 'high']).nullish() }).nullish(),
  metadata: z.record(z.string(), z.string()).nullish(),
  user: z.string().nullish(),
  service_tier: z.enum(['auto', 'default', 'flex', 'priority']).nullish(),
  store: z.boolean().nullish(),
  stream: z.boolean().nullish(),
  truncation: z.enum(['disabled', 'auto']).nullish(),
  include: z.array(z.string()).nullish(),
  background: z.boolean().nullish(),
  // Accepted and type-checked; they change nothing here (no prompt cache to key or
  // keep, no logprobs in the output, no built-in tools for max_tool_calls to bound).
  prompt_cache_key: z.string().nullish(),
  prompt_cache_retention: z.enum(['in_memory', '24h']).nullish(),
  safety_identifier: z.string().nullish(),
  top_logprobs: z.number().int().min(0).max(20).nullish(),
  max_tool_calls: z.number().int().min(1).nullish(),
  stream_options: z.object({ include_obfuscation: z.boolean().nullish() }).nullish(),
  conversation: z.union([z.string().min(1), z.object({ id: z.string().min(1) })]).nullish(),
});

/** A function tool, its `strict` decided (see `strictOf`). */
export type FunctionTool = Omit<z.output<typeof functionTool>, 'strict'> & { strict: boolean };

export interface ResponsesRequest {
  body: z.output<typeof schema>;
  /** The input as items (a string input is one user message). */
  items: InputItem[];
  tools: FunctionTool[];
  stream: boolean;
  store: boolean;
  previousResponseId: string | null;
  /** The conversation the response continues and is added to. */
  conversationId: string | null;
}

type SchemaNode = Record<string, unknown>;

function isNode(v: unknown): v is SchemaNode {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * What OpenAI's strict mode asks of a function's parameters, or why not: the root an
 * object, every object closed (`additionalProperties: false`) with all its properties
 * `required`, through `properties`, `items`, `anyOf` and `$defs`.
 */
function strictProblem(root: unknown): string | null {
  if (!isNode(root) || root.type !== 'object') return 'the root must be an object schema';
  const problem = (n: unknown, at: string): string | null => {
    if (!isNode(n)) return null;
    const props = n.properties;
    const types = Array.isArray(n.type) ? (n.type as unknown[]) : [n.type];
    if (types.includes('object') || props !== undefined) {
      if (n.additionalProperties !== false) {
        return `${at || '/'}: additionalProperties must be false`;
      }
      const required = Array.isArray(n.required) ? (n.required as unknown[]) : [];
      const declared = isNode(props) ? props : {};
      const undeclared = required.find((k) => typeof k !== 'string' || !Object.hasOwn(declared, k));
      if (undeclared !== undefined) {
        return `${at || '/'}: ${JSON.stringify(undeclared)} is required but not in properties`;
      }
      for (const [k, v] of Object.entries(declared)) {
        if (!required.includes(k)) return `${at || '/'}: '${k}' must be required`;
        const inner = problem(v, `${at}/properties/${k}`);
        if (inner !== null) return inner;
      }
    }
    const subs: Array<[unknown, string]> = [[n.items, `${at}/items`]];
    if (Array.isArray(n.anyOf)) n.anyOf.forEach((v, i) => subs.push([v, `${at}/anyOf/${i}`]));
    for (const key of ['$defs', 'definitions']) {
      const defs = n[key];
      if (isNode(defs))
        for (const [k, v] of Object.entries(defs)) subs.push([v, `${at}/${key}/${k}`]);
    }
    for (const [v, p] of subs) {
      const inner = problem(v, p);
      if (inner !== null) return inner;
    }
    return null;
  };
  return problem(root, '');
}

/**
 * Keywords that keep a tool without `strict` from being made strict: what OpenAI's
 * strict mode refuses (`allOf`, `not`, conditionals…), and value constraints that a
 * worker's grammar may not enforce in strict mode (`pattern`, `minimum`, most string
 * `format`s…), so that the default never turns a request that works into a refused one.
 */
const NOT_STRICT_BY_DEFAULT = new Set([
  // Refused by OpenAI's strict mode; the rest: what a worker's grammar cannot enforce.
  'allOf',
  'oneOf',
  'prefixItems',
  ...UNENFORCEABLE,
]);

/** Keywords whose value maps names to schemas. */
const NAMED = new Set(['properties', '$defs', 'definitions']);

function looseOnly(v: unknown): boolean {
  if (Array.isArray(v)) return v.some(looseOnly);
  if (!isNode(v)) return false;
  return Object.entries(v).some(
    // A property or definition named like a keyword is a name, not the keyword.
    ([k, x]) =>
      NOT_STRICT_BY_DEFAULT.has(k) ||
      (k === 'format' && typeof x === 'string' && !GRAMMAR_FORMATS.has(x)) ||
      (NAMED.has(k) && isNode(x) ? Object.values(x).some(looseOnly) : looseOnly(x)),
  );
}

/**
 * A function tool's `strict`. OpenAI's Responses API, unlike chat completions, makes a
 * tool without it strict when its schema can be, and falls back to non-strict otherwise
 * (the SDK: "If omitted, Responses attempts to use strict validation when the schema is
 * compatible, and falls back to non-strict validation otherwise"); `strict: true` on a
 * schema that cannot be is refused, as OpenAI refuses it.
 */
function strictOf(t: z.output<typeof functionTool>, i: number): boolean {
  const problem = t.parameters == null ? 'no parameters' : strictProblem(t.parameters);
  if (t.strict === true && problem !== null && t.parameters != null) {
    throw new ServiceError('invalid_value', {
      message: `Invalid schema for function '${t.name}' with strict: true: ${problem}.`,
      param: `tools[${i}].parameters`,
    });
  }
  if (t.strict != null) return t.strict;
  return problem === null && !looseOnly(t.parameters);
}

function unsupported(param: string, message: string): ServiceError {
  return new ServiceError('unsupported_value', { message, param });
}

/** Refuses image, file and audio parts, which no endpoint here reads, by name. */
function unsupportedParts(parts: readonly unknown[], at: string): void {
  parts.forEach((part, j) => {
    const t = (part as { type?: unknown } | null)?.type;
    if (t === 'input_image' || t === 'input_file' || t === 'input_audio') {
      throw unsupported(
        `${at}[${j}]`,
        `Content of type '${t}' is not supported by this endpoint; send text.`,
      );
    }
  });
}

/** One input item (of `input`, or of a conversation's `items`), `path` naming it in errors. */
export function parseInputItem(v: unknown, path: Array<string | number>): InputItem {
  const at = formatPath(path)!;
  const type = (v as { type?: unknown } | null)?.type;
  if (type === 'function_call') return parseField(functionCall, v, path);
  if (type === 'function_call_output') {
    const output = (v as { output?: unknown }).output;
    if (Array.isArray(output)) unsupportedParts(output, `${at}.output`);
    return parseField(functionCallOutput, v, path);
  }
  if (type === undefined || type === 'message') {
    const content = (v as { content?: unknown } | null)?.content;
    if (Array.isArray(content)) unsupportedParts(content, `${at}.content`);
    return parseField(message, v, path);
  }
  throw unsupported(
    `${at}.type`,
    `Input items of type '${String(type)}' are not supported; use messages, function_call and function_call_output.`,
  );
}

/**
 * An item as stored and listed: `type` explicit, message content as parts, and an id of
 * its own (a client's id is not kept: an item echoed back must not collide).
 */
export function storedItem(it: InputItem): Record<string, unknown> {
  if (it.type === 'function_call') {
    return { ...it, id: newItemId('fc'), status: 'completed' };
  }
  if (it.type === 'function_call_output') {
    return { ...it, id: newItemId('fco'), status: 'completed' };
  }
  const partType = it.role === 'assistant' ? 'output_text' : 'input_text';
  const content =
    typeof it.content === 'string' ? [{ type: partType, text: it.content }] : it.content;
  return {
    type: 'message',
    id: newItemId('msg'),
    status: 'completed',
    role: it.role,
    content,
  };
}

function newItemId(prefix: string): string {
  return `${prefix}_${randomBytes(16).toString('hex')}`;
}

export function parseResponsesRequest(body: unknown): ResponsesRequest {
  const d = parseField(schema, body, []);
  if (d.background) throw unsupported('background', 'Background responses are not supported.');
  // Features that would change the answer, which a silent skip would hide.
  if (d.prompt != null) {
    throw unsupported('prompt', 'Prompt templates are not supported; send the input itself.');
  }
  if (d.context_management != null) {
    throw unsupported('context_management', 'Context management is not supported.');
  }
  if (d.truncation === 'auto') {
    throw unsupported('truncation', "Only 'disabled' truncation is supported.");
  }
  const conv = d.conversation;
  const conversationId = conv == null ? null : typeof conv === 'string' ? conv : conv.id;
  if (conversationId !== null && d.previous_response_id != null) {
    throw new ServiceError('invalid_value', {
      message: "Use either 'conversation' or 'previous_response_id', not both.",
      param: 'conversation',
    });
  }
  if (d.metadata && Object.keys(d.metadata).length > 16) {
    throw new ServiceError('invalid_value', {
      message: "Invalid 'metadata': at most 16 pairs.",
      param: 'metadata',
    });
  }
  for (const [k, v] of Object.entries(d.metadata ?? {})) {
    if (k.length > 64 || v.length > 512) {
      throw new ServiceError('invalid_value', {
        message: "Invalid 'metadata': keys up to 64 characters, values up to 512.",
        param: `metadata.${k}`,
      });
    }
  }
  const tools = (d.tools ?? []).map((t, i) => {
    if (t === null || typeof t !== 'object' || Array.isArray(t)) {
      throw new ServiceError('invalid_type', {
        message: `Invalid 'tools[${i}]': expected an object.`,
        param: `tools[${i}]`,
      });
    }
    const type = (t as { type?: unknown }).type;
    if (type !== 'function') {
      throw unsupported(
        `tools[${i}].type`,
        `Tools of type '${String(type)}' are not supported; only 'function' tools.`,
      );
    }
    const tool = parseField(functionTool, t, ['tools', i]);
    return { ...tool, strict: strictOf(tool, i) };
  });
  const items =
    typeof d.input === 'string'
      ? [{ role: 'user' as const, content: d.input }]
      : d.input.map((v, i) => parseInputItem(v, ['input', i]));
  if (items.length === 0) {
    throw new ServiceError('invalid_value', {
      message: "Invalid 'input': must not be empty.",
      param: 'input',
    });
  }
  return {
    body: d,
    items,
    tools,
    stream: d.stream ?? false,
    store: d.store ?? true,
    previousResponseId: d.previous_response_id ?? null,
    conversationId,
  };
}

type ChatMessage = Record<string, unknown>;

/** Input items as chat messages; consecutive function calls make one assistant turn. */
export function toChatMessages(items: readonly InputItem[]): ChatMessage[] {
  const out: ChatMessage[] = [];
  for (const it of items) {
    if (it.type === 'function_call') {
      const call = {
        id: it.call_id,
        type: 'function',
        function: { name: it.name, arguments: it.arguments },
      };
      const last = out[out.length - 1];
      if (last?.role === 'assistant' && Array.isArray(last.tool_calls)) {
        (last.tool_calls as unknown[]).push(call);
      } else {
        out.push({ role: 'assistant', content: null, tool_calls: [call] });
      }
    } else if (it.type === 'function_call_output') {
      const content =
        typeof it.output === 'string' ? it.output : it.output.map((p) => p.text).join('');
      out.push({ role: 'tool', tool_call_id: it.call_id, content });
    } else if (typeof it.content === 'string') {
      out.push({ role: it.role, content: it.content });
    } else {
      const textOf = (p: (typeof it.content)[number]) => ('text' in p ? p.text : p.refusal);
      out.push({ role: it.role, content: it.content.map(textOf).join('') });
    }
  }
  return out;
}

/** The chat-completions body for the request, after the earlier conversation. */
export function chatBody(r: ResponsesRequest, history: readonly ChatMessage[]): ChatMessage {
  const d = r.body;
  const messages: ChatMessage[] = [];
  if (d.instructions) messages.push({ role: 'system', content: d.instructions });
  messages.push(...history, ...toChatMessages(r.items));
  const body: ChatMessage = { model: d.model ?? 'default', messages };
  if (d.max_output_tokens != null) body.max_completion_tokens = d.max_output_tokens;
  if (d.temperature != null) body.temperature = d.temperature;
  if (d.top_p != null) body.top_p = d.top_p;
  if (r.tools.length > 0) {
    body.tools = r.tools.map((t) => ({
      type: 'function',
      function: {
        name: t.name,
        ...(t.description != null ? { description: t.description } : {}),
        ...(t.parameters != null ? { parameters: t.parameters } : {}),
        strict: t.strict,
      },
    }));
  }
  if (d.tool_choice != null) {
    body.tool_choice =
      typeof d.tool_choice === 'string'
        ? d.tool_choice
        : { type: 'function', function: { name: d.tool_choice.name } };
  }
  if (d.parallel_tool_calls != null && r.tools.length > 0) {
    body.parallel_tool_calls = d.parallel_tool_calls;
  }
  const f = d.text?.format;
  if (f && f.type !== 'text') {
    body.response_format =
      f.type === 'json_object'
        ? { type: 'json_object' }
        : {
            type: 'json_schema',
            json_schema: {
              name: f.name,
              schema: f.schema,
              ...(f.description !== undefined ? { description: f.description } : {}),
              ...(f.strict != null ? { strict: f.strict } : {}),
            },
          };
  }
  if (d.reasoning?.effort) body.reasoning_effort = d.reasoning.effort;
  if (d.metadata) body.metadata = d.metadata;
  if (d.user != null) body.user = d.user;
  if (d.service_tier != null) body.service_tier = d.service_tier;
  if (r.stream) body.stream = true;
  return body;
}

/** A chat-route error's `param` in the Responses API's terms. */
export function responsesParam(param: string | null): string | null {
  if (param === null) return null;
  // Responses' text.format holds json_schema's fields itself (text.format.schema).
  if (param.startsWith('response_format')) {
    return param.replace(/^response_format(\.json_schema)?/, 'text.format');
  }
  if (param.startsWith('tool_choice.function.')) return param.replace('.function.', '.');
  if (param.startsWith('messages')) return 'input';
  const renamed: Record<string, string> = {
    max_completion_tokens: 'max_output_tokens',
    max_tokens: 'max_output_tokens',
    reasoning_effort: 'reasoning.effort',
  };
  if (param in renamed) return renamed[param]!;
  return param.replace(/^tools\[(\d+)\]\.function\./, 'tools[$1].');
}
