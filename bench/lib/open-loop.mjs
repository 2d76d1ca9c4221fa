/**
 * Open-loop fixed-rate load: request i is scheduled at t0 + i / rate, whatever
 * happened to earlier requests, and its latency is measured from that SCHEDULED
 * time, not from when it actually left. A server (or client) stall therefore
 * shows up in every request that should have been sent during the stall, which
 * is what a real client population experiences (no coordinated omission).
 *
 * The scheduler wakes on timers (never busy-spins: it shares a CPU with the sim
 * worker), sends everything that is due, and sleeps until the next due time.
 * Node timers have 1 ms granularity, so sends leave up to ~1 ms late; that lag
 * is reported as `sendLag` and counted in the latency of direct and router runs
 * alike, so it cancels out of the added latency.
 *
 * Bounded: exactly rate × duration requests are sent; the run then waits at most
 * `drainTimeoutS` for stragglers and reports what did not finish as `incomplete`.
 *
 * CLI: node bench/lib/open-loop.mjs '<json options>'  (prints a JSON result)
 */
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { Pool } from 'undici';
import { summarize } from './stats.mjs';

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

async function phase(pool, opts, rate, durationS, drainTimeoutS) {
  const total = Math.max(1, Math.round(rate * durationS));
  const interval = 1000 / rate;
  const latency = new Float64Array(total).fill(NaN);
  const lag = new Float64Array(total);
  let done = 0;
  let errors = 0;
  const statuses = {};
  const t0 = performance.now() + 5;

  const fire = (i) => {
    const scheduled = t0 + i * interval;
    lag[i] = performance.now() - scheduled;
    pool
      .request({ method: 'POST', path: opts.path, headers: opts.headers, body: opts.body })
      .then(async (res) => {
        await res.body.arrayBuffer();
        statuses[res.statusCode] = (statuses[res.statusCode] ?? 0) + 1;
        if (res.statusCode === 200) latency[i] = performance.now() - scheduled;
        else errors++;
      })
      .catch(() => {
        errors++;
      })
      .finally(() => {
        done++;
      });
  };

  let next = 0;
  await new Promise((resolve) => {
    const tick = () => {
      const now = performance.now();
      while (next < total && t0 + next * interval <= now) fire(next++);
      if (next >= total) return resolve();
      setTimeout(tick, Math.max(0, t0 + next * interval - performance.now()));
    };
    setTimeout(tick, 5);
  });
  const sendSpanMs = performance.now() - t0;

  const drainUntil = performance.now() + drainTimeoutS * 1000;
  while (done < total && performance.now() < drainUntil) await sleep(5);

  const ok = [];
  for (const v of latency) if (!Number.isNaN(v)) ok.push(v);
  return {
    rate,
    durationS,
    sent: total,
    completed: ok.length,
    errors,
    incomplete: total - done,
    statuses,
    achievedSendRate: Math.round((total / sendSpanMs) * 1000),
    latencyMs: summarize(ok),
    sendLagMs: summarize(lag),
  };
}

/**
 * @param {{url: string, headers?: Record<string,string>, body: string, rate: number,
 *   durationS: number, warmupS?: number, connections?: number, drainTimeoutS?: number}} o
 */
export async function runOpenLoop(o) {
  const u = new URL(o.url);
  const pool = new Pool(u.origin, {
    connections: o.connections ?? 256,
    pipelining: 1,
    keepAliveTimeout: 60_000,
  });
  const opts = {
    path: u.pathname + u.search,
    headers: { 'content-type': 'application/json', ...(o.headers ?? {}) },
    body: o.body,
  };
  const drain = o.drainTimeoutS ?? 10;
  try {
    let warmup = null;
    if (o.warmupS) {
      const w = await phase(pool, opts, o.rate, o.warmupS, drain);
      warmup = { completed: w.completed, errors: w.errors, incomplete: w.incomplete };
    }
    const result = await phase(pool, opts, o.rate, o.durationS, drain);
    return { ...result, warmup, connections: o.connections ?? 256 };
  } finally {
    await pool.destroy();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const result = await runOpenLoop(JSON.parse(process.argv[2] ?? '{}'));
  process.stdout.write(JSON.stringify(result) + '\n');
}
