/**
 * Two router instances sharing PostgreSQL and Redis: a key revoked or rotated
 * out through one instance is refused by the other within 1 second, although
 * the other had it cached with a long cache TTL (only pub/sub can explain it).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import {
  freshDatabase,
  seedProject,
  startTestServer,
  type TestDatabase,
  type TestServer,
} from '../support/harness.js';

const dbUrl = process.env.TEST_DATABASE_URL;
const redisUrl = process.env.TEST_REDIS_URL;
if (process.env.CI === 'true' && (!dbUrl || !redisUrl)) {
  throw new Error('CI=true needs TEST_DATABASE_URL and TEST_REDIS_URL');
}

describe(
  'revocation across instances',
  { skip: dbUrl && redisUrl ? false : 'needs PostgreSQL and Redis' },
  () => {
    let db: TestDatabase;
    let a: TestServer;
    let b: TestServer;
    before(async () => {
      db = await freshDatabase('postgres');
      const env = { REDIS_URL: redisUrl!, SWITCHYARD_KEY_CACHE_TTL_MS: '600000' };
      a = await startTestServer({ shared: { url: db.url! }, env });
      b = await startTestServer({ shared: { url: db.url! }, env });
    });
    after(async () => {
      await a.close();
      await b.close();
      await db.drop();
    });

    async function refusedWithin(
      s: TestServer,
      path: string,
      key: string,
      ms: number,
    ): Promise<number> {
      const start = Date.now();
      for (;;) {
        const r = await s.call('GET', path, { key });
        if (r.status === 401) return Date.now() - start;
        if (Date.now() - start > ms) assert.fail(`still ${r.status} after ${ms} ms`);
        await new Promise((res) => setTimeout(res, 20));
      }
    }

    it('a revoked key is refused by the other instance within 1 s', async () => {
      const p = await seedProject(a, { slug: 'multi', scopes: ['inference', 'management'] });
      const path = `/${p.projectId}/v1/models`;
      const k = await a.call('POST', `/${p.projectId}/v1/keys`, { key: p.key, body: {} });
      const value = String(k.body.key);
      assert.equal((await a.call('GET', path, { key: value })).status, 200);
      assert.equal((await b.call('GET', path, { key: value })).status, 200); // cached on b now
      const r = await a.call('DELETE', `/${p.projectId}/v1/keys/${String(k.body.id)}`, {
        key: p.key,
      });
      assert.equal(r.status, 200);
      const ms = await refusedWithin(b, path, value, 1000);
      assert.ok(ms <= 1000);
    });

    it('after rotation, the other instance serves each value with its own scopes at once', async () => {
      const p = await seedProject(a, { slug: 'multi2', scopes: ['inference', 'management'] });
      const k = await a.call('POST', `/${p.projectId}/v1/keys`, {
        key: p.key,
        body: { scopes: ['inference', 'management'] },
      });
      const value = String(k.body.key);
      const models = `/${p.projectId}/v1/models`;
      const keys = `/${p.projectId}/v1/keys`;
      // b has verified (and cached) the value with both scopes.
      assert.equal((await b.call('GET', models, { key: value })).status, 200);
      assert.equal((await b.call('GET', keys, { key: value })).status, 200);
      const r = await a.call('POST', `${keys}/${String(k.body.id)}/rotate`, {
        key: p.key,
        body: { scopes: ['inference'] },
      });
      assert.equal(r.status, 200, r.text);
      const fresh = String(r.body.key);
      // The old value keeps inference for its grace period, and loses management on
      // the other instance at once...
      assert.equal((await b.call('GET', models, { key: value })).status, 200);
      assert.equal((await b.call('GET', keys, { key: value })).status, 403);
      // ...and the new value has the new scopes there too.
      assert.equal((await b.call('GET', models, { key: fresh })).status, 200);
      assert.equal((await b.call('GET', keys, { key: fresh })).status, 403);
    });
  },
);
