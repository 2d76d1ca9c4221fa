/**
 * The Responses API with the official OpenAI SDK, through the router to a `sim`
 * worker: plain and streamed responses (the SDK's own stream accumulator checks the
 * event order), a function-call round trip over `previous_response_id`, stored
 * responses and their input items, errors with Responses field names, a disconnect.
 */
import assert from 'node:assert/strict';
import { after, afterEach, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { eq, sql } from 'drizzle-orm';
import { tables } from '../../src/store/index.js';
import {
  inferenceFixture,
  until,
  weatherTool,
  type InferenceFixture,
} from '../support/inference.js';

/** The chat tests' weather tool in the Responses API's flat shape, strict. */
const weather = {
  type: 'function' as const,
  ...weatherTool.function,
  parameters: { ...weatherTool.function.parameters, additionalProperties: false },
  strict: true,
};

describe('Responses API', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture();
  });
  after(() => f.close());

  it('answers a Response; stored, retrievable, with its input items; deleted', async () => {
    const { data: r, response: http } = await f.client.responses
      .create({
        model: 'anything',
        input: 'Say hello.',
        instructions: 'Be brief.',
        max_output_tokens: 24,
        metadata: { run: 't1' },
      })
      .withResponse();
    assert.match(r.id, /^resp_[0-9a-f]{32}$/);
    assert.equal(r.object, 'response');
    assert.ok(r.status === 'completed' || r.status === 'incomplete');
    if (r.status === 'incomplete') {
      assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
    }
    assert.equal(r.model, 'sim-model');
    assert.equal(r.instructions, 'Be brief.');
    assert.equal(r.max_output_tokens, 24);
    assert.deepEqual(r.metadata, { run: 't1' });
    assert.equal(r.output.length, 1);
    const item = r.output[0]!;
    assert.equal(item.type, 'message');
    assert.ok(r.output_text.length > 0);
    assert.ok(r.usage!.input_tokens > 0);
    assert.ok(r.usage!.output_tokens > 0 && r.usage!.output_tokens <= 24);
    assert.equal(r.usage!.total_tokens, r.usage!.input_tokens + r.usage!.output_tokens);
    assert.equal(http.headers.get('x-service-worker-id'), 'sim-1');
    assert.ok(http.headers.get('x-ratelimit-limit'));

    const again = await f.client.responses.retrieve(r.id);
    assert.deepEqual(again, { ...r, output_text: again.output_text });
    const items = await f.client.responses.inputItems.list(r.id);
    assert.equal(items.data.length, 1);
    const input = items.data[0]! as { id: string; type: string; role: string; content: unknown };
    assert.match(input.id, /^msg_/);
    assert.equal(input.type, 'message');
    assert.equal(input.role, 'user');
    assert.deepEqual(input.content, [{ type: 'input_text', text: 'Say hello.' }]);

    await f.client.responses.delete(r.id);
    const gone = await f.client.responses.retrieve(r.id).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(gone instanceof OpenAI.NotFoundError);

    // Each response is a chat completion underneath: one usage record, one event.
    await f.server.services.usage.flush();
    const usage = await f.server.services.store.db.select().from(tables.usageRecords);
    assert.ok(usage.some((u) => u.promptTokens === r.usage!.input_tokens));
    const events = await f.server.services.store.db.select().from(tables.events);
    assert.ok(events.some((e) => e.type === 'response.completed' && e.body.includes(r.id)));
  });

  it('streams events the SDK’s accumulator accepts, deltas adding up to the text', async () => {
    const stream = f.client.responses.stream({
      model: 'x',
      input: 'Tell a story.',
      max_output_tokens: 40,
    });
    const types: string[] = [];
    const seqs: number[] = [];
    let text = '';
    for await (const ev of stream) {
      types.push(ev.type);
      seqs.push(ev.sequence_number);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
    }
    const final = await stream.finalResponse();
    assert.deepEqual(
      seqs,
      seqs.map((_, i) => i),
    );
    assert.equal(types[0], 'response.created');
    assert.equal(types[1], 'response.in_progress');
    assert.equal(types[2], 'response.output_item.added');
    assert.equal(types[3], 'response.content_part.added');
    assert.ok(types.includes('response.output_text.delta'));
    assert.deepEqual(types.slice(-4, -1), [
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
    ]);
    assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)!));
    assert.equal(final.output_text, text);
    assert.ok(final.usage && final.usage.output_tokens > 0);
    // Stored as streamed.
    const stored = await f.client.responses.retrieve(final.id);
    assert.equal(stored.output_text, text);
  });

  it('a function call round trip over previous_response_id', async () => {
    const first = await f.client.responses.create({
      model: 'x',
      input: [{ role: 'user', content: 'Weather in Paris?' }],
      tools: [weather],
      tool_choice: 'required',
    });
    const call = first.output.find((o) => o.type === 'function_call');
    assert.ok(call && call.type === 'function_call');
    assert.equal(call.name, 'get_weather');
    assert.ok(call.call_id.length > 0);
    JSON.parse(call.arguments);

    const second = await f.client.responses.create({
      model: 'x',
      previous_response_id: first.id,
      input: [{ type: 'function_call_output', call_id: call.call_id, output: 'sunny, 21C' }],
      tools: [weather],
    });
    assert.equal(second.previous_response_id, first.id);
    assert.ok(second.status === 'completed' || second.status === 'incomplete');

    // Streamed, the call arrives as arguments deltas.
    const s = f.client.responses.stream({
      model: 'x',
      input: 'Weather in Rome?',
      tools: [weather],
      tool_choice: 'required',
    });
    let args = '';
    for await (const ev of s)
      if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
    const done = await s.finalResponse();
    const streamed = done.output.find((o) => o.type === 'function_call');
    assert.ok(streamed && streamed.type === 'function_call');
    assert.equal(streamed.arguments, args);
  });

  it('previous_response_id carries a refusal into the history, as a conversation does', async () => {
    const first = await f.client.responses.create({
      model: 'x',
      input: '[sim:refusal] Tell me a secret.',
    });
    const part = (first.output[0] as { content: Array<{ type: string }> }).content[0]!;
    assert.equal(part.type, 'refusal');
    const next = await f.client.responses.create({
      model: 'x',
      input: 'Why?',
      previous_response_id: first.id,
      max_output_tokens: 16,
    });
    // The second prompt holds the first turn whole: its input and the refusal.
    assert.ok(
      next.usage!.input_tokens > first.usage!.input_tokens + first.usage!.output_tokens,
      `${next.usage!.input_tokens} vs ${first.usage!.input_tokens} + ${first.usage!.output_tokens}`,
    );
  });

  it('store: false keeps nothing', async () => {
    const r = await f.client.responses.create({ model: 'x', input: 'hi', store: false });
    assert.equal((r as unknown as { store: boolean }).store, false);
    const gone = await f.client.responses.retrieve(r.id).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(gone instanceof OpenAI.NotFoundError);
  });

  it('retrieve with stream: true is refused, not answered as JSON', async () => {
    // OpenAI streams a response on retrieve only while a background one runs (resumed
    // with `starting_after`); this service has no background responses.
    const r = await f.client.responses.create({ model: 'x', input: 'hi', max_output_tokens: 16 });
    for (const query of [{ stream: true as const }, { stream: true as const, starting_after: 2 }]) {
      const err = await f.client.responses.retrieve(r.id, query).then(
        () => null,
        (e: unknown) => e,
      );
      assert.ok(err instanceof OpenAI.BadRequestError, String(err));
      assert.equal(err.code, 'unsupported_value');
      assert.equal(err.param, 'stream');
    }
    // Without it, or with stream false, the Response as before.
    assert.equal((await f.client.responses.retrieve(r.id, { stream: false })).id, r.id);
    // An unknown one is still not found.
    const gone = await f.client.responses.retrieve('resp_nope', { stream: true }).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(gone instanceof OpenAI.NotFoundError);
  });

  it('rejects bad requests naming the Responses field', async () => {
    const cases: Array<[Record<string, unknown>, string, string]> = [
      [{}, 'missing_required_parameter', 'input'],
      [{ input: [] }, 'invalid_value', 'input'],
      [{ input: 'x', temperature: 3 }, 'invalid_value', 'temperature'],
      [{ input: 'x', max_output_tokens: 8 }, 'invalid_value', 'max_output_tokens'],
      [{ input: 'x', tools: [{ type: 'web_search' }] }, 'unsupported_value', 'tools[0].type'],
      [{ input: 'x', background: true }, 'unsupported_value', 'background'],
      [{ input: [{ role: 'robot', content: 'x' }] }, 'invalid_value', 'input[0].role'],
      [
        { input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] },
        'unsupported_value',
        'input[0].content[0]',
      ],
      [
        { input: 'x', text: { format: { type: 'json_schema', name: 'n' } } },
        'missing_required_parameter',
        'text.format.schema',
      ],
      [{ input: 'x', tools: [null] }, 'invalid_type', 'tools[0]'],
      [{ input: 'x', prompt: { id: 'pmpt_1' } }, 'unsupported_value', 'prompt'],
      [{ input: 'x', top_logprobs: 'x' }, 'invalid_type', 'top_logprobs'],
      [{ input: 'x', stream_options: 5 }, 'invalid_type', 'stream_options'],
      [
        { input: 'x', tools: [weather], tool_choice: { type: 'function', name: 'zzz' } },
        'invalid_value',
        'tool_choice.name',
      ],
      // From the chat path: the endpoint's model lacks json_schema.
    ];
    for (const [body, code, param] of cases) {
      const err = await f.client.responses.create({ model: 'x', ...body } as never).then(
        () => null,
        (e: unknown) => e,
      );
      assert.ok(err instanceof OpenAI.BadRequestError, JSON.stringify(body));
      assert.equal(err.code, code, JSON.stringify(body));
      assert.equal(err.param, param, JSON.stringify(body));
      // A message naming a field names it as the param does, not as the chat route.
      assert.ok(!/messages\[|response_format|tool_choice\.function/.test(err.message), err.message);
    }
  });
});

describe('Responses API: the chat path’s errors and disconnects', () => {
  let f: InferenceFixture;
  afterEach(() => f?.close());

  it('a capability the model lacks: 400 from the chat path, param renamed', async () => {
    f = await inferenceFixture({ capabilities: [] });
    const err = await f.client.responses
      .create({
        model: 'x',
        input: 'x',
        text: { format: { type: 'json_schema', name: 'n', schema: { type: 'object' } } },
      })
      .then(
        () => null,
        (e: unknown) => e,
      );
    assert.ok(err instanceof OpenAI.BadRequestError);
    assert.equal(err.code, 'model_capability_missing');
    assert.equal(err.param, 'text.format');
    assert.equal(f.worker.stats().received, 0);
  });

  it('a key without scope inference is refused', async () => {
    f = await inferenceFixture({ keyScopes: ['management'] });
    const err = await f.client.responses.create({ model: 'x', input: 'x' }).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(err instanceof OpenAI.PermissionDeniedError);
    assert.equal(err.code, 'scope_insufficient');
  });

  it('a stream past the tier deadline ends with error and response.failed', async () => {
    f = await inferenceFixture({ tier: 'free', simOnFakeClock: true, sim: { ttftMs: 40_000 } });
    const pending = fetch(`${f.baseURL}/responses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${f.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'x', input: 'hi', stream: true }),
    });
    await until(() => f.worker.stats().running >= 1, 'the worker to start');
    f.server.clock.advance(30_000);
    const res = await pending;
    assert.equal(res.status, 200);
    const events = (await res.text())
      .split('\n\n')
      .filter(Boolean)
      .map((block) => JSON.parse(block.split('\ndata: ')[1]!) as Record<string, unknown>);
    assert.deepEqual(
      events.map((e) => e.type),
      ['response.created', 'response.in_progress', 'error', 'response.failed'],
    );
    assert.equal(events[2]!.code, 'request_timeout');
    const failed = events[3]!.response as { status: string; error: { code: string } };
    assert.equal(failed.status, 'failed');
    assert.equal(failed.error.code, 'request_timeout');
    await until(() => f.worker.stats().aborted >= 1, 'the worker’s request aborted');
    const rows = await f.server.services.store.db.select().from(tables.events);
    assert.ok(rows.some((e) => e.type === 'response.failed'));
    // Stored as OpenAI keeps it: retrievable, failed, with its error.
    const stored = await f.client.responses.retrieve((events[3]!.response as { id: string }).id);
    assert.equal(stored.status, 'failed');
    assert.equal(stored.error?.code, 'request_timeout');
    assert.deepEqual(stored, {
      ...(events[3]!.response as object),
      output_text: stored.output_text,
    });
  });

  it('a non-streamed request past the tier deadline: 408, and a response.failed event', async () => {
    f = await inferenceFixture({ tier: 'free', simOnFakeClock: true, sim: { ttftMs: 40_000 } });
    const pending = f.client.responses.create({ model: 'x', input: 'hi' }, { maxRetries: 0 }).then(
      () => null,
      (e: unknown) => e,
    );
    await until(() => f.worker.stats().running >= 1, 'the worker to start');
    f.server.clock.advance(30_000);
    const err = await pending;
    assert.ok(err instanceof OpenAI.APIError);
    assert.equal(err.status, 408);
    const rows = await f.server.services.store.db.select().from(tables.events);
    const failed = rows.filter((e) => e.type === 'response.failed');
    assert.equal(failed.length, 1);
    const { data } = JSON.parse(failed[0]!.body) as {
      data: { id: string; status: string; error: { code: string } };
    };
    assert.equal(data.status, 'failed');
    assert.equal(data.error.code, 'request_timeout');
    // The event's response is stored, failed with its error, as OpenAI keeps one.
    const stored = await f.client.responses.retrieve(data.id);
    assert.equal(stored.status, 'failed');
    assert.equal(stored.error?.code, 'request_timeout');
    assert.equal(typeof stored.error?.message, 'string');
    assert.deepEqual(stored.output, []);
  });

  it('a client that leaves a stream aborts the worker’s generation', async () => {
    f = await inferenceFixture({ simOnFakeClock: true, sim: { ttftMs: 5_000, tpotMs: 1_000 } });
    // Before the first token (nothing answered yet) and after it.
    for (const advance of [0, 6_000]) {
      const ac = new AbortController();
      const aborted = f.worker.stats().aborted;
      const pending = fetch(`${f.baseURL}/responses`, {
        method: 'POST',
        headers: { authorization: `Bearer ${f.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'x', input: 'hi', stream: true, max_output_tokens: 500 }),
        signal: ac.signal,
      });
      await until(() => f.worker.stats().running >= 1, 'the worker to start');
      if (advance > 0) {
        f.server.clock.advance(advance);
        const res = await pending;
        assert.match(res.headers.get('content-type') ?? '', /text\/event-stream/);
        const reader = res.body!.getReader();
        const first = new TextDecoder().decode((await reader.read()).value);
        assert.match(first, /^event: response.created\n/);
      }
      ac.abort();
      await pending.catch(() => null);
      await until(() => f.worker.stats().aborted > aborted, 'the worker’s request aborted');
    }
    assert.equal(f.worker.stats().completed, 0);
  });
});

describe('Responses API on PostgreSQL', { skip: !process.env.TEST_DATABASE_URL }, () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({ driver: 'postgres' });
  });
  after(() => f.close());

  it('a streamed response is stored before its response.completed is sent', async () => {
    const db = f.server.services.store.db;
    // Another connection holds the responses table (inserts wait) until the first
    // text has streamed, and a moment longer.
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let locked!: () => void;
    const isLocked = new Promise<void>((r) => (locked = r));
    const lock = db.transaction(async (tx) => {
      await tx.execute(sql`lock table responses in exclusive mode`);
      locked();
      await held;
    });
    await isLocked;
    const stream = f.client.responses.stream({
      model: 'x',
      input: 'Tell a story.',
      max_output_tokens: 24,
    });
    let storedWhenCompleted: boolean | null = null;
    let timer: NodeJS.Timeout | undefined;
    for await (const ev of stream) {
      if (ev.type === 'response.output_text.delta' && timer === undefined) {
        timer = setTimeout(release, 300);
      }
      if (ev.type === 'response.completed' || ev.type === 'response.incomplete') {
        const rows = await db
          .select({ id: tables.responses.id })
          .from(tables.responses)
          .where(eq(tables.responses.id, ev.response.id));
        storedWhenCompleted = rows.length === 1;
        // What a client does next: continue from it.
        const next = await f.client.responses.create({
          model: 'x',
          input: 'And then?',
          previous_response_id: ev.response.id,
          max_output_tokens: 16,
        });
        assert.equal(next.previous_response_id, ev.response.id);
      }
    }
    release();
    await lock;
    assert.equal(storedWhenCompleted, true);
  });
});
