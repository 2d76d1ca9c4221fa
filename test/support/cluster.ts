/**
 * Several routers on one throwaway PostgreSQL database, for the multi-instance
 * suites: `switchyard serve` processes, `switchyard worker` processes, other runs
 * of the binary and in-process routers (harness.ts), with their data directories.
 *
 * `cluster()` is called in a `describe` body, ahead of the suite's own hooks: it
 * registers a `before` hook that makes the database (so the suite's `before` finds
 * it) and one `after` hook that tears everything down in dependency order, SIGKILL
 * to every process still running, then the in-process routers, the database and
 * the directories. node:test runs `after` hooks in the order they were declared, so
 * a suite whose own cleanup must come first (timers that would start a process)
 * declares that `after` before the cluster. Until then a process 'exit' listener
 * SIGKILLs whatever is still running if the test process dies first.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before } from 'node:test';
import {
  ADMIN_TOKEN,
  freshDatabase,
  http,
  startTestServer,
  type Res,
  type TestDatabase,
  type TestServer,
} from './harness.js';
import { spawnSwitchyard, type Spawned } from './process.js';

/** The line `switchyard serve` prints once it accepts requests; group 1 is its base URL. */
export const LISTENING = /Switchyard listening on (http:\/\/\S+)/;
/** The line `switchyard worker` prints once it serves; group 1 is its `/v1` URL. */
export const WORKER_SERVING = /serving (http:\/\/\S+\/v1)/;

/** A `switchyard serve` process that is listening. */
export interface RouterProcess {
  proc: Spawned;
  /** Its base URL (`http://127.0.0.1:<port>`). */
  url: string;
  /** A call to its operator API (`/admin/v1` + path) with its admin token. */
  admin(method: string, path: string, body?: unknown): Promise<Res>;
}

export interface ServeOptions {
  /** After `serve` (e.g. `['--roles', 'api']`). */
  args?: string[];
  /** Added to, and overriding, the defaults (see `spawnServe`). */
  env?: Record<string, string>;
  /** The data directory; a new one (removed after the suite) when absent. */
  dataDir?: string;
}

export interface Cluster {
  /** The database; made by the cluster's `before` hook. */
  readonly db: TestDatabase;
  /** Its URL. */
  readonly url: string;
  /** Every process started, in order; exited ones stay, with their output. */
  readonly spawned: readonly Spawned[];
  /** A new directory, removed after the suite. */
  dataDir(): string;
  /** Runs the binary with `args` and `env` (over process.ts's base environment). */
  spawn(args: string[], env?: Record<string, string>): Spawned;
  /**
   * Starts `switchyard serve` on the database without waiting for it: DATABASE_URL,
   * SWITCHYARD_DATA_DIR, SWITCHYARD_ADMIN_TOKEN (harness's ADMIN_TOKEN),
   * SWITCHYARD_DEMO=0, PORT=0, LOG_LEVEL=warn and, for a cluster made with
   * `redis`, REDIS_URL; then `opts.env`.
   */
  spawnServe(opts?: ServeOptions): Spawned;
  /** `spawnServe`, then waits (30 s unless `timeoutMs`) for it to listen. */
  serve(opts?: ServeOptions & { timeoutMs?: number }): Promise<RouterProcess>;
  /** A `switchyard worker --engine sim` process for `model`, once it serves. */
  simWorker(
    model: string,
    opts?: { args?: string[]; timeoutMs?: number },
  ): Promise<{ proc: Spawned; url: string }>;
  /** An in-process router (harness.ts) on the database, with REDIS_URL for `redis`. */
  inProcess(opts?: { env?: Record<string, string> }): Promise<TestServer>;
}

/** The base URL a `serve` process prints (see `LISTENING`), waiting up to `timeoutMs`. */
export async function listening(p: Spawned, timeoutMs?: number): Promise<string> {
  return (await p.waitFor(LISTENING, timeoutMs))[1]!;
}

/** The operator API of the router at `url`. */
export function operator(url: string, token = ADMIN_TOKEN): RouterProcess['admin'] {
  return (method, path, body) =>
    http(method, `${url}/admin/v1${path}`, { auth: `Bearer ${token}`, body });
}

export function cluster(
  opts: {
    /** REDIS_URL for every router (TEST_REDIS_URL; see harness's sharedServices). */
    redis?: boolean;
    /**
     * False when the suite never queries the database itself: the test's own
     * connection is closed once the database is made and migrated.
     */
    store?: boolean;
  } = {},
): Cluster {
  let db: TestDatabase | undefined;
  const spawned: Spawned[] = [];
  const servers: TestServer[] = [];
  const dirs: string[] = [];
  const redis = (): Record<string, string> => {
    if (!opts.redis) return {};
    const url = process.env.TEST_REDIS_URL;
    if (!url) throw new Error('cluster({ redis: true }) needs TEST_REDIS_URL');
    return { REDIS_URL: url };
  };
  const killNow = () => {
    for (const p of spawned) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  };
  const made = (): TestDatabase => {
    if (!db) throw new Error('the cluster database is made in its before hook');
    return db;
  };

  before(async () => {
    process.on('exit', killNow);
    db = await freshDatabase('postgres');
    if (opts.store === false) await db.store.close();
  });
  after(async () => {
    process.off('exit', killNow);
    await Promise.all(spawned.map((p) => p.stop('SIGKILL')));
    for (const s of servers) await s.close();
    await db?.drop();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  const c: Cluster = {
    get db() {
      return made();
    },
    get url() {
      return made().url!;
    },
    spawned,
    dataDir() {
      const dir = mkdtempSync(join(tmpdir(), 'swy-cluster-'));
      dirs.push(dir);
      return dir;
    },
    spawn(args, env = {}) {
      const p = spawnSwitchyard(args, env);
      spawned.push(p);
      return p;
    },
    spawnServe(o = {}) {
      return c.spawn(['serve', ...(o.args ?? [])], {
        DATABASE_URL: c.url,
        SWITCHYARD_DATA_DIR: o.dataDir ?? c.dataDir(),
        SWITCHYARD_ADMIN_TOKEN: ADMIN_TOKEN,
        SWITCHYARD_DEMO: '0',
        PORT: '0',
        LOG_LEVEL: 'warn',
        ...redis(),
        ...o.env,
      });
    },
    async serve(o = {}) {
      const proc = c.spawnServe(o);
      const url = await listening(proc, o.timeoutMs);
      return { proc, url, admin: operator(url, o.env?.SWITCHYARD_ADMIN_TOKEN) };
    },
    async simWorker(model, o = {}) {
      const proc = c.spawn([
        'worker',
        '--engine',
        'sim',
        '--port',
        '0',
        '--model',
        model,
        ...(o.args ?? []),
      ]);
      return { proc, url: (await proc.waitFor(WORKER_SERVING, o.timeoutMs))[1]! };
    },
    async inProcess(o = {}) {
      const s = await startTestServer({ shared: { url: c.url }, env: { ...redis(), ...o.env } });
      servers.push(s);
      return s;
    },
  };
  return c;
}
