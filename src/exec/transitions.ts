/**
 * Invocation state changes. Every move is one conditional UPDATE
 * (`… WHERE id = ? AND status IN (<allowed from>)`) inside the transaction that
 * also writes the move's event, so a move happens once even when two router
 * instances, the scheduler and an agent's answer race for it: the loser
 * updates no row and emits nothing.
 *
 *   pending_approval → queued (approved) | cancelled (rejected, approval
 *                      timed out, cancel)
 *   queued           → dispatched | cancelled | failed (no agent before timeout_ms)
 *   dispatched       → running | completed | failed | cancelled
 *   running          → completed | failed | cancelled
 *   completed, failed, cancelled: terminal.
 */
import { and, eq, inArray } from 'drizzle-orm';
import type { Tx } from '../events/outbox.js';
import { tables } from '../store/index.js';
import { emit, type InvocationStatus } from './context.js';
import type { InvocationRow } from './records.js';

const { invocations: I } = tables;

export async function move(
  tx: Tx,
  inv: { id: string },
  from: readonly InvocationStatus[],
  set: Partial<InvocationRow> & { status: InvocationStatus; updatedAt: Date },
): Promise<InvocationRow | null> {
  const rows = await tx
    .update(I)
    .set(set)
    .where(and(eq(I.id, inv.id), inArray(I.status, [...from])))
    .returning();
  return rows[0] ?? null;
}

/** Fails a non-terminal invocation with `exec.failed` (a transport-side failure). */
export async function fail(
  tx: Tx,
  inv: InvocationRow,
  from: readonly InvocationStatus[],
  code: string,
  message: string,
  now: Date,
): Promise<InvocationRow | null> {
  const moved = await move(tx, inv, from, {
    status: 'failed',
    errorCode: code,
    errorMessage: message,
    finishedAt: now,
    updatedAt: now,
  });
  if (moved) {
    await emit(
      tx,
      inv.projectId,
      'exec.failed',
      {
        invocation_id: inv.externalId,
        error_code: code,
        error_message: message,
        failed_at: now.toISOString(),
      },
      now,
    );
  }
  return moved;
}

/** Cancels an invocation (no `exec.*` event exists for a cancel). */
export function cancel(
  tx: Tx,
  inv: InvocationRow,
  from: readonly InvocationStatus[],
  code: string,
  message: string,
  now: Date,
): Promise<InvocationRow | null> {
  return move(tx, inv, from, {
    status: 'cancelled',
    errorCode: code,
    errorMessage: message,
    finishedAt: now,
    updatedAt: now,
  });
}
