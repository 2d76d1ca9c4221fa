/**
 * The router's wait queue follows the worker list as it changes while requests wait:
 * a worker that joins the pool serves the requests already waiting (not only the ones
 * that arrive after it), and a worker drained meanwhile is not handed to them when its
 * own request ends. Every worker takes one request at a time
 * (SWITCHYARD_WORKER_MAX_INFLIGHT=1); the sims' delays run on the router's fake clock.
 */
import assert from 'node:assert/strict';
import { setImmediate as tick } from 'node:timers/promises';
import { afterEach, describe, it } from 'node:test';
import { clockSleep, startSimWorker, type SimWorker } from '../../src/workers/sim/index.js';
import { inferenceFixture, postChat, until, type InferenceFixture } from '../support/inference.js';

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

describe('the router queue and a changing worker list', () => {
  let f: InferenceFixture;
  let other: SimWorker | null = null;
  afterEach(async () => {
    await f?.close();
    await other?.close();
    other = null;
  });

  const start = () =>
    inferenceFixture({
      simOnFakeClock: true,
      sim: { ttftMs: 10_000, prefillMsPerToken: 0 },
      env: { SWITCHYARD_WORKER_MAX_INFLIGHT: '1', SWITCHYARD_ROUTER_QUEUE_TIMEOUT_MS: '60000' },
    });

  it('a worker that joins serves the request already waiting', async () => {
    f = await start();
    const first = watch(postChat(f, { max_tokens: 2 }));
    await until(() => f.worker.stats().received >= 1, 'the first request to reach the worker');
    const second = watch(postChat(f, { max_tokens: 2 }));
    await until(() => queued(f) === 1, 'the second request to queue');

    other = await startSimWorker({
      model: 'sim-model',
      contextWindow: 4096,
      ttftMs: 0,
      tpotMs: 0,
      prefillMsPerToken: 0,
      sleep: clockSleep(f.server.clock),
      clock: f.server.clock,
    });
    const added = await f.server.admin('POST', '/workers', {
      model: 'sim-model',
      tier: 'cpu',
      url: other.url,
      id: 'sim-2',
    });
    assert.equal(added.status, 201, added.text);
    // No time passes: the new worker is free now, and the waiting request is first in line.
    await until(() => second.settled, 'the waiting request to be served by the new worker');
    assert.equal(second.res?.status, 200);
    assert.equal(second.res?.headers.get('x-service-worker-id'), 'sim-2');
    assert.equal(first.settled, false);
    f.server.clock.advance(10_000);
    await until(() => first.settled, 'the first answer');
  });

  it('a worker drained while a request waits is not given to that request', async () => {
    f = await start();
    const first = watch(postChat(f, { max_tokens: 2 }));
    await until(() => f.worker.stats().received >= 1, 'the first request to reach the worker');
    const second = watch(postChat(f, { max_tokens: 2 }));
    await until(() => queued(f) === 1, 'the second request to queue');

    const drained = await f.server.admin('POST', '/workers/sim-1/drain');
    assert.equal(drained.status, 200, drained.text);
    for (let i = 0; i < 10; i++) await tick();
    // The first request ends on its worker, which frees a slot of a draining worker.
    f.server.clock.advance(10_000);
    await until(() => first.settled, 'the first answer');
    assert.equal(first.res?.status, 200);
    for (let i = 0; i < 20; i++) await tick();
    assert.equal(f.worker.stats().received, 1, 'nothing new sent to the draining worker');
    assert.equal(second.settled, false, 'still waiting for a worker that may take it');
    f.server.clock.advance(50_000);
    await until(() => second.settled, 'the end of the wait');
    assert.equal(second.res?.status, 429);
    assert.equal(f.worker.stats().received, 1);
  });
});
