/**
 * The execution surface's control plane in one object: it implements
 * `AgentDirectory` for the broker (enrollment, ZAP key check, renewals,
 * outcomes), owns the records behind the HTTP routes, and runs the scheduler.
 *
 * The transport is optional and plugged in later: `setTransport(t)` (the
 * broker calls it once listening; `setTransport(null)` on shutdown). Without
 * one, the catalog still lists enrolled agents' tools, but invocations that
 * would run at once get 503 `unavailable`, approved ones stay queued, and
 * `GET /exec/broker` answers 503.
 */
import type { Clock } from '../runtime/clock.js';
import type { Logger } from '../runtime/logger.js';
import type { Db } from '../store/index.js';
import { Approvals } from './approvals.js';
import { Catalog } from './catalog.js';
import type {
  AgentDirectory,
  AgentTransport,
  DispatchOutcome,
  EnrollRequest,
  EnrollResult,
} from './contracts.js';
import type { ExecContext, ExecSettings } from './context.js';
import { Directory } from './directory.js';
import { Invocations } from './invocations.js';
import { Management } from './management.js';
import { Scheduler } from './scheduler.js';
import { Users } from './users.js';
import { Workspaces } from './workspaces.js';

export class ExecService implements AgentDirectory {
  private transportRef: AgentTransport | null = null;
  private readonly changeListeners = new Set<() => void>();
  readonly ctx: ExecContext;
  readonly directory: Directory;
  readonly catalog: Catalog;
  readonly workspaces: Workspaces;
  readonly invocations: Invocations;
  readonly approvals: Approvals;
  readonly users: Users;
  readonly management: Management;
  readonly scheduler: Scheduler;

  constructor(deps: {
    db: Db;
    clock: Clock;
    logger: Logger;
    settings: ExecSettings;
    poke: () => void;
    transport?: AgentTransport | null;
  }) {
    this.transportRef = deps.transport ?? null;
    this.ctx = {
      db: deps.db,
      clock: deps.clock,
      logger: deps.logger,
      settings: deps.settings,
      transport: () => this.transportRef,
      poke: () => {
        deps.poke();
        for (const l of this.changeListeners) l();
      },
    };
    this.directory = new Directory(this.ctx);
    this.catalog = new Catalog(this.ctx);
    this.workspaces = new Workspaces(this.ctx);
    this.users = new Users(this.ctx);
    this.invocations = new Invocations(
      this.ctx,
      this.catalog,
      this.workspaces,
      () => this.approvals,
    );
    this.approvals = new Approvals(this.ctx, (inv) => this.invocations.dispatchQueued(inv));
    this.management = new Management(this.ctx, this.directory, this.invocations);
    this.scheduler = new Scheduler(this.ctx, this.approvals, this.invocations);
  }

  get transport(): AgentTransport | null {
    return this.transportRef;
  }

  /** Plugs in (or removes) the broker's transport. */
  setTransport(t: AgentTransport | null): void {
    this.transportRef = t;
  }

  /**
   * Calls `listener` after every committed exec state change in this process
   * (the same moments that wake the webhook dispatcher). Waiters (the chat tool
   * bridge, the MCP server) re-read the record then; returns the unsubscribe.
   */
  onChange(listener: () => void): () => void {
    this.changeListeners.add(listener);
    return () => this.changeListeners.delete(listener);
  }

  /** Runs the scheduler every `tickMs` on the injected clock. */
  start(): void {
    this.scheduler.start();
  }

  stop(): Promise<void> {
    return this.scheduler.stop();
  }

  /** One scheduler pass (tests call this after advancing a FakeClock). */
  tick(): Promise<void> {
    return this.scheduler.tick();
  }

  // AgentDirectory, delegated.
  enroll(req: EnrollRequest): Promise<EnrollResult> {
    return this.directory.enroll(req);
  }
  agentForKey(curvePublicKey: string): Promise<{ agentId: string } | null> {
    return this.directory.agentForKey(curvePublicKey);
  }
  renew(agentId: string, agentKey?: string): Promise<{ leaseMs: number } | null> {
    return this.directory.renew(agentId, agentKey);
  }
  started(invocationId: string, agentId: string): Promise<void> {
    return this.directory.started(invocationId, agentId);
  }
  finished(invocationId: string, agentId: string, outcome: DispatchOutcome): Promise<void> {
    return this.directory.finished(invocationId, agentId, outcome);
  }
}
