/**
 * Two router instances sharing PostgreSQL and Redis: a key revoked or rotated
 * out through one instance is refused by the other within 1 second, although
 * the other had it cached with a long cache TTL (only pub/sub can explain it);
 * so is a project's billing status or credit changed through the operator API.
 */
import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';
import { startSimWorker } from '../../src/workers/sim/index.js';
import { cluster } from '../support/cluster.js';
import { seedProject, sharedServices, type TestServer } from '../support/harness.js';

const { skip } = sharedServices({ redis: true });

describe('revocation across instances', { skip }, () => {
  const routers = cluster({ redis: true });
  let a: TestServer;
  let b: TestServer;
  before(async () => {
    const env = { SWITCHYARD_KEY_CACHE_TTL_MS: '600000' };
    a = await routers.inProcess({ env });
    b = await routers.inProcess({ env });
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

  it("a project's billing status and credit changed through one instance hold on the other at once", async () => {
    const w = await startSimWorker({ model: 'bill-model' });
    try {
      const must = async (r: Promise<{ status: number; text: string }>) => {
        const res = await r;
        assert.ok(res.status < 300, res.text);
      };
      const seeded = await seedProject(a, {
        slug: 'bill',
        model: 'bill-model',
        modelBody: {
          prompt_price_cents_per_mtok: 100_000,
          completion_price_cents_per_mtok: 100_000,
        },
        tier: 'gpu',
        worker: { url: w.url },
        projectBody: { credit_cents: 1000 },
        endpointSlug: 'chat',
      });
      const key = seeded.key;
      const chat = async () => {
        const r = await b.call('POST', `/${seeded.projectId}/chat/v1/chat/completions`, {
          key,
          body: { model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
        });
        return { status: r.status, code: (r.body.error as { code?: string } | undefined)?.code };
      };
      // b has the balance cached now (its clock does not move: only pub/sub can change it).
      assert.equal((await chat()).status, 200);
      const within = async (want: number, what: string) => {
        for (const start = Date.now(); ;) {
          const r = await chat();
          if (r.status === want) return r;
          if (Date.now() - start > 1000) assert.fail(`${what}: still ${r.status} after 1 s`);
          await new Promise((res) => setTimeout(res, 20));
        }
      };
      await must(a.admin('PATCH', '/projects/bill', { billing_status: 'delinquent' }));
      assert.equal((await within(402, 'delinquent')).code, 'billing_delinquent');
      await must(a.admin('PATCH', '/projects/bill', { billing_status: 'active', credit_cents: 0 }));
      assert.equal((await within(402, 'no credit')).code, 'insufficient_quota');
      await must(a.admin('PATCH', '/projects/bill', { add_credit_cents: 500 }));
      await within(200, 'credit added');
    } finally {
      await w.close();
    }
  });

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
});
