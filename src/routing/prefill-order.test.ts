import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { COLD_OFFSET_MS, PrefillOrder } from './prefill-order.js';
import type { Route } from './score.js';

/** A route on `workerId` for a prompt of `blocks` block hashes, the first `hit` predicted cached. */
function route(
  workerId: string,
  blocks: number[],
  hit: number,
  o: { promptTokens?: number; workTokens?: number } = {},
): Route {
  const promptTokens = o.promptTokens ?? blocks.length * 16;
  return {
    workerId,
    predictedCachedTokens: hit * 16,
    predictedTtftMs: 0,
    promptTokens,
    aheadTokens: 0,
    workTokens: o.workTokens ?? promptTokens - hit * 16,
    prompt: { blocks: { hashes: blocks, chars: blocks.length * 64 }, stamps: blocks.slice(0, hit) },
    started: false,
    done: false,
    runningAtFirstToken: 0,
  };
}

const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);

describe('PrefillOrder: warm before cold, arrival order within each', () => {
  it('a prompt predicted mostly cached keeps its arrival; a cold one goes after the warm ones of the next 500 ms', () => {
    const order = new PrefillOrder();
    const warm = order.assign(route('w1', range(0, 10), 6), 1_000);
    const cold = order.assign(route('w1', range(100, 110), 2), 900);
    assert.equal(warm.priority, 1_000);
    assert.equal(cold.priority, 900 + COLD_OFFSET_MS);
    assert.deepEqual([warm.class, cold.class], ['warm', 'cold']);
    assert.ok(
      warm.priority < cold.priority,
      'the later warm request runs before the earlier cold one',
    );
    // ... but not one that arrives more than the offset later: a cold request cannot starve.
    const muchLater = order.assign(route('w3', range(0, 10), 6), 900 + COLD_OFFSET_MS + 1);
    assert.ok(cold.priority < muchLater.priority);
    // Exactly half the prompt as work is still warm; more is cold.
    assert.equal(order.assign(route('w2', range(0, 10), 5), 5).priority, 5);
    assert.equal(
      order.assign(route('w2', range(0, 10), 5, { workTokens: 81 }), 5).priority,
      5 + COLD_OFFSET_MS,
    );
  });

  it('cold prompts keep their arrival order among themselves (none starves)', () => {
    const order = new PrefillOrder();
    const long = order.assign(route('w1', range(0, 200), 0), 10);
    const short = order.assign(route('w1', range(500, 502), 0), 20);
    assert.ok(long.priority < short.priority);
  });
});

describe('PrefillOrder: follow the request that will compute the hit', () => {
  it('a warm request whose hit another request still has to prefill queues right after it', () => {
    const order = new PrefillOrder();
    // A cold request starts computing blocks 0..9 on w1.
    const provider = order.assign(route('w1', range(0, 10), 0), 100);
    assert.equal(order.pendingBlocks('w1'), 10);
    // The index already predicts blocks 0..7 cached for the next one.
    const follower = order.assign(route('w1', range(0, 10), 8), 150);
    assert.equal(follower.class, 'follow');
    assert.equal(
      follower.priority,
      provider.priority,
      'takes the provider priority: after it by arrival',
    );
    // Another worker's pending blocks are not this worker's.
    assert.equal(order.assign(route('w2', range(0, 10), 8), 160).priority, 160);
    // Once the provider has its first token the blocks are real: own arrival again.
    provider.release();
    provider.release();
    assert.equal(order.pendingBlocks('w1'), 2, "the follower's own tail blocks stay pending");
    const after = order.assign(route('w1', range(0, 10), 8), 170);
    assert.equal(after.priority, 170);
    follower.release();
    after.release();
    assert.equal(order.pendingBlocks('w1'), 0);
  });

  it('follows the earliest of several providers, and never moves a request earlier', () => {
    const order = new PrefillOrder();
    const early = order.assign(route('w1', range(0, 4), 0), 100); // cold: 100 + offset
    order.assign(route('w1', range(4, 8), 0), 200); // cold: 200 + offset
    const both = order.assign(route('w1', range(0, 10), 8), 300);
    assert.equal(both.priority, early.priority);
    // A provider that is itself warm and earlier leaves the follower at its own arrival.
    const order2 = new PrefillOrder();
    order2.assign(route('w1', [...range(0, 6), 50, 51], 6), 10); // warm, computes 50, 51
    assert.equal(order2.assign(route('w1', [...range(0, 6), 50, 51, 52], 8), 20).priority, 20);
  });

  it('a cold request ignores providers: it sorts by its own arrival among the cold', () => {
    const order = new PrefillOrder();
    order.assign(route('w1', range(0, 10), 0), 500);
    assert.equal(order.assign(route('w1', range(0, 40), 5), 400).priority, 400 + COLD_OFFSET_MS);
  });
});
