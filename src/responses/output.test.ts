import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { fromCompletion, outputMessages, ResponseStream, type Shell } from './output.js';
import { chatBody, parseResponsesRequest, responsesParam, toChatMessages } from './request.js';

function shell(body: Record<string, unknown>): Shell {
  return {
    id: 'resp_1',
    createdAt: 1,
    model: 'm',
    serviceTier: 'cpu',
    request: parseResponsesRequest(body),
  };
}

const chunk = (delta: Record<string, unknown>, finish: string | null = null) => ({
  choices: [{ index: 0, delta, finish_reason: finish }],
});

describe('Responses from chat', () => {
  it('turns input items into chat messages; consecutive calls make one assistant turn', () => {
    const r = parseResponsesRequest({
      instructions: 'sys',
      input: [
        {
          role: 'user',
          content: [
            { type: 'input_text', text: 'a' },
            { type: 'input_text', text: 'b' },
          ],
        },
        { type: 'function_call', call_id: 'c1', name: 'f', arguments: '{}' },
        { type: 'function_call', call_id: 'c2', name: 'g', arguments: '{"x":1}' },
        { type: 'function_call_output', call_id: 'c1', output: 'one' },
        { type: 'function_call_output', call_id: 'c2', output: 'two' },
      ],
      max_output_tokens: 100,
      text: {
        format: { type: 'json_schema', name: 'n', schema: { type: 'object' }, strict: true },
      },
      reasoning: { effort: 'low' },
      tool_choice: { type: 'function', name: 'f' },
      tools: [{ type: 'function', name: 'f', parameters: { type: 'object' } }],
    });
    const body = chatBody(r, [{ role: 'user', content: 'earlier' }]);
    assert.deepEqual(body.messages, [
      { role: 'system', content: 'sys' },
      { role: 'user', content: 'earlier' },
      { role: 'user', content: 'ab' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          { id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } },
          { id: 'c2', type: 'function', function: { name: 'g', arguments: '{"x":1}' } },
        ],
      },
      { role: 'tool', tool_call_id: 'c1', content: 'one' },
      { role: 'tool', tool_call_id: 'c2', content: 'two' },
    ]);
    assert.equal(body.max_completion_tokens, 100);
    assert.deepEqual(body.response_format, {
      type: 'json_schema',
      json_schema: { name: 'n', schema: { type: 'object' }, strict: true },
    });
    assert.equal(body.reasoning_effort, 'low');
    assert.deepEqual(body.tool_choice, { type: 'function', function: { name: 'f' } });
    // No `strict`, and an open object schema: not strict (OpenAI's fallback), said so.
    assert.deepEqual(body.tools, [
      { type: 'function', function: { name: 'f', parameters: { type: 'object' }, strict: false } },
    ]);
  });

  it('renames chat params to Responses fields', () => {
    // text.format holds json_schema's fields itself.
    assert.equal(responsesParam('response_format.json_schema'), 'text.format');
    assert.equal(responsesParam('response_format.json_schema.schema'), 'text.format.schema');
    assert.equal(responsesParam('response_format.type'), 'text.format.type');
    assert.equal(responsesParam('tool_choice.function.name'), 'tool_choice.name');
    assert.equal(responsesParam('max_completion_tokens'), 'max_output_tokens');
    assert.equal(responsesParam('messages[3].content'), 'input');
    assert.equal(responsesParam('tools[1].function.name'), 'tools[1].name');
    assert.equal(responsesParam(null), null);
  });

  it('a completion cut by the token limit is incomplete; a refusal is a refusal part', () => {
    const r = fromCompletion(shell({ input: 'x' }), {
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: null, refusal: 'No.' },
          finish_reason: 'length',
        },
      ],
      usage: {
        prompt_tokens: 3,
        completion_tokens: 2,
        prompt_tokens_details: { cached_tokens: 1 },
      },
    });
    assert.equal(r.status, 'incomplete');
    assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
    const out = r.output as Array<{ content: unknown; status: string }>;
    assert.deepEqual(out[0]!.content, [{ type: 'refusal', refusal: 'No.' }]);
    assert.equal(out[0]!.status, 'incomplete', 'the item cut short, as the response');
    assert.deepEqual(r.usage, {
      input_tokens: 3,
      input_tokens_details: { cached_tokens: 1 },
      output_tokens: 2,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: 5,
    });
  });

  it('streams text, then a tool call, closing each item in order', () => {
    const t = new ResponseStream(shell({ input: 'x' }));
    const events = [
      ...t.start(),
      ...t.chunk(chunk({ role: 'assistant', content: '' })),
      ...t.chunk(chunk({ content: 'Hel' })),
      ...t.chunk(chunk({ content: 'lo' })),
      ...t.chunk(
        chunk({
          tool_calls: [{ index: 0, id: 'call_1', function: { name: 'f', arguments: '{"a"' } }],
        }),
      ),
      ...t.chunk(
        chunk({ tool_calls: [{ index: 0, function: { arguments: ':1}' } }] }, 'tool_calls'),
      ),
      ...t.chunk({ choices: [], usage: { prompt_tokens: 4, completion_tokens: 6 } }),
    ];
    const end = t.end();
    events.push(...end.events);
    assert.deepEqual(
      events.map((e) => e.type),
      [
        'response.created',
        'response.in_progress',
        'response.output_item.added',
        'response.content_part.added',
        'response.output_text.delta',
        'response.output_text.delta',
        'response.output_text.done',
        'response.content_part.done',
        'response.output_item.done',
        'response.output_item.added',
        'response.function_call_arguments.delta',
        'response.function_call_arguments.delta',
        'response.function_call_arguments.done',
        'response.output_item.done',
        'response.completed',
      ],
    );
    assert.deepEqual(
      events.map((e) => e.sequence_number),
      events.map((_, i) => i),
    );
    const output = end.response.output as Array<Record<string, unknown>>;
    assert.equal(output.length, 2);
    assert.equal((output[0]!.content as Array<{ text: string }>)[0]!.text, 'Hello');
    assert.equal(output[1]!.arguments, '{"a":1}');
    assert.equal(output[1]!.call_id, 'call_1');
    const argsDone = events.find((e) => e.type === 'response.function_call_arguments.done')!;
    assert.equal(argsDone.name, 'f', 'the done event names the function, as the SDK types say');
    assert.equal((end.response.usage as { total_tokens: number }).total_tokens, 10);
    // The turn as chat messages, for previous_response_id.
    assert.deepEqual(outputMessages(output), [
      {
        role: 'assistant',
        content: 'Hello',
        tool_calls: [
          { id: 'call_1', type: 'function', function: { name: 'f', arguments: '{"a":1}' } },
        ],
      },
    ]);
    assert.deepEqual(toChatMessages([]), []);
  });

  it('a refusal streams as refusal events; a failure ends with error and response.failed', () => {
    const t = new ResponseStream(shell({ input: 'x' }));
    t.start();
    const ev = t.chunk(chunk({ refusal: 'No' }));
    assert.deepEqual(
      ev.map((e) => e.type),
      ['response.output_item.added', 'response.content_part.added', 'response.refusal.delta'],
    );
    const failed = t.fail({ code: 'request_timeout', message: 'late' });
    assert.deepEqual(
      failed.events.map((e) => e.type),
      ['error', 'response.failed'],
    );
    assert.equal(failed.response.status, 'failed');
    assert.deepEqual(failed.response.error, { code: 'request_timeout', message: 'late' });
    // What streamed before the failure stays in the failed response, incomplete.
    assert.deepEqual(failed.response.output, [
      {
        type: 'message',
        id: (failed.response.output as Array<{ id: string }>)[0]!.id,
        status: 'incomplete',
        role: 'assistant',
        content: [{ type: 'refusal', refusal: 'No' }],
      },
    ]);
  });

  it('text then a refusal are two parts of one message, kept whole when the stream fails', () => {
    const t = new ResponseStream(shell({ input: 'x' }));
    t.start();
    t.chunk(chunk({ content: 'Well' }));
    const ev = t.chunk(chunk({ refusal: 'No' }));
    assert.deepEqual(
      ev.map((e) => [e.type, e.output_index, e.content_index]),
      [
        ['response.output_text.done', 0, 0],
        ['response.content_part.done', 0, 0],
        ['response.content_part.added', 0, 1],
        ['response.refusal.delta', 0, 1],
      ],
    );
    const failed = t.fail({ code: 'server_error', message: 'lost' });
    const item = (failed.response.output as Array<{ status: string; content: unknown }>)[0]!;
    assert.equal(item.status, 'incomplete');
    assert.deepEqual(item.content, [
      { type: 'output_text', text: 'Well', annotations: [], logprobs: [] },
      { type: 'refusal', refusal: 'No' },
    ]);
  });

  it('a stream cut by the token limit ends its items incomplete', () => {
    const t = new ResponseStream(shell({ input: 'x' }));
    t.start();
    t.chunk(chunk({ content: 'Once upon' }, 'length'));
    const end = t.end();
    assert.equal(end.response.status, 'incomplete');
    const done = end.events.find((e) => e.type === 'response.output_item.done')!;
    assert.equal((done.item as { status: string }).status, 'incomplete');
    assert.equal((end.response.output as Array<{ status: string }>)[0]!.status, 'incomplete');
  });
});
