/**
 * Streaming time to first byte: sequential `stream: true` requests over one
 * keep-alive connection. For each request: time until the response headers,
 * until the first body byte (the first SSE event), and until the stream ends.
 * The stream is checked to end with `data: [DONE]`.
 *
 * CLI: node bench/lib/ttfb.mjs '<json options>'  (prints a JSON result)
 */
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { Client } from 'undici';
import { summarize } from './stats.mjs';

/**
 * `warmup` requests first, unmeasured, but for at most `warmupMaxS` seconds: the
 * router's SSE path needs a few thousand sequential streams before V8's optimising
 * compiler is done with it, which a slow peer would take minutes to serve.
 * @param {{url: string, headers?: Record<string,string>, body: string, requests: number,
 *   warmup?: number, warmupMaxS?: number}} o
 */
export async function runTtfb(o) {
  const u = new URL(o.url);
  const client = new Client(u.origin, { keepAliveTimeout: 60_000 });
  const req = {
    method: 'POST',
    path: u.pathname + u.search,
    headers: { 'content-type': 'application/json', ...(o.headers ?? {}) },
    body: o.body,
  };
  const headers = [];
  const firstByte = [];
  const total = [];
  let errors = 0;
  let warmup = o.warmup ?? 0;
  const warmupEnd = performance.now() + (o.warmupMaxS ?? Infinity) * 1000;
  try {
    for (let i = 0; i < warmup + o.requests; i++) {
      // Warm-up time is up: what is left of it is not sent.
      if (i < warmup && performance.now() > warmupEnd) warmup = i;
      const t = performance.now();
      let tFirst = null;
      let tail = '';
      try {
        const res = await client.request(req);
        const tHeaders = performance.now();
        for await (const chunk of res.body) {
          if (tFirst === null) tFirst = performance.now();
          tail = (tail + chunk.toString('utf8')).slice(-64);
        }
        const tEnd = performance.now();
        if (res.statusCode !== 200 || !tail.includes('data: [DONE]')) {
          errors++;
          continue;
        }
        if (i < warmup) continue;
        headers.push(tHeaders - t);
        firstByte.push(tFirst - t);
        total.push(tEnd - t);
      } catch {
        errors++;
      }
    }
  } finally {
    await client.close();
  }
  return {
    requests: o.requests,
    warmup,
    errors,
    headersMs: summarize(headers),
    firstByteMs: summarize(firstByte),
    totalMs: summarize(total),
  };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const result = await runTtfb(JSON.parse(process.argv[2] ?? '{}'));
  process.stdout.write(JSON.stringify(result) + '\n');
}
