/**
 * End-to-end test of the execution surface (issue 6, "Done when"): real
 * `switchyard agent` processes (bin/switchyard.js over dist/, built before the
 * tests) talking ZeroMQ with CURVE to the router's exec broker, tools that are
 * small shell scripts, and every `exec.*` event checked where a subscriber
 * sees it: a local HTTPS webhook receiver, each delivery's signature verified
 * with the spec's scheme (hex HMAC-SHA256 over `<timestamp>.<raw body>`,
 * constant-time compare, 5-minute window), the envelope and payload checked
 * field by field against the spec's tables.
 *
 * 1. A real `switchyard serve` process (short lease through
 *    SWITCHYARD_EXEC_LEASE_MS, 100 ms scheduler tick) and two agents, alpha
 *    and beta: enrollment (`exec.agent_enrolled`, `manifest_hash` = SHA-256 of
 *    the canonical manifest, the catalog listing both agents), the three
 *    enrollment protocol codes (the agent prints the code and exits 3), a tool
 *    run (`exec.dispatched` + `exec.completed`) and a failing one
 *    (`exec.failed`), timeout (`exec.timeout`, the tool process killed),
 *    cancel (the tool process killed, `invocation_terminal` afterwards),
 *    idempotency replay (the tool ran once) and conflict, approve and reject
 *    by a user (`exec.approval_requested` also checked with the re-emitter's
 *    `verifyApprovalRequestedSignature`), and beta SIGKILLed mid-invocation →
 *    lease expiry → `exec.agent_offline` + `exec.failed`, its tool's process
 *    group ended by its reaper (restarted with its
 *    identity file, beta is back online without enrolling again). Finally
 *    every delivery record of the router is `delivered` and reached the
 *    receiver.
 * 2. The in-process router on a FakeClock (so stage deadlines are exact),
 *    with the real broker and a third real agent: an approval escalates at its
 *    stage deadline (not a millisecond before), is approved by a user the new
 *    stage allows (an approver is refused) and the tool runs; another
 *    escalates and then times out (`exec.approval_timed_out`, the invocation
 *    cancelled).
 *
 * Every child process (router, agents, tools left behind by a killed agent)
 * is killed in `after`, also when a test fails.
 */
import assert from 'node:assert/strict';
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { once } from 'node:events';
import { existsSync, readFileSync, readdirSync, writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Broker, CurveKeyPair } from '../../src/exec/broker/index.js';
import { verifyApprovalRequestedSignature } from '../../src/exec/signature.js';
import {
  ADMIN_TOKEN,
  http,
  startTestServer,
  type Res,
  type TestServer,
} from '../support/harness.js';
import { startReceiver, type Receiver, type ReceivedRequest } from '../support/https-receiver.js';
import { spawnSwitchyard, type Spawned } from '../support/process.js';
import { startTestBroker, tempDir } from '../exec-transport/support.js';
import { seedExecProject, type ExecProject } from './support.js';

// ---------------------------------------------------------------------------
// Spec: the exec.* event types and their exact payload fields.

const ACTIVE_EXEC = {
  'exec.dispatched': [
    'invocation_id',
    'tool_name',
    'workspace_id',
    'agent_id',
    'risk',
    'dispatched_at',
  ],
  'exec.completed': ['invocation_id', 'status', 'duration_ms', 'exit_code', 'completed_at'],
  'exec.failed': ['invocation_id', 'error_code', 'error_message', 'failed_at'],
  'exec.timeout': ['invocation_id', 'timeout_ms', 'elapsed_ms', 'timed_out_at'],
  'exec.approval_requested': [
    'invocation_id',
    'approval_id',
    'tool_name',
    'risk',
    'workspace_id',
    'requested_at',
  ],
  'exec.approved': ['invocation_id', 'approval_id', 'decided_by', 'approved_at'],
  'exec.rejected': ['invocation_id', 'approval_id', 'reason', 'rejected_at'],
  'exec.approval_escalated': ['invocation_id', 'approval_id', 'stage', 'target', 'escalated_at'],
  'exec.approval_timed_out': ['invocation_id', 'approval_id', 'timed_out_at'],
  'exec.agent_enrolled': [
    'agent_id',
    'registration_name',
    'project_id',
    'manifest_hash',
    'enrolled_at',
  ],
  'exec.agent_offline': ['invocation_id', 'agent_id', 'reason', 'detected_at'],
} as const;
type ExecType = keyof typeof ACTIVE_EXEC;
const RESERVED_EXEC = [
  'exec.ambiguous',
  'exec.discovery_pending',
  'exec.workspace_created',
  'exec.workspace_budget_exhausted',
];
/** Subscribed: every exec.* type, reserved ones included (they must never fire). */
const ALL_EXEC = [...Object.keys(ACTIVE_EXEC), ...RESERVED_EXEC];
const INTEGER_FIELDS = new Set(['duration_ms', 'exit_code', 'timeout_ms', 'elapsed_ms']);
const ID_FORMS: Record<string, RegExp> = {
  invocation_id: /^inv_[0-9a-f]+$/,
  approval_id: /^app_[0-9a-f]+$/,
  workspace_id: /^ws_[0-9a-f]+$/,
  agent_id: /^agt_[0-9a-f]+$/,
  decided_by: /^usr_[0-9a-f]+$/,
  project_id: /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/,
  manifest_hash: /^[0-9a-f]{64}$/,
};
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/;

interface Delivered {
  id: string;
  type: string;
  createdAt: number;
  data: Record<string, unknown>;
  request: ReceivedRequest;
}

/** The spec's signature check, written out here (not the implementation's). */
function assertSignature(secret: string, r: ReceivedRequest, nowSeconds: number): void {
  const ts = r.headers['x-webhook-timestamp'] ?? '';
  const sig = r.headers['x-webhook-signature'] ?? '';
  assert.match(ts, /^\d{1,15}$/, 'X-Webhook-Timestamp');
  const m = /^sha256=([0-9a-f]{64})$/.exec(sig);
  assert.ok(m, `X-Webhook-Signature ${sig}`);
  const mac = (body: string) =>
    createHmac('sha256', Buffer.from(secret, 'utf8')).update(`${ts}.${body}`, 'utf8').digest();
  const given = Buffer.from(m[1]!, 'hex');
  assert.ok(timingSafeEqual(given, mac(r.body)), `valid signature on ${r.body.slice(0, 80)}`);
  // The check has teeth: one changed byte of the body does not verify.
  assert.ok(!timingSafeEqual(given, mac(r.body.replace(/"data":\{/, '"data": {'))));
  assert.ok(Math.abs(nowSeconds - Number(ts)) <= 300, 'timestamp inside the 5-minute window');
}

/** Envelope and payload exactly as the spec's tables give them. */
function assertEvent(e: Record<string, unknown>): void {
  assert.deepEqual(Object.keys(e).sort(), ['created_at', 'data', 'id', 'object', 'type']);
  assert.match(String(e.id), /^evt_[0-9a-f]{24}$/);
  assert.equal(e.object, 'event');
  assert.ok(Number.isInteger(e.created_at), 'created_at is Unix seconds');
  const type = String(e.type);
  assert.ok(!RESERVED_EXEC.includes(type), `reserved ${type} delivered`);
  const fields = ACTIVE_EXEC[type as ExecType];
  assert.ok(fields, `unexpected type ${type}`);
  const data = e.data as Record<string, unknown>;
  assert.deepEqual(Object.keys(data).sort(), [...fields].sort(), `${type} payload fields`);
  for (const [k, v] of Object.entries(data)) {
    if (INTEGER_FIELDS.has(k)) assert.ok(Number.isInteger(v), `${type}.${k} integer`);
    else assert.equal(typeof v, 'string', `${type}.${k} string`);
    if (k.endsWith('_at')) assert.match(String(v), ISO, `${type}.${k} ISO 8601`);
    const form = ID_FORMS[k];
    if (form) assert.match(String(v), form, `${type}.${k}`);
  }
}

/** What a webhook receiver got, verified and deduplicated on the envelope id. */
class Hooks {
  private seen = 0;
  readonly events = new Map<string, Delivered>();
  secret = '';

  constructor(
    readonly rx: Receiver,
    private readonly nowSeconds: () => number,
    /** Drives delivery when no dispatcher runs on its own (fake clock). */
    private readonly pump: () => Promise<unknown> = async () => undefined,
  ) {}

  collect(): Delivered[] {
    for (; this.seen < this.rx.received.length; this.seen++) {
      const r = this.rx.received[this.seen]!;
      assert.equal(r.headers['content-type'], 'application/json');
      assert.match(r.headers['x-webhook-id'] ?? '', /^del_/);
      assertSignature(this.secret, r, this.nowSeconds());
      const e = JSON.parse(r.body) as Record<string, unknown>;
      assertEvent(e);
      const prior = this.events.get(String(e.id));
      if (prior) assert.equal(prior.request.body, r.body, 'a redelivery carries the same bytes');
      else
        this.events.set(String(e.id), {
          id: String(e.id),
          type: String(e.type),
          createdAt: Number(e.created_at),
          data: e.data as Record<string, unknown>,
          request: r,
        });
    }
    return [...this.events.values()];
  }

  of(type: ExecType, match: Record<string, unknown> = {}): Delivered[] {
    return this.collect().filter(
      (d) => d.type === type && Object.entries(match).every(([k, v]) => d.data[k] === v),
    );
  }

  async one(type: ExecType, match: Record<string, unknown>, timeoutMs = 10_000) {
    return until(
      `${type} ${JSON.stringify(match)} at the webhook receiver`,
      async () => {
        await this.pump();
        const found = this.of(type, match);
        assert.ok(found.length <= 1, `${type} delivered once: ${JSON.stringify(match)}`);
        return found[0];
      },
      timeoutMs,
    );
  }
}

/** Polls `check` until it returns something other than undefined/false, or fails. */
async function until<T>(
  what: string,
  check: () => Promise<T | undefined | false> | T | undefined | false,
  timeoutMs = 10_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Canonical JSON (RFC 8785 style: keys sorted, no whitespace), independent of the router's. */
function canonical(v: unknown): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  const o = v as Record<string, unknown>;
  return `{${Object.keys(o)
    .sort()
    .filter((k) => o[k] !== undefined)
    .map((k) => `${JSON.stringify(k)}:${canonical(o[k])}`)
    .join(',')}}`;
}

function errorOf(r: Res, status: number, code: string): Record<string, unknown> {
  assert.equal(r.status, status, r.text);
  const e = r.body.error as Record<string, unknown>;
  assert.equal(e.code, code, r.text);
  return e;
}

// ---------------------------------------------------------------------------
// Manifests: small shell tools. A long-running tool writes its pid (= its
// process group: the agent starts each tool in a group of its own) to
// PIDDIR/<invocation id>, so the test can watch it die and kill what a killed
// agent leaves behind.

interface ToolDecl {
  name: string;
  description: string;
  input_schema: Record<string, unknown>;
  risk: string;
  mcp_visible: boolean;
  default_timeout_ms: number;
}
type FileTool = ToolDecl & { command: string[]; env?: Record<string, string> };

const sh = (script: string) => ['sh', '-c', script];
const HANG = 'echo $$ > "$PIDDIR/$SWITCHYARD_INVOCATION_ID"; exec sleep 30';

function declared(t: FileTool): ToolDecl {
  const { command: _c, env: _e, ...rest } = t;
  return rest;
}

function writeManifest(path: string, tools: FileTool[]): string {
  writeFileSync(path, JSON.stringify({ version: 1, tools }));
  return path;
}

const isAlive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** Kills the process groups of tools that wrote pid files and still run (best effort). */
function killTools(pidDir: string): void {
  if (!existsSync(pidDir)) return;
  for (const f of readdirSync(pidDir)) {
    const pid = Number(readFileSync(join(pidDir, f), 'utf8').trim());
    let cmd = '';
    try {
      cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    } catch {
      continue; // gone (or no /proc): nothing to kill, and never a reused pid
    }
    if (Number.isInteger(pid) && pid > 1 && cmd.startsWith('sleep\0')) {
      try {
        process.kill(-pid, 'SIGKILL');
      } catch {
        // gone already
      }
    }
  }
}

// ---------------------------------------------------------------------------

describe('exec end to end: switchyard serve and two switchyard agent processes', () => {
  const tmp = tempDir('swy-exec-e2e-');
  const pidDir = join(tmp.dir, 'pids');
  const runsLog = join(tmp.dir, 'runs.log');
  const children: Spawned[] = [];
  let server: Spawned;
  let rx: Receiver;
  let hooks: Hooks;
  let base = '';
  let broker = { enroll: '', agents: '', key: '' };
  let projectId = '';
  let projectUuid = '';
  let execKey = '';
  let mgmtKey = '';
  let webhookId = '';
  let ws = '';
  let joinKey = '';
  let reservingKey = '';
  let approver = { id: '', token: '' };
  const agentIds: Record<string, string> = {};
  const manifests: Record<string, FileTool[]> = {};
  let alpha: Spawned;
  let beta: Spawned;

  const admin = (method: string, path: string, body?: unknown) =>
    http(method, `${base}/admin/v1${path}`, { auth: `Bearer ${ADMIN_TOKEN}`, body });
  const api = (
    method: string,
    path: string,
    key: string,
    body?: unknown,
    headers?: Record<string, string>,
  ) =>
    http(method, `${base}/${projectId}/v1${path}`, {
      auth: `Bearer ${key}`,
      body,
      ...(headers ? { headers } : {}),
    });
  const invoke = (body: Record<string, unknown>, headers?: Record<string, string>) =>
    api('POST', '/exec/invocations', execKey, { workspace_id: ws, ...body }, headers);
  const getInv = async (id: string) => {
    const r = await api('GET', `/exec/invocations/${id}`, execKey);
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  const invWhere = (id: string, what: string, pred: (b: Record<string, unknown>) => boolean) =>
    until(
      `${id} ${what}`,
      async () => {
        const b = await getInv(id);
        return pred(b) ? b : undefined;
      },
      15_000,
    );
  const pidOf = (inv: string) =>
    until(`pid file of ${inv}`, () => {
      const f = join(pidDir, inv);
      const t = existsSync(f) ? readFileSync(f, 'utf8').trim() : '';
      return t ? Number(t) : undefined;
    });
  const agentEnv = (o: { name: string; manifest: string; keyFile: string; joinKey?: string }) => ({
    SWITCHYARD_AGENT_ENROLL_ENDPOINT: broker.enroll,
    SWITCHYARD_AGENT_ENDPOINT: broker.agents,
    SWITCHYARD_AGENT_SERVER_KEY: broker.key,
    SWITCHYARD_AGENT_NAME: o.name,
    SWITCHYARD_AGENT_MANIFEST: o.manifest,
    SWITCHYARD_AGENT_KEY_FILE: o.keyFile,
    ...(o.joinKey ? { SWITCHYARD_AGENT_JOIN_KEY: o.joinKey } : {}),
    SWITCHYARD_AGENT_RECONNECT_MIN_MS: '50',
    SWITCHYARD_AGENT_RECONNECT_MAX_MS: '500',
    SWITCHYARD_AGENT_KILL_GRACE_MS: '300',
    LOG_LEVEL: 'info',
  });
  const spawnAgent = (o: Parameters<typeof agentEnv>[0]) => {
    const p = spawnSwitchyard(['agent'], agentEnv(o));
    children.push(p);
    return p;
  };

  before(async () => {
    mkdirSync(pidDir);
    rx = await startReceiver();
    hooks = new Hooks(rx, () => Math.floor(Date.now() / 1000));
    server = spawnSwitchyard(['serve'], {
      SWITCHYARD_DATA_DIR: join(tmp.dir, 'data'),
      PORT: '0',
      SWITCHYARD_DEMO: '0',
      LOG_LEVEL: 'warn',
      SWITCHYARD_ADMIN_TOKEN: ADMIN_TOKEN,
      SWITCHYARD_EXEC_LEASE_MS: '3000',
      SWITCHYARD_EXEC_TICK_MS: '100',
      SWITCHYARD_WEBHOOK_ALLOW_CIDRS: '127.0.0.0/8',
      SWITCHYARD_WEBHOOK_CA_FILE: rx.caFile,
    });
    children.push(server);
    base = (await server.waitFor(/Switchyard listening on (http:\/\/\S+)/))[1]!;
    const [, enroll, agents] = await server.waitFor(
      /Exec broker: enroll (tcp:\/\/127\.0\.0\.1:\d+)\s+agents (tcp:\/\/127\.0\.0\.1:\d+)/,
    );
    const [, key] = await server.waitFor(/Exec broker server key: (\S{40})/);
    broker = { enroll: enroll!, agents: agents!, key: key! };

    const p = await admin('POST', '/projects', { slug: 'e2e', name: 'Exec e2e' });
    assert.equal(p.status, 201, p.text);
    projectId = String(p.body.id);
    projectUuid = String((await admin('GET', '/projects/e2e')).body.uuid);
    for (const scope of ['execution', 'management']) {
      // The test polls invocations far past the spec's default quota of 60 a minute.
      const k = await admin('POST', '/projects/e2e/keys', {
        scopes: [scope],
        quotaRequests: 100_000,
      });
      assert.equal(k.status, 201, k.text);
      if (scope === 'execution') execKey = String(k.body.key);
      else mgmtKey = String(k.body.key);
    }
    // The broker the API announces is the one the banner printed.
    const b = await api('GET', '/exec/broker', mgmtKey);
    assert.equal(b.status, 200, b.text);
    assert.equal(b.body.server_public_key, broker.key);
    assert.deepEqual(b.body.endpoints, { enroll: broker.enroll, agents: broker.agents });
    assert.equal(b.body.lease_ms, 3000);

    const w = await api('POST', '/webhooks', mgmtKey, { url: rx.url, events: ALL_EXEC });
    assert.equal(w.status, 201, w.text);
    hooks.secret = String(w.body.secret);
    webhookId = String(w.body.id);
    const wsr = await api('POST', '/exec/workspaces', execKey, { name: 'e2e' });
    assert.equal(wsr.status, 201, wsr.text);
    ws = String(wsr.body.id);
    const jk = await api('POST', '/join_keys', mgmtKey, { name: 'fleet' });
    assert.equal(jk.status, 201, jk.text);
    joinKey = String(jk.body.key);
    const rk = await api('POST', '/join_keys', mgmtKey, { registration_name: 'alpha' });
    assert.equal(rk.status, 201, rk.text);
    reservingKey = String(rk.body.key);

    const u = await admin('POST', '/users', { name: 'Ada', email: 'ada@example.com' });
    assert.equal(u.status, 201, u.text);
    approver = { id: String(u.body.id), token: String(u.body.token) };
    const m = await admin('POST', '/projects/e2e/members', {
      user_id: approver.id,
      role: 'approver',
    });
    assert.equal(m.status, 201, m.text);

    const env = { PIDDIR: pidDir, RUNS: runsLog };
    const schema = (props: Record<string, unknown>, required: string[] = []) => ({
      type: 'object',
      properties: props,
      required,
      additionalProperties: false,
    });
    const echo: FileTool = {
      name: 'echo',
      description: 'Prints its arguments.',
      input_schema: schema({ msg: { type: 'string' } }, ['msg']),
      risk: 'low',
      mcp_visible: true,
      default_timeout_ms: 10_000,
      command: sh('echo "$SWITCHYARD_INVOCATION_ID" >> "$RUNS"; cat'),
      env,
    };
    manifests.alpha = [
      echo,
      {
        name: 'fail',
        description: 'Exits with code 3.',
        input_schema: schema({}),
        risk: 'medium',
        mcp_visible: false,
        default_timeout_ms: 10_000,
        command: sh('echo boom >&2; exit 3'),
      },
      {
        name: 'nap',
        description: 'Sleeps for 30 s.',
        input_schema: schema({}),
        risk: 'read_only',
        mcp_visible: false,
        default_timeout_ms: 30_000,
        command: sh(HANG),
        env,
      },
      {
        name: 'wipe',
        description: 'Destroys a path (pretends to).',
        input_schema: schema({ path: { type: 'string' } }, ['path']),
        risk: 'destructive',
        mcp_visible: false,
        default_timeout_ms: 10_000,
        command: sh('echo "wiped $(cat)"'),
      },
    ];
    manifests.beta = [
      echo,
      {
        name: 'beta.hang',
        description: 'Sleeps for 30 s on beta.',
        input_schema: schema({}),
        risk: 'high',
        mcp_visible: false,
        default_timeout_ms: 30_000,
        command: sh(HANG),
        env,
      },
      {
        name: 'beta.whoami',
        description: 'Prints beta.',
        input_schema: schema({}),
        risk: 'read_only',
        mcp_visible: true,
        default_timeout_ms: 5_000,
        command: sh('echo beta'),
      },
    ];
  });

  after(async () => {
    await Promise.all(children.map((c) => c.stop('SIGKILL')));
    killTools(pidDir);
    await rx?.close();
    tmp.cleanup();
  });

  it('two agents enroll over CURVE: exec.agent_enrolled with the manifest hash; both in the catalog', async () => {
    alpha = spawnAgent({
      name: 'alpha',
      manifest: writeManifest(join(tmp.dir, 'alpha.json'), manifests.alpha!),
      keyFile: join(tmp.dir, 'alpha.key'),
      joinKey,
    });
    beta = spawnAgent({
      name: 'beta',
      manifest: writeManifest(join(tmp.dir, 'beta.json'), manifests.beta!),
      keyFile: join(tmp.dir, 'beta.key'),
      joinKey,
    });
    await Promise.all([
      alpha.waitFor(/"msg":"connected to broker"/, 20_000),
      beta.waitFor(/"msg":"connected to broker"/, 20_000),
    ]);
    const list = await api('GET', '/agents', mgmtKey);
    assert.equal(list.status, 200, list.text);
    const agents = list.body.data as Array<Record<string, unknown>>;
    assert.deepEqual(agents.map((a) => a.registration_name).sort(), ['alpha', 'beta']);
    for (const a of agents) {
      const name = String(a.registration_name);
      agentIds[name] = String(a.id);
      assert.equal(a.status, 'enrolled');
      // The identity file keeps the keypair; the router knows the agent by its public key.
      const identity = JSON.parse(readFileSync(join(tmp.dir, `${name}.key`), 'utf8')) as {
        public_key: string;
        agent_id: string;
      };
      assert.equal(a.curve_public_key, identity.public_key);
      assert.equal(identity.agent_id, a.id);
      // manifest_hash: SHA-256 of the canonical JSON of the accepted manifest
      // (what the file declares, without the local command/env).
      const accepted = { version: 1, tools: manifests[name]!.map(declared) };
      const hash = createHash('sha256').update(canonical(accepted), 'utf8').digest('hex');
      assert.equal(a.manifest_hash, hash, `${name} manifest_hash`);
      const e = await hooks.one('exec.agent_enrolled', { agent_id: a.id });
      assert.deepEqual(
        { ...e.data, enrolled_at: null },
        {
          agent_id: a.id,
          registration_name: name,
          project_id: projectUuid,
          manifest_hash: hash,
          enrolled_at: null,
        },
      );
    }
    const tools = await api('GET', '/exec/tools', execKey);
    assert.equal(tools.status, 200, tools.text);
    const byName = new Map(
      (tools.body.data as Array<Record<string, unknown>>).map((t) => [String(t.name), t]),
    );
    assert.deepEqual([...byName.keys()].sort(), [
      'beta.hang',
      'beta.whoami',
      'echo',
      'fail',
      'nap',
      'wipe',
    ]);
    assert.deepEqual(
      (byName.get('echo')!.agents as string[]).slice().sort(),
      [agentIds.alpha, agentIds.beta].sort(),
    );
    assert.deepEqual(byName.get('beta.hang')!.agents, [agentIds.beta]);
    assert.equal(byName.get('wipe')!.requires_approval, true);
  });

  it('enrollment protocol codes: the agent prints the code and exits 3', async () => {
    const badManifest = writeManifest(join(tmp.dir, 'bad.json'), [
      { ...manifests.alpha![0]!, name: 'ok' },
      { ...manifests.alpha![1]!, input_schema: { type: 'string' } },
    ]);
    // Also refused by the router, not by the agent's own file check: a tool named
    // twice, and a version the router does not know.
    const twice = writeManifest(join(tmp.dir, 'twice.json'), [
      { ...manifests.alpha![0]!, name: 'same' },
      { ...manifests.alpha![0]!, name: 'same' },
    ]);
    const v2 = join(tmp.dir, 'v2.json');
    writeFileSync(v2, JSON.stringify({ version: 2, tools: [manifests.alpha![0]!] }));
    const goodManifest = join(tmp.dir, 'alpha.json');
    const run = async (o: Parameters<typeof agentEnv>[0]) => {
      const proc = spawnAgent(o);
      const [code] = (await once(proc.child, 'exit')) as [number | null];
      return { code, stdout: proc.stdout(), stderr: proc.stderr() };
    };
    const [invalid, dup, version, inUse, conflict] = await Promise.all([
      run({ name: 'gamma', manifest: badManifest, keyFile: join(tmp.dir, 'x1.key'), joinKey }),
      run({ name: 'delta', manifest: twice, keyFile: join(tmp.dir, 'x4.key'), joinKey }),
      run({ name: 'epsilon', manifest: v2, keyFile: join(tmp.dir, 'x5.key'), joinKey }),
      // A join key reserving 'alpha' while alpha is live.
      run({
        name: 'alpha',
        manifest: goodManifest,
        keyFile: join(tmp.dir, 'x2.key'),
        joinKey: reservingKey,
      }),
      // An ordinary join key, the same name, another CURVE key.
      run({ name: 'alpha', manifest: goodManifest, keyFile: join(tmp.dir, 'x3.key'), joinKey }),
    ]);
    assert.equal(invalid.code, 3, invalid.stderr);
    assert.match(
      invalid.stderr,
      /^enrollment rejected: exec_manifest_invalid: Invalid 'tools\[1\]\.input_schema': .+ \(tools\[1\]\.input_schema\)$/m,
    );
    assert.equal(dup.code, 3, dup.stderr);
    assert.match(
      dup.stderr,
      /^enrollment rejected: exec_manifest_invalid: .*'same'.* \(tools\[1\]\.name\)$/m,
    );
    assert.equal(version.code, 3, version.stderr);
    assert.match(version.stderr, /^enrollment rejected: exec_manifest_invalid: .* \(version\)$/m);
    assert.equal(inUse.code, 3, inUse.stderr);
    assert.match(inUse.stderr, /^enrollment rejected: agent_name_in_use: .*'alpha'.*$/m);
    assert.equal(conflict.code, 3, conflict.stderr);
    assert.match(conflict.stderr, /^enrollment rejected: agent_name_conflict: .*'alpha'.*$/m);
    for (const r of [invalid, dup, version, inUse, conflict]) {
      assert.ok(!(r.stdout + r.stderr).includes(joinKey), 'join key not printed');
    }
    // Nothing was enrolled; alpha keeps its name, its key and its session.
    const list = await api('GET', '/agents', mgmtKey);
    assert.deepEqual(
      (list.body.data as Array<Record<string, unknown>>).map((a) => [a.registration_name, a.id]),
      [
        ['alpha', agentIds.alpha],
        ['beta', agentIds.beta],
      ],
    );
    assert.equal(hooks.of('exec.agent_enrolled').length, 2);
    assert.equal(alpha.child.exitCode, null);
  });

  it('a tool run: dispatched, completed, output returned; a failing tool: exec.failed', async () => {
    const r = await invoke({ tool: 'echo', arguments: { msg: 'hello' } });
    assert.equal(r.status, 201, r.text);
    const id = String(r.body.id);
    assert.match(id, /^inv_[0-9a-f]+$/);
    const done = await invWhere(id, 'completed', (b) => b.status === 'completed');
    assert.equal(done.exit_code, 0);
    assert.equal(done.stdout, '{"msg":"hello"}');
    assert.equal(done.error, null);
    const agent = String(done.agent_id);
    assert.ok([agentIds.alpha, agentIds.beta].includes(agent));
    const res = await api('GET', `/exec/invocations/${id}/result`, execKey);
    assert.equal(res.status, 200, res.text);
    assert.equal(res.body.status, 'completed');

    const d = await hooks.one('exec.dispatched', { invocation_id: id });
    assert.deepEqual(
      { ...d.data, dispatched_at: null },
      {
        invocation_id: id,
        tool_name: 'echo',
        workspace_id: ws,
        agent_id: agent,
        risk: 'low',
        dispatched_at: null,
      },
    );
    const c = await hooks.one('exec.completed', { invocation_id: id });
    assert.equal(c.data.status, 'completed');
    assert.equal(c.data.exit_code, 0);
    assert.equal(c.data.duration_ms, done.duration_ms);
    assert.ok(Date.parse(String(c.data.completed_at)) >= Date.parse(String(d.data.dispatched_at)));

    const f = await invoke({ tool: 'fail' });
    assert.equal(f.status, 201, f.text);
    const fid = String(f.body.id);
    const failed = await invWhere(fid, 'failed', (b) => b.status === 'failed');
    assert.equal(failed.exit_code, 3);
    assert.equal(failed.stderr, 'boom\n');
    assert.equal((failed.error as Record<string, unknown>).code, 'nonzero_exit');
    await hooks.one('exec.dispatched', { invocation_id: fid, agent_id: agentIds.alpha });
    const fe = await hooks.one('exec.failed', { invocation_id: fid });
    assert.equal(fe.data.error_code, 'nonzero_exit');
    assert.equal(fe.data.error_message, (failed.error as Record<string, unknown>).message);
  });

  it('timeout: the agent kills the tool at timeout_ms; exec.timeout', async () => {
    const r = await invoke({ tool: 'nap', timeout_ms: 1000 });
    assert.equal(r.status, 201, r.text);
    const id = String(r.body.id);
    assert.equal(r.body.timeout_ms, 1000);
    const pid = await pidOf(id);
    const failed = await invWhere(id, 'timed out', (b) => b.status === 'failed');
    assert.equal((failed.error as Record<string, unknown>).code, 'timeout');
    const t = await hooks.one('exec.timeout', { invocation_id: id });
    assert.equal(t.data.timeout_ms, 1000);
    assert.ok(Number(t.data.elapsed_ms) >= 1000, `elapsed ${String(t.data.elapsed_ms)}`);
    assert.ok(Number(t.data.elapsed_ms) < 10_000, `elapsed ${String(t.data.elapsed_ms)}`);
    await until(`tool process ${pid} gone`, () => !isAlive(pid));
    assert.equal(hooks.of('exec.failed', { invocation_id: id }).length, 0);
    assert.equal(hooks.of('exec.completed', { invocation_id: id }).length, 0);
  });

  it('cancel: a running tool is killed; a second cancel is invocation_terminal', async () => {
    const r = await invoke({ tool: 'nap' });
    assert.equal(r.status, 201, r.text);
    const id = String(r.body.id);
    const pid = await pidOf(id);
    await invWhere(id, 'running', (b) => b.status === 'running');
    assert.ok(isAlive(pid));
    const c = await api('POST', `/exec/invocations/${id}/cancel`, execKey);
    assert.equal(c.status, 200, c.text);
    assert.equal(c.body.status, 'cancelled');
    assert.equal((c.body.error as Record<string, unknown>).code, 'cancelled');
    await until(`cancelled tool process ${pid} gone`, () => !isAlive(pid));
    errorOf(
      await api('POST', `/exec/invocations/${id}/cancel`, execKey),
      409,
      'invocation_terminal',
    );
    errorOf(await api('GET', `/exec/invocations/${id}/result`, execKey), 499, 'cancelled');
    // The agent's answer for the killed tool (cancelled) changes nothing.
    assert.equal((await getInv(id)).status, 'cancelled');
    assert.equal(hooks.of('exec.failed', { invocation_id: id }).length, 0);
    assert.equal(hooks.of('exec.completed', { invocation_id: id }).length, 0);
  });

  it('idempotency: the same key and body replay the invocation (run once); another body conflicts', async () => {
    const headers = { 'idempotency-key': 'e2e-echo-1' };
    const body = { tool: 'echo', arguments: { msg: 'once' } };
    const first = await invoke(body, headers);
    assert.equal(first.status, 201, first.text);
    const id = String(first.body.id);
    assert.equal(first.body.idempotency_key, 'e2e-echo-1');
    assert.equal(first.headers['idempotent-replayed'], undefined);
    const again = await invoke({ arguments: { msg: 'once' }, tool: 'echo' }, headers);
    assert.equal(again.status, 200, again.text);
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.equal(again.body.id, id);
    await invWhere(id, 'completed', (b) => b.status === 'completed');
    const late = await invoke(body, headers);
    assert.equal(late.status, 200);
    assert.equal(late.body.id, id);
    assert.equal(late.body.status, 'completed');
    const e = errorOf(
      await invoke({ tool: 'echo', arguments: { msg: 'twice' } }, headers),
      409,
      'exec_idempotency_conflict',
    );
    assert.equal(e.param, 'Idempotency-Key');
    // The tool ran once, and only one dispatch was announced.
    await hooks.one('exec.completed', { invocation_id: id });
    const runs = readFileSync(runsLog, 'utf8')
      .split('\n')
      .filter((l) => l === id);
    assert.equal(runs.length, 1);
    assert.equal(hooks.of('exec.dispatched', { invocation_id: id }).length, 1);
    const listed = await api('GET', '/exec/invocations?tool=echo&limit=100', execKey);
    assert.equal((listed.body.data as Array<{ id: string }>).filter((i) => i.id === id).length, 1);
  });

  it('approval: approve runs the destructive tool; reject cancels it; decisions are final', async () => {
    const user = { authorization: `Bearer ${approver.token}` };
    const decide = (approval: string, verb: 'approve' | 'reject', body?: unknown) =>
      http('POST', `${base}/${projectId}/v1/exec/approvals/${approval}/${verb}`, {
        headers: user,
        ...(body !== undefined ? { body } : {}),
      });

    const a = await invoke({ tool: 'wipe', arguments: { path: '/tmp/x' } });
    assert.equal(a.status, 201, a.text);
    assert.equal(a.body.status, 'pending_approval');
    const inv = String(a.body.id);
    const approval = String(a.body.approval_id);
    const req = await hooks.one('exec.approval_requested', { invocation_id: inv });
    assert.deepEqual(
      { ...req.data, requested_at: null },
      {
        invocation_id: inv,
        approval_id: approval,
        tool_name: 'wipe',
        risk: 'destructive',
        workspace_id: ws,
        requested_at: null,
      },
    );
    // What a re-emitter runs before forwarding the payload.
    const check = verifyApprovalRequestedSignature({
      secret: hooks.secret,
      body: req.request.body,
      timestamp: req.request.headers['x-webhook-timestamp'],
      signature: req.request.headers['x-webhook-signature'],
    });
    assert.deepEqual(check, { ok: true, eventId: req.id, data: req.data });
    assert.deepEqual(
      verifyApprovalRequestedSignature({
        secret: hooks.secret,
        body: req.request.body.replace('/tmp', '/tmq').replace('destructive', 'low'),
        timestamp: req.request.headers['x-webhook-timestamp'],
        signature: req.request.headers['x-webhook-signature'],
      }),
      { ok: false, reason: 'bad_signature' },
    );
    assert.equal(hooks.of('exec.dispatched', { invocation_id: inv }).length, 0);

    const ok = await decide(approval, 'approve');
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.body.status, 'accepted');
    assert.equal(ok.body.decided_by, approver.id);
    const done = await invWhere(inv, 'completed', (b) => b.status === 'completed');
    assert.equal(done.stdout, 'wiped {"path":"/tmp/x"}\n');
    assert.equal(done.agent_id, agentIds.alpha);
    const ap = await hooks.one('exec.approved', { invocation_id: inv });
    assert.equal(ap.data.approval_id, approval);
    assert.equal(ap.data.decided_by, approver.id);
    const d = await hooks.one('exec.dispatched', { invocation_id: inv });
    assert.equal(d.data.risk, 'destructive');
    await hooks.one('exec.completed', { invocation_id: inv });
    errorOf(await decide(approval, 'reject', { reason: 'too late' }), 409, 'approval_not_pending');

    const b = await invoke({ tool: 'wipe', arguments: { path: '/etc' } });
    assert.equal(b.status, 201, b.text);
    const inv2 = String(b.body.id);
    const approval2 = String(b.body.approval_id);
    const no = await decide(approval2, 'reject', { reason: 'not /etc' });
    assert.equal(no.status, 200, no.text);
    assert.equal(no.body.status, 'rejected');
    assert.equal(no.body.reason, 'not /etc');
    const rj = await hooks.one('exec.rejected', { invocation_id: inv2 });
    assert.equal(rj.data.approval_id, approval2);
    assert.equal(rj.data.reason, 'not /etc');
    const cancelled = await getInv(inv2);
    assert.equal(cancelled.status, 'cancelled');
    assert.equal((cancelled.error as Record<string, unknown>).code, 'approval_rejected');
    errorOf(await decide(approval2, 'approve'), 409, 'approval_not_pending');
    errorOf(await decide('app_0123456789abcdef', 'approve'), 404, 'approval_not_found');
    assert.equal(hooks.of('exec.dispatched', { invocation_id: inv2 }).length, 0);
  });

  it('an agent SIGKILLed mid-invocation: its lease expires → exec.agent_offline, the invocation fails', async () => {
    const r = await invoke({ tool: 'beta.hang' });
    assert.equal(r.status, 201, r.text);
    const id = String(r.body.id);
    assert.equal(r.body.agent_id, agentIds.beta);
    const pid = await pidOf(id);
    await invWhere(id, 'running', (b) => b.status === 'running');
    const killedAt = Date.now();
    assert.equal(await beta.stop('SIGKILL'), null);
    const failed = await invWhere(id, 'failed', (b) => b.status === 'failed');
    assert.equal((failed.error as Record<string, unknown>).code, 'agent_offline');
    const off = await hooks.one('exec.agent_offline', { invocation_id: id });
    assert.deepEqual(
      { ...off.data, detected_at: null },
      { invocation_id: id, agent_id: agentIds.beta, reason: 'lease_expired', detected_at: null },
    );
    // Not before the lease (3 s from the last renewal, renewed every second) could have run out.
    assert.ok(Date.parse(String(off.data.detected_at)) >= killedAt + 1000);
    const fe = await hooks.one('exec.failed', { invocation_id: id });
    assert.equal(fe.data.error_code, 'agent_offline');
    const agent = await api('GET', `/agents/${agentIds.beta}`, mgmtKey);
    assert.equal(agent.body.status, 'offline');
    // beta's tools left the catalog; alpha's `echo` is still there, offered by alpha alone.
    errorOf(await api('GET', '/exec/tools/beta.hang', execKey), 404, 'exec_tool_not_found');
    const echo = await api('GET', '/exec/tools/echo', execKey);
    assert.deepEqual(echo.body.agents, [agentIds.alpha]);
    // The tool runs in a process group of its own, which beta could not signal:
    // beta's reaper process ended it (the whole group) when beta died.
    await until(`tool ${pid} of the killed agent gone`, () => !isAlive(-pid));

    // Restarted with its identity file (no join key), beta comes back online
    // without enrolling again: no new agent, no second exec.agent_enrolled.
    beta = spawnAgent({
      name: 'beta',
      manifest: join(tmp.dir, 'beta.json'),
      keyFile: join(tmp.dir, 'beta.key'),
    });
    await beta.waitFor(/"msg":"connected to broker"/, 20_000);
    const back = await api('GET', `/agents/${agentIds.beta}`, mgmtKey);
    assert.equal(back.body.status, 'enrolled');
    const hang = await api('GET', '/exec/tools/beta.hang', execKey);
    assert.equal(hang.status, 200, hang.text);
    assert.deepEqual(hang.body.agents, [agentIds.beta]);
    const r2 = await invoke({ tool: 'beta.whoami' });
    assert.equal(r2.status, 201, r2.text);
    const ran = await invWhere(String(r2.body.id), 'completed', (b) => b.status === 'completed');
    assert.equal(ran.stdout, 'beta\n');
    assert.equal(ran.agent_id, agentIds.beta);
    assert.equal(hooks.of('exec.agent_enrolled', { agent_id: agentIds.beta }).length, 1);
    assert.equal(await beta.stop('SIGTERM'), 0);
  });

  it('every exec.* event reached the receiver, signed; every delivery record is delivered', async () => {
    const types = new Set(hooks.collect().map((d) => d.type));
    assert.deepEqual([...types].sort(), [
      'exec.agent_enrolled',
      'exec.agent_offline',
      'exec.approval_requested',
      'exec.approved',
      'exec.completed',
      'exec.dispatched',
      'exec.failed',
      'exec.rejected',
      'exec.timeout',
    ]);
    const records = await until(
      'every delivery delivered',
      async () => {
        const r = await api('GET', `/webhooks/${webhookId}/deliveries?limit=100`, mgmtKey);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.body.has_more, false);
        const data = r.body.data as Array<Record<string, unknown>>;
        return data.every((d) => d.status === 'delivered') ? data : undefined;
      },
      10_000,
    );
    const seen = new Set(rx.received.map((q) => q.headers['x-webhook-id']));
    const events = hooks.collect();
    assert.equal(records.length, events.length, 'one delivery per event');
    for (const d of records) {
      assert.ok(seen.has(String(d.id)), `delivery ${String(d.id)} reached the receiver`);
      assert.equal(d.http_status, 200);
    }
  });
});

// ---------------------------------------------------------------------------

describe('exec end to end: approval escalation and time-out on a fake clock', () => {
  const tmp = tempDir('swy-exec-e2e-clock-');
  let s: TestServer;
  let rx: Receiver;
  let hooks: Hooks;
  let broker: Broker | undefined;
  let agent: Spawned | undefined;
  let p: ExecProject;
  let ws = '';
  const users: Record<string, { id: string; token: string }> = {};
  const STAGE_MS = 60_000;

  const api = (method: string, path: string, body?: unknown) =>
    s.call(method, `/${p.projectId}/v1${path}`, { key: p.exec, body });
  const decide = (approval: string, as: string) =>
    http('POST', `${s.url}/${p.projectId}/v1/exec/approvals/${approval}/approve`, {
      auth: `Bearer ${users[as]!.token}`,
    });
  const approvalOf = async (id: string) => {
    const r = await api('GET', `/exec/approvals/${id}`);
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  const tick = async (ms: number) => {
    s.clock.advance(ms);
    await s.services.exec.tick();
  };

  before(async () => {
    rx = await startReceiver();
    s = await startTestServer({
      env: {
        SWITCHYARD_WEBHOOK_ALLOW_CIDRS: '127.0.0.0/8',
        SWITCHYARD_WEBHOOK_CA_FILE: rx.caFile,
        // Leases far longer than the stages advanced through: the agent stays online.
        SWITCHYARD_EXEC_LEASE_MS: '3600000',
        LOG_LEVEL: 'warn',
      },
    });
    hooks = new Hooks(
      rx,
      () => Math.floor(s.clock.now() / 1000),
      () => s.services.dispatcher.tick(),
    );
    p = await seedExecProject(s, 'e2eclock');
    const w = await s.call('POST', `/${p.projectId}/v1/webhooks`, {
      key: p.mgmt,
      body: { url: rx.url, events: ALL_EXEC },
    });
    assert.equal(w.status, 201, w.text);
    hooks.secret = String(w.body.secret);
    const wsr = await api('POST', '/exec/workspaces', { name: 'clock' });
    assert.equal(wsr.status, 201, wsr.text);
    ws = String(wsr.body.id);
    for (const role of ['approver', 'admin']) {
      const u = await s.admin('POST', '/users', { name: role, email: `${role}@clock.example` });
      assert.equal(u.status, 201, u.text);
      users[role] = { id: String(u.body.id), token: String(u.body.token) };
      const m = await s.admin('POST', `/projects/${p.slug}/members`, { user_id: u.body.id, role });
      assert.equal(m.status, 201, m.text);
    }
    const chain = await s.admin('PUT', `/projects/${p.slug}/approval_chain`, {
      stages: [
        { target: 'project-approvers', timeout_ms: STAGE_MS },
        { target: 'project-admins', timeout_ms: STAGE_MS },
      ],
    });
    assert.equal(chain.status, 200, chain.text);

    // The real broker on the router's (fake) clock, and a real agent.
    let keyPair: CurveKeyPair;
    ({ broker, keyPair } = await startTestBroker(s.services.exec, { clock: s.clock }));
    s.services.exec.setTransport(broker);
    const jk = await s.call('POST', `/${p.projectId}/v1/join_keys`, { key: p.mgmt, body: {} });
    assert.equal(jk.status, 201, jk.text);
    const manifest = writeManifest(join(tmp.dir, 'gamma.json'), [
      {
        name: 'drop_table',
        description: 'Drops a table (pretends to).',
        input_schema: {
          type: 'object',
          properties: { table: { type: 'string' } },
          required: ['table'],
        },
        risk: 'destructive',
        mcp_visible: false,
        default_timeout_ms: 10_000,
        command: sh('echo "dropped $(cat)"'),
      },
    ]);
    agent = spawnSwitchyard(['agent'], {
      SWITCHYARD_AGENT_ENROLL_ENDPOINT: broker.endpoints.enroll,
      SWITCHYARD_AGENT_ENDPOINT: broker.endpoints.agents,
      SWITCHYARD_AGENT_SERVER_KEY: keyPair.publicKey,
      SWITCHYARD_AGENT_NAME: 'gamma',
      SWITCHYARD_AGENT_MANIFEST: manifest,
      SWITCHYARD_AGENT_KEY_FILE: join(tmp.dir, 'gamma.key'),
      SWITCHYARD_AGENT_JOIN_KEY: String(jk.body.key),
      SWITCHYARD_AGENT_RECONNECT_MIN_MS: '50',
      SWITCHYARD_AGENT_RECONNECT_MAX_MS: '500',
    });
    await agent.waitFor(/"msg":"connected to broker"/, 20_000);
    await hooks.one('exec.agent_enrolled', { registration_name: 'gamma' });
  });

  after(async () => {
    await agent?.stop('SIGKILL');
    s?.services.exec.setTransport(null);
    await broker?.close();
    await s?.close();
    await rx?.close();
    tmp.cleanup();
  });

  it('escalates exactly at the stage deadline; the next stage decides; the tool runs', async () => {
    const r = await api('POST', '/exec/invocations', {
      tool: 'drop_table',
      arguments: { table: 'users' },
      workspace_id: ws,
    });
    assert.equal(r.status, 201, r.text);
    const inv = String(r.body.id);
    const id = String(r.body.approval_id);
    await hooks.one('exec.approval_requested', { invocation_id: inv, approval_id: id });
    const a = await approvalOf(id);
    assert.equal(a.stage, 1);
    assert.equal(a.target, 'project-approvers');
    assert.equal(Date.parse(String(a.stage_deadline)), s.clock.now() + STAGE_MS);

    await tick(STAGE_MS - 1);
    assert.equal((await approvalOf(id)).stage, 1, 'not escalated 1 ms before the deadline');
    await tick(1);
    const b = await approvalOf(id);
    assert.equal(b.stage, 2);
    assert.equal(b.target, 'project-admins');
    assert.equal(b.status, 'pending');
    const esc = await hooks.one('exec.approval_escalated', { approval_id: id });
    assert.deepEqual(
      { ...esc.data, escalated_at: null },
      {
        invocation_id: inv,
        approval_id: id,
        stage: '2',
        target: 'project-admins',
        escalated_at: null,
      },
    );
    assert.equal(esc.data.escalated_at, new Date(s.clock.now()).toISOString());

    // Stage 2 belongs to the admins: the approver may no longer decide.
    errorOf(await decide(id, 'approver'), 403, 'insufficient_role');
    const ok = await decide(id, 'admin');
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.body.status, 'accepted');
    assert.equal(ok.body.decided_by, users.admin!.id);
    const approved = await hooks.one('exec.approved', { approval_id: id });
    assert.equal(approved.data.decided_by, users.admin!.id);
    const done = await until(
      `${inv} completed on the agent`,
      async () => {
        const g = await api('GET', `/exec/invocations/${inv}`);
        return g.body.status === 'completed' ? g.body : undefined;
      },
      15_000,
    );
    assert.equal(done.stdout, 'dropped {"table":"users"}\n');
    await hooks.one('exec.dispatched', { invocation_id: inv });
    await hooks.one('exec.completed', { invocation_id: inv });
    // Past the old deadlines nothing more happens to a decided approval.
    await tick(2 * STAGE_MS);
    await s.services.dispatcher.tick();
    assert.equal(hooks.of('exec.approval_timed_out', { approval_id: id }).length, 0);
    assert.equal((await approvalOf(id)).status, 'accepted');
  });

  it('times out after the last stage: exec.approval_timed_out, the invocation cancelled', async () => {
    const r = await api('POST', '/exec/invocations', {
      tool: 'drop_table',
      arguments: { table: 'orders' },
      workspace_id: ws,
    });
    assert.equal(r.status, 201, r.text);
    const inv = String(r.body.id);
    const id = String(r.body.approval_id);
    await tick(STAGE_MS);
    await hooks.one('exec.approval_escalated', { approval_id: id, stage: '2' });
    // The second stage's deadline counts from the first one's.
    await tick(STAGE_MS - 1);
    assert.equal((await approvalOf(id)).status, 'pending');
    await tick(1);
    const a = await approvalOf(id);
    assert.equal(a.status, 'expired');
    assert.equal(a.stage_deadline, null);
    const t = await hooks.one('exec.approval_timed_out', { approval_id: id });
    assert.deepEqual(t.data, {
      invocation_id: inv,
      approval_id: id,
      timed_out_at: new Date(s.clock.now()).toISOString(),
    });
    const g = await api('GET', `/exec/invocations/${inv}`);
    assert.equal(g.body.status, 'cancelled');
    assert.equal((g.body.error as Record<string, unknown>).code, 'approval_timed_out');
    errorOf(await decide(id, 'admin'), 409, 'approval_not_pending');
    assert.equal(hooks.of('exec.dispatched', { invocation_id: inv }).length, 0);
    // Every event of this router reached the receiver, validly signed.
    assert.deepEqual([...new Set(hooks.collect().map((d) => d.type))].sort(), [
      'exec.agent_enrolled',
      'exec.approval_escalated',
      'exec.approval_requested',
      'exec.approval_timed_out',
      'exec.approved',
      'exec.completed',
      'exec.dispatched',
    ]);
  });
});
