/**
 * The auth layer's 401/403 matrix on a project route, driven over HTTP.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { tables } from '../../src/store/index.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

describe('API key authentication', () => {
  let s: TestServer;
  let a: Awaited<ReturnType<typeof seedProject>>;
  let b: Awaited<ReturnType<typeof seedProject>>;

  before(async () => {
    s = await startTestServer();
    a = await seedProject(s, { slug: 'alpha' });
    b = await seedProject(s, { slug: 'beta' });
  });
  after(() => s.close());

  const models = (pid: string) => `/${pid}/v1/models`;

  function expectError(
    r: { status: number; body: Record<string, unknown>; headers: Record<string, unknown> },
    status: number,
    code: string,
    type?: string,
  ) {
    assert.equal(r.status, status, JSON.stringify(r.body));
    const err = r.body.error as Record<string, unknown>;
    assert.equal(err.code, code);
    if (type) assert.equal(err.type, type);
    assert.equal(typeof err.message, 'string');
    assert.ok('param' in err);
    assert.match(String(r.headers['x-request-id']), /^req_[0-9a-f]{32}$/);
  }

  it('accepts a valid key with the scope on its own project', async () => {
    const r = await s.call('GET', models(a.projectId), { key: a.key });
    assert.equal(r.status, 200);
  });

  it('401 for a missing key', async () => {
    expectError(
      await s.call('GET', models(a.projectId)),
      401,
      'missing_api_key',
      'authentication_error',
    );
  });

  it('401 for a malformed key or another auth scheme', async () => {
    expectError(
      await s.call('GET', models(a.projectId), { key: 'sk-not-ours' }),
      401,
      'invalid_api_key',
    );
    const basic = await fetch(s.url + models(a.projectId), {
      headers: { authorization: `Basic ${a.key}` },
    });
    assert.equal(basic.status, 401);
  });

  it('401 for an unknown key of the right shape', async () => {
    const forged = a.key.slice(0, -6) + (a.key.endsWith('AAAAAA') ? 'BBBBBB' : 'AAAAAA');
    expectError(await s.call('GET', models(a.projectId), { key: forged }), 401, 'invalid_api_key');
    // Asked twice: the second answer comes from the negative cache, same outcome.
    expectError(await s.call('GET', models(a.projectId), { key: forged }), 401, 'invalid_api_key');
  });

  it('403 cross_project_access for a key of another project', async () => {
    expectError(
      await s.call('GET', models(b.projectId), { key: a.key }),
      403,
      'cross_project_access',
    );
    // Also for a project that does not exist: the key's project is not the path's.
    expectError(
      await s.call('GET', models('proj_doesnotexist'), { key: a.key }),
      403,
      'cross_project_access',
    );
  });

  it('403 scope_insufficient (type authentication_error) for a missing scope', async () => {
    const k = await s.admin('POST', `/projects/alpha/keys`, { scopes: ['management'] });
    assert.equal(k.status, 201);
    expectError(
      await s.call('GET', models(a.projectId), { key: String(k.body.key) }),
      403,
      'scope_insufficient',
      'authentication_error',
    );
  });

  it('401 once a key expires, to the millisecond of the clock', async () => {
    const expiresAt = new Date(s.clock.now() + 60_000).toISOString();
    const k = await s.admin('POST', `/projects/alpha/keys`, { expiresAt });
    assert.equal(k.status, 201);
    const key = String(k.body.key);
    assert.equal((await s.call('GET', models(a.projectId), { key })).status, 200);
    s.clock.advance(59_999);
    assert.equal((await s.call('GET', models(a.projectId), { key })).status, 200);
    s.clock.advance(1);
    expectError(await s.call('GET', models(a.projectId), { key }), 401, 'invalid_api_key');
  });

  it('401 for a revoked key, even after it was cached', async () => {
    const k = await s.admin('POST', `/projects/alpha/keys`, {});
    const key = String(k.body.key);
    assert.equal((await s.call('GET', models(a.projectId), { key })).status, 200);
    await s.services.store.db
      .update(tables.apiKeys)
      .set({ revokedAt: new Date(s.clock.now()) })
      .where(eq(tables.apiKeys.id, String(k.body.id)));
    s.services.verifier.invalidate(String(k.body.id));
    expectError(await s.call('GET', models(a.projectId), { key }), 401, 'invalid_api_key');
  });

  it('a cached verification is re-read from the database after the cache TTL', async () => {
    const k = await s.admin('POST', `/projects/alpha/keys`, {});
    const key = String(k.body.key);
    assert.equal((await s.call('GET', models(a.projectId), { key })).status, 200);
    await s.services.store.db
      .update(tables.apiKeys)
      .set({ revokedAt: new Date(s.clock.now()) })
      .where(eq(tables.apiKeys.id, String(k.body.id)));
    // Without invalidation the cached entry serves until its TTL passes; the first
    // request after it is still answered from the entry (stale-while-revalidate)
    // and starts one refresh, whose result the following requests see.
    const ttl = s.services.config.keyCacheTtlMs;
    s.clock.advance(ttl + 1);
    assert.equal((await s.call('GET', models(a.projectId), { key })).status, 200);
    let status = 200;
    for (const until = Date.now() + 5000; status === 200 && Date.now() < until;) {
      await new Promise((r) => setTimeout(r, 5));
      status = (await s.call('GET', models(a.projectId), { key })).status;
    }
    expectError(await s.call('GET', models(a.projectId), { key }), 401, 'invalid_api_key');
  });

  it('past twice the cache TTL a cached verification is re-read before answering', async () => {
    const k = await s.admin('POST', `/projects/alpha/keys`, {});
    const key = String(k.body.key);
    assert.equal((await s.call('GET', models(a.projectId), { key })).status, 200);
    await s.services.store.db
      .update(tables.apiKeys)
      .set({ revokedAt: new Date(s.clock.now()) })
      .where(eq(tables.apiKeys.id, String(k.body.id)));
    s.clock.advance(2 * s.services.config.keyCacheTtlMs + 1);
    expectError(await s.call('GET', models(a.projectId), { key }), 401, 'invalid_api_key');
  });

  it('never stores or logs the plaintext key', async () => {
    const k = await s.admin('POST', `/projects/beta/keys`, { name: 'secret-check' });
    const key = String(k.body.key);
    assert.equal((await s.call('GET', models(b.projectId), { key })).status, 200);
    await s.call('GET', models(a.projectId), { key });
    // A key pasted into a path (a client's mistake): its access-log line hides it.
    await s.call('GET', `/${b.projectId}/v1/keys/${key}`, { key });
    await s.call('GET', `/${b.projectId}/v1/keys/${key}?q=1`, { key });
    const token = key.split('_').slice(2).join('_');
    for (const table of ['api_keys', 'api_key_secrets', 'projects', 'endpoints', 'settings']) {
      const r = await s.services.store.db.execute(
        // Table names come from the fixed list above.
        `select row_to_json(t)::text as j from ${table} t` as never,
      );
      const dump = JSON.stringify((r as unknown as { rows: unknown[] }).rows);
      assert.ok(!dump.includes(token), `plaintext key found in ${table}`);
    }
    const logText = s.logs.join('');
    assert.ok(s.logs.length > 0);
    assert.ok(!logText.includes(token), 'plaintext key found in logs');
    assert.ok(!logText.includes(ADMIN_TOKEN_FRAGMENT), 'operator token found in logs');
  });
});

const ADMIN_TOKEN_FRAGMENT = 'test-operator-token';
