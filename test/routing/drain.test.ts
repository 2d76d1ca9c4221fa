/**
 * Draining a worker (`POST /admin/v1/workers/{id}/drain` and `/resume`) on a fake
 * clock: a draining worker gets no new request while the others of its pool take
 * them; heartbeats and the monitor's passes leave it draining; with no other worker
 * the endpoint answers 503 `unavailable`; `resume` and re-registration bring it back.
 * The worker token acts only on self-registered workers, the operator token on any.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { startSimWorker, type SimWorker } from '../../src/workers/sim/index.js';
import {
  http,
  monitorPasses,
  type Res,
  startTestServer,
  type TestServer,
  workerStatus,
} from '../support/harness.js';

const WORKER_TOKEN = 'drain-worker-token';
const SCRAPE_MS = 1000;
const HEARTBEAT_MS = 5000;

describe('draining a worker', () => {
  let s: TestServer;
  let a: SimWorker;
  let b: SimWorker;
  let projectId: string;
  let key: string;
  let idA = '';
  let idB = '';
  const worker = (method: string, path: string, body?: unknown, token = WORKER_TOKEN) =>
    http(method, `${s.url}/admin/v1${path}`, { auth: `Bearer ${token}`, body });
  const chat = (): Promise<Res> =>
    s.call('POST', `/${projectId}/dr/v1/chat/completions`, {
      key,
      body: { model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
    });
  const status = (id: string) => workerStatus(s, id);
  const endpoint = async () =>
    (
      (await s.admin('GET', '/projects/dp/endpoints')).body.data as Array<Record<string, unknown>>
    )[0]!;
  const pass = (ms: number) => monitorPasses(s, ms, SCRAPE_MS);
  /** Which workers served `n` requests. */
  const served = async (n: number) => {
    const seen = new Set<string>();
    for (let i = 0; i < n; i++) {
      const r = await chat();
      assert.equal(r.status, 200, r.text);
      seen.add(String(r.headers['x-service-worker-id']));
    }
    return seen;
  };

  before(async () => {
    s = await startTestServer({
      env: {
        SWITCHYARD_ROUTE_CACHE_TTL_MS: '0',
        SWITCHYARD_WORKER_TOKEN: WORKER_TOKEN,
        SWITCHYARD_WORKER_SCRAPE_MS: String(SCRAPE_MS),
        SWITCHYARD_WORKER_HEARTBEAT_MS: String(HEARTBEAT_MS),
      },
    });
    a = await startSimWorker({ model: 'dm' });
    b = await startSimWorker({ model: 'dm' });
    await s.admin('POST', '/models', { name: 'dm', context_window: 4096 });
    const p = await s.admin('POST', '/projects', { slug: 'dp', name: 'DP' });
    projectId = String(p.body.id);
    await s.admin('POST', '/projects/dp/endpoints', {
      slug: 'dr',
      name: 'dr',
      model: 'dm',
      tier: 'gpu',
    });
    key = String((await s.admin('POST', '/projects/dp/keys', {})).body.key);
    for (const w of [a, b]) {
      const r = await worker('POST', '/workers/register', { model: 'dm', tier: 'gpu', url: w.url });
      assert.equal(r.status, 201, r.text);
      if (w === a) idA = String(r.body.id);
      else idB = String(r.body.id);
    }
    s.services.monitor.start();
    await s.services.monitor.settled();
  });
  after(async () => {
    await s.services.monitor.stop();
    await s.close();
    await a.close();
    await b.close();
  });

  it('both workers serve before the drain', async () => {
    assert.deepEqual(await served(8), new Set([idA, idB]));
  });

  it('a draining worker gets no new request; the other takes them all', async () => {
    const r = await worker('POST', `/workers/${idA}/drain`);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.id, idA);
    assert.equal(r.body.status, 'draining');
    assert.equal(await status(idA), 'draining');
    const before = a.stats().received;
    assert.ok(before > 0);
    assert.deepEqual(await served(8), new Set([idB]));
    assert.equal(a.stats().received, before, 'nothing reached the draining worker');
  });

  it('heartbeats and monitor passes leave it draining', async () => {
    for (let i = 0; i < 3; i++) {
      await pass(HEARTBEAT_MS);
      const hb = await worker('POST', `/workers/${idA}/heartbeat`);
      assert.equal(hb.status, 200, hb.text);
      assert.equal(hb.body.status, 'draining');
      await worker('POST', `/workers/${idB}/heartbeat`);
    }
    assert.equal(await status(idA), 'draining');
    const text = (await http('GET', `${s.url}/metrics`)).text;
    assert.match(
      text,
      new RegExp(`^switchyard_worker_healthy\\{worker="${idA}",model="dm",tier="gpu"\\} 0$`, 'm'),
    );
  });

  it('with every worker draining the endpoint answers 503 unavailable with Retry-After', async () => {
    assert.equal((await worker('POST', `/workers/${idB}/drain`)).status, 200);
    const e = await endpoint();
    assert.equal(e.status, 'error');
    assert.equal(e.provisioning_state, 'no_healthy_worker');
    const r = await chat();
    assert.equal(r.status, 503);
    assert.equal((r.body.error as { code: string }).code, 'unavailable');
    assert.ok(r.headers['retry-after']);
  });

  it('resume brings a worker back; re-registration does too', async () => {
    const r = await worker('POST', `/workers/${idB}/resume`);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.status, 'healthy');
    assert.equal((await endpoint()).status, 'active');
    assert.deepEqual(await served(4), new Set([idB]));
    const again = await worker('POST', '/workers/register', {
      model: 'dm',
      tier: 'gpu',
      url: a.url,
    });
    assert.equal(again.status, 200, again.text);
    assert.equal(again.body.id, idA);
    assert.equal(again.body.status, 'healthy');
    assert.deepEqual(await served(8), new Set([idA, idB]));
  });

  it('the worker token drains only self-registered workers; the operator token any', async () => {
    const st = await s.admin('POST', '/workers', {
      model: 'dm',
      tier: 'gpu',
      url: b.url,
      id: 'dr-static',
    });
    assert.equal(st.status, 201, st.text);
    const byWorker = await worker('POST', '/workers/dr-static/drain');
    assert.equal(byWorker.status, 404);
    assert.equal((byWorker.body.error as { code: string }).code, 'worker_not_found');
    assert.equal(await status('dr-static'), 'healthy');
    const byOperator = await s.admin('POST', '/workers/dr-static/drain');
    assert.equal(byOperator.status, 200, byOperator.text);
    assert.equal(await status('dr-static'), 'draining');
    const back = await s.admin('POST', '/workers/dr-static/resume');
    assert.equal(back.body.status, 'healthy');
  });

  it('an unknown worker is 404; a bad token 401', async () => {
    const r = await worker('POST', '/workers/nope/drain');
    assert.equal(r.status, 404);
    assert.equal((r.body.error as { param: string }).param, 'id');
    const bad = await worker('POST', `/workers/${idA}/drain`, undefined, 'wrong');
    assert.equal(bad.status, 401);
    assert.equal(await status(idA), 'healthy');
  });
});
