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
 * A refusal is 429 `rate_limit_exceeded` with `Retry-After` and, inside the
 * error object, `retry_after` and `retry_strategy`.
 *
 * Management routes (batch, conversations, stored chat completions, files, uploads,
 * webhooks, SLOs): one fixed 60 per rolling minute per project; inference never
 * counts here.
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
 * The rule the headers report: among refusals the one that frees up last;
 * otherwise the one with the fewest admissions left (the first that will bite),
 * the smaller limit breaking ties.
 */
export function binding(ds: readonly Decision[]): Decision | undefined {
  let best: Decision | undefined;
  for (const d of ds) {
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

export function rateHeaders(d: Decision): RateHeaders {
  const limit = String(d.limit);
  const remaining = String(Math.max(0, Math.floor(d.remaining)));
  const reset = String(Math.ceil(d.resetMs / 1000));
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

export function rateLimited(d: Decision, headers: RateHeaders, message: string): ServiceError {
  return tooManyRequests('rate_limit_exceeded', Math.ceil(d.retryAfterMs / 1000), message, headers);
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
    const shown: number[] = [];
    if (s.tier.requestsPerMinute !== null) {
      shown.push(rules.length);
      rules.push({
        kind: 'burst',
        key: `tier:${s.projectId}:${s.tier.id}`,
        limit: s.tier.requestsPerMinute,
        burst: s.tier.burst ?? 0,
        windowMs: MINUTE,
      });
    }
    shown.push(rules.length);
    rules.push(quotaRule(s.keyId, s.quotaRequests, s.quotaWindow));
    shown.push(rules.length);
    rules.push({
      kind: 'window',
      key: `erpm:${s.endpointId}`,
      limit: s.maxRequestsPerMinute,
      windowMs: MINUTE,
    });
    const tokenRule = rules.length;
    rules.push({
      kind: 'sum',
      key: `etpm:${s.endpointId}`,
      limit: s.maxTokensPerMinute,
      windowMs: MINUTE,
    });
    const ds = await this.acquire(rules, 'inference');
    if (!ds) return {};
    const bound = binding(shown.map((i) => ds[i]!))!;
    const headers = rateHeaders(bound);
    if (ds.every((d) => d.allowed)) return headers;
    const tokens = ds[tokenRule]!;
    if (!tokens.allowed && bound.allowed) {
      throw rateLimited(tokens, headers, 'The endpoint exceeded its tokens-per-minute limit.');
    }
    const denied = binding(ds.filter((d) => !d.allowed))!;
    throw rateLimited(denied, rateHeaders(denied), 'Rate limit exceeded; retry after the delay.');
  }

  /**
   * The key's own quota on a route outside inference (http/auth.ts `KeyCheck`): the same
   * `quota:<key>` window the inference limits count, so both kinds of request share it.
   * Throws 429 `rate_limit_exceeded` with `Retry-After` past it.
   */
  async keyQuota(key: { id: string; quotaRequests: number; quotaWindow: number }): Promise<void> {
    const ds = await this.acquire([quotaRule(key.id, key.quotaRequests, key.quotaWindow)], 'quota');
    if (ds && !ds[0]!.allowed) {
      throw rateLimited(ds[0]!, rateHeaders(ds[0]!), "The API key's request quota is used up.");
    }
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

  /** The per-project management limit; sets headers on the reply or throws 429. */
  async management(projectId: string, reply: FastifyReply): Promise<void> {
    const ds = await this.acquire(
      [{ kind: 'window', key: `mgmt:${projectId}`, limit: MANAGEMENT_LIMIT, windowMs: MINUTE }],
      'management',
    );
    if (!ds) return;
    const d = ds[0]!;
    const all = rateHeaders(d);
    // The spec lists only the X- headers for the management limit.
    const headers: RateHeaders = {
      'X-RateLimit-Limit': all['X-RateLimit-Limit']!,
      'X-RateLimit-Remaining': all['X-RateLimit-Remaining']!,
      'X-RateLimit-Reset': all['X-RateLimit-Reset']!,
    };
    if (!d.allowed) throw rateLimited(d, headers, 'The project exceeded its management API limit.');
    reply.headers(headers);
  }

  /**
   * A limit on failures only (e.g. two-factor codes: 5 wrong ones in 5 minutes):
   * `checkFailures` refuses (429) once `limit` failures are in the window, without
   * counting anything; `addFailure` counts one. Successes never count, so a user
   * who signs in often is not locked out by their own right answers.
   */
  async checkFailures(
    key: string,
    limit: number,
    windowMs: number,
    message: string,
  ): Promise<void> {
    const ds = await this.acquire([{ kind: 'sum', key, limit, windowMs }], 'other');
    if (ds && !ds[0]!.allowed) throw rateLimited(ds[0]!, {}, message);
  }

  async addFailure(key: string, windowMs: number): Promise<void> {
    try {
      await this.backend.add(key, 1, windowMs, this.clock.now());
    } catch (err) {
      this.logger.warn({ err }, 'rate limiter unavailable (a failure went uncounted)');
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
    if (ds && !ds[0]!.allowed) throw rateLimited(ds[0]!, {}, message);
  }
}
