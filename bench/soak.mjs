/**
 * `node bench/soak.mjs [--minutes=10] [--rate=500] [--storage=pglite|postgres]`:
 * the router under a steady open-loop load for a long time, watching memory.
 *
 *   CPU 0: the router (`switchyard serve`); CPU 1: the sim worker and the client.
 *
 * The open-loop client (bench/lib/open-loop.mjs) runs in 30-second windows back
 * to back; after each window the router's RSS and heap (from its /metrics) are
 * sampled. Growth is judged on the second half of the run (after warm-up and
 * JIT): the least-squares slope of RSS over time, in MiB per minute, and the
 * difference between the last sample and the first sample of the second half.
 * Prints a markdown table and writes bench/results/soak-<timestamp>.json.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { fetch } from 'undici';
import { installCleanup, memoryOf, runProcess, stopAll } from './lib/procs.mjs';
import { startStack } from './lib/services.mjs';
import { CHAT_BODY } from './lib/setup.mjs';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const WINDOW_S = 30;

const { values: opts } = parseArgs({
  options: {
    minutes: { type: 'string', default: '10' },
    rate: { type: 'string', default: '500' },
    storage: { type: 'string', default: 'pglite' },
  },
  strict: true,
});
const MINUTES = Number(opts.minutes);
const RATE = Number(opts.rate);
const log = (m) => process.stderr.write(`soak: ${m}\n`);

function slope(points) {
  const n = points.length;
  if (n < 2) return null;
  const mx = points.reduce((a, p) => a + p[0], 0) / n;
  const my = points.reduce((a, p) => a + p[1], 0) / n;
  let num = 0;
  let den = 0;
  for (const [x, y] of points) {
    num += (x - mx) * (y - my);
    den += (x - mx) ** 2;
  }
  return den === 0 ? null : num / den;
}

async function heapUsedMiB(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = /^switchyard_nodejs_heap_size_used_bytes (\S+)$/m.exec(text);
  return m ? Math.round((Number(m[1]) / 1048576) * 10) / 10 : null;
}

async function main() {
  installCleanup();
  const stack = await startStack({ name: 'soak', storage: opts.storage });
  try {
    const { router, reg, url } = stack;
    const routerUrl = router.url;
    const body = CHAT_BODY;
    const windows = Math.max(2, Math.round((MINUTES * 60) / WINDOW_S));
    const samples = [];
    const t0 = Date.now();
    for (let w = 0; w < windows; w++) {
      const { stdout } = await runProcess({
        cpu: 1,
        cmd: process.execPath,
        args: [
          fileURLToPath(new URL('./lib/open-loop.mjs', import.meta.url)),
          JSON.stringify({
            url,
            headers: { 'content-type': 'application/json', authorization: `Bearer ${reg.key}` },
            body,
            rate: RATE,
            durationS: WINDOW_S,
            warmupS: 0,
            connections: 64,
            drainTimeoutS: 10,
          }),
        ],
        env: process.env,
        timeoutMs: (WINDOW_S + 40) * 1000,
      });
      const r = JSON.parse(stdout.trim().split('\n').pop());
      const mem = memoryOf(router.pid);
      const sample = {
        minute: Math.round(((Date.now() - t0) / 60000) * 100) / 100,
        rssMiB: mem.rssMiB,
        heapUsedMiB: await heapUsedMiB(routerUrl),
        completed: r.completed,
        errors: r.errors,
        incomplete: r.incomplete,
        p50Ms: r.latencyMs.p50,
        p99Ms: r.latencyMs.p99,
      };
      samples.push(sample);
      log(
        `window ${w + 1}/${windows}: RSS ${sample.rssMiB} MiB, heap ${sample.heapUsedMiB} MiB, ${r.completed} ok, ${r.errors} errors, p99 ${r.latencyMs.p99} ms`,
      );
    }
    const half = samples.slice(Math.floor(samples.length / 2));
    const rssSlope = slope(half.map((s) => [s.minute, s.rssMiB]));
    const heapSlope = slope(half.map((s) => [s.minute, s.heapUsedMiB ?? 0]));
    const result = {
      timestamp: new Date().toISOString(),
      minutes: MINUTES,
      rate: RATE,
      storage: opts.storage,
      samples,
      secondHalf: {
        rssSlopeMiBPerMin: rssSlope === null ? null : Math.round(rssSlope * 100) / 100,
        heapSlopeMiBPerMin: heapSlope === null ? null : Math.round(heapSlope * 100) / 100,
        rssChangeMiB: Math.round((half.at(-1).rssMiB - half[0].rssMiB) * 10) / 10,
      },
      totals: {
        completed: samples.reduce((a, s) => a + s.completed, 0),
        errors: samples.reduce((a, s) => a + s.errors, 0),
        incomplete: samples.reduce((a, s) => a + s.incomplete, 0),
      },
      loadAverage: os.loadavg().map((v) => Math.round(v * 100) / 100),
    };
    mkdirSync(join(ROOT, 'bench', 'results'), { recursive: true });
    const file = join(
      ROOT,
      'bench',
      'results',
      `soak-${result.timestamp.replace(/[:.]/g, '-')}.json`,
    );
    writeFileSync(file, JSON.stringify(result, null, 2) + '\n');
    const out = [
      '| Minute | RSS (MiB) | Heap used (MiB) | Completed | Errors | p99 (ms) |',
      '| ---: | ---: | ---: | ---: | ---: | ---: |',
      ...samples.map(
        (s) =>
          `| ${s.minute} | ${s.rssMiB} | ${s.heapUsedMiB ?? 'n/a'} | ${s.completed} | ${s.errors + s.incomplete} | ${s.p99Ms} |`,
      ),
      '',
      `Second half: RSS slope ${result.secondHalf.rssSlopeMiBPerMin} MiB/min, heap slope ${result.secondHalf.heapSlopeMiBPerMin} MiB/min, RSS change ${result.secondHalf.rssChangeMiB} MiB; ${result.totals.completed} requests, ${result.totals.errors} errors, ${result.totals.incomplete} incomplete.`,
    ];
    process.stdout.write(out.join('\n') + '\n');
    log(`results written to ${file}`);
  } finally {
    await stack.close();
  }
}

main().catch(async (err) => {
  process.stderr.write(`soak: ${err instanceof Error ? err.message : String(err)}\n`);
  await stopAll();
  process.exitCode = 1;
});
