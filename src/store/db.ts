/**
 * Storage drivers. One schema and one query layer (Drizzle) over two drivers:
 * PGlite in the data directory when `DATABASE_URL` is unset (embedded default),
 * node-postgres when it is set (scale-out). Migrations from `drizzle/` run at open.
 */
import {
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readFileSync,
  rmSync,
  writeSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sql } from 'drizzle-orm';
import type { PgDatabase, PgQueryResultHKT } from 'drizzle-orm/pg-core';
import * as schema from './schema.js';
import type { PGlite as PGliteClient, PGliteOptions } from '@electric-sql/pglite';
import type { PgliteOpen } from './pglite-options.js';

export type Schema = typeof schema;
export type Db = PgDatabase<PgQueryResultHKT, Schema>;

export interface Store {
  readonly db: Db;
  readonly driver: 'pglite' | 'postgres';
  /** True once migrations have been applied (for /readyz). */
  ping(): Promise<boolean>;
  close(): Promise<void>;
}

const here = dirname(fileURLToPath(import.meta.url));
/** `drizzle/` at the package root, from src/store or dist/store alike. */
export const migrationsFolder = resolve(here, '..', '..', 'drizzle');

/** Arbitrary constant: serialises migrations of several instances on one PostgreSQL. */
const MIGRATION_LOCK_ID = 727_274_001;

export interface OpenStoreOptions {
  databaseUrl?: string | undefined;
  /** Directory for PGlite's files; `memory://` keeps the database in memory (tests). */
  dataDir: string;
  poolSize?: number;
  /**
   * PGlite only: run it in a worker thread (the default) so its synchronous
   * WebAssembly work never blocks the event loop; false runs it in-process.
   */
  pgliteThread?: boolean;
  /**
   * PGlite: a new database starts from this data directory (a tar from PGlite's
   * `dumpDataDir`, e.g. a freshly migrated database) instead of an empty cluster,
   * which is most of the cost of opening one (about 2.6 s against 1.2 s on this
   * project's 2-core VM); ignored when the data directory already holds one.
   * Migrations still run (those already applied are skipped). The test suite opens
   * hundreds of databases this way (SWITCHYARD_PGLITE_TEMPLATE for processes).
   */
  pgliteFrom?: Uint8Array | undefined;
  /** PGlite: PostgreSQL's `shared_buffers` (e.g. `16MB`); its default, 128MB, when unset. */
  pgliteSharedBuffers?: string | undefined;
}

export async function openStore(opts: OpenStoreOptions): Promise<Store> {
  if (opts.databaseUrl) return openPostgres(opts.databaseUrl, opts.poolSize ?? 10);
  return openPglite(
    opts.dataDir,
    opts.pgliteThread ?? true,
    opts.pgliteFrom,
    opts.pgliteSharedBuffers,
  );
}

async function openPglite(
  dataDir: string,
  thread: boolean,
  from: Uint8Array | undefined,
  sharedBuffers: string | undefined,
): Promise<Store> {
  let dir = 'memory://';
  let unlock = () => {};
  if (dataDir !== 'memory://') {
    dir = join(dataDir, 'pgdata');
    mkdirSync(dir, { recursive: true });
    unlock = lockDataDir(dataDir);
    // PGlite refuses to load a dump over an existing database.
    if (existsSync(join(dir, 'PG_VERSION'))) from = undefined;
  }
  try {
    return await openPgliteIn({ dataDir: dir, from, sharedBuffers }, thread, unlock);
  } catch (err) {
    unlock();
    throw err;
  }
}

async function openPgliteIn(opts: PgliteOpen, thread: boolean, unlock: () => void): Promise<Store> {
  const { drizzle } = await import('drizzle-orm/pglite');
  const { migrate } = await import('drizzle-orm/pglite/migrator');
  let client: { close(): Promise<void> };
  let db;
  if (thread) {
    const { PgliteThreadClient } = await import('./pglite-thread.js');
    const c = await PgliteThreadClient.open(opts);
    client = c;
    // The thread client has the two methods drizzle's PGlite session calls.
    db = drizzle({ client: c as unknown as PGliteClient, schema });
  } else {
    const { PGlite } = await import('@electric-sql/pglite');
    const { pgliteOptions } = await import('./pglite-options.js');
    const c = new PGlite({ ...pgliteOptions(opts), ...(await pgliteAssets()) });
    client = c;
    db = drizzle({ client: c, schema });
  }
  try {
    await migrate(db, { migrationsFolder });
  } catch (err) {
    await client.close().catch(() => undefined);
    throw err;
  }
  return {
    db: db as unknown as Db,
    driver: 'pglite',
    ping: () => ping(db as unknown as Db),
    close: once(async () => {
      try {
        await client.close();
      } finally {
        unlock();
      }
    }),
  };
}

/**
 * One process per embedded database. PGlite keeps the database in memory and writes
 * it back to its files: two processes on one data directory each see only their own
 * writes, and the last to close wins (seen: a second `npm start` on another PORT
 * started fine, and one instance's projects were gone after a restart). The lock is a
 * file holding the owner's pid, created exclusively; one left by a process that no
 * longer runs is taken over. Several instances share PostgreSQL (DATABASE_URL).
 */
function lockDataDir(dataDir: string): () => void {
  const path = join(dataDir, 'pgdata.lock');
  for (let tries = 0; ; tries++) {
    try {
      const fd = openSync(path, 'wx', 0o600);
      writeSync(fd, `${process.pid}\n`);
      closeSync(fd);
      return () => rmSync(path, { force: true });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST' || tries > 0) throw err;
    }
    const owner = Number.parseInt(readFileSync(path, 'utf8'), 10);
    if (Number.isInteger(owner) && owner > 0 && owner !== process.pid && alive(owner)) {
      throw new Error(
        `The data directory ${resolve(dataDir)} is in use by another Switchyard process ` +
          `(pid ${owner}): two processes on one embedded database lose each other's ` +
          `writes. Stop it, set another SWITCHYARD_DATA_DIR, or share PostgreSQL ` +
          `(DATABASE_URL) between instances. (If pid ${owner} is not Switchyard, ` +
          `delete ${path}.)`,
      );
    }
    // Left behind by a process that is gone (or by this one): take it over.
    rmSync(path, { force: true });
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    // EPERM: it exists, under another user.
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

type PgliteAssets = Required<Pick<PGliteOptions, 'pgliteWasmModule' | 'fsBundle'>>;
/** Node's global WebAssembly (the project's `lib` leaves the DOM's declarations out). */
declare const WebAssembly: {
  compile(bytes: Uint8Array): Promise<PgliteAssets['pgliteWasmModule']>;
};
let assets: Promise<PgliteAssets> | undefined;

/**
 * PGlite's compiled WebAssembly module and file-system bundle (15 MB), read and
 * compiled once per process: without them every new in-process PGlite reads both
 * files again and compiles the module anew, about 0.4 s of a 1.5 s open on a 2-core
 * VM. A module is stateless, so instances share it. A process opens more than one
 * database only in the tests (hundreds) and when the PGlite template is made; the
 * router's own database runs in its worker thread (pglite-worker.ts).
 */
function pgliteAssets(): Promise<PgliteAssets> {
  assets ??= (async () => {
    const dist = dirname(createRequire(import.meta.url).resolve('@electric-sql/pglite'));
    const { bytesAsBlob } = await import('./pglite-options.js');
    return {
      pgliteWasmModule: await WebAssembly.compile(readFileSync(join(dist, 'pglite.wasm'))),
      fsBundle: bytesAsBlob(readFileSync(join(dist, 'pglite.data'))),
    };
  })();
  return assets;
}

/**
 * Bounds on waiting for PostgreSQL. Without them a network partition (the
 * server neither answers nor refuses) holds every query, and so every request
 * needing one, /readyz and the webhook dispatcher, until TCP gives up many
 * minutes later; with them a query fails after `query_timeout`, and the
 * callers' fallbacks apply (cached keys served stale, unseen keys 503
 * `unavailable`, usage kept buffered, /readyz 503). Either can be set in
 * DATABASE_URL (`?connectionTimeoutMillis=…&query_timeout=…`, node-postgres
 * names). Migrations run on their own connection without the query timeout.
 */
export const PG_CONNECT_TIMEOUT_MS = 5000;
export const PG_QUERY_TIMEOUT_MS = 10_000;

function positive(raw: string | null, def: number): number {
  const n = raw === null ? NaN : Number(raw);
  return Number.isFinite(n) && n > 0 ? n : def;
}

async function openPostgres(url: string, max: number): Promise<Store> {
  const pg = await import('pg');
  const { drizzle } = await import('drizzle-orm/node-postgres');
  const { migrate } = await import('drizzle-orm/node-postgres/migrator');
  const params = new URL(url).searchParams;
  const connectionTimeoutMillis = positive(
    params.get('connectionTimeoutMillis'),
    PG_CONNECT_TIMEOUT_MS,
  );
  const queryTimeout = positive(params.get('query_timeout'), PG_QUERY_TIMEOUT_MS);
  // Migrations may legitimately run long: their connection has no query timeout.
  const migrationUrl = new URL(url);
  migrationUrl.searchParams.delete('query_timeout');
  const conn = new pg.default.Client({
    connectionString: migrationUrl.toString(),
    connectionTimeoutMillis,
  });
  await conn.connect();
  try {
    await conn.query('select pg_advisory_lock($1)', [MIGRATION_LOCK_ID]);
    try {
      await migrate(drizzle(conn, { schema }), { migrationsFolder });
    } finally {
      await conn.query('select pg_advisory_unlock($1)', [MIGRATION_LOCK_ID]);
    }
  } finally {
    await conn.end();
  }
  const pool = new pg.default.Pool({
    connectionString: url,
    max,
    connectionTimeoutMillis,
    query_timeout: queryTimeout,
    keepAlive: true,
  });
  // An idle client's error (server restart) must not crash the process; the pool
  // discards the client and the next query reconnects.
  pool.on('error', () => undefined);
  // Nor may a checked-out one's: pg-pool removes its own listener while a client
  // is lent out, and a connection lost between two statements of a transaction
  // (no query active to receive the error) would be an unhandled 'error' event
  // that kills the process. The client is marked unusable; its pending and next
  // queries fail, and the pool drops it when it is released.
  pool.on('connect', (client) => client.on('error', () => undefined));
  const db = drizzle(pool, { schema });
  return {
    db: db as unknown as Db,
    driver: 'postgres',
    ping: () => ping(db as unknown as Db),
    close: once(() => pool.end()),
  };
}

/** Closing twice (a shared store, a shutdown racing a test's cleanup) is harmless. */
function once(fn: () => Promise<void>): () => Promise<void> {
  let p: Promise<void> | undefined;
  return () => (p ??= fn());
}

async function ping(db: Db): Promise<boolean> {
  try {
    // Reading a table the migrations create proves both reachability and schema.
    await db.execute(sql`select 1 from tiers limit 1`);
    return true;
  } catch {
    return false;
  }
}

/**
 * True when a query failed because the database could not be reached or went
 * away mid-query (refused, reset, timed out, shutting down), not because of
 * the query: the caller should answer 503 `unavailable` and let the client retry.
 */
export function isDatabaseUnavailable(err: unknown): boolean {
  for (let e: unknown = err, i = 0; e && i < 4; i++) {
    if (typeof e === 'object') {
      const { code, message } = e as { code?: unknown; message?: unknown };
      if (typeof code === 'string' && UNAVAILABLE_CODES.test(code)) return true;
      if (typeof message === 'string' && UNAVAILABLE_MESSAGES.test(message)) return true;
    }
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/** Socket errors, and SQLSTATE classes 08 (connection exception) and 57P (operator intervention). */
const UNAVAILABLE_CODES =
  /^(ECONNREFUSED|ECONNRESET|ETIMEDOUT|EPIPE|EHOSTUNREACH|ENETUNREACH|ENOTFOUND|EAI_AGAIN|08\w{3}|57P0[1-3])$/;
/** node-postgres reports these without a code. */
const UNAVAILABLE_MESSAGES =
  /^(Connection terminated|Query read timeout|timeout exceeded when trying to connect|Client has encountered a connection error|Client was closed and is not queryable)/;

/** The SQLSTATE of a failed query (drizzle wraps the driver's error in `cause`). */
export function sqlState(err: unknown): string | undefined {
  for (let e: unknown = err, i = 0; e && i < 4; i++) {
    const code = typeof e === 'object' ? (e as { code?: unknown }).code : undefined;
    if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/**
 * A value PostgreSQL cannot store as text or jsonb: U+0000 (22P05 "unsupported
 * Unicode escape sequence" in jsonb, 22021 "invalid byte sequence" in text).
 * Only a client's string can carry one.
 */
export function isUnstorableText(err: unknown): boolean {
  const s = sqlState(err);
  return s === '22021' || s === '22P05';
}

/**
 * True when a query failed on a unique constraint (PostgreSQL and PGlite alike);
 * with `constraint`, on that one (its index's name).
 */
export function isUniqueViolation(err: unknown, constraint?: string): boolean {
  for (let e: unknown = err, i = 0; e && i < 4; i++) {
    const x = e as { code?: unknown; constraint?: unknown };
    if (typeof e === 'object' && x.code === '23505') {
      return constraint === undefined || x.constraint === constraint;
    }
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}
