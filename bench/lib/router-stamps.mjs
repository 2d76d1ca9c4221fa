/**
 * A preload for bench/tail.mjs (`node --import bench/lib/router-stamps.mjs …`),
 * bench-only: nothing in src/ knows of it. On the machine's monotonic clock (the one
 * bench/tail.mjs's client and upstream stamp with) it records, in the process it is
 * loaded into:
 * - every garbage collection: [kind, startNs, durationMs];
 * - with STAMPS_LOOP_PROBE=1, every gap of 3 ms or more between the ticks of a 1 ms
 *   timer: [startNs, gapMs, cpuMs], cpuMs being the CPU time the process used in the
 *   gap (process.cpuUsage). A gap with as much CPU as wall time is work on the event
 *   loop; a gap with little is time the process did not run at all. The timer costs
 *   the process up to 1,000 wake-ups a second, so the probe changes what it measures
 *   a little; the GC stamps do not.
 * - with STAMPS_REQUESTS=1, for each request carrying an `x-seed` header (bench/tail.mjs's
 *   client sends one), from Node's and undici's diagnostics channels: when the router
 *   had its headers, created the upstream request, wrote it to the upstream socket,
 *   had the upstream's response headers, and finished its own response:
 *   [seed, arriveNs, createNs, sentNs, headersNs, finishNs].
 * On SIGUSR2 it writes {gcs, gaps, requests} since the last signal to $STAMPS_FILE.
 */
import diagnostics from 'node:diagnostics_channel';
import { writeFileSync } from 'node:fs';
import { PerformanceObserver, constants, performance } from 'node:perf_hooks';
import { setInterval } from 'node:timers';

const KINDS = {
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'major',
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'minor',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakcb',
};
// performance.now() counts from the process's time origin on the monotonic clock.
const originNs = process.hrtime.bigint() - BigInt(Math.round(performance.now() * 1e6));
let gcs = [];
let gaps = [];
let requests = new Map();
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) {
    const start = originNs + BigInt(Math.round(e.startTime * 1e6));
    gcs.push([KINDS[e.detail?.kind] ?? String(e.detail?.kind), String(start), e.duration]);
  }
}).observe({ entryTypes: ['gc'] });

if (process.env.STAMPS_LOOP_PROBE === '1') {
  let last = process.hrtime.bigint();
  let lastCpu = process.cpuUsage();
  setInterval(() => {
    const t = process.hrtime.bigint();
    const cpu = process.cpuUsage();
    const gapMs = Number(t - last) / 1e6;
    if (gapMs >= 3) {
      const cpuMs = (cpu.user - lastCpu.user + cpu.system - lastCpu.system) / 1000;
      gaps.push([String(last), gapMs, cpuMs]);
    }
    last = t;
    lastCpu = cpu;
  }, 1).unref();
}

if (process.env.STAMPS_REQUESTS === '1') {
  const now = () => String(process.hrtime.bigint());
  const upstream = new WeakMap(); // undici request → its stamp row
  diagnostics.subscribe('http.server.request.start', ({ request }) => {
    const seed = Number(request.headers['x-seed']);
    if (seed >= 0) requests.set(seed, [seed, now(), null, null, null, null]);
  });
  diagnostics.subscribe('http.server.response.finish', ({ request }) => {
    const row = requests.get(Number(request.headers['x-seed']));
    if (row) row[5] = now();
  });
  diagnostics.subscribe('undici:request:create', ({ request }) => {
    const m = /"seed":(\d+)/.exec(request.body?.toString('latin1') ?? '');
    const row = m && requests.get(Number(m[1]));
    if (row) {
      row[2] = now();
      upstream.set(request, row);
    }
  });
  diagnostics.subscribe('undici:client:sendHeaders', ({ request }) => {
    const row = upstream.get(request);
    if (row) row[3] = now();
  });
  diagnostics.subscribe('undici:request:headers', ({ request }) => {
    const row = upstream.get(request);
    if (row) row[4] = now();
  });
}

process.on('SIGUSR2', () => {
  const file = process.env.STAMPS_FILE;
  if (file) writeFileSync(file, JSON.stringify({ gcs, gaps, requests: [...requests.values()] }));
  gcs = [];
  gaps = [];
  requests = new Map();
});
