import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ServiceError } from '../../errors/index.js';
import { parseChatRequest } from './wire.js';

const ok = { model: 'm', messages: [{ role: 'user', content: 'hi' }] };

describe('parseChatRequest', () => {
  it('accepts a minimal request and passes unknown fields through', () => {
    const body = { ...ok, user: 'u1', metadata: { a: 'b' }, reasoning_effort: 'low' };
    assert.equal(parseChatRequest(body), body);
  });

  // [case, body, code, param]
  const CASES: ReadonlyArray<readonly [string, unknown, string, string | null]> = [
    ['not an object', [1], 'invalid_body', null],
    ['no messages', { model: 'm' }, 'missing_required_parameter', 'messages'],
    ['empty messages', { messages: [] }, 'invalid_value', 'messages'],
    [
      'unknown role',
      { messages: [{ role: 'robot', content: 'x' }] },
      'invalid_value',
      'messages[0].role',
    ],
    [
      'tool message without tool_call_id',
      { messages: [{ role: 'tool', content: 'x' }] },
      'missing_required_parameter',
      'messages[0].tool_call_id',
    ],
    [
      'content part without text',
      { messages: [{ role: 'user', content: [{ type: 'text' }] }] },
      'invalid_type',
      'messages[0].content[0].text',
    ],
    ['temperature too high', { ...ok, temperature: 2.5 }, 'invalid_value', 'temperature'],
    ['top_p as string', { ...ok, top_p: '1' }, 'invalid_type', 'top_p'],
    ['penalty out of range', { ...ok, presence_penalty: -3 }, 'invalid_value', 'presence_penalty'],
    ['max_tokens zero', { ...ok, max_tokens: 0 }, 'invalid_value', 'max_tokens'],
    ['top_logprobs without logprobs', { ...ok, top_logprobs: 2 }, 'invalid_value', 'top_logprobs'],
    [
      'top_logprobs above 20',
      { ...ok, logprobs: true, top_logprobs: 21 },
      'invalid_value',
      'top_logprobs',
    ],
    ['five stop sequences', { ...ok, stop: ['a', 'b', 'c', 'd', 'e'] }, 'invalid_value', 'stop'],
    ['logit_bias key', { ...ok, logit_bias: { abc: 1 } }, 'invalid_type', 'logit_bias.abc'],
    ['logit_bias value', { ...ok, logit_bias: { '12': 101 } }, 'invalid_value', 'logit_bias.12'],
    ['tool_choice unknown', { ...ok, tool_choice: 'always' }, 'unsupported_value', 'tool_choice'],
    [
      'tool_choice names a missing tool',
      {
        ...ok,
        tools: [{ type: 'function', function: { name: 'a' } }],
        tool_choice: { type: 'function', function: { name: 'b' } },
      },
      'invalid_value',
      'tool_choice.function.name',
    ],
    [
      'response_format type',
      { ...ok, response_format: { type: 'xml' } },
      'unsupported_value',
      'response_format.type',
    ],
    [
      'json_schema without its object',
      { ...ok, response_format: { type: 'json_schema' } },
      'missing_required_parameter',
      'response_format.json_schema',
    ],
    [
      'a tool name with a space (node-llama-cpp cannot call it)',
      {
        ...ok,
        tools: [{ type: 'function', function: { name: 'get weather', parameters: {} } }],
      },
      'invalid_value',
      'tools[0].function.name',
    ],
    [
      'a schema with more than 1,000 enum values',
      {
        ...ok,
        response_format: {
          type: 'json_schema',
          json_schema: {
            name: 'n',
            schema: { enum: Array.from({ length: 1001 }, (_, i) => `v${i}`) },
          },
        },
      },
      'invalid_value',
      'response_format.json_schema.schema',
    ],
    [
      'tool parameters nested more than 10 levels',
      {
        ...ok,
        tools: [
          {
            type: 'function',
            function: {
              name: 'deep',
              parameters: JSON.parse(
                '{"type":"object","properties":{"a":'.repeat(11) +
                  '{"type":"string"}' +
                  '}}'.repeat(11),
              ) as object,
            },
          },
        ],
      },
      'invalid_value',
      'tools[0].function.parameters',
    ],
    [
      'prediction type',
      { ...ok, prediction: { type: 'text', content: 'x' } },
      'invalid_type',
      'prediction',
    ],
  ];

  it('accepts schemas within the limits (1,000 enum values, 10 levels)', () => {
    const nested = (n: number): unknown =>
      JSON.parse(
        '{"type":"object","properties":{"a":'.repeat(n) + '{"type":"string"}' + '}}'.repeat(n),
      );
    parseChatRequest({
      ...ok,
      response_format: {
        type: 'json_schema',
        json_schema: { name: 'n', schema: { enum: Array.from({ length: 1000 }, (_, i) => i) } },
      },
      tools: [{ type: 'function', function: { name: 'ok_name', parameters: nested(9) } }],
    });
  });

  for (const [name, body, code, param] of CASES) {
    it(`rejects ${name}`, () => {
      assert.throws(
        () => parseChatRequest(body),
        (err: unknown) => {
          assert.ok(err instanceof ServiceError);
          assert.equal(err.status, 400);
          assert.equal(err.code, code);
          assert.equal(err.param, param);
          return true;
        },
      );
    });
  }
});
