#!/usr/bin/env node
/**
 * Does CPU per request alone make the tail? The no-logic floor (lib/floor-proxy.mjs)
 * is given extra work, a busy loop of N µs per request (FLOOR_SPIN_US), so its CPU per
 * request reaches the router's, and its added latency at a fixed rate is measured
 * beside the router's in the same run, in alternating rounds. If the floor with the
 * router's CPU per request had the router's p99, the router's tail would be its CPU
 * cost; if not, the tail comes from how that cost is spread (event-loop turns, stalls).
 *
 * Pinning as in `npm run bench`: the floor and the router on CPU 0, one at a time;
 * the sim, the open-loop client and this script on CPU 1.
 *
 *   npm run build && node bench/floor-spin.mjs [--spins=0,60,130] [--rate=1000]
 *     [--seconds=10] [--rounds=2] [--storage=postgres|pglite]
 */
import { parseArgs } from 'node:util';
import { runOpenLoop } from './lib/open-loop.mjs';
import {
  cpuBetween,
  installCleanup,
  pinSelf,
  schedOf,
  stopProcess,
  waitIdle,
} from './lib/procs.mjs';
import { startFloor, startStack } from './lib/services.mjs';
import { CHAT_BODY } from './lib/setup.mjs';
import { checkWrk, runWrk } from './lib/wrk.mjs';

const TARGET_CPU = 0;
const LOAD_CPU = 1;
const { values: opts } = parseArgs({
  options: {
    spins: { type: 'string', default: '0,60,130' },
    rate: { type: 'string', default: '1000' },
    seconds: { type: 'string', default: '10' },
    rounds: { type: 'string', default: '2' },
    storage: { type: 'string', default: 'postgres' },
  },
  strict: true,
});
const SPINS = opts.spins.split(',').map(Number);
const RATE = Number(opts.rate);
const SECONDS = Number(opts.seconds);
const ROUNDS = Number(opts.rounds);
if (SPINS.some((s) => !(s >= 0)) || !(RATE > 0) || !(SECONDS > 0) || !(ROUNDS >= 1)) {
  process.stderr.write('floor-spin: --spins takes numbers ≥ 0; --rate, --seconds, --rounds > 0\n');
  process.exit(2);
}

function log(msg) {
  process.stderr.write(`floor-spin: ${msg}\n`);
}

checkWrk();
installCleanup();
pinSelf(LOAD_CPU);

/** Warm-up (wrk 4 s, 2 s at the rate), then the measured run: p50/p99 and CPU per request. */
async function measure(pid, url, headers = {}) {
  await runWrk({
    cpu: LOAD_CPU,
    url,
    body: CHAT_BODY,
    authorization: headers.authorization,
    connections: 32,
    durationS: 4,
  });
  await runOpenLoop({ url, headers, body: CHAT_BODY, rate: RATE, durationS: 2 });
  if (pid) await waitIdle(pid, TARGET_CPU);
  const before = pid ? schedOf(pid, TARGET_CPU) : null;
  const r = await runOpenLoop({ url, headers, body: CHAT_BODY, rate: RATE, durationS: SECONDS });
  const cpu = before ? cpuBetween(before, schedOf(pid, TARGET_CPU)) : null;
  if (r.errors || r.incomplete) log(`${url}: ${r.errors} errors, ${r.incomplete} incomplete`);
  return {
    p50: r.latencyMs.p50,
    p99: r.latencyMs.p99,
    usPerRequest: cpu ? Math.round((cpu.cpuMs * 1000) / r.completed) : null,
  };
}

const stack = await startStack({ name: 'floor-spin', storage: opts.storage });
const rows = new Map(); // label → results of each round
const add = (label, m) => rows.set(label, [...(rows.get(label) ?? []), m]);
try {
  const direct = `${stack.sim.url}/chat/completions`;
  for (let round = 1; round <= ROUNDS; round++) {
    log(`round ${round}: direct`);
    const d = await measure(null, direct);
    add('direct', d);
    for (const spin of SPINS) {
      log(`round ${round}: floor, ${spin} µs of busy loop per request`);
      const floor = await startFloor({ cpu: TARGET_CPU, simUrl: stack.sim.url, spinUs: spin });
      const m = await measure(floor.pid, `${floor.url}/v1/chat/completions`);
      add(`floor + ${spin} µs`, { ...m, added: m.p99 - d.p99 });
      await stopProcess(floor.child);
    }
    log(`round ${round}: router`);
    const m = await measure(stack.router.pid, stack.url, {
      authorization: `Bearer ${stack.reg.key}`,
    });
    add('router', { ...m, added: m.p99 - d.p99 });
  }
  const out = [
    `${RATE.toLocaleString('en-US')} req/s, ${SECONDS} s per run, ${ROUNDS} round(s); each cell lists the rounds`,
    '',
    '| Target | CPU per request (µs) | p50 (ms) | p99 (ms) | p99 above direct (ms) |',
    '| --- | ---: | ---: | ---: | ---: |',
  ];
  const list = (ms, key, digits) =>
    ms
      .map((m) => (m[key] === null || m[key] === undefined ? '–' : m[key].toFixed(digits)))
      .join(', ');
  for (const [label, ms] of rows) {
    out.push(
      `| ${label} | ${list(ms, 'usPerRequest', 0)} | ${list(ms, 'p50', 3)} | ${list(ms, 'p99', 3)} | ${list(ms, 'added', 2)} |`,
    );
  }
  process.stdout.write(out.join('\n') + '\n');
} finally {
  await stack.close();
}
process.exit(0);
