/**
 * What a key may do through the key management API (spec: scopes are fixed at
 * creation and changed only by a rotation naming the new list; a rotated key's old
 * value works for 24 hours):
 * - a key grants nothing beyond what it holds: `inference` always, any other scope
 *   only if the caller has it, on creation and on the value a rotation hands back;
 * - a key bound to an endpoint cannot manage the project's keys;
 * - a rotated-out value keeps, for its grace period, the scopes it was issued with
 *   that the key still has: a rotation that removes a scope removes it from every
 *   older value at once; one that adds a scope gives it to the new value only.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

function err(r: { body: Record<string, unknown> }): Record<string, unknown> {
  return (r.body.error ?? {}) as Record<string, unknown>;
}

describe('key management security', () => {
  let s: TestServer;
  let p: Awaited<ReturnType<typeof seedProject>>;
  before(async () => {
    s = await startTestServer();
    p = await seedProject(s, { slug: 'sec', scopes: ['management'] });
  });
  after(() => s.close());

  const keys = (path = '') => `/${p.projectId}/v1/keys${path}`;
  const operatorKey = async (body: Record<string, unknown>) => {
    const r = await s.admin('POST', '/projects/sec/keys', body);
    assert.equal(r.status, 201, r.text);
    return { id: String(r.body.id), key: String(r.body.key) };
  };

  it('a management key mints inference keys, not scopes it lacks', async () => {
    const ok = await s.call('POST', keys(), { key: p.key, body: {} });
    assert.equal(ok.status, 201, ok.text);
    assert.deepEqual(ok.body.scopes, ['inference']);
    for (const scopes of [['execution'], ['inference', 'research'], ['management', 'execution']]) {
      const r = await s.call('POST', keys(), { key: p.key, body: { scopes } });
      assert.equal(r.status, 403, JSON.stringify(scopes));
      assert.deepEqual([err(r).code, err(r).param], ['scope_insufficient', 'scopes']);
    }
    // Holding it is enough.
    const wide = await operatorKey({ scopes: ['management', 'execution'] });
    const r = await s.call('POST', keys(), { key: wide.key, body: { scopes: ['execution'] } });
    assert.equal(r.status, 201, r.text);
  });

  it('a rotation hands back a value only with scopes the caller holds', async () => {
    const target = await operatorKey({ scopes: ['inference', 'execution'] });
    // Rotating an execution key would give a management-only caller an execution value.
    const r = await s.call('POST', keys(`/${target.id}/rotate`), { key: p.key, body: {} });
    assert.equal(r.status, 403);
    assert.deepEqual([err(r).code, err(r).param], ['scope_insufficient', 'scopes']);
    const added = await s.call('POST', keys(`/${target.id}/rotate`), {
      key: p.key,
      body: { scopes: ['inference', 'research'] },
    });
    assert.equal(added.status, 403);
    // Narrowing it to what the caller may grant is allowed; revoking always is.
    const narrowed = await s.call('POST', keys(`/${target.id}/rotate`), {
      key: p.key,
      body: { scopes: ['inference'] },
    });
    assert.equal(narrowed.status, 200, narrowed.text);
    const other = await operatorKey({ scopes: ['research'] });
    assert.equal((await s.call('DELETE', keys(`/${other.id}`), { key: p.key })).status, 200);
  });

  it('a key bound to an endpoint cannot use project-wide routes (keys, alerts, agents, exec)', async () => {
    const bound = await operatorKey({
      scopes: ['management', 'execution', 'inference'],
      endpointId: p.endpointId,
    });
    const v1 = `/${p.projectId}/v1`;
    for (const [method, path, body] of [
      ['GET', keys(), undefined],
      ['POST', keys(), {}],
      ['POST', `${v1}/budget_alerts`, { name: 'b', threshold_cents: 100 }],
      ['GET', `${v1}/budget_alerts`, undefined],
      ['POST', `${v1}/join_keys`, {}],
      ['GET', `${v1}/agents`, undefined],
      ['POST', `${v1}/exec/workspaces`, { name: 'w' }],
      ['GET', `${v1}/exec/invocations`, undefined],
      ['GET', `${v1}/exec/tools`, undefined],
      ['GET', `${v1}/exec/broker`, undefined],
      ['POST', `${v1}/mcp`, { jsonrpc: '2.0', id: 1, method: 'tools/list' }],
    ] as const) {
      const r = await s.call(method, path, { key: bound.key, ...(body ? { body } : {}) });
      assert.equal(r.status, 403, `${method} ${path}`);
      assert.equal(err(r).code, 'endpoint_restricted');
    }
  });

  it('a refusal for the binding spends no unit of the key’s quota', async () => {
    const bound = await operatorKey({
      scopes: ['management'],
      endpointId: p.endpointId,
      quotaRequests: 2,
      quotaWindow: 60,
    });
    const v1 = `/${p.projectId}/v1`;
    for (const path of [`${v1}/budget_alerts`, `${v1}/agents`, keys(), `${v1}/webhooks`]) {
      const r = await s.call('GET', path, { key: bound.key });
      assert.equal(r.status, 403, path);
      assert.equal(err(r).code, 'endpoint_restricted', path);
    }
    // Its two units are whole: its own endpoint's routes admit two, then 429.
    const own = `/${p.projectId}/main/v1/slos`;
    const statuses = [];
    for (let i = 0; i < 3; i++)
      statuses.push((await s.call('GET', own, { key: bound.key })).status);
    assert.deepEqual(statuses, [200, 200, 429]);
  });

  it('a rotated-out value keeps only the scopes the key still has', async () => {
    const models = `/${p.projectId}/v1/models`;
    const wide = await operatorKey({ scopes: ['management', 'inference'] });
    // inference -> inference + management: the old value reads models and gains no key access.
    const k = await operatorKey({ scopes: ['inference'] });
    const up = await s.call('POST', keys(`/${k.id}/rotate`), {
      key: wide.key,
      body: { scopes: ['inference', 'management'] },
    });
    assert.equal(up.status, 200, up.text);
    assert.equal((await s.call('GET', models, { key: k.key })).status, 200);
    const escalated = await s.call('GET', keys(), { key: k.key });
    assert.equal(escalated.status, 403);
    assert.equal(err(escalated).code, 'scope_insufficient');
    const second = String(up.body.key);
    assert.equal((await s.call('GET', keys(), { key: second })).status, 200);

    // Down to inference again: `management` leaves every older value at once, so the
    // value rotated out cannot rotate the key back up or mint a management key; it
    // still serves inference for its grace period.
    const down = await s.call('POST', keys(`/${k.id}/rotate`), {
      key: wide.key,
      body: { scopes: ['inference'] },
    });
    assert.equal(down.status, 200, down.text);
    for (const old of [second, k.key]) {
      assert.equal((await s.call('GET', models, { key: old })).status, 200);
      const back = await s.call('POST', keys(`/${k.id}/rotate`), {
        key: old,
        body: { scopes: ['inference', 'management'] },
      });
      assert.equal(back.status, 403, back.text);
      assert.equal(err(back).code, 'scope_insufficient');
      const mint = await s.call('POST', keys(), { key: old, body: { scopes: ['management'] } });
      assert.equal(mint.status, 403, mint.text);
    }

    // A rotation that drops every scope an old value had leaves it valid but empty.
    const m = await operatorKey({ scopes: ['inference'] });
    const swap = await s.call('POST', keys(`/${m.id}/rotate`), {
      key: wide.key,
      body: { scopes: ['management'] },
    });
    assert.equal(swap.status, 200, swap.text);
    const gone = await s.call('GET', models, { key: m.key });
    assert.equal(gone.status, 403);
    assert.equal(err(gone).code, 'scope_insufficient');
    const fresh = String(swap.body.key);
    assert.equal((await s.call('GET', keys(), { key: fresh })).status, 200);
    assert.equal((await s.call('GET', models, { key: fresh })).status, 403);
  });
});
