/**
 * Applying the limits to requests (the algorithms are in src/limits).
 *
 * Inference (chat completions), all-or-nothing in one acquire:
 * - tier limit per (project, tier): a project's endpoints on one tier share its
 *   tier budget, so creating endpoints never multiplies it; self_hosted has none;
 * - the key's quota: `quotaRequests` per rolling `quotaWindow` seconds;
 * - the endpoint's `max_requests_per_minute` (rolling 60 s);
 * - the endpoint's `max_tokens_per_minute` (rolling 60 s sum of prompt +
 *   completion tokens, added when a request finishes).
 * Headers report the binding rule (the one with the fewest admissions left,
 * or on refusal the one freeing up last): `RateLimit-Limit`,
 * `RateLimit-Remaining`, `RateLimit-Reset` (seconds) and their `X-` twins, and
 * `X-RateLimit-Warning: approaching_limit` when remaining < 20% of the limit.
 * One reading for every rule (docs/LIMITS.md, "Headers and refusals"): Limit is
 * the most Remaining can be (for the tier's GCRA: burst + 1, what a full bucket
 * admits at once), Remaining is how many would be admitted now, Reset is the
 * seconds until Remaining is back to Limit; on a refusal Remaining is 0 and
 * Reset is the seconds until the next admission, the same value as
 * `Retry-After` (as the IETF RateLimit draft asks). The tokens-per-minute rule
 * (in tokens) is shown only when it refuses. A refusal is 429
 * `rate_limit_exceeded` with `Retry-After` and, inside the error object,
 * `retry_after` and `retry_strategy`.
 *
 * Management routes (batch, conversations, stored chat completions, files, uploads,
 * webhooks, SLOs): one fixed 60 per rolling minute per project; inference never
 * counts here. Every other key-authenticated route counts the key's quota; the
 * `X-RateLimit-*` headers there follow the binding one of the quota and the
 * route's management limit, if it has one.
 *
 * If the limiter backend (Redis) fails, limits fail open by default (requests
 * flow, a warning is logged) or closed with SWITCHYARD_LIMITS_FAIL=closed (503).
 */
import type { FastifyReply } from 'fastify';
import { ServiceError } from '../errors/index.js';
import type { Decision, LimiterBackend, Rule } from '../limits/index.js';
import type { Clock } from '../runtime/clock.js';
import type { Logger } from '../runtime/logger.js';
import type { Metrics } from '../runtime/metrics.js';

declare module 'fastify' {
  interface FastifyRequest {
    /**
     * The key's quota as the auth layer counted it (http/auth.ts), so that a route
     * limit counted next (`Limits.management`) reports whichever of the two binds.
     */
    keyQuota?: Decision;
    /**
     * The auth layer left the key's quota to the route's management limit, which
     * counts both in one acquire after the route's own checks (KeyCheck
     * `quotaWithManagement`).
     */
    keyQuotaDue?: boolean;
  }
}

export const MANAGEMENT_LIMIT = 60;
const MINUTE = 60_000;
const WARNING_RATIO = 0.2;

export interface TierLimit {
  id: string;
  requestsPerMinute: number | null;
  burst: number | null;
}

export interface LimitSubject {
  projectId: string;
  keyId: string;
  quotaRequests: number;
  quotaWindow: number;
  endpointId: string;
  maxRequestsPerMinute: number;
  maxTokensPerMinute: number;
  tier: TierLimit;
}

export type RateHeaders = Record<string, string>;

/**
 * The rule the headers report, among the first `n` decisions (all by default):
 * among refusals the one that frees up last; otherwise the one with the fewest
 * admissions left (the first that will bite), the smaller limit breaking ties.
 */
export function binding(ds: readonly Decision[], n = ds.length): Decision | undefined {
  let best: Decision | undefined;
  for (let i = 0; i < n; i++) {
    const d = ds[i]!;
    if (!best) best = d;
    else if (!d.allowed && (best.allowed || d.retryAfterMs > best.retryAfterMs)) best = d;
    else if (
      d.allowed &&
      best.allowed &&
      (d.remaining < best.remaining || (d.remaining === best.remaining && d.limit < best.limit))
    ) {
      best = d;
    }
  }
  return best;
}

/** Whole seconds until a refused request would be admitted: the 429's `Retry-After`. */
function retryAfterSeconds(d: Decision): number {
  return Math.max(1, Math.ceil(d.retryAfterMs / 1000));
}

/**
 * The reset header: seconds until Remaining is back to Limit (the window emptied,
 * the bucket full again); on a refusal, until the next admission, which is
 * exactly the `Retry-After` sent with it.
 */
function resetSeconds(d: Decision): number {
  return d.allowed ? Math.ceil(d.resetMs / 1000) : retryAfterSeconds(d);
}

export function rateHeaders(d: Decision): RateHeaders {
  const limit = String(d.limit);
  const remaining = String(Math.max(0, Math.floor(d.remaining)));
  const reset = String(resetSeconds(d));
  const h: RateHeaders = {
    'RateLimit-Limit': limit,
    'RateLimit-Remaining': remaining,
    'RateLimit-Reset': reset,
    'X-RateLimit-Limit': limit,
    'X-RateLimit-Remaining': remaining,
    'X-RateLimit-Reset': reset,
  };
  if (d.remaining < d.limit * WARNING_RATIO) h['X-RateLimit-Warning'] = 'approaching_limit';
  return h;
}

/**
 * The headers outside inference (management routes and the key's quota on every
 * other route): the spec lists only the `X-` triple there. Same reading as
 * `rateHeaders`.
 */
export function managementHeaders(d: Decision): RateHeaders {
  return {
    'X-RateLimit-Limit': String(d.limit),
    'X-RateLimit-Remaining': String(Math.max(0, Math.floor(d.remaining))),
    'X-RateLimit-Reset': String(resetSeconds(d)),
  };
}

/** The 429 for refused decision `d`; `headers` must describe `d` (their reset is its Retry-After). */
export function rateLimited(d: Decision, headers: RateHeaders, message: string): ServiceError {
  return tooManyRequests('rate_limit_exceeded', retryAfterSeconds(d), message, headers);
}

/**
 * A 429 as the spec's envelope requires every 429 to be: `Retry-After` (whole
 * seconds, at least 1) and, inside the error object, the same `retry_after` and a
 * `retry_strategy`. The rate limits and the inference path's capacity errors both
 * build theirs here so the two cannot drift apart.
 */
export function tooManyRequests(
  code: 'rate_limit_exceeded' | 'capacity_exceeded',
  retryAfterSeconds: number,
  message: string,
  headers: RateHeaders = {},
): ServiceError {
  const retryAfter = Math.max(1, Math.ceil(retryAfterSeconds));
  return new ServiceError(code, {
    message,
    headers: { ...headers, 'Retry-After': String(retryAfter) },
    extra: {
      retry_after: retryAfter,
      retry_strategy: {
        type: 'exponential_backoff',
        initial_delay_ms: retryAfter * 1000,
        // Never below the first delay: a quota window or a worker may ask for more than a minute.
        max_delay_ms: Math.max(60_000, retryAfter * 1000),
        multiplier: 2,
        jitter: true,
      },
    },
  });
}

/** A key's quota: `requests` per rolling `windowSeconds`, one window per key. */
function quotaRule(keyId: string, requests: number, windowSeconds: number): Rule {
  return { kind: 'window', key: `quota:${keyId}`, limit: requests, windowMs: windowSeconds * 1000 };
}

/** A slot under a failure limit, taken by `Limits.takeTry`. */
export interface AttemptTry {
  key: string;
  windowMs: number;
  /** The bucket the slot was counted in (what `LimiterBackend.release` takes). */
  at: number;
}

/** After a limiter failure, requests fail open or closed at once for this long. */
const LIMITER_BACKOFF_MS = 1000;

export class Limits {
  /** Until when the limiter is not asked (it just failed); epoch ms on the clock. */
  private downUntil = 0;

  constructor(
    private readonly backend: LimiterBackend,
    private readonly clock: Clock,
    private readonly logger: Logger,
    private readonly failClosed: boolean,
    private readonly metrics?: Metrics,
  ) {}

  private async acquire(rules: Rule[], scope: string): Promise<Decision[] | null> {
    // Just failed: fail the same way at once for a moment instead of making every
    // request wait out another timeout while the limiter is unreachable.
    if (this.clock.now() < this.downUntil) return this.unavailable(scope);
    try {
      const ds = await this.backend.acquire(rules, this.clock.now());
      this.metrics?.limiterDecisions.inc({
        scope,
        outcome: ds.every((d) => d.allowed) ? 'admitted' : 'refused',
      });
      return ds;
    } catch (err) {
      if (err instanceof RangeError) throw err;
      this.downUntil = this.clock.now() + LIMITER_BACKOFF_MS;
      this.logger.warn(
        { err, failClosed: this.failClosed },
        'rate limiter unavailable; failing ' + (this.failClosed ? 'closed' : 'open'),
      );
      return this.unavailable(scope);
    }
  }

  /** The limiter cannot answer: fail open (no decision) or closed (503), as configured. */
  private unavailable(scope: string): null {
    this.metrics?.limiterDecisions.inc({ scope, outcome: 'error' });
    if (this.failClosed) {
      throw new ServiceError('unavailable', {
        message: 'Rate limiting is temporarily unavailable.',
        headers: { 'Retry-After': '1' },
      });
    }
    return null;
  }

  /** Admits an inference request or throws 429; returns the headers to send. */
  async inference(s: LimitSubject): Promise<RateHeaders> {
    const rules: Rule[] = [];
    if (s.tier.requestsPerMinute !== null) {
      rules.push({
        kind: 'burst',
        key: `tier:${s.projectId}:${s.tier.id}`,
        limit: s.tier.requestsPerMinute,
        burst: s.tier.burst ?? 0,
        windowMs: MINUTE,
      });
    }
    rules.push(quotaRule(s.keyId, s.quotaRequests, s.quotaWindow));
    rules.push({
      kind: 'window',
      key: `erpm:${s.endpointId}`,
      limit: s.maxRequestsPerMinute,
      windowMs: MINUTE,
    });
    // Last, so that the request rules before it are the ones an admission reports.
    const tokenRule = rules.length;
    rules.push({
      kind: 'sum',
      key: `etpm:${s.endpointId}`,
      limit: s.maxTokensPerMinute,
      windowMs: MINUTE,
    });
    const ds = await this.acquire(rules, 'inference');
    if (!ds) return {};
    // Refused: the headers and Retry-After both describe the refusing rule that frees
    // up last, whichever it is, the tokens-per-minute rule included. Admitted: the
    // binding request rule (the tokens-per-minute rule counts tokens, not admissions,
    // so it is shown only when it refuses).
    const denied = binding(ds)!;
    if (denied.allowed) return rateHeaders(binding(ds, tokenRule)!);
    throw rateLimited(
      denied,
      rateHeaders(denied),
      denied === ds[tokenRule]
        ? 'The endpoint exceeded its tokens-per-minute limit.'
        : 'Rate limit exceeded; retry after the delay.',
    );
  }

  /**
   * The key's own quota on a route outside inference (http/auth.ts `KeyCheck`): the same
   * `quota:<key>` window the inference limits count, so both kinds of request share it.
   * Returns its decision (null when the limiter failed open), from which the caller
   * sends the headers; throws 429 `rate_limit_exceeded` with `Retry-After` past it.
   */
  async keyQuota(key: {
    id: string;
    quotaRequests: number;
    quotaWindow: number;
  }): Promise<Decision | null> {
    const ds = await this.acquire([quotaRule(key.id, key.quotaRequests, key.quotaWindow)], 'quota');
    if (!ds) return null;
    const d = ds[0]!;
    if (!d.allowed) {
      throw rateLimited(d, managementHeaders(d), "The API key's request quota is used up.");
    }
    return d;
  }

  /** Adds a finished request's tokens to its endpoint's tokens-per-minute window. */
  async addTokens(endpointId: string, tokens: number): Promise<void> {
    if (tokens <= 0) return;
    try {
      await this.backend.add(`etpm:${endpointId}`, tokens, MINUTE, this.clock.now());
    } catch (err) {
      this.logger.warn({ err }, 'rate limiter unavailable (token count dropped)');
    }
  }

  /**
   * The per-project management limit; sets headers on the reply or throws 429. The
   * key's quota binds here too: when the auth layer left it to this limit
   * (`keyQuotaDue`), both are counted in one all-or-nothing acquire, so a request
   * refused by either, or by the route's checks before this, spends neither; when
   * the auth layer already counted it (`keyQuota`), the headers report whichever
   * of the two binds.
   */
  async management(projectId: string, reply: FastifyReply): Promise<void> {
    const request = reply.request;
    const key = request.keyQuotaDue === true ? request.apiKey : undefined;
    const mgmt: Rule = {
      kind: 'window',
      key: `mgmt:${projectId}`,
      limit: MANAGEMENT_LIMIT,
      windowMs: MINUTE,
    };
    const ds = await this.acquire(
      key ? [quotaRule(key.id, key.quotaRequests, key.quotaWindow), mgmt] : [mgmt],
      'management',
    );
    if (!ds) return;
    const route = ds[ds.length - 1]!;
    const counted = key ? undefined : request.keyQuota;
    const d = binding(counted ? [counted, route] : ds)!;
    const headers = managementHeaders(d);
    if (!d.allowed) {
      throw rateLimited(
        d,
        headers,
        d === route
          ? 'The project exceeded its management API limit.'
          : "The API key's request quota is used up.",
      );
    }
    reply.headers(headers);
  }

  /**
   * A limit on failures only (two-factor codes: 5 wrong ones in 5 minutes; passwords:
   * 10 in 15): at most `limit` answers are checked and found wrong in any window,
   * however many router instances check them at once, and right answers never
   * count, so a user who signs in often is not locked out by their own answers.
   *
   * Before its answer is checked, a try takes a slot: one all-or-nothing acquire of
   * the failures so far (a 'sum') and of the slots (a 'window' holding the tries in
   * flight and the wrong ones), both under `limit`. Taken atomically (one Lua script
   * with Redis), so of the tries sent at once to any number of instances only as many
   * as the window has room for are checked. Then `tryFailed` counts a wrong answer
   * (the slot stays, as the failure's); `tryDone` gives the slot back for anything
   * else, a right answer or an error. Refusals: 429 with `Retry-After` until the
   * failures free one up; when only tries still in flight fill the window (the
   * failures are under the limit), 429 with `Retry-After: 1`, since those give their
   * slots back as soon as their answers are known (a few ms) unless they are wrong.
   *
   * Null when the limiter cannot answer and limits fail open: the answer is checked
   * uncounted (with limits failing closed, 503 instead).
   */
  async takeTry(
    key: string,
    limit: number,
    windowMs: number,
    message: string,
  ): Promise<AttemptTry | null> {
    const now = this.clock.now();
    const ds = await this.acquire(
      [
        { kind: 'sum', key, limit, windowMs },
        { kind: 'window', key, limit, windowMs },
      ],
      'other',
    );
    if (!ds) return null;
    const [failures, slots] = ds as [Decision, Decision];
    if (!failures.allowed) throw rateLimited(failures, {}, message);
    if (!slots.allowed) {
      throw tooManyRequests(
        'rate_limit_exceeded',
        1,
        'Other answers for this account are being checked; retry in a second.',
      );
    }
    // The bucket the slot went to (Decision.resetMs of an admission ends there + windowMs).
    return { key, windowMs, at: now + slots.resetMs - windowMs };
  }

  /** The try's answer was wrong: it counts as a failure (its slot stays). */
  async tryFailed(t: AttemptTry): Promise<void> {
    try {
      await this.backend.add(t.key, 1, t.windowMs, this.clock.now());
    } catch (err) {
      // The slot still counts the failure until it expires.
      this.logger.warn({ err }, 'rate limiter unavailable (a failure went uncounted)');
    }
  }

  /** The try's answer was right, or could not be checked: its slot goes back. */
  async tryDone(t: AttemptTry): Promise<void> {
    try {
      await this.backend.release(t.key, t.windowMs, t.at, this.clock.now());
    } catch (err) {
      this.logger.warn({ err }, 'rate limiter unavailable (a try was not given back)');
    }
  }

  /**
   * A named rolling-window limit (e.g. webhook test deliveries: 10 per hour). Its
   * 429 carries Retry-After and the retry fields but no RateLimit headers: those
   * describe the route's own limit (the management limit on webhook routes),
   * which the reply already carries and this must not overwrite.
   */
  async window(key: string, limit: number, windowMs: number, message: string): Promise<void> {
    const ds = await this.acquire([{ kind: 'window', key, limit, windowMs }], 'other');
    // The refusal's headers describe this window, not the route's limit the reply had.
    if (ds && !ds[0]!.allowed) throw rateLimited(ds[0]!, managementHeaders(ds[0]!), message);
  }
}
