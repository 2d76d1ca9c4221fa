/**
 * What every part of the control plane shares: the database, the injected
 * clock, the settings, the (optional) transport and a way to wake the webhook
 * dispatcher after events commit. Also the small SQL predicates that define
 * "online" and "terminal" once.
 */
import { and, eq, gt, isNull, type SQL } from 'drizzle-orm';
import type { Tx } from '../events/outbox.js';
import { emitEvent } from '../events/outbox.js';
import type { EventData } from '../events/catalogue.js';
import type { Clock } from '../runtime/clock.js';
import type { Logger } from '../runtime/logger.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';
import type { AgentTransport } from './contracts.js';

export interface ExecSettings {
  /** How long an enrollment or renewal keeps an agent online. */
  leaseMs: number;
  /** Non-terminal invocations a project may have at once (503 `unavailable` above). */
  maxPendingPerProject: number;
  /** How long past `timeout_ms` the router waits for the agent's answer before `exec.timeout`. */
  timeoutGraceMs: number;
  /** Bytes of stdout and of stderr kept per invocation. */
  outputMaxBytes: number;
  /** Scheduler period in production. */
  tickMs: number;
}

export interface ExecContext {
  db: Db;
  clock: Clock;
  logger: Logger;
  settings: ExecSettings;
  transport(): AgentTransport | null;
  /** Wakes the webhook dispatcher (events just committed). */
  poke(): void;
}

export const INVOCATION_STATUSES = [
  'pending_approval',
  'queued',
  'dispatched',
  'running',
  'completed',
  'failed',
  'cancelled',
] as const;
export type InvocationStatus = (typeof INVOCATION_STATUSES)[number];
export const TERMINAL: readonly InvocationStatus[] = ['completed', 'failed', 'cancelled'];
export const IN_FLIGHT: readonly InvocationStatus[] = ['dispatched', 'running'];
export const NON_TERMINAL: readonly InvocationStatus[] = [
  'pending_approval',
  'queued',
  'dispatched',
  'running',
];

export function isTerminal(status: string): boolean {
  return (TERMINAL as readonly string[]).includes(status);
}

const { agents: A } = tables;

/** An agent is online when enrolled, not deleted, and its lease has not run out. */
export function onlineAgent(now: Date): SQL {
  return and(eq(A.status, 'enrolled'), isNull(A.deletedAt), gt(A.leaseExpiresAt, now))!;
}

export const iso = (d: Date | null | undefined): string | null => (d ? d.toISOString() : null);

/** Emits an event inside the caller's transaction. */
export function emit<T extends string>(
  tx: Tx,
  projectId: string,
  type: T,
  data: EventData<T>,
  now: Date,
): Promise<unknown> {
  return emitEvent(tx, { projectId, type, data, now });
}

/** Cuts a string to at most `max` UTF-8 bytes without splitting a character. */
export function clampUtf8(s: string, max: number): { text: string; cut: boolean } {
  const buf = Buffer.from(s, 'utf8');
  if (buf.length <= max) return { text: s, cut: false };
  let end = max;
  // Back off continuation bytes (10xxxxxx) so a multi-byte character is not split.
  while (end > 0 && (buf[end]! & 0xc0) === 0x80) end--;
  return { text: buf.subarray(0, end).toString('utf8'), cut: true };
}

/** Keyset pagination shared by the exec lists: newest first, `after` = last id seen. */
export const DEFAULT_PAGE = 20;
export const MAX_PAGE = 100;
