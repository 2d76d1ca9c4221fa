/**
 * The real `switchyard worker --engine sim --register <router> --token …`
 * process against an in-process router: it registers its model, tier,
 * advertised URL, capacity and scheduling policy, heartbeats at the interval the router gives,
 * serves requests routed to it, registers again when the router forgot it,
 * and deregisters on SIGTERM.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { spawnSwitchyard, type Spawned } from '../support/process.js';
import { http, startTestServer, type TestServer } from '../support/harness.js';

const WORKER_TOKEN = 'proc-worker-token';

async function until(cond: () => Promise<boolean>, what: string, ms = 15_000): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail(`timed out waiting for ${what}`);
}

describe('switchyard worker --register (real process)', () => {
  let s: TestServer;
  let w: Spawned;
  let id = '';
  const workers = async () =>
    (await s.admin('GET', '/workers')).body.data as Array<Record<string, unknown>>;

  before(async () => {
    s = await startTestServer({
      env: {
        SWITCHYARD_ROUTE_CACHE_TTL_MS: '0',
        SWITCHYARD_WORKER_TOKEN: WORKER_TOKEN,
        SWITCHYARD_WORKER_HEARTBEAT_MS: '200',
      },
    });
    await s.admin('POST', '/models', { name: 'proc-sim', context_window: 4096 });
    await s.admin('POST', '/projects', { slug: 'rp', name: 'RP' });
    await s.admin('POST', '/projects/rp/endpoints', {
      slug: 'chat',
      name: 'C',
      model: 'proc-sim',
      tier: 'gpu',
    });
  });
  after(async () => {
    await w?.stop('SIGKILL');
    await s.close();
  });

  it('a wrong token is refused at start-up (exit 2)', async () => {
    const bad = spawnSwitchyard(
      ['worker', '--engine', 'sim', '--port', '0', '--model', 'proc-sim', '--register', s.url],
      { SWITCHYARD_WORKER_TOKEN: 'wrong' },
    );
    const code = await new Promise<number | null>((r) => bad.child.on('exit', (c) => r(c)));
    assert.equal(code, 2);
    assert.match(bad.stderr(), /refused registration/);
  });

  it('registers (token from the environment) and serves what the router sends it', async () => {
    w = spawnSwitchyard(
      [
        'worker',
        '--engine',
        'sim',
        '--port',
        '0',
        '--model',
        'proc-sim',
        '--tier',
        'gpu',
        '--capacity',
        '16',
        '--scheduling-policy',
        'priority',
        '--register',
        s.url,
      ],
      { SWITCHYARD_WORKER_TOKEN: WORKER_TOKEN },
    );
    id = (await w.waitFor(/"msg":"registered with \S+ as ([^\s"]+)"/))[1]!;
    const rec = (await workers()).find((x) => x.id === id)!;
    assert.equal(rec.source, 'registered');
    assert.equal(rec.model, 'proc-sim');
    assert.equal(rec.tier, 'gpu');
    assert.equal(rec.capacity, 16);
    assert.equal(rec.scheduling_policy, 'priority');
    assert.match(String(rec.url), /^http:\/\/127\.0\.0\.1:\d+\/v1$/);

    const p = await s.admin('GET', '/projects/rp');
    const k = await s.admin('POST', '/projects/rp/keys', {});
    const r = await http('POST', `${s.url}/${String(p.body.id)}/chat/v1/chat/completions`, {
      auth: `Bearer ${String(k.body.key)}`,
      body: { model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
    });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers['x-service-worker-id'], id);
  });

  it('heartbeats at the interval the router gave', async () => {
    s.clock.advance(10_000);
    const want = Math.floor(s.clock.now() / 1000);
    await until(
      async () => (await workers()).find((x) => x.id === id)?.last_heartbeat_at === want,
      'a heartbeat',
    );
  });

  it('registers again (same id) when the router forgot it', async () => {
    assert.equal((await s.admin('DELETE', `/workers/${id}`)).status, 200);
    await until(async () => (await workers()).some((x) => x.id === id), 're-registration');
    assert.match(w.stdout(), /registering again/);
  });

  it('SIGTERM deregisters, then exits 0', async () => {
    const code = await w.stop('SIGTERM');
    assert.equal(code, 0);
    assert.match(w.stdout(), new RegExp(`deregistered ${id}`));
    assert.equal(
      (await workers()).some((x) => x.id === id),
      false,
    );
  });
});
