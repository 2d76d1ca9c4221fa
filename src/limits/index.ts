/**
 * Rate limits and quotas (spec: Limits; Authentication, per-key quota).
 *
 * A request is checked against a list of rules in one `acquire`, all or
 * nothing: it is counted against every rule only if every rule admits it, so
 * a request refused by the key quota does not use up tier capacity. Two
 * backends implement the same contract: `MemoryLimiter` (one process) and
 * `RedisLimiter` (one Lua script per acquire, so N router instances share one
 * limit exactly). Time is passed in from the injected clock, in whole
 * milliseconds (fractions are dropped).
 *
 * Rule kinds and how the service uses them:
 * - 'burst': tier limits, per endpoint, e.g. free is
 *   { kind: 'burst', limit: 64, burst: 32, windowMs: 60_000 }; cpu 128 + 64,
 *   gpu 256 + 128. self_hosted is unlimited: the caller passes no rule.
 * - 'window': the per-key quota (quotaRequests per quotaWindow, default
 *   60 / 60 s), endpoint max_requests_per_minute, and the per-project
 *   management limit (60 / 60 s).
 * - 'sum': endpoint max_tokens_per_minute; usage is added after the response.
 *
 * 'burst' = GCRA. Emission interval T = windowMs / limit, tolerance
 * tau = burst * T. Per key a theoretical arrival time TAT (initially <= now).
 * A request at t conforms iff TAT - t <= tau; admitting it sets
 * TAT = max(TAT, t) + T. Bounds:
 * - Any sliding window holds at most limit + burst admissions, exactly. Take
 *   n admissions t1 <= ... <= tn with tn - t1 < windowMs. After the first,
 *   TAT >= t1 + T, and each later admission raises it by at least T, so
 *   before the n-th TAT >= t1 + (n - 1)T. The n-th conformed:
 *   t1 + (n - 1)T - tn <= tau, so (n - 1)T <= tau + (tn - t1)
 *   < burst * T + limit * T, hence n <= limit + burst. The bound is reached:
 *   burst + 1 at once, then one every T, puts limit + burst in the first
 *   window.
 * - After a quiet period (TAT <= t), k requests at one instant conform while
 *   (k - 1)T <= tau: burst + 1 at once.
 * - Sustained rate: under overload admissions are exactly T apart, i.e. limit
 *   per window; over any span H at most H / T + burst + 1 are admitted.
 * This is the spec's "sliding window with burst capacity": no sliding window
 * ever holds more than limit + burst, sustained throughput is limit per
 * window, and the burst refills at the tier rate. All of it runs in integer
 * ticks of 1 / limit ms (gcra.ts), so retryAfterMs is exact to the ms.
 * Decision: limit = burst + 1 (what a full bucket admits at once);
 * remaining = requests that conform now (burst + 1 from a full bucket, so
 * 0 <= remaining <= limit); resetMs = until TAT <= now, i.e. until the
 * bucket is full again; retryAfterMs = until the next request conforms.
 *
 * 'window' = sliding-window log. Per key, the admission times; a request at t
 * is admitted iff fewer than `limit` admissions lie in (t - windowMs, t].
 * Exact: no window of windowMs ever holds more than `limit` (the check at the
 * last admission of any such window sees all the others), and a request is
 * refused only when `limit` admissions really lie in the window. Memory is
 * at most `limit` entries per key (same-ms admissions share one). Above
 * MAX_LOG_ENTRIES (1000) the log becomes a sliding-window counter with
 * buckets of g = ceil(windowMs / 1000) ms; each admission counts until the
 * end of its bucket + windowMs. Error bound: never more than `limit` in any
 * window of windowMs (still exact as an upper bound); a request is refused
 * only if `limit` admissions lie in the last windowMs + g, so throughput is
 * at least limit * windowMs / (windowMs + g), within 0.1% of the limit.
 * Decision: remaining = limit - counted; resetMs = until the newest counted
 * admission expires; retryAfterMs = until enough of the oldest expire.
 *
 * 'sum' = bucketed sliding log of (time, amount), buckets of
 * g = ceil(windowMs / 1000) ms (60 ms for a minute); at most ~1000 entries
 * per key however many requests add to it. The sum seen at t covers every
 * amount added in (t - windowMs, t] and possibly some added up to g earlier:
 * the window is between windowMs and windowMs + g long (0.1% precision),
 * never shorter. A request is admitted iff that sum < limit. Admission adds
 * nothing, so the amount added within a window can exceed the limit by what
 * requests already admitted add later (at most their usage each); this is
 * inherent in "admit, then add usage". Decision: limit and remaining are in
 * the sum's units (tokens).
 *
 * Clocks: each backend keeps a log's buckets sorted even if a clock steps
 * back, which only makes limits stricter meanwhile. With Redis, instances
 * pass their own clocks: keep them NTP-synchronised; a skew of d ms shifts
 * one instance's view of the window by d ms.
 *
 * Response headers report `bindingDecision(decisions)`: the denial with the
 * longest retryAfterMs, else the admission with the smallest remaining/limit.
 */
export type { Decision, LimiterBackend, Rule, RuleKind } from './types.js';
export { bindingDecision } from './binding.js';
export { MemoryLimiter, type MemoryLimiterOptions } from './memory.js';
export { RedisLimiter } from './redis.js';
export { validateRule, validateRules } from './rules.js';
export {
  gcraAllows,
  gcraDebt,
  gcraDecision,
  gcraExpiresAt,
  gcraNext,
  type GcraState,
} from './gcra.js';
export {
  MAX_LOG_ENTRIES,
  SlidingLog,
  bucketAt,
  sumGrainMs,
  windowDecision,
  windowGrainMs,
} from './log.js';
