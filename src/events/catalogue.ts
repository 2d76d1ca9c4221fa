/**
 * The event catalogue: every event type of the spec with its status.
 * - `active`: emitted, with a typed payload schema (the spec's fields; ISO 8601
 *   strings for `*_at` inside exec.* payloads, integers where it says integer).
 * - `reserved`: may be subscribed to, is never emitted (no payload defined).
 * - `listed`: named by the spec without a payload shape; emitted by the
 *   surfaces that own them with the payload documented there.
 * Plus Switchyard's own `webhook.test` (the synthetic test delivery) and the
 * legacy `budget.threshold_reached` (un-enveloped body, see budget alerts).
 */
import { z } from 'zod';

const iso = z.iso.datetime({ offset: true });
const id = (prefix: string) => z.string().regex(new RegExp(`^${prefix}_[A-Za-z0-9]+$`));
const int = z.number().int();

export const ACTIVE_PAYLOADS = {
  'exec.dispatched': z.object({
    invocation_id: id('inv'),
    tool_name: z.string(),
    workspace_id: id('ws'),
    agent_id: id('agt'),
    risk: z.string(),
    dispatched_at: iso,
  }),
  'exec.completed': z.object({
    invocation_id: id('inv'),
    status: z.string(),
    duration_ms: int,
    exit_code: int,
    completed_at: iso,
  }),
  'exec.failed': z.object({
    invocation_id: id('inv'),
    error_code: z.string(),
    error_message: z.string(),
    failed_at: iso,
  }),
  'exec.timeout': z.object({
    invocation_id: id('inv'),
    timeout_ms: int,
    elapsed_ms: int,
    timed_out_at: iso,
  }),
  'exec.approval_requested': z.object({
    invocation_id: id('inv'),
    approval_id: id('app'),
    tool_name: z.string(),
    risk: z.string(),
    workspace_id: id('ws'),
    requested_at: iso,
  }),
  'exec.approved': z.object({
    invocation_id: id('inv'),
    approval_id: id('app'),
    decided_by: id('usr'),
    approved_at: iso,
  }),
  'exec.rejected': z.object({
    invocation_id: id('inv'),
    approval_id: id('app'),
    reason: z.string(),
    rejected_at: iso,
  }),
  'exec.approval_escalated': z.object({
    invocation_id: id('inv'),
    approval_id: id('app'),
    stage: z.string(),
    target: z.string(),
    escalated_at: iso,
  }),
  'exec.approval_timed_out': z.object({
    invocation_id: id('inv'),
    approval_id: id('app'),
    timed_out_at: iso,
  }),
  'exec.agent_enrolled': z.object({
    agent_id: id('agt'),
    registration_name: z.string(),
    project_id: z.uuid(),
    manifest_hash: z.string().regex(/^[0-9a-f]{64}$/),
    enrolled_at: iso,
  }),
  'exec.agent_offline': z.object({
    // '' when the agent had nothing in flight (one event per agent, not per invocation).
    invocation_id: z.union([id('inv'), z.literal('')]),
    agent_id: id('agt'),
    reason: z.string(),
    detected_at: iso,
  }),
} as const;

export const RESERVED_TYPES = [
  'exec.ambiguous',
  'exec.discovery_pending',
  'exec.workspace_created',
  'exec.workspace_budget_exhausted',
] as const;

export const LISTED_TYPES = [
  'agent.created',
  'agent.updated',
  'agent.deleted',
  'agent.enrolled',
  'agent.key_rotated',
  'join_key.created',
  'join_key.revoked',
  'batch.completed',
  'batch.failed',
  'batch.cancelled',
  'response.completed',
  'response.failed',
  'file.uploaded',
  'file.deleted',
  'conversation.created',
  'conversation.deleted',
  'ox.alert.raised',
] as const;

/** Switchyard's own types. */
export const SERVICE_TYPES = ['webhook.test', 'budget.threshold_reached'] as const;

export type ActiveType = keyof typeof ACTIVE_PAYLOADS;
export type EventType =
  | ActiveType
  | (typeof RESERVED_TYPES)[number]
  | (typeof LISTED_TYPES)[number]
  | (typeof SERVICE_TYPES)[number];
export type EventStatus = 'active' | 'reserved' | 'listed' | 'service';

const STATUS = new Map<string, EventStatus>([
  ...Object.keys(ACTIVE_PAYLOADS).map((t) => [t, 'active'] as const),
  ...RESERVED_TYPES.map((t) => [t, 'reserved'] as const),
  ...LISTED_TYPES.map((t) => [t, 'listed'] as const),
  ...SERVICE_TYPES.map((t) => [t, 'service'] as const),
]);

export function eventStatus(type: string): EventStatus | undefined {
  return STATUS.get(type);
}

export const ALL_EVENT_TYPES: readonly string[] = [...STATUS.keys()];

/** Payload of an event as the emitter passes it. */
export type EventData<T extends string> = T extends ActiveType
  ? z.input<(typeof ACTIVE_PAYLOADS)[T]>
  : Record<string, unknown>;
