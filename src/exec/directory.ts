/**
 * The control plane's side of the broker seam (`AgentDirectory`): enrollment,
 * the ZAP key check, lease renewals and invocation outcomes.
 *
 * Enrollment, in order (the first failure answers):
 * 1. the join key: unknown, revoked or expired → `join_key_invalid`; a key
 *    that reserves a `registration_name` enrolls only that name (else
 *    `join_key_invalid`);
 * 2. `registration_name` (`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`), the CURVE key
 *    (Z85, 40 characters) and the manifest → `exec_manifest_invalid` with the
 *    field in `param`;
 * 3. the name among the project's non-deleted agents:
 *    - held by the same CURVE key → re-enrollment of that agent (same id, new
 *      manifest; uses no join-key use, so a restarting agent is never locked
 *      out by `max_uses`);
 *    - held by a *live* agent (enrolled, lease current) with another key →
 *      `agent_name_in_use` when the join key reserves the name, else
 *      `agent_name_conflict`;
 *    - held by an offline agent with another key → a reserving join key takes
 *      the name over (the old agent is soft-deleted, `agent.deleted`); an
 *      ordinary join key gets `agent_name_conflict` (delete the old agent or
 *      rotate its key first);
 *    - the CURVE key already identifies another non-deleted agent →
 *      `agent_name_conflict`;
 * 4. a new agent uses one join-key use (`max_uses` reached → `join_key_invalid`).
 * Accepted: `agent.created` (new agents), `exec.agent_enrolled`, `agent.enrolled`.
 */
import { randomUUID } from 'node:crypto';
import { and, eq, isNull, sql } from 'drizzle-orm';
import type { Tx } from '../events/outbox.js';
import { externalId } from '../runtime/ids.js';
import { isUniqueViolation, tables } from '../store/index.js';
import type { AgentDirectory, DispatchOutcome, EnrollRequest, EnrollResult } from './contracts.js';
import { clampUtf8, emit, IN_FLIGHT, type ExecContext } from './context.js';
import { validateManifest } from './manifest.js';
import type { AgentRow, InvocationRow } from './records.js';
import { joinKeyHash } from './secrets.js';
import { fail, move, cancel } from './transitions.js';

const { agents: A, joinKeys: J, invocations: I } = tables;

export const REGISTRATION_NAME = /^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$/;
/** Z85 alphabet, 40 characters = 32 bytes. */
export const CURVE_KEY = /^[0-9a-zA-Z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;

type Refusal = Extract<EnrollResult, { ok: false }>;

class EnrollRefused extends Error {
  constructor(readonly result: Refusal) {
    super(result.message);
  }
}

function refuse(code: Refusal['code'], message: string, param?: string): never {
  throw new EnrollRefused({ ok: false, code, message, ...(param ? { param } : {}) });
}

/**
 * Text a PostgreSQL column can hold: the tool wrote what it wrote (binary output,
 * `find -print0`), and a U+0000 would fail the record of its result, so it is kept
 * as U+FFFD, as a worker's answer is (src/store/storable.ts).
 */
function storableText(s: string): string {
  return s.includes('\u0000') ? s.replaceAll('\u0000', '\uFFFD') : s;
}

/** The range of the `integer` columns an agent's numbers are stored in (exit code, durations). */
const INT_MAX = 2 ** 31 - 1;
const INT_MIN = -(2 ** 31);

/** An exit code the `exit_code` column holds: an integer of 32 bits. */
function storableExitCode(code: number): boolean {
  return Number.isInteger(code) && code >= INT_MIN && code <= INT_MAX;
}

/** A duration an agent reported, in milliseconds, as the `integer` column holds it. */
function storableMs(ms: number): number {
  return Math.min(Math.max(Math.round(ms), 0), INT_MAX);
}

export class Directory implements AgentDirectory {
  constructor(private readonly ctx: ExecContext) {}

  async enroll(req: EnrollRequest): Promise<EnrollResult> {
    try {
      const r = await this.ctx.db.transaction((tx) => this.enrollIn(tx, req));
      this.ctx.poke();
      return r;
    } catch (err) {
      if (err instanceof EnrollRefused) return err.result;
      if (isUniqueViolation(err)) {
        // A concurrent enrollment took the name or the key first.
        return {
          ok: false,
          code: 'agent_name_conflict',
          message: `Another agent enrolled as '${req.registrationName}' or with this CURVE key at the same time.`,
        };
      }
      throw err;
    }
  }

  private async enrollIn(tx: Tx, req: EnrollRequest): Promise<EnrollResult> {
    const nowMs = this.ctx.clock.now();
    const now = new Date(nowMs);
    const hash = typeof req.joinKey === 'string' ? joinKeyHash(req.joinKey) : null;
    const [jk] = hash
      ? await tx.select().from(J).where(eq(J.secretHash, hash)).limit(1).for('update')
      : [];
    if (!jk) refuse('join_key_invalid', 'Unknown join key.');
    if (jk.revokedAt) refuse('join_key_invalid', 'The join key has been revoked.');
    if (jk.expiresAt && jk.expiresAt.getTime() <= nowMs) {
      refuse('join_key_invalid', 'The join key has expired.');
    }
    const name = req.registrationName;
    if (typeof name !== 'string' || !REGISTRATION_NAME.test(name)) {
      refuse(
        'exec_manifest_invalid',
        "Invalid 'registration_name': must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$.",
        'registration_name',
      );
    }
    if (jk.registrationName !== null && jk.registrationName !== name) {
      refuse('join_key_invalid', `The join key enrolls only '${jk.registrationName}'.`);
    }
    if (typeof req.curvePublicKey !== 'string' || !CURVE_KEY.test(req.curvePublicKey)) {
      refuse(
        'exec_manifest_invalid',
        "Invalid 'curve_public_key': must be 40 Z85 characters.",
        'curve_public_key',
      );
    }
    const m = validateManifest(req.manifest);
    if (!m.ok) refuse('exec_manifest_invalid', m.message, m.param);

    const [byName] = await tx
      .select()
      .from(A)
      .where(and(eq(A.projectId, jk.projectId), eq(A.registrationName, name), isNull(A.deletedAt)))
      .limit(1)
      .for('update');
    const [byKey] = await tx
      .select()
      .from(A)
      .where(and(eq(A.curvePublicKey, req.curvePublicKey), isNull(A.deletedAt)))
      .limit(1);
    if (byKey && byKey.id !== byName?.id) {
      refuse(
        'agent_name_conflict',
        'This CURVE key already identifies another agent; each agent needs its own keypair.',
      );
    }
    const lease = new Date(nowMs + this.ctx.settings.leaseMs);
    const manifestJson = m.manifest as unknown as Record<string, unknown>;
    let agent: AgentRow;
    let created = false;
    if (byName && byName.curvePublicKey === req.curvePublicKey) {
      [agent] = (await tx
        .update(A)
        .set({
          status: 'enrolled',
          manifest: manifestJson,
          manifestHash: m.hash,
          leaseExpiresAt: lease,
          enrolledAt: now,
          lastSeenAt: now,
          updatedAt: now,
        })
        .where(eq(A.id, byName.id))
        .returning()) as [AgentRow];
    } else {
      if (byName) {
        const live =
          byName.status === 'enrolled' && (byName.leaseExpiresAt?.getTime() ?? 0) > nowMs;
        if (live && jk.registrationName !== null) {
          refuse(
            'agent_name_in_use',
            `The join key reserves '${name}', which a live agent (${byName.externalId}) uses.`,
          );
        }
        if (live || jk.registrationName === null) {
          refuse(
            'agent_name_conflict',
            `An agent named '${name}' (${byName.externalId}) already exists with another CURVE key.`,
          );
        }
        // A reserving join key takes over the name of an offline agent.
        await this.softDelete(tx, byName, now, 'agent_replaced');
      }
      const used = await tx
        .update(J)
        .set({ useCount: sql`${J.useCount} + 1` })
        .where(and(eq(J.id, jk.id), sql`(${J.maxUses} is null or ${J.useCount} < ${J.maxUses})`))
        .returning({ id: J.id });
      if (used.length === 0) refuse('join_key_invalid', 'The join key has no uses left.');
      const row = {
        id: randomUUID(),
        externalId: externalId('agt'),
        projectId: jk.projectId,
        registrationName: name,
        curvePublicKey: req.curvePublicKey,
        status: 'enrolled',
        manifest: manifestJson,
        manifestHash: m.hash,
        description: '',
        metadata: {},
        joinKeyId: jk.id,
        leaseExpiresAt: lease,
        enrolledAt: now,
        lastSeenAt: now,
        createdAt: now,
        updatedAt: now,
        deletedAt: null,
      };
      await tx.insert(A).values(row);
      agent = row;
      created = true;
      await emit(
        tx,
        agent.projectId,
        'agent.created',
        {
          agent_id: agent.externalId,
          registration_name: name,
          join_key_id: jk.externalId,
          created_at: now.toISOString(),
        },
        now,
      );
    }
    await emit(
      tx,
      agent.projectId,
      'exec.agent_enrolled',
      {
        agent_id: agent.externalId,
        registration_name: name,
        project_id: agent.projectId,
        manifest_hash: m.hash,
        enrolled_at: now.toISOString(),
      },
      now,
    );
    await emit(
      tx,
      agent.projectId,
      'agent.enrolled',
      {
        agent_id: agent.externalId,
        registration_name: name,
        manifest_hash: m.hash,
        tools: m.manifest.tools.map((t) => t.name),
        first_enrollment: created,
        enrolled_at: now.toISOString(),
      },
      now,
    );
    return {
      ok: true,
      agentId: agent.externalId,
      projectId: agent.projectId,
      manifestHash: m.hash,
      leaseMs: this.ctx.settings.leaseMs,
    };
  }

  /**
   * Soft-deletes an agent inside `tx`: its in-flight invocations fail
   * (`agent_deleted`) and are cancelled on the agent after commit by the caller.
   */
  /**
   * Null when the agent was deleted already: another delete, read live at the same
   * time, got there first (it failed the in-flight invocations and emitted the event).
   */
  async softDelete(
    tx: Tx,
    agent: AgentRow,
    now: Date,
    reason: string,
  ): Promise<InvocationRow[] | null> {
    const done = await tx
      .update(A)
      .set({ status: 'deleted', deletedAt: now, leaseExpiresAt: null, updatedAt: now })
      .where(and(eq(A.id, agent.id), isNull(A.deletedAt)))
      .returning({ id: A.id });
    if (done.length === 0) return null;
    const inflight = await tx
      .select()
      .from(I)
      .where(and(eq(I.agentId, agent.id), sql`${I.status} in ('dispatched', 'running')`));
    for (const inv of inflight) {
      await fail(tx, inv, IN_FLIGHT, 'agent_deleted', 'The agent was deleted.', now);
    }
    await emit(
      tx,
      agent.projectId,
      'agent.deleted',
      { agent_id: agent.externalId, reason, deleted_at: now.toISOString() },
      now,
    );
    return inflight;
  }

  async agentForKey(curvePublicKey: string): Promise<{ agentId: string } | null> {
    const [a] = await this.ctx.db
      .select({ externalId: A.externalId })
      .from(A)
      .where(and(eq(A.curvePublicKey, curvePublicKey), isNull(A.deletedAt)))
      .limit(1);
    return a ? { agentId: a.externalId } : null;
  }

  /**
   * A renewal also brings an offline (not deleted) agent back online. With
   * `agentKey` (the key its session was opened with), only while the agent still
   * holds that key: a session of a rotated-out key is not renewed.
   */
  async renew(agentId: string, agentKey?: string): Promise<{ leaseMs: number } | null> {
    const nowMs = this.ctx.clock.now();
    const now = new Date(nowMs);
    const rows = await this.ctx.db
      .update(A)
      .set({
        status: 'enrolled',
        leaseExpiresAt: new Date(nowMs + this.ctx.settings.leaseMs),
        lastSeenAt: now,
        updatedAt: now,
      })
      .where(
        and(
          eq(A.externalId, agentId),
          isNull(A.deletedAt),
          agentKey === undefined ? undefined : eq(A.curvePublicKey, agentKey),
        ),
      )
      .returning({ id: A.id });
    return rows.length ? { leaseMs: this.ctx.settings.leaseMs } : null;
  }

  private async invocationOf(
    tx: Tx,
    invocationId: string,
    agentId: string,
  ): Promise<InvocationRow | null> {
    const [row] = await tx
      .select({ inv: I })
      .from(I)
      .innerJoin(A, eq(A.id, I.agentId))
      .where(and(eq(I.externalId, invocationId), eq(A.externalId, agentId)))
      .limit(1);
    return row?.inv ?? null;
  }

  async started(invocationId: string, agentId: string): Promise<void> {
    const now = new Date(this.ctx.clock.now());
    await this.ctx.db.transaction(async (tx) => {
      const inv = await this.invocationOf(tx, invocationId, agentId);
      if (!inv) return;
      await move(tx, inv, ['dispatched'], { status: 'running', startedAt: now, updatedAt: now });
    });
  }

  /**
   * Records the agent's outcome. Exit code 0 → `completed` (`exec.completed`);
   * another exit code → `failed`, `nonzero_exit` (`exec.failed`); the agent's
   * error → `failed` with its code (`exec.failed`); the agent's timeout →
   * `failed`, `timeout` (`exec.timeout`); cancelled → `cancelled`. An answer
   * for an invocation that is already terminal (cancelled, or failed by the
   * router's own timeout backstop) changes nothing.
   */
  async finished(invocationId: string, agentId: string, outcome: DispatchOutcome): Promise<void> {
    const now = new Date(this.ctx.clock.now());
    const at = now.toISOString();
    const max = this.ctx.settings.outputMaxBytes;
    await this.ctx.db.transaction(async (tx) => {
      const inv = await this.invocationOf(tx, invocationId, agentId);
      if (!inv) return;
      const from = IN_FLIGHT;
      const p = inv.projectId;
      switch (outcome.kind) {
        case 'exited': {
          const out = clampUtf8(storableText(outcome.stdout), max);
          const err = clampUtf8(storableText(outcome.stderr), max);
          const ok = outcome.exitCode === 0;
          // An exit code no process has (not a 32-bit integer) is the agent's fault: the
          // invocation fails saying so, instead of its record failing to be written (and
          // the invocation waiting for the timeout backstop).
          const valid = storableExitCode(outcome.exitCode);
          const code = valid ? 'nonzero_exit' : 'invalid_exit_code';
          const message = valid
            ? `The tool exited with code ${outcome.exitCode}.`
            : `The agent reported exit code ${outcome.exitCode}, which is not a 32-bit integer.`;
          const moved = await move(tx, inv, from, {
            status: ok ? 'completed' : 'failed',
            exitCode: valid ? outcome.exitCode : null,
            durationMs: storableMs(outcome.durationMs),
            stdout: out.text,
            stderr: err.text,
            outputTruncated: outcome.truncated || out.cut || err.cut ? 1 : 0,
            errorCode: ok ? null : code,
            errorMessage: ok ? null : message,
            finishedAt: now,
            updatedAt: now,
          });
          if (!moved) return;
          if (ok) {
            await emit(
              tx,
              p,
              'exec.completed',
              {
                invocation_id: inv.externalId,
                status: 'completed',
                duration_ms: storableMs(outcome.durationMs),
                exit_code: outcome.exitCode,
                completed_at: at,
              },
              now,
            );
          } else {
            await emit(
              tx,
              p,
              'exec.failed',
              {
                invocation_id: inv.externalId,
                error_code: code,
                error_message: message,
                failed_at: at,
              },
              now,
            );
          }
          return;
        }
        case 'error': {
          const code = storableText(outcome.errorCode.slice(0, 100)) || 'agent_error';
          const message = clampUtf8(storableText(outcome.errorMessage), 2048).text;
          const moved = await fail(tx, inv, from, code, message, now);
          if (moved && outcome.durationMs >= 0) {
            await tx
              .update(I)
              .set({ durationMs: storableMs(outcome.durationMs) })
              .where(eq(I.id, inv.id));
          }
          return;
        }
        case 'timeout': {
          const moved = await move(tx, inv, from, {
            status: 'failed',
            errorCode: 'timeout',
            errorMessage: `The invocation exceeded its timeout_ms (${inv.timeoutMs}).`,
            durationMs: storableMs(outcome.elapsedMs),
            finishedAt: now,
            updatedAt: now,
          });
          if (moved) {
            await emit(
              tx,
              p,
              'exec.timeout',
              {
                invocation_id: inv.externalId,
                timeout_ms: inv.timeoutMs,
                elapsed_ms: storableMs(outcome.elapsedMs),
                timed_out_at: at,
              },
              now,
            );
          }
          return;
        }
        case 'cancelled': {
          await cancel(tx, inv, from, 'cancelled', 'Invocation cancelled before completion.', now);
          return;
        }
      }
    });
    this.ctx.poke();
  }
}
