/**
 * The control plane's clock-driven work, one `tick()` at a time (tests call
 * it after advancing a FakeClock; in production `start()` runs it every
 * `SWITCHYARD_EXEC_TICK_MS` on the injected clock). Each step is a set of
 * conditional transitions, so several router instances may tick the same
 * database: whoever moves a row emits its event, the others do nothing.
 *
 * 1. Leases: an enrolled agent whose lease has passed goes `offline`; each of
 *    its in-flight invocations gets `exec.agent_offline` (reason
 *    `lease_expired`) and fails (`agent_offline`, `exec.failed`).
 * 2. Approvals: stage deadlines escalate, the last one expires (approvals.ts).
 * 3. Backstop: an invocation dispatched more than `timeout_ms` + grace ago with
 *    no answer from its agent fails with error `timeout` and `exec.timeout`
 *    (the agent is asked to kill it).
 * 4. Queue: queued invocations (approved ones waiting for a connected agent)
 *    are dispatched, all of them, a page of BATCH at a time (those no agent can
 *    take now stay queued without holding up the rest); one queued longer than
 *    its `timeout_ms` fails with `tool_executor_unavailable` (`exec.failed`).
 * 5. Cancels (with a broker here): an invocation the router ended after its
 *    dispatch (cancel, force-fail, backstop, agent deleted) is told to its agent
 *    by the instance whose broker holds the agent's session. The instance that
 *    ended it sends the CANCEL itself when it can; this step delivers those it
 *    could not (an API-only instance, another broker), once per instance. An
 *    invocation failed because its agent's lease ran out (`agent_offline`) had nobody
 *    to tell: its agent may have been alive, cut off (a network blip), and still run
 *    the tool; when it is back (connected here) within the invocation's `timeout_ms`
 *    plus grace of its dispatch, it gets the CANCEL then.
 *
 * Every pass starts with a select per step, and on an idle router they all find
 * nothing, every second, forever. They are prepared once (`sql.placeholder('now')`,
 * unnamed statements): building one with Drizzle cost about 94 KB of garbage and
 * 310 µs, executing a prepared one 22 KB and 120 µs (docs/RELIABILITY.md, "An idle
 * router").
 */
import { and, eq, gt, inArray, isNull, lte, sql, type SQL } from 'drizzle-orm';
import type { Timer } from '../runtime/clock.js';
import { tables } from '../store/index.js';
import type { Approvals } from './approvals.js';
import { emit, IN_FLIGHT, type ExecContext } from './context.js';
import type { Invocations } from './invocations.js';
import { MAX_TIMEOUT_MS } from './manifest.js';
import { fail, move } from './transitions.js';

const { agents: A, invocations: I } = tables;
const BATCH = 100;
/** Ended invocations looked at per pass for CANCEL delivery (two ticks' worth of ends). */
const ENDED_BATCH = 1000;

/** The pass's selects, built once; `now` is the only parameter. */
function dueQueries(ctx: ExecContext) {
  const now = sql.placeholder('now');
  const grace = ctx.settings.timeoutGraceMs;
  /** Dispatched invocations ended with no answer of their agent recorded, and `also`. */
  const endedWithoutAnswer = (also: SQL | undefined) =>
    ctx.db
      .select({ invocationId: I.externalId, agentId: A.externalId, agentKey: A.curvePublicKey })
      .from(I)
      .innerJoin(A, eq(A.id, I.agentId))
      .where(
        and(
          // As written in the partial index invocations_router_ended_idx, so it is used.
          sql`${I.status} in ('cancelled', 'failed') and ${I.dispatchedAt} is not null and ${I.durationMs} is null`,
          also,
        ),
      )
      .orderBy(I.finishedAt)
      .limit(ENDED_BATCH)
      .prepare('');
  return {
    expiredLeases: ctx.db
      .select()
      .from(A)
      .where(and(eq(A.status, 'enrolled'), isNull(A.deletedAt), lte(A.leaseExpiresAt, now)))
      .limit(BATCH)
      .prepare(''),
    overdue: ctx.db
      .select()
      .from(I)
      .where(
        and(
          inArray(I.status, [...IN_FLIGHT]),
          sql`${I.dispatchedAt} + (${I.timeoutMs} + ${grace}) * interval '1 millisecond' <= ${now}`,
        ),
      )
      .limit(BATCH)
      .prepare(''),
    // Keyset pages (`after`: the last row's queue time and id), so queued invocations
    // that cannot be dispatched now do not hide the ones behind them.
    // Ended by the router after a dispatch, no answer of the agent recorded
    // (`duration_ms` is set only by one), within the window.
    ended: endedWithoutAnswer(
      and(gt(I.finishedAt, sql.placeholder('since')), lte(I.finishedAt, sql.placeholder('now'))),
    ),
    // Failed with their agent's lease, maybe still running there: until the agent's own
    // timeout has killed them (the backstop's window), on the same partial index.
    offline: endedWithoutAnswer(
      and(
        gt(
          I.finishedAt,
          sql`${sql.placeholder('now')}::timestamptz - ${MAX_TIMEOUT_MS + grace} * interval '1 millisecond'`,
        ),
        eq(I.errorCode, 'agent_offline'),
        eq(A.status, 'enrolled'),
        sql`${I.dispatchedAt} + (${I.timeoutMs} + ${grace}) * interval '1 millisecond' > ${sql.placeholder('now')}`,
      ),
    ),
    queued: ctx.db
      .select()
      .from(I)
      .where(
        and(
          eq(I.status, 'queued'),
          sql`(coalesce(${I.queuedAt}, ${I.createdAt}), ${I.id}) > (${sql.placeholder('afterAt')}, ${sql.placeholder('afterId')})`,
        ),
      )
      .orderBy(sql`coalesce(${I.queuedAt}, ${I.createdAt})`, I.id)
      .limit(BATCH)
      .prepare(''),
  };
}

export class Scheduler {
  private timer: Timer | null = null;
  private running: Promise<unknown> = Promise.resolve();
  private stopped = true;
  private readonly due: ReturnType<typeof dueQueries>;

  constructor(
    private readonly ctx: ExecContext,
    private readonly approvals: Approvals,
    private readonly invocations: Invocations,
  ) {
    this.due = dueQueries(ctx);
  }

  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    const loop = () => {
      if (this.stopped) return;
      this.timer = this.ctx.clock.setTimer(this.ctx.settings.tickMs, () => {
        void this.tick()
          .catch((err: unknown) => this.ctx.logger.error({ err }, 'exec scheduler tick failed'))
          .finally(loop);
      });
    };
    loop();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.timer?.cancel();
    this.timer = null;
    await this.running.catch(() => undefined);
  }

  /** One pass; passes never overlap (a call made during one runs after it). */
  tick(): Promise<void> {
    const next = this.running.catch(() => undefined).then(() => this.pass());
    this.running = next;
    return next;
  }

  private async pass(): Promise<void> {
    await this.expireLeases();
    await this.approvals.sweep(BATCH);
    await this.backstop();
    await this.queue();
    await this.deliverCancels();
  }

  /** Clock time of the previous delivery step (null before the first). */
  private cancelsCheckedAt: number | null = null;

  /**
   * Step 5: CANCEL to agents connected here for invocations ended since the previous
   * pass (with two ticks of overlap, for commits that land late or another
   * instance's clock), skipping those already sent from this instance.
   */
  async deliverCancels(): Promise<number> {
    const t = this.ctx.transport();
    const nowMs = this.ctx.clock.now();
    const since = (this.cancelsCheckedAt ?? nowMs) - 2 * this.ctx.settings.tickMs;
    this.cancelsCheckedAt = nowMs;
    if (!t) return 0;
    const ended = await this.due.ended.execute({ since: new Date(since), now: new Date(nowMs) });
    const offline = await this.due.offline.execute({ now: new Date(nowMs) });
    let n = 0;
    for (const e of [...ended, ...offline]) {
      if (this.invocations.cancelsSent.has(e.invocationId)) continue;
      if (!t.isConnected(e.agentId, e.agentKey)) continue;
      await this.invocations.sendCancel(t, e.agentId, e.invocationId);
      n++;
    }
    return n;
  }

  async expireLeases(): Promise<number> {
    const now = new Date(this.ctx.clock.now());
    const due = await this.due.expiredLeases.execute({ now });
    let n = 0;
    for (const agent of due) {
      const moved = await this.ctx.db.transaction(async (tx) => {
        const [a] = await tx
          .update(A)
          .set({ status: 'offline', updatedAt: now })
          .where(and(eq(A.id, agent.id), eq(A.status, 'enrolled'), lte(A.leaseExpiresAt, now)))
          .returning();
        if (!a) return false;
        const inflight = await tx
          .select()
          .from(I)
          .where(and(eq(I.agentId, a.id), inArray(I.status, [...IN_FLIGHT])));
        if (inflight.length === 0) {
          // The spec's transition (enrolled → offline) always emits
          // exec.agent_offline; with nothing in flight there is no invocation to
          // name, so `invocation_id` is the empty string (still a string).
          await emit(
            tx,
            a.projectId,
            'exec.agent_offline',
            {
              invocation_id: '',
              agent_id: a.externalId,
              reason: 'lease_expired',
              detected_at: now.toISOString(),
            },
            now,
          );
        }
        for (const inv of inflight) {
          await emit(
            tx,
            a.projectId,
            'exec.agent_offline',
            {
              invocation_id: inv.externalId,
              agent_id: a.externalId,
              reason: 'lease_expired',
              detected_at: now.toISOString(),
            },
            now,
          );
          await fail(
            tx,
            inv,
            IN_FLIGHT,
            'agent_offline',
            'The agent missed its lease renewal while running the invocation.',
            now,
          );
        }
        return true;
      });
      if (moved) n++;
    }
    if (n > 0) this.ctx.poke();
    return n;
  }

  async backstop(): Promise<number> {
    const nowMs = this.ctx.clock.now();
    const now = new Date(nowMs);
    const grace = this.ctx.settings.timeoutGraceMs;
    const due = await this.due.overdue.execute({ now });
    let n = 0;
    for (const inv of due) {
      const elapsed = nowMs - (inv.startedAt ?? inv.dispatchedAt ?? now).getTime();
      const moved = await this.ctx.db.transaction(async (tx) => {
        const m = await move(tx, inv, IN_FLIGHT, {
          status: 'failed',
          errorCode: 'timeout',
          errorMessage: `No answer from the agent within timeout_ms (${inv.timeoutMs}) plus ${grace} ms.`,
          finishedAt: now,
          updatedAt: now,
        });
        if (!m) return null;
        await emit(
          tx,
          inv.projectId,
          'exec.timeout',
          {
            invocation_id: inv.externalId,
            timeout_ms: inv.timeoutMs,
            elapsed_ms: elapsed,
            timed_out_at: now.toISOString(),
          },
          now,
        );
        return m;
      });
      if (moved) {
        n++;
        await this.invocations.cancelOnAgent(inv);
      }
    }
    if (n > 0) this.ctx.poke();
    return n;
  }

  async queue(): Promise<void> {
    const now = new Date(this.ctx.clock.now());
    let failed = 0;
    // Project and tool pairs no agent connected here offers: one catalog read a pass.
    const idle = new Set<string>();
    let afterAt = new Date(0);
    let afterId = '00000000-0000-0000-0000-000000000000';
    for (;;) {
      const queued = await this.due.queued.execute({ afterAt, afterId });
      for (const inv of queued) {
        const since = (inv.queuedAt ?? inv.createdAt).getTime();
        if (since + inv.timeoutMs <= now.getTime()) {
          const m = await this.ctx.db.transaction((tx) =>
            fail(
              tx,
              inv,
              ['queued'],
              'tool_executor_unavailable',
              'No agent was online for the tool before the invocation timed out.',
              now,
            ),
          );
          if (m) failed++;
          continue;
        }
        const key = `${inv.projectId}:${inv.tool}`;
        if (idle.has(key)) continue;
        if (!(await this.invocations.dispatchQueued(inv))) idle.add(key);
      }
      if (queued.length < BATCH) break;
      const last = queued[queued.length - 1]!;
      afterAt = last.queuedAt ?? last.createdAt;
      afterId = last.id;
    }
    if (failed > 0) this.ctx.poke();
  }
}
