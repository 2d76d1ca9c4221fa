/**
 * Tier timeouts and disconnects on the fake clock: the sim worker's delays run
 * on the same clock as the router's deadlines, so no test sleeps.
 * free: deadline 30 s, idle 120 s. cpu: deadline 300 s, idle 600 s.
 */
import assert from 'node:assert/strict';
import { setImmediate as tick } from 'node:timers/promises';
import { after, afterEach, describe, it } from 'node:test';
import { tables } from '../../src/store/index.js';
import {
  inferenceFixture,
  sseErrorEvent,
  until,
  usageStatuses,
  type InferenceFixture,
  postChat,
} from '../support/inference.js';

/** Reads an SSE response incrementally into `text`. */
function reader(res: Response) {
  const state = { text: '', done: false };
  const dec = new TextDecoder();
  void (async () => {
    const r = res.body!.getReader();
    for (;;) {
      const { value, done } = await r.read().catch(() => ({ value: undefined, done: true }));
      if (done) break;
      state.text += dec.decode(value, { stream: true });
    }
    state.done = true;
  })();
  return state;
}

describe('timeouts on the free tier (deadline 30 s)', () => {
  let f: InferenceFixture;
  afterEach(() => f?.close());

  it('non-streaming past the deadline: 408 timeout_error, upstream aborted', async () => {
    f = await inferenceFixture({ tier: 'free', simOnFakeClock: true, sim: { ttftMs: 40_000 } });
    const pending = postChat(f, { max_tokens: 5 });
    await until(() => f.worker.stats().received >= 1, 'the worker to receive the request');
    f.server.clock.advance(29_999);
    await tick();
    assert.equal(f.worker.stats().aborted, 0);
    f.server.clock.advance(1);
    const res = await pending;
    assert.equal(res.status, 408);
    const body = (await res.json()) as { error: Record<string, unknown> };
    assert.equal(body.error.type, 'timeout_error');
    assert.equal(body.error.code, 'request_timeout');
    await until(() => f.worker.stats().aborted >= 1, 'the upstream abort');
    assert.deepEqual(await usageStatuses(f), ['timeout']);
  });

  it('streaming with no first token by the deadline: SSE error event, type timeout_error', async () => {
    f = await inferenceFixture({ tier: 'free', simOnFakeClock: true, sim: { ttftMs: 40_000 } });
    const pending = postChat(f, { stream: true });
    await until(() => f.worker.stats().received >= 1, 'the worker to receive the request');
    f.server.clock.advance(30_000);
    const res = await pending;
    assert.equal(res.status, 200);
    const text = await res.text();
    const err = sseErrorEvent(text);
    assert.equal(err.type, 'timeout_error');
    assert.equal(typeof err.message, 'string');
    assert.ok(!text.includes('[DONE]'));
    await until(() => f.worker.stats().aborted >= 1, 'the upstream abort');
  });
});

describe('idle timeouts on the cpu tier (deadline 300 s, idle 600 s)', () => {
  let f: InferenceFixture;
  after(() => f?.close());

  async function startStream(body: Record<string, unknown>) {
    const res = await postChat(f, { stream: true, max_tokens: 50, ...body });
    assert.equal(res.status, 200);
    const s = reader(res);
    // Deliver the first generated token (the sim's TTFT is 0 on the fake clock).
    await until(() => {
      f.server.clock.advance(0);
      return /"(content|role)"/.test(s.text) && f.worker.stats().generationTokens >= 1;
    }, 'the first token');
    return s;
  }

  it('a stream idle for 600 s ends with the timeout event; 599 s is fine', async () => {
    f = await inferenceFixture({ tier: 'cpu', simOnFakeClock: true, sim: { tpotMs: 700_000 } });
    const s = await startStream({});
    f.server.clock.advance(599_000);
    await tick();
    await tick();
    assert.ok(!s.text.includes('event: error'));
    f.server.clock.advance(1_000);
    await until(() => s.done, 'the stream to end');
    assert.equal(sseErrorEvent(s.text).type, 'timeout_error');
    await until(() => f.worker.stats().aborted >= 1, 'the upstream abort');
  });

  it('with reasoning_effort the idle timeout equals the deadline (300 s)', async () => {
    const before = f.worker.stats().aborted;
    const s = await startStream({ reasoning_effort: 'low' });
    f.server.clock.advance(299_000);
    await tick();
    assert.ok(!s.text.includes('event: error'));
    f.server.clock.advance(1_000);
    await until(() => s.done, 'the stream to end');
    assert.equal(sseErrorEvent(s.text).type, 'timeout_error');
    assert.ok(!s.text.includes('reasoning'));
    await until(() => f.worker.stats().aborted > before, 'the upstream abort');
  });
});

describe('client disconnects', () => {
  let f: InferenceFixture;
  after(() => f?.close());

  it('abort the upstream request at once, streaming or not, and are recorded', async () => {
    f = await inferenceFixture({ tier: 'cpu', simOnFakeClock: true, sim: { ttftMs: 10_000 } });
    for (const stream of [false, true]) {
      const before = f.worker.stats().aborted;
      const ac = new AbortController();
      const pending = postChat(f, { stream }, ac.signal).catch((e: unknown) => e);
      await until(
        () => f.worker.stats().running + f.worker.stats().waiting >= 1,
        'request running',
      );
      ac.abort();
      await pending;
      await until(() => f.worker.stats().aborted > before, `upstream abort (stream=${stream})`);
    }
    const statuses = await usageStatuses(f);
    assert.deepEqual(statuses, ['cancelled', 'cancelled']);
    // The worker had read the prompt: it is billed in both modes (the non-streaming
    // one was recorded with 0 tokens, free however long it had run).
    const rows = await f.server.services.store.db.select().from(tables.usageRecords);
    for (const r of rows) assert.ok(r.promptTokens > 0, `stream ${r.stream}: ${r.promptTokens}`);
  });
});

describe('a worker that dies mid-stream', () => {
  let f: InferenceFixture;
  after(() => f?.close());

  it('ends the stream with the cancelled error event (no type) and records the tokens', async () => {
    f = await inferenceFixture({
      tier: 'cpu',
      sim: { failMode: { kind: 'die-after-tokens', tokens: 3 } },
    });
    const res = await postChat(f, { stream: true, max_tokens: 40 });
    const text = await res.text();
    const err = sseErrorEvent(text);
    assert.equal(err.code, 'cancelled');
    assert.equal('type' in err, false);
    assert.ok(!text.includes('[DONE]'));
    await f.server.services.usage.flush();
    const rows = await f.server.services.store.db.select().from(tables.usageRecords);
    assert.equal(rows[0]!.status, 'cancelled');
    assert.ok(rows[0]!.completionTokens >= 1);
    // The warning says which request lost its worker (RELIABILITY.md: the id on every line).
    const line = f.server.logs.find((l) => l.includes('worker stream failed'));
    assert.ok(line, 'the failure is logged');
    assert.equal(
      (JSON.parse(line) as { request_id?: string }).request_id,
      res.headers.get('x-request-id'),
    );
  });
});
