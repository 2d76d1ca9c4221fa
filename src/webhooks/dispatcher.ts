/**
 * The webhook dispatcher: crash-safe, at-least-once delivery with the spec's
 * exact retry schedule, shared by any number of dispatcher processes.
 *
 * Claim (one short transaction, `FOR UPDATE SKIP LOCKED` so dispatchers never
 * wait on each other): due pending deliveries (`next_attempt_at <= now` and no
 * live lease) are taken; each gets a new fencing token, a lease, its attempt
 * counted and an `in_progress` attempt row — BEFORE any HTTP is sent, so a
 * dispatcher killed at any moment can never cause a seventh attempt.
 * `next_attempt_at` is set at claim to when the next retry would be due, so a
 * delivery whose dispatcher died becomes claimable again on schedule (the lost
 * attempt is marked `lost`, outcome unknown: the receiver may have seen it).
 *
 * The loop polls every 250 ms. An idle poll is one prepared select of a single due
 * delivery's id (no lock, no transaction); the claim runs only when it finds one.
 * Building the claim's transaction anew on every poll was about half of an idle
 * router's garbage (docs/RELIABILITY.md, "An idle router"). A probe that sees a
 * delivery another dispatcher then claims leads to an empty claim, nothing more.
 *
 * Send: outside any transaction, through the SSRF-guarded agent, 30 s limit.
 *
 * Complete (one transaction, fenced): only if the delivery still carries our
 * token is the outcome written: 2xx → delivered; otherwise a failed attempt,
 * retried 1 min, 5 min, 15 min, 1 h, 4 h after the failure; after the 6th,
 * permanently failed. A stale completion (lease lost, another dispatcher took
 * over) writes nothing.
 *
 * Why SKIP LOCKED over a job library: the queue is one table that also serves
 * the delivery-records API, and it must work on PGlite as well as PostgreSQL;
 * maintained Postgres job libraries (graphile-worker, pg-boss) need LISTEN or
 * their own schema and connection handling that PGlite does not offer in-process.
 */
import { and, eq, sql } from 'drizzle-orm';
import type { Clock } from '../runtime/clock.js';
import type { Logger } from '../runtime/logger.js';
import type { Metrics } from '../runtime/metrics.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';
import type { Sender } from './sender.js';
import { signPayload, SIGNATURE_HEADER, TIMESTAMP_HEADER, WEBHOOK_ID_HEADER } from './signing.js';
import { RESPONSE_BODY_LIMIT, USER_AGENT } from './sender.js';

/** The first `limit` bytes of a string as UTF-8, never ending in half a character. */
export function truncateUtf8(s: string, limit = RESPONSE_BODY_LIMIT): string {
  const b = Buffer.from(s, 'utf8');
  if (b.length <= limit) return s;
  let end = limit;
  // Step back over continuation bytes (10xxxxxx) to a character boundary.
  while (end > 0 && (b[end]! & 0xc0) === 0x80) end--;
  return b.subarray(0, end).toString('utf8');
}

/**
 * The answer's text as PostgreSQL's text holds it: a U+0000 would fail the write of
 * the attempt's outcome (a 2xx lost, the delivery retried as if never answered), so
 * it is kept as U+FFFD, as a worker's answer is (src/store/storable.ts). Before the
 * 1 KiB cut: U+FFFD is 3 bytes.
 */
function storableBody(s: string): string {
  return s.includes('\u0000') ? s.replaceAll('\u0000', '\uFFFD') : s;
}

export const RETRY_DELAYS_MS = [60_000, 300_000, 900_000, 3_600_000, 14_400_000] as const;
export const MAX_ATTEMPTS = RETRY_DELAYS_MS.length + 1;
export const ATTEMPT_TIMEOUT_MS = 30_000;
/** Longer than the attempt timeout, shorter than the first retry delay. */
export const LEASE_MS = 45_000;

const { webhookDeliveries: D, webhookEndpoints: E, events: EV, webhookAttempts: A } = tables;

export interface Claimed {
  id: string;
  token: number;
  attempt: number;
  url: string;
  secret: string;
  body: string;
  /** A test delivery: one attempt, no retries. */
  final: boolean;
}

export interface AttemptOutcome {
  success: boolean;
  httpStatus: number | null;
  responseBody: string | null;
  error: string | null;
  durationMs: number;
}

export interface DispatcherOptions {
  metrics?: Metrics;
  batchSize?: number;
  pollMs?: number;
  /**
   * The schedule, the spec's unless overridden (only tests and drills shorten it:
   * SWITCHYARD_WEBHOOK_RETRY_DELAYS_MS and friends).
   */
  retryDelaysMs?: readonly number[];
  attemptTimeoutMs?: number;
  leaseMs?: number;
}

export class Dispatcher {
  private running = false;
  private loop: Promise<void> | null = null;
  private wake: (() => void) | null = null;
  private readonly batchSize: number;
  private readonly pollMs: number;
  private readonly delays: readonly number[];
  private readonly maxAttempts: number;
  private readonly timeoutMs: number;
  private readonly leaseMs: number;
  private readonly metrics: Metrics | undefined;
  /** Deliveries in flight in this process (drained on stop). */
  private inFlight = 0;
  /** Is any delivery due? The idle loop's only query, built once. */
  private readonly dueProbe;
  stats = { delivered: 0, failedAttempts: 0, permanentlyFailed: 0, stale: 0 };

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly sender: Sender,
    private readonly logger: Logger,
    opts: DispatcherOptions = {},
  ) {
    this.batchSize = opts.batchSize ?? 32;
    this.pollMs = opts.pollMs ?? 250;
    this.delays = opts.retryDelaysMs ?? RETRY_DELAYS_MS;
    this.maxAttempts = this.delays.length + 1;
    this.timeoutMs = opts.attemptTimeoutMs ?? ATTEMPT_TIMEOUT_MS;
    this.leaseMs = opts.leaseMs ?? LEASE_MS;
    this.metrics = opts.metrics;
    if (this.leaseMs <= this.timeoutMs)
      throw new Error('the lease must outlast the attempt timeout');
    const now = sql.placeholder('now');
    // The claim's own conditions, the webhook's being active included: a disabled
    // webhook's waiting retries are not due, or every poll would run a claim's
    // transaction that finds nothing for as long as the webhook stays disabled.
    this.dueProbe = db
      .select({ id: D.id })
      .from(D)
      .innerJoin(E, eq(E.id, D.endpointId))
      .where(
        and(
          eq(D.status, 'pending'),
          sql`${D.nextAttemptAt} <= ${now}`,
          sql`(${D.leaseUntil} is null or ${D.leaseUntil} <= ${now})`,
          eq(E.isActive, 1),
        ),
      )
      .limit(1)
      .prepare('');
  }

  /** Claims due deliveries and attempts them; resolves when they are recorded. */
  async tick(): Promise<number> {
    const claimed = await this.claim(this.batchSize);
    await Promise.all(claimed.map((c) => this.attempt(c)));
    return claimed.length;
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    // Continuous: up to `batchSize` attempts in flight; a slot freed by a fast
    // receiver is refilled at once instead of waiting for the slowest attempt
    // of a batch (a hanging receiver would otherwise hold 31 others for 30 s).
    const running = new Set<Promise<unknown>>();
    this.loop = (async () => {
      while (this.running) {
        let n = 0;
        const free = this.batchSize - running.size;
        if (free > 0) {
          try {
            const claimed = (await this.anyDue()) ? await this.claim(free) : [];
            n = claimed.length;
            for (const c of claimed) {
              const p: Promise<unknown> = this.attempt(c)
                .catch((err: unknown) => this.logger.warn({ err }, 'webhook attempt failed'))
                .finally(() => {
                  running.delete(p);
                  this.wake?.();
                });
              running.add(p);
            }
          } catch (err) {
            this.logger.warn({ err }, 'webhook dispatch claim failed');
          }
        }
        if ((n === 0 || running.size >= this.batchSize) && this.running) {
          await new Promise<void>((resolve) => {
            const t = setTimeout(resolve, this.pollMs);
            this.wake = () => {
              clearTimeout(t);
              resolve();
            };
          });
          this.wake = null;
        }
      }
      // Stopping: attempts in flight finish and record their outcome.
      await Promise.all(running);
    })();
  }

  /** Whether a claim now would find a delivery: the idle loop's one query per poll. */
  async anyDue(): Promise<boolean> {
    const due = await this.dueProbe.execute({ now: new Date(this.clock.now()) });
    return due.length > 0;
  }

  /** Nudges an idle loop (after an event was emitted in this process). */
  poke(): void {
    this.wake?.();
  }

  async stop(): Promise<void> {
    this.running = false;
    this.wake?.();
    await this.loop;
  }

  async claim(limit: number, onlyId?: string): Promise<Claimed[]> {
    const now = new Date(this.clock.now());
    return this.db.transaction(async (tx) => {
      const due = await tx
        .select({
          id: D.id,
          attemptCount: D.attemptCount,
          leaseUntil: D.leaseUntil,
          leaseToken: D.leaseToken,
          url: E.url,
          secret: E.secret,
          isActive: E.isActive,
          body: EV.body,
          eventType: D.eventType,
        })
        .from(D)
        .innerJoin(E, eq(E.id, D.endpointId))
        .innerJoin(EV, eq(EV.id, D.eventId))
        .where(
          onlyId
            ? and(eq(D.id, onlyId), eq(D.status, 'pending'))
            : and(
                eq(D.status, 'pending'),
                sql`${D.nextAttemptAt} <= ${now}`,
                sql`(${D.leaseUntil} is null or ${D.leaseUntil} <= ${now})`,
                // A disabled webhook's retries wait with it (paused for maintenance,
                // say) and go on where they were once it is enabled again.
                eq(E.isActive, 1),
              ),
        )
        .orderBy(D.nextAttemptAt)
        .limit(limit)
        .for('update', { of: D, skipLocked: true });

      const claimed: Claimed[] = [];
      for (const d of due) {
        if (d.leaseUntil && !onlyId) {
          // A previous claim was never completed: its dispatcher died mid-attempt.
          await tx
            .update(A)
            .set({ outcome: 'lost', error: 'dispatcher lost its lease; outcome unknown' })
            .where(
              and(
                eq(A.deliveryId, d.id),
                eq(A.attemptNo, d.attemptCount),
                eq(A.outcome, 'in_progress'),
              ),
            );
        }
        const final = d.eventType === 'webhook.test';
        // A test delivery is one attempt: one claimed before (its dispatcher died
        // with it, outcome unknown) is its last, as the 6th is for any other.
        const spent = d.attemptCount >= (final ? 1 : this.maxAttempts);
        if (spent || d.isActive !== 1) {
          await tx
            .update(D)
            .set({
              status: 'failed',
              leaseUntil: null,
              updatedAt: now,
              ...(d.isActive !== 1 ? { lastError: 'webhook endpoint disabled' } : {}),
            })
            .where(eq(D.id, d.id));
          if (spent) this.stats.permanentlyFailed++;
          continue;
        }
        const attempt = d.attemptCount + 1;
        const token = d.leaseToken + 1;
        const retryAt =
          attempt < this.maxAttempts && !final
            ? now.getTime() + this.delays[attempt - 1]!
            : now.getTime() + this.leaseMs;
        await tx
          .update(D)
          .set({
            attemptCount: attempt,
            leaseToken: token,
            leaseUntil: new Date(now.getTime() + this.leaseMs),
            nextAttemptAt: new Date(retryAt),
            updatedAt: now,
          })
          .where(eq(D.id, d.id));
        await tx.insert(A).values({
          deliveryId: d.id,
          attemptNo: attempt,
          outcome: 'in_progress',
          startedAt: now,
        });
        claimed.push({
          id: d.id,
          token,
          attempt,
          url: d.url,
          secret: d.secret,
          body: d.body,
          final,
        });
      }
      return claimed;
    });
  }

  /** Sends one claimed delivery and records the outcome (fenced by its token). */
  async attempt(c: Claimed): Promise<AttemptOutcome> {
    this.inFlight++;
    try {
      const outcome = await this.send(c);
      await this.complete(c, outcome);
      return outcome;
    } finally {
      this.inFlight--;
    }
  }

  private async send(c: Claimed): Promise<AttemptOutcome> {
    const started = this.clock.now();
    const timestamp = Math.floor(started / 1000);
    const headers = {
      'content-type': 'application/json',
      'user-agent': USER_AGENT,
      [WEBHOOK_ID_HEADER.toLowerCase()]: c.id,
      [TIMESTAMP_HEADER.toLowerCase()]: String(timestamp),
      [SIGNATURE_HEADER.toLowerCase()]: signPayload(c.secret, timestamp, c.body),
    };
    const abort = new AbortController();
    let timedOut = false;
    const timer = this.clock.setTimer(this.timeoutMs, () => {
      timedOut = true;
      abort.abort();
    });
    try {
      const res = await this.sender.send(c.url, headers, c.body, abort.signal);
      const ok = res.status >= 200 && res.status < 300;
      return {
        success: ok,
        httpStatus: res.status,
        responseBody: truncateUtf8(storableBody(res.body)),
        error: ok ? null : `HTTP ${res.status}`,
        durationMs: this.clock.now() - started,
      };
    } catch (err) {
      const e = err as { code?: string; message?: string };
      return {
        success: false,
        httpStatus: null,
        responseBody: null,
        error: timedOut
          ? `no response within ${this.timeoutMs / 1000} s`
          : `${e.code ?? 'error'}: ${e.message ?? String(err)}`.slice(0, 1024),
        durationMs: this.clock.now() - started,
      };
    } finally {
      timer.cancel();
    }
  }

  private async complete(c: Claimed, o: AttemptOutcome): Promise<void> {
    const now = new Date(this.clock.now());
    const lastAttempt = c.attempt >= this.maxAttempts || c.final;
    const status = o.success ? 'delivered' : lastAttempt ? 'failed' : 'pending';
    const recorded = await this.db.transaction(async (tx) => {
      const rows = await tx
        .update(D)
        .set({
          status,
          httpStatus: o.httpStatus,
          responseBody: o.responseBody,
          lastError: o.error,
          leaseUntil: null,
          updatedAt: now,
          ...(status === 'pending'
            ? { nextAttemptAt: new Date(now.getTime() + this.delays[c.attempt - 1]!) }
            : {}),
        })
        .where(and(eq(D.id, c.id), eq(D.leaseToken, c.token), eq(D.status, 'pending')))
        .returning({ id: D.id });
      if (rows.length === 0) return false;
      await tx
        .update(A)
        .set({
          outcome: o.success ? 'succeeded' : 'failed',
          httpStatus: o.httpStatus,
          responseBody: o.responseBody,
          error: o.error,
          durationMs: o.durationMs,
        })
        .where(and(eq(A.deliveryId, c.id), eq(A.attemptNo, c.attempt)));
      return true;
    });
    this.metrics?.webhookAttempts.inc({
      outcome: !recorded ? 'stale' : o.success ? 'delivered' : 'failed',
    });
    if (!recorded) {
      this.stats.stale++;
      this.logger.warn(
        { delivery: c.id },
        'webhook attempt finished after its lease was taken over',
      );
      return;
    }
    if (o.success) this.stats.delivered++;
    else {
      this.stats.failedAttempts++;
      if (status === 'failed') this.stats.permanentlyFailed++;
    }
  }

  get busy(): number {
    return this.inFlight;
  }
}
