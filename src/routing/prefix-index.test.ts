import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { PrefixIndex, renderForIndex } from './prefix-index.js';

const text = (n: number, seed = 'a'): string => {
  let s = '';
  for (let i = 0; s.length < n; i++) s += `${seed}${i} `;
  return s.slice(0, n);
};

describe('PrefixIndex', () => {
  it('hashes full blocks in a chain: a shared prefix shares hashes, then diverges', () => {
    const ix = new PrefixIndex({ blockChars: 16 });
    const a = ix.blocks(text(100) + 'X'.repeat(60));
    const b = ix.blocks(text(100) + 'Y'.repeat(60));
    assert.equal(a.hashes.length, 10);
    assert.deepEqual(a.hashes.slice(0, 6), b.hashes.slice(0, 6));
    assert.notEqual(a.hashes[6], b.hashes[6]);
    // Same block text under another prefix hashes differently.
    const c = ix.blocks('Z'.repeat(16) + text(100).slice(16));
    assert.notEqual(c.hashes[1], a.hashes[1]);
  });

  it('renders messages canonically (role and text; content parts joined)', () => {
    const a = renderForIndex([
      { role: 'system', content: 'be brief' },
      { role: 'user', content: [{ type: 'text', text: 'hi' }] },
    ]);
    const b = renderForIndex([
      { role: 'system', content: 'be brief' },
      { role: 'user', content: 'hi' },
    ]);
    assert.equal(a, b);
    assert.notEqual(a, renderForIndex([{ role: 'user', content: 'be brief' }]));
  });

  it('predicts the matched prefix per worker after routing', () => {
    const ix = new PrefixIndex({ blockChars: 16, charsPerToken: 4 });
    const p = ix.blocks(text(320));
    assert.equal(ix.match('w1', p), 0);
    ix.route('w1', p);
    assert.equal(ix.match('w1', p), 20);
    assert.equal(ix.match('w2', p), 0);
    // 20 blocks × 16 chars / 4 chars per token, capped at prompt tokens − 1.
    assert.equal(ix.predictCachedTokens('w1', p, 100), 80);
    assert.equal(ix.predictCachedTokens('w1', p, 50), 49);
  });

  it('is bounded per worker (LRU, first blocks outlive the tail)', () => {
    const ix = new PrefixIndex({ blockChars: 16, defaultCapacityBlocks: 30, minCapacityBlocks: 1 });
    const a = ix.blocks(text(320, 'a'));
    const b = ix.blocks(text(320, 'b'));
    ix.route('w', a);
    ix.route('w', b);
    assert.equal(ix.sizeOf('w'), 30);
    assert.equal(ix.match('w', b), 20);
    // a's tail was touched first, so its least recent blocks are the tail ones; its
    // leading blocks that survive still form a prefix.
    assert.equal(ix.match('w', a), 10);
  });

  it('ties capacity to the KV-cache size', () => {
    const ix = new PrefixIndex({ blockChars: 64, charsPerToken: 4, minCapacityBlocks: 1 });
    ix.setKvCacheTokens('w', 16_000);
    assert.equal(ix.capacityOf('w'), 1000);
  });

  it('closes the loop: reported < predicted shrinks the worker and drops old blocks', () => {
    const ix = new PrefixIndex({
      blockChars: 16,
      charsPerToken: 4,
      defaultCapacityBlocks: 100,
      minCapacityBlocks: 1,
    });
    const old = ix.blocks(text(640, 'o'));
    ix.route('w', old); // 40 blocks
    const p = ix.blocks(text(640, 'p'));
    ix.route('w', p); // 80 blocks now
    const again = ix.route('w', p);
    const predicted = ix.blocksToTokens(again.stamps.length); // 160 tokens
    assert.equal(predicted, 160);
    // The worker only had 10 blocks' worth: it keeps 30 blocks fewer than assumed.
    ix.observe('w', predicted, 40, again);
    assert.equal(ix.capacityOf('w'), 70);
    assert.equal(ix.sizeOf('w'), 70);
    assert.equal(ix.match('w', p), 40, 'the prompt itself was just recomputed: kept');
    assert.equal(ix.match('w', old), 30, 'the least recent blocks (its tail) went first');
    const s = ix.predictionStats();
    assert.equal(s.observations, 1);
    assert.equal(s.overPredicted, 1);
    assert.equal(s.meanErrorTokens, 120);
    assert.equal(s.correctedEvictions, 10);
  });

  it('closes the loop: reported > predicted grows the capacity (bounded)', () => {
    const ix = new PrefixIndex({
      blockChars: 16,
      charsPerToken: 4,
      defaultCapacityBlocks: 100,
      maxCapacityFactor: 2,
    });
    const p = ix.blocks(text(640));
    const r = ix.route('w', p);
    ix.observe('w', 0, 120, r);
    assert.equal(ix.capacityOf('w'), 130);
    for (let i = 0; i < 10; i++) ix.observe('w', 0, 120, r);
    assert.equal(ix.capacityOf('w'), 200);
    assert.equal(ix.predictionStats().underPredicted, 11);
  });

  it('treats an error within one block as agreement, and can be switched off', () => {
    const ix = new PrefixIndex({ blockChars: 16, charsPerToken: 4, defaultCapacityBlocks: 100 });
    const r = ix.route('w', ix.blocks(text(640)));
    ix.observe('w', 100, 97, r);
    assert.equal(ix.capacityOf('w'), 100);
    const off = new PrefixIndex({ blockChars: 16, correct: false, defaultCapacityBlocks: 100 });
    const r2 = off.route('w', off.blocks(text(640)));
    off.observe('w', 160, 0, r2);
    assert.equal(off.capacityOf('w'), 100);
    assert.equal(off.predictionStats().overPredicted, 1);
  });

  it('a KV-cache capacity follows the learned chars per token, keeping the correction', () => {
    const ix = new PrefixIndex({ blockChars: 16, charsPerToken: 4, minCapacityBlocks: 1 });
    ix.setKvCacheTokens('w', 400); // 400 tokens × 4 chars ÷ 16 = 100 blocks
    assert.equal(ix.capacityOf('w'), 100);
    const r = ix.route('w', ix.blocks(text(320)));
    ix.observe('w', 0, 40, r); // 40 tokens more than predicted: +10 blocks
    assert.equal(ix.capacityOf('w'), 110);
    // Prompts of 3 chars per token: 400 tokens are 75 blocks, and the +10 stays.
    for (let i = 0; i < 400; i++) ix.observe('w', 80, 80, r, 320 / 3);
    assert.ok(Math.abs(ix.charsPerToken - 3) < 0.01);
    assert.equal(ix.capacityOf('w'), 85);
  });

  it('release makes a finished prompt the most recent again (the engine frees it then)', () => {
    const ix = new PrefixIndex({ blockChars: 16, defaultCapacityBlocks: 40, minCapacityBlocks: 1 });
    const a = ix.blocks(text(320, 'a'));
    const b = ix.blocks(text(320, 'b'));
    const ra = ix.route('w', a);
    ix.route('w', b);
    ix.release('w', ra); // a finished after b was dispatched
    ix.route('w', ix.blocks(text(320, 'c')));
    assert.equal(ix.match('w', a), 20, 'a outlives b');
    assert.equal(ix.match('w', b), 0);
  });

  it('learns chars per token from reported prompt tokens', () => {
    const ix = new PrefixIndex({ blockChars: 16, charsPerToken: 4 });
    const p = ix.blocks(text(300));
    const r = ix.route('w', p);
    for (let i = 0; i < 200; i++) ix.observe('w', 0, 0, r, 100);
    assert.ok(Math.abs(ix.charsPerToken - 3) < 0.01);
  });

  it('forgets a worker that left', () => {
    const ix = new PrefixIndex({ blockChars: 16 });
    const p = ix.blocks(text(64));
    ix.route('w', p);
    ix.forget('w');
    assert.equal(ix.match('w', p), 0);
  });
});
