/**
 * The seam between the execution surface's two halves:
 *
 * - the **control plane** (`src/exec/service.ts` and friends): records in the
 *   database (join keys, agents, workspaces, invocations, approvals, users),
 *   the HTTP API under `/<project_id>/v1/exec/*` and the management routes,
 *   the approval escalation and lease-expiry scheduler on the injected clock,
 *   and the `exec.*` / `agent.*` / `join_key.*` events;
 * - the **transport** (`src/exec/broker/` and `src/exec/agent/`): the ZeroMQ
 *   broker with CURVE and ZAP, the enrollment protocol, lease renewals, and
 *   the `switchyard agent` program that runs tools as subprocesses.
 *
 * The broker calls the control plane through `AgentDirectory`; the control
 * plane reaches agents through `AgentTransport`. Both run in one process (the
 * `broker` and `api` roles together); see docs/EXEC.md.
 */

/** Risk classification of a tool, from its manifest. `destructive` needs approval. */
export const RISKS = ['read_only', 'low', 'medium', 'high', 'destructive'] as const;
export type Risk = (typeof RISKS)[number];

/** One tool as an agent declares it in its capability manifest. */
export interface ToolSpec {
  /** `^[a-zA-Z0-9_.-]{1,64}$`, unique within the manifest. */
  name: string;
  description: string;
  /** A JSON Schema (draft 2020-12 subset Ajv accepts) for the tool's arguments. */
  input_schema: Record<string, unknown>;
  risk: Risk;
  /** Whether the project's MCP server lists and runs this tool. */
  mcp_visible: boolean;
  /** Used when an invocation gives no `timeout_ms`. 1 .. 3,600,000. */
  default_timeout_ms: number;
}

/** What an agent sends at enrollment (the router validates it; docs/EXEC.md). */
export interface Manifest {
  /** Manifest format version; `1`. */
  version: 1;
  tools: ToolSpec[];
}

export interface EnrollRequest {
  /** The join key secret (`swyjk_…`). */
  joinKey: string;
  registrationName: string;
  /** The agent's CURVE public key, Z85 (40 chars); the ZeroMQ handshake proved it. */
  curvePublicKey: string;
  /** Unvalidated: the control plane validates it. */
  manifest: unknown;
}

export type EnrollResult =
  | {
      ok: true;
      /** `agt_<hex>` */
      agentId: string;
      /** Internal project UUID. */
      projectId: string;
      manifestHash: string;
      /** The agent must renew before this many ms pass. */
      leaseMs: number;
    }
  | {
      ok: false;
      code:
        'exec_manifest_invalid' | 'agent_name_in_use' | 'agent_name_conflict' | 'join_key_invalid';
      message: string;
      /** For exec_manifest_invalid: the field path, e.g. `tools[1].input_schema`. */
      param?: string;
    };

/** Outcome of one dispatched invocation, as the agent reports it. */
export type DispatchOutcome =
  | {
      kind: 'exited';
      exitCode: number;
      durationMs: number;
      stdout: string;
      stderr: string;
      /** True when stdout or stderr was cut at the agent's bound. */
      truncated: boolean;
    }
  /** The agent could not run it (spawn failure, unknown tool, bad arguments). */
  | { kind: 'error'; errorCode: string; errorMessage: string; durationMs: number }
  /** The agent killed it at its timeout (SIGTERM, then SIGKILL). */
  | { kind: 'timeout'; elapsedMs: number }
  /** The agent killed it because the router asked (cancel). */
  | { kind: 'cancelled'; durationMs: number };

export interface DispatchRequest {
  /** `inv_<hex>` */
  invocationId: string;
  tool: string;
  arguments: unknown;
  timeoutMs: number;
  /**
   * The agent's CURVE key as the control plane knows it now: a session opened with
   * another (rotated-out) key is not sent the invocation.
   */
  agentKey?: string;
}

/** Implemented by the control plane; called by the broker. */
export interface AgentDirectory {
  /** Validates the join key and manifest, reserves the name, stores the agent. */
  enroll(req: EnrollRequest): Promise<EnrollResult>;
  /**
   * ZAP: is this CURVE key an enrolled, not deleted agent? Returns its id.
   * Only such peers may connect to the agent socket.
   */
  agentForKey(curvePublicKey: string): Promise<{ agentId: string } | null>;
  /** A lease renewal (heartbeat) arrived; returns the new lease length or null if the agent is unknown/deleted. */
  /** Null when the agent is gone, or (with `agentKey`) no longer holds that key. */
  renew(agentId: string, agentKey?: string): Promise<{ leaseMs: number } | null>;
  /** The agent accepted the dispatch and started the tool. */
  started(invocationId: string, agentId: string): Promise<void>;
  /** The agent reported the outcome. */
  finished(invocationId: string, agentId: string, outcome: DispatchOutcome): Promise<void>;
}

/** Implemented by the broker; called by the control plane. */
export interface AgentTransport {
  /** The broker's CURVE server public key (Z85), shown by the API and `switchyard admin`. */
  readonly serverPublicKey: string;
  /** Endpoints agents connect to, e.g. `tcp://127.0.0.1:7601`. */
  readonly endpoints: { enroll: string; agents: string };
  /**
   * Is the agent connected to this broker now (session open, lease current)? With
   * `agentKey`: over a session opened with that key (not one rotated out since).
   */
  isConnected(agentId: string, agentKey?: string): boolean;
  /** Sends the invocation to the agent. Rejects when the agent is not connected. */
  dispatch(agentId: string, req: DispatchRequest): Promise<void>;
  /** Asks the agent to kill the running tool (SIGTERM then SIGKILL); it answers with `cancelled`. */
  cancel(agentId: string, invocationId: string): Promise<void>;
  close(): Promise<void>;
}
