/**
 * Workers that break the wire format's rules, and what the client still gets: a
 * fake worker (node:http) answers the canned stream or body of the case the request
 * names in its forwarded `variant` field. Every stream the client gets is checked
 * chunk by chunk against OpenAI's schemas (id = X-Request-ID on each, one
 * finish_reason per choice, nothing for a choice after it) and assembled by the
 * SDK's `ChatCompletionStream` (`finalChatCompletion()`), which throws on a choice
 * without a finish_reason or a role.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { apiError } from '../support/inference.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';
import { validateChunk } from '../support/openai-schemas.js';
import { listenWorker, onPost } from '../support/fake-worker.js';

type Payload = Record<string, unknown>;

const head = { id: 'cmpl-w', object: 'chat.completion.chunk', created: 1754524122, model: 'w' };
/** One SSE event of a chunk with these choices. */
const chunk = (choices: Payload[], extra: Payload = {}) =>
  `data: ${JSON.stringify({ ...head, choices, ...extra })}\n\n`;
const text = (content: string, index = 0) => chunk([{ index, delta: { content } }]);
const first = chunk([{ index: 0, delta: { role: 'assistant', content: 'Hi' } }]);
const finish = (reason: string, index = 0) => chunk([{ index, delta: {}, finish_reason: reason }]);
const usage = chunk([], { usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } });
const DONE = 'data: [DONE]\n\n';

/** Streams as the worker writes them, one TCP write each. */
const streams: Record<string, string[]> = {
  'finish-twice': [first, finish('stop'), finish('length'), usage, DONE],
  'text-after-finish': [first, finish('stop'), text(' and more'), usage, DONE],
  // [DONE] with the choice never finished.
  'no-finish': [first, text(' there'), usage, DONE],
  // Every choice finished and usage sent, then the worker closes without [DONE].
  'finished-no-done': [first, finish('stop'), usage],
  // Content after [DONE]; [DONE] twice; [DONE] with the connection kept open.
  'after-done': [first, usage, DONE, text(' ghost'), DONE],
  'open-after-done': [first, finish('stop'), usage, DONE],
  // [DONE] without a single choice before it.
  'no-choices-stream': [usage, DONE],
  // finish_reason tool_calls without a single tool call streamed.
  'tool-finish-no-calls': [first, finish('tool_calls'), usage, DONE],
  // The usage chunk is an empty object.
  'empty-usage-stream': [first, finish('stop'), chunk([], { usage: {} }), DONE],
  // Choices the request did not ask for (n is 1): a stray index, a second choice.
  'unknown-index': [first, text('X', 3), finish('stop'), usage, DONE],
  'second-choice': [
    first,
    chunk([{ index: 1, delta: { role: 'assistant', content: 'B' } }]),
    finish('stop'),
    finish('stop', 1),
    usage,
    DONE,
  ],
};

/** Non-streaming bodies, answered as JSON. */
const message = (content: string) => ({ role: 'assistant', content });
const bodies: Record<string, Payload> = {
  // Two choices both at index 0; one choice at index 7 of an n=1 request; three
  // choices for n=2.
  'same-index': {
    choices: [0, 0].map((index, i) => ({
      index,
      message: message(i === 0 ? 'A' : 'B'),
      finish_reason: 'stop',
    })),
  },
  // A usage object without a single count (and one with counts as strings).
  'empty-usage': {
    choices: [{ index: 0, message: message('Hello there, world'), finish_reason: 'stop' }],
    usage: {},
  },
  'string-usage': {
    choices: [{ index: 0, message: message('Hello there, world'), finish_reason: 'stop' }],
    usage: { prompt_tokens: '9', completion_tokens: '4', total_tokens: '13' },
  },
  'stray-index': { choices: [{ index: 7, message: message('A'), finish_reason: 'stop' }] },
  'extra-choices': {
    choices: ['A', 'B', 'C'].map((t, index) => ({
      index,
      message: message(t),
      finish_reason: 'stop',
    })),
  },
  'no-choices': { choices: [], usage: { prompt_tokens: 3, completion_tokens: 0, total_tokens: 3 } },
};

/** Responses the worker keeps open after their last write (`open-after-done`). */
const held: http.ServerResponse[] = [];

async function misbehavingWorker() {
  const server = http.createServer(
    onPost((body, res) => {
      if (body.variant === 'huge') {
        // A completion of `size` bytes, written 1 MiB at a time.
        res.writeHead(200, { 'content-type': 'application/json' });
        const open =
          '{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"';
        const mib = 'x'.repeat(1 << 20);
        let left = Number(body.size);
        const more = () => {
          while (left > 0) {
            left -= mib.length;
            if (!res.write(mib)) return void res.once('drain', more);
          }
          res.end('"}}]}');
        };
        res.write(open);
        more();
        return;
      }
      const json = bodies[String(body.variant)];
      if (json !== undefined) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(json));
        return;
      }
      const writes = streams[String(body.variant)];
      if (writes === undefined) {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: `no variant ${String(body.variant)}` } }));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const next = (i: number) => {
        if (i < writes.length) res.write(writes[i], () => setImmediate(next, i + 1));
        else if (body.variant === 'open-after-done') held.push(res);
        else res.end();
      };
      next(0);
    }),
  );
  return listenWorker(server);
}

describe('a worker that breaks the stream rules', () => {
  let s: TestServer;
  let w: Awaited<ReturnType<typeof misbehavingWorker>>;
  let client: OpenAI;
  let baseURL: string;
  let key: string;
  before(async () => {
    s = await startTestServer();
    w = await misbehavingWorker();
    const p = await seedProject(s, {
      slug: 'mis',
      model: 'mm',
      worker: { url: w.url, id: 'mis' },
      quotaRequests: 10_000,
    });
    ({ baseURL, key } = p);
    client = new OpenAI({ baseURL, apiKey: key, maxRetries: 0 });
  });
  after(async () => {
    await s.close();
    await w.close();
  });

  const params = (variant: string, extra: Payload = {}) =>
    ({
      model: 'x',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
      variant,
      ...extra,
    }) as unknown as OpenAI.Chat.ChatCompletionCreateParamsStreaming;

  /**
   * The stream as sent (raw fetch): every chunk valid and carrying the request id,
   * the finish reasons per choice in order, and the last event.
   */
  async function wire(variant: string, extra: Payload = {}) {
    const res = await fetch(`${baseURL}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify(params(variant, extra)),
      signal: AbortSignal.timeout(10_000),
    });
    assert.equal(res.status, 200);
    const id = res.headers.get('x-request-id');
    const events = (await res.text()).split('\n\n').filter((e) => e !== '');
    const finishes: Record<number, string[]> = {};
    const content: Record<number, string> = {};
    const afterFinish: string[] = [];
    for (const e of events) {
      if (!e.startsWith('data: {')) continue;
      const c = JSON.parse(e.slice('data: '.length)) as OpenAI.Chat.ChatCompletionChunk;
      assert.deepEqual(validateChunk(c), [], e);
      assert.equal(c.id, id);
      for (const choice of c.choices) {
        if ((finishes[choice.index] ?? []).length > 0) afterFinish.push(e);
        content[choice.index] = (content[choice.index] ?? '') + (choice.delta.content ?? '');
        if (choice.finish_reason !== null) {
          (finishes[choice.index] ??= []).push(choice.finish_reason);
        }
      }
    }
    return { finishes, content, afterFinish, last: events.at(-1) };
  }

  /** The SDK's assembled completion of the same stream. */
  function assembled(variant: string, extra: Payload = {}) {
    return client.chat.completions.stream(params(variant, extra)).finalChatCompletion();
  }

  it('a finish_reason sent twice reaches the client once, the first one', async () => {
    const got = await wire('finish-twice');
    assert.deepEqual(got.finishes, { 0: ['stop'] });
    assert.deepEqual(got.afterFinish, []);
    assert.equal(got.last, DONE.trim());
    const done = await assembled('finish-twice');
    assert.equal(done.choices[0]!.finish_reason, 'stop');
    assert.equal(done.choices[0]!.message.content, 'Hi');
  });

  it('text a worker sends after the finish_reason is not forwarded', async () => {
    const got = await wire('text-after-finish');
    assert.deepEqual(got.finishes, { 0: ['stop'] });
    assert.deepEqual(got.content, { 0: 'Hi' });
    assert.deepEqual(got.afterFinish, []);
    assert.equal((await assembled('text-after-finish')).choices[0]!.message.content, 'Hi');
  });

  it('a choice the worker never finished ends with finish_reason stop before [DONE]', async () => {
    const got = await wire('no-finish', { stream_options: { include_usage: true } });
    assert.deepEqual(got.finishes, { 0: ['stop'] });
    assert.equal(got.last, DONE.trim());
    const done = await assembled('no-finish', { stream_options: { include_usage: true } });
    assert.equal(done.choices[0]!.finish_reason, 'stop');
    assert.equal(done.choices[0]!.message.content, 'Hi there');
    assert.equal(done.usage?.total_tokens, 5);
  });

  it('a worker that closes without [DONE] after every choice finished completed the stream', async () => {
    const got = await wire('finished-no-done', { stream_options: { include_usage: true } });
    assert.deepEqual(got.finishes, { 0: ['stop'] });
    assert.equal(got.last, DONE.trim());
    const done = await assembled('finished-no-done', { stream_options: { include_usage: true } });
    assert.equal(done.choices[0]!.message.content, 'Hi');
    assert.equal(done.usage?.total_tokens, 5);
  });

  it('[DONE] ends the stream: nothing after it is forwarded, a second one is not repeated', async () => {
    const got = await wire('after-done');
    assert.deepEqual(got.content, { 0: 'Hi' });
    assert.deepEqual(got.finishes, { 0: ['stop'] });
    assert.equal(got.last, DONE.trim());
    assert.deepEqual(got.afterFinish, []);
    assert.equal((await assembled('after-done')).choices[0]!.message.content, 'Hi');
  });

  it('a worker that keeps its connection open after [DONE]: the client has its answer at once, the connection is dropped 1 s later', async () => {
    // Without the fix the client waits for the idle timeout (600 s on cpu); the
    // fetch's own 10 s timeout would fail the test.
    const got = await wire('open-after-done');
    assert.deepEqual(got.finishes, { 0: ['stop'] });
    assert.equal(got.last, DONE.trim());
    const res = held.pop()!;
    assert.equal(res.destroyed, false, 'the worker connection stays for the grace period');
    const closed = once(res, 'close');
    s.clock.advance(1000);
    await closed;
  });

  it('finish_reason tool_calls without a tool call streamed reads stop, as it does non-streamed', async () => {
    const got = await wire('tool-finish-no-calls');
    assert.deepEqual(got.finishes, { 0: ['stop'] });
    const done = await assembled('tool-finish-no-calls');
    assert.equal(done.choices[0]!.finish_reason, 'stop');
    assert.equal(done.choices[0]!.message.tool_calls, undefined);
  });

  for (const variant of ['unknown-index', 'second-choice']) {
    it(`${variant}: a choice index the request did not ask for is not forwarded`, async () => {
      const got = await wire(variant);
      assert.deepEqual(got.finishes, { 0: ['stop'] });
      assert.deepEqual(got.content, { 0: 'Hi' });
      const done = await assembled(variant);
      assert.deepEqual(
        done.choices.map((c) => [c.index, c.message.content, c.finish_reason]),
        [[0, 'Hi', 'stop']],
      );
    });
  }

  const unary = (variant: string, extra: Payload = {}) =>
    client.chat.completions.create({
      ...params(variant, extra),
      stream: false,
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);

  it('an answer without a single choice is 502 upstream_error, streamed or not, not a 200 without an answer', async () => {
    const err = await apiError(unary('no-choices'));
    assert.equal(err.status, 502);
    assert.equal(err.code, 'upstream_error');
    assert.match(err.headers?.get('x-request-id') ?? '', /^chatcmpl-/);
    const streamed = await apiError(client.chat.completions.create(params('no-choices-stream')));
    assert.equal(streamed.status, 502);
    assert.equal(streamed.code, 'upstream_error');
  });

  it('choice indexes are 0 to n - 1, one per choice, whatever indexes the worker sent', async () => {
    const indexes = (c: OpenAI.Chat.ChatCompletion) =>
      c.choices.map((x) => [x.index, x.message.content]);
    assert.deepEqual(indexes(await unary('same-index', { n: 2 })), [
      [0, 'A'],
      [1, 'B'],
    ]);
    assert.deepEqual(indexes(await unary('stray-index')), [[0, 'A']]);
    // Choices beyond the request's n are not the client's, as in a stream.
    assert.deepEqual(indexes(await unary('extra-choices', { n: 2 })), [
      [0, 'A'],
      [1, 'B'],
    ]);
  });

  it('a usage object without a count is no usage: the router estimates it, as for none', async () => {
    for (const variant of ['empty-usage', 'string-usage']) {
      const u = (await unary(variant)).usage!;
      assert.ok(u.prompt_tokens > 0, `${variant}: ${JSON.stringify(u)}`);
      assert.ok(u.completion_tokens > 0, `${variant}: ${JSON.stringify(u)}`);
      assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
    }
    const stream = client.chat.completions.stream(
      params('empty-usage-stream', { stream_options: { include_usage: true } }),
    );
    const u = (await stream.finalChatCompletion()).usage!;
    assert.ok(u.prompt_tokens > 0 && u.completion_tokens > 0, JSON.stringify(u));
  });

  // Last: the 8 MiB answer spends the endpoint's tokens per minute.
  it('a non-streamed answer past 64 MiB is 502 upstream_error; one below it is served', async () => {
    const err = await apiError(unary('huge', { size: 80 << 20 }));
    assert.equal(err.status, 502);
    assert.equal(err.code, 'upstream_error');
    const ok = await unary('huge', { size: 8 << 20 });
    assert.equal(ok.choices[0]!.message.content!.length, 8 << 20);
  });
});
