/**
 * The router's young-generation GC under a fixed request rate: the router runs with
 * `--trace-gc-nvp` (V8 prints one line per GC with its pause and the bytes
 * allocated, survived and promoted) behind the open-loop client, and the scavenges
 * of the run are summed. GC counts, unlike latencies, hardly depend on how fast the
 * machine is that day. See docs/BENCHMARKS.md, "Young-generation GC at 1,000 req/s".
 *
 *   node bench/gc.mjs [--rate=1000] [--seconds=10] [--storage=postgres|pglite]
 *     [--router-node-args="--max-semi-space-size=32"]
 */
import { parseArgs } from 'node:util';
import { runOpenLoop } from './lib/open-loop.mjs';
import { installCleanup } from './lib/procs.mjs';
import { startStack } from './lib/services.mjs';
import { CHAT_BODY } from './lib/setup.mjs';

const { values: opts } = parseArgs({
  options: {
    rate: { type: 'string', default: '1000' },
    seconds: { type: 'string', default: '10' },
    storage: { type: 'string', default: 'postgres' },
    'router-node-args': { type: 'string', default: '' },
  },
});
installCleanup();
const rate = Number(opts.rate);
const seconds = Number(opts.seconds);
const stack = await startStack({
  name: 'gc',
  storage: opts.storage,
  routerNodeArgs: ['--trace-gc-nvp', ...opts['router-node-args'].split(' ').filter(Boolean)],
});
try {
  let out = '';
  let counting = false;
  stack.router.child.stdout.on('data', (d) => {
    if (counting) out += d;
  });
  const load = {
    url: stack.url,
    headers: { authorization: `Bearer ${stack.reg.key}` },
    body: CHAT_BODY,
    rate,
  };
  await runOpenLoop({ ...load, durationS: 5 });
  counting = true;
  const r = await runOpenLoop({ ...load, durationS: seconds });
  await new Promise((res) => setTimeout(res, 500));
  counting = false;
  const scavenges = [];
  let major = 0;
  for (const line of out.split('\n')) {
    const f = Object.fromEntries(
      line
        .split(' ')
        .filter((w) => w.includes('='))
        .map((w) => w.split('=')),
    );
    if (f.gc === 's') scavenges.push(f);
    else if (f.gc === 'mc' || f.gc === 'mmc') major++;
  }
  const sum = (k) => scavenges.reduce((a, f) => a + Number(f[k] ?? 0), 0);
  const pauses = scavenges.map((f) => Number(f.pause)).sort((a, b) => a - b);
  const n = r.completed;
  console.log(
    JSON.stringify(
      {
        rate,
        seconds,
        routerNodeArgs: opts['router-node-args'],
        requests: n,
        errors: r.errors,
        latencyMs: r.latencyMs,
        scavenges: scavenges.length,
        requestsPerScavenge: Math.round(n / Math.max(1, scavenges.length)),
        allocatedKBPerRequest: Math.round(sum('allocated') / 1024 / n),
        survivedPlusPromotedMBPerScavenge:
          Math.round(
            ((sum('new_space_survived') + sum('promoted')) / 1e6 / scavenges.length) * 100,
          ) / 100,
        pauseMs: {
          mean: Math.round((sum('pause') / scavenges.length) * 100) / 100,
          max: pauses.at(-1),
          total: Math.round(sum('pause')),
        },
        majorGCs: major,
      },
      null,
      2,
    ),
  );
} finally {
  await stack.close();
}
