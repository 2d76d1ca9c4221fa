/**
 * What the router was doing while its slowest requests waited. The router runs under
 * V8's CPU profiler (100 µs sampling) behind the open-loop client at a fixed rate;
 * every measured request's scheduled send time and latency are kept on the same
 * monotonic clock as the profile's samples. The slow requests' windows are merged into
 * episodes, and each episode's profile time is split into:
 *
 *   - busy: the main thread ran JavaScript or native code (by area and function);
 *   - GC: V8's "(garbage collector)" samples;
 *   - idle: the event loop was waiting (the delay was elsewhere: the kernel, the sim,
 *     the client);
 *   - gap: no sample at all for longer than 4 sampling intervals, so the profiler's
 *     thread could not run either: the router's CPU was taken by another process or
 *     by one of the router's own helper threads (the router is pinned to one CPU).
 *
 *   node bench/stalls.mjs [--rate=1000] [--seconds=10] [--storage=postgres|pglite]
 *     [--slow-ms=N (default: the run's p99)] [--router-node-args="..."] [--top=12]
 *
 * The sim, the client and this script run on CPU 1, the router on CPU 0, as in
 * `npm run bench`. Prints a summary and writes bench/results/stalls-<time>.json.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { runOpenLoop } from './lib/open-loop.mjs';
import { installCleanup, stopProcess } from './lib/procs.mjs';
import { startStack } from './lib/services.mjs';
import { CHAT_BODY } from './lib/setup.mjs';
import { summarize } from './lib/stats.mjs';

const { values: opts } = parseArgs({
  options: {
    rate: { type: 'string', default: '1000' },
    seconds: { type: 'string', default: '10' },
    storage: { type: 'string', default: 'postgres' },
    'slow-ms': { type: 'string' },
    'router-node-args': { type: 'string', default: '' },
    top: { type: 'string', default: '12' },
  },
});
const INTERVAL_US = 100;
const GAP_US = 4 * INTERVAL_US;
const RESULTS = fileURLToPath(new URL('./results/', import.meta.url));

installCleanup();
execFileSync('taskset', ['-a', '-cp', '1', String(process.pid)], { stdio: 'ignore' });
const profDir = mkdtempSync(join(os.tmpdir(), 'switchyard-stalls-'));
const stack = await startStack({
  name: 'stalls',
  storage: opts.storage,
  routerNodeArgs: [
    '--cpu-prof',
    `--cpu-prof-dir=${profDir}`,
    `--cpu-prof-interval=${INTERVAL_US}`,
    ...opts['router-node-args'].split(' ').filter(Boolean),
  ],
});
let run;
let profile;
try {
  const load = {
    url: stack.url,
    headers: { authorization: `Bearer ${stack.reg.key}` },
    body: CHAT_BODY,
    rate: Number(opts.rate),
  };
  await runOpenLoop({ ...load, durationS: 3 });
  run = await runOpenLoop({ ...load, durationS: Number(opts.seconds), trace: true });
  await stopProcess(stack.router.child, 20_000);
  const file = readdirSync(profDir).find((f) => f.endsWith('.cpuprofile'));
  if (!file) throw new Error(`no .cpuprofile written in ${profDir}`);
  profile = JSON.parse(readFileSync(join(profDir, file), 'utf8'));
} finally {
  await stack.close();
  rmSync(profDir, { recursive: true, force: true });
}

// --- the profile as a time line: [tsUs, durUs, kind, label] per sample
const byId = new Map();
const parent = new Map();
for (const n of profile.nodes) {
  byId.set(n.id, n);
  for (const c of n.children ?? []) parent.set(c, n.id);
}
const short = (url) => {
  if (!url) return '';
  const nm = url.lastIndexOf('node_modules/');
  if (nm !== -1) return url.slice(nm + 'node_modules/'.length);
  const d = url.indexOf('/dist/');
  return d !== -1 ? url.slice(d + 1) : url.replace(/^file:\/\//, '');
};
const labelCache = new Map();
/**
 * What ran (the sample's frame; a native one is named with its nearest JavaScript
 * caller) and who in our code asked for it (the innermost Switchyard frame).
 */
function label(id) {
  let l = labelCache.get(id);
  if (l) return l;
  const cf = byId.get(id).callFrame;
  const name = (f) => `${f.functionName || '(anonymous)'} ${short(f.url)}:${f.lineNumber + 1}`;
  let kind = 'busy';
  if (cf.functionName === '(idle)') kind = 'idle';
  else if (cf.functionName === '(garbage collector)') kind = 'gc';
  let what = cf.url ? name(cf) : cf.functionName || '(native)';
  let ours = '(no Switchyard frame)';
  let caller = null;
  for (let cur = parent.get(id); cur !== undefined; cur = parent.get(cur)) {
    const f = byId.get(cur).callFrame;
    if (!f.url) continue;
    caller ??= name(f);
    if (f.url.includes('/dist/') && !f.url.includes('node_modules')) {
      ours = name(f);
      break;
    }
  }
  if (cf.url.includes('/dist/') && !cf.url.includes('node_modules')) ours = name(cf);
  if (!cf.url && caller) what = `${what} < ${caller}`;
  l = { kind, what, ours };
  labelCache.set(id, l);
  return l;
}
const ts = new Float64Array(profile.samples.length);
{
  let t = profile.startTime;
  for (let i = 0; i < profile.samples.length; i++) {
    t += profile.timeDeltas[i];
    ts[i] = t;
  }
}

/** Profile time in [from, to) split by kind, with the busy time by function. */
function account(from, to) {
  const out = { idle: 0, gc: 0, busy: 0, gap: 0, fn: new Map(), ours: new Map() };
  // first sample at or after `from` (binary search)
  let lo = 0;
  let hi = ts.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (ts[mid] < from) lo = mid + 1;
    else hi = mid;
  }
  for (let i = Math.max(0, lo - 1); i < ts.length - 1 && ts[i] < to; i++) {
    const a = Math.max(ts[i], from);
    const b = Math.min(ts[i + 1], to);
    if (b <= a) continue;
    const span = ts[i + 1] - ts[i];
    if (span > GAP_US) {
      // The sample stands for its first interval; the rest nobody on the CPU sampled.
      const sampledEnd = Math.min(ts[i] + INTERVAL_US, to);
      if (sampledEnd > a) addSample(out, profile.samples[i], sampledEnd - a);
      out.gap += b - Math.max(a, sampledEnd);
    } else addSample(out, profile.samples[i], b - a);
  }
  return out;
}
function addSample(out, id, us) {
  const l = label(id);
  out[l.kind] += us;
  if (l.kind === 'busy') {
    out.fn.set(l.what, (out.fn.get(l.what) ?? 0) + us);
    out.ours.set(l.ours, (out.ours.get(l.ours) ?? 0) + us);
  }
}

// --- the slow requests, merged into episodes
const { scheduledUs, latencyMs } = run.trace;
const lat = latencyMs.filter((v) => !Number.isNaN(v));
const stats = summarize(lat);
const slowMs = opts['slow-ms'] ? Number(opts['slow-ms']) : stats.p99;
const slow = [];
for (let i = 0; i < latencyMs.length; i++) {
  if (latencyMs[i] >= slowMs) slow.push([scheduledUs[i], scheduledUs[i] + latencyMs[i] * 1000]);
}
slow.sort((a, b) => a[0] - b[0]);
const episodes = [];
for (const [a, b] of slow) {
  const last = episodes.at(-1);
  if (last && a <= last.to) {
    last.to = Math.max(last.to, b);
    last.requests++;
  } else episodes.push({ from: a, to: b, requests: 1 });
}

const top = Number(opts.top);
const ms = (us) => Math.round(us / 10) / 100;
const rows = (m) =>
  [...m.entries()]
    .sort((x, y) => y[1] - x[1])
    .slice(0, top)
    .map(([name, us]) => ({ name, ms: ms(us) }));
const mergeInto = (acc, a) => {
  for (const k of ['idle', 'gc', 'busy', 'gap']) acc[k] += a[k];
  for (const [k, v] of a.fn) acc.fn.set(k, (acc.fn.get(k) ?? 0) + v);
  for (const [k, v] of a.ours) acc.ours.set(k, (acc.ours.get(k) ?? 0) + v);
};
const inSlow = { idle: 0, gc: 0, busy: 0, gap: 0, fn: new Map(), ours: new Map() };
for (const e of episodes) {
  const a = account(e.from, e.to);
  e.split = { idle: ms(a.idle), gc: ms(a.gc), busy: ms(a.busy), gap: ms(a.gap) };
  e.top = rows(a.fn).slice(0, 3);
  mergeInto(inSlow, a);
}
const whole = account(scheduledUs[0], scheduledUs.at(-1) + 1000 * (latencyMs.at(-1) || 0));
const share = (a) => {
  const t = a.idle + a.gc + a.busy + a.gap || 1;
  return {
    totalMs: ms(t),
    idlePct: Math.round((a.idle / t) * 1000) / 10,
    gcPct: Math.round((a.gc / t) * 1000) / 10,
    busyPct: Math.round((a.busy / t) * 1000) / 10,
    gapPct: Math.round((a.gap / t) * 1000) / 10,
  };
};
const report = {
  rate: Number(opts.rate),
  seconds: Number(opts.seconds),
  storage: opts.storage,
  routerNodeArgs: opts['router-node-args'],
  latencyMs: stats,
  slowMs,
  slowRequests: slow.length,
  episodes: episodes.length,
  wholeRun: share(whole),
  duringSlowEpisodes: {
    ...share(inSlow),
    busyByFunction: rows(inSlow.fn),
    busyByInnermostSwitchyardFrame: rows(inSlow.ours),
  },
  longestEpisodes: [...episodes]
    .sort((x, y) => y.to - y.from - (x.to - x.from))
    .slice(0, top)
    .map((e) => ({
      atS: Math.round((e.from - scheduledUs[0]) / 1e4) / 100,
      ms: ms(e.to - e.from),
      requests: e.requests,
      ...e.split,
      top: e.top.map((r) => `${r.name} ${r.ms}`),
    })),
};
mkdirSync(RESULTS, { recursive: true });
const out = join(RESULTS, `stalls-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
writeFileSync(out, JSON.stringify(report, null, 2) + '\n');
console.log(JSON.stringify(report, null, 2));
console.error(`stalls: written to ${out}`);
