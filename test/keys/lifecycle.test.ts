/**
 * The key lifecycle through the key management API (scope `management`):
 * create, rotate with a 24-hour grace for the old value, scope changes through
 * rotation, revoke, expiry; IP filters and endpoint binding.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { sql } from 'drizzle-orm';
import { http, seedProject, startTestServer, type TestServer } from '../support/harness.js';

const DAY = 24 * 60 * 60 * 1000;

function code(r: { body: Record<string, unknown> }): unknown {
  return (r.body.error as Record<string, unknown> | undefined)?.code;
}

describe('key management API', () => {
  let s: TestServer;
  let p: Awaited<ReturnType<typeof seedProject>>;
  let mgmt: string;
  before(async () => {
    s = await startTestServer();
    p = await seedProject(s, { slug: 'life', scopes: ['management'] });
    mgmt = p.key;
  });
  after(() => s.close());

  const keys = (path = '') => `/${p.projectId}/v1/keys${path}`;
  const models = () => `/${p.projectId}/v1/models`;

  it('needs the management scope', async () => {
    const k = await s.call('POST', keys(), { key: mgmt, body: { scopes: ['inference'] } });
    const r = await s.call('GET', keys(), { key: String(k.body.key) });
    assert.equal(r.status, 403);
    assert.equal(code(r), 'scope_insufficient');
    assert.equal((await s.call('GET', keys())).status, 401);
  });

  it('lastUsedAt: null until used, then the time of the last use, written within a minute', async () => {
    const r = await s.call('POST', keys(), { key: mgmt, body: { scopes: ['inference'] } });
    const id = String(r.body.id);
    const lastUsed = async () =>
      (await s.call('GET', keys(`/${id}`), { key: mgmt })).body.lastUsedAt as string | null;
    assert.equal(r.body.lastUsedAt, null);
    // Written by the next write after any earlier timer: drain what is pending.
    await s.services.verifier.flushUse();
    assert.equal(await lastUsed(), null);
    assert.equal((await s.call('GET', models(), { key: String(r.body.key) })).status, 200);
    const usedAt = new Date(s.clock.now()).toISOString();
    s.clock.advance(30_000);
    assert.equal((await s.call('GET', models(), { key: String(r.body.key) })).status, 200);
    const laterAt = new Date(s.clock.now()).toISOString();
    assert.notEqual(usedAt, laterAt);
    // The minute's timer writes it (the clock's timer, no sleep but for the write).
    s.clock.advance(60_000);
    for (const until = Date.now() + 5_000; (await lastUsed()) !== laterAt && Date.now() < until;)
      await new Promise((res) => setTimeout(res, 20));
    assert.equal(await lastUsed(), laterAt);
    // An older time never moves it back (another instance may have written a later one).
    await s.services.store.db.execute(
      sql`UPDATE api_keys SET last_used_at = ${new Date(s.clock.now() + 1000).toISOString()}::timestamptz WHERE id = ${id}::uuid`,
    );
    assert.equal((await s.call('GET', models(), { key: String(r.body.key) })).status, 200);
    await s.services.verifier.flushUse();
    assert.equal(await lastUsed(), new Date(s.clock.now() + 1000).toISOString());
  });

  it('creates a key, shows the value once, lists and gets it without secrets', async () => {
    const r = await s.call('POST', keys(), {
      key: mgmt,
      body: { name: 'app', scopes: ['inference'] },
    });
    assert.equal(r.status, 201);
    const value = String(r.body.key);
    assert.match(value, /^swy_life_[A-Za-z0-9_-]{43}$/);
    const got = await s.call('GET', keys(`/${String(r.body.id)}`), { key: mgmt });
    assert.equal(got.status, 200);
    assert.equal(got.body.name, 'app');
    assert.equal(got.body.status, 'active');
    assert.equal('key' in got.body, false);
    const list = await s.call('GET', keys(), { key: mgmt });
    assert.ok(!list.text.includes(value));
    assert.ok(!list.text.includes(value.slice(-20)));
    assert.equal((await s.call('GET', keys('/not-a-uuid'), { key: mgmt })).status, 404);
    const past = await s.call('POST', keys(), {
      key: mgmt,
      body: { expiresAt: new Date(s.clock.now() - 1000).toISOString() },
    });
    assert.equal(past.status, 400);
    assert.equal((past.body.error as Record<string, unknown>).param, 'expiresAt');
  });

  it('an expiresAt past the year 9999 (UTC) is a 400 naming it, not a 500; the last instant before it is kept', async () => {
    // 9999-12-31T23:59:59-23:59 is in the year 10000 UTC, which a timestamp cannot be written as.
    for (const expiresAt of ['9999-12-31T23:59:59-23:59', '9999-12-31T23:59:59-01:00']) {
      const r = await s.call('POST', keys(), { key: mgmt, body: { expiresAt } });
      assert.equal(r.status, 400, r.text);
      assert.equal((r.body.error as Record<string, unknown>).param, 'expiresAt');
      const admin = await s.admin('POST', '/projects/life/keys', { expiresAt });
      assert.equal(admin.status, 400, admin.text);
    }
    const last = await s.call('POST', keys(), {
      key: mgmt,
      body: { expiresAt: '9999-12-31T23:59:59.999Z' },
    });
    assert.equal(last.status, 201, last.text);
    assert.equal(last.body.expiresAt, '9999-12-31T23:59:59.999Z');
    const got = await s.call('GET', keys(`/${String(last.body.id)}`), { key: mgmt });
    assert.equal(got.body.expiresAt, '9999-12-31T23:59:59.999Z');
  });

  it('rotation: new value at once, old value for exactly 24 hours, prefix reset, new scopes', async () => {
    const c = await s.call('POST', keys(), { key: mgmt, body: { scopes: ['inference'] } });
    const id = String(c.body.id);
    const oldValue = String(c.body.key);
    assert.equal((await s.call('GET', models(), { key: oldValue })).status, 200);
    const rotatedAt = s.clock.now();
    // Adding `execution` takes a key that holds it (management.security.test.ts).
    const admin = await s.admin('POST', `/projects/life/keys`, {
      scopes: ['management', 'execution'],
    });
    const r = await s.call('POST', keys(`/${id}/rotate`), {
      key: String(admin.body.key),
      body: { scopes: ['inference', 'execution'] },
    });
    assert.equal(r.status, 200, r.text);
    const newValue = String(r.body.key);
    assert.notEqual(newValue, oldValue);
    assert.notEqual(r.body.prefix, c.body.prefix);
    assert.equal(r.body.prefix, newValue.slice(0, 'swy_life_'.length + 4));
    assert.deepEqual(r.body.scopes, ['inference', 'execution']);
    assert.equal(r.body.id, id);
    assert.equal((await s.call('GET', models(), { key: newValue })).status, 200);
    assert.equal((await s.call('GET', models(), { key: oldValue })).status, 200);
    s.clock.set(rotatedAt + DAY - 1);
    assert.equal((await s.call('GET', models(), { key: oldValue })).status, 200);
    s.clock.set(rotatedAt + DAY);
    const gone = await s.call('GET', models(), { key: oldValue });
    assert.equal(gone.status, 401);
    assert.equal(code(gone), 'invalid_api_key');
    assert.equal((await s.call('GET', models(), { key: newValue })).status, 200);
    // Rotating twice inside a day: the first old value keeps its own end.
    const second = await s.call('POST', keys(`/${id}/rotate`), {
      key: String(admin.body.key),
      body: {},
    });
    assert.deepEqual(second.body.scopes, ['inference', 'execution']);
    assert.equal((await s.call('GET', models(), { key: newValue })).status, 200);
    assert.equal((await s.call('GET', models(), { key: String(second.body.key) })).status, 200);
    assert.equal((await s.call('GET', models(), { key: oldValue })).status, 401);
  });

  it('revocation is permanent and covers values in their grace period', async () => {
    const c = await s.call('POST', keys(), { key: mgmt, body: {} });
    const id = String(c.body.id);
    const v1 = String(c.body.key);
    const v2 = String(
      (await s.call('POST', keys(`/${id}/rotate`), { key: mgmt, body: {} })).body.key,
    );
    assert.equal((await s.call('GET', models(), { key: v1 })).status, 200);
    const r = await s.call('DELETE', keys(`/${id}`), { key: mgmt });
    assert.equal(r.status, 200);
    assert.equal(r.body.status, 'revoked');
    for (const v of [v1, v2]) assert.equal((await s.call('GET', models(), { key: v })).status, 401);
    const again = await s.call('DELETE', keys(`/${id}`), { key: mgmt });
    assert.equal(again.body.status, 'revoked');
    const rot = await s.call('POST', keys(`/${id}/rotate`), { key: mgmt, body: {} });
    assert.equal(rot.status, 409);
    assert.equal(code(rot), 'invalid_state');
    s.clock.advance(2 * DAY);
    assert.equal((await s.call('GET', models(), { key: v2 })).status, 401);
  });

  it('expiry is treated as revocation', async () => {
    const c = await s.call('POST', keys(), {
      key: mgmt,
      body: { expiresAt: new Date(s.clock.now() + 5000).toISOString() },
    });
    const v = String(c.body.key);
    assert.equal((await s.call('GET', models(), { key: v })).status, 200);
    s.clock.advance(5000);
    assert.equal((await s.call('GET', models(), { key: v })).status, 401);
    const got = await s.call('GET', keys(`/${String(c.body.id)}`), { key: mgmt });
    assert.equal(got.body.status, 'expired');
  });

  it('an expired key cannot be rotated: 409 invalid_state, as for a revoked key', async () => {
    const c = await s.call('POST', keys(), {
      key: mgmt,
      body: { expiresAt: new Date(s.clock.now() + 5000).toISOString() },
    });
    const id = String(c.body.id);
    const v = String(c.body.key);
    // Until the instant of expiry it rotates.
    s.clock.advance(4999);
    const before = await s.call('POST', keys(`/${id}/rotate`), { key: mgmt, body: {} });
    assert.equal(before.status, 200, before.text);
    const current = String(before.body.key);
    s.clock.advance(1);
    const r = await s.call('POST', keys(`/${id}/rotate`), { key: mgmt, body: {} });
    assert.equal(r.status, 409, r.text);
    assert.equal(code(r), 'invalid_state');
    assert.equal('key' in r.body, false);
    // Nothing changed: same prefix and rotation time, no value works.
    const got = await s.call('GET', keys(`/${id}`), { key: mgmt });
    assert.equal(got.body.status, 'expired');
    assert.equal(got.body.prefix, before.body.prefix);
    assert.equal(got.body.rotatedAt, before.body.rotatedAt);
    for (const value of [v, current]) {
      assert.equal((await s.call('GET', models(), { key: value })).status, 401);
    }
  });

  it('IP allow and block lists, blocklist winning', async () => {
    const make = async (body: Record<string, unknown>) =>
      String((await s.call('POST', keys(), { key: mgmt, body })).body.key);
    const allowOther = await make({ allowedIps: ['10.0.0.1'] });
    const allowLocal = await make({ allowedIps: ['127.0.0.0/8', '::1'] });
    const both = await make({ allowedIps: ['127.0.0.1'], blockedIps: ['127.0.0.1'] });
    const blocked = await make({ blockedIps: ['127.0.0.0/8'] });
    const r = await s.call('GET', models(), { key: allowOther });
    assert.equal(r.status, 403);
    assert.equal(code(r), 'ip_not_allowed');
    assert.equal((await s.call('GET', models(), { key: allowLocal })).status, 200);
    assert.equal((await s.call('GET', models(), { key: both })).status, 403);
    assert.equal((await s.call('GET', models(), { key: blocked })).status, 403);
    // X-Forwarded-For is ignored unless the proxy is trusted.
    const spoof = await http('GET', s.url + models(), {
      auth: `Bearer ${allowOther}`,
      headers: { 'x-forwarded-for': '10.0.0.1' },
    });
    assert.equal(spoof.status, 403);
  });

  it('a key bound to an endpoint gets 403 endpoint_restricted elsewhere', async () => {
    const other = await s.admin('POST', '/projects/life/endpoints', {
      slug: 'other',
      name: 'Other',
      model: 'test-model',
      tier: 'cpu',
    });
    const bound = await s.call('POST', keys(), { key: mgmt, body: { endpointId: p.endpointId } });
    const v = String(bound.body.key);
    const r = await s.call('POST', `/${p.projectId}/other/v1/chat/completions`, {
      key: v,
      body: { model: 'x', messages: [{ role: 'user', content: 'hi' }] },
    });
    assert.equal(r.status, 403);
    assert.equal(code(r), 'endpoint_restricted');
    // On its own endpoint it passes the auth layer (this endpoint has no worker: 503).
    const own = await s.call('POST', `/${p.projectId}/main/v1/chat/completions`, {
      key: v,
      body: { model: 'x', messages: [{ role: 'user', content: 'hi' }] },
    });
    assert.equal(own.status, 503);
    assert.ok(other.status === 201);
    const badBind = await s.call('POST', keys(), {
      key: mgmt,
      body: { endpointId: '00000000-0000-4000-8000-000000000000' },
    });
    assert.equal(badBind.status, 404);
  });
});

describe('trusted proxies', () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer({ env: { SWITCHYARD_TRUSTED_PROXIES: '127.0.0.1/32,::1/128' } });
  });
  after(() => s.close());

  it('take the client address from X-Forwarded-For', async () => {
    const p = await seedProject(s, { slug: 'proxied', scopes: ['management'] });
    const k = await s.call('POST', `/${p.projectId}/v1/keys`, {
      key: p.key,
      body: { allowedIps: ['10.0.0.1'] },
    });
    const v = String(k.body.key);
    const url = `${s.url}/${p.projectId}/v1/models`;
    const ok = await http('GET', url, {
      auth: `Bearer ${v}`,
      headers: { 'x-forwarded-for': '10.0.0.1' },
    });
    assert.equal(ok.status, 200);
    const no = await http('GET', url, {
      auth: `Bearer ${v}`,
      headers: { 'x-forwarded-for': '10.0.0.2' },
    });
    assert.equal(no.status, 403);
  });
});
