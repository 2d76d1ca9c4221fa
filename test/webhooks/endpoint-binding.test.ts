/**
 * A key bound to an endpoint (`endpointId`) and the webhook API: its own
 * endpoint's path works; another endpoint's path and the project-level alias
 * (which names no endpoint) get 403 `endpoint_restricted`, for every route.
 * Unbound keys keep both paths.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

const publicResolver = async () => [{ address: '93.184.215.14', family: 4 }];

function err(r: { body: Record<string, unknown> }): Record<string, unknown> {
  return (r.body.error ?? {}) as Record<string, unknown>;
}

describe('webhook API and endpoint-bound keys', () => {
  let s: TestServer;
  let p: Awaited<ReturnType<typeof seedProject>>;
  let bound: string;
  let webhookId: string;
  before(async () => {
    s = await startTestServer({ deps: { webhookResolver: publicResolver } });
    p = await seedProject(s, { slug: 'bindwh', scopes: ['management'] });
    const other = await s.admin('POST', '/projects/bindwh/endpoints', {
      slug: 'other',
      name: 'Other',
      model: 'test-model',
      tier: 'cpu',
    });
    assert.equal(other.status, 201, other.text);
    const k = await s.call('POST', `/${p.projectId}/v1/keys`, {
      key: p.key,
      body: { scopes: ['management'], endpointId: p.endpointId },
    });
    assert.equal(k.status, 201, k.text);
    bound = String(k.body.key);
    const w = await s.call('POST', `/${p.projectId}/v1/webhooks`, {
      key: p.key,
      body: { url: 'https://hooks.example.com/in', events: ['exec.completed'] },
    });
    assert.equal(w.status, 201, w.text);
    webhookId = String(w.body.id);
  });
  after(() => s.close());

  it("a bound key manages webhooks under its own endpoint's path", async () => {
    const base = `/${p.projectId}/main/v1/webhooks`;
    const list = await s.call('GET', base, { key: bound });
    assert.equal(list.status, 200, list.text);
    assert.equal((await s.call('GET', `${base}/${webhookId}`, { key: bound })).status, 200);
  });

  it("a bound key gets 403 endpoint_restricted on another endpoint's webhook routes", async () => {
    const base = `/${p.projectId}/other/v1/webhooks`;
    const routes: Array<[string, string, unknown?]> = [
      ['POST', base, { url: 'https://hooks.example.com/x', events: ['exec.completed'] }],
      ['GET', base],
      ['GET', `${base}/${webhookId}`],
      ['PUT', `${base}/${webhookId}`, { description: 'changed' }],
      ['POST', `${base}/${webhookId}/test`],
      ['GET', `${base}/${webhookId}/deliveries`],
      ['GET', `${base}/${webhookId}/deliveries/del_x/attempts`],
      ['POST', `${base}/${webhookId}/deliveries/del_x/redeliver`],
      ['DELETE', `${base}/${webhookId}`],
    ];
    for (const [method, path, body] of routes) {
      const r = await s.call(method, path, { key: bound, body });
      assert.equal(r.status, 403, `${method} ${path}: ${r.text}`);
      assert.equal(err(r).code, 'endpoint_restricted', `${method} ${path}`);
      assert.equal(err(r).type, 'permission_error');
    }
    // Nothing changed through the refused calls.
    const still = await s.call('GET', `/${p.projectId}/v1/webhooks/${webhookId}`, { key: p.key });
    assert.equal(still.status, 200);
    assert.equal(still.body.description, '');
    // An unknown endpoint is still 404, bound key or not.
    const none = await s.call('GET', `/${p.projectId}/nosuch/v1/webhooks`, { key: bound });
    assert.equal(none.status, 404);
    assert.equal(err(none).code, 'endpoint_not_found');
  });

  it('a bound key gets 403 endpoint_restricted on the project-level webhook alias', async () => {
    const base = `/${p.projectId}/v1/webhooks`;
    for (const [method, path] of [
      ['GET', base],
      ['GET', `${base}/${webhookId}`],
      ['DELETE', `${base}/${webhookId}`],
    ] as const) {
      const r = await s.call(method, path, { key: bound });
      assert.equal(r.status, 403, `${method} ${path}: ${r.text}`);
      assert.equal(err(r).code, 'endpoint_restricted');
    }
    assert.equal((await s.call('GET', `${base}/${webhookId}`, { key: p.key })).status, 200);
  });

  it('an unbound key reaches webhooks on every endpoint path and the alias', async () => {
    for (const path of [
      `/${p.projectId}/main/v1/webhooks`,
      `/${p.projectId}/other/v1/webhooks`,
      `/${p.projectId}/v1/webhooks`,
    ]) {
      const r = await s.call('GET', path, { key: p.key });
      assert.equal(r.status, 200, `${path}: ${r.text}`);
    }
  });
});
