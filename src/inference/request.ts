/**
 * Validation of the chat-completions request body (POST .../v1/chat/completions).
 *
 * How a body is judged:
 * - One zod schema, built once at module load, checks types, ranges and enumerations;
 *   a short pass in plain code then checks the rules that span fields (tool messages
 *   need `tool_call_id`, `top_logprobs` needs `logprobs: true`, `n > 1` cannot stream,
 *   `stream_options` needs `stream: true`, content part types allowed per role,
 *   `tool_choice` must name a declared tool, ...).
 *   A body of the common shapes that the schema would accept unchanged is recognised by
 *   a one-pass check in plain code instead (request-fast.ts; the hot path), with the
 *   same result; the schema still judges every other body and words every error.
 * - The first problem becomes a `ServiceError`: status 400, type `invalid_request_error`,
 *   a stable code and `param` naming the field the way OpenAI does
 *   (`messages[2].tool_call_id`, `stop[1]`, `metadata.somekey`):
 *     missing_required_parameter  a required field is absent
 *     invalid_type                a field has the wrong JSON type (including non-integers
 *                                 where an integer is expected, as OpenAI reports them)
 *     invalid_value               right type, value out of range or not allowed
 *     unsupported_value           a value the service does not support (reasoning_effort,
 *                                 service_tier, modalities, n > 1 with streaming)
 * - Optional fields may be `null`, meaning omitted: OpenAI's schema marks them nullable and
 *   several client libraries send explicit nulls.
 * - Unknown fields, top-level or inside messages, are accepted and ignored because SDKs
 *   and agent frameworks send extras; the untouched body stays in `body` for forwarding.
 *
 * Normalisation: `maxTokens` is max_completion_tokens ?? max_tokens (and `maxTokensParam`
 * says which one was given); spec defaults are applied (temperature 0.7, top_p 0.9, n 1,
 * stream false, penalties 0, logprobs false, store false); `stop` is always an array;
 * the prediction's text parts are concatenated into `predictionText`.
 */
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { conforms } from './request-fast.js';

// ---------------------------------------------------------------------------------------
// Wire types (messages, tools and formats keep their wire names: they are forwarded and
// rendered as-is).

export type Role = 'system' | 'user' | 'assistant' | 'tool' | 'developer';

export interface TextPart {
  type: 'text';
  text: string;
}
export interface ImageUrlPart {
  type: 'image_url';
  image_url: { url: string; detail?: string };
}
export interface InputAudioPart {
  type: 'input_audio';
  input_audio: { data: string; format: string };
}
export interface FilePart {
  type: 'file';
  file: { file_data?: string; file_id?: string; filename?: string };
}
export interface RefusalPart {
  type: 'refusal';
  refusal: string;
}
export type ContentPart = TextPart | ImageUrlPart | InputAudioPart | FilePart | RefusalPart;

export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export interface ChatMessage {
  role: Role;
  /** Absent or null only on assistant messages that carry tool calls. */
  content?: string | ContentPart[] | null;
  name?: string | null;
  tool_call_id?: string | null;
  tool_calls?: ToolCall[] | null;
}

export interface ToolDefinition {
  type: 'function';
  function: {
    name: string;
    description?: string;
    parameters?: Record<string, unknown>;
    strict?: boolean | null;
  };
}

export type ToolChoice =
  'auto' | 'none' | 'required' | { type: 'function'; function: { name: string } };

export interface JsonSchemaFormat {
  name: string;
  description?: string;
  schema?: Record<string, unknown>;
  strict?: boolean | null;
}

export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  | { type: 'json_schema'; json_schema: JsonSchemaFormat };

export type ReasoningEffort = 'low' | 'medium' | 'high';
export type ServiceTierHint = 'flex' | 'priority' | 'auto' | 'default';

/** A validated, normalised chat-completions request. */
export interface ChatRequest {
  /** The body exactly as received, for forwarding upstream. */
  readonly body: Readonly<Record<string, unknown>>;
  readonly model: string;
  readonly messages: readonly ChatMessage[];
  /** max_completion_tokens ?? max_tokens; undefined when neither was given. */
  readonly maxTokens: number | undefined;
  /** Which field supplied `maxTokens`. */
  readonly maxTokensParam: 'max_completion_tokens' | 'max_tokens' | undefined;
  readonly temperature: number;
  readonly topP: number;
  readonly n: number;
  readonly stream: boolean;
  /** stream_options.include_usage; only meaningful when streaming. */
  readonly includeUsage: boolean;
  readonly stop: readonly string[] | undefined;
  readonly frequencyPenalty: number;
  readonly presencePenalty: number;
  readonly seed: number | undefined;
  readonly logprobs: boolean;
  readonly topLogprobs: number | undefined;
  readonly logitBias: Readonly<Record<string, number>> | undefined;
  readonly tools: readonly ToolDefinition[] | undefined;
  readonly toolChoice: ToolChoice | undefined;
  readonly parallelToolCalls: boolean | undefined;
  readonly responseFormat: ResponseFormat | undefined;
  readonly metadata: Readonly<Record<string, string>> | undefined;
  readonly user: string | undefined;
  readonly store: boolean;
  readonly reasoningEffort: ReasoningEffort | undefined;
  readonly serviceTier: ServiceTierHint | undefined;
  /** The prediction's content, text parts concatenated. */
  readonly predictionText: string | undefined;
  readonly modalities: readonly 'text'[] | undefined;
  /** Opt-in for the execution tool bridge (src/inference/bridge.ts); not interpreted here. */
  readonly xExec: boolean | undefined;
}

export const DEFAULT_TEMPERATURE = 0.7;
export const DEFAULT_TOP_P = 0.9;
export const MAX_N = 128;
export const MAX_STOP_SEQUENCES = 4;
export const MAX_METADATA_PAIRS = 16;
export const MAX_METADATA_KEY_CHARS = 64;
export const MAX_METADATA_VALUE_CHARS = 512;
export const MAX_TOP_LOGPROBS = 20;

// ---------------------------------------------------------------------------------------
// Schemas, built once.

function isJsonObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// A custom check instead of z.record: JSON-schema objects are passed through by reference
// (no copy of possibly large schemas, no special treatment of a `__proto__` key).
const jsonObject = z.custom<Record<string, unknown>>(isJsonObject, {
  params: { expected: 'object' },
});

/**
 * A positive integer of any size. Not `z.int()`: its safe-integer bound would reject
 * `max_tokens: 1e20`, which the spec clamps to the context window instead (Limits).
 * A non-integer is still a type error, as OpenAI reports it.
 */
const positiveInt = z
  .number()
  .refine(Number.isInteger, { params: { expected: 'int' }, abort: true })
  .min(1);
const penalty = z.number().min(-2).max(2);
/**
 * `seed`: OpenAI and vLLM take any signed 64-bit integer, and clients send random
 * 63-bit ones. A JSON number that large arrives as a double (every double past 2^53 is
 * integral), so the bound is on the double: [-2^63, 2^63).
 */
export const SEED_BOUND = 2 ** 63;
const seedInt = z
  .number()
  .refine(Number.isInteger, { params: { expected: 'int' }, abort: true })
  .min(-SEED_BOUND)
  .lt(SEED_BOUND);

const textPart = z.object({ type: z.literal('text'), text: z.string() });
const contentPart = z.discriminatedUnion('type', [
  textPart,
  z.object({
    type: z.literal('image_url'),
    image_url: z.object({ url: z.string(), detail: z.string().optional() }),
  }),
  z.object({
    type: z.literal('input_audio'),
    input_audio: z.object({ data: z.string(), format: z.string() }),
  }),
  z.object({
    type: z.literal('file'),
    file: z.object({
      file_data: z.string().optional(),
      file_id: z.string().optional(),
      filename: z.string().optional(),
    }),
  }),
  z.object({ type: z.literal('refusal'), refusal: z.string() }),
]);

const toolCall = z.object({
  id: z.string(),
  type: z.literal('function'),
  function: z.object({ name: z.string(), arguments: z.string() }),
});

const messageSchema = z.object({
  role: z.enum(['system', 'user', 'assistant', 'tool', 'developer']),
  // Presence rules depend on the role and are checked after parsing.
  content: z.union([z.string(), z.array(contentPart).min(1)]).nullish(),
  name: z.string().nullish(),
  tool_call_id: z.string().nullish(),
  tool_calls: z.array(toolCall).nullish(),
});

const toolSchema = z.object({
  type: z.literal('function'),
  function: z.object({
    // Not held to OpenAI's name pattern (MCP-bridged tools use dotted names), but no
    // whitespace: no engine can call such a function (llama.cpp's refuses it outright).
    name: z.string().min(1).regex(/^\S+$/, 'must not contain whitespace'),
    description: z.string().optional(),
    parameters: jsonObject.optional(),
    strict: z.boolean().nullish(),
  }),
});

const toolChoiceSchema = z.union([
  z.enum(['auto', 'none', 'required']),
  z.object({ type: z.literal('function'), function: z.object({ name: z.string() }) }),
]);

const responseFormatSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('text') }),
  z.object({ type: z.literal('json_object') }),
  z.object({
    type: z.literal('json_schema'),
    json_schema: z.object({
      name: z.string(),
      description: z.string().optional(),
      schema: jsonObject.optional(),
      strict: z.boolean().nullish(),
    }),
  }),
]);

const predictionSchema = z.object({
  type: z.literal('content'),
  content: z.union([z.string(), z.array(textPart)]),
});

const metadataSchema = z
  .record(z.string().max(MAX_METADATA_KEY_CHARS), z.string().max(MAX_METADATA_VALUE_CHARS))
  .refine((m) => Object.keys(m).length <= MAX_METADATA_PAIRS, {
    message: `at most ${MAX_METADATA_PAIRS} key-value pairs are allowed`,
  });

/** Exported for request-fast.test.ts, which holds `conforms` to it. */
export const requestSchema = z.object({
  model: z.string().min(1),
  messages: z.array(messageSchema).min(1),
  max_tokens: positiveInt.nullish(),
  max_completion_tokens: positiveInt.nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().min(0).max(1).nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
  stop: z.union([z.string(), z.array(z.string()).max(MAX_STOP_SEQUENCES)]).nullish(),
  frequency_penalty: penalty.nullish(),
  presence_penalty: penalty.nullish(),
  n: z.int().min(1).max(MAX_N).nullish(),
  seed: seedInt.nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.int().min(0).max(MAX_TOP_LOGPROBS).nullish(),
  logit_bias: z
    .record(
      z.string().regex(/^\d+$/, { message: 'keys must be integer token ids' }),
      z.number().min(-100).max(100),
    )
    .nullish(),
  tools: z.array(toolSchema).nullish(),
  tool_choice: toolChoiceSchema.nullish(),
  parallel_tool_calls: z.boolean().nullish(),
  response_format: responseFormatSchema.nullish(),
  metadata: metadataSchema.nullish(),
  user: z.string().nullish(),
  store: z.boolean().nullish(),
  reasoning_effort: z.enum(['low', 'medium', 'high']).nullish(),
  service_tier: z.enum(['flex', 'priority', 'auto', 'default']).nullish(),
  prediction: predictionSchema.nullish(),
  // Element types come from the schema; "only text" is a support rule checked below.
  modalities: z.array(z.string()).nullish(),
  x_exec: z.boolean().nullish(),
});

/** What the schema returns for a valid body (and what request-fast.ts's `conforms` vouches for). */
export type RequestData = z.output<typeof requestSchema>;

// Compile-time proof that the schemas produce the exported wire types.
const _messageCheck: z.ZodType<ChatMessage> = messageSchema;
const _toolCheck: z.ZodType<ToolDefinition> = toolSchema;
const _toolChoiceCheck: z.ZodType<ToolChoice> = toolChoiceSchema;
const _formatCheck: z.ZodType<ResponseFormat> = responseFormatSchema;

/** Fields whose enumerated values are a support matter rather than a malformed request. */
const UNSUPPORTED_WHEN_INVALID = new Set(['reasoning_effort', 'service_tier', 'modalities']);

/** Content part types each role may send, as in OpenAI's message schemas. */
const PARTS_BY_ROLE: Readonly<Record<Role, ReadonlySet<ContentPart['type']>>> = {
  system: new Set(['text']),
  developer: new Set(['text']),
  tool: new Set(['text']),
  assistant: new Set(['text', 'refusal']),
  user: new Set(['text', 'image_url', 'input_audio', 'file']),
};

// ---------------------------------------------------------------------------------------
// Public API.

/**
 * Validates and normalises a chat-completions body.
 * @throws ServiceError (400, invalid_request_error) on the first problem found.
 */
export function parseChatRequest(body: unknown): ChatRequest {
  // The common valid body skips zod (request-fast.ts); anything else, every error
  // included, is the schema's to judge.
  let d: RequestData;
  if (conforms(body)) {
    d = body;
  } else {
    const parsed = requestSchema.safeParse(body, { reportInput: true });
    if (!parsed.success) throw issueToError(parsed.error.issues[0]!, []);
    d = parsed.data;
  }

  checkMessages(d.messages);

  const stream = d.stream ?? false;
  const n = d.n ?? 1;
  if (stream && n > 1) {
    throw fail(
      'unsupported_value',
      'n',
      "Unsupported value for 'n': only n=1 is supported when 'stream' is true.",
    );
  }
  if (d.stream_options != null && !stream) {
    // OpenAI refuses it too: usage options of a stream that will not be sent.
    throw fail(
      'invalid_value',
      'stream_options',
      "Invalid value for 'stream_options': it is only allowed when 'stream' is true.",
    );
  }
  const logprobs = d.logprobs ?? false;
  if (d.top_logprobs != null && !logprobs) {
    throw fail(
      'invalid_value',
      'top_logprobs',
      "Invalid value for 'top_logprobs': it is only allowed when 'logprobs' is true.",
    );
  }
  const tools = d.tools ?? undefined;
  const toolChoice = d.tool_choice ?? undefined;
  if (toolChoice !== undefined) checkToolChoice(toolChoice, tools);
  if (d.modalities != null && !isTextOnly(d.modalities)) {
    throw fail(
      'unsupported_value',
      'modalities',
      `Unsupported value for 'modalities': only ["text"] is supported.`,
    );
  }

  const maxCompletion = d.max_completion_tokens ?? undefined;
  const maxTokens = d.max_tokens ?? undefined;

  return {
    body: body as Record<string, unknown>,
    model: d.model,
    messages: d.messages,
    maxTokens: maxCompletion ?? maxTokens,
    maxTokensParam:
      maxCompletion !== undefined
        ? 'max_completion_tokens'
        : maxTokens !== undefined
          ? 'max_tokens'
          : undefined,
    temperature: d.temperature ?? DEFAULT_TEMPERATURE,
    topP: d.top_p ?? DEFAULT_TOP_P,
    n,
    stream,
    includeUsage: d.stream_options?.include_usage ?? false,
    stop: d.stop == null ? undefined : typeof d.stop === 'string' ? [d.stop] : d.stop,
    frequencyPenalty: d.frequency_penalty ?? 0,
    presencePenalty: d.presence_penalty ?? 0,
    seed: d.seed ?? undefined,
    logprobs,
    topLogprobs: d.top_logprobs ?? undefined,
    logitBias: d.logit_bias ?? undefined,
    tools,
    toolChoice,
    parallelToolCalls: d.parallel_tool_calls ?? undefined,
    responseFormat: d.response_format ?? undefined,
    metadata: d.metadata ?? undefined,
    user: d.user ?? undefined,
    store: d.store ?? false,
    reasoningEffort: d.reasoning_effort ?? undefined,
    serviceTier: d.service_tier ?? undefined,
    predictionText: d.prediction == null ? undefined : contentText(d.prediction.content),
    modalities: d.modalities == null ? undefined : (d.modalities as 'text'[]),
    xExec: d.x_exec ?? undefined,
  };
}

/** The text of a message: the string content, or its text parts concatenated. */
export function textOf(message: Pick<ChatMessage, 'content'>): string {
  return contentText(message.content);
}

// ---------------------------------------------------------------------------------------
// Cross-field rules.

function checkMessages(messages: readonly ChatMessage[]): void {
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!;
    if (m.content == null) {
      // Assistant turns that only call tools legitimately have no content.
      const callsTools = m.role === 'assistant' && m.tool_calls != null && m.tool_calls.length > 0;
      if (!callsTools) {
        const at = `messages[${i}]`;
        if (m.content === null && m.role !== 'assistant') {
          throw fail(
            'invalid_type',
            `${at}.content`,
            `Invalid type for '${at}.content': expected a string or an array of content parts, but got null instead.`,
          );
        }
        throw missing(`${at}.content`);
      }
    } else if (typeof m.content !== 'string') {
      const allowed = PARTS_BY_ROLE[m.role];
      for (let j = 0; j < m.content.length; j++) {
        const type = m.content[j]!.type;
        if (!allowed.has(type)) {
          const at = `messages[${i}]`;
          throw fail(
            'invalid_value',
            `${at}.content[${j}].type`,
            `Invalid value for '${at}.content[${j}].type': '${type}' parts are not allowed in '${m.role}' messages.`,
          );
        }
      }
    }
    if (m.role === 'tool') checkToolResult(messages, i);
  }
}

/**
 * A tool result answers a call of the assistant turn before it (other tool results may
 * sit between them): the spec's "the matching `tool_call_id`", and OpenAI's rule.
 */
function checkToolResult(messages: readonly ChatMessage[], i: number): void {
  const m = messages[i]!;
  const at = `messages[${i}]`;
  if (m.tool_call_id == null) throw missing(`${at}.tool_call_id`);
  let k = i - 1;
  while (k >= 0 && messages[k]!.role === 'tool') k--;
  const turn = k >= 0 ? messages[k]! : undefined;
  const calls = turn?.role === 'assistant' ? turn.tool_calls : undefined;
  if (!calls || calls.length === 0) {
    throw fail(
      'invalid_value',
      `${at}.role`,
      `Invalid value for '${at}.role': a 'tool' message must answer a tool call of the assistant message before it, and that message has no 'tool_calls'.`,
    );
  }
  if (!calls.some((c) => c.id === m.tool_call_id)) {
    throw fail(
      'invalid_value',
      `${at}.tool_call_id`,
      `Invalid value for '${at}.tool_call_id': '${m.tool_call_id}' is not the id of a tool call in the assistant message before it.`,
    );
  }
}

function checkToolChoice(choice: ToolChoice, tools: readonly ToolDefinition[] | undefined): void {
  // 'auto' and 'none' without tools are harmless and some clients always send them.
  if (choice === 'auto' || choice === 'none') return;
  if (tools === undefined || tools.length === 0) {
    throw fail(
      'invalid_value',
      'tool_choice',
      "Invalid value for 'tool_choice': it requires 'tools' to be specified.",
    );
  }
  if (typeof choice === 'object') {
    const name = choice.function.name;
    if (!tools.some((t) => t.function.name === name)) {
      throw fail(
        'invalid_value',
        'tool_choice.function.name',
        `Invalid value for 'tool_choice.function.name': no tool named '${name}' is defined in 'tools'.`,
      );
    }
  }
}

function isTextOnly(modalities: readonly string[]): boolean {
  if (modalities.length === 0) return false;
  for (const m of modalities) if (m !== 'text') return false;
  return true;
}

function contentText(
  content: string | readonly { type: string; text?: string }[] | null | undefined,
): string {
  if (content == null) return '';
  if (typeof content === 'string') return content;
  let out = '';
  for (const part of content) if (part.type === 'text' && part.text !== undefined) out += part.text;
  return out;
}

// ---------------------------------------------------------------------------------------
// zod issue -> catalogue error.

type Issue = z.core.$ZodIssue;
type RequestErrorCode =
  'missing_required_parameter' | 'invalid_type' | 'invalid_value' | 'unsupported_value';

function fail(code: RequestErrorCode, param: string | null, message: string): ServiceError {
  return new ServiceError(code, { message, param });
}

function missing(param: string): ServiceError {
  return fail('missing_required_parameter', param, `Missing required parameter: '${param}'.`);
}

/** Formats a path the OpenAI way: `messages[2].content[0].text`, `metadata.key`. */
function formatParam(path: ReadonlyArray<PropertyKey>): string | null {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else out += out === '' ? String(seg) : `.${String(seg)}`;
  }
  return out === '' ? null : out;
}

function issueToError(issue: Issue, base: readonly PropertyKey[]): ServiceError {
  const path = base.length === 0 ? issue.path : [...base, ...issue.path];
  const param = formatParam(path);
  const name = param ?? 'body';

  if (path.length === 0) {
    return fail(
      'invalid_type',
      null,
      `The request body must be a JSON object, but got ${describe(issue.input)} instead.`,
    );
  }

  switch (issue.code) {
    case 'invalid_type':
      if (issue.input === undefined) return missing(name);
      return typeError(name, expectedText(issue.expected), issue.input);

    case 'invalid_union':
      return unionToError(issue, path, name);

    case 'invalid_value': {
      if (issue.input === undefined) return missing(name);
      if (!sameKind(issue.values, issue.input)) {
        return typeError(name, describeValuesKind(issue.values), issue.input);
      }
      const allowed = issue.values.map((v) => JSON.stringify(v)).join(', ');
      const code = UNSUPPORTED_WHEN_INVALID.has(String(path[0]))
        ? 'unsupported_value'
        : 'invalid_value';
      const verb = code === 'unsupported_value' ? 'Unsupported' : 'Invalid';
      return fail(
        code,
        param,
        `${verb} value for '${name}': ${quote(issue.input)}. Supported values are: ${allowed}.`,
      );
    }

    case 'custom': {
      const expected: unknown = issue.params?.['expected'];
      if (typeof expected === 'string') {
        if (issue.input === undefined) return missing(name);
        return typeError(name, expectedText(expected), issue.input);
      }
      return fail('invalid_value', param, `Invalid value for '${name}': ${issue.message}.`);
    }

    case 'invalid_key': {
      const inner = issue.issues[0];
      const why =
        inner?.code === 'too_big'
          ? `keys must be at most ${String(inner.maximum)} characters`
          : (inner?.message ?? 'invalid key');
      return fail(
        'invalid_value',
        param,
        `Invalid key ${quote(issue.input)} in '${formatParam(path.slice(0, -1)) ?? name}': ${why}.`,
      );
    }

    case 'too_big':
    case 'too_small':
      return fail('invalid_value', param, `Invalid value for '${name}': ${boundText(issue)}.`);

    default:
      return fail('invalid_value', param, `Invalid value for '${name}': ${issue.message}.`);
  }
}

/**
 * A union failed. For a discriminated union the discriminator field is named; otherwise
 * the branch that got furthest (its type matched, the failure is deeper or a range) is
 * reported, so `stop: ["a", 1]` names `stop[1]` rather than just `stop`.
 */
function unionToError(
  issue: Extract<Issue, { code: 'invalid_union' }>,
  path: readonly PropertyKey[],
  name: string,
): ServiceError {
  if (issue.discriminator !== undefined) {
    // The path already ends at the discriminator key; `input` is the enclosing object.
    const holder = issue.input;
    if (!isJsonObject(holder)) {
      return typeError(formatParam(path.slice(0, -1)) ?? name, 'an object', holder);
    }
    const value = holder[issue.discriminator];
    if (value === undefined) return missing(name);
    const options = ('options' in issue ? (issue.options ?? []) : [])
      .map((o) => JSON.stringify(o))
      .join(', ');
    if (typeof value !== 'string') return typeError(name, 'a string', value);
    return fail(
      'invalid_value',
      formatParam(path),
      `Invalid value for '${name}': ${quote(value)}. Supported values are: ${options}.`,
    );
  }

  if (issue.input === undefined) return missing(name);
  let best: Issue | undefined;
  let bestScore = 0;
  const expected: string[] = [];
  for (const branch of issue.errors) {
    const first = branch[0];
    if (first === undefined) continue;
    const score = branchScore(first);
    if (score > bestScore) {
      best = first;
      bestScore = score;
    }
    const want = rootExpectation(first);
    if (want !== undefined) expected.push(want);
  }
  if (best !== undefined) return issueToError(best, path);
  return typeError(name, expected.join(' or ') || 'a different type', issue.input);
}

/** What a branch wanted at its root, for the "expected X or Y" message. */
function rootExpectation(issue: Issue): string | undefined {
  if (issue.path.length > 0) return undefined;
  if (issue.code === 'invalid_type') return expectedText(issue.expected);
  if (issue.code === 'invalid_value') return describeValuesKind(issue.values);
  if (issue.code === 'custom' && issue.params?.['expected'] === 'object') return 'an object';
  return undefined;
}

/** How far a union branch got: 0 = wrong type at its root, 1 = root range/value, 2 = deeper. */
function branchScore(issue: Issue): number {
  if (issue.path.length > 0) return 2;
  if (issue.code === 'invalid_type') return 0;
  if (issue.code === 'invalid_value' && !sameKind(issue.values, issue.input)) return 0;
  if (issue.code === 'custom' && issue.params?.['expected'] === 'object') return 0;
  return 1;
}

function typeError(name: string, expected: string, input: unknown): ServiceError {
  return fail(
    'invalid_type',
    name === 'body' ? null : name,
    `Invalid type for '${name}': expected ${expected}, but got ${describe(input)} instead.`,
  );
}

function sameKind(values: readonly unknown[], input: unknown): boolean {
  return (
    values.length === 0 ||
    values.some((v) => typeof v === typeof input && (v === null) === (input === null))
  );
}

function describeValuesKind(values: readonly unknown[]): string {
  const v = values[0];
  if (typeof v === 'string') return 'a string';
  if (typeof v === 'number') return 'a number';
  if (typeof v === 'boolean') return 'a boolean';
  return 'a different type';
}

function expectedText(expected: string): string {
  switch (expected) {
    case 'string':
      return 'a string';
    case 'number':
      return 'a number';
    case 'int':
      return 'an integer';
    case 'boolean':
      return 'a boolean';
    case 'array':
      return 'an array';
    case 'object':
    case 'record':
      return 'an object';
    default:
      return expected;
  }
}

/** Echoes a client value in a message, cut short so error bodies stay small. */
function quote(v: unknown): string {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 80 ? `${s.slice(0, 77)}...` : s;
}

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (v === undefined) return 'nothing';
  if (Array.isArray(v)) return 'an array';
  switch (typeof v) {
    case 'string':
      return 'a string';
    case 'number':
      // 1e400 in JSON parses to Infinity: a number out of range, not a decimal.
      if (!Number.isFinite(v)) return 'a number out of range';
      return Number.isInteger(v) ? 'an integer' : 'a decimal number';
    case 'boolean':
      return 'a boolean';
    case 'object':
      return 'an object';
    default:
      return typeof v;
  }
}

function boundText(issue: Extract<Issue, { code: 'too_big' | 'too_small' }>): string {
  const big = issue.code === 'too_big';
  const bound = String(big ? issue.maximum : issue.minimum);
  switch (issue.origin) {
    case 'array':
      return big ? `expected at most ${bound} items` : `expected at least ${bound} item(s)`;
    case 'string':
      return big
        ? `expected at most ${bound} characters`
        : `expected at least ${bound} character(s)`;
    default: {
      const op = big
        ? issue.inclusive === false
          ? '<'
          : '<='
        : issue.inclusive === false
          ? '>'
          : '>=';
      return `expected a value ${op} ${bound}, but got ${String(issue.input)}`;
    }
  }
}
