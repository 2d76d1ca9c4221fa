/**
 * The real `switchyard worker --register <router>` process, stopped with SIGTERM
 * while it is still trying to register for the first time:
 * - the router is not reachable (nothing listens): it exits 0 within a second,
 *   without waiting for its retry backoff;
 * - the router appears at that instant (its registration is in flight, answered
 *   just after the SIGTERM): it exits 0 within a second and leaves no registration
 *   behind, and it makes no other attempt;
 * - the router holds its answer: it still exits 0 within a second (the call is
 *   abandoned after 0.5 s; a router that records it later expires it).
 */
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createTcpServer } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { spawnSwitchyard, type Spawned } from '../support/process.js';
import { startTestServer, type TestServer } from '../support/harness.js';

const WORKER_TOKEN = 'sigterm-worker-token';

/** A port nothing listens on (just released by the kernel). */
async function freePort(): Promise<number> {
  const srv = createTcpServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

function spawnWorker(routerPort: number): Spawned {
  return spawnSwitchyard(
    [
      'worker',
      ...['--engine', 'sim', '--port', '0', '--model', 'sig-sim', '--tier', 'gpu'],
      ...['--register', `http://127.0.0.1:${routerPort}`],
    ],
    { SWITCHYARD_WORKER_TOKEN: WORKER_TOKEN },
  );
}

/** SIGTERM; the exit code and how long the exit took (ms). */
/** Exit code 0 within a second of the SIGTERM. */
function exitedPromptly(w: Spawned, { code, ms }: { code: number | null; ms: number }): void {
  assert.equal(code, 0, w.stderr());
  assert.ok(ms < 1000, `exit took ${Math.round(ms)} ms\n${w.stdout()}`);
}

async function sigterm(w: Spawned): Promise<{ code: number | null; ms: number }> {
  const t0 = performance.now();
  const code = await w.stop('SIGTERM');
  return { code, ms: performance.now() - t0 };
}

/**
 * The router's front door, opened late: requests are held until `release()`, then
 * passed to the real router, its answers passed back.
 */
interface Door {
  seen: string[];
  arrived: Promise<void>;
  release(): void;
  close(): Promise<void>;
}

async function openDoor(port: number, router: string): Promise<Door> {
  const seen: string[] = [];
  let arrive!: () => void;
  const arrived = new Promise<void>((r) => (arrive = r));
  let open!: () => void;
  const released = new Promise<void>((r) => (open = r));
  const pass = async (req: IncomingMessage, res: ServerResponse, body: Buffer) => {
    await released;
    const up = await request(router + req.url, {
      method: req.method as 'POST',
      headers: {
        authorization: req.headers.authorization ?? '',
        ...(body.length ? { 'content-type': 'application/json' } : {}),
      },
      body: body.length ? body : undefined,
    });
    const text = await up.body.text();
    res.writeHead(up.statusCode, { 'content-type': 'application/json' }).end(text);
  };
  const srv: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      seen.push(`${req.method} ${req.url}`);
      arrive();
      void pass(req, res, Buffer.concat(chunks)).catch(() => res.destroy());
    });
  });
  await new Promise<void>((r) => srv.listen(port, '127.0.0.1', r));
  return {
    seen,
    arrived,
    release: open,
    close: () => {
      srv.closeAllConnections();
      return new Promise<void>((r) => srv.close(() => r()));
    },
  };
}

describe('switchyard worker --register: SIGTERM before the first registration', () => {
  let s: TestServer;
  const workers = async () =>
    (await s.admin('GET', '/workers')).body.data as Array<Record<string, unknown>>;

  before(async () => {
    s = await startTestServer({ env: { SWITCHYARD_WORKER_TOKEN: WORKER_TOKEN } });
    await s.admin('POST', '/models', { name: 'sig-sim', context_window: 4096 });
  });
  after(() => s.close());

  it('with no router reachable: exits 0 at once, not after the retry backoff', async () => {
    const w = spawnWorker(await freePort());
    try {
      await w.waitFor(/registration with \S+ failed .*retrying/);
      exitedPromptly(w, await sigterm(w));
    } finally {
      await w.stop('SIGKILL');
    }
  });

  it('with the router answering just after the SIGTERM: exits 0 within a second, no registration left', async () => {
    const port = await freePort();
    const w = spawnWorker(port);
    let door: Door | null = null;
    try {
      await w.waitFor(/registration with \S+ failed .*retrying/);
      // The router comes up during the backoff; the worker's next try is held in its door.
      door = await openDoor(port, s.url);
      await door.arrived;
      assert.deepEqual(door.seen, ['POST /admin/v1/workers/register']);
      // The router answers just after the worker took the SIGTERM in (it logs the
      // drain it starts with), so the answer cannot come first.
      const exit = sigterm(w);
      await w.waitFor(/"msg":"draining: /, 5000);
      door.release();
      exitedPromptly(w, await exit);
      // The registration the router recorded was taken back, and nothing came after it.
      assert.deepEqual(await workers(), []);
      assert.equal(door.seen.filter((x) => x.endsWith('/register')).length, 1, String(door.seen));
    } finally {
      await w.stop('SIGKILL');
      await door?.close();
    }
  });

  it('with the router holding its answer: exits 0 within a second anyway', async () => {
    const port = await freePort();
    const w = spawnWorker(port);
    let door: Door | null = null;
    try {
      await w.waitFor(/registration with \S+ failed .*retrying/);
      door = await openDoor(port, s.url);
      await door.arrived;
      exitedPromptly(w, await sigterm(w));
      assert.equal(door.seen.length, 1, String(door.seen));
    } finally {
      await w.stop('SIGKILL');
      await door?.close();
    }
  });
});
