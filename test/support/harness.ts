/**
 * Test harness: an in-process router on an ephemeral port with its own
 * database (in-memory PGlite, or a fresh PostgreSQL database on
 * TEST_DATABASE_URL), a fake clock and a captured log.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { request } from 'undici';
import { loadConfig } from '../../src/config/index.js';
import { buildApp } from '../../src/http/app.js';
import { FakeClock } from '../../src/runtime/clock.js';
import { createLogger } from '../../src/runtime/logger.js';
import { createServices, type Services } from '../../src/runtime/services.js';
import { openStore, type Store } from '../../src/store/index.js';
import { pgliteTemplate, TEST_PGLITE_SHARED_BUFFERS } from './pglite-template.js';

export const ADMIN_TOKEN = 'test-operator-token';

export type Driver = 'pglite' | 'postgres';

/** Drivers the storage contract runs on: PGlite always, PostgreSQL when configured. */
export function drivers(): Driver[] {
  return process.env.TEST_DATABASE_URL ? ['pglite', 'postgres'] : ['pglite'];
}

/** The PostgreSQL and Redis a multi-instance suite shares, from the environment. */
export interface SharedServices {
  /** node:test's `skip` for the suite: false, or the reason it is skipped. */
  skip: string | false;
  /** TEST_DATABASE_URL. */
  databaseUrl: string | undefined;
  /** TEST_REDIS_URL, when the suite asked for Redis. */
  redisUrl: string | undefined;
}

/**
 * What a suite of several routers on one database needs: PostgreSQL
 * (TEST_DATABASE_URL) and, with `redis`, Redis (TEST_REDIS_URL). Without them the
 * suite is skipped, except in CI (CI=true), where this throws: those suites must
 * run there, and a skip would pass unnoticed.
 */
export function sharedServices(opts: { redis?: boolean } = {}): SharedServices {
  const databaseUrl = process.env.TEST_DATABASE_URL;
  const redisUrl = opts.redis ? process.env.TEST_REDIS_URL : undefined;
  const needs = opts.redis ? 'TEST_DATABASE_URL and TEST_REDIS_URL' : 'TEST_DATABASE_URL';
  const missing = !databaseUrl || (opts.redis && !redisUrl);
  if (missing && process.env.CI === 'true') throw new Error(`CI=true needs ${needs}`);
  const what = opts.redis ? 'PostgreSQL and Redis' : 'PostgreSQL';
  return { skip: missing ? `needs ${what} (${needs})` : false, databaseUrl, redisUrl };
}

export interface TestDatabase {
  store: Store;
  url: string | undefined;
  drop(): Promise<void>;
}

/**
 * A fresh, migrated database on the driver. PGlite runs in the test's own thread
 * unless `thread` is set: starting the router's PGlite worker thread (which loads
 * tsx, PGlite and its WebAssembly again in a new isolate) doubled the cost of each
 * open (2.2–2.7 s against 1.1–1.2 s, measured back to back on 2 cores). The
 * thread client itself runs the storage contract (test/store/contract.test.ts) and
 * serves every spawned `switchyard serve` of the process tests.
 */
export async function freshDatabase(
  driver: Driver,
  opts: { thread?: boolean } = {},
): Promise<TestDatabase> {
  if (driver === 'pglite') {
    const store = await openStore({
      dataDir: 'memory://',
      pgliteFrom: await pgliteTemplate(),
      pgliteThread: opts.thread ?? false,
      pgliteSharedBuffers: TEST_PGLITE_SHARED_BUFFERS,
    });
    return { store, url: undefined, drop: () => store.close() };
  }
  const base = process.env.TEST_DATABASE_URL;
  if (!base) throw new Error('TEST_DATABASE_URL is not set');
  const name = `swy_test_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
  const admin = new pg.Client({ connectionString: base });
  await admin.connect();
  await admin.query(`create database ${name}`);
  await admin.end();
  const u = new URL(base);
  u.pathname = `/${name}`;
  const url = u.toString();
  const store = await openStore({ dataDir: '', databaseUrl: url, poolSize: 4 });
  return {
    store,
    url,
    drop: async () => {
      await store.close();
      const c = new pg.Client({ connectionString: base });
      await c.connect();
      await c.query(`drop database if exists ${name} with (force)`);
      await c.end();
    },
  };
}

export interface TestServer {
  url: string;
  app: FastifyInstance;
  services: Services;
  clock: FakeClock;
  logs: string[];
  dataDir: string;
  admin(method: string, path: string, body?: unknown): Promise<Res>;
  call(method: string, path: string, opts?: { key?: string; body?: unknown }): Promise<Res>;
  close(): Promise<void>;
}

export interface Res {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Record<string, unknown>;
  text: string;
}

export async function http(
  method: string,
  url: string,
  opts: { auth?: string; body?: unknown; rawBody?: string; headers?: Record<string, string> } = {},
): Promise<Res> {
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.auth) headers.authorization = opts.auth;
  let payload: string | undefined = opts.rawBody;
  if (opts.body !== undefined) {
    payload = JSON.stringify(opts.body);
    headers['content-type'] ??= 'application/json';
  }
  const res = await request(url, { method: method as 'GET', headers, body: payload });
  const text = await res.body.text();
  let body: Record<string, unknown> = {};
  try {
    body = text ? (JSON.parse(text) as Record<string, unknown>) : {};
  } catch {
    body = {};
  }
  return { status: res.statusCode, headers: res.headers, body, text };
}

export async function startTestServer(
  opts: {
    driver?: Driver;
    env?: Record<string, string>;
    /** A database shared with other servers (PostgreSQL); not dropped on close. */
    shared?: { url: string };
    /** Extra service dependencies (test seams). */
    deps?: Pick<Parameters<typeof createServices>[1], 'webhookSender' | 'webhookResolver'>;
  } = {},
): Promise<TestServer> {
  const dataDir = mkdtempSync(join(tmpdir(), 'swy-test-'));
  const db: TestDatabase = opts.shared
    ? {
        store: await openStore({ dataDir: '', databaseUrl: opts.shared.url, poolSize: 4 }),
        url: opts.shared.url,
        drop: async () => undefined,
      }
    : await freshDatabase(opts.driver ?? 'pglite');
  if (opts.shared) {
    const store = db.store;
    db.drop = () => store.close();
  }
  const config = loadConfig({
    SWITCHYARD_DATA_DIR: dataDir,
    SWITCHYARD_ADMIN_TOKEN: ADMIN_TOKEN,
    SWITCHYARD_DEMO: '0',
    LOG_LEVEL: 'debug',
    ...opts.env,
  });
  const logs: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      logs.push(chunk.toString('utf8'));
      cb();
    },
  });
  const clock = new FakeClock(Date.UTC(2026, 10, 22, 12, 0, 0));
  const logger = createLogger(config.logLevel, sink);
  const services = await createServices(config, { clock, logger, store: db.store, ...opts.deps });
  const app = await buildApp(services);
  await app.listen({ port: 0, host: '127.0.0.1' });
  const addr = app.server.address();
  if (!addr || typeof addr === 'string') throw new Error('no address');
  const url = `http://127.0.0.1:${addr.port}`;
  return {
    url,
    app,
    services,
    clock,
    logs,
    dataDir,
    admin: (method, path, body) =>
      http(method, `${url}/admin/v1${path}`, { auth: `Bearer ${ADMIN_TOKEN}`, body }),
    call: (method, path, o = {}) =>
      http(method, url + path, { auth: o.key ? `Bearer ${o.key}` : undefined, body: o.body }),
    close: async () => {
      // Clients under test may leave connections that never carried a request
      // (an aborted fetch's spare socket); do not wait for their timeout.
      app.server.closeAllConnections();
      await app.close();
      await services.usage.close();
      await services.upstream.close();
      await services.bus.close();
      await db.drop();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** What seedProject needs of a router: its base URL and its operator API. */
export type OperatorTarget = Pick<TestServer, 'url' | 'admin'>;

/**
 * Creates a model, a project, an endpoint and a key through the operator API of a
 * router: an in-process one, or a `switchyard serve` process (cluster.ts).
 */
export async function seedProject(
  s: OperatorTarget,
  opts: {
    slug?: string;
    scopes?: string[];
    tier?: string;
    model?: string;
    /** The key's quota per 60 s (the spec's default 60 when absent). */
    quotaRequests?: number;
    /** The model's declared capabilities (none when absent). */
    capabilities?: string[];
    /** A worker of the model on the endpoint's tier, registered by URL (a test's own). */
    worker?: { url: string; id?: string };
    endpointSlug?: string;
    /** More fields of the model (prices). */
    modelBody?: Record<string, unknown>;
    /** More fields of the project (credit_cents). */
    projectBody?: Record<string, unknown>;
  } = {},
): Promise<{
  projectId: string;
  projectSlug: string;
  projectUuid: string;
  endpointId: string;
  key: string;
  /** The endpoint's `/v1` base URL, as an OpenAI client takes it. */
  baseURL: string;
}> {
  const slug = opts.slug ?? `p${Math.random().toString(36).slice(2, 8)}`;
  const model = opts.model ?? 'test-model';
  const tier = opts.tier ?? 'cpu';
  const endpointSlug = opts.endpointSlug ?? 'main';
  const m = await s.admin('POST', '/models', {
    name: model,
    context_window: 4096,
    ...(opts.capabilities ? { capabilities: opts.capabilities } : {}),
    ...opts.modelBody,
  });
  if (m.status !== 201 && m.status !== 409) throw new Error(`model: ${m.text}`);
  if (opts.worker) {
    const w = await s.admin('POST', '/workers', { model, tier, ...opts.worker });
    if (w.status !== 201) throw new Error(`worker: ${w.text}`);
  }
  const p = await s.admin('POST', '/projects', {
    slug,
    name: `Project ${slug}`,
    ...opts.projectBody,
  });
  if (p.status !== 201) throw new Error(`project: ${p.text}`);
  const e = await s.admin('POST', `/projects/${slug}/endpoints`, {
    slug: endpointSlug,
    name: 'Main',
    model,
    tier,
  });
  if (e.status !== 201) throw new Error(`endpoint: ${e.text}`);
  const k = await s.admin('POST', `/projects/${slug}/keys`, {
    scopes: opts.scopes ?? ['inference'],
    ...(opts.quotaRequests !== undefined ? { quotaRequests: opts.quotaRequests } : {}),
  });
  if (k.status !== 201) throw new Error(`key: ${k.text}`);
  return {
    projectId: String(p.body.id),
    projectSlug: slug,
    projectUuid: String(p.body.uuid),
    endpointId: String(e.body.id),
    key: String(k.body.key),
    baseURL: `${s.url}/${String(p.body.id)}/${endpointSlug}/v1`,
  };
}

/** A worker's status as the operator API lists it (undefined when not listed). */
export async function workerStatus(s: TestServer, id: string): Promise<unknown> {
  const listed = (await s.admin('GET', '/workers')).body.data as Array<Record<string, unknown>>;
  return listed.find((w) => w.id === id)?.status;
}

/** Advances the fake clock by whole worker-monitor periods, letting each pass finish. */
export async function monitorPasses(s: TestServer, ms: number, periodMs: number): Promise<void> {
  for (let t = 0; t < ms; t += periodMs) {
    s.clock.advance(periodMs);
    await s.services.monitor.settled();
  }
}
