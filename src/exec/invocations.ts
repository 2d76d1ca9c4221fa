/**
 * Invocations: create (with `Idempotency-Key`), read, list, cancel, result,
 * and dispatch to agents through the transport.
 *
 * Create decides, in order: body shape (`invalid_body`, `missing_workspace_id`
 * first when `workspace_id` is absent), the workspace (see workspaces.ts), the
 * idempotency key (same key and same canonical body → the stored invocation,
 * 200 with `Idempotent-Replayed: true`; same key, other body →
 * `exec_idempotency_conflict` 409), the tool (no online agent offers it →
 * `exec_tool_not_found` 400), the arguments against the tool's `input_schema`
 * (`invalid_body`, `param` = `arguments.<path>`), capacity (the project's
 * non-terminal invocations at `SWITCHYARD_EXEC_MAX_PENDING`, or no connected
 * agent for a tool that runs at once → 503 `unavailable`, nothing stored).
 * Then: a `destructive` tool waits for approval (`pending_approval`,
 * `exec.approval_requested`); any other is queued and dispatched at once
 * (`exec.dispatched` once the transport accepts it). If the transport refuses
 * the dispatch, the invocation fails (`unavailable`, `exec.failed`), its
 * Idempotency-Key is released (it never reached an agent, so a retry with the
 * same key and body runs anew) and the answer is 503.
 */
import { randomUUID } from 'node:crypto';
import { and, desc, eq, inArray, sql } from 'drizzle-orm';
import { LRUCache } from 'lru-cache';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { parseBody } from '../http/validate.js';
import { externalId } from '../runtime/ids.js';
import { isUniqueViolation, tables } from '../store/index.js';
import type { Approvals } from './approvals.js';
import { canonicalHash } from './canonical.js';
import type { Catalog, Candidate } from './catalog.js';
import type { AgentTransport } from './contracts.js';
import {
  emit,
  INVOCATION_STATUSES,
  isTerminal,
  NON_TERMINAL,
  type ExecContext,
} from './context.js';
import { checkArguments, MAX_TIMEOUT_MS } from './manifest.js';
import { afterCursor, page, pageQuery } from './pagination.js';
import { publicInvocation, type InvocationRow } from './records.js';
import { cancel, fail, move } from './transitions.js';
import type { Workspaces } from './workspaces.js';

const { invocations: I, workspaces: W, agents: A, approvals: P, projects: PR } = tables;

const createBody = z
  .object({
    tool: z.string().min(1).max(64),
    arguments: z.record(z.string(), z.unknown()).default({}),
    workspace_id: z.unknown(),
    timeout_ms: z.number().int().min(1).max(MAX_TIMEOUT_MS).optional(),
  })
  .strict();

const listQuery = pageQuery.extend({
  status: z.enum(INVOCATION_STATUSES).optional(),
  workspace_id: z.string().optional(),
  tool: z.string().optional(),
});

export const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;

export type PublicInvocation = ReturnType<typeof publicInvocation>;

export class Invocations {
  constructor(
    private readonly ctx: ExecContext,
    private readonly catalog: Catalog,
    private readonly workspaces: Workspaces,
    private readonly approvals: () => Approvals,
  ) {}

  async view(i: InvocationRow): Promise<PublicInvocation> {
    const [w] = await this.ctx.db
      .select({ id: W.externalId })
      .from(W)
      .where(eq(W.id, i.workspaceId));
    const [a] = i.agentId
      ? await this.ctx.db.select({ id: A.externalId }).from(A).where(eq(A.id, i.agentId))
      : [];
    const [p] = await this.ctx.db
      .select({ id: P.externalId })
      .from(P)
      .where(eq(P.invocationId, i.id));
    return publicInvocation(i, {
      workspace: w!.id,
      agent: a?.id ?? null,
      approval: p?.id ?? null,
    });
  }

  /**
   * `opts.mcp`: the call comes from the MCP server, so only an agent whose own
   * declaration of the tool is `mcp_visible` may run it (agents of one project may
   * declare a tool of the same name differently; the catalog describes it by one).
   */
  async create(
    projectId: string,
    raw: unknown,
    idempotencyKey: string | undefined,
    opts: { mcp?: boolean } = {},
  ): Promise<{ replayed: boolean; invocation: PublicInvocation }> {
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
      throw new ServiceError('invalid_body', { message: 'The body must be a JSON object.' });
    }
    const wsRaw = (raw as Record<string, unknown>).workspace_id;
    if (wsRaw === undefined || wsRaw === null || wsRaw === '') {
      throw new ServiceError('missing_workspace_id', { param: 'workspace_id' });
    }
    const body = parseBody(createBody, raw);
    if (nestedDeeperThan(body.arguments, MAX_ARGUMENT_DEPTH)) {
      throw new ServiceError('invalid_body', {
        message: `Invalid 'arguments': nested deeper than ${MAX_ARGUMENT_DEPTH} levels.`,
        param: 'arguments',
      });
    }
    if (idempotencyKey !== undefined && !IDEMPOTENCY_KEY.test(idempotencyKey)) {
      throw new ServiceError('invalid_body', {
        message: 'Idempotency-Key must be 1..255 printable ASCII characters.',
        param: 'Idempotency-Key',
      });
    }
    const ws = await this.workspaces.resolve(projectId, body.workspace_id);
    const requestHash = canonicalHash({
      tool: body.tool,
      arguments: body.arguments,
      workspace_id: ws.externalId,
      timeout_ms: body.timeout_ms ?? null,
    });
    if (idempotencyKey !== undefined) {
      const prior = await this.replay(projectId, idempotencyKey, requestHash);
      if (prior) return { replayed: true, invocation: prior };
    }
    const offered = await this.catalog.candidates(projectId, body.tool);
    const candidates = opts.mcp ? offered.filter((c) => c.spec.mcp_visible) : offered;
    const chosen = candidates[0];
    if (!chosen && offered.length > 0) {
      throw new ServiceError('tool_not_mcp_visible', {
        message: `The tool '${body.tool}' is not exposed over MCP (mcp_visible is false).`,
        param: 'tool',
      });
    }
    if (!chosen) {
      throw new ServiceError('exec_tool_not_found', {
        status: 400,
        message: `No online agent offers the tool '${body.tool}'.`,
        param: 'tool',
      });
    }
    const bad = checkArguments(chosen.manifestHash, chosen.spec, body.arguments);
    if (bad) throw new ServiceError('invalid_body', { message: bad.message, param: bad.param });
    const destructive = chosen.spec.risk === 'destructive';
    const surface = opts.mcp ? 'mcp' : 'http';
    const t = this.ctx.transport();
    // This instance dispatches to agents connected to its own broker. An instance
    // without a broker (`--roles` without `broker`) stores the invocation queued
    // for an online agent: the scheduler of the broker instance holding that
    // agent's session dispatches it (its next tick), as after an approval.
    const target =
      destructive || !t
        ? chosen
        : candidates.find(
            (c) =>
              mayRun(c, { risk: chosen.spec.risk, arguments: body.arguments, surface }) &&
              connected(t, c),
          );
    if (!target) throw unavailable(`No agent offering '${body.tool}' is connected.`);
    const chain = destructive ? await this.approvals().chain(projectId) : [];
    const now = new Date(this.ctx.clock.now());
    let inv: InvocationRow;
    try {
      inv = await this.ctx.db.transaction(async (tx) => {
        // Serialise creations per project so the pending cap holds under concurrency.
        await tx.execute(sql`select id from ${PR} where id = ${projectId} for update`);
        const [count] = await tx
          .select({ n: sql<number>`count(*)::int` })
          .from(I)
          .where(and(eq(I.projectId, projectId), inArray(I.status, [...NON_TERMINAL])));
        if ((count?.n ?? 0) >= this.ctx.settings.maxPendingPerProject) {
          throw unavailable('The project has too many invocations in progress.');
        }
        const row: InvocationRow = {
          id: randomUUID(),
          externalId: externalId('inv'),
          projectId,
          workspaceId: ws.id,
          tool: body.tool,
          risk: chosen.spec.risk,
          agentId: target.agentId,
          arguments: body.arguments,
          surface,
          status: destructive ? 'pending_approval' : 'queued',
          idempotencyKey: idempotencyKey ?? null,
          requestHash,
          timeoutMs: body.timeout_ms ?? chosen.spec.default_timeout_ms,
          exitCode: null,
          durationMs: null,
          stdout: null,
          stderr: null,
          outputTruncated: 0,
          errorCode: null,
          errorMessage: null,
          createdAt: now,
          queuedAt: destructive ? null : now,
          dispatchedAt: null,
          startedAt: null,
          finishedAt: null,
          updatedAt: now,
        };
        await tx.insert(I).values(row);
        if (destructive) await this.approvals().request(tx, row, ws.externalId, chain, now);
        return row;
      });
    } catch (err) {
      if (idempotencyKey !== undefined && isUniqueViolation(err)) {
        const prior = await this.replay(projectId, idempotencyKey, requestHash);
        if (prior) return { replayed: true, invocation: prior };
        // The holder failed `unavailable` and released the key meanwhile.
        throw unavailable('A request with this Idempotency-Key was just refused; retry.');
      }
      throw err;
    }
    this.ctx.poke();
    if (!destructive) {
      const outcome = await this.dispatch(inv, target, { releaseKey: true });
      if (outcome === 'failed') {
        throw unavailable('The agent could not accept the invocation; it was marked failed.');
      }
    }
    return { replayed: false, invocation: await this.view(await this.row(projectId, inv.id)) };
  }

  private async replay(
    projectId: string,
    key: string,
    hash: string,
  ): Promise<PublicInvocation | null> {
    const [prior] = await this.ctx.db
      .select()
      .from(I)
      .where(and(eq(I.projectId, projectId), eq(I.idempotencyKey, key)))
      .limit(1);
    if (!prior) return null;
    if (prior.requestHash !== hash) {
      throw new ServiceError('exec_idempotency_conflict', {
        message: 'This Idempotency-Key was used with a different request body.',
        param: 'Idempotency-Key',
      });
    }
    return this.view(prior);
  }

  /**
   * queued → dispatched, then the transport; `exec.dispatched` only once the
   * transport has accepted (spec: "forwarded to an execution agent"), in its
   * own transaction: the agent's answer may be recorded first, as event order
   * is not guaranteed. A refusal fails the invocation (`unavailable`,
   * `exec.failed`) with no `exec.dispatched`; with `releaseKey` (the create
   * request that is about to answer 503) it also frees its Idempotency-Key, so
   * the client's retry with the same key runs instead of replaying the failure.
   */
  async dispatch(
    inv: InvocationRow,
    agent: Candidate,
    opts: { releaseKey?: boolean } = {},
  ): Promise<'dispatched' | 'failed' | 'skipped'> {
    const t = this.ctx.transport();
    if (!t) return 'skipped';
    const now = new Date(this.ctx.clock.now());
    const moved = await this.ctx.db.transaction((tx) =>
      move(tx, inv, ['queued'], {
        status: 'dispatched',
        agentId: agent.agentId,
        dispatchedAt: now,
        updatedAt: now,
      }),
    );
    if (!moved) return 'skipped';
    try {
      await t.dispatch(agent.agentExternalId, {
        invocationId: inv.externalId,
        tool: inv.tool,
        arguments: inv.arguments,
        timeoutMs: inv.timeoutMs,
        agentKey: agent.agentKey,
      });
    } catch (err) {
      this.ctx.logger.warn(
        { err, invocation: inv.externalId, agent: agent.agentExternalId },
        'exec dispatch refused by the transport',
      );
      const at = new Date(this.ctx.clock.now());
      await this.ctx.db.transaction(async (tx) => {
        const failed = await fail(
          tx,
          moved,
          ['dispatched'],
          'unavailable',
          'The agent could not be reached.',
          at,
        );
        if (failed && opts.releaseKey && failed.idempotencyKey !== null) {
          await tx.update(I).set({ idempotencyKey: null }).where(eq(I.id, failed.id));
        }
      });
      this.ctx.poke();
      return 'failed';
    }
    // Forwarded: whatever happened to the invocation since (a fast answer, a
    // cancel), this is true and reported once, by the instance that moved it.
    await this.ctx.db.transaction(async (tx) => {
      const [w] = await tx.select({ id: W.externalId }).from(W).where(eq(W.id, inv.workspaceId));
      await emit(
        tx,
        inv.projectId,
        'exec.dispatched',
        {
          invocation_id: inv.externalId,
          tool_name: inv.tool,
          workspace_id: w!.id,
          agent_id: agent.agentExternalId,
          risk: inv.risk,
          dispatched_at: now.toISOString(),
        },
        new Date(this.ctx.clock.now()),
      );
    });
    this.ctx.poke();
    // Ended by the router while the dispatch was on its way (a cancel, a force-fail):
    // its CANCEL may have reached the agent before the DISPATCH, which the agent
    // would then run. Tell it again. (`duration_ms` is set only by an agent's answer.)
    const latest = await this.row(inv.projectId, inv.id);
    if (isTerminal(latest.status) && latest.durationMs === null) await this.cancelOnAgent(latest);
    return 'dispatched';
  }

  /**
   * Dispatches a queued invocation to a connected agent, if there is one now. False
   * when no agent offering the tool is connected here at all (the scheduler then
   * skips the tool's other queued invocations of the project for the rest of its pass).
   */
  async dispatchQueued(inv: InvocationRow): Promise<boolean> {
    const t = this.ctx.transport();
    if (!t) return false;
    const offering = (await this.catalog.candidates(inv.projectId, inv.tool)).filter((c) =>
      connected(t, c),
    );
    // Another agent may take it, but only one whose declaration of the tool needs no
    // approval this invocation lacks, whose own schema accepts its arguments and, for
    // one made over MCP, that makes the tool MCP-visible.
    const candidates = offering.filter((c) => mayRun(c, inv));
    const agent = candidates.find((c) => c.agentId === inv.agentId) ?? candidates[0];
    if (agent) await this.dispatch(inv, agent);
    return offering.length > 0;
  }

  private async row(projectId: string, id: string): Promise<InvocationRow> {
    const [i] = await this.ctx.db
      .select()
      .from(I)
      .where(and(eq(I.projectId, projectId), eq(I.id, id)))
      .limit(1);
    if (!i) throw new ServiceError('invocation_not_found', { param: 'invocation_id' });
    return i;
  }

  /** By external id, in the caller's project only (another project's id is simply not found). */
  async rowByExternal(projectId: string, id: string): Promise<InvocationRow> {
    const [i] = /^inv_[0-9a-f]{1,64}$/.test(id)
      ? await this.ctx.db
          .select()
          .from(I)
          .where(and(eq(I.projectId, projectId), eq(I.externalId, id)))
          .limit(1)
      : [];
    if (!i) throw new ServiceError('invocation_not_found', { param: 'invocation_id' });
    return i;
  }

  async get(projectId: string, id: string) {
    return this.view(await this.rowByExternal(projectId, id));
  }

  async list(projectId: string, query: unknown) {
    const q = parseBody(listQuery, query ?? {});
    let wsId: string | undefined;
    if (q.workspace_id !== undefined) {
      wsId = (await this.workspaces.resolve(projectId, q.workspace_id)).id;
    }
    const cursor = await afterCursor(this.ctx.db, I, projectId, q.after);
    const rows = await this.ctx.db
      .select()
      .from(I)
      .where(
        and(
          eq(I.projectId, projectId),
          q.status ? eq(I.status, q.status) : undefined,
          wsId ? eq(I.workspaceId, wsId) : undefined,
          q.tool ? eq(I.tool, q.tool) : undefined,
          cursor,
        ),
      )
      .orderBy(desc(I.createdAt), desc(I.id))
      .limit(q.limit + 1);
    const data = [];
    for (const r of rows) data.push(await this.view(r));
    return page(data, q.limit);
  }

  /**
   * Cancel: any non-terminal invocation becomes `cancelled` at once (error
   * `cancelled`); a pending approval expires; a dispatched or running tool is
   * killed on its agent (best effort; its later answer changes nothing).
   * Terminal → `invocation_terminal` 409.
   */
  async cancel(projectId: string, id: string) {
    const { inv, moved } = await this.endLive(projectId, id, {
      transition: cancel,
      code: 'cancelled',
      message: 'Invocation cancelled before completion.',
      attempts: 3,
      terminal: (status) =>
        new ServiceError('invocation_terminal', {
          message: `The invocation is already ${status}.`,
        }),
      busy: () => unavailable('The invocation is changing state; retry.'),
    });
    if ((inv.status === 'dispatched' || inv.status === 'running') && inv.agentId) {
      await this.cancelOnAgent(inv);
    }
    return this.view(moved);
  }

  /**
   * Ends a live invocation with `transition` (cancel or fail), an update conditional on
   * the status read, expiring its pending approval. One that moved on meanwhile
   * (queued → dispatched → running) is read again, so only a terminal record gets
   * `terminal`; still moving after `attempts` reads, `busy`.
   */
  private async endLive(
    projectId: string,
    id: string,
    o: {
      transition: typeof fail;
      code: string;
      message: string;
      attempts: number;
      terminal: (status: string) => ServiceError;
      busy: () => ServiceError;
    },
  ): Promise<{ inv: InvocationRow; moved: InvocationRow }> {
    for (let attempt = 0; attempt < o.attempts; attempt++) {
      const inv = await this.rowByExternal(projectId, id);
      if (isTerminal(inv.status)) throw o.terminal(inv.status);
      const now = new Date(this.ctx.clock.now());
      const moved = await this.ctx.db.transaction(async (tx) => {
        // The approval's row before the invocation's, the order of a decision
        // (approvals.ts): a cancel and an approve of one invocation at the same time
        // would otherwise each hold the row the other waits for (a PostgreSQL deadlock).
        if (inv.status === 'pending_approval') await this.approvals().lockFor(tx, inv.id);
        const m = await o.transition(
          tx,
          inv,
          [inv.status as (typeof NON_TERMINAL)[number]],
          o.code,
          o.message,
          now,
        );
        if (m && inv.status === 'pending_approval') {
          await this.approvals().expireFor(tx, inv.id, now);
        }
        return m;
      });
      if (moved) return { inv, moved };
    }
    throw o.busy();
  }

  /**
   * Invocations whose CANCEL this instance's transport accepted, so the scheduler's
   * delivery step (scheduler.ts) does not send it again.
   */
  readonly cancelsSent = new LRUCache<string, true>({ max: 4096 });

  async cancelOnAgent(inv: InvocationRow): Promise<void> {
    const t = this.ctx.transport();
    if (!t || !inv.agentId) return;
    const [a] = await this.ctx.db.select({ id: A.externalId }).from(A).where(eq(A.id, inv.agentId));
    if (!a) return;
    await this.sendCancel(t, a.id, inv.externalId);
  }

  /** One CANCEL through `t`; remembered once accepted. */
  async sendCancel(t: AgentTransport, agentId: string, invocationId: string): Promise<void> {
    try {
      await t.cancel(agentId, invocationId);
      this.cancelsSent.set(invocationId, true);
    } catch (err) {
      // Another instance's broker may hold the agent's session: its scheduler delivers it.
      this.ctx.logger.warn({ err, invocation: invocationId }, 'exec cancel not delivered');
    }
  }

  /**
   * The outcome of a terminal invocation: 200 for completed and failed ones
   * (exit code, output, error), 499 `cancelled` for cancelled ones, 409
   * `invalid_state` while it is not terminal yet.
   */
  async result(projectId: string, id: string) {
    const inv = await this.rowByExternal(projectId, id);
    if (!isTerminal(inv.status)) {
      throw new ServiceError('invalid_state', {
        message: `The invocation is ${inv.status}; its result is not available yet.`,
      });
    }
    if (inv.status === 'cancelled') {
      throw new ServiceError('cancelled', {
        message: inv.errorMessage ?? 'Invocation cancelled before completion.',
      });
    }
    return {
      object: 'invocation.result' as const,
      invocation_id: inv.externalId,
      status: inv.status,
      exit_code: inv.exitCode,
      duration_ms: inv.durationMs,
      stdout: inv.stdout ?? '',
      stderr: inv.stderr ?? '',
      output_truncated: inv.outputTruncated === 1,
      error: inv.errorCode ? { code: inv.errorCode, message: inv.errorMessage ?? '' } : null,
    };
  }

  /**
   * Operator maintenance: force a stuck invocation to `failed` (`exec.failed`,
   * error `operator_failed`). Already terminal → `already_terminal` 400; still
   * changing state after 5 reads → `invalid_state` 409 (`endLive`).
   */
  async forceFail(projectId: string, id: string, reason: string) {
    const { inv, moved } = await this.endLive(projectId, id, {
      transition: fail,
      code: 'operator_failed',
      message: reason || 'Failed by an operator.',
      attempts: 5,
      terminal: (status) =>
        new ServiceError('already_terminal', { message: `The invocation is already ${status}.` }),
      busy: () =>
        new ServiceError('invalid_state', {
          message: 'The invocation kept changing state; try again.',
        }),
    });
    this.ctx.poke();
    if (inv.status === 'dispatched' || inv.status === 'running') await this.cancelOnAgent(inv);
    return this.view(moved);
  }
}

/**
 * Arguments nest at most this deep: hashing them (canonical.ts), validating them and
 * storing them all walk the value, and a body of a few KB could nest thousands of
 * levels (a 500 from a stack overflow, before this check).
 */
const MAX_ARGUMENT_DEPTH = 64;

/** True when `value` has arrays or objects nested more than `max` levels. */
function nestedDeeperThan(value: unknown, max: number): boolean {
  // An explicit stack, not recursion: the value may be nested thousands of levels deep.
  const stack: Array<[unknown, number]> = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (v === null || typeof v !== 'object') continue;
    if (depth > max) return true;
    for (const child of Object.values(v)) stack.push([child, depth + 1]);
  }
  return false;
}

/**
 * May agent `c` run an invocation created with `risk` and these arguments, on this
 * surface? Its own declaration of the tool must not need an approval the invocation
 * did not get (`destructive` where it was created lower), must be `mcp_visible` for
 * one created over MCP, and its own schema must accept the arguments: agents of one
 * project may declare a tool of the same name differently.
 */
function mayRun(c: Candidate, inv: { risk: string; arguments: unknown; surface: string }): boolean {
  if (c.spec.risk === 'destructive' && inv.risk !== 'destructive') return false;
  if (inv.surface === 'mcp' && !c.spec.mcp_visible) return false;
  return checkArguments(c.manifestHash, c.spec, inv.arguments) === null;
}

/** Connected to this broker over a session of the agent's current key. */
function connected(t: AgentTransport, c: Candidate): boolean {
  return t.isConnected(c.agentExternalId, c.agentKey);
}

function unavailable(message: string): ServiceError {
  return new ServiceError('unavailable', { message, headers: { 'Retry-After': '1' } });
}
