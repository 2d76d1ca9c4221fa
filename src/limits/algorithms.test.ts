/**
 * The limiter math as pure functions: the spec's bounds as properties over
 * random traffic, and the decision numbers as tables.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { bindingDecision } from './binding.js';
import { gcraAllows, gcraDebt, gcraDecision, gcraNext, type GcraState } from './gcra.js';
import { SlidingLog, bucketAt, windowGrainMs } from './log.js';
import type { Decision } from './types.js';

const T0 = Date.UTC(2026, 0, 1);

/** Arrival times: T0 plus cumulative gaps (zeros give same-instant bursts). */
const arrivals = fc
  .array(fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 3000 })), { maxLength: 400 })
  .map((gaps) => {
    let t = T0;
    return gaps.map((g) => (t += g));
  });

/** The most admissions in any window [s, s + w). */
function maxInWindow(times: readonly number[], w: number): number {
  let best = 0;
  let lo = 0;
  for (let hi = 0; hi < times.length; hi++) {
    while (times[hi]! - times[lo]! >= w) lo++;
    best = Math.max(best, hi - lo + 1);
  }
  return best;
}

function countIn(times: readonly number[], from: number, to: number): number {
  return times.filter((x) => x > from && x <= to).length;
}

describe('GCRA', () => {
  it('no sliding window ever holds more than limit + burst (property)', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 50 }),
        fc.integer({ min: 0, max: 20 }),
        fc.integer({ min: 1, max: 60_000 }),
        arrivals,
        (limit, burst, windowMs, times) => {
          let s: GcraState | undefined;
          const admitted: number[] = [];
          for (const t of times) {
            const debt = gcraDebt(s, limit, t);
            if (!gcraAllows(debt, burst, windowMs)) continue;
            s = gcraNext(debt, limit, windowMs, t);
            admitted.push(t);
          }
          assert.ok(maxInWindow(admitted, windowMs) <= limit + burst);
        },
      ),
      { numRuns: 500 },
    );
  });

  it('from idle admits exactly burst + 1 at one instant', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 1000 }),
        fc.integer({ min: 0, max: 500 }),
        fc.integer({ min: 1, max: 86_400_000 }),
        (limit, burst, windowMs) => {
          let s: GcraState | undefined;
          let n = 0;
          for (;;) {
            const debt = gcraDebt(s, limit, T0);
            if (!gcraAllows(debt, burst, windowMs)) break;
            s = gcraNext(debt, limit, windowMs, T0);
            n++;
          }
          assert.equal(n, burst + 1);
        },
      ),
    );
  });

  it('decision numbers for the free tier', () => {
    const W = 60_000;
    // [debt in ticks of 1/64 ms, admitted?, expected decision]
    const CASES: ReadonlyArray<[number, boolean, Decision]> = [
      [0, true, { allowed: true, limit: 33, remaining: 32, resetMs: 938, retryAfterMs: 0 }],
      [0, false, { allowed: true, limit: 33, remaining: 33, resetMs: 0, retryAfterMs: 0 }],
      [32 * W, true, { allowed: true, limit: 33, remaining: 0, resetMs: 30_938, retryAfterMs: 0 }],
      [
        33 * W,
        false,
        { allowed: false, limit: 33, remaining: 0, resetMs: 30_938, retryAfterMs: 938 },
      ],
      [
        32 * W + 1,
        false,
        { allowed: false, limit: 33, remaining: 0, resetMs: 30_001, retryAfterMs: 1 },
      ],
    ];
    for (const [debt, admitted, want] of CASES) {
      assert.deepEqual(gcraDecision(debt, 64, 32, W, admitted), want, `debt ${debt}`);
    }
  });

  it('a changed limit reads an old state conservatively (TAT rounded up to a whole ms)', () => {
    const s = gcraNext(0, 64, 60_000, T0); // TAT = T0 + 937.5 ms
    assert.deepEqual(s, { tatMs: T0 + 937, tatRem: 32, den: 64 });
    assert.equal(gcraDebt(s, 64, T0), 60_000);
    assert.equal(gcraDebt(s, 128, T0), 938 * 128);
    assert.equal(gcraDebt(s, 128, T0 + 938), 0);
  });
});

describe('sliding log', () => {
  /** Drives a log with grain g; returns admissions and denial times. */
  function drive(times: readonly number[], limit: number, windowMs: number, grain: number) {
    const log = new SlidingLog(windowMs);
    const admitted: number[] = [];
    const denied: number[] = [];
    for (const t of times) {
      log.prune(t, windowMs);
      if (log.total < limit) {
        log.record(bucketAt(t, grain, log.last), 1);
        admitted.push(t);
      } else denied.push(t);
    }
    return { admitted, denied };
  }

  it('exact mode: at most limit in any window, and a denial only when limit lie in (t - W, t]', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 20 }),
        fc.integer({ min: 1, max: 30_000 }),
        arrivals,
        (limit, windowMs, times) => {
          const { admitted, denied } = drive(times, limit, windowMs, 1);
          assert.ok(maxInWindow(admitted, windowMs) <= limit);
          for (const t of denied) assert.ok(countIn(admitted, t - windowMs, t) >= limit);
        },
      ),
      { numRuns: 500 },
    );
  });

  it('bucketed mode: at most limit in any window, and a denial only when limit lie in the last W + g', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 20 }),
        fc.integer({ min: 10, max: 30_000 }),
        fc.integer({ min: 1, max: 100 }),
        arrivals,
        (limit, windowMs, divisor, times) => {
          const g = Math.ceil(windowMs / divisor);
          const { admitted, denied } = drive(times, limit, windowMs, g);
          assert.ok(maxInWindow(admitted, windowMs) <= limit);
          for (const t of denied) assert.ok(countIn(admitted, t - windowMs - g, t) >= limit);
        },
      ),
      { numRuns: 500 },
    );
  });

  it('uses 1 ms buckets up to 1000 and windowMs / 1000 above', () => {
    assert.equal(windowGrainMs(60, 60_000), 1);
    assert.equal(windowGrainMs(1000, 60_000), 1);
    assert.equal(windowGrainMs(1001, 60_000), 60);
    assert.equal(windowGrainMs(5000, 86_400_000), 86_400);
  });

  it('retryAt walks the oldest entries until the log would hold less than the limit', () => {
    const log = new SlidingLog(1000);
    log.record(10, 2);
    log.record(20, 1);
    log.record(30, 3);
    assert.equal(log.total, 6);
    assert.equal(log.retryAt(6, 1000), 1010);
    assert.equal(log.retryAt(4, 1000), 1020);
    assert.equal(log.retryAt(3, 1000), 1030);
    assert.equal(log.retryAt(1, 1000), 1030);
    log.prune(1015, 1000);
    assert.equal(log.total, 4);
  });
});

describe('bindingDecision', () => {
  const d = (allowed: boolean, limit: number, remaining: number, retryAfterMs = 0): Decision => ({
    allowed,
    limit,
    remaining,
    resetMs: 0,
    retryAfterMs,
  });
  const CASES: ReadonlyArray<[string, Decision[], number | undefined]> = [
    ['no rules: nothing binds', [], undefined],
    ['one rule', [d(true, 96, 10)], 0],
    ['the smallest remaining/limit among admissions', [d(true, 96, 40), d(true, 60, 20)], 1],
    [
      'a ratio, not an absolute count (tokens vs requests)',
      [d(true, 60, 30), d(true, 10_000, 100)],
      1,
    ],
    ['equal ratios: the smaller remaining', [d(true, 100, 50), d(true, 10, 5)], 1],
    ['any denial beats admissions', [d(true, 60, 0), d(false, 96, 0, 500)], 1],
    ['the denial with the longest wait', [d(false, 96, 0, 500), d(false, 60, 0, 9000)], 1],
    ['equal waits: the first', [d(false, 96, 0, 500), d(false, 60, 0, 500)], 0],
  ];
  for (const [name, ds, want] of CASES) {
    it(name, () => {
      assert.equal(bindingDecision(ds), want === undefined ? undefined : ds[want]);
    });
  }
});
