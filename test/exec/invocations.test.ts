/**
 * The execution API over HTTP: tools catalog, workspaces, invocations through
 * every state (queued → dispatched → running → completed / failed / timeout /
 * cancelled), the exec.* events with the spec's payloads, idempotency, the
 * scheduler's timeout backstop, capacity (`unavailable`), and the codes of the
 * spec's execution-surface table this surface can produce.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { sql } from 'drizzle-orm';
import { http, drivers, startTestServer, type Res, type TestServer } from '../support/harness.js';
import {
  curveKey,
  enrollAgent,
  events,
  expectError,
  FakeTransport,
  joinKey,
  manifest,
  seedExecProject,
  tool,
  workspace,
  type ExecProject,
} from './support.js';

for (const driver of drivers()) {
  describe(`exec invocations API ({driver})`, () => {
    let s: TestServer;
    let p: ExecProject;
    let other: ExecProject;
    let t: FakeTransport;
    let agent: string;
    let ws: string;
    before(async () => {
      s = await startTestServer({ driver, env: { SWITCHYARD_EXEC_MAX_PENDING: '5' } });
      p = await seedExecProject(s, 'inv');
      other = await seedExecProject(s, 'inv-other');
      t = new FakeTransport();
      s.services.exec.setTransport(t);
      agent = (
        await enrollAgent(s, p, {
          name: 'runner',
          tools: [
            tool('run'),
            tool('rm', { risk: 'destructive' }),
            tool('hidden', { mcp_visible: false }),
          ],
          transport: t,
        })
      ).agentId;
      ws = await workspace(s, p);
    });
    after(() => s.close());

    const base = () => `/${p.projectId}/v1/exec`;
    const call = (method: string, path: string, body?: unknown, key = p.exec) =>
      s.call(method, base() + path, { key, body });
    const create = (body: Record<string, unknown>, idem?: string): Promise<Res> =>
      http('POST', `${s.url}${base()}/invocations`, {
        auth: `Bearer ${p.exec}`,
        body,
        headers: idem ? { 'idempotency-key': idem } : {},
      });
    const nowIso = () => new Date(s.clock.now()).toISOString();
    /** Frees the project's pending slots (the cap is 5 in this suite). */
    async function drain() {
      const list = await call('GET', '/invocations?limit=100');
      for (const i of list.body.data as Array<Record<string, unknown>>) {
        if (!['completed', 'failed', 'cancelled'].includes(String(i.status))) {
          await call('POST', `/invocations/${String(i.id)}/cancel`);
        }
      }
    }

    it('tools catalog: online tools only; exec_tool_not_found 404 on the read route', async () => {
      const r = await call('GET', '/tools');
      assert.equal(r.status, 200, r.text);
      const names = (r.body.data as Array<Record<string, unknown>>).map((x) => x.name);
      assert.deepEqual(names, ['hidden', 'rm', 'run']);
      const one = await call('GET', '/tools/rm');
      assert.equal(one.status, 200);
      assert.equal(one.body.risk, 'destructive');
      assert.equal(one.body.requires_approval, true);
      assert.deepEqual(one.body.agents, [agent]);
      expectError(await call('GET', '/tools/nope'), 404, 'exec_tool_not_found', { param: 'name' });
    });

    it('workspaces: ws_ ids; missing, invalid (UUID), not found, project_mismatch, lookup_failed', async () => {
      assert.match(ws, /^ws_[0-9a-f]+$/);
      const got = await call('GET', `/workspaces/${ws}`);
      assert.equal(got.status, 200);
      assert.equal(got.body.object, 'workspace');
      const list = await call('GET', '/workspaces');
      assert.ok((list.body.data as Array<Record<string, unknown>>).some((w) => w.id === ws));
      const body = { tool: 'run', arguments: { path: '/' } };
      expectError(await create(body), 400, 'missing_workspace_id', { param: 'workspace_id' });
      expectError(
        await create({ ...body, workspace_id: '0b6f3c1e-0f7a-4c1e-9a55-1f2e3d4c5b6a' }),
        400,
        'invalid_workspace_id',
        { param: 'workspace_id' },
      );
      expectError(await call('GET', '/workspaces/not-an-id'), 400, 'invalid_workspace_id');
      expectError(
        await create({ ...body, workspace_id: 'ws_0123456789abcdef01234567' }),
        404,
        'workspace_not_found',
      );
      const foreign = await workspace(s, other);
      expectError(await create({ ...body, workspace_id: foreign }), 403, 'project_mismatch');
      // A transient database fault: the table is briefly unreachable.
      const db = s.services.store.db;
      await db.execute(sql`alter table workspaces rename to workspaces_away`);
      try {
        const e = expectError(
          await create({ ...body, workspace_id: ws }),
          500,
          'workspace_lookup_failed',
        );
        assert.equal(e.type, 'server_error');
      } finally {
        await db.execute(sql`alter table workspaces_away rename to workspaces`);
      }
    });

    it('runs a tool: queued → dispatched (exec.dispatched) → running → completed (exec.completed)', async () => {
      t.dispatched = [];
      const r = await create({
        tool: 'run',
        arguments: { path: '/tmp', count: 2 },
        workspace_id: ws,
      });
      assert.equal(r.status, 201, r.text);
      const id = String(r.body.id);
      assert.match(id, /^inv_[0-9a-f]+$/);
      assert.equal(r.body.status, 'dispatched');
      assert.equal(r.body.agent_id, agent);
      assert.equal(r.body.timeout_ms, 30_000);
      assert.deepEqual(t.dispatched, [
        {
          agentId: agent,
          req: {
            invocationId: id,
            tool: 'run',
            arguments: { path: '/tmp', count: 2 },
            timeoutMs: 30_000,
          },
        },
      ]);
      const d = (await events(s, p.projectUuid, 'exec.dispatched')).find(
        (e) => e.data.invocation_id === id,
      );
      assert.deepEqual(d?.data, {
        invocation_id: id,
        tool_name: 'run',
        workspace_id: ws,
        agent_id: agent,
        risk: 'low',
        dispatched_at: nowIso(),
      });
      expectError(await call('GET', `/invocations/${id}/result`), 409, 'invalid_state');
      await s.services.exec.started(id, agent);
      assert.equal((await call('GET', `/invocations/${id}`)).body.status, 'running');
      s.clock.advance(1234);
      await s.services.exec.finished(id, agent, {
        kind: 'exited',
        exitCode: 0,
        durationMs: 1200,
        stdout: 'hello\n',
        stderr: '',
        truncated: false,
      });
      const done = await call('GET', `/invocations/${id}`);
      assert.equal(done.body.status, 'completed');
      assert.equal(done.body.exit_code, 0);
      assert.equal(done.body.stdout, 'hello\n');
      const c = (await events(s, p.projectUuid, 'exec.completed')).find(
        (e) => e.data.invocation_id === id,
      );
      assert.deepEqual(c?.data, {
        invocation_id: id,
        status: 'completed',
        duration_ms: 1200,
        exit_code: 0,
        completed_at: nowIso(),
      });
      const result = await call('GET', `/invocations/${id}/result`);
      assert.equal(result.status, 200);
      assert.equal(result.body.stdout, 'hello\n');
      // A late duplicate answer changes nothing.
      await s.services.exec.finished(id, agent, {
        kind: 'exited',
        exitCode: 3,
        durationMs: 1,
        stdout: '',
        stderr: '',
        truncated: false,
      });
      assert.equal((await call('GET', `/invocations/${id}`)).body.status, 'completed');
      expectError(await call('POST', `/invocations/${id}/cancel`), 409, 'invocation_terminal');
    });

    it('failures: non-zero exit (nonzero_exit), agent error, agent timeout (exec.timeout); output bounded', async () => {
      const mk = async () =>
        String((await create({ tool: 'run', arguments: { path: '/' }, workspace_id: ws })).body.id);
      const a = await mk();
      await s.services.exec.finished(a, agent, {
        kind: 'exited',
        exitCode: 2,
        durationMs: 10,
        stdout: 'x'.repeat(70_000),
        stderr: 'boom',
        truncated: false,
      });
      const ra = await call('GET', `/invocations/${a}`);
      assert.equal(ra.body.status, 'failed');
      assert.equal(ra.body.exit_code, 2);
      assert.equal(String(ra.body.stdout).length, 65_536);
      assert.equal(ra.body.output_truncated, true);
      assert.deepEqual((ra.body.error as Record<string, unknown>).code, 'nonzero_exit');
      const fa = (await events(s, p.projectUuid, 'exec.failed')).find(
        (e) => e.data.invocation_id === a,
      );
      assert.equal(fa?.data.error_code, 'nonzero_exit');
      assert.equal(fa?.data.failed_at, nowIso());
      assert.equal(
        (await events(s, p.projectUuid, 'exec.completed')).some((e) => e.data.invocation_id === a),
        false,
      );

      const b = await mk();
      await s.services.exec.finished(b, agent, {
        kind: 'error',
        errorCode: 'spawn_failed',
        errorMessage: 'ENOENT',
        durationMs: 1,
      });
      const fb = (await events(s, p.projectUuid, 'exec.failed')).find(
        (e) => e.data.invocation_id === b,
      );
      assert.deepEqual([fb?.data.error_code, fb?.data.error_message], ['spawn_failed', 'ENOENT']);

      const c = await mk();
      await s.services.exec.started(c, agent);
      await s.services.exec.finished(c, agent, { kind: 'timeout', elapsedMs: 30_010 });
      const rc = await call('GET', `/invocations/${c}`);
      assert.equal(rc.body.status, 'failed');
      assert.deepEqual((rc.body.error as Record<string, unknown>).code, 'timeout');
      const tc = (await events(s, p.projectUuid, 'exec.timeout')).find(
        (e) => e.data.invocation_id === c,
      );
      assert.deepEqual(tc?.data, {
        invocation_id: c,
        timeout_ms: 30_000,
        elapsed_ms: 30_010,
        timed_out_at: nowIso(),
      });
      // An answer from another agent is ignored.
      const d = await mk();
      await s.services.exec.finished(d, 'agt_ffffffff', { kind: 'cancelled', durationMs: 1 });
      assert.equal((await call('GET', `/invocations/${d}`)).body.status, 'dispatched');
      await call('POST', `/invocations/${d}/cancel`);
    });

    it('timeout backstop: no answer within timeout_ms + grace → failed with exec.timeout', async () => {
      t.cancelled = [];
      const r = await create({
        tool: 'run',
        arguments: { path: '/' },
        workspace_id: ws,
        timeout_ms: 5000,
      });
      const id = String(r.body.id);
      await s.services.exec.started(id, agent);
      s.clock.advance(14_999);
      await s.services.exec.renew(agent);
      await s.services.exec.tick();
      assert.equal((await call('GET', `/invocations/${id}`)).body.status, 'running');
      s.clock.advance(1);
      await s.services.exec.tick();
      const got = await call('GET', `/invocations/${id}`);
      assert.equal(got.body.status, 'failed');
      const e = (await events(s, p.projectUuid, 'exec.timeout')).find(
        (x) => x.data.invocation_id === id,
      );
      assert.deepEqual(e?.data, {
        invocation_id: id,
        timeout_ms: 5000,
        elapsed_ms: 15_000,
        timed_out_at: nowIso(),
      });
      assert.deepEqual(t.cancelled, [{ agentId: agent, invocationId: id }]);
      await s.services.exec.renew(agent);
    });

    it('cancel: dispatched → cancelled (agent asked to kill); result 499 cancelled; terminal → 409', async () => {
      t.cancelled = [];
      const r = await create({ tool: 'run', arguments: { path: '/' }, workspace_id: ws });
      const id = String(r.body.id);
      const c = await call('POST', `/invocations/${id}/cancel`);
      assert.equal(c.status, 200, c.text);
      assert.equal(c.body.status, 'cancelled');
      assert.deepEqual((c.body.error as Record<string, unknown>).code, 'cancelled');
      assert.deepEqual(t.cancelled, [{ agentId: agent, invocationId: id }]);
      const res = expectError(await call('GET', `/invocations/${id}/result`), 499, 'cancelled');
      assert.equal(res.type, 'invalid_request_error');
      expectError(await call('POST', `/invocations/${id}/cancel`), 409, 'invocation_terminal');
      // The agent's late `cancelled` answer changes nothing.
      await s.services.exec.finished(id, agent, { kind: 'cancelled', durationMs: 5 });
      assert.equal((await call('GET', `/invocations/${id}`)).body.status, 'cancelled');
    });

    it('a cancel while the dispatch is on its way: the agent gets a CANCEL after the DISPATCH', async () => {
      // The transport holds the dispatch (a full send queue, a slow link) until released.
      const wire: string[] = [];
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      const { dispatch, cancel } = t;
      t.dispatch = async (agentId, req) => {
        await held;
        await dispatch.call(t, agentId, req);
        wire.push(`DISPATCH ${req.invocationId}`);
      };
      t.cancel = async (agentId, invocationId) => {
        await cancel.call(t, agentId, invocationId);
        wire.push(`CANCEL ${invocationId}`);
      };
      try {
        const creating = create({ tool: 'run', arguments: { path: '/held' }, workspace_id: ws });
        let id = '';
        for (let i = 0; i < 500 && !id; i++) {
          await new Promise((r) => setTimeout(r, 5));
          const l = await call('GET', '/invocations?status=dispatched&tool=run');
          const row = (l.body.data as Array<{ id: string; arguments: { path: string } }>).find(
            (x) => x.arguments.path === '/held',
          );
          id = row?.id ?? '';
        }
        assert.ok(id, 'the invocation is dispatched');
        const c = await call('POST', `/invocations/${id}/cancel`);
        assert.equal(c.body.status, 'cancelled', c.text);
        release();
        assert.equal((await creating).status, 201);
        // An agent told CANCEL for an invocation it does not run yet answers `cancelled`
        // and forgets it; the DISPATCH after it would run the tool. So a CANCEL follows.
        const mine = wire.filter((w) => w.endsWith(id));
        assert.equal(mine.at(-1), `CANCEL ${id}`, JSON.stringify(mine));
        assert.equal((await call('GET', `/invocations/${id}`)).body.status, 'cancelled');
      } finally {
        t.dispatch = dispatch;
        t.cancel = cancel;
      }
    });

    it('idempotency: same key + body replays (200), other body → exec_idempotency_conflict', async () => {
      const body = { tool: 'run', arguments: { path: '/i', count: 1 }, workspace_id: ws };
      const first = await create(body, 'key-1');
      assert.equal(first.status, 201, first.text);
      t.dispatched = [];
      // Same data in another key order: the same request.
      const again = await create(
        { workspace_id: ws, arguments: { count: 1, path: '/i' }, tool: 'run' },
        'key-1',
      );
      assert.equal(again.status, 200, again.text);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.equal(again.body.id, first.body.id);
      assert.deepEqual(t.dispatched, []);
      const e = expectError(
        await create({ ...body, arguments: { path: '/other' } }, 'key-1'),
        409,
        'exec_idempotency_conflict',
      );
      assert.equal(e.param, 'Idempotency-Key');
      // Keys are per project.
      expectError(await create(body, 'x'.repeat(256)), 400, 'invalid_body', {
        param: 'Idempotency-Key',
      });
      await call('POST', `/invocations/${String(first.body.id)}/cancel`);
    });

    it('invalid_body, exec_tool_not_found 400 as a target, payload_too_large', async () => {
      expectError(
        await create({ tool: 'run', workspace_id: ws, arguments: { count: 1 } }),
        400,
        'invalid_body',
        {
          param: 'arguments.path',
        },
      );
      expectError(
        await create({ tool: 'run', workspace_id: ws, arguments: { path: '/', count: -1 } }),
        400,
        'invalid_body',
        { param: 'arguments.count' },
      );
      expectError(
        await create({ tool: 'run', workspace_id: ws, arguments: { path: '/' }, timeout_ms: 0 }),
        400,
        'invalid_body',
        {
          param: 'timeout_ms',
        },
      );
      expectError(
        await create({ tool: 'run', workspace_id: ws, surprise: 1 }),
        400,
        'invalid_body',
        {
          param: 'surprise',
        },
      );
      const nf = expectError(
        await create({ tool: 'ghost', workspace_id: ws }),
        400,
        'exec_tool_not_found',
        {
          param: 'tool',
        },
      );
      assert.equal(nf.type, 'invalid_request_error');
      const big = await create({
        tool: 'run',
        workspace_id: ws,
        arguments: { path: 'x'.repeat(5 * 1024 * 1024) },
      });
      expectError(big, 413, 'payload_too_large');
    });

    it('bodies: JSON that fails decoding is invalid_body (the inference API keeps invalid_json); an empty JSON body is {}', async () => {
      const json = { 'content-type': 'application/json' };
      for (const rawBody of ['{"tool":', '{', 'nul', '{"__proto__": {"x": 1}}']) {
        const r = await http('POST', `${s.url}${base()}/invocations`, {
          auth: `Bearer ${p.exec}`,
          rawBody,
          headers: json,
        });
        expectError(r, 400, 'invalid_body', { type: 'invalid_request_error' });
        assert.match(String((r.body.error as Record<string, unknown>).message), /JSON/);
      }
      const ws2 = await http('POST', `${s.url}${base()}/workspaces`, {
        auth: `Bearer ${p.exec}`,
        rawBody: '[1,',
        headers: { 'content-type': 'application/json; charset=utf-8' },
      });
      expectError(ws2, 400, 'invalid_body');
      // Elsewhere the code stays invalid_json.
      const chat = await http('POST', `${s.url}/${p.projectId}/main/v1/chat/completions`, {
        auth: `Bearer ${p.inference}`,
        rawBody: '{"model":',
        headers: json,
      });
      expectError(chat, 400, 'invalid_json');

      // Cancel takes no body; clients that send Content-Type: application/json with
      // an empty one get the same answer as without.
      const r = await create({ tool: 'run', arguments: { path: '/' }, workspace_id: ws });
      const c = await http('POST', `${s.url}${base()}/invocations/${String(r.body.id)}/cancel`, {
        auth: `Bearer ${p.exec}`,
        rawBody: '',
        headers: json,
      });
      assert.equal(c.status, 200, c.text);
      assert.equal(c.body.status, 'cancelled');
      // An empty create body is an empty object: the first missing field answers.
      const empty = await http('POST', `${s.url}${base()}/invocations`, {
        auth: `Bearer ${p.exec}`,
        rawBody: '',
        headers: json,
      });
      expectError(empty, 400, 'missing_workspace_id');
    });

    it('invocation_not_found for unknown and cross-project ids (never 403)', async () => {
      const mine = await create({ tool: 'run', arguments: { path: '/' }, workspace_id: ws });
      const id = String(mine.body.id);
      expectError(await call('GET', '/invocations/inv_00000000'), 404, 'invocation_not_found');
      expectError(await call('GET', '/invocations/garbage'), 404, 'invocation_not_found');
      const cross = await s.call('GET', `/${other.projectId}/v1/exec/invocations/${id}`, {
        key: other.exec,
      });
      expectError(cross, 404, 'invocation_not_found');
      const crossCancel = await s.call(
        'POST',
        `/${other.projectId}/v1/exec/invocations/${id}/cancel`,
        {
          key: other.exec,
        },
      );
      expectError(crossCancel, 404, 'invocation_not_found');
      await call('POST', `/invocations/${id}/cancel`);
    });

    it('lists with filters and pagination', async () => {
      const l = await call('GET', '/invocations?limit=2');
      assert.equal(l.status, 200);
      assert.equal((l.body.data as unknown[]).length, 2);
      assert.equal(l.body.has_more, true);
      const last = (l.body.data as Array<Record<string, unknown>>)[1]!.id;
      const next = await call('GET', `/invocations?limit=2&after=${String(last)}`);
      assert.equal(next.status, 200);
      const cancelled = await call('GET', '/invocations?status=cancelled&limit=100');
      assert.ok(
        (cancelled.body.data as Array<Record<string, unknown>>).every(
          (i) => i.status === 'cancelled',
        ),
      );
      expectError(await call('GET', '/invocations?status=weird'), 400, 'invalid_body');
    });

    it('no broker on this instance (API-only role): stored queued, dispatched by the instance holding the agent', async () => {
      await drain();
      const body = { tool: 'run', arguments: { path: '/' }, workspace_id: ws };
      s.services.exec.setTransport(null);
      const r = await create(body);
      assert.equal(r.status, 201, r.text);
      assert.equal(r.body.status, 'queued');
      expectError(
        await s.call('GET', `/${p.projectId}/v1/exec/broker`, { key: p.mgmt }),
        503,
        'unavailable',
      );
      // The broker's instance (here: the same service once its transport is back) dispatches it.
      s.services.exec.setTransport(t);
      await s.services.exec.tick();
      const got = await call('GET', `/invocations/${String(r.body.id)}`);
      assert.equal(got.body.status, 'dispatched');
      await drain();
    });

    it('a cancel on an instance without the agent’s session reaches the agent through the broker instance', async () => {
      await drain();
      const r = await create({ tool: 'run', arguments: { path: '/far' }, workspace_id: ws });
      assert.equal(r.body.status, 'dispatched', r.text);
      const id = String(r.body.id);
      t.cancelled = [];
      // Cancelled through an API-only instance: it has no session to send CANCEL on.
      s.services.exec.setTransport(null);
      const c = await call('POST', `/invocations/${id}/cancel`);
      assert.equal(c.body.status, 'cancelled', c.text);
      assert.deepEqual(t.cancelled, []);
      // The broker's instance (here: the same service once its transport is back) tells the agent.
      s.services.exec.setTransport(t);
      await s.services.exec.tick();
      assert.deepEqual(t.cancelled, [{ agentId: agent, invocationId: id }]);
      // Once: neither the next pass nor a cancel this instance sent itself goes again.
      s.clock.advance(1000);
      await s.services.exec.tick();
      const local = await create({ tool: 'run', arguments: { path: '/near' }, workspace_id: ws });
      await call('POST', `/invocations/${String(local.body.id)}/cancel`);
      await s.services.exec.tick();
      assert.deepEqual(t.cancelled, [
        { agentId: agent, invocationId: id },
        { agentId: agent, invocationId: local.body.id },
      ]);
    });

    it('a queued invocation goes only to an agent whose own declaration of the tool may run it', async () => {
      await drain();
      // Two agents declare `op`: the older one destructive (needs approval), the newer
      // (chosen at creation) low. Likewise `op2`: the older one's schema refuses the
      // arguments the newer one's accepts.
      const strict = await enrollAgent(s, p, {
        name: 'op-strict',
        tools: [
          tool('op', { risk: 'destructive' }),
          tool('op2', {
            input_schema: {
              type: 'object',
              properties: { n: { type: 'integer' } },
              required: ['n'],
            },
          }),
        ],
      });
      s.clock.advance(1_000); // enrolled later: the first candidate
      const loose = await enrollAgent(s, p, {
        name: 'op-loose',
        tools: [tool('op'), tool('op2', { input_schema: { type: 'object' } })],
      });
      s.services.exec.setTransport(null);
      const op = await create({ tool: 'op', arguments: { path: '/' }, workspace_id: ws });
      const op2 = await create({ tool: 'op2', arguments: { n: 'x' }, workspace_id: ws });
      assert.deepEqual([op.body.status, op2.body.status], ['queued', 'queued'], op.text);
      assert.equal(op.body.risk, 'low');
      // Only the agent that may not run them is connected to this broker: nothing goes.
      t.connected.add(strict.agentId);
      t.connected.delete(loose.agentId);
      s.services.exec.setTransport(t);
      const before = t.dispatched.length;
      await s.services.exec.tick();
      assert.equal(t.dispatched.length, before, 'no approval bypass, no unchecked arguments');
      assert.equal((await call('GET', `/invocations/${String(op.body.id)}`)).body.status, 'queued');
      t.connected.add(loose.agentId);
      await s.services.exec.tick();
      assert.deepEqual(
        t.dispatched
          .slice(before)
          .map((d) => d.agentId)
          .sort(),
        [loose.agentId, loose.agentId],
      );
      t.connected.delete(strict.agentId);
      t.connected.delete(loose.agentId);
      await drain();
    });

    it('schema patterns run in linear time; one RE2 cannot run is refused at enrollment', async () => {
      await drain();
      const schema = (pattern: string) => ({
        type: 'object',
        properties: { s: { type: 'string', pattern } },
        required: ['s'],
      });
      await enrollAgent(s, p, {
        name: 'redos',
        tools: [tool('greedy', { input_schema: schema('^(a+)+$') })],
        transport: t,
      });
      // 40 `a`s and a `!`: a backtracking engine needs about 2^40 steps (hours, with
      // the router's event loop held for every tenant); RE2 answers at once.
      const r = await create({
        tool: 'greedy',
        arguments: { s: `${'a'.repeat(40)}!` },
        workspace_id: ws,
      });
      expectError(r, 400, 'invalid_body', { param: 'arguments.s' });
      const ok = await create({ tool: 'greedy', arguments: { s: 'aaaa' }, workspace_id: ws });
      assert.equal(ok.status, 201, ok.text);
      // A backreference is not a regular language: RE2 cannot run it, so it is refused.
      const refused = await s.services.exec.enroll({
        joinKey: await joinKey(s, p),
        registrationName: 'backref',
        curvePublicKey: curveKey(),
        manifest: manifest(tool('echoes', { input_schema: schema('^(a)\\1$') })),
      });
      assert.equal(refused.ok, false);
      assert.equal(!refused.ok && refused.code, 'exec_manifest_invalid');
      await drain();
    });

    it('arguments nested past 64 levels: 400 invalid_body naming arguments, not 500', async () => {
      await drain();
      let deep: unknown = 'x';
      for (let i = 0; i < 3_000; i++) deep = [deep];
      const r = await create({ tool: 'run', arguments: { deep }, workspace_id: ws });
      expectError(r, 400, 'invalid_body', { param: 'arguments' });
    });

    it('unavailable 503: agent not connected, transport refusal, project queue full', async () => {
      await drain();
      const body = { tool: 'run', arguments: { path: '/' }, workspace_id: ws };
      t.connected.delete(agent);
      let e = expectError(await create(body), 503, 'unavailable');
      assert.equal(e.type, 'server_error');
      t.connected.add(agent);
      // The transport refuses after the invocation was stored: it fails with exec.failed
      // (covered with its events and the retry below).
      t.refuse = true;
      expectError(await create(body), 503, 'unavailable');
      t.refuse = false;
      // Five non-terminal invocations is this suite's cap.
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) ids.push(String((await create(body)).body.id));
      const full = await create(body);
      e = expectError(full, 503, 'unavailable');
      assert.equal(full.headers['retry-after'], '1');
      await drain();
      assert.equal((await create(body)).status, 201);
      await drain();
    });

    it('transport refusal: exec.failed without exec.dispatched; a retry with the same Idempotency-Key runs anew', async () => {
      await drain();
      const body = { tool: 'run', arguments: { path: '/retry' }, workspace_id: ws };
      t.refuse = true;
      const refused = await create(body, 'refused-1');
      expectError(refused, 503, 'unavailable');
      assert.equal(refused.headers['retry-after'], '1');
      t.refuse = false;
      const list = await call('GET', '/invocations?tool=run&status=failed&limit=100');
      const failed = (list.body.data as Array<Record<string, unknown>>).find(
        (i) => (i.arguments as Record<string, unknown>).path === '/retry',
      )!;
      assert.equal((failed.error as Record<string, unknown>).code, 'unavailable');
      assert.equal(failed.idempotency_key, null, 'the key was released');
      const about = async (id: unknown) =>
        (await events(s, p.projectUuid))
          .filter((e) => e.data.invocation_id === id)
          .map((e) => e.type);
      // Never forwarded to an agent: no exec.dispatched.
      assert.deepEqual(await about(failed.id), ['exec.failed']);

      // 503 is retryable: the same key and body now run (201), not replay the failure.
      t.dispatched = [];
      const retry = await create(body, 'refused-1');
      assert.equal(retry.status, 201, retry.text);
      assert.equal(retry.headers['idempotent-replayed'], undefined);
      assert.notEqual(retry.body.id, failed.id);
      assert.equal(retry.body.status, 'dispatched');
      assert.equal(retry.body.idempotency_key, 'refused-1');
      assert.equal(t.dispatched[0]?.req.invocationId, retry.body.id);
      assert.deepEqual(await about(retry.body.id), ['exec.dispatched']);
      // From now on the key is bound to the invocation that ran.
      const replay = await create(body, 'refused-1');
      assert.equal(replay.status, 200, replay.text);
      assert.equal(replay.headers['idempotent-replayed'], 'true');
      assert.equal(replay.body.id, retry.body.id);
      expectError(
        await create({ ...body, arguments: { path: '/other' } }, 'refused-1'),
        409,
        'exec_idempotency_conflict',
      );
      await drain();
    });

    it('a refused dispatch after approval emits exec.failed, no exec.dispatched; its key stays bound', async () => {
      await drain();
      const u = await s.admin('POST', '/users', { name: 'o', email: 'owner@inv.example.com' });
      await s.admin('POST', `/projects/${p.slug}/members`, { user_id: u.body.id, role: 'owner' });
      const body = { tool: 'rm', arguments: { path: '/x' }, workspace_id: ws };
      const r = await create(body, 'approved-refused');
      assert.equal(r.body.status, 'pending_approval');
      const id = String(r.body.id);
      t.refuse = true;
      const ok = await http(
        'POST',
        `${s.url}${base()}/approvals/${String(r.body.approval_id)}/approve`,
        { auth: `Bearer ${String(u.body.token)}` },
      );
      t.refuse = false;
      assert.equal(ok.status, 200, ok.text);
      const got = await call('GET', `/invocations/${id}`);
      assert.equal(got.body.status, 'failed');
      assert.equal((got.body.error as Record<string, unknown>).code, 'unavailable');
      // Its creation answered 201: a replay still finds it.
      assert.equal(got.body.idempotency_key, 'approved-refused');
      const replay = await create(body, 'approved-refused');
      assert.equal(replay.status, 200, replay.text);
      assert.equal(replay.body.id, id);
      // One frozen millisecond: their order among equal created_at is not the point.
      const types = (await events(s, p.projectUuid))
        .filter((e) => e.data.invocation_id === id)
        .map((e) => e.type)
        .sort();
      assert.deepEqual(types, ['exec.approval_requested', 'exec.approved', 'exec.failed']);
    });

    it('operator maintenance: force-fail; already_terminal 400 when terminal', async () => {
      const r = await create({ tool: 'run', arguments: { path: '/' }, workspace_id: ws });
      const id = String(r.body.id);
      const f = await s.admin('POST', `/projects/${p.slug}/invocations/${id}/fail`, {
        reason: 'stuck',
      });
      assert.equal(f.status, 200, f.text);
      assert.equal(f.body.status, 'failed');
      const again = await s.admin('POST', `/projects/${p.slug}/invocations/${id}/fail`, {});
      expectError(again, 400, 'already_terminal');
    });

    it('force-fail of an invocation that moved on after it was read fails it, not already_terminal', async () => {
      const r = await create({ tool: 'run', arguments: { path: '/' }, workspace_id: ws });
      const id = String(r.body.id);
      const inv = s.services.exec!.invocations;
      const real = inv.rowByExternal.bind(inv);
      let reads = 0;
      // The first read returns the record as it was a moment earlier (another status):
      // the conditional update finds it changed.
      inv.rowByExternal = async (projectId: string, ext: string) => {
        const row = await real(projectId, ext);
        return reads++ === 0 ? { ...row, status: 'pending_approval' } : row;
      };
      try {
        const f = await s.admin('POST', `/projects/${p.slug}/invocations/${id}/fail`, {});
        assert.equal(f.status, 200, f.text);
        assert.equal(f.body.status, 'failed');
        assert.equal(reads, 2);
      } finally {
        inv.rowByExternal = real;
      }
    });

    it('scope_insufficient (type authentication_error) for keys without execution; cross_project_access', async () => {
      for (const key of [p.mgmt, p.inference]) {
        const r = await s.call('GET', `${base()}/tools`, { key });
        expectError(r, 403, 'scope_insufficient', { type: 'authentication_error' });
      }
      expectError(
        await s.call('GET', `${base()}/tools`, { key: other.exec }),
        403,
        'cross_project_access',
      );
      // The execution surface's table names a request without credentials so.
      expectError(await s.call('GET', `${base()}/tools`), 401, 'authentication_required');
      expectError(
        await s.call('GET', `${base()}/invocations`, { key: 'swy_not_a_key' }),
        401,
        'invalid_api_key',
      );
    });

    it('GET /v1/models?capability=tool_calling lists only tool-calling models', async () => {
      await s.admin('POST', '/models', {
        name: 'tc-model',
        context_window: 4096,
        capabilities: ['tool_calling'],
      });
      const r = await s.call('GET', `/${p.projectId}/v1/models?capability=tool_calling`, {
        key: p.inference,
      });
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(
        (r.body.data as Array<Record<string, unknown>>).map((m) => m.id),
        ['tc-model'],
      );
      const all = await s.call('GET', `/${p.projectId}/v1/models`, { key: p.inference });
      assert.ok((all.body.data as unknown[]).length >= 2);
      expectError(
        await s.call('GET', `/${p.projectId}/v1/models?capability=telepathy`, { key: p.inference }),
        400,
        'invalid_value',
        { param: 'capability' },
      );
    });
  });
}
