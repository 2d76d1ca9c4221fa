/**
 * The pool's live state without a server: a worker's declared capacity lowers
 * its in-flight limit (and saturation), stale signals are not returned, and
 * an open breaker admits one half-open probe after the cool-down.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  BREAKER_COOLDOWN_MS,
  BREAKER_THRESHOLD,
  WorkerPool,
  type RouteHints,
} from '../../src/routing/pool.js';
import type { WorkerRecord, WorkerRegistry } from '../../src/routing/registry.js';
import { FakeClock } from '../../src/runtime/clock.js';
import { COLD_OFFSET_MS } from '../../src/routing/prefill-order.js';

function worker(
  id: string,
  capacity: number | null = null,
  schedulingPolicy: WorkerRecord['schedulingPolicy'] = 'fcfs',
): WorkerRecord {
  return {
    id,
    modelId: 'm',
    modelName: 'm',
    tierId: 'gpu',
    url: `http://${id}/v1`,
    source: 'registered',
    status: 'healthy',
    lastHeartbeatAt: null,
    capacity,
    schedulingPolicy,
    createdAt: new Date(0),
  };
}

const registry = {} as WorkerRegistry;

const hints: RouteHints = {
  blocks: { hashes: [], chars: 0 },
  promptTokens: 10,
  slo: {},
  tier: 'default',
};

/** The pool's choice for one request, handed straight back (in-flight counts unchanged). */
function pick(pool: WorkerPool, candidates: WorkerRecord[]): WorkerRecord | null {
  const lease = pool.route(candidates, hints);
  if (lease) pool.abandon(lease);
  return lease?.worker ?? null;
}

describe('worker pool', () => {
  it('capacity lowers the in-flight limit; saturation follows it', () => {
    const pool = new WorkerPool(registry, new FakeClock(), 0, 4);
    const small = worker('small', 2);
    const big = worker('big', 100);
    assert.equal(pool.limit(small), 2);
    assert.equal(pool.limit(big), 4);
    assert.equal(pool.limit(worker('none')), 4);
    pool.acquire('small');
    pool.acquire('small');
    assert.equal(pick(pool, [small]), null);
    assert.equal(pool.load('small') >= pool.tierLimit(small, 'default'), true);
    assert.equal(pick(pool, [small, big])?.id, 'big');
  });

  it('a priority-scheduling worker gets a priority with its lease; its pending blocks go at the first token', () => {
    const clock = new FakeClock();
    const pool = new WorkerPool(registry, clock, 0);
    const hashes = Array.from({ length: 40 }, (_, i) => i + 1); // 16 tokens per block
    const cold = { ...hints, blocks: { hashes, chars: 2560 }, promptTokens: 640 };
    const fcfs = pool.route([worker('f')], cold)!;
    assert.equal(fcfs.priority, undefined);
    pool.abandon(fcfs);
    const lease = pool.route([worker('p', null, 'priority')], cold)!;
    assert.equal(lease.priority, clock.now() + COLD_OFFSET_MS, 'nothing cached yet: cold');
    assert.equal(pool.prefillOrder.pendingBlocks('p'), 40);
    pool.firstToken(lease);
    assert.equal(pool.prefillOrder.pendingBlocks('p'), 0);
    pool.finish(lease, { promptTokens: 640, cachedTokens: 0 });
    // The same prompt again: the index now predicts it cached there, so it is warm.
    clock.advance(5);
    const again = pool.route([worker('p', null, 'priority')], cold)!;
    assert.equal(again.priority, clock.now());
    pool.abandon(again);
    assert.equal(pool.prefillOrder.pendingBlocks('p'), 0, 'released with the lease');
  });

  it('signals older than the maximum age are not returned', () => {
    const clock = new FakeClock();
    const pool = new WorkerPool(registry, clock, 0);
    pool.setSignalsMaxAge(3000);
    pool.setSignals('w', {
      running: 1,
      waiting: 2,
      kvCacheUsage: 0.5,
      scrapedAt: clock.now(),
      source: 'vllm',
    });
    assert.equal(pool.signals('w')?.waiting, 2);
    clock.advance(3001);
    assert.equal(pool.signals('w'), null);
    pool.forget('w');
    assert.equal(pool.signals('w'), null);
  });

  it('an open breaker admits one half-open probe after the cool-down; success re-admits', () => {
    const clock = new FakeClock();
    const pool = new WorkerPool(registry, clock, 0);
    pool.setPolicy('least-loaded'); // the breaker is the same under both policies
    const a = worker('a');
    const b = worker('b');
    for (let i = 0; i < BREAKER_THRESHOLD; i++) pool.failure('a');
    assert.equal(pool.isOpen('a'), true);
    for (let i = 0; i < 4; i++) assert.equal(pick(pool, [a, b])?.id, 'b');
    clock.advance(BREAKER_COOLDOWN_MS);
    pool.acquire('b'); // a is now the less loaded one
    const probe = pool.route([a, b], hints)!;
    assert.equal(probe.worker.id, 'a', 'the probe');
    assert.equal(pick(pool, [a, b])?.id, 'b', 'only one probe at a time');
    pool.success('a');
    pool.finish(probe, {});
    pool.release('b');
    pool.acquire('b');
    assert.equal(pick(pool, [a, b])?.id, 'a', 're-admitted');
  });

  it('a probe handed back without a verdict (the client left) lets the next request probe', () => {
    const clock = new FakeClock();
    const pool = new WorkerPool(registry, clock, 0);
    pool.setPolicy('least-loaded');
    const a = worker('a');
    const b = worker('b');
    for (let i = 0; i < BREAKER_THRESHOLD; i++) pool.failure('a');
    clock.advance(BREAKER_COOLDOWN_MS);
    pool.acquire('b');
    const probe = pool.route([a, b], hints)!;
    assert.equal(probe.worker.id, 'a', 'the probe');
    assert.equal(pick(pool, [a, b])?.id, 'b', 'only one probe at a time');
    pool.abandon(probe); // neither success nor failure
    clock.advance(60_000);
    assert.equal(pick(pool, [a, b])?.id, 'a', 'probed again');
  });
});
