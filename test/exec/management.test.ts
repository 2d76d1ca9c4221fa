/**
 * The management side (scope `management`): join keys (secret once, list,
 * revoke), agents (list, get, update, soft delete, key rotation), the broker
 * endpoint (scope `execution`, or `management`), with their `join_key.*` /
 * `agent.*` events.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { drivers, startTestServer, type TestServer } from '../support/harness.js';
import {
  curveKey,
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
  describe(`exec management API ({driver})`, () => {
    let s: TestServer;
    let p: ExecProject;
    let other: ExecProject;
    let t: FakeTransport;
    before(async () => {
      s = await startTestServer({ driver });
      p = await seedExecProject(s, 'mgmt');
      other = await seedExecProject(s, 'mgmt-other');
      t = new FakeTransport();
    });
    after(() => s.close());

    const call = (method: string, path: string, body?: unknown, key = p.mgmt) =>
      s.call(method, `/${p.projectId}/v1${path}`, { key, body });

    it('join keys: created with the secret once, listed without it, revoked (events)', async () => {
      const r = await call('POST', '/join_keys', {
        name: 'fleet',
        max_uses: 3,
        expires_at: new Date(s.clock.now() + 3_600_000).toISOString(),
        registration_name: 'box-1',
      });
      assert.equal(r.status, 201, r.text);
      assert.match(String(r.body.key), /^swyjk_[A-Za-z0-9_-]{43}$/);
      assert.match(String(r.body.id), /^jk_[0-9a-f]+$/);
      assert.equal(r.body.status, 'active');
      assert.equal(r.body.prefix, String(r.body.key).slice(0, 10));
      const id = String(r.body.id);
      const got = await call('GET', `/join_keys/${id}`);
      assert.equal(got.status, 200);
      assert.equal('key' in got.body, false);
      assert.equal(got.body.max_uses, 3);
      assert.equal(got.body.registration_name, 'box-1');
      const list = await call('GET', '/join_keys');
      assert.ok((list.body.data as Array<Record<string, unknown>>).every((k) => !('key' in k)));
      const created = (await events(s, p.projectUuid, 'join_key.created')).find(
        (e) => e.data.join_key_id === id,
      );
      assert.equal(created?.data.name, 'fleet');
      assert.equal(created?.data.max_uses, 3);
      const rev = await call('DELETE', `/join_keys/${id}`);
      assert.equal(rev.status, 200);
      assert.equal(rev.body.status, 'revoked');
      await call('DELETE', `/join_keys/${id}`);
      const revoked = (await events(s, p.projectUuid, 'join_key.revoked')).filter(
        (e) => e.data.join_key_id === id,
      );
      assert.equal(revoked.length, 1, 'revoking twice emits once');
      expectError(await call('GET', '/join_keys/jk_00'), 404, 'join_key_not_found');
      expectError(await call('POST', '/join_keys', { max_uses: 0 }), 400, 'invalid_body', {
        param: 'max_uses',
      });
      expectError(
        await call('POST', '/join_keys', { expires_at: new Date(s.clock.now() - 1).toISOString() }),
        400,
        'invalid_body',
        {
          param: 'expires_at',
        },
      );
      expectError(
        await call('POST', '/join_keys', { registration_name: 'bad name' }),
        400,
        'invalid_body',
        {
          param: 'registration_name',
        },
      );
      // Another project's join key is not found here.
      const foreign = await s.call('POST', `/${other.projectId}/v1/join_keys`, {
        key: other.mgmt,
        body: {},
      });
      expectError(
        await call('GET', `/join_keys/${String(foreign.body.id)}`),
        404,
        'join_key_not_found',
      );
    });

    it('agents: list, get, update (agent.updated), rotate key (agent.key_rotated), delete (agent.deleted)', async () => {
      s.services.exec.setTransport(t);
      const oldKey = curveKey();
      const a = await enrollAgent(s, p, {
        name: 'worker-a',
        tools: [tool('x.run')],
        transport: t,
        key: oldKey,
      });
      const ws = await workspace(s, p);
      const list = await call('GET', '/agents');
      const mine = (list.body.data as Array<Record<string, unknown>>).find(
        (x) => x.id === a.agentId,
      );
      assert.equal(mine?.status, 'enrolled');
      assert.equal(mine?.manifest_hash, a.manifestHash);
      assert.deepEqual(mine?.tools, [{ name: 'x.run', risk: 'low', mcp_visible: true }]);
      assert.match(String(mine?.join_key_id), /^jk_/);

      const u = await call('PATCH', `/agents/${a.agentId}`, {
        description: 'build box',
        metadata: { rack: '7' },
      });
      assert.equal(u.status, 200, u.text);
      assert.equal(u.body.description, 'build box');
      const upd = (await events(s, p.projectUuid, 'agent.updated')).find(
        (e) => e.data.agent_id === a.agentId,
      );
      assert.deepEqual(upd?.data.changed, ['description', 'metadata']);
      expectError(
        await call('PATCH', `/agents/${a.agentId}`, { registration_name: 'x' }),
        400,
        'invalid_body',
      );

      const newKey = curveKey();
      const rot = await call('POST', `/agents/${a.agentId}/rotate_key`, {
        curve_public_key: newKey,
      });
      assert.equal(rot.status, 200, rot.text);
      assert.equal(rot.body.curve_public_key, newKey);
      assert.equal(await s.services.exec.agentForKey(oldKey), null);
      // A session opened with the old key is not renewed; one with the new key is.
      assert.equal(await s.services.exec.renew(a.agentId, oldKey), null);
      assert.ok(await s.services.exec.renew(a.agentId, newKey));
      assert.deepEqual(await s.services.exec.agentForKey(newKey), { agentId: a.agentId });
      const kr = (await events(s, p.projectUuid, 'agent.key_rotated')).find(
        (e) => e.data.agent_id === a.agentId,
      );
      assert.equal(kr?.data.curve_public_key, newKey);
      expectError(
        await call('POST', `/agents/${a.agentId}/rotate_key`, { curve_public_key: 'short' }),
        400,
        'invalid_body',
        {
          param: 'curve_public_key',
        },
      );

      // Delete: in-flight invocations fail (agent_deleted) and are killed on the agent.
      const inv = await s.call('POST', `/${p.projectId}/v1/exec/invocations`, {
        key: p.exec,
        body: { tool: 'x.run', arguments: { path: '/' }, workspace_id: ws },
      });
      assert.equal(inv.status, 201, inv.text);
      t.cancelled = [];
      const del = await call('DELETE', `/agents/${a.agentId}`);
      assert.equal(del.status, 200, del.text);
      assert.equal(del.body.status, 'deleted');
      assert.equal(del.body.deleted, true);
      assert.deepEqual(t.cancelled, [{ agentId: a.agentId, invocationId: String(inv.body.id) }]);
      const gone = await s.call(
        'GET',
        `/${p.projectId}/v1/exec/invocations/${String(inv.body.id)}`,
        {
          key: p.exec,
        },
      );
      assert.deepEqual((gone.body.error as Record<string, unknown>).code, 'agent_deleted');
      assert.equal(await s.services.exec.agentForKey(newKey), null);
      assert.equal(await s.services.exec.renew(a.agentId), null);
      const d = (await events(s, p.projectUuid, 'agent.deleted')).find(
        (e) => e.data.agent_id === a.agentId,
      );
      assert.equal(d?.data.reason, 'deleted_by_api');
      expectError(await call('DELETE', `/agents/${a.agentId}`), 409, 'invalid_state');
      const visible = await call('GET', '/agents');
      assert.equal(
        (visible.body.data as Array<Record<string, unknown>>).some((x) => x.id === a.agentId),
        false,
      );
      const withDeleted = await call('GET', '/agents?include_deleted=true');
      assert.ok(
        (withDeleted.body.data as Array<Record<string, unknown>>).some((x) => x.id === a.agentId),
      );
      expectError(await call('GET', '/agents/agt_00'), 404, 'agent_not_found');
      expectError(
        await s.call('GET', `/${other.projectId}/v1/agents/${a.agentId}`, { key: other.mgmt }),
        404,
        'agent_not_found',
      );
    });

    it('two deletes of one agent at once: one deletes it (one agent.deleted), the other is 409', async () => {
      const a = await enrollAgent(s, p, { name: 'twice', tools: [tool('x.run')], transport: t });
      // Side by side in the service, so both read the agent live before either deletes.
      const m = s.services.exec.management;
      const both = await Promise.allSettled([
        m.deleteAgent(p.projectUuid, a.agentId),
        m.deleteAgent(p.projectUuid, a.agentId),
      ]);
      assert.deepEqual(
        both.map((r) => r.status),
        ['fulfilled', 'rejected'],
      );
      const err = (both[1] as PromiseRejectedResult).reason as { code?: string; status?: number };
      assert.deepEqual([err.status, err.code], [409, 'invalid_state']);
      const deleted = (await events(s, p.projectUuid, 'agent.deleted')).filter(
        (e) => e.data.agent_id === a.agentId,
      );
      assert.equal(deleted.length, 1);
    });

    it('broker endpoint: the transport’s server key and endpoints; 503 without a transport', async () => {
      s.services.exec.setTransport(null);
      expectError(await call('GET', '/exec/broker'), 503, 'unavailable');
      s.services.exec.setTransport(t);
      const r = await call('GET', '/exec/broker');
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.body, {
        object: 'exec.broker',
        server_public_key: t.serverPublicKey,
        endpoints: t.endpoints,
        lease_ms: 30_000,
      });
    });

    it('scope_insufficient for keys without management', async () => {
      for (const path of ['/join_keys', '/agents']) {
        expectError(await call('GET', path, undefined, p.exec), 403, 'scope_insufficient', {
          type: 'authentication_error',
        });
      }
      expectError(await call('GET', '/agents', undefined, other.mgmt), 403, 'cross_project_access');
    });

    it('broker endpoint is on the /v1/exec surface: execution scope (management kept); others scope_insufficient', async () => {
      s.services.exec.setTransport(t);
      for (const key of [p.exec, p.mgmt]) {
        const r = await call('GET', '/exec/broker', undefined, key);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.body.server_public_key, t.serverPublicKey);
      }
      const e = expectError(
        await call('GET', '/exec/broker', undefined, p.inference),
        403,
        'scope_insufficient',
        { type: 'authentication_error' },
      );
      assert.match(String(e.message), /'execution'/);
      expectError(
        await call('GET', '/exec/broker', undefined, other.exec),
        403,
        'cross_project_access',
      );
      expectError(
        await s.call('GET', `/${p.projectId}/v1/exec/broker`),
        401,
        'authentication_required',
      );
      // Join keys and agents are the management API, not the execution surface.
      expectError(await s.call('GET', `/${p.projectId}/v1/agents`), 401, 'missing_api_key');
    });

    it('operator API: users (token once, unique e-mail), members (role upsert), user_not_found', async () => {
      const u = await s.admin('POST', '/users', { name: 'Ada', email: 'ada@example.com' });
      assert.equal(u.status, 201, u.text);
      expectError(
        await s.admin('POST', '/users', { name: 'Ada 2', email: 'ADA@example.com' }),
        409,
        'conflict',
      );
      const users = await s.admin('GET', '/users');
      assert.ok((users.body.data as Array<Record<string, unknown>>).every((x) => !('token' in x)));
      await s.admin('POST', `/projects/${p.slug}/members`, { user_id: u.body.id, role: 'viewer' });
      await s.admin('POST', `/projects/${p.slug}/members`, { user_id: u.body.id, role: 'admin' });
      const m = await s.admin('GET', `/projects/${p.slug}/members`);
      assert.deepEqual(m.body.data, [
        { object: 'project_member', user_id: u.body.id, role: 'admin' },
      ]);
      expectError(
        await s.admin('POST', `/projects/${p.slug}/members`, { user_id: 'usr_00', role: 'admin' }),
        404,
        'user_not_found',
      );
      expectError(
        await s.admin('POST', `/projects/${p.slug}/members`, { user_id: u.body.id, role: 'king' }),
        400,
        'invalid_body',
      );
    });
  });
}
