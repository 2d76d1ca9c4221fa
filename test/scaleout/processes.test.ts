/**
 * Two `switchyard serve` processes sharing PostgreSQL and Redis, one `sim`
 * worker process: the tier limit is global (admissions across both stay within
 * the free tier's burst + the sustained rate), and a key revoked through one
 * process is refused by the other within 1 s.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { freshDatabase, http, sharedServices, type TestDatabase } from '../support/harness.js';
import { spawnSwitchyard, type Spawned } from '../support/process.js';

const { skip, redisUrl } = sharedServices({ redis: true });

const TOKEN = 'scaleout-operator-token';

describe('two router processes', { skip }, () => {
  let db: TestDatabase;
  const procs: Spawned[] = [];
  const dirs: string[] = [];
  let a = '';
  let b = '';
  let projectId = '';
  let mgmtKey = '';

  before(async () => {
    db = await freshDatabase('postgres');
    await db.store.close();
    const worker = spawnSwitchyard(
      ['worker', '--engine', 'sim', '--port', '0', '--model', 'scale-model'],
      {},
    );
    procs.push(worker);
    const workerUrl = (await worker.waitFor(/serving (http:\/\/\S+\/v1)/))[1]!;
    for (let i = 0; i < 2; i++) {
      const dir = mkdtempSync(join(tmpdir(), 'swy-scale-'));
      dirs.push(dir);
      const p = spawnSwitchyard(['serve'], {
        DATABASE_URL: db.url!,
        REDIS_URL: redisUrl!,
        SWITCHYARD_DATA_DIR: dir,
        SWITCHYARD_ADMIN_TOKEN: TOKEN,
        SWITCHYARD_DEMO: '0',
        PORT: '0',
        LOG_LEVEL: 'warn',
      });
      procs.push(p);
      const url = (await p.waitFor(/listening on (http:\/\/127\.0\.0\.1:\d+)/))[1]!;
      if (i === 0) a = url;
      else b = url;
    }
    const op = (path: string, body: unknown) =>
      http('POST', `${a}/admin/v1${path}`, { auth: `Bearer ${TOKEN}`, body });
    assert.equal((await op('/models', { name: 'scale-model', context_window: 4096 })).status, 201);
    assert.equal(
      (await op('/workers', { model: 'scale-model', tier: 'free', url: workerUrl })).status,
      201,
    );
    const proj = await op('/projects', { slug: 'scale', name: 'Scale' });
    projectId = String(proj.body.id);
    assert.equal(
      (
        await op('/projects/scale/endpoints', {
          slug: 'chat',
          name: 'Chat',
          model: 'scale-model',
          tier: 'free',
        })
      ).status,
      201,
    );
    mgmtKey = String((await op('/projects/scale/keys', { scopes: ['management'] })).body.key);
  });

  after(async () => {
    for (const p of procs) await p.stop('SIGKILL');
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
    await db.drop();
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
