/**
 * Approvals for `destructive` tools, with an escalation chain.
 *
 * A project's chain is a list of stages `{target, timeout_ms}` (operator API;
 * default: `project-approvers` for 15 minutes, then `project-admins` for 15
 * minutes). The chain is copied into the approval when it is requested, so a
 * later change does not move approvals already pending. Stage *n*'s target
 * decides who may decide while the approval sits at that stage:
 * `project-owners` → owner; `project-admins` → owner or admin; any other
 * target (`project-approvers`, or a rotation named by the operator) → owner,
 * admin or approver. Viewers never decide.
 *
 * pending → accepted (`exec.approved`; the invocation is queued and dispatched)
 * pending → rejected (`exec.rejected`; the invocation is cancelled)
 * pending → pending, next stage (`exec.approval_escalated`, `stage` = the new
 *           1-based stage number as a string, `target` = its target)
 * pending → expired at the last stage's deadline (`exec.approval_timed_out`;
 *           the invocation is cancelled, error `approval_timed_out`)
 * Cancelling the invocation first expires the approval (no event).
 *
 * Deadlines are applied by the scheduler's sweep once per tick, and by every
 * decision for its own approval before it is judged (same step, same events),
 * so a decision made after a deadline but before the next tick sees the stage
 * (or the expiry) the clock says, not the one the last tick left.
 */
import { randomUUID } from 'node:crypto';
import { and, desc, eq, lte, sql } from 'drizzle-orm';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import type { Tx } from '../events/outbox.js';
import { parseBody } from '../http/validate.js';
import { externalId } from '../runtime/ids.js';
import { tables } from '../store/index.js';
import { emit, type ExecContext } from './context.js';
import { afterCursor, page, pageQuery } from './pagination.js';
import { publicApproval, type ApprovalRow, type InvocationRow } from './records.js';
import { cancel, move } from './transitions.js';
import type { UserRef } from './users.js';

const { approvals: P, invocations: I, users: U, settings: S } = tables;

export interface Stage {
  target: string;
  timeout_ms: number;
}

export const DEFAULT_CHAIN: Stage[] = [
  { target: 'project-approvers', timeout_ms: 900_000 },
  { target: 'project-admins', timeout_ms: 900_000 },
];

export const chainBody = z
  .object({
    stages: z
      .array(
        z
          .object({
            target: z
              .string()
              .regex(/^[a-z0-9][a-z0-9_.:-]{0,63}$/, 'must be lowercase letters, digits, _.:-'),
            timeout_ms: z.number().int().min(1000).max(604_800_000),
          })
          .strict(),
      )
      .min(1)
      .max(10),
  })
  .strict();

const ROLES_FOR: Record<string, readonly string[]> = {
  'project-owners': ['owner'],
  'project-admins': ['owner', 'admin'],
};
const DEFAULT_DECIDERS = ['owner', 'admin', 'approver'] as const;

function notMember(): ServiceError {
  return new ServiceError('insufficient_role', {
    message: 'The user is not a member of this project.',
  });
}

export function mayDecide(role: string | null, target: string): boolean {
  if (!role) return false;
  return (ROLES_FOR[target] ?? DEFAULT_DECIDERS).includes(role);
}

const chainKey = (projectId: string) => `exec.approval_chain:${projectId}`;

const listQuery = pageQuery.extend({
  status: z.enum(['pending', 'accepted', 'rejected', 'expired']).optional(),
});

const rejectBody = z.object({ reason: z.string().max(2000).optional() }).strict();

type Decision<T> =
  | { kind: 'decided'; value: T }
  | { kind: 'not_pending'; status: string }
  | { kind: 'forbidden'; target: string }
  | { kind: 'raced' };

export class Approvals {
  /** The sweep's select, built once: the scheduler runs it every tick (scheduler.ts). */
  private readonly overdue;

  constructor(
    private readonly ctx: ExecContext,
    private readonly dispatchQueued: (inv: InvocationRow) => Promise<unknown>,
  ) {
    this.overdue = ctx.db
      .select()
      .from(P)
      .where(and(eq(P.status, 'pending'), lte(P.stageDeadline, sql.placeholder('now'))))
      .orderBy(P.stageDeadline)
      .limit(sql.placeholder('limit'))
      .prepare('');
  }

  async chain(projectId: string): Promise<Stage[]> {
    const [row] = await this.ctx.db
      .select()
      .from(S)
      .where(eq(S.key, chainKey(projectId)))
      .limit(1);
    const parsed = chainBody.safeParse({ stages: row?.value });
    return parsed.success ? parsed.data.stages : DEFAULT_CHAIN;
  }

  async setChain(projectId: string, raw: unknown): Promise<Stage[]> {
    const body = parseBody(chainBody, raw);
    await this.ctx.db
      .insert(S)
      .values({ key: chainKey(projectId), value: body.stages })
      .onConflictDoUpdate({ target: S.key, set: { value: body.stages } });
    return body.stages;
  }

  /** Inside the invocation's creating transaction. */
  async request(
    tx: Tx,
    inv: InvocationRow,
    workspaceExternalId: string,
    chain: Stage[],
    now: Date,
  ): Promise<ApprovalRow> {
    const row: ApprovalRow = {
      id: randomUUID(),
      externalId: externalId('app'),
      projectId: inv.projectId,
      invocationId: inv.id,
      status: 'pending',
      stage: 0,
      chain,
      stageDeadline: new Date(now.getTime() + chain[0]!.timeout_ms),
      decidedBy: null,
      reason: null,
      createdAt: now,
      decidedAt: null,
      updatedAt: now,
    };
    await tx.insert(P).values(row);
    await emit(
      tx,
      inv.projectId,
      'exec.approval_requested',
      {
        invocation_id: inv.externalId,
        approval_id: row.externalId,
        tool_name: inv.tool,
        risk: inv.risk,
        workspace_id: workspaceExternalId,
        requested_at: now.toISOString(),
      },
      now,
    );
    return row;
  }

  private async view(rows: ApprovalRow[]) {
    if (rows.length === 0) return [];
    const out = [];
    for (const a of rows) {
      const [inv] = await this.ctx.db
        .select({ externalId: I.externalId, tool: I.tool, risk: I.risk })
        .from(I)
        .where(eq(I.id, a.invocationId));
      const [u] = a.decidedBy
        ? await this.ctx.db
            .select({ externalId: U.externalId })
            .from(U)
            .where(eq(U.id, a.decidedBy))
        : [];
      out.push(
        publicApproval(a, {
          invocation: inv!.externalId,
          tool: inv!.tool,
          risk: inv!.risk,
          decidedBy: u?.externalId ?? null,
        }),
      );
    }
    return out;
  }

  private async row(projectId: string, id: string): Promise<ApprovalRow> {
    const [a] = /^app_[0-9a-f]{1,64}$/.test(id)
      ? await this.ctx.db
          .select()
          .from(P)
          .where(and(eq(P.projectId, projectId), eq(P.externalId, id)))
          .limit(1)
      : [];
    if (!a) throw new ServiceError('approval_not_found', { param: 'approval_id' });
    return a;
  }

  async get(projectId: string, id: string) {
    return (await this.view([await this.row(projectId, id)]))[0]!;
  }

  async list(projectId: string, query: unknown) {
    const q = parseBody(listQuery, query ?? {});
    const cursor = await afterCursor(this.ctx.db, P, projectId, q.after);
    const rows = await this.ctx.db
      .select()
      .from(P)
      .where(and(eq(P.projectId, projectId), q.status ? eq(P.status, q.status) : undefined, cursor))
      .orderBy(desc(P.createdAt), desc(P.id))
      .limit(q.limit + 1);
    return page(await this.view(rows), q.limit);
  }

  async approve(projectId: string, id: string, user: UserRef) {
    const inv = await this.decide(projectId, id, user, async (tx, a, now) => {
      const decided = await this.close(tx, a, 'accepted', now, { decidedBy: user.id });
      if (!decided) return null;
      const [inv] = await tx.select().from(I).where(eq(I.id, a.invocationId));
      const queued = await move(tx, inv!, ['pending_approval'], {
        status: 'queued',
        queuedAt: now,
        updatedAt: now,
      });
      await emit(
        tx,
        projectId,
        'exec.approved',
        {
          invocation_id: inv!.externalId,
          approval_id: decided.externalId,
          decided_by: user.externalId,
          approved_at: now.toISOString(),
        },
        now,
      );
      return { queued };
    });
    if (inv.queued) await this.dispatchQueued(inv.queued);
    return this.get(projectId, id);
  }

  async reject(projectId: string, id: string, user: UserRef, raw: unknown) {
    const body = parseBody(rejectBody, raw ?? {});
    const reason = body.reason ?? '';
    await this.decide(projectId, id, user, async (tx, a, now) => {
      const decided = await this.close(tx, a, 'rejected', now, { decidedBy: user.id, reason });
      if (!decided) return null;
      const [inv] = await tx.select().from(I).where(eq(I.id, a.invocationId));
      await cancel(
        tx,
        inv!,
        ['pending_approval'],
        'approval_rejected',
        reason ? `Approval rejected: ${reason}` : 'Approval rejected.',
        now,
      );
      await emit(
        tx,
        projectId,
        'exec.rejected',
        {
          invocation_id: inv!.externalId,
          approval_id: decided.externalId,
          reason,
          rejected_at: now.toISOString(),
        },
        now,
      );
      return {};
    });
    return this.get(projectId, id);
  }

  /**
   * One decision, in one transaction: the stage moves already due are applied
   * first (as the sweep would, with their events), so a decision never lands
   * on a stage whose deadline has passed. Then 409 when not pending, 403 when
   * the user's role may not decide at the (current) stage, else `apply`. Its
   * `null` means the conditional close lost a race (another instance moved
   * the stage meanwhile): the decision reads the approval again and re-checks
   * instead of answering 409 for an approval that is still pending. 404 first,
   * except to a user who is no member of the project: 403 before any lookup, so
   * whatever the id, the answer tells such a user nothing about the approval.
   */
  private async decide<T>(
    projectId: string,
    id: string,
    user: UserRef,
    apply: (tx: Tx, a: ApprovalRow, now: Date) => Promise<T | null>,
  ): Promise<T> {
    if (!user.role) throw notMember();
    const found = await this.row(projectId, id);
    for (let attempt = 0; attempt < 3; attempt++) {
      const now = new Date(this.ctx.clock.now());
      const out = await this.ctx.db.transaction(async (tx): Promise<Decision<T>> => {
        const a = await this.catchUp(tx, found.id, now);
        if (a.status !== 'pending') return { kind: 'not_pending', status: a.status };
        const target = a.chain[a.stage]?.target ?? '';
        if (!mayDecide(user.role, target)) return { kind: 'forbidden', target };
        const done = await apply(tx, a, now);
        return done === null ? { kind: 'raced' } : { kind: 'decided', value: done };
      });
      // Stage moves may have committed whatever the outcome.
      this.ctx.poke();
      switch (out.kind) {
        case 'decided':
          return out.value;
        case 'not_pending':
          throw new ServiceError('approval_not_pending', {
            message: `The approval is already ${out.status}.`,
          });
        case 'forbidden':
          throw new ServiceError('insufficient_role', {
            message: `Role '${user.role}' may not decide at this stage (target '${out.target}').`,
          });
        case 'raced':
          continue;
      }
    }
    throw new ServiceError('unavailable', {
      message: 'The approval is changing stage; retry.',
      headers: { 'Retry-After': '1' },
    });
  }

  /**
   * The approval as of `now`: every stage deadline already passed is applied
   * with the sweep's own step (`advance`), one stage at a time, each with its
   * event. A step that finds the row moved by someone else just reads it again.
   */
  private async catchUp(tx: Tx, id: string, now: Date): Promise<ApprovalRow> {
    for (;;) {
      const [a] = await tx.select().from(P).where(eq(P.id, id));
      if (!a) throw new ServiceError('approval_not_found', { param: 'approval_id' });
      if (a.status !== 'pending' || a.stageDeadline.getTime() > now.getTime()) return a;
      await this.advance(tx, a, now);
    }
  }

  /** Conditional close: null when the approval is no longer pending at this stage. */
  private async close(
    tx: Tx,
    a: ApprovalRow,
    status: 'accepted' | 'rejected',
    now: Date,
    extra: { decidedBy?: string; reason?: string } = {},
  ): Promise<ApprovalRow | null> {
    const [row] = await tx
      .update(P)
      .set({
        status,
        decidedAt: now,
        updatedAt: now,
        decidedBy: extra.decidedBy ?? null,
        reason: extra.reason ?? null,
      })
      .where(and(eq(P.id, a.id), eq(P.status, 'pending'), eq(P.stage, a.stage)))
      .returning();
    return row ?? null;
  }

  /**
   * Locks the approval of an invocation (`FOR UPDATE`) in `tx`. Every decision, step
   * and expiry writes the approval's row before the invocation's; a transaction that
   * ends an invocation waiting for approval takes this lock first to keep that order.
   */
  async lockFor(tx: Tx, invocationId: string): Promise<void> {
    await tx.select({ id: P.id }).from(P).where(eq(P.invocationId, invocationId)).for('update');
  }

  /** The invocation was cancelled while waiting: its approval expires silently. */
  async expireFor(tx: Tx, invocationId: string, now: Date): Promise<void> {
    await tx
      .update(P)
      .set({ status: 'expired', reason: 'invocation cancelled', decidedAt: now, updatedAt: now })
      .where(and(eq(P.invocationId, invocationId), eq(P.status, 'pending')));
  }

  /** Scheduler: advances or expires approvals whose stage deadline has passed. */
  async sweep(limit = 100): Promise<number> {
    const now = new Date(this.ctx.clock.now());
    const due = await this.overdue.execute({ now, limit });
    let n = 0;
    for (const a of due) {
      // Several stages may have passed since the last sweep: walk them one by one,
      // each at its own deadline, so every escalation is reported.
      let cur: ApprovalRow | null = a;
      while (cur && cur.status === 'pending' && cur.stageDeadline.getTime() <= now.getTime()) {
        cur = await this.ctx.db.transaction((tx) => this.advance(tx, cur!, now));
        n++;
      }
    }
    if (n > 0) this.ctx.poke();
    return n;
  }

  private async advance(tx: Tx, a: ApprovalRow, now: Date): Promise<ApprovalRow | null> {
    const [inv] = await tx.select().from(I).where(eq(I.id, a.invocationId));
    const next = a.stage + 1;
    const stage = a.chain[next];
    if (stage) {
      const [row] = await tx
        .update(P)
        .set({
          stage: next,
          stageDeadline: new Date(a.stageDeadline.getTime() + stage.timeout_ms),
          updatedAt: now,
        })
        .where(and(eq(P.id, a.id), eq(P.status, 'pending'), eq(P.stage, a.stage)))
        .returning();
      if (!row) return null;
      await emit(
        tx,
        a.projectId,
        'exec.approval_escalated',
        {
          invocation_id: inv!.externalId,
          approval_id: a.externalId,
          stage: String(next + 1),
          target: stage.target,
          escalated_at: now.toISOString(),
        },
        now,
      );
      return row;
    }
    const [row] = await tx
      .update(P)
      .set({ status: 'expired', decidedAt: now, updatedAt: now, reason: 'no decision in time' })
      .where(and(eq(P.id, a.id), eq(P.status, 'pending'), eq(P.stage, a.stage)))
      .returning();
    if (!row) return null;
    await cancel(
      tx,
      inv!,
      ['pending_approval'],
      'approval_timed_out',
      'No approval decision in time.',
      now,
    );
    await emit(
      tx,
      a.projectId,
      'exec.approval_timed_out',
      {
        invocation_id: inv!.externalId,
        approval_id: a.externalId,
        timed_out_at: now.toISOString(),
      },
      now,
    );
    return row;
  }
}
