/**
 * The worker registry's health on a fake clock: self-registration with the
 * worker token, heartbeats, missed heartbeats (unhealthy, endpoint `error`,
 * 503 `unavailable` with Retry-After), removal and re-registration; health
 * checks of a static worker that goes down and comes back (re-admission);
 * live signals scraped from the sim's /metrics; per-worker router metrics.
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

const WORKER_TOKEN = 'test-worker-token';
const HEARTBEAT_MS = 5000;
const SCRAPE_MS = 1000;

describe('worker registry and health', () => {
  let s: TestServer;
  let reg: SimWorker;
  let stat: SimWorker;
  let projectId: string;
  let key: string;
  const worker = (method: string, path: string, body?: unknown, token = WORKER_TOKEN) =>
    http(method, `${s.url}/admin/v1${path}`, { auth: `Bearer ${token}`, body });
  const ep = async (slug: string) =>
    (
      (await s.admin('GET', '/projects/rh/endpoints')).body.data as Array<Record<string, unknown>>
    ).find((e) => e.slug === slug)!;
  const chat = (slug: string): Promise<Res> =>
    s.call('POST', `/${projectId}/${slug}/v1/chat/completions`, {
      key,
      body: { model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
    });
  /** Advances the fake clock by whole monitor periods, letting each pass finish. */
  const pass = (ms: number) => monitorPasses(s, ms, SCRAPE_MS);

  before(async () => {
    s = await startTestServer({
      env: {
        SWITCHYARD_ROUTE_CACHE_TTL_MS: '0',
        SWITCHYARD_WORKER_TOKEN: WORKER_TOKEN,
        SWITCHYARD_WORKER_SCRAPE_MS: String(SCRAPE_MS),
        SWITCHYARD_WORKER_HEARTBEAT_MS: String(HEARTBEAT_MS),
        SWITCHYARD_WORKER_MISSED_HEARTBEATS: '3',
        SWITCHYARD_WORKER_EXPIRE_MS: '60000',
        SWITCHYARD_WORKER_FAILED_CHECKS: '3',
      },
    });
    reg = await startSimWorker({ model: 'rm' });
    stat = await startSimWorker({ model: 'sm' });
    await s.admin('POST', '/models', { name: 'rm', context_window: 4096 });
    await s.admin('POST', '/models', { name: 'sm', context_window: 4096 });
    const p = await s.admin('POST', '/projects', { slug: 'rh', name: 'RH' });
    projectId = String(p.body.id);
    for (const [slug, model] of [
      ['reg', 'rm'],
      ['stat', 'sm'],
    ]) {
      await s.admin('POST', '/projects/rh/endpoints', { slug, name: slug, model, tier: 'gpu' });
    }
    key = String((await s.admin('POST', '/projects/rh/keys', {})).body.key);
    s.services.monitor.start();
    await s.services.monitor.settled();
  });
  after(async () => {
    await s.services.monitor.stop();
    await s.close();
    await reg.close();
    await stat.close();
  });

  it('an endpoint without workers is provisioning and answers 503 unavailable with Retry-After', async () => {
    const e = await ep('reg');
    assert.equal(e.status, 'provisioning');
    assert.equal(e.provisioning_state, 'waiting_for_worker');
    assert.equal(e.provisioned_worker_id, null);
    const r = await chat('reg');
    assert.equal(r.status, 503);
    assert.equal((r.body.error as { code: string }).code, 'unavailable');
    assert.ok(r.headers['retry-after']);
  });

  it('registration needs the worker token (or the operator token) and a known model', async () => {
    const body = { model: 'rm', tier: 'gpu', url: reg.url };
    assert.equal((await worker('POST', '/workers/register', body, 'wrong')).status, 401);
    // The worker token opens no other operator route.
    assert.equal((await worker('GET', '/workers')).status, 401);
    const unknown = await worker('POST', '/workers/register', { ...body, model: 'nope' });
    assert.equal(unknown.status, 404);
    assert.equal((unknown.body.error as { code: string }).code, 'model_not_found');
    const bad = await worker('POST', '/workers/register', { ...body, url: 'http://x:1/nov1' });
    assert.equal(bad.status, 400);
  });

  let id = '';
  it('a registered worker serves its endpoint at once; the record names it', async () => {
    const r = await worker('POST', '/workers/register', {
      model: 'rm',
      tier: 'gpu',
      url: reg.url,
      capacity: 8,
    });
    assert.equal(r.status, 201, r.text);
    id = String(r.body.id);
    assert.equal(r.body.source, 'registered');
    assert.equal(r.body.status, 'healthy');
    assert.equal(r.body.capacity, 8);
    assert.equal(r.body.heartbeat_interval_ms, HEARTBEAT_MS);
    const e = await ep('reg');
    assert.equal(e.status, 'active');
    assert.equal(e.provisioning_state, 'ready');
    assert.equal(e.provisioned_worker_id, id);
    const c = await chat('reg');
    assert.equal(c.status, 200, c.text);
    assert.equal(c.headers['x-service-worker-id'], id);
  });

  it("live signals: the monitor scrapes the worker's /metrics on the clock", async () => {
    await pass(SCRAPE_MS);
    const sig = s.services.pool.signals(id);
    assert.ok(sig, 'signals after a scrape');
    assert.equal(sig.source, 'switchyard');
    assert.equal(sig.running, 0);
    assert.equal(sig.waiting, 0);
    assert.equal(typeof sig.kvCacheUsage, 'number');
    assert.equal(sig.scrapedAt, s.clock.now());
  });

  it('heartbeats keep it healthy; missed heartbeats make it unhealthy, the endpoint `error`', async () => {
    for (let i = 0; i < 4; i++) {
      await pass(HEARTBEAT_MS);
      const hb = await worker('POST', `/workers/${id}/heartbeat`);
      assert.equal(hb.status, 200, hb.text);
      assert.equal(hb.body.status, 'healthy');
    }
    // Silence for three heartbeat periods (and a bit).
    await pass(3 * HEARTBEAT_MS + SCRAPE_MS);
    const w = (await s.admin('GET', '/workers')).body.data as Array<Record<string, unknown>>;
    assert.equal(w.find((x) => x.id === id)?.status, 'unhealthy');
    const e = await ep('reg');
    assert.equal(e.status, 'error');
    assert.equal(e.provisioning_state, 'no_healthy_worker');
    assert.equal(e.provisioned_worker_id, null);
    const r = await chat('reg');
    assert.equal(r.status, 503);
    assert.equal((r.body.error as { code: string }).code, 'unavailable');
    assert.ok(r.headers['retry-after']);
  });

  it('a heartbeat re-admits it at once', async () => {
    const hb = await worker('POST', `/workers/${id}/heartbeat`);
    assert.equal(hb.body.status, 'healthy');
    assert.equal((await ep('reg')).status, 'active');
    assert.equal((await chat('reg')).status, 200);
  });

  it('after the database was unreachable, heartbeat ages count from its return', async () => {
    const status = () => workerStatus(s, id);
    // The registry cannot be read (nor heartbeats written) for four heartbeat periods.
    const registry = s.services.workers;
    const list = registry.list.bind(registry);
    registry.list = () => Promise.reject(new Error('connect ECONNREFUSED 127.0.0.1:5432'));
    try {
      await pass(4 * HEARTBEAT_MS);
    } finally {
      registry.list = list;
    }
    // Back: the worker is not unhealthy for heartbeats nobody could record.
    await pass(SCRAPE_MS);
    assert.equal(await status(), 'healthy');
    assert.equal((await chat('reg')).status, 200);
    // It must still send them: silent for three periods after the return, unhealthy.
    await pass(3 * HEARTBEAT_MS + SCRAPE_MS);
    assert.equal(await status(), 'unhealthy');
    const hb = await worker('POST', `/workers/${id}/heartbeat`);
    assert.equal(hb.body.status, 'healthy');
  });

  it('silent past the expiry it is removed; its heartbeat gets 404; it registers again', async () => {
    await pass(60_000 + SCRAPE_MS);
    const w = (await s.admin('GET', '/workers')).body.data as Array<Record<string, unknown>>;
    assert.equal(
      w.some((x) => x.id === id),
      false,
    );
    assert.equal((await ep('reg')).status, 'provisioning');
    assert.equal(s.services.pool.signals(id), null);
    const hb = await worker('POST', `/workers/${id}/heartbeat`);
    assert.equal(hb.status, 404);
    assert.equal((hb.body.error as { code: string }).code, 'worker_not_found');
    // Re-registration under the id it had (as the worker process does).
    const again = await worker('POST', '/workers/register', {
      model: 'rm',
      tier: 'gpu',
      url: reg.url,
      id,
    });
    assert.equal(again.status, 201);
    assert.equal(again.body.id, id);
    // Registering the same (model, tier, url) again without an id updates it in place.
    const same = await worker('POST', '/workers/register', {
      model: 'rm',
      tier: 'gpu',
      url: reg.url,
    });
    assert.equal(same.status, 200);
    assert.equal(same.body.id, id);
    assert.equal((await chat('reg')).status, 200);
  });

  it('a static worker cannot be taken over by registration', async () => {
    await s.admin('POST', '/workers', { model: 'sm', tier: 'gpu', url: stat.url, id: 'static-1' });
    const r = await worker('POST', '/workers/register', {
      model: 'sm',
      tier: 'gpu',
      url: stat.url,
      id: 'static-1',
    });
    assert.equal(r.status, 409);
    assert.equal((await worker('POST', '/workers/static-1/deregister')).status, 404);
  });

  it('failed health checks mark a static worker unhealthy; it is re-admitted when it is back', async () => {
    await pass(SCRAPE_MS);
    assert.equal((await ep('stat')).status, 'active');
    const port = stat.port;
    await stat.close();
    await pass(3 * SCRAPE_MS);
    const w = (await s.admin('GET', '/workers')).body.data as Array<Record<string, unknown>>;
    assert.equal(w.find((x) => x.id === 'static-1')?.status, 'unhealthy');
    assert.equal((await ep('stat')).status, 'error');
    assert.equal((await chat('stat')).status, 503);
    stat = await startSimWorker({ model: 'sm', port });
    await pass(SCRAPE_MS);
    assert.equal((await ep('stat')).status, 'active');
    const c = await chat('stat');
    assert.equal(c.status, 200, c.text);
    assert.equal(c.headers['x-service-worker-id'], 'static-1');
  });

  it("per-worker metrics on the router's /metrics", async () => {
    await pass(SCRAPE_MS);
    const text = (await http('GET', `${s.url}/metrics`)).text;
    const has = (re: RegExp) => assert.match(text, re);
    has(new RegExp(`^switchyard_worker_requests_total\\{worker="${id}"\\} [1-9]`, 'm'));
    has(/^switchyard_worker_chosen_total\{worker="static-1"\} [1-9]/m);
    has(new RegExp(`^switchyard_worker_healthy\\{worker="${id}",model="rm",tier="gpu"\\} 1$`, 'm'));
    has(/^switchyard_worker_in_flight\{worker="static-1",model="sm",tier="gpu"\} 0$/m);
    has(/^switchyard_worker_breaker_open\{worker="static-1",model="sm",tier="gpu"\} 0$/m);
    has(/^switchyard_worker_queue_depth\{worker="static-1",model="sm",tier="gpu"\} 0$/m);
    has(/^switchyard_worker_kv_cache_usage\{worker="static-1",model="sm",tier="gpu"\} /m);
    has(
      /^switchyard_worker_scrape_failures_total\{worker="static-1",reason="unreachable"\} [3-9]/m,
    );
  });

  it('deregistration removes the worker; the endpoint waits for a worker again', async () => {
    const r = await worker('POST', `/workers/${id}/deregister`);
    assert.equal(r.status, 200);
    assert.equal(r.body.deleted, true);
    assert.equal((await ep('reg')).status, 'provisioning');
    assert.equal((await chat('reg')).status, 503);
    const text = (await http('GET', `${s.url}/metrics`)).text;
    assert.doesNotMatch(text, new RegExp(`worker="${id}"`));
  });

  it('a worker removed elsewhere (another instance, the database) is forgotten at the next pass; its connections close', async () => {
    assert.equal((await chat('stat')).headers['x-service-worker-id'], 'static-1');
    const origin = new URL(stat.url).origin;
    assert.ok(s.services.upstream.origins.includes(origin));
    assert.match((await http('GET', `${s.url}/metrics`)).text, /worker="static-1"/);
    // Not through this instance's API, which forgets it at once.
    assert.equal(await s.services.workers.remove('static-1'), true);
    await pass(SCRAPE_MS);
    assert.doesNotMatch((await http('GET', `${s.url}/metrics`)).text, /worker="static-1"/);
    assert.equal(s.services.pool.load('static-1'), 0);
    assert.ok(!s.services.upstream.origins.includes(origin), 'its connection pool is closed');
  });
});
