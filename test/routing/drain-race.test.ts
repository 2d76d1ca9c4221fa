/**
 * A drain that lands while a monitor pass is checking the worker: the pass read the
 * worker's status before the drain, and its verdict (healthy again, or unhealthy)
 * must not overwrite `draining` (fake clock; the worker's /metrics answer is held
 * until the drain has been recorded).
 */
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { listenWorker } from '../support/fake-worker.js';
import {
  monitorPasses,
  startTestServer,
  type TestServer,
  workerStatus,
} from '../support/harness.js';

const SCRAPE_MS = 1000;
const METRICS = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n';

describe('a drain during a monitor pass', () => {
  let s: TestServer;
  let w: { url: string; close: () => Promise<void> };
  let failing = false;
  /** While set, scrapes wait here; `arrived` once both workers' scrapes have. */
  let held: { arrived: () => void; res: ServerResponse[] } | null = null;
  const status = (id: string) => workerStatus(s, id);

  before(async () => {
    s = await startTestServer({
      env: {
        SWITCHYARD_ROUTE_CACHE_TTL_MS: '0',
        SWITCHYARD_WORKER_SCRAPE_MS: String(SCRAPE_MS),
        SWITCHYARD_WORKER_FAILED_CHECKS: '3',
      },
    });
    w = await listenWorker(
      createServer((req, res) => {
        if (req.url !== '/metrics') return res.writeHead(404).end();
        if (held) {
          held.res.push(res);
          if (held.res.length === 2) held.arrived();
          return;
        }
        if (failing) return res.writeHead(500).end();
        res.writeHead(200, { 'content-type': 'text/plain' }).end(METRICS);
      }),
    );
    await s.admin('POST', '/models', { name: 'rm', context_window: 4096 });
    for (const id of ['race-up', 'race-down']) {
      const r = await s.admin('POST', '/workers', {
        model: 'rm',
        tier: id === 'race-up' ? 'gpu' : 'cpu',
        url: w.url,
        id,
      });
      assert.equal(r.status, 201, r.text);
    }
    s.services.monitor.start();
    await s.services.monitor.settled();
  });
  after(async () => {
    await s.services.monitor.stop();
    await s.close();
    await w.close();
  });

  /** Starts a pass, drains `id` while the pass waits for the worker, then answers it. */
  async function drainDuringPass(id: string, answer: (res: ServerResponse) => void) {
    let arrived!: () => void;
    const reached = new Promise<void>((resolve) => (arrived = resolve));
    held = { arrived, res: [] };
    s.clock.advance(SCRAPE_MS);
    await reached;
    const d = await s.admin('POST', `/workers/${id}/drain`);
    assert.equal(d.status, 200, d.text);
    assert.equal(await status(id), 'draining');
    const h = held;
    held = null;
    // Both workers share the server: answer both scrapes of this pass.
    for (const res of h.res) answer(res);
    await s.services.monitor.settled();
  }

  it('a worker coming back during the pass stays draining', async () => {
    failing = true;
    await monitorPasses(s, 3 * SCRAPE_MS, SCRAPE_MS);
    assert.equal(await status('race-up'), 'unhealthy');
    failing = false;
    await drainDuringPass('race-up', (res) =>
      res.writeHead(200, { 'content-type': 'text/plain' }).end(METRICS),
    );
    assert.equal(await status('race-up'), 'draining', 'the pass undid the drain');
  });

  it('a worker failing its last check during the pass stays draining', async () => {
    await s.admin('POST', '/workers/race-up/resume');
    failing = false;
    await monitorPasses(s, SCRAPE_MS, SCRAPE_MS);
    assert.equal(await status('race-down'), 'healthy');
    failing = true;
    await monitorPasses(s, 2 * SCRAPE_MS, SCRAPE_MS);
    assert.equal(await status('race-down'), 'healthy');
    await drainDuringPass('race-down', (res) => res.writeHead(500).end());
    assert.equal(await status('race-down'), 'draining', 'the pass undid the drain');
  });
});
