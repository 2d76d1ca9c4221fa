/**
 * Budget alerts: a monthly budget with thresholds (percent). After each usage
 * flush the projects that spent are evaluated; each threshold crossed for the
 * first time in the current UTC month (or, early in a month, by the month before's
 * late-written usage: `periods`) fires once: a delivery of the spec's
 * legacy, un-enveloped body to the project's webhook endpoints subscribed to
 * `budget.threshold_reached`, signed like every delivery. The event and the
 * "fired" mark are written in one transaction (outbox), so a threshold fires
 * exactly once per month however many instances evaluate concurrently.
 */
import { randomUUID } from 'node:crypto';
import { and, asc, eq, gte, lt, sql } from 'drizzle-orm';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { eventId, insertEvent } from '../events/outbox.js';
import { parseBody } from '../http/validate.js';
import type { Clock, Timer } from '../runtime/clock.js';
import type { Logger } from '../runtime/logger.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';

const { budgetAlerts: B, usageRecords: U, projects: P } = tables;

export const BUDGET_EVENT = 'budget.threshold_reached';
/**
 * Every usage batch of a project evaluates all its alerts (under a row lock) and the
 * list is not paged: without a bound one client could make both as large as it likes.
 */
export const MAX_BUDGET_ALERTS_PER_PROJECT = 20;
const MICROCENTS_PER_CENT = 1_000_000;
/** An alert id: PostgreSQL refuses other strings of hex digits and dashes (a 500, not a 404). */
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

const createBody = z
  .object({
    name: z.string().min(1).max(200),
    budget_amount_cents: z.number().int().min(1),
    thresholds: z
      .array(z.number().positive().max(1000))
      .min(1)
      .max(10)
      .refine((a) => new Set(a).size === a.length, 'must not repeat a threshold')
      .optional(),
  })
  .strict();

type Row = typeof B.$inferSelect;

function publicAlert(a: Row) {
  return {
    id: a.id,
    object: 'budget_alert' as const,
    name: a.name,
    budget_amount_cents: a.budgetAmountCents,
    thresholds: a.thresholds,
    created_at: Math.floor(a.createdAt.getTime() / 1000),
  };
}

export function monthKey(ms: number): string {
  return new Date(ms).toISOString().slice(0, 7);
}

function monthStart(ms: number): Date {
  const d = new Date(ms);
  return new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1));
}

/** How long an instance trusts what it learned about a project having alerts. */
const PRESENCE_TTL_MS = 5_000;
/**
 * A project's alerts are evaluated at most once per this interval per instance. An
 * evaluation sums the month's usage of the project; a busy project writes a usage
 * batch every 100 ms, and summing a month of rows that often would load the database
 * for nothing. A batch inside the interval schedules one evaluation at its end.
 */
const EVAL_INTERVAL_MS = 1_000;
/**
 * How long into a month the month before is still judged: usage is dated by its
 * request's start and reaches the database after the request ends (self_hosted requests
 * run up to 30 minutes), batched, and later still after a database outage.
 */
const LATE_USAGE_MS = 2 * 3_600_000;

export class BudgetAlerts {
  /**
   * Whether a project has alerts, as last read (or written here), until `until`.
   * Every usage batch evaluates the projects it charged, and most projects have no
   * alerts: without this, each batch opened a transaction per project to find none.
   * An alert created through another instance is seen here within the TTL; its
   * thresholds are then checked against the month's whole spend, so a crossing is
   * reported late by at most that, never missed: a batch skipped on the strength of
   * "no alerts" schedules one evaluation at the TTL's end (`rechecks`), without which
   * a crossing by a project's last batch before it went quiet was never reported.
   */
  private readonly presence = new Map<string, { has: boolean; until: number }>();
  private readonly lastEval = new Map<string, number>();
  /** Evaluations deferred to the end of their project's interval. */
  private readonly due = new Map<string, Timer>();
  /** Evaluations at the end of a cached "no alerts" of a project that spent meanwhile. */
  private readonly rechecks = new Map<string, Timer>();
  /** Called when a deferred evaluation fired events (the webhook dispatcher's poke). */
  onFired: (() => void) | null = null;

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly logger: Logger,
  ) {}

  private known(projectId: string, has: boolean): void {
    if (this.presence.size >= 100_000) this.presence.clear();
    this.presence.set(projectId, { has, until: this.clock.now() + PRESENCE_TTL_MS });
  }

  async create(projectId: string, raw: unknown) {
    const body = parseBody(createBody, raw);
    const row = {
      id: randomUUID(),
      projectId,
      name: body.name,
      budgetAmountCents: body.budget_amount_cents,
      thresholds: [...(body.thresholds ?? [50, 80, 100])].sort((a, b) => a - b),
      fired: {},
      createdAt: new Date(this.clock.now()),
    };
    await this.db.transaction(async (tx) => {
      // Serialise creations per project so the cap holds under concurrency.
      await tx.execute(sql`select id from ${P} where id = ${projectId} for update`);
      const [count] = await tx
        .select({ n: sql<number>`count(*)::int` })
        .from(B)
        .where(eq(B.projectId, projectId));
      if (Number(count?.n ?? 0) >= MAX_BUDGET_ALERTS_PER_PROJECT) {
        throw new ServiceError('budget_alert_limit', {
          message: `A project can have at most ${MAX_BUDGET_ALERTS_PER_PROJECT} budget alerts.`,
        });
      }
      await tx.insert(B).values(row);
    });
    this.known(projectId, true);
    return publicAlert(row);
  }

  async list(projectId: string) {
    const rows = await this.db
      .select()
      .from(B)
      .where(eq(B.projectId, projectId))
      .orderBy(asc(B.createdAt));
    return { object: 'list' as const, data: rows.map(publicAlert) };
  }

  async remove(projectId: string, id: string) {
    const rows = UUID.test(id)
      ? await this.db
          .delete(B)
          .where(and(eq(B.projectId, projectId), eq(B.id, id)))
          .returning({ id: B.id })
      : [];
    if (rows.length === 0)
      throw new ServiceError('budget_alert_not_found', {
        message: 'No such budget alert.',
        param: 'budget_alert_id',
      });
    // Others may remain: the next batch reads the table again.
    this.presence.delete(projectId);
    return { id, object: 'budget_alert' as const, deleted: true };
  }

  /** Fires newly crossed thresholds of the given projects' alerts. */
  async evaluate(projectIds: Iterable<string>): Promise<number> {
    let fired = 0;
    for (const projectId of projectIds) {
      const now = this.clock.now();
      const seen = this.presence.get(projectId);
      if (seen && !seen.has && seen.until > now) {
        this.later(this.rechecks, projectId, seen.until - now);
        continue;
      }
      const last = this.lastEval.get(projectId);
      if (last !== undefined && now - last < EVAL_INTERVAL_MS) {
        this.later(this.due, projectId, last + EVAL_INTERVAL_MS - now);
        continue;
      }
      fired += await this.evaluateNow(projectId);
    }
    return fired;
  }

  /** Evaluates the project in `delayMs`, unless `timers` already holds an evaluation of it. */
  private later(timers: Map<string, Timer>, projectId: string, delayMs: number): void {
    if (timers.has(projectId)) return;
    const timer = this.clock.setTimer(delayMs, () => {
      timers.delete(projectId);
      void this.evaluate([projectId]).then((n) => {
        if (n > 0) this.onFired?.();
      });
    });
    timers.set(projectId, timer);
  }

  /**
   * Runs the deferred evaluations now (a graceful stop, before the store closes). The
   * rechecks of projects without alerts are dropped: they are for alerts that another
   * instance created in the last seconds, and would cost one transaction per project.
   */
  async close(): Promise<number> {
    for (const t of this.rechecks.values()) t.cancel();
    this.rechecks.clear();
    const projects = [...this.due.keys()];
    for (const t of this.due.values()) t.cancel();
    this.due.clear();
    let fired = 0;
    for (const p of projects) fired += await this.evaluateNow(p);
    return fired;
  }

  private async evaluateNow(projectId: string): Promise<number> {
    if (this.lastEval.size >= 100_000) this.lastEval.clear();
    this.lastEval.set(projectId, this.clock.now());
    try {
      return await this.evaluateProject(projectId);
    } catch (err) {
      this.logger.warn({ err, projectId }, 'budget alert evaluation failed');
      return 0;
    }
  }

  private async evaluateProject(projectId: string): Promise<number> {
    const nowMs = this.clock.now();
    return this.db.transaction(async (tx) => {
      const alerts = await tx.select().from(B).where(eq(B.projectId, projectId)).for('update');
      this.known(projectId, alerts.length > 0);
      if (alerts.length === 0) return 0;
      const [project] = await tx.select({ name: P.name }).from(P).where(eq(P.id, projectId));
      /** Each alert's fired marks as updated here. */
      const fired = new Map<string, Row['fired']>();
      let n = 0;
      for (const period of periods(nowMs)) {
        // The alerts with a threshold still to fire in the period (a month that ended
        // only for those that existed in it).
        const open = alerts.filter(
          (a) =>
            (period.end === null || a.createdAt < period.end) &&
            a.thresholds.some((t) => !(a.fired[period.month] ?? []).includes(t)),
        );
        if (open.length === 0) continue;
        const [spend] = await tx
          .select({ micro: sql<string>`coalesce(sum(${U.costMicrocents}), 0)` })
          .from(U)
          .where(
            and(
              eq(U.projectId, projectId),
              gte(U.createdAt, period.start),
              period.end === null ? undefined : lt(U.createdAt, period.end),
            ),
          );
        // Crossings are judged on the exact spend (micro-cents), not on whole cents: a
        // small budget would otherwise cross late and report a rounded percentage.
        // `currentSpendCents` is an integer (spec), whole cents spent.
        const spentMicro = Number(spend?.micro ?? 0);
        const spentCents = Math.floor(spentMicro / MICROCENTS_PER_CENT);
        for (const a of open) {
          const pct = (spentMicro / (a.budgetAmountCents * MICROCENTS_PER_CENT)) * 100;
          const marks = fired.get(a.id) ?? a.fired;
          const done = new Set(marks[period.month] ?? []);
          const crossed = a.thresholds.filter((t) => pct >= t && !done.has(t));
          for (const threshold of crossed) {
            const body = JSON.stringify({
              eventType: BUDGET_EVENT,
              alertId: a.id,
              alertName: a.name,
              projectId,
              projectName: project?.name ?? '',
              threshold,
              currentSpendCents: spentCents,
              budgetAmountCents: a.budgetAmountCents,
              spendPercentage: Math.round(pct * 100) / 100,
              timestamp: new Date(nowMs).toISOString(),
            });
            await insertEvent(tx, {
              id: eventId(),
              projectId,
              type: BUDGET_EVENT,
              body,
              now: new Date(nowMs),
            });
            done.add(threshold);
            n++;
          }
          if (crossed.length > 0) {
            fired.set(a.id, { ...marks, [period.month]: [...done].sort((x, y) => x - y) });
          }
        }
      }
      for (const [id, marks] of fired) {
        await tx.update(B).set({ fired: marks }).where(eq(B.id, id));
      }
      return n;
    });
  }
}

/**
 * The months whose spend an evaluation at `nowMs` judges: the current one, and, early in
 * a month, the one before it. A request's usage carries its start time, so a request
 * started in a month's last moments is that month's spend, yet is written (and its
 * project evaluated) in the next: judged only on the new month, its crossing of the old
 * month's thresholds was never reported.
 */
function periods(nowMs: number): Array<{ month: string; start: Date; end: Date | null }> {
  const start = monthStart(nowMs);
  const current = { month: monthKey(nowMs), start, end: null };
  if (nowMs - start.getTime() >= LATE_USAGE_MS) return [current];
  const previous = monthStart(start.getTime() - 1);
  return [{ month: monthKey(previous.getTime()), start: previous, end: start }, current];
}
