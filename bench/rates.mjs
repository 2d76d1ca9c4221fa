#!/usr/bin/env node
/**
 * CPU per request against the arrival rate, for the router and for the no-logic
 * floor (lib/floor-proxy.mjs), side by side in one run. Both are pinned to CPU 0
 * in turn; the sim, the clients and this script run on CPU 1, as in `npm run bench`.
 *
 * For each target: 5 s of wrk (warm-up), then 5 s of wrk measured (saturation),
 * then each rate with the open-loop client. CPU is the target's threads' run time
 * (/proc/<pid>/task/<tid>/schedstat) over the measured phase, divided by the
 * requests completed in it. A process that does the same work per request at every
 * rate shows the same figure in every row; `npm run bench` reads its latency at
 * 1,000 req/s, where this says what each request costs there.
 *
 *   npm run build && node bench/rates.mjs [--rates=250,500,1000,2000] [--seconds=8]
 *     [--storage=postgres|pglite]
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
    rates: { type: 'string', default: '250,500,1000,2000' },
    seconds: { type: 'string', default: '8' },
    storage: { type: 'string', default: 'postgres' },
  },
  strict: true,
});
const RATES = opts.rates.split(',').map(Number);
const SECONDS = Number(opts.seconds);
if (RATES.some((r) => !(r > 0)) || !(SECONDS > 0)) {
  process.stderr.write('rates: --rates takes positive numbers, --seconds a positive number\n');
  process.exit(2);
}

function log(msg) {
  process.stderr.write(`rates: ${msg}\n`);
}

checkWrk();
installCleanup();
pinSelf(LOAD_CPU);

/** Saturation, then each rate: `{ rate: 'wrk' | number, usPerRequest, p50, p99 }[]`. */
async function measure(name, pid, url, headers) {
  const wrk = (durationS) =>
    runWrk({
      cpu: LOAD_CPU,
      url,
      body: CHAT_BODY,
      authorization: headers.authorization,
      connections: 32,
      durationS,
    });
  log(`${name}: warm-up`);
  await wrk(5);
  const rows = [];
  await waitIdle(pid, TARGET_CPU);
  let before = schedOf(pid, TARGET_CPU);
  const w = await wrk(5);
  let cpu = cpuBetween(before, schedOf(pid, TARGET_CPU));
  rows.push({
    rate: `wrk, ${w.requestsPerSec.toLocaleString('en-US')} req/s`,
    usPerRequest: Math.round((cpu.cpuMs * 1000) / w.requests),
    p50: w.latencyMs.p50,
    p99: w.latencyMs.p99,
  });
  for (const rate of RATES) {
    await waitIdle(pid, TARGET_CPU);
    log(`${name}: ${rate} req/s`);
    before = schedOf(pid, TARGET_CPU);
    const r = await runOpenLoop({ url, headers, body: CHAT_BODY, rate, durationS: SECONDS });
    cpu = cpuBetween(before, schedOf(pid, TARGET_CPU));
    if (r.errors || r.incomplete) log(`${name}: ${r.errors} errors, ${r.incomplete} incomplete`);
    rows.push({
      rate,
      usPerRequest: Math.round((cpu.cpuMs * 1000) / r.completed),
      p50: r.latencyMs.p50,
      p99: r.latencyMs.p99,
    });
  }
  return rows;
}

const stack = await startStack({ name: 'rates', storage: opts.storage });
try {
  const router = await measure('router', stack.router.pid, stack.url, {
    authorization: `Bearer ${stack.reg.key}`,
  });
  await stopProcess(stack.router.child);
  const floor = await startFloor({ cpu: TARGET_CPU, simUrl: stack.sim.url });
  const floorRows = await measure('floor', floor.pid, `${floor.url}/v1/chat/completions`, {});

  const out = [
    `CPU per request against the arrival rate (router: --storage=${opts.storage}; ${SECONDS} s per rate)`,
    '',
    '| Load | Router CPU per request | Floor CPU per request | Router ÷ floor | Router p50 / p99 (ms) | Floor p50 / p99 (ms) |',
    '| --- | ---: | ---: | ---: | ---: | ---: |',
  ];
  const ms = (v) => (v === undefined ? '–' : v.toFixed(3));
  for (let i = 0; i < router.length; i++) {
    const a = router[i];
    const b = floorRows[i];
    const rate = typeof a.rate === 'number' ? `${a.rate.toLocaleString('en-US')} req/s` : a.rate;
    out.push(
      `| ${rate}${typeof a.rate === 'number' ? '' : ` (floor ${b.rate.replace('wrk, ', '')})`} | ${a.usPerRequest} µs | ${b.usPerRequest} µs | ${(a.usPerRequest / b.usPerRequest).toFixed(2)} | ${ms(a.p50)} / ${ms(a.p99)} | ${ms(b.p50)} / ${ms(b.p99)} |`,
    );
  }
  process.stdout.write(out.join('\n') + '\n');
} finally {
  await stack.close();
}
process.exit(0);
