#!/usr/bin/env node
/**
 * Where the slow requests' time goes, without instrumenting the router's code.
 *
 * The client (lib/stamp-client.mjs) and an upstream (lib/stamp-upstream.mjs) stamp
 * every request on the machine's monotonic clock, which every process shares, so
 * each request's latency splits into
 *
 *   lag       due → handed to the client's socket pool (the client's own delay)
 *   inbound   handed over → its body had arrived upstream
 *   upstream  arrived → the upstream wrote its answer
 *   outbound  answer written → the client had read it whole
 *
 * and runs straight to the upstream ("direct") give the same legs without a router.
 * Pinning as in `npm run bench`: the router on CPU 0; the upstream, the client, this
 * script and (with --storage=postgres) the PostgreSQL server on CPU 1.
 *
 * --inside loads lib/router-stamps.mjs into the router (a preload: src/ knows nothing
 *   of it) for its garbage collections and, from Node's and undici's diagnostics
 *   channels, when it parsed each request, sent it upstream, had the upstream's
 *   headers and finished: the inbound and outbound legs split at the router.
 * --loop-probe adds the router's event-loop gaps of 3 ms or more (a 1 ms timer in
 *   the router, so it perturbs a little).
 * --sched records the scheduler system-wide with perf during the router runs and
 *   says, for the slowest 1 %, what the router's main thread was doing between the
 *   client's send and its parse of the request (running other work, runnable while
 *   something else held its CPU, or asleep) and who held its CPU. Needs --inside,
 *   perf (Debian: linux-perf) and root.
 *
 *   npm run build && node bench/tail.mjs [--rate=1000] [--seconds=10] [--rounds=2]
 *     [--storage=postgres|pglite] [--inside [--loop-probe] [--sched]]
 *     [--router-env=K=V,…] [--router-node-args="…"] [--router-stdout=FILE] [--json]
 */
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { fetch } from 'undici';
import { createDatabase } from './lib/postgres.mjs';
import { installCleanup, pinSelf, runProcess, startService, stopAll } from './lib/procs.mjs';
import { startRouter } from './lib/services.mjs';
import { CHAT_BODY, register } from './lib/setup.mjs';
import {
  attributeWindows,
  joinRequests,
  parseSched,
  slowest,
  summarize,
} from './lib/tail-analysis.mjs';
import { runWrk } from './lib/wrk.mjs';

const { values: opts } = parseArgs({
  options: {
    rate: { type: 'string', default: '1000' },
    seconds: { type: 'string', default: '10' },
    rounds: { type: 'string', default: '2' },
    storage: { type: 'string', default: 'postgres' },
    inside: { type: 'boolean', default: false },
    'loop-probe': { type: 'boolean', default: false },
    sched: { type: 'boolean', default: false },
    'router-env': { type: 'string', default: '' },
    'router-node-args': { type: 'string', default: '' },
    'router-stdout': { type: 'string' },
    json: { type: 'boolean', default: false },
  },
  strict: true,
});
const RATE = Number(opts.rate);
const SECONDS = Number(opts.seconds);
const ROUNDS = Number(opts.rounds);
const ROUTER_CPU = 0;
const LOAD_CPU = 1;
if (opts.sched && !opts.inside) {
  process.stderr.write(
    'tail: --sched needs --inside (the router stamps when it parsed each request)\n',
  );
  process.exit(2);
}

function log(msg) {
  process.stderr.write(`tail: ${msg}\n`);
}

const lib = (name) => fileURLToPath(new URL(`./lib/${name}`, import.meta.url));

/** One open-loop run; resolves with the client's rows. */
async function client(url, headers, first, seconds = SECONDS) {
  const { stdout } = await runProcess({
    cpu: LOAD_CPU,
    cmd: process.execPath,
    args: [lib('stamp-client.mjs'), JSON.stringify({ url, headers, rate: RATE, seconds, first })],
    env: process.env,
    timeoutMs: (seconds + 60) * 1000,
  });
  return JSON.parse(stdout.trim().split('\n').pop()).rows;
}

/** The upstream's stamps since the last call: Map seed → [arrived, answered]. */
async function upstreamStamps(base) {
  const res = await fetch(`${base.replace(/\/v1$/, '')}/stamps`);
  return new Map((await res.json()).map(([seed, a, b]) => [seed, [a, b]]));
}

/** The router's stamps since the last call (lib/router-stamps.mjs writes them on SIGUSR2). */
async function routerStamps(pid, file) {
  rmSync(file, { force: true });
  process.kill(pid, 'SIGUSR2');
  for (let i = 0; i < 300 && !existsSync(file); i++) await new Promise((r) => setTimeout(r, 10));
  await new Promise((r) => setTimeout(r, 50)); // the write is synchronous; let it land whole
  const { gcs, gaps, requests } = JSON.parse(readFileSync(file, 'utf8'));
  return {
    gcs: gcs.map(([kind, start, d]) => ({ kind, start: Number(start), ms: d })),
    gaps: gaps.map(([start, gapMs, cpuMs]) => ({ start: Number(start), ms: gapMs, cpuMs })),
    requests: new Map(requests.map((r) => [r[0], r.slice(1)])),
  };
}

/** perf recording the scheduler on every CPU into tmpfs (no writeback on the router's CPU). */
function startSchedRecord(dir) {
  const file = join(dir, 'sched.data');
  const child = spawn(
    'taskset',
    [
      '-c',
      String(LOAD_CPU),
      'perf',
      'record',
      '-q',
      '-e',
      'sched:sched_switch',
      '-e',
      'sched:sched_wakeup',
      '-k',
      'CLOCK_MONOTONIC',
      '-a',
      '-o',
      file,
    ],
    { stdio: 'ignore' },
  );
  return {
    async stop() {
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGINT');
      await exited;
      const text = execFileSync('perf', ['script', '-i', file, '-F', 'cpu,time,event,trace'], {
        encoding: 'utf8',
        maxBuffer: 1 << 30,
        stdio: ['ignore', 'pipe', 'ignore'],
      });
      rmSync(file, { force: true });
      return parseSched(text);
    },
  };
}

installCleanup();
// This script stays off the router's CPU, as bench/run.mjs does.
pinSelf(LOAD_CPU);
const dataDir = mkdtempSync(join(os.tmpdir(), 'switchyard-tail-'));
const schedDir = existsSync('/dev/shm') ? mkdtempSync('/dev/shm/switchyard-tail-') : dataDir;
const db =
  opts.storage === 'postgres'
    ? await createDatabase(
        process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres',
      )
    : null;
try {
  const up = await startService({
    name: 'stamp upstream',
    cpu: LOAD_CPU,
    cmd: process.execPath,
    args: [lib('stamp-upstream.mjs')],
    env: process.env,
    ready: /stamp upstream on (http:\/\/127\.0\.0\.1:\d+\/v1)/,
  });
  const upstream = up.match[1];
  const token = randomBytes(24).toString('base64url');
  const stampsFile = join(dataDir, 'stamps.json');
  const router = await startRouter({
    cpu: ROUTER_CPU,
    dataDir,
    token,
    databaseUrl: db?.url ?? null,
    nodeArgs: [
      ...(opts.inside ? ['--import', lib('router-stamps.mjs')] : []),
      ...opts['router-node-args'].split(' ').filter(Boolean),
    ],
    extraEnv: {
      ...Object.fromEntries(
        opts['router-env']
          .split(',')
          .filter(Boolean)
          .map((kv) => kv.split('=')),
      ),
      STAMPS_FILE: stampsFile,
      STAMPS_LOOP_PROBE: opts['loop-probe'] ? '1' : '0',
      STAMPS_REQUESTS: opts.inside ? '1' : '0',
    },
  });
  const stdoutFile = opts['router-stdout'];
  const mark = (what) => stdoutFile && appendFileSync(stdoutFile, `=== tail: ${what}\n`);
  if (stdoutFile) router.child.stdout.on('data', (d) => appendFileSync(stdoutFile, d));

  const reg = await register({ routerUrl: router.url, token, workerUrl: upstream });
  const routed = `${router.url}/${reg.projectId}/${reg.endpointSlug}/v1/chat/completions`;
  const auth = { authorization: `Bearer ${reg.key}` };
  log('warm-up: wrk 5 s, then 3 s at the rate');
  await runWrk({
    cpu: LOAD_CPU,
    url: routed,
    body: CHAT_BODY,
    authorization: auth.authorization,
    headers: auth,
    connections: 64,
    durationS: 5,
  });
  await client(routed, auth, 10_000_000, 3);
  await upstreamStamps(upstream);
  if (opts.inside) await routerStamps(router.pid, stampsFile);

  const results = [];
  let first = 0;
  for (let round = 1; round <= ROUNDS; round++) {
    for (const name of ['direct', 'router']) {
      const viaRouter = name === 'router';
      const rec = viaRouter && opts.sched ? startSchedRecord(schedDir) : null;
      if (rec) await new Promise((r) => setTimeout(r, 500)); // perf is recording
      mark(`${name} ${round} start`);
      const rows = viaRouter
        ? await client(routed, auth, first)
        : await client(`${upstream}/chat/completions`, {}, first);
      mark(`${name} ${round} end`);
      first += rows.length;
      const rs = viaRouter && opts.inside ? await routerStamps(router.pid, stampsFile) : null;
      const sched = rec ? await rec.stop() : null;
      const requests = joinRequests(rows, await upstreamStamps(upstream), rs?.requests);
      const s = { name: `${name} ${round}`, ...summarize(requests, rs?.gcs ?? null) };
      if (rs) {
        s.gcCount = rs.gcs.length;
        s.gcMs = rs.gcs.reduce((n, g) => n + g.ms, 0);
        const at = (t) => Math.round((t - requests[0].due) / 1e6);
        s.longGcs = rs.gcs
          .filter((g) => g.ms >= 1)
          .map((g) => `${g.kind} ${g.ms.toFixed(1)} ms at ${at(g.start)}`);
        s.gaps = rs.gaps.map(
          (g) => `${g.ms.toFixed(1)} ms (CPU ${g.cpuMs.toFixed(1)}) at ${at(g.start)}`,
        );
      }
      if (sched) s.sched = attributeWindows(slowest(requests), sched, router.pid, ROUTER_CPU);
      results.push(s);
      log(`${s.name}: p50 ${s.p50.toFixed(3)} p99 ${s.p99.toFixed(3)} ms (${s.n} requests)`);
    }
  }

  if (opts.json) {
    process.stdout.write(JSON.stringify(results) + '\n');
  } else {
    const f = (x) => x.toFixed(3);
    const out = [
      `\n${RATE} req/s, ${SECONDS} s per run. Legs in ms: median of all requests | mean of the slowest 1 %\n`,
      '| run | p50 | p99 | lag | inbound | upstream | outbound |',
      '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
    ];
    const cell = (s, k) => `${f(s.median[k])} \\| ${f(s.slowMean[k])}`;
    for (const s of results) {
      out.push(
        `| ${s.name} | ${f(s.p50)} | ${f(s.p99)} | ${cell(s, 'lag')} | ${cell(s, 'inbound')} | ${cell(s, 'upstream')} | ${cell(s, 'outbound')} |`,
      );
    }
    out.push('\nWhen the slowest 1 % were due (ms from the start of each run):');
    for (const s of results) out.push(`- ${s.name}: ${s.slowAt.join(' ')}`);
    for (const s of results.filter((r) => r.insideMedian)) {
      out.push(`\n${s.name}, split at the router (ms; median of all | mean of the slowest 1 %):`);
      for (const k of Object.keys(s.insideMedian)) {
        out.push(`- ${k}: ${f(s.insideMedian[k])} | ${f(s.insideSlowMean[k])}`);
      }
      out.push(
        `Collections: ${s.gcCount}, ${s.gcMs.toFixed(1)} ms in all; ${s.slowDuringGc} of the slowest ${s.slowAt.length} overlapped one.`,
        `Collections of 1 ms or more: ${s.longGcs.join('; ') || 'none'}`,
      );
      if (opts['loop-probe'])
        out.push(`Event-loop gaps of 3 ms or more: ${s.gaps.join('; ') || 'none'}`);
      if (s.sched) {
        const a = s.sched;
        out.push(
          `From the client's send to the router's parse, the slowest ${a.n}: main thread running other work ${f(a.meanMs.running)} ms, ` +
            `runnable while its CPU was taken ${f(a.meanMs.runnable)} ms, asleep (request not there yet) ${f(a.meanMs.sleeping)} ms on average; ` +
            `mostly ${Object.entries(a.dominant)
              .map(([k, v]) => `${k} ${v}`)
              .join(', ')}.`,
          `Who held CPU ${ROUTER_CPU} while the router's main thread waited for it (ms, summed over those windows): ` +
            a.occupantsMs
              .slice(0, 8)
              .map(([t, v]) => `${t} ${v.toFixed(1)}`)
              .join('; '),
        );
      }
    }
    process.stdout.write(out.join('\n') + '\n');
  }
} finally {
  await stopAll();
  rmSync(dataDir, { recursive: true, force: true });
  if (schedDir !== dataDir) rmSync(schedDir, { recursive: true, force: true });
  await db?.drop();
}
