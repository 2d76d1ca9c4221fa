#!/usr/bin/env node
/**
 * Two builds of the router side by side in one run: this checkout's (B) against a
 * baseline checkout's (A, `--base=<dir>`, built with `npm run build` there). Both
 * run pinned to CPU 0 in front of one `sim` worker on CPU 1, each with its own
 * throwaway PostgreSQL database, and take the load in alternating rounds (A B B A
 * A B …) so a machine that speeds up or slows down during the run does not favour
 * either. Per round and build: wrk at saturation (req/s, CPU per request), then the
 * open-loop client at `--rate` (CPU per request, p50/p99 from the scheduled send).
 * Prints each round and the medians. `--a-args` / `--b-args` add Node/V8 flags to one
 * build's router (with `--base=.` that compares flags on the same build).
 *
 *   git worktree add /tmp/base <commit> && (cd /tmp/base && npm ci && npm run build)
 *   npm run build && node bench/ab.mjs --base=/tmp/base [--rounds=4] [--rate=1000] [--seconds=8]
 *   node bench/ab.mjs --base=. --b-args="--max-semi-space-size=8"
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { createDatabase } from './lib/postgres.mjs';
import { runOpenLoop } from './lib/open-loop.mjs';
import { cpuBetween, installCleanup, pinSelf, schedOf, stopAll, waitIdle } from './lib/procs.mjs';
import { BIN, startRouter, startSim } from './lib/services.mjs';
import { CHAT_BODY, register } from './lib/setup.mjs';
import { percentile } from './lib/stats.mjs';
import { checkWrk, runWrk } from './lib/wrk.mjs';

const TARGET_CPU = 0;
const LOAD_CPU = 1;
const { values: opts } = parseArgs({
  options: {
    base: { type: 'string' },
    rounds: { type: 'string', default: '4' },
    rate: { type: 'string', default: '1000' },
    seconds: { type: 'string', default: '8' },
    'a-args': { type: 'string', default: '' },
    'b-args': { type: 'string', default: '' },
  },
  strict: true,
});
const ROUNDS = Number(opts.rounds);
const RATE = Number(opts.rate);
const SECONDS = Number(opts.seconds);
if (!opts.base || !(ROUNDS > 0) || !(RATE > 0) || !(SECONDS > 0)) {
  process.stderr.write('ab: --base=<checkout dir> is required; --rounds, --rate, --seconds > 0\n');
  process.exit(2);
}
const log = (msg) => process.stderr.write(`ab: ${msg}\n`);

checkWrk();
installCleanup();
pinSelf(LOAD_CPU);

const adminUrl = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const cleanups = [];

async function startBuild(label, bin, simUrl, nodeArgs) {
  const dataDir = mkdtempSync(
    join(os.tmpdir(), `switchyard-ab-${label.replace(/[^A-Za-z0-9]+/g, '-')}-`),
  );
  const db = await createDatabase(adminUrl);
  cleanups.push(async () => {
    rmSync(dataDir, { recursive: true, force: true });
    await db.drop();
  });
  const token = randomBytes(24).toString('base64url');
  const router = await startRouter({
    bin,
    name: `router ${label}`,
    cpu: TARGET_CPU,
    dataDir,
    token,
    databaseUrl: db.url,
    nodeArgs: nodeArgs.split(' ').filter(Boolean),
  });
  const reg = await register({ routerUrl: router.url, token, workerUrl: simUrl });
  return {
    label,
    pid: router.pid,
    url: `${router.url}/${reg.projectId}/${reg.endpointSlug}/v1/chat/completions`,
    authorization: `Bearer ${reg.key}`,
    rounds: [],
  };
}

async function round(b) {
  const wrk = (durationS) =>
    runWrk({
      cpu: LOAD_CPU,
      url: b.url,
      body: CHAT_BODY,
      authorization: b.authorization,
      connections: 32,
      durationS,
    });
  await wrk(3);
  await waitIdle(b.pid, TARGET_CPU);
  let before = schedOf(b.pid, TARGET_CPU);
  const w = await wrk(5);
  let cpu = cpuBetween(before, schedOf(b.pid, TARGET_CPU));
  const sat = { rps: w.requestsPerSec, us: (cpu.cpuMs * 1000) / w.requests };
  await waitIdle(b.pid, TARGET_CPU);
  before = schedOf(b.pid, TARGET_CPU);
  const r = await runOpenLoop({
    url: b.url,
    headers: { authorization: b.authorization },
    body: CHAT_BODY,
    rate: RATE,
    durationS: SECONDS,
    warmupS: 2,
  });
  cpu = cpuBetween(before, schedOf(b.pid, TARGET_CPU));
  if (r.errors || r.incomplete) log(`${b.label}: ${r.errors} errors, ${r.incomplete} incomplete`);
  // The warm-up's requests ran inside the CPU window too.
  const n = r.completed + (r.warmup?.completed ?? 0);
  const row = {
    rps: sat.rps,
    satUs: Math.round(sat.us),
    rateUs: Math.round((cpu.cpuMs * 1000) / n),
    p50: r.latencyMs.p50,
    p99: r.latencyMs.p99,
  };
  b.rounds.push(row);
  log(
    `${b.label}: ${row.rps} req/s at ${row.satUs} µs; ${RATE} req/s: ${row.rateUs} µs, p50 ${row.p50.toFixed(3)} p99 ${row.p99.toFixed(3)} ms`,
  );
}

/** The median as every bench table gives it: the nearest-rank p50 (lib/stats.mjs). */
const median = (xs) =>
  percentile(
    [...xs].sort((a, b) => a - b),
    50,
  );

try {
  const sim = await startSim({ cpu: LOAD_CPU });
  const label = (name, args) => (args ? `${name} ${args}` : name);
  const a = await startBuild(
    label('A (base)', opts['a-args']),
    join(resolve(opts.base), 'bin', 'switchyard.js'),
    sim.url,
    opts['a-args'],
  );
  const b = await startBuild(label('B (this)', opts['b-args']), BIN, sim.url, opts['b-args']);
  for (let i = 0; i < ROUNDS; i++) {
    // A B, B A, A B, …: each build goes first in half of the rounds.
    for (const x of i % 2 === 0 ? [a, b] : [b, a]) await round(x);
  }
  const out = [
    `A/B, ${ROUNDS} rounds; CPU per request at saturation (wrk) and at ${RATE} req/s (open loop, ${SECONDS} s)`,
    '',
    '| Build | wrk req/s | CPU/request, wrk | CPU/request, fixed rate | p50 (ms) | p99 (ms) |',
    '| --- | ---: | ---: | ---: | ---: | ---: |',
  ];
  for (const x of [a, b]) {
    const col = (k, f = (v) => v) => x.rounds.map((r) => f(r[k])).join(', ');
    out.push(
      `| ${x.label} | ${col('rps')} | ${col('satUs')} µs | ${col('rateUs')} µs | ${col('p50', (v) => v.toFixed(3))} | ${col('p99', (v) => v.toFixed(3))} |`,
    );
  }
  for (const x of [a, b]) {
    const m = (k) => median(x.rounds.map((r) => r[k]));
    out.push(
      `| ${x.label}, median | ${Math.round(m('rps'))} | ${Math.round(m('satUs'))} µs | ${Math.round(m('rateUs'))} µs | ${m('p50').toFixed(3)} | ${m('p99').toFixed(3)} |`,
    );
  }
  process.stdout.write(out.join('\n') + '\n');
} finally {
  await stopAll();
  for (const c of cleanups) await c();
}
process.exit(0);
