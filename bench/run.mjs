/**
 * `npm run bench`: what the router adds over calling a worker directly, side
 * by side in one run, against the `sim` engine with zero TTFT/TPOT.
 *
 *   CPU 0: the router (`switchyard serve`, PGlite in a temp data dir): "one core".
 *   CPU 1: the sim worker, wrk, the Node load clients and this script.
 *
 * Phases, each run against the sim directly and then through the router:
 *   1. max throughput, non-streaming (wrk, closed loop);
 *   2. latency at fixed rates (open loop, latency from the scheduled send time);
 *   3. streaming time to first byte (sequential);
 *   4. RSS of the router and the sim after all of the above.
 * Prints a markdown table and writes bench/results/<timestamp>.json.
 *
 * Options:
 *   --quick     short phases (a smoke test of the harness, figures not meaningful)
 *   --profile   instead of the phases: run the router under `node --cpu-prof`,
 *               drive it with wrk, and summarise its self/total time by function
 *   --no-peer   skip the peer gateway (Portkey's OSS gateway, installed on demand
 *               into bench/peer/ from its lock file; see lib/peer.mjs), which
 *               otherwise runs every phase too, pinned to CPU 0 like the router
 *   --profile-rate=N
 *               with --profile: drive the router with the open-loop client at N
 *               req/s instead of wrk (where the time goes below saturation)
 *   --profile-stream
 *               with --profile: send `stream: true` requests (the SSE path)
 *   --no-floor  skip the floor: a pass-through Node proxy with no logic (lib/floor-proxy.mjs),
 *               pinned to CPU 0 like the router, which otherwise runs every phase too,
 *               to show what the extra HTTP hop alone costs on this machine that day
 *   --router-node-args="..."
 *               extra Node/V8 flags for the router only (e.g.
 *               "--max-semi-space-size=2" to compare memory and tail latency)
 *   --nice=N    start every child with `nice -n N` (e.g. --nice=-10, as root) so other
 *               work on a shared machine does not take the pinned CPUs
 *   --storage=pglite|postgres
 *               the router's database: the embedded PGlite (default, inside the
 *               router's process, so on its core) or PostgreSQL (a throwaway
 *               database created on the server at BENCH_DATABASE_URL, default
 *               postgres://postgres@127.0.0.1:5432/postgres, and dropped after; when
 *               the server is local its processes are pinned to CPU 1 for the run)
 *
 * Every child process is killed on exit, on error and on SIGINT. Only 127.0.0.1.
 */
import { randomBytes } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { fetch } from 'undici';
import {
  cpuBetween,
  hasCommand,
  installCleanup,
  memoryOf,
  pinSelf,
  runProcess,
  schedOf,
  setNiceness,
  startService,
  stopAll,
  stopProcess,
  waitIdle,
} from './lib/procs.mjs';
import { formatProfile, summarizeProfile } from './lib/profile.mjs';
import { markdownReport } from './lib/report.mjs';
import { CHAT_BODY, register } from './lib/setup.mjs';
import { diff } from './lib/stats.mjs';
import { checkWrk, runWrk } from './lib/wrk.mjs';
import { createDatabase } from './lib/postgres.mjs';
import { ensurePeer, freePort, PEER_NAME, peerHeaders } from './lib/peer.mjs';
import { startFloor, startRouter, startSim } from './lib/services.mjs';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const RESULTS = join(ROOT, 'bench', 'results');
const ROUTER_CPU = 0;
const LOAD_CPU = 1;

const { values: opts } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    profile: { type: 'boolean', default: false },
    nice: { type: 'string', default: '0' },
    storage: { type: 'string', default: 'pglite' },
    'profile-rate': { type: 'string' },
    'profile-stream': { type: 'boolean', default: false },
    'router-node-args': { type: 'string', default: '' },
    peer: { type: 'boolean', default: true },
    floor: { type: 'boolean', default: true },
  },
  strict: true,
  allowNegative: true,
});
const NICE = Number(opts.nice);
if (opts.storage !== 'pglite' && opts.storage !== 'postgres') {
  process.stderr.write('bench: --storage takes pglite or postgres\n');
  process.exit(2);
}
const ADMIN_DATABASE_URL =
  process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

const P = opts.quick
  ? {
      wrkWarmupS: 1,
      wrkS: 2,
      rates: [1000, 2000],
      rateWarmupS: 1,
      rateS: 2,
      ttfbRequests: 50,
      ttfbWarmup: 10,
      ttfbWarmupMaxS: 1,
    }
  : {
      wrkWarmupS: 3,
      wrkS: 10,
      rates: [1000, 2000],
      rateWarmupS: 3,
      rateS: 10,
      ttfbRequests: 500,
      ttfbWarmup: 3000,
      ttfbWarmupMaxS: 3,
    };
const WRK_CONNECTIONS = 64;
/** Unmeasured streams that open the measuring client's connection. */
const TTFB_CONNECTION_WARMUP = 10;
const OPEN_LOOP_CONNECTIONS = 256;
const PROFILE_LOAD_S = 15;

const BODY = CHAT_BODY;
const STREAM_BODY = JSON.stringify({ ...JSON.parse(BODY), stream: true });

function log(msg) {
  process.stderr.write(`bench: ${msg}\n`);
}

function machine() {
  const cpuinfo = existsSync('/proc/cpuinfo') ? readFileSync('/proc/cpuinfo', 'utf8') : '';
  const model = /^model name\s*:\s*(.+)$/m.exec(cpuinfo);
  return {
    nproc: os.availableParallelism(),
    cpuModel: model ? model[1].trim() : (os.cpus()[0]?.model ?? 'unknown'),
    node: process.version,
    kernel: `${os.type()} ${os.release()}`,
  };
}

function preflight() {
  if (process.platform !== 'linux') throw new Error('the benchmark needs Linux (taskset, /proc)');
  if (!hasCommand('taskset', ['--version'])) {
    throw new Error('taskset is missing; it comes with util-linux (apt-get install util-linux)');
  }
  checkWrk();
  if (!existsSync(join(ROOT, 'dist', 'cli', 'main.js'))) {
    throw new Error('dist/ is missing; run `npm run build` first');
  }
  if (os.availableParallelism() < 2) {
    throw new Error('the benchmark pins the router and the load to separate CPUs; it needs 2 CPUs');
  }
}

async function startPeer() {
  const entry = ensurePeer(log);
  const port = await freePort();
  const s = await startService({
    name: 'peer gateway',
    cpu: ROUTER_CPU,
    cmd: process.execPath,
    args: [entry, `--port=${port}`, '--headless'],
    env: { ...process.env, NODE_ENV: 'production' },
    ready: /Ready for connections/,
    timeoutMs: 60_000,
  });
  return { ...s, url: `http://127.0.0.1:${port}` };
}

/** One request each way before measuring: fail loudly rather than benchmark errors. */
async function sanityCheck(target) {
  const r = await fetch(target.url, { method: 'POST', headers: target.headers, body: BODY });
  const text = await r.text();
  if (r.status !== 200 || !JSON.parse(text).choices?.[0]?.message) {
    throw new Error(
      `${target.name}: sanity request failed: HTTP ${r.status} ${text.slice(0, 500)}`,
    );
  }
  const s = await fetch(target.url, { method: 'POST', headers: target.headers, body: STREAM_BODY });
  const stream = await s.text();
  if (s.status !== 200 || !stream.trimEnd().endsWith('data: [DONE]')) {
    throw new Error(
      `${target.name}: sanity stream failed: HTTP ${s.status} ${stream.slice(0, 500)}`,
    );
  }
}

async function nodeClient(script, options, timeoutS) {
  const { stdout } = await runProcess({
    cpu: LOAD_CPU,
    cmd: process.execPath,
    args: [fileURLToPath(new URL(`./lib/${script}`, import.meta.url)), JSON.stringify(options)],
    env: process.env,
    timeoutMs: timeoutS * 1000,
  });
  return JSON.parse(stdout.trim().split('\n').pop());
}

async function throughput(target) {
  log(`wrk ${target.name}: warm-up ${P.wrkWarmupS} s, then ${P.wrkS} s`);
  const args = {
    cpu: LOAD_CPU,
    url: target.url,
    body: BODY,
    authorization: target.headers.authorization,
    headers: target.headers,
    connections: WRK_CONNECTIONS,
  };
  await runWrk({ ...args, durationS: P.wrkWarmupS });
  const before = schedOf(target.pid, target.cpu);
  const r = await runWrk({ ...args, durationS: P.wrkS });
  const cpu = withPerRequest(cpuBetween(before, schedOf(target.pid, target.cpu)), r.requests);
  log(
    `  ${r.requestsPerSec} req/s, non-2xx ${r.non2xx}, socket errors ${r.socketErrors}; ${cpuLine(target, cpu)}`,
  );
  return { ...r, cpu };
}

/** CPU time of the process serving the requests (sim direct, router routed) per request. */
function withPerRequest(cpu, requests) {
  return {
    ...cpu,
    cpuUsPerRequest: requests > 0 ? Math.round((cpu.cpuMs * 1000) / requests) : null,
  };
}

function cpuLine(target, cpu) {
  return `${target.process} CPU ${cpu.cpuUsPerRequest} us/request, busy ${pct(cpu.cpuShare)}, event loop waiting for its CPU ${pct(cpu.waitShare)} of the time`;
}

const pct = (v) => `${Math.round(v * 100)}%`;

/** Lets the serving processes finish the previous phase's backlog first. */
async function settle(env) {
  await waitIdle(env.router.pid, ROUTER_CPU);
  if (env.peer) await waitIdle(env.peer.pid, ROUTER_CPU);
  if (env.floor) await waitIdle(env.floor.pid, ROUTER_CPU);
  await waitIdle(env.sim.pid, LOAD_CPU);
}

async function fixedRate(target, rate) {
  log(`open loop ${target.name} at ${rate} req/s: warm-up ${P.rateWarmupS} s, then ${P.rateS} s`);
  // Measured over warm-up and run alike (the client runs both in one process).
  const before = schedOf(target.pid, target.cpu);
  const r = await nodeClient(
    'open-loop.mjs',
    {
      url: target.url,
      headers: target.headers,
      body: BODY,
      rate,
      durationS: P.rateS,
      warmupS: P.rateWarmupS,
      connections: OPEN_LOOP_CONNECTIONS,
      drainTimeoutS: 10,
    },
    P.rateWarmupS + P.rateS + 30,
  );
  const cpu = withPerRequest(
    cpuBetween(before, schedOf(target.pid, target.cpu)),
    r.sent + (r.warmup?.completed ?? 0),
  );
  const l = r.latencyMs;
  log(
    `  p50 ${l.p50} ms, p99 ${l.p99} ms, max ${l.max} ms; errors ${r.errors}, incomplete ${r.incomplete}; ${cpuLine(target, cpu)}`,
  );
  return { ...r, cpu };
}

async function ttfb(target, env) {
  // The streaming path gets the warm-up the non-streaming one gets before its phases
  // (wrk at saturation for the same time) and then up to 3,000 sequential streams (at
  // most 3 s), then a settle, before the measured ones. With only 50 sequential
  // warm-up requests, the optimising compiler was still compiling the SSE path during
  // the measured streams: the router's compiler thread ran 81 ms of the 0.8 s phase on
  // the router's CPU, the event loop waited for it (12-14 % of the phase), and the
  // verdict was inconclusive. After 3,000 the compiler thread ran 0.5 ms in the phase.
  log(`streaming TTFB ${target.name}: warm-up ${P.wrkWarmupS} s of wrk streams`);
  await runWrk({
    cpu: LOAD_CPU,
    url: target.url,
    body: STREAM_BODY,
    authorization: target.headers.authorization,
    headers: target.headers,
    connections: WRK_CONNECTIONS,
    durationS: P.wrkWarmupS,
  });
  const stream = { url: target.url, headers: target.headers, body: STREAM_BODY };
  await nodeClient(
    'ttfb.mjs',
    { ...stream, requests: 0, warmup: P.ttfbWarmup, warmupMaxS: P.ttfbWarmupMaxS },
    60,
  );
  await settle(env);
  // The CPU accounting covers the measured streams only (and the few warm-up ones
  // that open the measuring client's connection), not the compiling warm-up above.
  log(`streaming TTFB ${target.name}: ${P.ttfbRequests} sequential requests`);
  const before = schedOf(target.pid, target.cpu);
  const r = await nodeClient(
    'ttfb.mjs',
    { ...stream, requests: P.ttfbRequests, warmup: TTFB_CONNECTION_WARMUP },
    120,
  );
  const cpu = withPerRequest(
    cpuBetween(before, schedOf(target.pid, target.cpu)),
    P.ttfbRequests + r.warmup,
  );
  log(
    `  first byte p50 ${r.firstByteMs.p50} ms, p99 ${r.firstByteMs.p99} ms; errors ${r.errors}; ${cpuLine(target, cpu)}`,
  );
  return { ...r, cpu };
}

/** The router's event loop was ready but waited for its CPU more than 5% of the time. */
function contended(cpu) {
  return cpu.waitShare > 0.05;
}

/**
 * Verdicts: `met`, `not met`, or `inconclusive` when a latency target passed or
 * failed while other processes took the router's CPU (the figure then says more
 * about the machine than about the router). Throughput is also judged from the
 * router's CPU time per request, which contention hardly changes.
 */
function targets(results) {
  const t = results.throughput.router;
  const capacity = t.cpu.cpuUsPerRequest ? Math.round(1e6 / t.cpu.cpuUsPerRequest) : null;
  const at1k = results.fixedRate.find((x) => x.rate === 1000);
  const clean = (x) => x.errors === 0 && x.incomplete === 0;
  const latencyVerdict = (ok, cpu) => (contended(cpu) ? 'inconclusive' : ok ? 'met' : 'not met');
  const list = [];
  let throughputStatus = 'not met';
  if (t.requestsPerSec >= 5000 && t.non2xx === 0) throughputStatus = 'met';
  else if (contended(t.cpu) && capacity !== null && capacity >= 5000) {
    throughputStatus = 'inconclusive';
  }
  list.push({
    name: 'Router max throughput, non-streaming, one core >= 5,000 req/s',
    source: 'issue 3, issue 8',
    measured: `${t.requestsPerSec} req/s (non-2xx ${t.non2xx}); router CPU ${t.cpu.cpuUsPerRequest} us/request = at most ${capacity} req/s on a whole core`,
    status: throughputStatus,
  });
  if (at1k) {
    const ok = at1k.added.p99 !== null && at1k.added.p99 < 1 && clean(at1k.router);
    list.push({
      name: 'Added p99 latency at 1,000 req/s < 1 ms',
      source: 'issue 3, issue 8',
      measured: `${at1k.added.p99} ms (router p99 ${at1k.router.latencyMs.p99} ms vs direct ${at1k.direct.latencyMs.p99} ms)`,
      status: latencyVerdict(ok, at1k.router.cpu),
    });
  }
  const tt = results.ttfb;
  list.push(
    {
      name: 'Added stream TTFB <= 0.5 ms',
      source: 'issue 8',
      measured: `p50 ${tt.added.p50} ms, p99 ${tt.added.p99} ms`,
      status: latencyVerdict(tt.added.p50 !== null && tt.added.p50 <= 0.5, tt.router.cpu),
    },
    {
      name: 'Router RSS after the run < 100 MB',
      source: 'issue 8',
      measured: `${results.rss.settled.router.rssMiB} MiB after ${results.rss.settled.afterIdleS} s idle (${results.rss.router.rssMiB} MiB at the end of the last phase; peak ${results.rss.router.peakRssMiB} MiB)`,
      status: results.rss.settled.router.rssMiB * 1.048576 < 100 ? 'met' : 'not met',
    },
  );
  const peer = results.throughput.peer;
  if (peer) {
    // Only answered requests count (a gateway answering errors fast is not throughput).
    const good = (x) => (x.requests > 0 ? x.requestsPerSec * (1 - x.non2xx / x.requests) : 0);
    const peerGood = Math.round(good(peer));
    const ratio = peerGood > 0 ? good(t) / peerGood : null;
    list.push({
      name: "Max req/s on one core >= 6x the peer gateway's",
      source: 'issue 8',
      measured: `${Math.round(good(t))} vs ${peerGood} successful req/s = ${ratio === null ? 'n/a' : ratio.toFixed(1)}x`,
      status: ratio !== null && ratio >= 6 ? 'met' : 'not met',
    });
  }
  return list;
}

async function setup(nodeArgs = []) {
  const dataDir = mkdtempSync(join(os.tmpdir(), 'switchyard-bench-'));
  const database = opts.storage === 'postgres' ? await createDatabase(ADMIN_DATABASE_URL) : null;
  try {
    return { ...(await start(dataDir, nodeArgs, database?.url ?? null)), database };
  } catch (err) {
    await stopAll();
    rmSync(dataDir, { recursive: true, force: true });
    await database?.drop();
    throw err;
  }
}

async function teardown(env) {
  await stopAll();
  rmSync(env.dataDir, { recursive: true, force: true });
  await env.database?.drop();
}

/** The router's V8 heap (MiB committed, whole and by space) from its own /metrics. */
/** How long the router is left idle before its settled RSS is read. */
const SETTLE_MS = 30_000;

/** The router's malloc trims so far (count, MiB released), from /metrics. */
async function trimsOf(routerUrl) {
  try {
    const text = await (await fetch(`${routerUrl}/metrics`)).text();
    const n = (re) => Number(re.exec(text)?.[1] ?? NaN);
    return {
      count: n(/^switchyard_memory_trims_total (\S+)$/m),
      releasedMiB:
        Math.round((n(/^switchyard_memory_trim_released_bytes_total (\S+)$/m) / 1048576) * 10) / 10,
    };
  } catch {
    return null;
  }
}

async function v8HeapOf(routerUrl) {
  try {
    const text = await (await fetch(`${routerUrl}/metrics`)).text();
    const mib = (re) => {
      const m = re.exec(text);
      return m ? Math.round((Number(m[1]) / 1048576) * 10) / 10 : null;
    };
    return {
      totalMiB: mib(/^switchyard_nodejs_heap_size_total_bytes (\S+)$/m),
      newMiB: mib(/^switchyard_nodejs_heap_space_size_total_bytes\{space="new"\} (\S+)$/m),
      oldMiB: mib(/^switchyard_nodejs_heap_space_size_total_bytes\{space="old"\} (\S+)$/m),
    };
  } catch {
    return null;
  }
}

async function start(dataDir, nodeArgs, databaseUrl) {
  const token = randomBytes(24).toString('base64url');
  log('starting the sim worker (CPU 1) and the router (CPU 0)');
  // The single-instance setup: no Redis; PGlite unless --storage=postgres.
  const sim = await startSim({ cpu: LOAD_CPU, simArgs: ['--ttft-ms', '0', '--tpot-ms', '0'] });
  const router = await startRouter({ cpu: ROUTER_CPU, dataDir, token, nodeArgs, databaseUrl });
  const reg = await register({ routerUrl: router.url, token, workerUrl: sim.url });
  const direct = {
    name: 'direct',
    process: 'sim',
    pid: sim.pid,
    cpu: LOAD_CPU,
    url: `${sim.url}/chat/completions`,
    headers: { 'content-type': 'application/json' },
  };
  const routed = {
    name: 'router',
    process: 'router',
    pid: router.pid,
    cpu: ROUTER_CPU,
    url: `${router.url}/${reg.projectId}/${reg.endpointSlug}/v1/chat/completions`,
    headers: { 'content-type': 'application/json', authorization: `Bearer ${reg.key}` },
  };
  await sanityCheck(direct);
  await sanityCheck(routed);
  let peer = null;
  let peered = null;
  if (opts.peer && !opts.profile) {
    peer = await startPeer();
    peered = {
      name: 'peer',
      process: 'peer',
      pid: peer.pid,
      cpu: ROUTER_CPU,
      url: `${peer.url}/v1/chat/completions`,
      headers: peerHeaders(sim.url),
    };
    await sanityCheck(peered);
  }
  let floor = null;
  let floored = null;
  if (opts.floor && !opts.profile) {
    floor = await startFloor({ cpu: ROUTER_CPU, simUrl: sim.url });
    floored = {
      name: 'floor',
      process: 'floor proxy',
      pid: floor.pid,
      cpu: ROUTER_CPU,
      url: `${floor.url}/v1/chat/completions`,
      headers: { 'content-type': 'application/json' },
    };
    await sanityCheck(floored);
  }
  return { dataDir, sim, router, peer, direct, routed, peered, floor, floored };
}

function stamp() {
  return new Date().toISOString().replace(/[:.]/g, '-');
}

async function benchmark(host) {
  const started = Date.now();
  const load1 = os.loadavg()[0];
  if (load1 > 1.5) {
    log(
      `warning: load average ${load1.toFixed(2)} on ${host.nproc} CPUs: other processes compete for the pinned CPUs, figures will be noisy (see "waiting for its CPU")`,
    );
  }
  const env = await setup(opts['router-node-args'].split(' ').filter(Boolean));
  try {
    const results = {
      timestamp: new Date().toISOString(),
      machine: host,
      loadAverageAtStart: os.loadavg().map((v) => Math.round(v * 100) / 100),
      config: {
        quick: opts.quick,
        routerCpu: ROUTER_CPU,
        loadCpu: LOAD_CPU,
        nice: NICE,
        body: JSON.parse(BODY),
        sim: { ttftMs: 0, tpotMs: 0 },
        wrk: { connections: WRK_CONNECTIONS, threads: 1, warmupS: P.wrkWarmupS, durationS: P.wrkS },
        openLoop: {
          connections: OPEN_LOOP_CONNECTIONS,
          warmupS: P.rateWarmupS,
          durationS: P.rateS,
        },
        ttfb: {
          requests: P.ttfbRequests,
          warmup: P.ttfbWarmup,
          warmupMaxS: P.ttfbWarmupMaxS,
          wrkWarmupS: P.wrkWarmupS,
        },
        peer: env.peered ? PEER_NAME : null,
        floor: env.floored ? 'bench/lib/floor-proxy.mjs (node:http + undici Pool, no logic)' : null,
        storage:
          opts.storage === 'postgres'
            ? `PostgreSQL (throwaway database; server processes ${env.database.pinned ? `pinned to CPU ${LOAD_CPU}` : 'not pinned'})`
            : 'PGlite (temp data dir, inside the router process)',
      },
    };

    results.throughput = {
      direct: await throughput(env.direct),
      router: await settle(env).then(() => throughput(env.routed)),
    };
    if (env.peered) results.throughput.peer = await settle(env).then(() => throughput(env.peered));
    if (env.floored) {
      results.throughput.floor = await settle(env).then(() => throughput(env.floored));
    }

    results.fixedRate = [];
    for (const rate of P.rates) {
      await settle(env);
      const direct = await fixedRate(env.direct, rate);
      await settle(env);
      const router = await fixedRate(env.routed, rate);
      const added = {};
      for (const p of ['p50', 'p90', 'p99', 'max'])
        added[p] = diff(router.latencyMs[p], direct.latencyMs[p]);
      const entry = { rate, direct, router, added };
      if (env.peered) {
        await settle(env);
        entry.peer = await fixedRate(env.peered, rate);
        entry.peerAdded = {};
        for (const p of ['p50', 'p90', 'p99', 'max'])
          entry.peerAdded[p] = diff(entry.peer.latencyMs[p], direct.latencyMs[p]);
      }
      if (env.floored) {
        await settle(env);
        entry.floor = await fixedRate(env.floored, rate);
        entry.floorAdded = {};
        for (const p of ['p50', 'p90', 'p99', 'max'])
          entry.floorAdded[p] = diff(entry.floor.latencyMs[p], direct.latencyMs[p]);
      }
      results.fixedRate.push(entry);
    }

    await settle(env);
    const td = await ttfb(env.direct, env);
    await settle(env);
    const tr = await ttfb(env.routed, env);
    const routerLastBusy = Date.now();
    results.ttfb = {
      direct: td,
      router: tr,
      added: {
        p50: diff(tr.firstByteMs.p50, td.firstByteMs.p50),
        p99: diff(tr.firstByteMs.p99, td.firstByteMs.p99),
      },
      addedTotalP50: diff(tr.totalMs.p50, td.totalMs.p50),
    };
    if (env.peered) {
      await settle(env);
      const tp = await ttfb(env.peered, env);
      results.ttfb.peer = tp;
      results.ttfb.peerAdded = {
        p50: diff(tp.firstByteMs.p50, td.firstByteMs.p50),
        p99: diff(tp.firstByteMs.p99, td.firstByteMs.p99),
      };
    }

    if (env.floored) {
      await settle(env);
      const tf = await ttfb(env.floored, env);
      results.ttfb.floor = tf;
      results.ttfb.floorAdded = {
        p50: diff(tf.firstByteMs.p50, td.firstByteMs.p50),
        p99: diff(tf.firstByteMs.p99, td.firstByteMs.p99),
      };
    }

    results.rss = { router: memoryOf(env.router.pid), sim: memoryOf(env.sim.pid) };
    results.rss.router.v8 = await v8HeapOf(env.router.url);
    if (env.peer) results.rss.peer = memoryOf(env.peer.pid);
    if (env.floor) results.rss.floor = memoryOf(env.floor.pid);
    // And once the router has been idle for SETTLE_MS after its last phase: V8's
    // memory reducer and the router's malloc trim act on an idle process within
    // that time, and an operator's memory limit sees the settled size.
    await sleep(Math.max(0, routerLastBusy + SETTLE_MS - Date.now()));
    results.rss.settled = {
      afterIdleS: SETTLE_MS / 1000,
      router: memoryOf(env.router.pid),
      trims: await trimsOf(env.router.url),
      ...(env.peer ? { peer: memoryOf(env.peer.pid) } : {}),
      ...(env.floor ? { floor: memoryOf(env.floor.pid) } : {}),
    };
    results.loadAverageAtEnd = os.loadavg().map((v) => Math.round(v * 100) / 100);
    results.targets = targets(results);
    results.elapsedS = Math.round((Date.now() - started) / 1000);

    mkdirSync(RESULTS, { recursive: true });
    const file = join(RESULTS, `${stamp()}.json`);
    writeFileSync(file, JSON.stringify(results, null, 2) + '\n');
    process.stdout.write('\n' + markdownReport(results) + '\n\n');
    log(`results written to ${file} (${results.elapsedS} s)`);
  } finally {
    await teardown(env);
  }
}

async function profile() {
  const dir = mkdtempSync(join(os.tmpdir(), 'switchyard-prof-'));
  const env = await setup([
    '--cpu-prof',
    `--cpu-prof-dir=${dir}`,
    ...opts['router-node-args'].split(' ').filter(Boolean),
  ]);
  try {
    const body = opts['profile-stream'] ? STREAM_BODY : BODY;
    log(`profiling the router under wrk load: warm-up ${P.wrkWarmupS} s, then ${PROFILE_LOAD_S} s`);
    const args = {
      cpu: LOAD_CPU,
      url: env.routed.url,
      body,
      authorization: env.routed.headers.authorization,
      connections: WRK_CONNECTIONS,
    };
    await runWrk({ ...args, durationS: P.wrkWarmupS });
    const fromUs = Number(process.hrtime.bigint() / 1000n);
    const rate = opts['profile-rate'] ? Number(opts['profile-rate']) : null;
    const r = rate
      ? await nodeClient(
          'open-loop.mjs',
          {
            url: env.routed.url,
            headers: env.routed.headers,
            body,
            rate,
            durationS: PROFILE_LOAD_S,
            warmupS: 0,
            connections: OPEN_LOOP_CONNECTIONS,
            drainTimeoutS: 10,
          },
          PROFILE_LOAD_S + 30,
        ).then((x) => ({ ...x, requestsPerSec: Math.round(x.completed / PROFILE_LOAD_S) }))
      : await runWrk({ ...args, durationS: PROFILE_LOAD_S });
    const toUs = Number(process.hrtime.bigint() / 1000n);
    log(`  ${r.requestsPerSec} req/s under the profiler`);
    // SIGTERM: the router exits through process.exit, which writes the profile.
    await stopProcess(env.router.child, 20_000);
    const file = readdirSync(dir).find((f) => f.endsWith('.cpuprofile'));
    if (!file) throw new Error(`no .cpuprofile written in ${dir}`);
    // Only the measured load counts (same monotonic clock as the router's profiler).
    const summary = summarizeProfile(JSON.parse(readFileSync(join(dir, file), 'utf8')), {
      top: 30,
      fromUs,
      toUs,
    });
    mkdirSync(RESULTS, { recursive: true });
    const base = join(RESULTS, `profile-${stamp()}`);
    writeFileSync(`${base}.cpuprofile`, readFileSync(join(dir, file)));
    writeFileSync(
      `${base}.json`,
      JSON.stringify({ requestsPerSec: r.requestsPerSec, ...summary }, null, 2) + '\n',
    );
    process.stdout.write('\n' + formatProfile(summary) + '\n\n');
    log(`profile written to ${base}.cpuprofile (open it in Chrome DevTools) and ${base}.json`);
  } finally {
    await teardown(env);
    rmSync(dir, { recursive: true, force: true });
  }
}

installCleanup();
try {
  preflight();
  const host = machine(); // before pinning: nproc counts the CPUs this process may use
  pinSelf(LOAD_CPU);
  if (!Number.isInteger(NICE) || NICE < -20 || NICE > 19) throw new Error('--nice takes -20..19');
  setNiceness(NICE);
  if (opts.profile) await profile();
  else await benchmark(host);
} catch (err) {
  process.stderr.write(`bench: ${err instanceof Error ? err.message : String(err)}\n`);
  await stopAll();
  process.exitCode = 1;
}
