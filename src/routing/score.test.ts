import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { PrefixIndex } from './prefix-index.js';
import {
  admissionLimit,
  admits,
  DEFAULT_SCORE_CONSTANTS,
  scoreWorker,
  sloPenalty,
  tierRank,
  WorkerScorer,
  type Candidate,
  type PoolView,
  type RouteRequest,
  type WorkerView,
} from './score.js';

const pool: PoolView = { msPerToken: 0.5, tpotBaseMs: 20, meanWorkTokens: 500 };
const idle = (id: string, extra: Partial<WorkerView> = {}): WorkerView => ({
  id,
  pendingPrefillTokens: 0,
  running: 0,
  ...extra,
});
const req = { promptTokens: 2000, slo: {} };
const best = (...scores: ReturnType<typeof scoreWorker>[]): string =>
  scores.reduce((a, b) => (b.score > a.score ? b : a)).workerId;

describe('scoreWorker: each term moves the choice', () => {
  it('load: more pending prefill work or exported waiting loses', () => {
    assert.equal(
      best(
        scoreWorker(idle('a', { pendingPrefillTokens: 3000 }), req, 0, pool),
        scoreWorker(idle('b'), req, 0, pool),
      ),
      'b',
    );
    assert.equal(
      best(
        scoreWorker(idle('a', { exportedWaiting: 4 }), req, 0, pool),
        scoreWorker(idle('b', { exportedWaiting: 1 }), req, 0, pool),
      ),
      'b',
    );
    // Running sequences raise the predicted TPOT.
    assert.equal(
      best(
        scoreWorker(idle('a', { running: 60 }), req, 0, pool),
        scoreWorker(idle('b', { running: 2 }), req, 0, pool),
      ),
      'b',
    );
  });

  it('KV pressure: above the knee the fuller worker loses; below it, no effect', () => {
    assert.equal(
      best(
        scoreWorker(idle('a', { kvCacheUsage: 0.97 }), req, 0, pool),
        scoreWorker(idle('b', { kvCacheUsage: 0.5 }), req, 0, pool),
      ),
      'b',
    );
    const low = scoreWorker(idle('a', { kvCacheUsage: 0.1 }), req, 0, pool);
    const mid = scoreWorker(idle('b', { kvCacheUsage: 0.7 }), req, 0, pool);
    assert.equal(low.cost, mid.cost);
  });

  it('prefix affinity: the worker holding the prefix wins, until its queue costs more', () => {
    assert.equal(
      best(scoreWorker(idle('a'), req, 0, pool), scoreWorker(idle('b'), req, 1500, pool)),
      'b',
    );
    // 1,500 cached tokens are worth 1,500 tokens of queued work, not more.
    assert.equal(
      best(
        scoreWorker(idle('a'), req, 0, pool),
        scoreWorker(idle('b', { pendingPrefillTokens: 2000 }), req, 1500, pool),
      ),
      'a',
    );
  });

  it('uncached weight β: off by default; on, uncached work costs beyond the own TTFT', () => {
    // a holds 1,500 tokens of the prompt but has 1,800 tokens queued; b is idle and cold.
    const a = idle('a', { pendingPrefillTokens: 1800 });
    const b = idle('b');
    assert.equal(best(scoreWorker(a, req, 1500, pool), scoreWorker(b, req, 0, pool)), 'b');
    const k = { ...DEFAULT_SCORE_CONSTANTS, uncachedWeight: 0.5 };
    const sa = scoreWorker(a, req, 1500, pool, k);
    const sb = scoreWorker(b, req, 0, pool, k);
    assert.equal(best(sa, sb), 'a');
    // The term is cost only: the predicted TTFT is unchanged.
    assert.equal(sb.predictedTtftMs, scoreWorker(b, req, 0, pool).predictedTtftMs);
    assert.equal(sb.cost - scoreWorker(b, req, 0, pool).cost, 0.5 * 0.5 * 2000);
  });

  it('busy uncached weight β_busy: only under a backlog, in proportion to it', () => {
    // a holds 1,500 tokens of the prompt but has 2,100 tokens queued; b is cold with 300.
    const a = idle('a', { pendingPrefillTokens: 2100 });
    const b = idle('b', { pendingPrefillTokens: 300 });
    assert.equal(DEFAULT_SCORE_CONSTANTS.busyUncachedWeight, 0.5);
    // No backlog signal (busy absent or 0): the choice is the predicted TTFT's, b.
    assert.equal(best(scoreWorker(a, req, 1500, pool), scoreWorker(b, req, 0, pool)), 'b');
    const calm = { ...pool, busy: 0 };
    assert.equal(best(scoreWorker(a, req, 1500, calm), scoreWorker(b, req, 0, calm)), 'b');
    // Every candidate has a queue: b's 2,000 uncached tokens delay whoever comes next.
    const busy = { ...pool, busy: 1 };
    const sa = scoreWorker(a, req, 1500, busy);
    const sb = scoreWorker(b, req, 0, busy);
    assert.equal(best(sa, sb), 'a');
    // Cost only, linear in busy (capped at 1): 0.5 × busy × m × u.
    const base = scoreWorker(b, req, 0, pool);
    assert.equal(sb.predictedTtftMs, base.predictedTtftMs);
    assert.equal(sb.cost - base.cost, 0.5 * 0.5 * 2000);
    assert.equal(
      scoreWorker(b, req, 0, { ...pool, busy: 0.5 }).cost - base.cost,
      0.25 * 0.5 * 2000,
    );
    assert.equal(scoreWorker(b, req, 0, { ...pool, busy: 3 }).cost, sb.cost);
  });

  it('observed speed: a worker with a higher learned ms/token loses', () => {
    assert.equal(
      best(
        scoreWorker(idle('slow', { msPerToken: 0.75 }), req, 0, pool),
        scoreWorker(idle('fast', { msPerToken: 0.5 }), req, 0, pool),
      ),
      'fast',
    );
  });

  it('SLO fit: a TTFT target steers to the worker predicted to meet it', () => {
    // Without an SLO the cheaper-overall worker (short TPOT) wins despite a slower TTFT…
    const a = idle('a', { msPerToken: 0.5, tpotBaseMs: 10 });
    const b = idle('b', { msPerToken: 0.4, tpotBaseMs: 300 });
    assert.equal(best(scoreWorker(a, req, 0, pool), scoreWorker(b, req, 0, pool)), 'a');
    // …with X-SLO-TTFT-Ms 1000 only b (predicted ≈ 826 ms) meets it.
    const slo = { promptTokens: 2000, slo: { ttftMs: 1000 } };
    const sa = scoreWorker(a, slo, 0, pool);
    const sb = scoreWorker(b, slo, 0, pool);
    assert.ok(sa.predictedTtftMs > 1000 && sb.predictedTtftMs < 1000);
    assert.equal(best(sa, sb), 'b');
    // A TPOT target works the same way.
    const tpot = { promptTokens: 2000, slo: { tpotMs: 30 } };
    assert.equal(best(scoreWorker(a, tpot, 0, pool), scoreWorker(b, tpot, 0, pool)), 'a');
  });

  it('SLO overshoot λ: when every worker misses the target, the smaller miss wins', () => {
    const k = DEFAULT_SCORE_CONSTANTS;
    assert.equal(k.sloOvershootWeight, 2);
    // The penalty: nothing up to the target, then S_miss plus λ per ms beyond it.
    assert.equal(sloPenalty(1000, 1000, k), 0);
    assert.equal(sloPenalty(999, 1000, k), 0);
    assert.equal(sloPenalty(1100, 1000, k), k.sloMissMs + 2 * 100);
    // Under a backlog, a (holds 1,500 tokens, 2,100 queued, predicted ≈ 1,332 ms) beats
    // b (cold, 300 queued, ≈ 1,182 ms): β_busy prices b's 2,000 uncached tokens.
    const a = idle('a', { pendingPrefillTokens: 2100 });
    const b = idle('b', { pendingPrefillTokens: 300 });
    const busy = { ...pool, busy: 1 };
    assert.equal(best(scoreWorker(a, req, 1500, busy), scoreWorker(b, req, 0, busy)), 'a');
    // With X-SLO-TTFT-Ms 1000 both miss; a step alone would add S_miss to both and keep
    // a. The overshoot term keeps the caller's target in play: b misses by less.
    const slo = { promptTokens: 2000, slo: { ttftMs: 1000 } };
    const sa = scoreWorker(a, slo, 1500, busy);
    const sb = scoreWorker(b, slo, 0, busy);
    assert.ok(sa.predictedTtftMs > sb.predictedTtftMs && sb.predictedTtftMs > 1000);
    assert.equal(sb.sloPenaltyMs, k.sloMissMs + 2 * (sb.predictedTtftMs - 1000));
    assert.equal(best(sa, sb), 'b');
    const step = { ...k, sloOvershootWeight: 0 };
    assert.equal(
      best(scoreWorker(a, slo, 1500, busy, step), scoreWorker(b, slo, 0, busy, step)),
      'a',
    );
    // Without a target the term never applies.
    assert.equal(scoreWorker(a, req, 1500, busy).sloPenaltyMs, 0);
  });
});

describe('tier admission', () => {
  it('flex stops at 85 % of maxInFlight, default at 100 %, priority at 115 %', () => {
    assert.equal(admissionLimit(100, 'flex'), 85);
    assert.equal(admissionLimit(100, 'default'), 100);
    assert.equal(admissionLimit(100, 'auto'), 100);
    assert.equal(admissionLimit(100, 'priority'), 115);
    assert.equal(admits(90, 100, 'flex'), false);
    assert.equal(admits(90, 100, 'default'), true);
    assert.equal(admits(105, 100, 'default'), false);
    assert.equal(admits(105, 100, 'priority'), true);
    assert.ok(tierRank('priority') > tierRank('default') && tierRank('default') > tierRank('flex'));
    assert.equal(tierRank('auto'), tierRank('default'));
  });
});

describe('WorkerScorer', () => {
  const candidates: Candidate[] = [{ id: 'w1' }, { id: 'w2' }];
  const make = (maxInFlight = 10): WorkerScorer =>
    new WorkerScorer({ index: new PrefixIndex({ blockChars: 16, charsPerToken: 4 }), maxInFlight });
  const request = (
    s: WorkerScorer,
    text: string,
    extra: Partial<RouteRequest> = {},
  ): RouteRequest => ({
    blocks: s.index.blocks(text),
    slo: {},
    tier: 'default',
    ...extra,
  });
  const prompt = 'shared system prompt '.repeat(200);

  it('spreads cold requests and sends a repeated prefix back to its worker', () => {
    const s = make();
    const first = s.choose(candidates, request(s, prompt + 'question one'));
    assert.ok(first.ok);
    s.finish(first.route, { ttftMs: 100, tpotMs: 20, promptTokens: 1000, cachedTokens: 0 });
    const again = s.choose(candidates, request(s, prompt + 'question two'));
    assert.ok(again.ok);
    assert.equal(again.route.workerId, first.route.workerId);
    assert.ok(again.route.predictedCachedTokens > 900);
  });

  it('busy: β_busy applies once the least busy candidate has a queue, not before', () => {
    const s = make(1000);
    const extra = (c: { predictedTtftMs: number; predictedTpotMs: number; cost: number }) =>
      c.cost - c.predictedTtftMs - c.predictedTpotMs;
    const a = s.choose(candidates, request(s, 'first unique prompt '.repeat(40)));
    assert.ok(a.ok);
    // One worker is still idle: no candidate pays the busy term.
    const b = s.choose(candidates, request(s, 'second unique prompt '.repeat(40)));
    assert.ok(b.ok);
    assert.notEqual(b.route.workerId, a.route.workerId);
    for (const sc of b.scores) assert.equal(extra(sc), 0);
    // Both now queue 200+ tokens (≥ busyWaitMs at the prior 0.5 ms/token): busy = 1.
    const c = s.choose(candidates, request(s, 'third unique prompt '.repeat(40)));
    assert.ok(c.ok);
    for (const sc of c.scores) {
      const u = c.route.promptTokens - sc.predictedCachedTokens;
      assert.ok(Math.abs(extra(sc) - 0.5 * 0.5 * u) < 1e-9);
    }
  });

  it('a flex request is refused (capacity_exceeded) before default, default before priority', () => {
    const s = make(10);
    const routes = [];
    for (let i = 0; i < 18; i++) {
      const c = s.choose(candidates, request(s, `p${i}`));
      assert.ok(c.ok);
      routes.push(c.route);
    }
    // 9 in flight per worker: flex (limit 8) is refused, default (10) admitted.
    const flex = s.choose(candidates, request(s, 'x', { tier: 'flex' }));
    assert.deepEqual(flex, { ok: false, code: 'capacity_exceeded', retryAfterMs: 1000 });
    assert.ok(s.choose(candidates, request(s, 'y')).ok);
    assert.ok(s.choose(candidates, request(s, 'z')).ok);
    assert.equal(s.choose(candidates, request(s, 'd')).ok, false);
    assert.ok(s.choose(candidates, request(s, 'q', { tier: 'priority' })).ok);
    // Finishing frees a slot again.
    for (const r of routes) s.finish(r, { ttftMs: 10 });
    assert.equal(s.choose(candidates, request(s, 'e', { tier: 'flex' })).ok, true);
  });

  it('excluded or missing workers give unavailable, not capacity_exceeded', () => {
    const s = make();
    const c = s.choose(candidates, request(s, 'x'), new Set(['w1', 'w2']));
    assert.equal(c.ok, false);
    assert.equal(!c.ok && c.code, 'unavailable');
  });

  it('learns a slow worker from observed TTFT and routes away from it', () => {
    const s = make(1000);
    for (let i = 0; i < 20; i++) {
      const c = s.choose(candidates, request(s, `unique prompt ${i} `.repeat(50)));
      assert.ok(c.ok);
      const slow = c.route.workerId === 'w2';
      s.finish(c.route, { ttftMs: slow ? 600 : 200, tpotMs: slow ? 30 : 20, promptTokens: 250 });
    }
    let w2 = 0;
    for (let i = 0; i < 10; i++) {
      const c = s.choose(candidates, request(s, `fresh ${i} `.repeat(50)));
      assert.ok(c.ok);
      if (c.route.workerId === 'w2') w2++;
      s.fail(c.route);
    }
    assert.equal(w2, 0);
    const snap = s.snapshot();
    assert.ok(
      snap.find((x) => x.workerId === 'w2')!.msPerToken! >
        snap.find((x) => x.workerId === 'w1')!.msPerToken!,
    );
  });

  it('pending prefill work leaves at the first token; failures release everything', () => {
    const s = make();
    const c = s.choose(candidates, request(s, prompt));
    assert.ok(c.ok);
    const id = c.route.workerId;
    assert.ok(s.snapshot().find((x) => x.workerId === id)!.pendingPrefillTokens > 0);
    s.firstToken(c.route);
    const after = s.snapshot().find((x) => x.workerId === id)!;
    assert.equal(after.pendingPrefillTokens, 0);
    assert.equal(after.running, 1);
    s.fail(c.route);
    s.fail(c.route);
    assert.equal(s.inFlight(id), 0);
    assert.equal(s.snapshot().find((x) => x.workerId === id)!.running, 0);
  });

  it('with a clock, credits the prefill already done on the oldest queued request', () => {
    const s = make(1000);
    const one: Candidate[] = [{ id: 'w1' }];
    const ahead = (nowMs?: number): number => {
      const c = s.choose(one, request(s, 'probe', nowMs === undefined ? {} : { nowMs }));
      assert.ok(c.ok);
      s.fail(c.route, nowMs === undefined ? undefined : { nowMs });
      return c.route.aheadTokens;
    };
    // Teach w1 its speed: 0.5 ms per token of work.
    const t = s.choose(one, request(s, 'x'.repeat(400), { nowMs: 0 }));
    assert.ok(t.ok);
    s.finish(t.route, { ttftMs: 0.5 * t.route.workTokens });
    // Two cold requests queued at t = 1000: the first starts at once.
    const a = s.choose(one, request(s, 'a'.repeat(4000), { nowMs: 1000 }));
    const b = s.choose(one, request(s, 'b'.repeat(4000), { nowMs: 1000 }));
    assert.ok(a.ok && b.ok);
    const both = a.route.workTokens + b.route.workTokens;
    assert.equal(ahead(), both, 'no clock: nothing credited');
    assert.equal(ahead(1000), both);
    assert.equal(ahead(1000 + 0.5 * 400), both - 400, '400 tokens of a are done');
    // a has no first token yet, so at most its own work is credited.
    assert.equal(ahead(1e6), b.route.workTokens);
    // a's first token: b starts then, and is credited from that moment.
    s.firstToken(a.route, { nowMs: 5000 });
    assert.equal(ahead(5000), b.route.workTokens);
    assert.equal(ahead(5000 + 0.5 * 100), b.route.workTokens - 100);
  });

  it('a worker learned at 0 ms per token (first token within the same ms) keeps a finite score', () => {
    const s = make(1000);
    // w1 answered its first token in the millisecond it got the request; w2 is slow.
    const teach = (id: string, ttftMs: number) => {
      const c = s.choose([{ id }], request(s, `teach ${id}`, { nowMs: 0 }));
      assert.ok(c.ok);
      s.finish(c.route, { ttftMs });
    };
    teach('w1', 0);
    teach('w2', 500);
    // Requests arriving in one millisecond: the first starts w1's queue at that instant.
    const now = 10_000;
    for (let i = 0; i < 4; i++) {
      const c = s.choose(candidates, request(s, `burst ${i} `.repeat(20), { nowMs: now }));
      assert.ok(c.ok);
      for (const sc of c.scores) assert.ok(Number.isFinite(sc.cost), `cost of ${sc.workerId}`);
      assert.ok(Number.isFinite(c.route.aheadTokens));
      assert.equal(c.route.workerId, 'w1', 'the faster worker wins');
    }
  });

  it('a request that ends after its worker was forgotten does not bring the worker back', () => {
    const s = make(1000);
    const c = s.choose([{ id: 'gone' }], request(s, prompt));
    assert.ok(c.ok);
    const d = s.choose([{ id: 'gone' }], request(s, prompt + 'x'));
    assert.ok(d.ok);
    s.forget('gone'); // deregistered while its requests were still running
    s.finish(c.route, { ttftMs: 5000, tpotMs: 100, promptTokens: 1000, cachedTokens: 0 });
    s.fail(d.route);
    assert.deepEqual(
      s.snapshot().map((x) => x.workerId),
      [],
      'no state kept for the removed worker',
    );
    assert.equal(s.index.sizeOf('gone'), 0);
    // Its slow answer is not part of the pool mean a new worker is scored with.
    const n = s.choose([{ id: 'new' }], request(s, 'fresh prompt', { promptTokens: 100 }));
    assert.ok(n.ok);
    const fresh = make(1000).choose(
      [{ id: 'new' }],
      request(s, 'fresh prompt', { promptTokens: 100 }),
    );
    assert.ok(fresh.ok);
    assert.equal(n.route.predictedTtftMs, fresh.route.predictedTtftMs);
  });

  it('requests of a forgotten worker do not count against it when it is back under its id', () => {
    const s = make(1000);
    const old = [0, 1, 2].map((i) => {
      const c = s.choose([{ id: 'back' }], request(s, `${prompt} old ${i}`, { nowMs: 0 }));
      assert.ok(c.ok);
      return c.route;
    });
    s.firstToken(old[0]!, { nowMs: 10 });
    s.forget('back'); // deleted while they ran, then added again
    const fresh = s.choose([{ id: 'back' }], request(s, `${prompt} new`, { nowMs: 20 }));
    assert.ok(fresh.ok);
    const before = s.snapshot().find((x) => x.workerId === 'back')!;
    s.finish(old[0]!, { ttftMs: 10, promptTokens: 1000, cachedTokens: 0 });
    s.fail(old[1]!, { nowMs: 30 });
    s.firstToken(old[2]!, { nowMs: 30 });
    s.fail(old[2]!, { nowMs: 40 });
    assert.deepEqual(
      s.snapshot().find((x) => x.workerId === 'back'),
      before,
      "the old requests' ends leave the new state alone",
    );
    s.fail(fresh.route, { nowMs: 50 });
    const after = s.snapshot().find((x) => x.workerId === 'back')!;
    assert.equal(after.inFlight, 0);
    assert.equal(after.pendingPrefillTokens, 0);
  });

  it('feeds reported cached_tokens back into the prefix index', () => {
    const s = make();
    const a = s.choose(candidates, request(s, prompt + 'a'));
    assert.ok(a.ok);
    s.finish(a.route, { ttftMs: 50, promptTokens: 1000, cachedTokens: 0 });
    const b = s.choose(candidates, request(s, prompt + 'b'));
    assert.ok(b.ok);
    s.finish(b.route, { ttftMs: 50, promptTokens: 1000, cachedTokens: 0 });
    const st = s.index.predictionStats();
    assert.equal(st.observations, 2);
    assert.equal(st.overPredicted, 1, 'the second request was predicted cached but was not');
  });
});
