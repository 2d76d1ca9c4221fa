/**
 * Exec test support: a fake in-memory AgentTransport, a project with
 * management and execution keys, agents enrolled through the AgentDirectory
 * (standing in for `switchyard agent`), and the project's events read back
 * from the outbox with every active payload checked against the catalogue.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { asc, eq } from 'drizzle-orm';
import { ACTIVE_PAYLOADS, eventStatus, type ActiveType } from '../../src/events/catalogue.js';
import type { AgentTransport, DispatchRequest, ToolSpec } from '../../src/exec/contracts.js';
import { tables } from '../../src/store/index.js';
import { seedProject, type Res, type TestServer } from '../support/harness.js';

export class FakeTransport implements AgentTransport {
  readonly serverPublicKey = 'rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7';
  readonly endpoints = { enroll: 'tcp://127.0.0.1:7601', agents: 'tcp://127.0.0.1:7602' };
  connected = new Set<string>();
  dispatched: Array<{ agentId: string; req: DispatchRequest }> = [];
  cancelled: Array<{ agentId: string; invocationId: string }> = [];
  refuse = false;
  isConnected(agentId: string): boolean {
    return this.connected.has(agentId);
  }
  async dispatch(agentId: string, req: DispatchRequest): Promise<void> {
    if (this.refuse || !this.connected.has(agentId)) throw new Error('agent not connected');
    // What goes on the wire: the key only picks the session.
    const wire = { ...req };
    delete wire.agentKey;
    this.dispatched.push({ agentId, req: wire });
  }
  async cancel(agentId: string, invocationId: string): Promise<void> {
    this.cancelled.push({ agentId, invocationId });
  }
  async close(): Promise<void> {}
}

/** A random Z85-looking CURVE public key (40 characters of the Z85 alphabet). */
export function curveKey(): string {
  const alphabet =
    '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#';
  return Array.from(randomBytes(40), (b) => alphabet[b % 85]).join('');
}

export function tool(name: string, over: Partial<ToolSpec> = {}): ToolSpec {
  return {
    name,
    description: `The ${name} tool.`,
    input_schema: {
      type: 'object',
      properties: { path: { type: 'string' }, count: { type: 'integer', minimum: 0 } },
      required: ['path'],
      additionalProperties: false,
    },
    risk: 'low',
    mcp_visible: true,
    default_timeout_ms: 30_000,
    ...over,
  };
}

export function manifest(...tools: ToolSpec[]) {
  return { version: 1 as const, tools };
}

export interface ExecProject {
  projectId: string;
  projectUuid: string;
  slug: string;
  exec: string;
  mgmt: string;
  inference: string;
}

/**
 * The keys' quotas are far above the spec's default 60 a minute: these tests make more
 * requests than that on the fake clock's frozen minute, and the quota is tested in
 * test/limits, not here.
 */
const QUOTA = 100_000;

export async function seedExecProject(s: TestServer, slug: string): Promise<ExecProject> {
  const p = await seedProject(s, { slug, scopes: ['execution'], quotaRequests: QUOTA });
  const m = await s.admin('POST', `/projects/${slug}/keys`, {
    scopes: ['management'],
    quotaRequests: QUOTA,
  });
  const i = await s.admin('POST', `/projects/${slug}/keys`, {
    scopes: ['inference'],
    quotaRequests: QUOTA,
  });
  const proj = await s.admin('GET', `/projects/${slug}`);
  return {
    projectId: p.projectId,
    projectUuid: String(proj.body.uuid),
    slug,
    exec: p.key,
    mgmt: String(m.body.key),
    inference: String(i.body.key),
  };
}

export async function joinKey(
  s: TestServer,
  p: ExecProject,
  body: Record<string, unknown> = {},
): Promise<string> {
  const r = await s.call('POST', `/${p.projectId}/v1/join_keys`, { key: p.mgmt, body });
  assert.equal(r.status, 201, r.text);
  return String(r.body.key);
}

/** Enrolls an agent through the directory, as the broker would; marks it connected. */
export async function enrollAgent(
  s: TestServer,
  p: ExecProject,
  opts: { name: string; tools: ToolSpec[]; transport?: FakeTransport; key?: string; jk?: string },
) {
  const r = await s.services.exec.enroll({
    joinKey: opts.jk ?? (await joinKey(s, p)),
    registrationName: opts.name,
    curvePublicKey: opts.key ?? curveKey(),
    manifest: manifest(...opts.tools),
  });
  assert.equal(r.ok, true, JSON.stringify(r));
  if (!r.ok) throw new Error('enroll failed');
  opts.transport?.connected.add(r.agentId);
  return r;
}

export interface Evt {
  id: string;
  type: string;
  created_at: number;
  data: Record<string, unknown>;
}

/** All events of a project; active payloads are parsed with the catalogue (strictly). */
export async function events(s: TestServer, projectUuid: string, type?: string): Promise<Evt[]> {
  const rows = await s.services.store.db
    .select()
    .from(tables.events)
    .where(eq(tables.events.projectId, projectUuid))
    .orderBy(asc(tables.events.createdAt));
  const out: Evt[] = [];
  for (const r of rows) {
    const e = JSON.parse(r.body) as Evt & { object: string };
    assert.equal(e.object, 'event');
    assert.match(e.id, /^evt_[0-9a-f]{24}$/);
    assert.equal(e.type, r.type);
    const status = eventStatus(e.type);
    assert.ok(status && status !== 'reserved', `emitted ${e.type}`);
    if (status === 'active') {
      const schema = ACTIVE_PAYLOADS[e.type as ActiveType];
      // Exactly the spec's fields: strict parse.
      schema.strict().parse(e.data);
    }
    if (!type || e.type === type) out.push(e);
  }
  return out;
}

export function expectError(
  r: Res,
  status: number,
  code: string,
  opts: { type?: string; param?: string | null } = {},
): Record<string, unknown> {
  assert.equal(r.status, status, r.text);
  const err = r.body.error as Record<string, unknown>;
  assert.equal(err.code, code, r.text);
  assert.equal(typeof err.message, 'string');
  assert.ok('param' in err && 'type' in err);
  if (opts.type) assert.equal(err.type, opts.type);
  if (opts.param !== undefined) assert.equal(err.param, opts.param);
  return err;
}

export async function workspace(s: TestServer, p: ExecProject): Promise<string> {
  const r = await s.call('POST', `/${p.projectId}/v1/exec/workspaces`, {
    key: p.exec,
    body: { name: 'w' },
  });
  assert.equal(r.status, 201, r.text);
  return String(r.body.id);
}
