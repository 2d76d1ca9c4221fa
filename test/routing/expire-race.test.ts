/**
 * A self-registered worker that comes back while a monitor pass is checking it: the
 * pass read its old, expired heartbeat before the re-registration, and must not
 * remove the worker that has just registered again (fake clock; the worker's
 * /metrics answer is held until the re-registration has been recorded).
 */
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { listenWorker } from '../support/fake-worker.js';
import { drivers, http, startTestServer, type TestServer } from '../support/harness.js';

const WORKER_TOKEN = 'expire-race-token';
const SCRAPE_MS = 1000;
const EXPIRE_MS = 60_000;
const METRICS = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n';

for (const driver of drivers()) {
  describe(`a re-registration during the pass that expires the worker (${driver})`, () => {
    let s: TestServer;
    let w: { url: string; close: () => Promise<void> };
    let held: { arrived: () => void; res?: ServerResponse } | null = null;
    const register = () =>
      http('POST', `${s.url}/admin/v1/workers/register`, {
        auth: `Bearer ${WORKER_TOKEN}`,
        body: { model: 'xm', tier: 'gpu', url: w.url, id: 'comes-back' },
      });

    before(async () => {
      s = await startTestServer({
        driver,
        env: {
          SWITCHYARD_ROUTE_CACHE_TTL_MS: '0',
          SWITCHYARD_WORKER_TOKEN: WORKER_TOKEN,
          SWITCHYARD_WORKER_SCRAPE_MS: String(SCRAPE_MS),
          SWITCHYARD_WORKER_EXPIRE_MS: String(EXPIRE_MS),
        },
      });
      w = await listenWorker(
        createServer((req, res) => {
          if (req.url !== '/metrics') return res.writeHead(404).end();
          if (held) {
            held.res = res;
            held.arrived();
            return;
          }
          res.writeHead(200, { 'content-type': 'text/plain' }).end(METRICS);
        }),
      );
      await s.admin('POST', '/models', { name: 'xm', context_window: 4096 });
    });
    after(async () => {
      await s.services.monitor.stop();
      await s.close();
      await w.close();
    });

    it('the worker that registered again is kept', async () => {
      assert.equal((await register()).status, 201);
      s.services.monitor.start();
      await s.services.monitor.settled();
      await s.services.monitor.stop();
      // Silent for longer than the expiry, with no pass meanwhile.
      s.clock.advance(EXPIRE_MS + SCRAPE_MS);
      let arrived!: () => void;
      const reached = new Promise<void>((resolve) => (arrived = resolve));
      held = { arrived };
      s.services.monitor.start();
      await reached;
      const again = await register();
      assert.equal(again.status, 200, again.text);
      const h = held;
      held = null;
      h.res!.writeHead(200, { 'content-type': 'text/plain' }).end(METRICS);
      await s.services.monitor.settled();
      const ids = ((await s.admin('GET', '/workers')).body.data as Array<{ id: string }>).map(
        (x) => x.id,
      );
      assert.deepEqual(ids, ['comes-back'], 'the pass removed the worker that came back');
      const hb = await http('POST', `${s.url}/admin/v1/workers/comes-back/heartbeat`, {
        auth: `Bearer ${WORKER_TOKEN}`,
      });
      assert.equal(hb.status, 200, hb.text);
    });

    it('a worker still silent at the expiry is removed', async () => {
      s.clock.advance(EXPIRE_MS + SCRAPE_MS);
      await s.services.monitor.settled();
      const ids = (await s.admin('GET', '/workers')).body.data as unknown[];
      assert.deepEqual(ids, []);
    });
  });
}
