/**
 * The router's resident memory after load, and how it settles: the router (on
 * PostgreSQL at BENCH_DATABASE_URL, or PGlite) behind wrk for `--seconds`, then its
 * RSS sampled every 5 s for `--settle` seconds of idleness (V8's memory reducer
 * returns heap pages some seconds after the allocation rate drops).
 *
 *   node bench/rss-settle.mjs --storage=postgres --seconds=20 --settle=60
 *     [--router-node-args="--some-v8-flag"]
 */
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { installCleanup, memoryOf } from './lib/procs.mjs';
import { startStack } from './lib/services.mjs';

const { values: opts } = parseArgs({
  options: {
    storage: { type: 'string', default: 'postgres' },
    seconds: { type: 'string', default: '20' },
    settle: { type: 'string', default: '60' },
    'router-node-args': { type: 'string', default: '' },
  },
});
installCleanup();
const stack = await startStack({
  name: 'rss',
  storage: opts.storage,
  routerNodeArgs: opts['router-node-args'].split(' ').filter(Boolean),
});
const lua = join(os.tmpdir(), `switchyard-rss-${process.pid}.lua`);
try {
  const { router, reg, url } = stack;
  const body = JSON.stringify({
    model: 'x',
    messages: [{ role: 'user', content: 'hi' }],
    max_tokens: 8,
  });
  writeFileSync(
    lua,
    `wrk.method = "POST"\nwrk.body = ${JSON.stringify(body)}\nwrk.headers["content-type"] = "application/json"\nwrk.headers["authorization"] = "Bearer ${reg.key}"\n`,
  );
  console.log(`idle before load: ${memoryOf(router.pid).rssMiB} MiB`);
  const out = execFileSync(
    'taskset',
    ['-c', '1', 'wrk', '-t1', '-c64', `-d${opts.seconds}s`, '-s', lua, url],
    {
      encoding: 'utf8',
    },
  );
  console.log(/Requests\/sec:\s+\S+/.exec(out)?.[0]);
  for (let t = 0; t <= Number(opts.settle); t += 5) {
    const m = memoryOf(router.pid);
    console.log(`${t} s after the load: RSS ${m.rssMiB} MiB (peak ${m.peakRssMiB})`);
    await new Promise((r) => setTimeout(r, 5000));
  }
} finally {
  rmSync(lua, { force: true });
  await stack.close();
}
