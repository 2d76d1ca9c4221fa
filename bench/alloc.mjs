/**
 * Where the router's garbage comes from: the router (on PostgreSQL at
 * BENCH_DATABASE_URL, or PGlite) behind the open-loop client at a fixed rate,
 * with V8's sampling heap profiler counting every allocation (collected or not)
 * over the measured seconds; prints KB allocated per request by allocating
 * function and by the innermost Switchyard function on the stack. Sampled (one
 * sample per 512 bytes on average), so small entries are estimates. Pairs with
 * `npm run bench:gc`, which counts the scavenges that this garbage causes.
 *
 *   node bench/alloc.mjs [--rate=500] [--seconds=6] [--stream] [--storage=postgres|pglite]
 *     [--top=30] [--survivors] [--idle] [--router-node-args="..."]
 *
 * `--survivors` leaves out what young-generation GCs collect: what remains outlived a
 * scavenge (or was still alive at the end), the bytes each scavenge has to copy.
 * `--idle` measures a router with no traffic instead (after the same warm-up, and
 * 10 s of quiet): KB allocated per second by its timers and background loops.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { runOpenLoop } from './lib/open-loop.mjs';
import { installCleanup } from './lib/procs.mjs';
import { startStack } from './lib/services.mjs';
import { CHAT_BODY } from './lib/setup.mjs';

const { values: opts } = parseArgs({
  options: {
    rate: { type: 'string', default: '500' },
    idle: { type: 'boolean', default: false },
    seconds: { type: 'string', default: '6' },
    stream: { type: 'boolean', default: false },
    survivors: { type: 'boolean', default: false },
    storage: { type: 'string', default: 'postgres' },
    top: { type: 'string', default: '30' },
    'router-node-args': { type: 'string', default: '' },
  },
});
installCleanup();
const dir = mkdtempSync(join(os.tmpdir(), 'switchyard-alloc-'));
const file = join(dir, 'alloc.heapprofile');
const sampler = fileURLToPath(new URL('./lib/alloc-sampler.mjs', import.meta.url));
const stack = await startStack({
  name: 'alloc',
  storage: opts.storage,
  routerNodeArgs: [`--import=${sampler}`, ...opts['router-node-args'].split(' ').filter(Boolean)],
  routerEnv: {
    SWITCHYARD_ALLOC_PROFILE: file,
    SWITCHYARD_ALLOC_SURVIVORS: opts.survivors ? '1' : '0',
  },
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
try {
  const body = opts.stream ? JSON.stringify({ ...JSON.parse(CHAT_BODY), stream: true }) : CHAT_BODY;
  const load = {
    url: stack.url,
    headers: { authorization: `Bearer ${stack.reg.key}` },
    body,
    rate: Number(opts.rate),
  };
  await runOpenLoop({ ...load, durationS: 4 }); // warm-up: JIT, caches, pools
  if (opts.idle) await sleep(10_000); // the load's leftovers settle
  process.kill(stack.router.pid, 'SIGUSR2');
  await sleep(300);
  const r = opts.idle
    ? await sleep(Number(opts.seconds) * 1000).then(() => ({
        completed: Number(opts.seconds),
        errors: 0,
      }))
    : await runOpenLoop({ ...load, durationS: Number(opts.seconds) });
  process.kill(stack.router.pid, 'SIGUSR2');
  for (let i = 0; i < 100 && !existsSync(file); i++) await sleep(100);
  await sleep(300); // the write may still be under way
  const profile = JSON.parse(readFileSync(file, 'utf8'));
  const n = r.completed;
  const bySelf = new Map();
  const byOurs = new Map();
  const walk = (node, ours) => {
    const cf = node.callFrame;
    const name = `${cf.functionName || '(anonymous)'} ${cf.url
      .replace(/.*node_modules\//, '')
      .replace(/.*\/dist\//, 'dist/')}:${cf.lineNumber + 1}`;
    const inner = cf.url.includes('/dist/') ? name : ours;
    if (node.selfSize) {
      bySelf.set(name, (bySelf.get(name) ?? 0) + node.selfSize);
      byOurs.set(inner, (byOurs.get(inner) ?? 0) + node.selfSize);
    }
    for (const c of node.children) walk(c, inner);
  };
  walk(profile.head, '(no Switchyard frame on the stack)');
  const total = [...bySelf.values()].reduce((a, b) => a + b, 0);
  const rows = (m) =>
    [...m]
      .sort((a, b) => b[1] - a[1])
      .slice(0, Number(opts.top))
      .map(([name, v]) => `| ${(v / 1024 / n).toFixed(2)} | \`${name}\` |`)
      .join('\n');
  const unit = opts.idle ? 'second' : 'request';
  console.log(
    (opts.idle
      ? `${n} s with no traffic: `
      : `${n} ${opts.stream ? 'streamed' : 'non-streaming'} requests at ${opts.rate} req/s, errors ${r.errors}: `) +
      `${(total / 1024 / n).toFixed(1)} KB ${opts.survivors ? 'outliving a scavenge' : 'allocated'} per ${unit} (sampled)\n`,
  );
  console.log(`| KB/${unit} | allocating function |\n| ---: | --- |\n${rows(bySelf)}\n`);
  console.log(`| KB/${unit} | innermost Switchyard function |\n| ---: | --- |\n${rows(byOurs)}`);
} finally {
  await stack.close();
  rmSync(dir, { recursive: true, force: true });
}
