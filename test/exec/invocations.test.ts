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
  enrollAgent,
  events,
  expectError,
  FakeTransport,
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
      const raw = await http('POST', `${s.url}${base()}/invocations`, {
        auth: `Bearer ${p.exec}`,
        rawBody: '{"tool":',
        headers: { 'content-type': 'application/json' },
      });
      assert.equal(raw.status, 400);
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

    it('unavailable 503: agent not connected, transport refusal, project queue full', async () => {
      await drain();
      const body = { tool: 'run', arguments: { path: '/' }, workspace_id: ws };
      t.connected.delete(agent);
      let e = expectError(await create(body), 503, 'unavailable');
      assert.equal(e.type, 'server_error');
      t.connected.add(agent);
      // The transport refuses after the invocation was stored: it fails with exec.failed.
      t.refuse = true;
      const refused = expectError(await create(body, 'refused-1'), 503, 'unavailable');
      assert.ok(refused);
      t.refuse = false;
      const stored = await create(body, 'refused-1');
      assert.equal(stored.body.status, 'failed');
      assert.deepEqual((stored.body.error as Record<string, unknown>).code, 'unavailable');
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
      expectError(await s.call('GET', `${base()}/tools`), 401, 'missing_api_key');
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
