/**
 * `node bench/streams.mjs [--streams=5000] [--storage=pglite|postgres]`: many
 * concurrent open SSE streams on ONE router instance, and what each costs.
 *
 *   CPU 0: the router (`switchyard serve`).
 *   CPU 1: a sim worker emitting one token every `--tpot-ms` (default 1000, so
 *          every stream stays open for the whole hold) and the client.
 *
 * The client opens `--streams` streaming chat completions through the router
 * (one HTTP/1.1 connection each, ramped at `--ramp` per second), waits until
 * every one has received its first chunk, samples the router's RSS and heap
 * with all of them open, then lets them finish and checks each ended with
 * `data: [DONE]` and no error event. Memory per stream = (RSS with all open -
 * RSS before) / streams. Prints a markdown table and writes
 * bench/results/streams-<timestamp>.json.
 */
import { Buffer } from 'node:buffer';
import { mkdirSync, writeFileSync } from 'node:fs';
import { Agent, request } from 'node:http';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { installCleanup, memoryOf, stopAll } from './lib/procs.mjs';
import { startStack } from './lib/services.mjs';
import { MODEL } from './lib/setup.mjs';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

const { values: opts } = parseArgs({
  options: {
    streams: { type: 'string', default: '5000' },
    ramp: { type: 'string', default: '1000' },
    'tpot-ms': { type: 'string', default: '1000' },
    tokens: { type: 'string', default: '20' },
    storage: { type: 'string', default: 'pglite' },
  },
  strict: true,
});
const N = Number(opts.streams);
const RAMP = Number(opts.ramp);
const TPOT = Number(opts['tpot-ms']);
const TOKENS = Number(opts.tokens);

const log = (m) => process.stderr.write(`streams: ${m}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function metricsOf(url) {
  return new Promise((resolve, reject) => {
    request(`${url}/metrics`, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve(body));
    })
      .on('error', reject)
      .end();
  });
}

async function main() {
  installCleanup();
  const stack = await startStack({
    name: 'streams',
    storage: opts.storage,
    simArgs: [
      '--ttft-ms',
      '0',
      '--tpot-ms',
      String(TPOT),
      // Every stream decodes at once (the default sim batch is 256 sequences).
      '--max-running',
      String(N + 100),
      '--kv-cache-tokens',
      String((N + 100) * 256),
    ],
    // One worker carries every stream: let it have them all in flight.
    routerEnv: { SWITCHYARD_WORKER_MAX_INFLIGHT: String(N + 100) },
  });
  try {
    const { router, reg } = stack;
    const routerUrl = router.url;
    const url = new URL(stack.url);
    const body = JSON.stringify({
      model: MODEL,
      messages: [{ role: 'user', content: 'Stream for a while.' }],
      max_tokens: TOKENS,
      stream: true,
    });
    await sleep(1000);
    const idle = memoryOf(router.pid);
    log(`router idle RSS ${idle.rssMiB} MiB; opening ${N} streams at ${RAMP}/s`);

    const agent = new Agent({ keepAlive: false, maxSockets: Infinity });
    let firstChunk = 0;
    let done = 0;
    let errors = 0;
    let errorSample = null;
    const finished = [];
    const t0 = Date.now();
    for (let i = 0; i < N; i++) {
      const due = t0 + (i * 1000) / RAMP;
      if (due > Date.now()) await sleep(due - Date.now());
      finished.push(
        new Promise((resolve) => {
          let got = false;
          let text = '';
          const req = request(
            url,
            {
              method: 'POST',
              agent,
              headers: {
                'content-type': 'application/json',
                authorization: `Bearer ${reg.key}`,
                'content-length': Buffer.byteLength(body),
              },
            },
            (res) => {
              res.setEncoding('utf8');
              res.on('data', (d) => {
                if (!got) {
                  got = true;
                  firstChunk++;
                }
                text += d;
              });
              res.on('end', () => {
                const ok =
                  res.statusCode === 200 &&
                  text.trimEnd().endsWith('data: [DONE]') &&
                  !text.includes('event: error');
                if (ok) done++;
                else {
                  errors++;
                  errorSample ??= `HTTP ${res.statusCode} ${text.slice(-300)}`;
                }
                resolve();
              });
            },
          );
          req.on('error', (e) => {
            errors++;
            errorSample ??= e.message;
            resolve();
          });
          req.end(body);
        }),
      );
    }
    const openedS = (Date.now() - t0) / 1000;
    const deadline = Date.now() + 60_000;
    while (firstChunk + errors < N && Date.now() < deadline) await sleep(100);
    const open = memoryOf(router.pid);
    const m = await metricsOf(routerUrl);
    const heap = /switchyard_nodejs_heap_size_used_bytes (\S+)/.exec(m)?.[1];
    log(
      `all ${firstChunk} streams open after ${openedS.toFixed(1)} s ramp; router RSS ${open.rssMiB} MiB`,
    );
    await Promise.all(finished);
    const after = memoryOf(router.pid);
    const result = {
      timestamp: new Date().toISOString(),
      streams: N,
      rampPerS: RAMP,
      tpotMs: TPOT,
      tokensPerStream: TOKENS,
      storage: opts.storage,
      openAtOnce: firstChunk,
      completed: done,
      errors,
      errorSample,
      routerRssMiB: {
        idle: idle.rssMiB,
        allOpen: open.rssMiB,
        afterAll: after.rssMiB,
        peak: after.peakRssMiB,
      },
      heapUsedMiB: heap ? Math.round((Number(heap) / 1048576) * 10) / 10 : null,
      kibPerStream: Math.round(((open.rssMiB - idle.rssMiB) * 1024) / N),
      loadAverage: os.loadavg().map((v) => Math.round(v * 100) / 100),
    };
    mkdirSync(join(ROOT, 'bench', 'results'), { recursive: true });
    const file = join(
      ROOT,
      'bench',
      'results',
      `streams-${result.timestamp.replace(/[:.]/g, '-')}.json`,
    );
    writeFileSync(file, JSON.stringify(result, null, 2) + '\n');
    process.stdout.write(
      [
        `| Streams | Open at once | Completed | Errors | Router RSS idle → all open → after (MiB) | Per stream |`,
        `| ---: | ---: | ---: | ---: | --- | ---: |`,
        `| ${N} | ${firstChunk} | ${done} | ${errors} | ${idle.rssMiB} → ${open.rssMiB} → ${after.rssMiB} | ${result.kibPerStream} KiB |`,
      ].join('\n') + '\n',
    );
    log(`results written to ${file}`);
    if (errors > 0) process.exitCode = 1;
  } finally {
    await stack.close();
  }
}

main().catch(async (err) => {
  process.stderr.write(`streams: ${err instanceof Error ? err.message : String(err)}\n`);
  await stopAll();
  process.exitCode = 1;
});
