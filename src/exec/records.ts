/**
 * Public shapes of the execution surface's records (docs/EXEC.md). Ids are the
 * external forms (`jk_`, `agt_`, `ws_`, `inv_`, `app_`, `usr_`); timestamps are
 * ISO 8601 strings, as inside `exec.*` payloads. Secrets and their hashes never
 * appear here.
 */
import { tables } from '../store/index.js';
import type { Manifest } from './contracts.js';
import { iso } from './context.js';

type JoinKeyRow = typeof tables.joinKeys.$inferSelect;
type AgentRow = typeof tables.agents.$inferSelect;
type WorkspaceRow = typeof tables.workspaces.$inferSelect;
type InvocationRow = typeof tables.invocations.$inferSelect;
type ApprovalRow = typeof tables.approvals.$inferSelect;

export type { JoinKeyRow, AgentRow, WorkspaceRow, InvocationRow, ApprovalRow };

export function joinKeyStatus(k: JoinKeyRow, nowMs: number) {
  if (k.revokedAt) return 'revoked' as const;
  if (k.expiresAt && k.expiresAt.getTime() <= nowMs) return 'expired' as const;
  if (k.maxUses !== null && k.useCount >= k.maxUses) return 'exhausted' as const;
  return 'active' as const;
}

export function publicJoinKey(k: JoinKeyRow, nowMs: number) {
  return {
    id: k.externalId,
    object: 'join_key' as const,
    name: k.name,
    prefix: k.prefix,
    status: joinKeyStatus(k, nowMs),
    registration_name: k.registrationName,
    expires_at: iso(k.expiresAt),
    max_uses: k.maxUses,
    use_count: k.useCount,
    created_at: k.createdAt.toISOString(),
    revoked_at: iso(k.revokedAt),
  };
}

/** `enrolled` rows whose lease ran out read as `offline` before the scheduler notices. */
export function agentStatus(a: AgentRow, nowMs: number): 'enrolled' | 'offline' | 'deleted' {
  if (a.deletedAt || a.status === 'deleted') return 'deleted';
  if (a.status === 'enrolled' && a.leaseExpiresAt && a.leaseExpiresAt.getTime() > nowMs) {
    return 'enrolled';
  }
  return 'offline';
}

export function publicAgent(a: AgentRow, nowMs: number, joinKeyExternalId: string | null) {
  const manifest = a.manifest as unknown as Manifest;
  return {
    id: a.externalId,
    object: 'agent' as const,
    registration_name: a.registrationName,
    status: agentStatus(a, nowMs),
    curve_public_key: a.curvePublicKey,
    description: a.description,
    metadata: a.metadata,
    manifest_hash: a.manifestHash,
    tools: manifest.tools.map((t) => ({ name: t.name, risk: t.risk, mcp_visible: t.mcp_visible })),
    join_key_id: joinKeyExternalId,
    lease_expires_at: iso(a.leaseExpiresAt),
    enrolled_at: a.enrolledAt.toISOString(),
    last_seen_at: iso(a.lastSeenAt),
    created_at: a.createdAt.toISOString(),
    updated_at: a.updatedAt.toISOString(),
    deleted_at: iso(a.deletedAt),
  };
}

export function publicWorkspace(w: WorkspaceRow) {
  return {
    id: w.externalId,
    object: 'workspace' as const,
    name: w.name,
    metadata: w.metadata,
    created_at: w.createdAt.toISOString(),
  };
}

export interface InvocationRefs {
  workspace: string;
  agent: string | null;
  approval: string | null;
}

export function publicInvocation(i: InvocationRow, refs: InvocationRefs) {
  return {
    id: i.externalId,
    object: 'invocation' as const,
    tool: i.tool,
    risk: i.risk,
    workspace_id: refs.workspace,
    agent_id: refs.agent,
    approval_id: refs.approval,
    arguments: i.arguments,
    status: i.status,
    timeout_ms: i.timeoutMs,
    idempotency_key: i.idempotencyKey,
    exit_code: i.exitCode,
    duration_ms: i.durationMs,
    stdout: i.stdout,
    stderr: i.stderr,
    output_truncated: i.outputTruncated === 1,
    error: i.errorCode ? { code: i.errorCode, message: i.errorMessage ?? '' } : null,
    created_at: i.createdAt.toISOString(),
    queued_at: iso(i.queuedAt),
    dispatched_at: iso(i.dispatchedAt),
    started_at: iso(i.startedAt),
    finished_at: iso(i.finishedAt),
  };
}

export function publicApproval(
  a: ApprovalRow,
  refs: { invocation: string; decidedBy: string | null; tool: string; risk: string },
) {
  const stage = a.chain[a.stage];
  return {
    id: a.externalId,
    object: 'approval' as const,
    invocation_id: refs.invocation,
    tool: refs.tool,
    risk: refs.risk,
    status: a.status,
    stage: a.stage + 1,
    target: stage?.target ?? null,
    chain: a.chain,
    stage_deadline: a.status === 'pending' ? a.stageDeadline.toISOString() : null,
    decided_by: refs.decidedBy,
    reason: a.reason,
    created_at: a.createdAt.toISOString(),
    decided_at: iso(a.decidedAt),
  };
}
