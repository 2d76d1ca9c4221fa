/**
 * The router's resident memory after load, and how it settles: the router (on
 * PostgreSQL at BENCH_DATABASE_URL, or PGlite) behind wrk for `--seconds`, then its
 * RSS sampled every 5 s for `--settle` seconds of idleness (V8's memory reducer
 * returns heap pages some seconds after the allocation rate drops).
 *
 *   node bench/rss-settle.mjs --storage=postgres --seconds=20 --settle=60
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { installCleanup, stopAll } from './lib/procs.mjs';
import { createDatabase } from './lib/postgres.mjs';
import { startRouter, startSim } from './lib/services.mjs';
import { register } from './lib/setup.mjs';

const { values: opts } = parseArgs({
  options: {
    storage: { type: 'string', default: 'postgres' },
    seconds: { type: 'string', default: '20' },
    settle: { type: 'string', default: '60' },
  },
});
const ADMIN_DATABASE_URL =
  process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

const mib = (pid) => {
  const s = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (k) => Number(new RegExp(`${k}:\\s+(\\d+)`).exec(s)[1]);
  return { rss: kb('VmRSS') / 1024, peak: kb('VmHWM') / 1024 };
};

installCleanup();
const dataDir = mkdtempSync(join(os.tmpdir(), 'switchyard-rss-'));
const database = opts.storage === 'postgres' ? await createDatabase(ADMIN_DATABASE_URL) : null;
try {
  const sim = await startSim({ cpu: 1, simArgs: ['--ttft-ms', '0', '--tpot-ms', '0'] });
  const token = randomBytes(24).toString('base64url');
  const router = await startRouter({ cpu: 0, dataDir, token, databaseUrl: database?.url ?? null });
  const reg = await register({ routerUrl: router.url, token, workerUrl: sim.url });
  const url = `${router.url}/${reg.projectId}/${reg.endpointSlug}/v1/chat/completions`;
  const lua = join(dataDir, 'post.lua');
  const body = JSON.stringify({
    model: 'x',
    messages: [{ role: 'user', content: 'hi' }],
    max_tokens: 8,
  });
  const { writeFileSync } = await import('node:fs');
  writeFileSync(
    lua,
    `wrk.method = "POST"\nwrk.body = ${JSON.stringify(body)}\nwrk.headers["content-type"] = "application/json"\nwrk.headers["authorization"] = "Bearer ${reg.key}"\n`,
  );
  console.log(`idle before load: ${mib(router.pid).rss.toFixed(1)} MiB`);
  const out = execFileSync(
    'taskset',
    ['-c', '1', 'wrk', '-t1', '-c64', `-d${opts.seconds}s`, '-s', lua, url],
    {
      encoding: 'utf8',
    },
  );
  console.log(/Requests\/sec:\s+\S+/.exec(out)?.[0]);
  for (let t = 0; t <= Number(opts.settle); t += 5) {
    const m = mib(router.pid);
    console.log(`${t} s after the load: RSS ${m.rss.toFixed(1)} MiB (peak ${m.peak.toFixed(1)})`);
    await new Promise((r) => setTimeout(r, 5000));
  }
} finally {
  await stopAll();
  rmSync(dataDir, { recursive: true, force: true });
  await database?.drop();
}
