/**
 * The two processes every bench starts: a `sim` worker and the router
 * (`switchyard serve`), each pinned to a CPU, both on 127.0.0.1 with free ports.
 * The router runs the single-instance setup (no Redis; PGlite in `dataDir`, or
 * PostgreSQL when `databaseUrl` is given) with limits and logging out of the way.
 */
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startService } from './procs.mjs';
import { MODEL } from './setup.mjs';

export const BIN = join(fileURLToPath(new URL('../..', import.meta.url)), 'bin', 'switchyard.js');

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

/** Resolves with `url` (the router's base URL). `extraEnv` adds or overrides settings. */
export async function startRouter({
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
    name: 'router',
    cpu,
    cmd: process.execPath,
    args: [...nodeArgs, BIN, 'serve'],
    env,
    ready: /Switchyard listening on (http:\/\/127\.0\.0\.1:\d+)/,
    timeoutMs: 60_000,
  });
  return { ...s, url: s.match[1] };
}
