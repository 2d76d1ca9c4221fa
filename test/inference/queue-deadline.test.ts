/**
 * The tier deadline counts from the request's start, the router's queue included:
 * a request that waited for a worker gets only what is left of its deadline, and
 * one whose deadline passes while it is still queued times out (408, or the SSE
 * timeout event when streaming) instead of getting 429. Free tier: deadline 30 s.
 * Every worker takes one request at a time (SWITCHYARD_WORKER_MAX_INFLIGHT=1) and
 * the queue's own limit (60 s) is longer than the deadline, so only the deadline
 * can end a wait. The sim's delays run on the router's fake clock.
 */
import assert from 'node:assert/strict';
import { setImmediate as tick } from 'node:timers/promises';
import { afterEach, describe, it } from 'node:test';
import type { SimWorkerOptions } from '../../src/workers/sim/index.js';
import {
  inferenceFixture,
  sseErrorEvent,
  until,
  usageStatuses,
  type InferenceFixture,
  postChat,
} from '../support/inference.js';

/** A pending response whose settling can be observed without awaiting it. */
function watch(p: Promise<Response>) {
  const s: { res: Response | null; settled: boolean } = { res: null, settled: false };
  void p.then(
    (r) => {
      s.res = r;
      s.settled = true;
    },
    () => (s.settled = true),
  );
  return s;
}

function queued(f: InferenceFixture): number {
  return f.server.services.pool.queueDepths().reduce((n, q) => n + q.depth, 0);
}

function fixture(sim: SimWorkerOptions): Promise<InferenceFixture> {
  return inferenceFixture({
    tier: 'free',
    simOnFakeClock: true,
    sim: { prefillMsPerToken: 0, ...sim },
    env: {
      SWITCHYARD_WORKER_MAX_INFLIGHT: '1',
      SWITCHYARD_ROUTER_QUEUE_TIMEOUT_MS: '60000',
    },
  });
}

describe('the tier deadline and the router queue (free tier, 30 s)', () => {
  let f: InferenceFixture;
  afterEach(() => f?.close());

  it('a request that waited 25 s in the queue gets only the 5 s left: 408 at 30 s', async () => {
    f = await fixture({ ttftMs: 25_000 });
    const first = watch(postChat(f, { max_tokens: 3 }));
    await until(() => f.worker.stats().received >= 1, 'the first request to reach the worker');
    const second = watch(postChat(f, { max_tokens: 3 }));
    await until(() => queued(f) === 1, 'the second request to queue');

    // The first answers at 25 s and hands its worker to the second.
    f.server.clock.advance(25_000);
    await until(() => first.settled, 'the first answer');
    assert.equal(first.res?.status, 200);
    await until(() => f.worker.stats().received >= 2, 'the second request to reach the worker');

    f.server.clock.advance(4_999);
    await tick();
    await tick();
    assert.equal(second.settled, false, 'answered before its deadline');
    f.server.clock.advance(1);
    // Without the queue time counted, the worker would have had 30 s more (a 200 at 50 s).
    await until(() => second.settled, 'the second answer at 30 s from its start');
    const res = second.res!;
    assert.equal(res.status, 408);
    const body = (await res.json()) as { error: Record<string, unknown> };
    assert.equal(body.error.type, 'timeout_error');
    assert.equal(body.error.code, 'request_timeout');
    await until(() => f.worker.stats().aborted >= 1, 'the upstream abort');
    assert.deepEqual((await usageStatuses(f)).sort(), ['completed', 'timeout']);
  });

  it('a deadline that passes while queued: 408 (non-streaming) and the SSE timeout event (streaming), not 429', async () => {
    // The first request streams one token every 20 s: it keeps the only slot for minutes.
    f = await fixture({ ttftMs: 0, tpotMs: 20_000 });
    const first = await postChat(f, { stream: true, max_tokens: 10 });
    assert.equal(first.status, 200);
    void first.text().catch(() => undefined);
    const plain = watch(postChat(f, { max_tokens: 3 }));
    const streamed = watch(postChat(f, { stream: true, max_tokens: 3 }));
    await until(() => queued(f) === 2, 'both requests to queue');

    f.server.clock.advance(29_999);
    await tick();
    await tick();
    assert.equal(plain.settled || streamed.settled, false, 'answered before the deadline');
    f.server.clock.advance(1);
    await until(() => plain.settled && streamed.settled, 'both answers at the deadline');

    assert.equal(plain.res!.status, 408);
    const body = (await plain.res!.json()) as { error: Record<string, unknown> };
    assert.equal(body.error.type, 'timeout_error');
    assert.equal(body.error.code, 'request_timeout');

    const sse = streamed.res!;
    assert.equal(sse.status, 200);
    assert.match(sse.headers.get('content-type') ?? '', /^text\/event-stream/);
    assert.match(sse.headers.get('x-request-id') ?? '', /^chatcmpl-/);
    assert.equal(sse.headers.get('x-service-worker-id'), null);
    const text = await sse.text();
    const err = sseErrorEvent(text);
    assert.equal(err.type, 'timeout_error');
    assert.equal(err.code, 'request_timeout');
    assert.ok(!text.includes('[DONE]'));

    // Neither reached a worker; nothing waits in the queue any more.
    assert.equal(f.worker.stats().received, 1);
    assert.equal(queued(f), 0);
  });
});
