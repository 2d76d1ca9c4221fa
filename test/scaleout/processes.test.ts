/**
 * Two `switchyard serve` processes sharing PostgreSQL and Redis, one `sim`
 * worker process: the tier limit is global (admissions across both stay within
 * the free tier's burst + the sustained rate), and a key revoked through one
 * process is refused by the other within 1 s.
 */
import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';
import { cluster } from '../support/cluster.js';
import { http, seedProject, sharedServices } from '../support/harness.js';

const { skip } = sharedServices({ redis: true });

describe('two router processes', { skip }, () => {
  const routers = cluster({ redis: true, store: false });
  let a = '';
  let b = '';
  let projectId = '';
  let mgmtKey = '';

  before(async () => {
    const worker = await routers.simWorker('scale-model');
    const first = await routers.serve();
    a = first.url;
    b = (await routers.serve()).url;
    const seeded = await seedProject(first, {
      slug: 'scale',
      model: 'scale-model',
      tier: 'free',
      worker: { url: worker.url },
      endpointSlug: 'chat',
      scopes: ['management'],
    });
    projectId = seeded.projectId;
    mgmtKey = seeded.key;
  });

  async function newKey(body: Record<string, unknown>): Promise<{ id: string; key: string }> {
    const r = await http('POST', `${a}/${projectId}/v1/keys`, {
      auth: `Bearer ${mgmtKey}`,
      body,
    });
    assert.equal(r.status, 201, r.text);
    return { id: String(r.body.id), key: String(r.body.key) };
  }

  it('enforces one global tier limit across both instances', async () => {
    const { key } = await newKey({ quotaRequests: 100_000 });
    const started = Date.now();
    let admitted = 0;
    const statuses: number[] = [];
    // Alternate between the instances, 200 requests as fast as they come.
    for (let i = 0; i < 200; i++) {
      const r = await http('POST', `${i % 2 ? b : a}/${projectId}/chat/v1/chat/completions`, {
        auth: `Bearer ${key}`,
        body: { model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 },
      });
      statuses.push(r.status);
      if (r.status === 200) admitted++;
    }
    const elapsed = Date.now() - started;
    // Free tier: burst + 1 = 33 at once, then one per 937.5 ms. Two independent
    // per-instance limits would admit about twice as many.
    const bound = 33 + Math.ceil(elapsed / 937.5) + 1;
    assert.ok(admitted >= 33, `admitted ${admitted}`);
    assert.ok(admitted <= bound, `admitted ${admitted} > ${bound} in ${elapsed} ms`);
    assert.ok(statuses.includes(429));
  });

  it('a key revoked through one instance is refused by the other within 1 s', async () => {
    const { id, key } = await newKey({});
    const path = `/${projectId}/v1/models`;
    assert.equal((await http('GET', b + path, { auth: `Bearer ${key}` })).status, 200);
    const revoke = await http('DELETE', `${a}/${projectId}/v1/keys/${id}`, {
      auth: `Bearer ${mgmtKey}`,
    });
    assert.equal(revoke.status, 200);
    const t0 = Date.now();
    for (;;) {
      const r = await http('GET', b + path, { auth: `Bearer ${key}` });
      if (r.status === 401) break;
      assert.ok(Date.now() - t0 < 1000, 'still accepted after 1 s');
      await new Promise((res) => setTimeout(res, 10));
    }
  });
});
