/**
 * One contract for every limiter backend: the memory backend always, Redis
 * when TEST_REDIS_URL is set (required when CI=true). Fake times only.
 */
import { after, before, describe, it, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fc from 'fast-check';
import { connectRedis, type Redis } from '../store/redis.js';
import {
  MemoryLimiter,
  RedisLimiter,
  bindingDecision,
  type Decision,
  type LimiterBackend,
  type Rule,
} from './index.js';

const T0 = Date.UTC(2026, 0, 1); // a multiple of every bucket width used below
const MIN = 60_000;
const TIERS = [
  { tier: 'free', limit: 64, burst: 32 },
  { tier: 'cpu', limit: 128, burst: 64 },
  { tier: 'gpu', limit: 256, burst: 128 },
] as const;

interface Subject {
  name: string;
  fresh: () => LimiterBackend;
  /** Property-test runs (Redis pays a round trip per step). */
  runs: number;
}

async function one(l: LimiterBackend, rule: Rule, t: number): Promise<Decision> {
  const [d] = await l.acquire([rule], t);
  assert.ok(d);
  return d;
}

/** Acquires at t until denied; returns the admissions and the denial. */
async function exhaust(
  l: LimiterBackend,
  rule: Rule,
  t: number,
): Promise<{ admitted: number; denial: Decision }> {
  for (let admitted = 0; admitted < 100_000; admitted++) {
    const d = await one(l, rule, t);
    if (!d.allowed) return { admitted, denial: d };
  }
  throw new Error('never denied');
}

/** Counts of `times` (sorted) in [s, s + w) for each s in starts (ascending). */
function windowCounts(times: readonly number[], starts: readonly number[], w: number): number[] {
  const out: number[] = [];
  let lo = 0;
  let hi = 0;
  for (const s of starts) {
    while (lo < times.length && times[lo]! < s) lo++;
    while (hi < times.length && times[hi]! < s + w) hi++;
    out.push(hi - lo);
  }
  return out;
}

function range(from: number, to: number, step: number): number[] {
  const out: number[] = [];
  for (let s = from; s <= to; s += step) out.push(s);
  return out;
}

/** Drives requests every stepMs for horizonMs; returns admission times. */
async function overload(
  l: LimiterBackend,
  rules: readonly Rule[],
  stepMs: number,
  horizonMs: number,
  onAdmit?: (t: number) => Promise<void> | void,
): Promise<number[]> {
  const times: number[] = [];
  for (let t = T0; t < T0 + horizonMs; t += stepMs) {
    const ds = await l.acquire(rules, t);
    if (ds.every((d) => d.allowed)) {
      times.push(t);
      await onAdmit?.(t);
    }
  }
  return times;
}

function contractSuite(s: Subject): void {
  describe('burst (GCRA)', () => {
    for (const { tier, limit, burst } of TIERS) {
      it(`${tier}: a full bucket admits burst + 1 at once, then denies for exactly T`, async () => {
        const l = s.fresh();
        const rule: Rule = { kind: 'burst', key: `tier:${tier}`, limit, burst, windowMs: MIN };
        const first = await one(l, rule, T0);
        assert.deepEqual(first, {
          allowed: true,
          limit: burst + 1,
          remaining: burst,
          resetMs: Math.ceil(MIN / limit),
          retryAfterMs: 0,
        });
        const { admitted, denial } = await exhaust(l, rule, T0);
        assert.equal(admitted + 1, burst + 1);
        assert.deepEqual(denial, {
          allowed: false,
          limit: burst + 1,
          remaining: 0,
          resetMs: Math.ceil(((burst + 1) * MIN) / limit),
          retryAfterMs: Math.ceil(MIN / limit),
        });
        await l.close();
      });
    }

    it('refills at the sustained rate and is full again after resetMs', async () => {
      const l = s.fresh();
      const rule: Rule = { kind: 'burst', key: 'refill', limit: 60, burst: 5, windowMs: MIN };
      const { denial } = await exhaust(l, rule, T0);
      assert.equal(denial.retryAfterMs, 1000);
      // Each interval T = 1 s frees exactly one admission.
      const d = await one(l, rule, T0 + 1000);
      assert.equal(d.allowed, true);
      assert.equal(d.remaining, 0);
      assert.equal((await one(l, rule, T0 + 1000)).allowed, false);
      const reset = (await one(l, rule, T0 + 1000)).resetMs;
      assert.equal(reset, 6000);
      const full = await exhaust(l, rule, T0 + 1000 + reset);
      assert.equal(full.admitted, 6);
      await l.close();
    });
  });

  describe('window (sliding log)', () => {
    it('counts down remaining; the request over the limit waits for the oldest to expire', async () => {
      const l = s.fresh();
      const rule: Rule = { kind: 'window', key: 'quota', limit: 5, windowMs: 10_000 };
      for (let i = 0; i < 5; i++) {
        assert.deepEqual(await one(l, rule, T0 + i * 1000), {
          allowed: true,
          limit: 5,
          remaining: 4 - i,
          resetMs: 10_000,
          retryAfterMs: 0,
        });
      }
      assert.deepEqual(await one(l, rule, T0 + 5000), {
        allowed: false,
        limit: 5,
        remaining: 0,
        resetMs: 9000,
        retryAfterMs: 5000,
      });
      // At T0 + 10 s the first admission leaves the window (t - W < q is false).
      assert.equal((await one(l, rule, T0 + 9999)).allowed, false);
      const d = await one(l, rule, T0 + 10_000);
      assert.deepEqual(d, {
        allowed: true,
        limit: 5,
        remaining: 0,
        resetMs: 10_000,
        retryAfterMs: 0,
      });
      const denied = await one(l, rule, T0 + 10_000);
      assert.equal(denied.retryAfterMs, 1000);
      await l.close();
    });

    it('above 1000 the counter mode still admits exactly the limit at once', async () => {
      const l = s.fresh();
      const rule: Rule = { kind: 'window', key: 'big', limit: 1500, windowMs: MIN };
      const { admitted, denial } = await exhaust(l, rule, T0);
      assert.equal(admitted, 1500);
      // All 1500 sit in the bucket ending at T0 (T0 is a multiple of 60 ms).
      assert.equal(denial.retryAfterMs, MIN);
      assert.equal((await one(l, rule, T0 + MIN - 1)).allowed, false);
      assert.equal((await one(l, rule, T0 + MIN)).allowed, true);
      await l.close();
    });
  });

  describe('sum (rolling usage)', () => {
    it('admission adds nothing; denied once the added sum reaches the limit', async () => {
      const l = s.fresh();
      const rule: Rule = { kind: 'sum', key: 'tpm', limit: 1000, windowMs: MIN };
      for (let i = 0; i < 20; i++) {
        assert.deepEqual(await one(l, rule, T0), {
          allowed: true,
          limit: 1000,
          remaining: 1000,
          resetMs: 0,
          retryAfterMs: 0,
        });
      }
      await l.add('tpm', 400, MIN, T0);
      assert.equal((await one(l, rule, T0 + 1)).remaining, 600);
      await l.add('tpm', 600, MIN, T0 + 30_000);
      assert.deepEqual(await one(l, rule, T0 + 30_000), {
        allowed: false,
        limit: 1000,
        remaining: 0,
        resetMs: MIN,
        retryAfterMs: 30_000,
      });
      const after = await one(l, rule, T0 + MIN);
      assert.deepEqual(after, {
        allowed: true,
        limit: 1000,
        remaining: 400,
        resetMs: 30_000,
        retryAfterMs: 0,
      });
      await l.close();
    });

    it('add(0) is a no-op and fractional amounts round up', async () => {
      const l = s.fresh();
      const rule: Rule = { kind: 'sum', key: 'frac', limit: 10, windowMs: MIN };
      await l.add('frac', 0, MIN, T0);
      assert.deepEqual(await one(l, rule, T0), {
        allowed: true,
        limit: 10,
        remaining: 10,
        resetMs: 0,
        retryAfterMs: 0,
      });
      await l.add('frac', 2.1, MIN, T0);
      assert.equal((await one(l, rule, T0)).remaining, 7);
      await l.close();
    });
  });

  describe('retryAfterMs is exact', () => {
    // Each case brings the rule to a denial at `t`; then t + retry - 1 must
    // deny and t + retry admit.
    const CASES: ReadonlyArray<{
      name: string;
      rule: Rule;
      setup: (l: LimiterBackend, rule: Rule) => Promise<number>;
    }> = [
      ...TIERS.map(({ tier, limit, burst }) => ({
        name: `burst ${tier}`,
        rule: { kind: 'burst', key: 'r', limit, burst, windowMs: MIN } as Rule,
        setup: async (l: LimiterBackend, rule: Rule) => (await exhaust(l, rule, T0), T0),
      })),
      {
        name: 'burst with a fractional interval (7 per minute, T = 8571.43 ms), mid-interval',
        rule: { kind: 'burst', key: 'r', limit: 7, burst: 3, windowMs: MIN },
        setup: async (l, rule) => {
          await exhaust(l, rule, T0);
          await exhaust(l, rule, T0 + 12_345);
          return T0 + 12_345;
        },
      },
      {
        name: 'burst without burst capacity',
        rule: { kind: 'burst', key: 'r', limit: 3, burst: 0, windowMs: 1000 },
        setup: async (l, rule) => (await exhaust(l, rule, T0 + 1), T0 + 1),
      },
      {
        name: 'window, staggered admissions',
        rule: { kind: 'window', key: 'r', limit: 3, windowMs: 1001 },
        setup: async (l, rule) => {
          for (const dt of [0, 7, 500]) assert.equal((await one(l, rule, T0 + dt)).allowed, true);
          return T0 + 600;
        },
      },
      {
        name: 'window, limit 1',
        rule: { kind: 'window', key: 'r', limit: 1, windowMs: MIN },
        setup: async (l, rule) => (await one(l, rule, T0 + 3), T0 + 4),
      },
      {
        name: 'sum, several buckets must expire',
        rule: { kind: 'sum', key: 'r', limit: 100, windowMs: MIN },
        setup: async (l) => {
          await l.add('r', 30, MIN, T0);
          await l.add('r', 30, MIN, T0 + 1000);
          await l.add('r', 50, MIN, T0 + 2000);
          await l.add('r', 45, MIN, T0 + 3000);
          return T0 + 4000;
        },
      },
    ];
    for (const c of CASES) {
      it(c.name, async () => {
        const l = s.fresh();
        const t = await c.setup(l, c.rule);
        const denial = await one(l, c.rule, t);
        assert.equal(denial.allowed, false);
        assert.ok(denial.retryAfterMs > 0);
        assert.equal((await one(l, c.rule, t + denial.retryAfterMs - 1)).allowed, false);
        assert.equal((await one(l, c.rule, t + denial.retryAfterMs)).allowed, true);
        await l.close();
      });
    }

    it('holds for random rules and traffic (property)', async () => {
      const arbRule: fc.Arbitrary<Rule> = fc.oneof(
        fc.record({
          kind: fc.constant('burst' as const),
          key: fc.constant('p'),
          limit: fc.integer({ min: 1, max: 100 }),
          burst: fc.integer({ min: 0, max: 10 }),
          // Redis expires keys by its real clock: keep TTLs (>= windowMs / limit)
          // far above the real time between two steps of a fake-time test.
          windowMs: fc.integer({ min: 10_000, max: 120_000 }),
        }),
        fc.record({
          kind: fc.constant('window' as const),
          key: fc.constant('p'),
          limit: fc.integer({ min: 1, max: 8 }),
          windowMs: fc.integer({ min: 1000, max: 120_000 }),
        }),
      );
      await fc.assert(
        fc.asyncProperty(
          arbRule,
          fc.array(fc.integer({ min: 0, max: 5000 }), { minLength: 1, maxLength: 25 }),
          async (rule, gaps) => {
            const l = s.fresh();
            let t = T0 + 17;
            for (const gap of gaps) {
              t += gap;
              const d = await one(l, rule, t);
              if (d.allowed) continue;
              assert.ok(d.retryAfterMs > 0);
              assert.equal((await one(l, rule, t + d.retryAfterMs - 1)).allowed, false);
              t += d.retryAfterMs;
              assert.equal((await one(l, rule, t)).allowed, true);
            }
            await l.close();
          },
        ),
        { numRuns: s.runs },
      );
    });
  });

  describe('all or nothing', () => {
    const denyingSetups: ReadonlyArray<{
      name: string;
      rule: Rule;
      exhaust: (l: LimiterBackend) => Promise<void>;
    }> = [
      {
        name: 'burst',
        rule: { kind: 'burst', key: 'x', limit: 10, burst: 1, windowMs: MIN },
        exhaust: async (l) => void (await exhaust(l, denyingSetups[0]!.rule, T0)),
      },
      {
        name: 'window',
        rule: { kind: 'window', key: 'x', limit: 2, windowMs: MIN },
        exhaust: async (l) => void (await exhaust(l, denyingSetups[1]!.rule, T0)),
      },
      {
        name: 'sum',
        rule: { kind: 'sum', key: 'x', limit: 10, windowMs: MIN },
        exhaust: async (l) => l.add('x', 10, MIN, T0),
      },
    ];
    for (const deny of denyingSetups) {
      it(`a denial by '${deny.name}' counts nothing on the other rules`, async () => {
        const l = s.fresh();
        await deny.exhaust(l);
        const others: Rule[] = [
          { kind: 'burst', key: 'o', limit: 60, burst: 2, windowMs: MIN },
          { kind: 'window', key: 'o', limit: 3, windowMs: MIN },
          { kind: 'sum', key: 'o', limit: 5, windowMs: MIN },
        ];
        for (let i = 0; i < 5; i++) {
          const ds = await l.acquire([others[0]!, deny.rule, others[1]!, others[2]!], T0 + 1);
          assert.deepEqual(
            ds.map((d) => d.allowed),
            [true, false, true, true],
          );
          // Allowed rules report their state without this (uncounted) request.
          assert.equal(ds[0]!.remaining, 3);
          assert.equal(ds[0]!.resetMs, 0);
          assert.equal(ds[2]!.remaining, 3);
          assert.equal(ds[2]!.resetMs, 0);
        }
        // Nothing was counted: the others are still fresh.
        const fresh = await l.acquire(others, T0 + 1);
        assert.deepEqual(
          fresh.map((d) => [d.allowed, d.remaining]),
          [
            [true, 2],
            [true, 2],
            [true, 5],
          ],
        );
        await l.close();
      });
    }

    it('waiting the binding retryAfterMs admits every rule', async () => {
      const l = s.fresh();
      const rules: Rule[] = [
        { kind: 'burst', key: 'b', limit: 6, burst: 0, windowMs: MIN },
        { kind: 'window', key: 'w', limit: 1, windowMs: 30_000 },
      ];
      assert.ok((await l.acquire(rules, T0)).every((d) => d.allowed));
      const ds = await l.acquire(rules, T0 + 1);
      const bind = bindingDecision(ds);
      assert.ok(bind && !bind.allowed);
      assert.equal(bind.retryAfterMs, 29_999);
      assert.equal(bind, ds[1]);
      assert.ok((await l.acquire(rules, T0 + 1 + bind.retryAfterMs)).every((d) => d.allowed));
      await l.close();
    });

    it('no rules: nothing to decide', async () => {
      const l = s.fresh();
      assert.deepEqual(await l.acquire([], T0), []);
      await l.close();
    });
  });

  describe('keys', () => {
    it('are independent, across keys and across kinds with the same key', async () => {
      const l = s.fresh();
      const a: Rule = { kind: 'window', key: 'a', limit: 1, windowMs: MIN };
      await exhaust(l, a, T0);
      assert.equal((await one(l, { ...a, key: 'b' }, T0)).allowed, true);
      assert.equal(
        (await one(l, { kind: 'burst', key: 'a', limit: 1, burst: 0, windowMs: MIN }, T0)).allowed,
        true,
      );
      await l.add('a', 5, MIN, T0);
      assert.equal(
        (await one(l, { kind: 'sum', key: 'a', limit: 6, windowMs: MIN }, T0)).remaining,
        1,
      );
      assert.equal((await one(l, a, T0)).allowed, false);
      await l.close();
    });

    it('a clock stepping back never admits more', async () => {
      const l = s.fresh();
      const rules: Rule[] = [
        { kind: 'burst', key: 'c', limit: 60, burst: 0, windowMs: MIN },
        { kind: 'window', key: 'c', limit: 2, windowMs: MIN },
      ];
      assert.ok((await l.acquire(rules, T0 + 5000)).every((d) => d.allowed));
      // 5 s earlier the burst rule sees its TAT 6 s away instead of 1 s.
      const back = await l.acquire(rules, T0);
      assert.deepEqual(
        back.map((d) => [d.allowed, d.retryAfterMs]),
        [
          [false, 6000],
          [true, 0],
        ],
      );
      assert.ok((await l.acquire(rules, T0 + 6000)).every((d) => d.allowed));
      // The window log still holds both admissions and stays sorted.
      const w = await l.acquire([rules[1]!], T0 + 5500);
      assert.deepEqual([w[0]!.allowed, w[0]!.retryAfterMs], [false, MIN - 500]);
      await l.close();
    });

    it('may hold any characters', async () => {
      const l = s.fresh();
      const rule: Rule = { kind: 'window', key: 'proj:ü/{x}*?:n', limit: 1, windowMs: MIN };
      assert.equal((await one(l, rule, T0)).allowed, true);
      assert.equal((await one(l, rule, T0)).allowed, false);
      await l.close();
    });
  });

  describe('release', () => {
    /** The bucket an admission was counted in, as the decision reports it. */
    const bucketOf = (d: Decision, t: number, windowMs: number) => t + d.resetMs - windowMs;

    it('gives back the admission it names, which then no longer counts', async () => {
      const l = s.fresh();
      const rule: Rule = { kind: 'window', key: 'r', limit: 3, windowMs: MIN };
      const first = await one(l, rule, T0);
      const second = await one(l, rule, T0 + 1000);
      await one(l, rule, T0 + 1000);
      assert.equal((await one(l, rule, T0 + 2000)).allowed, false);
      // The second and third share a bucket: one of the two goes back.
      await l.release('r', MIN, bucketOf(second, T0 + 1000, MIN), T0 + 2000);
      const again = await one(l, rule, T0 + 2000);
      assert.deepEqual([again.allowed, again.remaining], [true, 0]);
      assert.equal((await one(l, rule, T0 + 2000)).allowed, false);
      // Giving back the first: the oldest left is the one at T0 + 1000.
      await l.release('r', MIN, bucketOf(first, T0, MIN), T0 + 3000);
      const denied = await exhaust(l, rule, T0 + 3000);
      assert.equal(denied.admitted, 1);
      assert.equal(denied.denial.retryAfterMs, MIN - 2000);
      await l.close();
    });

    it('of an expired, unknown or empty bucket changes nothing; the last one empties the key', async () => {
      const l = s.fresh();
      const rule: Rule = { kind: 'window', key: 'e', limit: 2, windowMs: MIN };
      const d = await one(l, rule, T0);
      await l.release('e', MIN, T0 + 5, T0 + 10); // no admission there
      await l.release('nobody', MIN, T0, T0 + 10);
      assert.equal((await one(l, rule, T0 + 10)).remaining, 0);
      await l.release('e', MIN, bucketOf(d, T0, MIN), T0 + MIN); // expired already
      await l.release('e', MIN, T0 + 10, T0 + 20);
      await l.release('e', MIN, T0 + 10, T0 + 20); // a second time: nothing left there
      const after = await one(l, rule, T0 + MIN);
      assert.deepEqual([after.allowed, after.remaining, after.resetMs], [true, 1, MIN]);
      // A sum of the same key is another rule: untouched.
      await l.add('e', 5, MIN, T0);
      await l.release('e', MIN, T0, T0 + 1);
      assert.equal(
        (await one(l, { kind: 'sum', key: 'e', limit: 9, windowMs: MIN }, T0 + 1)).remaining,
        4,
      );
      await l.close();
    });

    it('rejects a bucket that is not a whole ms', async () => {
      const l = s.fresh();
      await assert.rejects(async () => l.release('x', MIN, 1.5, T0), RangeError);
      await assert.rejects(async () => l.release('', MIN, T0, T0), RangeError);
      await l.close();
    });
  });

  describe('validation', () => {
    const BAD: ReadonlyArray<[string, Rule[]]> = [
      ['limit 0', [{ kind: 'window', key: 'k', limit: 0, windowMs: MIN }]],
      ['fractional limit', [{ kind: 'window', key: 'k', limit: 1.5, windowMs: MIN }]],
      ['negative burst', [{ kind: 'burst', key: 'k', limit: 1, burst: -1, windowMs: MIN }]],
      ['windowMs 0', [{ kind: 'sum', key: 'k', limit: 1, windowMs: 0 }]],
      ['empty key', [{ kind: 'window', key: '', limit: 1, windowMs: MIN }]],
      [
        'one (kind, key) twice',
        [
          { kind: 'window', key: 'k', limit: 1, windowMs: MIN },
          { kind: 'window', key: 'k', limit: 2, windowMs: MIN },
        ],
      ],
    ];
    for (const [name, rules] of BAD) {
      it(`rejects ${name}`, async () => {
        const l = s.fresh();
        await assert.rejects(async () => l.acquire(rules, T0), RangeError);
        await l.close();
      });
    }
    it('rejects a non-finite time and a negative amount', async () => {
      const l = s.fresh();
      const rule: Rule = { kind: 'window', key: 'k', limit: 1, windowMs: MIN };
      await assert.rejects(async () => l.acquire([rule], Number.NaN), RangeError);
      await assert.rejects(async () => l.add('k', -1, MIN, T0), RangeError);
      await l.close();
    });
  });

  describe('accuracy under steady overload (10x the rate, 12 windows)', () => {
    it('burst: every sliding window <= limit + burst; the first holds limit + burst (±1), later ones limit (±1)', async () => {
      const l = s.fresh();
      const limit = 64;
      const burst = 32;
      const rule: Rule = { kind: 'burst', key: 'acc', limit, burst, windowMs: MIN };
      const step = Math.floor(MIN / (10 * limit)); // 93 ms
      const times = await overload(l, [rule], step, 12 * MIN);
      const all = windowCounts(times, range(T0, T0 + 11 * MIN, step), MIN);
      assert.ok(Math.max(...all) <= limit + burst, `max ${Math.max(...all)}`);
      const [first] = windowCounts(times, [T0], MIN);
      assert.ok(first! >= limit + burst - 1 && first! <= limit + burst, `first ${first}`);
      const steady = windowCounts(times, range(T0 + MIN, T0 + 11 * MIN, step), MIN);
      assert.ok(Math.min(...steady) >= limit - 1, `min ${Math.min(...steady)}`);
      assert.ok(Math.max(...steady) <= limit + 1, `max ${Math.max(...steady)}`);
      const [ten] = windowCounts(times, [T0 + MIN], 10 * MIN);
      assert.ok(Math.abs(ten! - 10 * limit) <= 1, `10 windows ${ten}`);
      await l.close();
    });

    it('window: every sliding window holds limit (−1 at most), throughput limit per window', async () => {
      const l = s.fresh();
      const limit = 60;
      const rule: Rule = { kind: 'window', key: 'acc', limit, windowMs: MIN };
      const step = Math.floor(MIN / (10 * limit)) + 7; // 107 ms: not a divisor of the window
      const times = await overload(l, [rule], step, 12 * MIN);
      const all = windowCounts(times, range(T0, T0 + 11 * MIN, step), MIN);
      assert.ok(Math.max(...all) <= limit, `max ${Math.max(...all)}`);
      assert.ok(Math.min(...all) >= limit - 1, `min ${Math.min(...all)}`);
      const [ten] = windowCounts(times, [T0], 10 * MIN);
      assert.ok(Math.abs(ten! - 10 * limit) <= 1, `10 windows ${ten}`);
      await l.close();
    });

    it('sum: usage added per admission keeps every sliding window at limit / amount (±1)', async () => {
      const l = s.fresh();
      const amount = 100;
      const limit = 6000; // 60 requests' worth a minute
      const rule: Rule = { kind: 'sum', key: 'acc', limit, windowMs: MIN };
      const step = 100;
      const times = await overload(l, [rule], step, 12 * MIN, (t) => l.add('acc', amount, MIN, t));
      const per = limit / amount;
      const all = windowCounts(times, range(T0, T0 + 11 * MIN, step), MIN);
      assert.ok(Math.max(...all) <= per, `max ${Math.max(...all)}`);
      assert.ok(Math.min(...all) >= per - 1, `min ${Math.min(...all)}`);
      const [ten] = windowCounts(times, [T0], 10 * MIN);
      assert.ok(Math.abs(ten! - 10 * per) <= 1, `10 windows ${ten}`);
      await l.close();
    });
  });
}

describe('MemoryLimiter contract', () => {
  contractSuite({ name: 'memory', fresh: () => new MemoryLimiter(), runs: 300 });
});

const REDIS_URL = process.env.TEST_REDIS_URL;
if (!REDIS_URL && process.env.CI === 'true') {
  test('RedisLimiter contract', () => assert.fail('TEST_REDIS_URL must be set when CI=true'));
}

describe('RedisLimiter contract', { skip: REDIS_URL ? false : 'TEST_REDIS_URL not set' }, () => {
  // One prefix per run, one sub-prefix per limiter: tests never share keys,
  // and cleanup deletes everything under the run's prefix.
  const runPrefix = `swy:test:rl:${process.pid}-${randomBytes(4).toString('hex')}:`;
  let seq = 0;
  let redis: Redis;
  let redis2: Redis;
  const nextPrefix = (): string => `${runPrefix}${seq++}:`;

  before(() => {
    redis = connectRedis(REDIS_URL!);
    redis2 = connectRedis(REDIS_URL!);
  });
  after(async () => {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${runPrefix}*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) await redis.del(...keys);
    } while (cursor !== '0');
    await redis.quit();
    await redis2.quit();
  });

  contractSuite({ name: 'redis', fresh: () => new RedisLimiter(redis, nextPrefix()), runs: 40 });

  describe('Redis only', () => {
    it('two instances on two connections hammering one key never admit more than the limit', async () => {
      const prefix = nextPrefix();
      const a = new RedisLimiter(redis, prefix);
      const b = new RedisLimiter(redis2, prefix);
      const window: Rule = { kind: 'window', key: 'hot', limit: 50, windowMs: MIN };
      const burst: Rule = { kind: 'burst', key: 'hot', limit: 64, burst: 32, windowMs: MIN };
      const fire = (rules: Rule[], n: number): Promise<Decision[][]> =>
        Promise.all(
          Array.from({ length: n }, (_, i) => (i % 2 ? a : b).acquire(rules, T0 + (i % 3))),
        );
      const w = await fire([window], 400);
      assert.equal(w.filter((ds) => ds[0]!.allowed).length, 50);
      const g = await fire([burst], 400);
      assert.equal(g.filter((ds) => ds[0]!.allowed).length, 33);
      // All or nothing under contention: the tighter rule bounds both.
      const both: Rule[] = [
        { kind: 'window', key: 'both-a', limit: 40, windowMs: MIN },
        { kind: 'window', key: 'both-b', limit: 25, windowMs: MIN },
      ];
      const m = await fire(both, 300);
      assert.equal(m.filter((ds) => ds.every((d) => d.allowed)).length, 25);
      const [ra] = await a.acquire([both[0]!], T0 + 3);
      assert.equal(ra!.remaining, 40 - 25 - 1);
    });

    it('every key it writes carries a TTL no longer than its state lives', async () => {
      const prefix = nextPrefix();
      const l = new RedisLimiter(redis, prefix);
      const ds = await l.acquire(
        [
          { kind: 'burst', key: 'k', limit: 64, burst: 32, windowMs: MIN },
          { kind: 'window', key: 'k', limit: 60, windowMs: MIN },
        ],
        Date.now(),
      );
      await l.add('k', 10, MIN, Date.now());
      const keys = await redis.keys(`${prefix}*`);
      assert.equal(keys.length, 5);
      for (const k of keys) {
        const ttl = await redis.pttl(k);
        assert.ok(ttl > 0 && ttl <= MIN + 60, `${k} ttl ${ttl}`);
      }
      assert.ok((await redis.pttl(`${prefix}b:k`)) <= ds[0]!.resetMs);
    });

    it('recovers a window total lost to eviction from the list', async () => {
      const prefix = nextPrefix();
      const l = new RedisLimiter(redis, prefix);
      const rule: Rule = { kind: 'window', key: 'k', limit: 3, windowMs: MIN };
      await one(l, rule, T0);
      await one(l, rule, T0 + 1);
      await redis.del(`${prefix}wt:k`);
      assert.equal((await one(l, rule, T0 + 2)).remaining, 0);
      assert.equal((await one(l, rule, T0 + 3)).allowed, false);
      assert.ok((await redis.pttl(`${prefix}wt:k`)) > 0);
    });

    it('reloads the script after SCRIPT FLUSH (EVALSHA falls back to EVAL)', async () => {
      const l = new RedisLimiter(redis, nextPrefix());
      const rule: Rule = { kind: 'window', key: 'k', limit: 3, windowMs: MIN };
      await one(l, rule, T0);
      await redis.script('FLUSH');
      assert.equal((await one(l, rule, T0)).remaining, 1);
    });

    it('decides exactly as the memory backend (differential property)', async () => {
      const op = fc.oneof(
        fc.record({ type: fc.constant('acquire' as const), dt: fc.integer({ min: 0, max: 4000 }) }),
        fc.record({
          type: fc.constant('add' as const),
          dt: fc.integer({ min: 0, max: 4000 }),
          amount: fc.integer({ min: 0, max: 400 }),
        }),
        // Gives back one of the window rule's admissions (the back-th newest).
        fc.record({
          type: fc.constant('release' as const),
          dt: fc.integer({ min: 0, max: 4000 }),
          back: fc.integer({ min: 0, max: 6 }),
        }),
      );
      await fc.assert(
        fc.asyncProperty(
          fc.integer({ min: 1, max: 20 }),
          fc.integer({ min: 0, max: 5 }),
          fc.integer({ min: 1, max: 6 }),
          fc.integer({ min: 5000, max: 30_000 }),
          fc.array(op, { minLength: 1, maxLength: 40 }),
          async (limit, burst, wlimit, windowMs, ops) => {
            const rules: Rule[] = [
              { kind: 'burst', key: 'd', limit, burst, windowMs },
              { kind: 'window', key: 'd', limit: wlimit, windowMs },
              { kind: 'sum', key: 'd', limit: 1000, windowMs },
            ];
            const mem = new MemoryLimiter();
            const red = new RedisLimiter(redis, nextPrefix());
            let t = T0 + 11;
            const admitted: number[] = [];
            for (const o of ops) {
              t += o.dt;
              if (o.type === 'add') {
                mem.add('d', o.amount, windowMs, t);
                await red.add('d', o.amount, windowMs, t);
              } else if (o.type === 'release') {
                const at = admitted[admitted.length - 1 - o.back];
                if (at === undefined) continue;
                mem.release('d', windowMs, at, t);
                await red.release('d', windowMs, at, t);
              } else {
                const ds = await red.acquire(rules, t);
                assert.deepEqual(ds, mem.acquire(rules, t));
                if (ds.every((d) => d.allowed)) admitted.push(t + ds[1]!.resetMs - windowMs);
              }
            }
          },
        ),
        { numRuns: 100 },
      );
    });
  });
});
