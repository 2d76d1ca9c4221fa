/**
 * The tools catalog: the tools of the project's online agents (enrolled, not
 * deleted, lease current). Several agents may offer the same tool name; the
 * catalog lists it once with every agent offering it, described by the most
 * recently enrolled one. Picking an agent for an invocation prefers agents the
 * transport has a session with, then the fewest invocations in flight.
 */
import { and, desc, eq, inArray, sql } from 'drizzle-orm';
import { tables } from '../store/index.js';
import type { Manifest, ToolSpec } from './contracts.js';
import { onlineAgent, type ExecContext } from './context.js';

const { agents: A, invocations: I } = tables;

export interface Candidate {
  agentId: string;
  agentExternalId: string;
  manifestHash: string;
  spec: ToolSpec;
  /** The agent's CURVE key now (a session of another key is not this agent's). */
  agentKey: string;
}

export interface CatalogEntry {
  spec: ToolSpec;
  agents: string[];
}

export class Catalog {
  constructor(private readonly ctx: ExecContext) {}

  private async online(projectId: string) {
    const now = new Date(this.ctx.clock.now());
    return this.ctx.db
      .select({
        id: A.id,
        externalId: A.externalId,
        manifest: A.manifest,
        manifestHash: A.manifestHash,
        curvePublicKey: A.curvePublicKey,
      })
      .from(A)
      .where(and(eq(A.projectId, projectId), onlineAgent(now)))
      .orderBy(desc(A.enrolledAt), desc(A.id));
  }

  async list(projectId: string): Promise<CatalogEntry[]> {
    const byName = new Map<string, CatalogEntry>();
    for (const a of await this.online(projectId)) {
      for (const spec of (a.manifest as unknown as Manifest).tools) {
        const e = byName.get(spec.name);
        if (e) e.agents.push(a.externalId);
        else byName.set(spec.name, { spec, agents: [a.externalId] });
      }
    }
    return [...byName.values()].sort((x, y) => (x.spec.name < y.spec.name ? -1 : 1));
  }

  async get(projectId: string, name: string): Promise<CatalogEntry | null> {
    return (await this.list(projectId)).find((e) => e.spec.name === name) ?? null;
  }

  /** Online agents offering `tool`, best first. */
  async candidates(projectId: string, tool: string): Promise<Candidate[]> {
    const found: Candidate[] = [];
    for (const a of await this.online(projectId)) {
      const spec = (a.manifest as unknown as Manifest).tools.find((t) => t.name === tool);
      if (spec) {
        found.push({
          agentId: a.id,
          agentExternalId: a.externalId,
          manifestHash: a.manifestHash,
          spec,
          agentKey: a.curvePublicKey,
        });
      }
    }
    if (found.length < 2) return found;
    const load = new Map<string, number>();
    const rows = await this.ctx.db
      .select({ agentId: I.agentId, n: sql<number>`count(*)::int` })
      .from(I)
      .where(
        and(
          inArray(
            I.agentId,
            found.map((c) => c.agentId),
          ),
          inArray(I.status, ['dispatched', 'running']),
        ),
      )
      .groupBy(I.agentId);
    for (const r of rows) if (r.agentId) load.set(r.agentId, r.n);
    const t = this.ctx.transport();
    const connected = (c: Candidate) => (t?.isConnected(c.agentExternalId, c.agentKey) ? 0 : 1);
    return found.sort(
      (x, y) =>
        connected(x) - connected(y) || (load.get(x.agentId) ?? 0) - (load.get(y.agentId) ?? 0),
    );
  }

  /**
   * Can `tool` run now? (The tool bridge's check.) With a broker here: an online
   * agent offering it is connected to it. Without one (an API-only instance): an
   * online agent offers it, and the broker instance holding its session runs it.
   */
  async available(projectId: string, tool: string): Promise<boolean> {
    const t = this.ctx.transport();
    const found = await this.candidates(projectId, tool);
    return t ? found.some((c) => t.isConnected(c.agentExternalId, c.agentKey)) : found.length > 0;
  }
}

export function publicTool(e: CatalogEntry) {
  return {
    object: 'exec.tool' as const,
    name: e.spec.name,
    description: e.spec.description,
    input_schema: e.spec.input_schema,
    risk: e.spec.risk,
    requires_approval: e.spec.risk === 'destructive',
    mcp_visible: e.spec.mcp_visible,
    default_timeout_ms: e.spec.default_timeout_ms,
    agents: e.agents,
  };
}
