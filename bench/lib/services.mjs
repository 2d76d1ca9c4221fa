/**
 * The two processes every bench starts: a `sim` worker and the router
 * (`switchyard serve`), each pinned to a CPU, both on 127.0.0.1 with free ports.
 * The router runs the single-instance setup (no Redis; PGlite in `dataDir`, or
 * PostgreSQL when `databaseUrl` is given) with limits and logging out of the way.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createDatabase } from './postgres.mjs';
import { startService, stopAll } from './procs.mjs';
import { MODEL, register } from './setup.mjs';

export const BIN = join(fileURLToPath(new URL('../..', import.meta.url)), 'bin', 'switchyard.js');

/**
 * The Node/V8 flags the `switchyard` binary runs with, from its first line
 * (`#!/usr/bin/env -S node <flags>`): the bench starts the router as `npm start` and
 * the installed binary do.
 */
export function binNodeFlags(bin = BIN) {
  const first = readFileSync(bin, 'utf8').split('\n', 1)[0];
  const m = /^#!\/usr\/bin\/env -S node(?<flags>( --?[\w-]+(=\S+)?)*)\s*$/.exec(first);
  if (!m) throw new Error(`${bin}: first line is not '#!/usr/bin/env -S node [flags]'`);
  return m.groups.flags.split(' ').filter(Boolean);
}

/** `simArgs`: more `switchyard worker` flags (delays, batch size). Resolves with `url` (…/v1). */
export async function startSim({ cpu, simArgs = [] }) {
  const s = await startService({
    name: 'sim worker',
    cpu,
    cmd: process.execPath,
    args: [BIN, 'worker', '--engine', 'sim', '--port', '0', '--model', MODEL, ...simArgs],
    env: { ...process.env, NODE_ENV: 'production' },
    ready: /serving (http:\/\/127\.0\.0\.1:\d+\/v1)/,
  });
  return { ...s, url: s.match[1] };
}

/**
 * The no-logic floor (lib/floor-proxy.mjs) in front of `simUrl` (…/v1), with the
 * router's V8 flags so the two differ by the logic alone. `spinUs` adds a busy loop
 * per request (bench/floor-spin.mjs). Resolves with `url` (its base URL).
 */
export async function startFloor({ cpu, simUrl, spinUs = 0 }) {
  const s = await startService({
    name: 'floor proxy',
    cpu,
    cmd: process.execPath,
    args: [...binNodeFlags(), fileURLToPath(new URL('./floor-proxy.mjs', import.meta.url)), simUrl],
    env: { ...process.env, FLOOR_SPIN_US: String(spinUs) },
    ready: /floor proxy listening on (http:\/\/127\.0\.0\.1:\d+)/,
  });
  return { ...s, url: s.match[1] };
}

/**
 * Resolves with `url` (the router's base URL). `extraEnv` adds or overrides settings;
 * `bin` runs another checkout's build (bench/ab.mjs), with that binary's own flags.
 */
export async function startRouter({
  bin = BIN,
  name = 'router',
  cpu,
  dataDir,
  token,
  databaseUrl = null,
  nodeArgs = [],
  extraEnv = {},
}) {
  const env = {
    ...process.env,
    NODE_ENV: 'production',
    PORT: '0',
    HOST: '127.0.0.1',
    SWITCHYARD_ENV: 'development',
    SWITCHYARD_DEMO: '0',
    SWITCHYARD_DATA_DIR: dataDir,
    SWITCHYARD_ADMIN_TOKEN: token,
    LOG_LEVEL: 'warn',
    ...extraEnv,
  };
  delete env.DATABASE_URL;
  delete env.REDIS_URL;
  if (databaseUrl) env.DATABASE_URL = databaseUrl;
  const s = await startService({
    name,
    cpu,
    cmd: process.execPath,
    args: [...binNodeFlags(bin), ...nodeArgs, bin, 'serve'],
    env,
    ready: /Switchyard listening on (http:\/\/127\.0\.0\.1:\d+)/,
    timeoutMs: 60_000,
  });
  return { ...s, url: s.match[1] };
}

/**
 * The whole single-instance setup of the soak, streams and memory benches: a
 * throwaway data directory (and PostgreSQL database with `storage: 'postgres'`,
 * created on BENCH_DATABASE_URL's server), the sim on CPU 1, the router on CPU 0,
 * and the benchmark project registered. `close()` stops both and removes the rest.
 */
export async function startStack({
  name,
  storage,
  simArgs = [],
  routerEnv = {},
  routerNodeArgs = [],
}) {
  const dataDir = mkdtempSync(join(os.tmpdir(), `switchyard-${name}-`));
  const db =
    storage === 'postgres'
      ? await createDatabase(
          process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres',
        )
      : null;
  const close = async () => {
    await stopAll();
    rmSync(dataDir, { recursive: true, force: true });
    await db?.drop();
  };
  try {
    const token = randomBytes(24).toString('base64url');
    const sim = await startSim({ cpu: 1, simArgs });
    const router = await startRouter({
      cpu: 0,
      dataDir,
      token,
      databaseUrl: db?.url ?? null,
      nodeArgs: routerNodeArgs,
      extraEnv: routerEnv,
    });
    const reg = await register({ routerUrl: router.url, token, workerUrl: sim.url });
    const url = `${router.url}/${reg.projectId}/${reg.endpointSlug}/v1/chat/completions`;
    return { sim, router, reg, url, close };
  } catch (err) {
    await close();
    throw err;
  }
}
