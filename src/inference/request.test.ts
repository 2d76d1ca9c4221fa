import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import type { ChatCompletionCreateParams } from 'openai/resources/chat/completions';
import { ServiceError } from '../errors/index.js';
import { parseChatRequest, textOf, type ChatMessage } from './request.js';

type Body = Record<string, unknown>;

function base(): Body {
  return { model: 'any-model', messages: [{ role: 'user', content: 'Hello' }] };
}

function withFields(fields: Body): Body {
  return { ...base(), ...fields };
}

/** An assistant tool call with this id. */
function call(id: string) {
  return { id, type: 'function', function: { name: 'f', arguments: '{}' } };
}

function withMessages(...messages: unknown[]): Body {
  return { ...base(), messages };
}

function rejection(body: unknown): ServiceError {
  try {
    parseChatRequest(body);
  } catch (e) {
    assert.ok(e instanceof ServiceError, `expected a ServiceError, got ${String(e)}`);
    return e;
  }
  assert.fail(`expected ${JSON.stringify(body)} to be rejected`);
}

const longKey = 'k'.repeat(65);
const sixteenPairs = Object.fromEntries(Array.from({ length: 16 }, (_, i) => [`k${i}`, 'v']));
const seventeenPairs = { ...sixteenPairs, k16: 'v' };
const tool = {
  type: 'function',
  function: { name: 'get_weather', parameters: { type: 'object' } },
};

// [name, body, code, param]
const BAD: ReadonlyArray<readonly [string, unknown, string, string | null]> = [
  // body
  ['body is an array', [], 'invalid_type', null],
  ['body is null', null, 'invalid_type', null],
  ['body is a string', 'hi', 'invalid_type', null],
  // model
  ['model missing', { messages: base()['messages'] }, 'missing_required_parameter', 'model'],
  ['model empty', withFields({ model: '' }), 'invalid_value', 'model'],
  ['model not a string', withFields({ model: 5 }), 'invalid_type', 'model'],
  ['model null', withFields({ model: null }), 'invalid_type', 'model'],
  // messages
  ['messages missing', { model: 'm' }, 'missing_required_parameter', 'messages'],
  ['messages empty', withFields({ messages: [] }), 'invalid_value', 'messages'],
  ['messages not an array', withFields({ messages: 'hi' }), 'invalid_type', 'messages'],
  ['message not an object', withMessages('hi'), 'invalid_type', 'messages[0]'],
  [
    'role missing',
    withMessages({ content: 'x' }),
    'missing_required_parameter',
    'messages[0].role',
  ],
  [
    'role unknown',
    withMessages({ role: 'robot', content: 'x' }),
    'invalid_value',
    'messages[0].role',
  ],
  [
    'role not a string',
    withMessages({ role: 1, content: 'x' }),
    'invalid_type',
    'messages[0].role',
  ],
  [
    'content missing',
    withMessages({ role: 'user' }),
    'missing_required_parameter',
    'messages[0].content',
  ],
  [
    'content null on user',
    withMessages({ role: 'user', content: null }),
    'invalid_type',
    'messages[0].content',
  ],
  [
    'content a number',
    withMessages({ role: 'user', content: 5 }),
    'invalid_type',
    'messages[0].content',
  ],
  [
    'content empty parts',
    withMessages({ role: 'user', content: [] }),
    'invalid_value',
    'messages[0].content',
  ],
  [
    'part type unknown',
    withMessages({ role: 'user', content: [{ type: 'video', video: {} }] }),
    'invalid_value',
    'messages[0].content[0].type',
  ],
  [
    'part type missing',
    withMessages({ role: 'user', content: [{ text: 'x' }] }),
    'missing_required_parameter',
    'messages[0].content[0].type',
  ],
  [
    'part not an object',
    withMessages({ role: 'user', content: ['x'] }),
    'invalid_type',
    'messages[0].content[0]',
  ],
  [
    'text part text not a string',
    withMessages({ role: 'user', content: [{ type: 'text', text: 1 }] }),
    'invalid_type',
    'messages[0].content[0].text',
  ],
  [
    'text part text missing',
    withMessages({ role: 'user', content: [{ type: 'text' }] }),
    'missing_required_parameter',
    'messages[0].content[0].text',
  ],
  [
    'image part without url',
    withMessages({ role: 'user', content: [{ type: 'image_url', image_url: {} }] }),
    'missing_required_parameter',
    'messages[0].content[0].image_url.url',
  ],
  [
    'image part in a system message',
    withMessages({
      role: 'system',
      content: [{ type: 'image_url', image_url: { url: 'https://x/y.png' } }],
    }),
    'invalid_value',
    'messages[0].content[0].type',
  ],
  [
    'refusal part in a user message',
    withMessages({ role: 'user', content: [{ type: 'refusal', refusal: 'no' }] }),
    'invalid_value',
    'messages[0].content[0].type',
  ],
  [
    'name not a string',
    withMessages({ role: 'user', content: 'x', name: 3 }),
    'invalid_type',
    'messages[0].name',
  ],
  [
    'tool message without tool_call_id',
    withMessages(
      { role: 'user', content: 'x' },
      { role: 'assistant', content: 'y' },
      { role: 'tool', content: 'z' },
    ),
    'missing_required_parameter',
    'messages[2].tool_call_id',
  ],
  [
    'tool message not after an assistant tool call',
    withMessages(
      { role: 'user', content: 'x' },
      { role: 'tool', content: 'z', tool_call_id: 'c1' },
    ),
    'invalid_value',
    'messages[1].role',
  ],
  [
    'tool message after an assistant turn without tool_calls',
    withMessages(
      { role: 'user', content: 'x' },
      { role: 'assistant', content: 'y' },
      { role: 'tool', content: 'z', tool_call_id: 'c1' },
    ),
    'invalid_value',
    'messages[2].role',
  ],
  [
    'tool message after a user turn that follows the call',
    withMessages(
      { role: 'assistant', content: null, tool_calls: [call('c1')] },
      { role: 'tool', content: 'z', tool_call_id: 'c1' },
      { role: 'user', content: 'more' },
      { role: 'tool', content: 'z', tool_call_id: 'c1' },
    ),
    'invalid_value',
    'messages[3].role',
  ],
  [
    'tool_call_id matching no call of the assistant turn',
    withMessages(
      { role: 'user', content: 'x' },
      { role: 'assistant', content: null, tool_calls: [call('c1'), call('c2')] },
      { role: 'tool', content: 'one', tool_call_id: 'c1' },
      { role: 'tool', content: 'three', tool_call_id: 'c3' },
    ),
    'invalid_value',
    'messages[3].tool_call_id',
  ],
  [
    'tool_call_id not a string',
    withMessages({ role: 'tool', content: 'z', tool_call_id: 7 }),
    'invalid_type',
    'messages[0].tool_call_id',
  ],
  [
    'assistant without content or tool_calls',
    withMessages({ role: 'assistant' }),
    'missing_required_parameter',
    'messages[0].content',
  ],
  [
    'assistant null content and empty tool_calls',
    withMessages({ role: 'assistant', content: null, tool_calls: [] }),
    'missing_required_parameter',
    'messages[0].content',
  ],
  [
    'tool_calls not an array',
    withMessages({ role: 'assistant', content: null, tool_calls: {} }),
    'invalid_type',
    'messages[0].tool_calls',
  ],
  [
    'tool call type not function',
    withMessages({
      role: 'assistant',
      tool_calls: [{ id: 'c1', type: 'tool', function: { name: 'f', arguments: '{}' } }],
    }),
    'invalid_value',
    'messages[0].tool_calls[0].type',
  ],
  [
    'tool call arguments not a string',
    withMessages({
      role: 'assistant',
      tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: {} } }],
    }),
    'invalid_type',
    'messages[0].tool_calls[0].function.arguments',
  ],
  [
    'tool call id missing',
    withMessages({
      role: 'assistant',
      tool_calls: [{ type: 'function', function: { name: 'f', arguments: '{}' } }],
    }),
    'missing_required_parameter',
    'messages[0].tool_calls[0].id',
  ],
  // max tokens
  ['max_tokens zero', withFields({ max_tokens: 0 }), 'invalid_value', 'max_tokens'],
  ['max_tokens negative', withFields({ max_tokens: -5 }), 'invalid_value', 'max_tokens'],
  ['max_tokens decimal', withFields({ max_tokens: 1.5 }), 'invalid_type', 'max_tokens'],
  ['max_tokens string', withFields({ max_tokens: '100' }), 'invalid_type', 'max_tokens'],
  [
    'max_completion_tokens zero',
    withFields({ max_completion_tokens: 0 }),
    'invalid_value',
    'max_completion_tokens',
  ],
  [
    'max_completion_tokens decimal',
    withFields({ max_completion_tokens: 2.5 }),
    'invalid_type',
    'max_completion_tokens',
  ],
  // sampling
  ['temperature above 2', withFields({ temperature: 2.01 }), 'invalid_value', 'temperature'],
  ['temperature below 0', withFields({ temperature: -0.1 }), 'invalid_value', 'temperature'],
  ['temperature string', withFields({ temperature: '0.5' }), 'invalid_type', 'temperature'],
  ['top_p above 1', withFields({ top_p: 1.5 }), 'invalid_value', 'top_p'],
  ['top_p below 0', withFields({ top_p: -1 }), 'invalid_value', 'top_p'],
  [
    'frequency_penalty above 2',
    withFields({ frequency_penalty: 3 }),
    'invalid_value',
    'frequency_penalty',
  ],
  [
    'frequency_penalty below -2',
    withFields({ frequency_penalty: -2.5 }),
    'invalid_value',
    'frequency_penalty',
  ],
  [
    'presence_penalty above 2',
    withFields({ presence_penalty: 2.5 }),
    'invalid_value',
    'presence_penalty',
  ],
  [
    'presence_penalty boolean',
    withFields({ presence_penalty: true }),
    'invalid_type',
    'presence_penalty',
  ],
  ['seed decimal', withFields({ seed: 1.5 }), 'invalid_type', 'seed'],
  ['seed string', withFields({ seed: '42' }), 'invalid_type', 'seed'],
  ['seed 2^63 (past int64)', withFields({ seed: 2 ** 63 }), 'invalid_value', 'seed'],
  ['seed below -2^63', withFields({ seed: -(2 ** 64) }), 'invalid_value', 'seed'],
  // n and streaming
  ['n zero', withFields({ n: 0 }), 'invalid_value', 'n'],
  ['n above cap', withFields({ n: 129 }), 'invalid_value', 'n'],
  ['n decimal', withFields({ n: 2.5 }), 'invalid_type', 'n'],
  ['n > 1 while streaming', withFields({ n: 2, stream: true }), 'unsupported_value', 'n'],
  ['stream string', withFields({ stream: 'true' }), 'invalid_type', 'stream'],
  [
    'stream_options not an object',
    withFields({ stream_options: true }),
    'invalid_type',
    'stream_options',
  ],
  [
    'stream_options without stream',
    withFields({ stream_options: { include_usage: true } }),
    'invalid_value',
    'stream_options',
  ],
  [
    'stream_options with stream false',
    withFields({ stream: false, stream_options: { include_usage: false } }),
    'invalid_value',
    'stream_options',
  ],
  [
    'include_usage not a boolean',
    withFields({ stream: true, stream_options: { include_usage: 'yes' } }),
    'invalid_type',
    'stream_options.include_usage',
  ],
  // stop
  ['stop number', withFields({ stop: 5 }), 'invalid_type', 'stop'],
  ['stop five sequences', withFields({ stop: ['a', 'b', 'c', 'd', 'e'] }), 'invalid_value', 'stop'],
  ['stop element not a string', withFields({ stop: ['a', 1] }), 'invalid_type', 'stop[1]'],
  // logprobs
  ['logprobs string', withFields({ logprobs: 'yes' }), 'invalid_type', 'logprobs'],
  [
    'top_logprobs without logprobs',
    withFields({ top_logprobs: 2 }),
    'invalid_value',
    'top_logprobs',
  ],
  [
    'top_logprobs with logprobs false',
    withFields({ logprobs: false, top_logprobs: 2 }),
    'invalid_value',
    'top_logprobs',
  ],
  [
    'top_logprobs above 20',
    withFields({ logprobs: true, top_logprobs: 21 }),
    'invalid_value',
    'top_logprobs',
  ],
  [
    'top_logprobs negative',
    withFields({ logprobs: true, top_logprobs: -1 }),
    'invalid_value',
    'top_logprobs',
  ],
  [
    'top_logprobs decimal',
    withFields({ logprobs: true, top_logprobs: 1.5 }),
    'invalid_type',
    'top_logprobs',
  ],
  // logit_bias
  ['logit_bias array', withFields({ logit_bias: [1] }), 'invalid_type', 'logit_bias'],
  [
    'logit_bias non-integer key',
    withFields({ logit_bias: { abc: 1 } }),
    'invalid_value',
    'logit_bias.abc',
  ],
  [
    'logit_bias negative key',
    withFields({ logit_bias: { '-5': 1 } }),
    'invalid_value',
    'logit_bias.-5',
  ],
  [
    'logit_bias above 100',
    withFields({ logit_bias: { '50256': 101 } }),
    'invalid_value',
    'logit_bias.50256',
  ],
  [
    'logit_bias below -100',
    withFields({ logit_bias: { '7': -100.5 } }),
    'invalid_value',
    'logit_bias.7',
  ],
  [
    'logit_bias value string',
    withFields({ logit_bias: { '7': '1' } }),
    'invalid_type',
    'logit_bias.7',
  ],
  // metadata
  ['metadata array', withFields({ metadata: ['a'] }), 'invalid_type', 'metadata'],
  ['metadata 17 pairs', withFields({ metadata: seventeenPairs }), 'invalid_value', 'metadata'],
  [
    'metadata key too long',
    withFields({ metadata: { [longKey]: 'v' } }),
    'invalid_value',
    `metadata.${longKey}`,
  ],
  [
    'metadata value not a string',
    withFields({ metadata: { somekey: 1 } }),
    'invalid_type',
    'metadata.somekey',
  ],
  [
    'metadata value too long',
    withFields({ metadata: { somekey: 'v'.repeat(513) } }),
    'invalid_value',
    'metadata.somekey',
  ],
  // enumerations the service does not support
  [
    'reasoning_effort unknown',
    withFields({ reasoning_effort: 'extreme' }),
    'unsupported_value',
    'reasoning_effort',
  ],
  [
    'reasoning_effort minimal',
    withFields({ reasoning_effort: 'minimal' }),
    'unsupported_value',
    'reasoning_effort',
  ],
  [
    'reasoning_effort number',
    withFields({ reasoning_effort: 3 }),
    'invalid_type',
    'reasoning_effort',
  ],
  [
    'service_tier unknown',
    withFields({ service_tier: 'scale' }),
    'unsupported_value',
    'service_tier',
  ],
  [
    'modalities with audio',
    withFields({ modalities: ['text', 'audio'] }),
    'unsupported_value',
    'modalities',
  ],
  [
    'modalities audio only',
    withFields({ modalities: ['audio'] }),
    'unsupported_value',
    'modalities',
  ],
  ['modalities empty', withFields({ modalities: [] }), 'unsupported_value', 'modalities'],
  ['modalities string', withFields({ modalities: 'text' }), 'invalid_type', 'modalities'],
  ['modalities element number', withFields({ modalities: [1] }), 'invalid_type', 'modalities[0]'],
  // tools
  ['tools not an array', withFields({ tools: tool }), 'invalid_type', 'tools'],
  [
    'tool type not function',
    withFields({ tools: [{ ...tool, type: 'custom' }] }),
    'invalid_value',
    'tools[0].type',
  ],
  [
    'tool function missing',
    withFields({ tools: [{ type: 'function' }] }),
    'missing_required_parameter',
    'tools[0].function',
  ],
  [
    'tool name missing',
    withFields({ tools: [{ type: 'function', function: {} }] }),
    'missing_required_parameter',
    'tools[0].function.name',
  ],
  [
    'tool name with a space',
    withFields({ tools: [{ type: 'function', function: { name: 'get weather' } }] }),
    'invalid_value',
    'tools[0].function.name',
  ],
  [
    'tool name empty',
    withFields({ tools: [{ type: 'function', function: { name: '' } }] }),
    'invalid_value',
    'tools[0].function.name',
  ],
  [
    'tool parameters an array',
    withFields({ tools: [{ type: 'function', function: { name: 'f', parameters: [] } }] }),
    'invalid_type',
    'tools[0].function.parameters',
  ],
  [
    'tool strict a string',
    withFields({ tools: [{ type: 'function', function: { name: 'f', strict: 'yes' } }] }),
    'invalid_type',
    'tools[0].function.strict',
  ],
  [
    'second tool description a number',
    withFields({ tools: [tool, { type: 'function', function: { name: 'g', description: 1 } }] }),
    'invalid_type',
    'tools[1].function.description',
  ],
  [
    'parallel_tool_calls string',
    withFields({ parallel_tool_calls: 'yes' }),
    'invalid_type',
    'parallel_tool_calls',
  ],
  // tool_choice
  [
    'tool_choice unknown string',
    withFields({ tools: [tool], tool_choice: 'any' }),
    'invalid_value',
    'tool_choice',
  ],
  ['tool_choice number', withFields({ tool_choice: 1 }), 'invalid_type', 'tool_choice'],
  [
    'tool_choice object type wrong',
    withFields({ tools: [tool], tool_choice: { type: 'tool', function: { name: 'get_weather' } } }),
    'invalid_value',
    'tool_choice.type',
  ],
  [
    'tool_choice function name missing',
    withFields({ tools: [tool], tool_choice: { type: 'function', function: {} } }),
    'missing_required_parameter',
    'tool_choice.function.name',
  ],
  [
    'tool_choice names an undeclared tool',
    withFields({ tools: [tool], tool_choice: { type: 'function', function: { name: 'nope' } } }),
    'invalid_value',
    'tool_choice.function.name',
  ],
  [
    'tool_choice required without tools',
    withFields({ tool_choice: 'required' }),
    'invalid_value',
    'tool_choice',
  ],
  // response_format
  [
    'response_format string',
    withFields({ response_format: 'json' }),
    'invalid_type',
    'response_format',
  ],
  [
    'response_format type missing',
    withFields({ response_format: {} }),
    'missing_required_parameter',
    'response_format.type',
  ],
  [
    'response_format type unknown',
    withFields({ response_format: { type: 'yaml' } }),
    'invalid_value',
    'response_format.type',
  ],
  [
    'json_schema missing',
    withFields({ response_format: { type: 'json_schema' } }),
    'missing_required_parameter',
    'response_format.json_schema',
  ],
  [
    'json_schema name missing',
    withFields({ response_format: { type: 'json_schema', json_schema: { schema: {} } } }),
    'missing_required_parameter',
    'response_format.json_schema.name',
  ],
  [
    'json_schema name not a string',
    withFields({ response_format: { type: 'json_schema', json_schema: { name: 5 } } }),
    'invalid_type',
    'response_format.json_schema.name',
  ],
  [
    'json_schema schema not an object',
    withFields({
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: 'obj' } },
    }),
    'invalid_type',
    'response_format.json_schema.schema',
  ],
  [
    'json_schema strict not a boolean',
    withFields({ response_format: { type: 'json_schema', json_schema: { name: 'x', strict: 1 } } }),
    'invalid_type',
    'response_format.json_schema.strict',
  ],
  // prediction
  ['prediction string', withFields({ prediction: 'text' }), 'invalid_type', 'prediction'],
  [
    'prediction type missing',
    withFields({ prediction: { content: 'x' } }),
    'missing_required_parameter',
    'prediction.type',
  ],
  [
    'prediction type wrong',
    withFields({ prediction: { type: 'text', content: 'x' } }),
    'invalid_value',
    'prediction.type',
  ],
  [
    'prediction content missing',
    withFields({ prediction: { type: 'content' } }),
    'missing_required_parameter',
    'prediction.content',
  ],
  [
    'prediction content number',
    withFields({ prediction: { type: 'content', content: 5 } }),
    'invalid_type',
    'prediction.content',
  ],
  [
    'prediction part not text',
    withFields({ prediction: { type: 'content', content: [{ type: 'image_url', text: 'x' }] } }),
    'invalid_value',
    'prediction.content[0].type',
  ],
  [
    'prediction part text missing',
    withFields({ prediction: { type: 'content', content: [{ type: 'text' }] } }),
    'missing_required_parameter',
    'prediction.content[0].text',
  ],
  // the remaining scalars
  ['user number', withFields({ user: 5 }), 'invalid_type', 'user'],
  ['store string', withFields({ store: 'no' }), 'invalid_type', 'store'],
  ['x_exec string', withFields({ x_exec: 'true' }), 'invalid_type', 'x_exec'],
];

describe('parseChatRequest rejects', () => {
  for (const [name, body, code, param] of BAD) {
    it(`${name} → ${code} ${param ?? '(body)'}`, () => {
      const e = rejection(body);
      assert.equal(e.status, 400);
      assert.equal(e.type, 'invalid_request_error');
      assert.equal(e.code, code);
      assert.equal(e.param, param);
      assert.ok(e.message.length > 0);
    });
  }

  it('renders the spec envelope', () => {
    const e = rejection(withFields({ temperature: 3 }));
    const env = e.toEnvelope();
    assert.deepEqual(Object.keys(env.error).sort(), ['code', 'message', 'param', 'type']);
    assert.equal(env.error.param, 'temperature');
    assert.match(env.error.message, /temperature/);
  });

  it('names the missing field in the message', () => {
    const e = rejection(withMessages({ role: 'tool', content: 'x' }));
    assert.equal(e.message, "Missing required parameter: 'messages[0].tool_call_id'.");
  });

  it('calls a number JSON cannot hold (1e400 parses to Infinity) out of range', () => {
    const e = rejection(
      JSON.parse('{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1e400}'),
    );
    assert.equal(e.param, 'temperature');
    assert.match(e.message, /out of range/);
    assert.doesNotMatch(e.message, /decimal/);
  });

  it('keeps echoed values short', () => {
    const e = rejection(withFields({ reasoning_effort: 'x'.repeat(10_000) }));
    assert.ok(e.message.length < 300, e.message);
  });
});

describe('parseChatRequest accepts', () => {
  it('applies the spec defaults', () => {
    const r = parseChatRequest(base());
    assert.equal(r.model, 'any-model');
    assert.equal(r.temperature, 0.7);
    assert.equal(r.topP, 0.9);
    assert.equal(r.n, 1);
    assert.equal(r.stream, false);
    assert.equal(r.includeUsage, false);
    assert.equal(r.frequencyPenalty, 0);
    assert.equal(r.presencePenalty, 0);
    assert.equal(r.logprobs, false);
    assert.equal(r.store, false);
    assert.equal(r.maxTokens, undefined);
    assert.equal(r.maxTokensParam, undefined);
    assert.equal(r.stop, undefined);
    assert.equal(r.predictionText, undefined);
    assert.equal(r.xExec, undefined);
  });

  const MAX_TOKENS: ReadonlyArray<readonly [string, Body, number | undefined, string | undefined]> =
    [
      ['max_tokens only', { max_tokens: 100 }, 100, 'max_tokens'],
      ['max_completion_tokens only', { max_completion_tokens: 200 }, 200, 'max_completion_tokens'],
      [
        'both: max_completion_tokens wins',
        { max_tokens: 100, max_completion_tokens: 200 },
        200,
        'max_completion_tokens',
      ],
      [
        'both, smaller completion value still wins',
        { max_tokens: 500, max_completion_tokens: 20 },
        20,
        'max_completion_tokens',
      ],
      [
        'null max_completion_tokens falls back',
        { max_tokens: 7, max_completion_tokens: null },
        7,
        'max_tokens',
      ],
      [
        'very large values pass (clamped later)',
        { max_tokens: 10_000_000 },
        10_000_000,
        'max_tokens',
      ],
      [
        'beyond 2^53 pass too (spec: clamped, not rejected)',
        { max_completion_tokens: 1e20 },
        1e20,
        'max_completion_tokens',
      ],
      ['neither', {}, undefined, undefined],
    ];
  for (const [name, fields, value, param] of MAX_TOKENS) {
    it(`normalises maxTokens: ${name}`, () => {
      const r = parseChatRequest(withFields(fields));
      assert.equal(r.maxTokens, value);
      assert.equal(r.maxTokensParam, param);
    });
  }

  const BOUNDARIES: ReadonlyArray<readonly [string, Body]> = [
    ['temperature 0', { temperature: 0 }],
    ['temperature 2', { temperature: 2 }],
    ['top_p 0', { top_p: 0 }],
    ['top_p 1', { top_p: 1 }],
    ['penalties at -2', { frequency_penalty: -2, presence_penalty: -2 }],
    ['penalties at 2', { frequency_penalty: 2, presence_penalty: 2 }],
    ['n 128 without streaming', { n: 128 }],
    ['n 1 while streaming', { n: 1, stream: true }],
    ['top_logprobs 0', { logprobs: true, top_logprobs: 0 }],
    ['top_logprobs 20', { logprobs: true, top_logprobs: 20 }],
    ['logit_bias at ±100', { logit_bias: { '0': -100, '50256': 100 } }],
    ['metadata 16 pairs', { metadata: sixteenPairs }],
    ['metadata key 64, value 512', { metadata: { ['k'.repeat(64)]: 'v'.repeat(512) } }],
    ['stop string', { stop: '\n' }],
    ['stop 4 sequences', { stop: ['a', 'b', 'c', 'd'] }],
    ['seed negative', { seed: -42 }],
    [
      'parallel tool calls answered in any order',
      {
        messages: [
          { role: 'user', content: 'x' },
          { role: 'assistant', content: null, tool_calls: [call('a'), call('b')] },
          { role: 'tool', content: '2', tool_call_id: 'b' },
          { role: 'tool', content: '1', tool_call_id: 'a' },
          { role: 'assistant', content: 'done' },
        ],
      },
    ],
    // Random 63-bit seeds, as clients send them: past 2^53 but within int64.
    ['seed 2^53 + 2', { seed: 2 ** 53 + 2 }],
    ['seed 10^17', { seed: 100000000000000000 }],
    ['seed -2^63', { seed: -(2 ** 63) }],
    ['reasoning_effort low', { reasoning_effort: 'low' }],
    ['reasoning_effort medium', { reasoning_effort: 'medium' }],
    ['reasoning_effort high', { reasoning_effort: 'high' }],
    ['service_tier flex', { service_tier: 'flex' }],
    ['service_tier priority', { service_tier: 'priority' }],
    ['service_tier auto', { service_tier: 'auto' }],
    ['service_tier default', { service_tier: 'default' }],
    ['modalities text', { modalities: ['text'] }],
    ['response_format text', { response_format: { type: 'text' } }],
    ['response_format json_object', { response_format: { type: 'json_object' } }],
    ['tool_choice auto without tools', { tool_choice: 'auto' }],
    ['tool_choice none without tools', { tool_choice: 'none' }],
    ['tool_choice required with tools', { tools: [tool], tool_choice: 'required' }],
    ['empty tools', { tools: [] }],
    ['dotted MCP tool name', { tools: [{ type: 'function', function: { name: 'exec.run' } }] }],
    ['store and user', { store: true, user: 'end-user-1' }],
    ['x_exec', { x_exec: true }],
  ];
  for (const [name, fields] of BOUNDARIES) {
    it(`accepts ${name}`, () => {
      assert.doesNotThrow(() => parseChatRequest(withFields(fields)));
    });
  }

  it('treats null optional fields as omitted', () => {
    const nulls = Object.fromEntries(
      [
        'max_tokens',
        'max_completion_tokens',
        'temperature',
        'top_p',
        'stream',
        'stream_options',
        'stop',
        'frequency_penalty',
        'presence_penalty',
        'n',
        'seed',
        'logprobs',
        'top_logprobs',
        'logit_bias',
        'tools',
        'tool_choice',
        'parallel_tool_calls',
        'response_format',
        'metadata',
        'user',
        'store',
        'reasoning_effort',
        'service_tier',
        'prediction',
        'modalities',
        'x_exec',
      ].map((k) => [k, null]),
    );
    const r = parseChatRequest(withFields(nulls));
    assert.equal(r.stream, false);
    assert.equal(r.temperature, 0.7);
    assert.equal(r.maxTokens, undefined);
    assert.equal(r.tools, undefined);
    assert.equal(r.metadata, undefined);
  });

  it('ignores unknown fields but keeps the original body and x_exec', () => {
    const body = withFields({
      frequency: 1,
      extra_body: { top_k: 20 },
      chat_template_kwargs: { enable_thinking: false },
      x_exec: true,
    });
    const r = parseChatRequest(body);
    assert.equal(r.body, body);
    assert.deepEqual(r.body['extra_body'], { top_k: 20 });
    assert.equal(r.xExec, true);
    assert.equal('frequency' in r, false);
  });

  it('normalises stop to an array', () => {
    assert.deepEqual(parseChatRequest(withFields({ stop: 'END' })).stop, ['END']);
    assert.deepEqual(parseChatRequest(withFields({ stop: ['a', 'b'] })).stop, ['a', 'b']);
  });

  it('reads streaming options', () => {
    const r = parseChatRequest(
      withFields({ stream: true, stream_options: { include_usage: true } }),
    );
    assert.equal(r.stream, true);
    assert.equal(r.includeUsage, true);
    assert.equal(parseChatRequest(withFields({ stream: null })).stream, false);
  });

  it('concatenates prediction text parts', () => {
    const parts = parseChatRequest(
      withFields({
        prediction: {
          type: 'content',
          content: [
            { type: 'text', text: 'def f():\n' },
            { type: 'text', text: '    return 1\n' },
          ],
        },
      }),
    );
    assert.equal(parts.predictionText, 'def f():\n    return 1\n');
    const plain = parseChatRequest(withFields({ prediction: { type: 'content', content: 'abc' } }));
    assert.equal(plain.predictionText, 'abc');
  });

  it('accepts a full tool-calling conversation', () => {
    const r = parseChatRequest({
      model: 'm',
      messages: [
        { role: 'developer', content: 'Be terse.' },
        { role: 'system', content: [{ type: 'text', text: 'You are helpful.' }] },
        {
          role: 'user',
          name: 'alice',
          content: [
            { type: 'text', text: 'Weather in ' },
            { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA', detail: 'low' } },
            { type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } },
            { type: 'file', file: { file_id: 'file-1' } },
            { type: 'text', text: 'Paris?' },
          ],
        },
        {
          role: 'assistant',
          content: null,
          tool_calls: [
            {
              id: 'call_1',
              type: 'function',
              function: { name: 'get_weather', arguments: '{"city":"Paris"}' },
            },
          ],
        },
        { role: 'tool', tool_call_id: 'call_1', content: '{"temp":21}' },
        { role: 'assistant', content: [{ type: 'refusal', refusal: 'no' }] },
        {
          role: 'assistant',
          tool_calls: [{ id: 'c2', type: 'function', function: { name: 'f', arguments: '' } }],
        },
      ],
      tools: [tool],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      parallel_tool_calls: false,
      response_format: {
        type: 'json_schema',
        json_schema: { name: 'weather', schema: { type: 'object' }, strict: true },
      },
    });
    assert.equal(r.messages.length, 7);
    assert.equal(textOf(r.messages[2]!), 'Weather in Paris?');
    assert.equal(r.messages[3]!.tool_calls?.[0]?.function.name, 'get_weather');
    assert.deepEqual(r.toolChoice, { type: 'function', function: { name: 'get_weather' } });
    assert.equal(r.parallelToolCalls, false);
    assert.deepEqual(r.responseFormat, {
      type: 'json_schema',
      json_schema: { name: 'weather', schema: { type: 'object' }, strict: true },
    });
  });

  it('accepts what the OpenAI SDK sends', () => {
    const params: ChatCompletionCreateParams = {
      model: 'gpt-4o-mini',
      messages: [
        { role: 'system', content: 'sys' },
        { role: 'user', content: [{ type: 'text', text: 'hi' }] },
      ],
      max_completion_tokens: 64,
      temperature: 0.2,
      top_p: 0.5,
      stop: ['\n\n'],
      seed: 7,
      logprobs: true,
      top_logprobs: 3,
      logit_bias: { '1234': -50 },
      metadata: { trace: 'abc' },
      user: 'u',
      store: false,
      reasoning_effort: 'low',
      service_tier: 'auto',
      modalities: ['text'],
      stream: true,
      stream_options: { include_usage: true },
      prediction: { type: 'content', content: 'x' },
    };
    const r = parseChatRequest(JSON.parse(JSON.stringify(params)));
    assert.equal(r.maxTokens, 64);
    assert.equal(r.temperature, 0.2);
    assert.equal(r.topP, 0.5);
    assert.equal(r.topLogprobs, 3);
    assert.deepEqual(r.logitBias, { '1234': -50 });
    assert.deepEqual(r.metadata, { trace: 'abc' });
    assert.equal(r.reasoningEffort, 'low');
    assert.equal(r.serviceTier, 'auto');
    assert.equal(r.includeUsage, true);
  });
});

describe('textOf', () => {
  const CASES: ReadonlyArray<readonly [string, ChatMessage, string]> = [
    ['string content', { role: 'user', content: 'abc' }, 'abc'],
    ['null content', { role: 'assistant', content: null }, ''],
    ['no content', { role: 'assistant' }, ''],
    [
      'text parts only',
      {
        role: 'user',
        content: [
          { type: 'text', text: 'a' },
          { type: 'image_url', image_url: { url: 'u' } },
          { type: 'text', text: 'b' },
        ],
      },
      'ab',
    ],
    [
      'refusal is not text',
      { role: 'assistant', content: [{ type: 'refusal', refusal: 'no' }] },
      '',
    ],
  ];
  for (const [name, message, text] of CASES) {
    it(name, () => assert.equal(textOf(message), text));
  }
});

describe('parseChatRequest properties', () => {
  function onlyServiceErrors(body: unknown): void {
    try {
      const r = parseChatRequest(body);
      assert.ok(r.n >= 1 && r.n <= 128);
      assert.ok(r.maxTokens === undefined || (Number.isInteger(r.maxTokens) && r.maxTokens >= 1));
      assert.ok(r.messages.length >= 1);
    } catch (e) {
      if (!(e instanceof ServiceError)) throw e;
      assert.equal(e.status, 400);
      assert.equal(e.type, 'invalid_request_error');
      assert.ok(
        [
          'missing_required_parameter',
          'invalid_type',
          'invalid_value',
          'unsupported_value',
        ].includes(e.code),
        e.code,
      );
    }
  }

  it('survives __proto__ keys from JSON.parse', () => {
    const body: unknown = JSON.parse(
      '{"model":"m","messages":[{"role":"user","content":"x","__proto__":{"role":1}}],' +
        '"metadata":{"__proto__":"x"},"logit_bias":{"__proto__":1},"__proto__":{"n":5},' +
        '"tools":[{"type":"function","function":{"name":"f","parameters":{"__proto__":{"a":1}}}}]}',
    );
    onlyServiceErrors(body);
  });

  it('random JSON values only ever produce a 400 ServiceError', () => {
    fc.assert(fc.property(fc.jsonValue(), onlyServiceErrors), { numRuns: 2000 });
  });

  it('near-valid requests with random field values only ever produce a 400 ServiceError', () => {
    const anyJson = fc.jsonValue({ maxDepth: 3 });
    const part = fc.oneof(
      fc.record({
        type: fc.constantFrom('text', 'image_url', 'refusal', 'file', 'bogus'),
        text: anyJson,
      }),
      fc.record({ type: fc.constant('text'), text: fc.string() }),
      anyJson,
    );
    const message = fc.record(
      {
        role: fc.oneof(
          fc.constantFrom('system', 'user', 'assistant', 'tool', 'developer'),
          anyJson,
        ),
        content: fc.oneof(
          fc.string(),
          fc.array(part, { maxLength: 3 }),
          fc.constant(null),
          anyJson,
        ),
        name: fc.oneof(fc.string(), anyJson),
        tool_call_id: fc.oneof(fc.string(), anyJson),
        tool_calls: fc.oneof(
          fc.array(
            fc.record({
              id: fc.string(),
              type: fc.constantFrom('function', 'x'),
              function: fc.record({ name: fc.string(), arguments: fc.oneof(fc.string(), anyJson) }),
            }),
            { maxLength: 2 },
          ),
          anyJson,
        ),
      },
      { requiredKeys: ['role'] },
    );
    const field = <T>(good: fc.Arbitrary<T>) => fc.oneof(good, anyJson, fc.constant(null));
    const request = fc.record(
      {
        model: field(fc.string()),
        messages: field(fc.array(message, { maxLength: 4 })),
        max_tokens: field(fc.integer({ min: -5, max: 1_000_000 })),
        max_completion_tokens: field(fc.integer({ min: -5, max: 1_000_000 })),
        temperature: field(fc.double({ min: -1, max: 3, noNaN: true })),
        top_p: field(fc.double({ min: -1, max: 2, noNaN: true })),
        n: field(fc.integer({ min: -1, max: 200 })),
        stream: field(fc.boolean()),
        stream_options: field(fc.record({ include_usage: fc.oneof(fc.boolean(), anyJson) })),
        stop: field(
          fc.oneof(fc.string(), fc.array(fc.oneof(fc.string(), anyJson), { maxLength: 6 })),
        ),
        logprobs: field(fc.boolean()),
        top_logprobs: field(fc.integer({ min: -2, max: 25 })),
        logit_bias: field(fc.dictionary(fc.oneof(fc.nat().map(String), fc.string()), anyJson)),
        metadata: field(
          fc.dictionary(fc.string({ maxLength: 70 }), fc.oneof(fc.string(), anyJson)),
        ),
        tools: field(
          fc.array(fc.record({ type: fc.constantFrom('function', 'x'), function: anyJson })),
        ),
        tool_choice: field(fc.oneof(fc.constantFrom('auto', 'none', 'required', 'x'), anyJson)),
        response_format: field(
          fc.record({
            type: fc.constantFrom('text', 'json_object', 'json_schema', 'x'),
            json_schema: anyJson,
          }),
        ),
        reasoning_effort: field(fc.constantFrom('low', 'medium', 'high', 'max')),
        service_tier: field(fc.constantFrom('flex', 'priority', 'auto', 'default', 'scale')),
        prediction: field(fc.record({ type: fc.constantFrom('content', 'x'), content: anyJson })),
        modalities: field(fc.array(fc.constantFrom('text', 'audio'), { maxLength: 3 })),
        x_exec: field(fc.boolean()),
      },
      { requiredKeys: [] },
    );
    fc.assert(fc.property(request, onlyServiceErrors), { numRuns: 3000 });
  });
});
