// Tests of the benchmark's pure helpers: node --test bench/
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fetch } from 'undici';
import { summarizeProfile } from './profile.mjs';
import { diff, percentile, summarize } from './stats.mjs';
import { parseWrk } from './wrk.mjs';
import { accessSync, constants, readFileSync } from 'node:fs';
import { BIN, binNodeFlags } from './services.mjs';

test('percentile is nearest-rank over the sorted samples', () => {
  const s = Float64Array.from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  assert.equal(percentile(s, 50), 5);
  assert.equal(percentile(s, 90), 9);
  assert.equal(percentile(s, 99), 10);
  assert.equal(percentile(s, 0), 1);
  assert.equal(percentile(new Float64Array(0), 50), null);
});

test('summarize reports max and mean of every sample', () => {
  const r = summarize([3, 1, 2]);
  assert.deepEqual([r.count, r.p50, r.max, r.mean], [3, 2, 3, 2]);
  assert.equal(diff(1.5, 0.25), 1.25);
  assert.equal(diff(null, 1), null);
});

test('parseWrk reads rate, errors and latency percentiles in any unit', () => {
  const out = `Running 10s test @ http://127.0.0.1:1/v1/chat/completions
  1 threads and 64 connections
  Latency Distribution
     50%  650.00us
     75%    1.20ms
     90%    2.50ms
     99%    1.01s
  61420 requests in 10.07s, 48.62MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 7
Requests/sec:   6099.53
Transfer/sec:      9.59MB
`;
  const r = parseWrk(out);
  assert.equal(r.requestsPerSec, 6100);
  assert.equal(r.requests, 61420);
  assert.equal(r.non2xx, 7);
  assert.equal(r.socketErrors, 5);
  assert.deepEqual(r.latencyMs, { p50: 0.65, p75: 1.2, p90: 2.5, p99: 1010 });
});

test('summarizeProfile splits self time by function and charges wasm to its caller', () => {
  const url = 'file:///x/node_modules/pkg/index.js';
  const profile = {
    nodes: [
      { id: 1, callFrame: { functionName: '(root)', url: '', lineNumber: -1 }, children: [2, 4] },
      { id: 2, callFrame: { functionName: 'query', url, lineNumber: 9 }, children: [3] },
      {
        id: 3,
        callFrame: { functionName: 'wasm-function[1]', url: 'wasm://wasm/ab', lineNumber: 0 },
      },
      { id: 4, callFrame: { functionName: '(idle)', url: '', lineNumber: -1 } },
    ],
    startTime: 0,
    endTime: 400,
    samples: [3, 3, 2, 4],
    timeDeltas: [0, 100, 100, 100],
  };
  const s = summarizeProfile(profile);
  assert.equal(s.selfByArea[0].name, 'npm:pkg (native/wasm)');
  assert.equal(s.totalByFunction[0].name, 'query  pkg/index.js:10');
  assert.equal(s.totalByFunction[0].pctOfBusy, 100);
});

test('the floor proxy passes bodies and streams through unchanged', async (t) => {
  const { createServer } = await import('node:http');
  const { spawn } = await import('node:child_process');
  const { fileURLToPath } = await import('node:url');
  const seen = [];
  const upstream = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({ url: req.url, body });
      if (JSON.parse(body).stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: {"a":1}\n\n');
        setTimeout(() => res.end('data: [DONE]\n\n'), 10);
      } else {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"ok":true}');
      }
    });
  });
  await new Promise((r) => upstream.listen(0, '127.0.0.1', r));
  t.after(() => upstream.close());
  const proxy = spawn(process.execPath, [
    fileURLToPath(new URL('./floor-proxy.mjs', import.meta.url)),
    `http://127.0.0.1:${upstream.address().port}/v1`,
  ]);
  t.after(() => proxy.kill());
  const base = await new Promise((resolve, reject) => {
    proxy.once('exit', (code) => reject(new Error(`floor proxy exited (${code})`)));
    proxy.stdout.on('data', (d) => {
      const m = /listening on (\S+)/.exec(String(d));
      if (m) resolve(m[1]);
    });
  });
  const post = (body) =>
    fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
  const plain = await post({ stream: false });
  assert.equal(plain.status, 200);
  assert.deepEqual(await plain.json(), { ok: true });
  const streamed = await post({ stream: true });
  assert.equal(streamed.headers.get('content-type'), 'text/event-stream');
  assert.equal(await streamed.text(), 'data: {"a":1}\n\ndata: [DONE]\n\n');
  assert.deepEqual(
    seen.map((s) => s.url),
    ['/v1/chat/completions', '/v1/chat/completions'],
  );
  assert.equal(seen[1].body, '{"stream":true}');
});

test("the router runs with the flags on the binary's first line, under npm start and in the bench", () => {
  const flags = binNodeFlags();
  assert.ok(flags.includes('--max-semi-space-size=4'), flags.join(' '));
  assert.ok(flags.includes('--single-threaded-gc'), flags.join(' '));
  assert.ok(flags.includes('--v8-pool-size=1'), flags.join(' '));
  // npm start runs the file itself, so its shebang (and flags) apply.
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8'));
  assert.match(pkg.scripts.start, /\.\/bin\/switchyard\.js serve$/);
  accessSync(BIN, constants.X_OK);
});
