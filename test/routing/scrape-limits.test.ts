/**
 * A worker whose /metrics never ends (a misbehaving exporter, or not a metrics page
 * at all): the monitor reads at most the 4 MiB it keeps of a page and goes on, so
 * its pass finishes and the other workers' health is still kept (fake clock). A page
 * that trickles in is cut at the check's timeout (real time, as the connection's):
 * a failed check.
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { listenWorker } from '../support/fake-worker.js';
import { startTestServer, type TestServer, workerStatus } from '../support/harness.js';

const SCRAPE_MS = 1000;

describe('a /metrics page that never ends', () => {
  let s: TestServer;
  let endless: { url: string; close: () => Promise<void> };
  let down: { url: string; close: () => Promise<void> };
  let trickle: { url: string; close: () => Promise<void> };
  const status = (id: string) => workerStatus(s, id);

  before(async () => {
    s = await startTestServer({
      env: {
        SWITCHYARD_ROUTE_CACHE_TTL_MS: '0',
        SWITCHYARD_WORKER_SCRAPE_MS: String(SCRAPE_MS),
        SWITCHYARD_WORKER_FAILED_CHECKS: '1',
      },
    });
    const chunk = '# padding '.repeat(6553) + '\n';
    endless = await listenWorker(
      createServer((req, res) => {
        if (req.url !== '/metrics') return res.writeHead(404).end();
        res.writeHead(200, { 'content-type': 'text/plain' });
        const more = () => {
          while (!res.destroyed && res.write(chunk));
          if (!res.destroyed) res.once('drain', more);
        };
        more();
      }),
    );
    down = await listenWorker(createServer((_req, res) => res.writeHead(500).end()));
    // Never idle long enough for the connection's idle timeout, never done either.
    trickle = await listenWorker(
      createServer((_req, res) => {
        res.writeHead(200, { 'content-type': 'text/plain' });
        const timer = setInterval(() => res.write('# still here\n'), 100);
        res.once('close', () => clearInterval(timer));
      }),
    );
    await s.admin('POST', '/models', { name: 'em', context_window: 4096 });
    for (const [id, url] of [
      ['endless', endless.url],
      ['down', down.url],
      ['trickle', trickle.url],
    ] as const) {
      const r = await s.admin('POST', '/workers', { model: 'em', tier: 'gpu', url, id });
      assert.equal(r.status, 201, r.text);
    }
  });
  after(async () => {
    await s.services.monitor.stop();
    await s.close();
    await endless.close();
    await down.close();
    await trickle.close();
  });

  it('the pass finishes and the failing worker is marked unhealthy', async () => {
    s.services.monitor.start();
    const settled = await Promise.race([
      s.services.monitor.settled().then(() => true),
      sleep(8000).then(() => false),
    ]);
    assert.ok(settled, 'the monitor pass did not finish');
    assert.equal(await status('down'), 'unhealthy');
    assert.equal(await status('endless'), 'healthy');
    assert.equal(await status('trickle'), 'unhealthy');
  });
});
