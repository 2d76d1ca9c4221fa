/**
 * Chat completions through the router with the official OpenAI SDK, against a
 * `sim` worker: plain and streamed (with and without include_usage), tool-call
 * round trip, logprobs, json_schema, clamping, n=2, SDK error classes, usage
 * records. Every response is validated against OpenAI's own schemas.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { tables } from '../../src/store/index.js';
import { inferenceFixture, weatherTool, type InferenceFixture } from '../support/inference.js';
import { validateChunk, validateCompletion } from '../support/openai-schemas.js';

describe('chat completions with the OpenAI SDK', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture();
  });
  after(() => f.close());

  it('plain completion: the spec shape, id = X-Request-ID, worker header, no clamp header', async () => {
    const { data, response } = await f.client.chat.completions
      .create({
        model: 'anything',
        messages: [{ role: 'user', content: 'Hello there' }],
        max_tokens: 12,
      })
      .withResponse();
    assert.deepEqual(validateCompletion(data), []);
    assert.equal(data.id, response.headers.get('x-request-id'));
    assert.match(data.id, /^chatcmpl-[0-9a-f]{32}$/);
    assert.equal(response.headers.get('x-service-worker-id'), 'sim-1');
    assert.equal(response.headers.get('x-service-max-tokens-clamped'), null);
    assert.equal(data.object, 'chat.completion');
    assert.equal(data.model, 'sim-model');
    assert.equal(data.service_tier, 'cpu' as never);
    assert.equal(typeof data.system_fingerprint, 'string');
    const choice = data.choices[0]!;
    assert.equal(choice.message.role, 'assistant');
    assert.equal(typeof choice.message.content, 'string');
    assert.equal(choice.message.refusal, null);
    assert.equal(choice.message.tool_calls ?? null, null);
    assert.deepEqual(choice.message.annotations, []);
    assert.ok(choice.finish_reason === 'length' || choice.finish_reason === 'stop');
    assert.equal(choice.logprobs, null);
    const u = data.usage!;
    assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
    assert.ok(u.completion_tokens <= 12);
    assert.equal(u.prompt_tokens_details?.cached_tokens, 0);
    assert.equal(u.prompt_tokens_details?.audio_tokens, null);
    assert.equal(u.completion_tokens_details?.reasoning_tokens, null);
    assert.equal(u.completion_tokens_details?.accepted_prediction_tokens, null);
    assert.deepEqual(Object.keys(data).sort(), [
      'choices',
      'created',
      'id',
      'model',
      'object',
      'service_tier',
      'system_fingerprint',
      'usage',
    ]);
  });

  it('streams chunks with service_tier and system_fingerprint on each, usage only when asked (null on the others)', async () => {
    for (const includeUsage of [true, false]) {
      const stream = await f.client.chat.completions.create({
        model: 'x',
        messages: [{ role: 'user', content: 'Stream please' }],
        max_tokens: 10,
        stream: true,
        ...(includeUsage ? { stream_options: { include_usage: true } } : {}),
      });
      const chunks = [];
      for await (const c of stream) chunks.push(c);
      assert.ok(chunks.length >= 2);
      const ids = new Set(chunks.map((c) => c.id));
      assert.equal(ids.size, 1);
      for (const c of chunks) {
        assert.deepEqual(validateChunk(c), [], JSON.stringify(c));
        assert.equal(c.service_tier, 'cpu' as never);
        assert.ok('system_fingerprint' in c);
        for (const ch of c.choices) {
          for (const k of Object.keys(ch.delta)) {
            assert.ok(['role', 'content', 'refusal', 'tool_calls'].includes(k), k);
          }
        }
      }
      const last = chunks.at(-1)!;
      if (includeUsage) {
        assert.deepEqual(last.choices, []);
        assert.equal(
          last.usage!.total_tokens,
          last.usage!.prompt_tokens + last.usage!.completion_tokens,
        );
        // OpenAI's stream schema: with include_usage every other chunk has `usage: null`.
        for (const c of chunks.slice(0, -1)) assert.strictEqual(c.usage, null, JSON.stringify(c));
      } else {
        for (const c of chunks) assert.ok(!('usage' in c), JSON.stringify(c));
      }
      assert.ok(chunks.some((c) => c.choices[0]?.finish_reason));
    }
  });

  it('sends data: [DONE] last and X-Request-ID equal to the chunk ids', async () => {
    const res = await fetch(`${f.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${f.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'x',
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
        max_tokens: 5,
      }),
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type')!, /^text\/event-stream/);
    const text = await res.text();
    assert.ok(text.endsWith('data: [DONE]\n\n'));
    const rid = res.headers.get('x-request-id')!;
    const first = JSON.parse(text.split('\n\n')[0]!.slice('data: '.length)) as { id: string };
    assert.equal(first.id, rid);
  });

  it('never emits reasoning text, and multi-byte characters arrive whole', async () => {
    const plain = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: '[sim:reasoning] think' }],
      max_tokens: 30,
    });
    assert.ok(!JSON.stringify(plain).includes('reasoning_content'));
    const stream = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: '[sim:emoji] [sim:reasoning] go' }],
      max_tokens: 60,
      stream: true,
    });
    let content = '';
    for await (const c of stream) {
      assert.ok(!JSON.stringify(c).includes('reasoning'));
      content += c.choices[0]?.delta.content ?? '';
    }
    assert.ok(!content.includes('\uFFFD'));
    assert.match(content, /🚀/);
  });

  it('tool-call round trip', async () => {
    const tools = [weatherTool];
    const first = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
      tools,
      tool_choice: 'required',
    });
    assert.deepEqual(validateCompletion(first), []);
    const msg = first.choices[0]!.message;
    assert.equal(first.choices[0]!.finish_reason, 'tool_calls');
    assert.equal(msg.content, null);
    const call = msg.tool_calls![0]!;
    assert.equal(call.type, 'function');
    assert.equal(call.type === 'function' && call.function.name, 'get_weather');
    const args = JSON.parse(call.type === 'function' ? call.function.arguments : '{}') as {
      city: string;
    };
    assert.equal(typeof args.city, 'string');
    const second = await f.client.chat.completions.create({
      model: 'x',
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        msg,
        { role: 'tool', tool_call_id: call.id, content: 'sunny, 21C' },
      ],
      tools,
    });
    assert.equal(second.choices[0]!.finish_reason === 'tool_calls', false);
    assert.match(second.choices[0]!.message.content!, /sunny, 21C/);
  });

  it('logprobs with top_logprobs in the spec shape', async () => {
    const r = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'probabilities' }],
      max_tokens: 5,
      logprobs: true,
      top_logprobs: 3,
    });
    assert.deepEqual(validateCompletion(r), []);
    const lp = r.choices[0]!.logprobs!;
    assert.ok(lp.content!.length > 0);
    for (const t of lp.content!) {
      assert.equal(typeof t.token, 'string');
      assert.ok(t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 3);
    }
    assert.equal(lp.refusal, null);
    // An answer of tool calls only still has the logprobs object, with no content tokens.
    const calls = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: {} } }],
      tool_choice: 'required',
      logprobs: true,
    });
    assert.deepEqual(validateCompletion(calls), []);
    assert.equal(calls.choices[0]!.finish_reason, 'tool_calls');
    assert.deepEqual(calls.choices[0]!.logprobs, { content: null, refusal: null });
  });

  it('json_schema output parses and fits the schema', async () => {
    const r = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'a person' }],
      response_format: {
        type: 'json_schema',
        json_schema: {
          name: 'person',
          strict: true,
          schema: {
            type: 'object',
            properties: { name: { type: 'string' }, age: { type: 'integer' } },
            required: ['name', 'age'],
          },
        },
      },
    });
    const obj = JSON.parse(r.choices[0]!.message.content!) as { name: unknown; age: unknown };
    assert.equal(typeof obj.name, 'string');
    assert.ok(Number.isInteger(obj.age));
  });

  it('n: 2 returns two choices', async () => {
    const r = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'two' }],
      n: 2,
      max_tokens: 4,
    });
    assert.deepEqual(
      r.choices.map((c) => c.index),
      [0, 1],
    );
  });

  it('a random 63-bit seed is served, the same seed the same answer', async () => {
    const ask = () =>
      f.client.chat.completions.create({
        model: 'x',
        messages: [{ role: 'user', content: 'seeded' }],
        seed: 2 ** 62 + 2 ** 60, // past 2^53, within int64
        temperature: 1,
        max_tokens: 8,
      });
    const [a, b] = [await ask(), await ask()];
    assert.ok(a.choices[0]!.message.content);
    assert.equal(a.choices[0]!.message.content, b.choices[0]!.message.content);
  });

  it('clamps an over-large max_tokens and says so in the header', async () => {
    const { data, response } = await f.client.chat.completions
      .create({
        model: 'x',
        messages: [{ role: 'user', content: 'short' }],
        max_completion_tokens: 100_000,
      })
      .withResponse();
    const h = response.headers.get('x-service-max-tokens-clamped');
    assert.match(h!, /^100000 -> \d+$/);
    const clamped = Number(h!.split(' -> ')[1]);
    assert.ok(clamped < 4096 && clamped > 3000);
    assert.ok(data.usage!.completion_tokens <= clamped);
  });

  it('SDK error classes see the status, code and param of bad input', async () => {
    const cases: Array<[Record<string, unknown>, string, string | null]> = [
      [{ temperature: 3 }, 'invalid_value', 'temperature'],
      [{ reasoning_effort: 'extreme' }, 'unsupported_value', 'reasoning_effort'],
      [{ modalities: ['text', 'audio'] }, 'unsupported_value', 'modalities'],
      [{ n: 2, stream: true }, 'unsupported_value', 'n'],
      [{ top_logprobs: 2 }, 'invalid_value', 'top_logprobs'],
      [{ stop: ['a', 'b', 'c', 'd', 'e'] }, 'invalid_value', 'stop'],
    ];
    for (const [extra, code, param] of cases) {
      await assert.rejects(
        f.client.chat.completions.create({
          model: 'x',
          messages: [{ role: 'user', content: 'x' }],
          ...extra,
        } as never),
        (err: unknown) => {
          assert.ok(err instanceof OpenAI.BadRequestError, String(err));
          assert.equal(err.status, 400);
          assert.equal(err.code, code, JSON.stringify(extra));
          assert.equal(err.param, param, JSON.stringify(extra));
          assert.equal(err.type, 'invalid_request_error');
          return true;
        },
      );
    }
    await assert.rejects(
      f.client.chat.completions.create({
        model: 'x',
        messages: [{ role: 'user', content: 'x' }, { role: 'tool', content: 'r' } as never],
      }),
      (err: unknown) =>
        err instanceof OpenAI.BadRequestError && err.param === 'messages[1].tool_call_id',
    );
    const bad = new OpenAI({
      baseURL: f.baseURL,
      apiKey: 'swy_inf_' + 'A'.repeat(43),
      maxRetries: 0,
    });
    await assert.rejects(
      bad.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'x' }] }),
      (err: unknown) => err instanceof OpenAI.AuthenticationError,
    );
  });

  it('records the usage of every request in the database', async () => {
    await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'bill me' }],
      max_tokens: 3,
      user: 'end-user-7',
      metadata: { team: 'blue' },
      service_tier: 'priority',
    } as never);
    await f.server.services.usage.flush();
    const rows = await f.server.services.store.db.select().from(tables.usageRecords);
    const row = rows.find((r) => r.user === 'end-user-7')!;
    assert.ok(row);
    assert.equal(row.status, 'completed');
    assert.equal(row.priceMultiplier, 1.25);
    assert.deepEqual(row.metadata, { team: 'blue' });
    assert.equal(row.workerId, 'sim-1');
    assert.ok(row.promptTokens > 0 && row.completionTokens > 0);
    assert.ok(rows.some((r) => r.stream === 1));
  });
});

describe('engine token-count retry', () => {
  let f: InferenceFixture;
  before(async () => {
    // The model record claims more context than the worker has: the router's
    // clamp lets too much through and the engine's exact error corrects it.
    f = await inferenceFixture({ contextWindow: 8192 });
  });
  after(() => f.close());

  it('retries once with the value the engine says fits and reports it in the header', async () => {
    const { data, response } = await f.client.chat.completions
      .create({ model: 'x', messages: [{ role: 'user', content: 'fit me' }], max_tokens: 6000 })
      .withResponse();
    const h = response.headers.get('x-service-max-tokens-clamped');
    assert.match(h!, /^6000 -> \d+$/);
    assert.ok(Number(h!.split(' -> ')[1]) < 4096);
    assert.deepEqual(validateCompletion(data), []);
  });
});
