/**
 * The floor of `npm run bench`: the least any Node.js gateway does, a
 * pass-through proxy with no auth, limits, validation, routing or usage: read
 * the request body, POST it to the worker over a keep-alive undici pool, and
 * stream the answer back unchanged. Pinned to the router's CPU, it measures what
 * the extra HTTP hop costs on this machine (two loopback connections, Node's HTTP
 * parser and writer, the kernel), so the router's own share of the added latency
 * is the difference between the two, whatever the machine's speed that day.
 *
 * CLI: node bench/lib/floor-proxy.mjs <worker base URL, …/v1>
 * FLOOR_SPIN_US=N adds a busy loop of N µs to every request (bench/floor-spin.mjs).
 * Prints `floor proxy listening on http://127.0.0.1:<port>`.
 */
import { Buffer } from 'node:buffer';
import { createServer } from 'node:http';
import { performance } from 'node:perf_hooks';
import { Pool } from 'undici';

const upstream = new URL(process.argv[2] ?? '');
const base = upstream.pathname.replace(/\/$/, '');
const pool = new Pool(upstream.origin, { connections: 256, keepAliveTimeout: 60_000 });

const SPIN_MS = Number(process.env.FLOOR_SPIN_US ?? 0) / 1000;
const server = createServer(async (req, res) => {
  try {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    // bench/floor-spin.mjs: extra CPU per request, as a busy loop, and nothing else.
    if (SPIN_MS > 0) {
      const end = performance.now() + SPIN_MS;
      while (performance.now() < end);
    }
    // `/v1/chat/completions` here → `<base>/chat/completions` on the worker.
    const path = base + (req.url ?? '/').replace(/^\/v1/, '');
    const up = await pool.request({
      method: req.method ?? 'POST',
      path,
      headers: { 'content-type': req.headers['content-type'] ?? 'application/json' },
      body: Buffer.concat(chunks),
    });
    const headers = {};
    const type = up.headers['content-type'];
    if (type) headers['content-type'] = type;
    res.writeHead(up.statusCode, headers);
    for await (const c of up.body) res.write(c);
    res.end();
  } catch {
    if (!res.headersSent) res.writeHead(502);
    res.end();
  }
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  process.stdout.write(`floor proxy listening on http://127.0.0.1:${port}\n`);
});
process.on('SIGTERM', () => {
  server.close();
  pool.close().finally(() => process.exit(0));
});
