/**
 * The open-loop client of bench/tail.mjs: request i is due at t0 + i/rate (as in
 * open-loop.mjs) and carries `seed: <first> + i`; for each it records, on the
 * monotonic clock, when it was due, when it was handed to the socket pool and when
 * its answer had been read whole.
 *
 * CLI: node bench/lib/stamp-client.mjs '{"url","headers","rate","seconds","first","warmup"}'
 * Prints one JSON line: {rows: [[seed, dueNs, sentNs, doneNs, status], …]}.
 */
import { Pool } from 'undici';

const o = JSON.parse(process.argv[2]);
const u = new URL(o.url);
const pool = new Pool(u.origin, { connections: 256, keepAliveTimeout: 60_000 });
const now = () => process.hrtime.bigint();
// The first `warmup` seconds open the pool's connections and are not recorded.
const warm = Math.round(o.rate * (o.warmup ?? 2));
const total = warm + Math.round(o.rate * o.seconds);
const rows = new Array(total - warm);
const t0 = now() + 20_000_000n;
const stepNs = 1e9 / o.rate;
let done = 0;
let next = 0;

await new Promise((resolve) => {
  const tick = () => {
    const t = now();
    while (next < total && t0 + BigInt(Math.round(next * stepNs)) <= t) {
      const i = next++;
      const due = t0 + BigInt(Math.round(i * stepNs));
      const body = JSON.stringify({
        model: 'bench-sim',
        messages: [{ role: 'user', content: 'Say hello in one short sentence.' }],
        max_tokens: 16,
        seed: i < warm ? -1 : o.first + i - warm,
      });
      const sent = now();
      pool
        .request({
          method: 'POST',
          path: u.pathname,
          headers: {
            'content-type': 'application/json',
            'x-seed': String(i < warm ? -1 : o.first + i - warm),
            ...(o.headers ?? {}),
          },
          body,
        })
        .then(async (res) => {
          await res.body.text();
          if (i >= warm) {
            rows[i - warm] = [
              o.first + i - warm,
              String(due),
              String(sent),
              String(now()),
              res.statusCode,
            ];
          }
        })
        .catch(() => {
          if (i >= warm)
            rows[i - warm] = [o.first + i - warm, String(due), String(sent), String(now()), 0];
        })
        .finally(() => {
          if (++done === total) resolve();
        });
    }
    if (next < total) {
      const wait = Number(t0 + BigInt(Math.round(next * stepNs)) - now()) / 1e6;
      setTimeout(tick, Math.max(0, Math.floor(wait)));
    }
  };
  tick();
});
await pool.close();
process.stdout.write(JSON.stringify({ rows }) + '\n');
