/**
 * The upstream client's own body reader (src/inference/upstream.ts) against a real
 * local HTTP server: whole and chunked reads, backpressure, and every way a request
 * ends early (the caller's abort before and after the headers, an abandoned
 * iteration, a refused connection, a worker that dies mid-body, an abort while
 * queued for a connection).
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { UpstreamClient } from '../../src/inference/upstream.js';

type Handler = (req: IncomingMessage, res: ServerResponse) => void;

describe('UpstreamClient', () => {
  let server: http.Server;
  let base: string;
  let handler: Handler = (_req, res) => res.end();
  const client = new UpstreamClient({ connections: 4 });

  before(async () => {
    server = http.createServer((req, res) => {
      req.resume();
      handler(req, res);
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  });
  after(async () => {
    await client.close();
    server.closeAllConnections();
    server.close();
  });

  const post = (signal = new AbortController().signal) =>
    client.post(base, '/chat/completions', '{"a":1}', signal);

  it('reads a body sent in many chunks whole, UTF-8 split across chunks intact', async () => {
    let seen: { path?: string; body: string; type?: string } = { body: '' };
    handler = (req, res) => {
      seen.path = req.url;
      seen.type = req.headers['content-type'];
      req.removeAllListeners('data');
      req.setEncoding('utf8');
      req.on('data', (d: string) => (seen.body += d));
      req.on('end', () => {
        res.writeHead(201, { 'x-worker': 'w1' });
        const bytes = Buffer.from('héllo → wörld', 'utf8');
        for (let i = 0; i < bytes.length; i++) res.write(bytes.subarray(i, i + 1));
        res.end();
      });
    };
    seen = { body: '' };
    const res = await post();
    assert.equal(res.statusCode, 201);
    assert.equal(res.headers['x-worker'], 'w1');
    assert.equal(await res.body.text(), 'héllo → wörld');
    assert.equal(seen.path, '/v1/chat/completions');
    assert.equal(seen.type, 'application/json');
    assert.equal(seen.body, '{"a":1}');
  });

  it('iterates chunks in order and holds the worker back while the reader stalls', async () => {
    const total = 32 * 1024 * 1024;
    let sent = 0;
    handler = (_req, res) => {
      res.writeHead(200);
      const pump = () => {
        while (sent < total) {
          const chunk = Buffer.alloc(64 * 1024);
          for (let i = 0; i < chunk.length; i++) chunk[i] = (sent + i) % 251;
          sent += chunk.length;
          if (!res.write(chunk)) {
            res.once('drain', pump);
            return;
          }
        }
        res.end();
      };
      pump();
    };
    const res = await post();
    let got = 0;
    let stalled = false;
    for await (const c of res.body) {
      for (const b of c) {
        if (b !== got % 251) assert.fail(`byte ${got} is ${b}`);
        got++;
      }
      if (!stalled) {
        stalled = true;
        await new Promise((r) => setTimeout(r, 300));
        // Without backpressure the whole 32 MiB would be buffered by now; with it the
        // worker waits once the socket buffers and the client's 64 KiB are full.
        assert.ok(sent < total / 2, `the worker sent ${sent} bytes to a stalled reader`);
      }
    }
    assert.equal(got, total);
  });

  it('rejects with an AbortError when the caller aborts before the headers', async () => {
    let closed: Promise<unknown> = Promise.resolve();
    handler = (req) => {
      closed = once(req.socket, 'close');
    };
    const ac = new AbortController();
    const p = post(ac.signal);
    await new Promise((r) => setTimeout(r, 50));
    ac.abort();
    await assert.rejects(p, (e: Error) => e.name === 'AbortError');
    await closed; // the connection to the worker is torn down
  });

  it('fails the body read when the caller aborts mid-body, and drops the connection', async () => {
    let closed: Promise<unknown> = Promise.resolve();
    handler = (req, res) => {
      closed = once(req.socket, 'close');
      res.writeHead(200);
      res.write('partial');
    };
    const ac = new AbortController();
    const res = await post(ac.signal);
    const text = res.body.text();
    setTimeout(() => ac.abort(), 20);
    await assert.rejects(text, (e: Error) => e.name === 'AbortError');
    await closed;
  });

  it('aborts the request when the reader leaves the iteration early', async () => {
    let closed: Promise<unknown> = Promise.resolve();
    handler = (req, res) => {
      closed = once(req.socket, 'close');
      res.writeHead(200);
      res.write('data: 1\n\n');
      // never ends
    };
    const res = await post();
    for await (const c of res.body) {
      assert.equal(c.toString(), 'data: 1\n\n');
      break;
    }
    await closed;
  });

  it('rejects when the worker refuses the connection', async () => {
    const dead = http.createServer();
    dead.listen(0, '127.0.0.1');
    await once(dead, 'listening');
    const port = (dead.address() as AddressInfo).port;
    dead.close();
    await once(dead, 'close');
    await assert.rejects(
      client.post(`http://127.0.0.1:${port}/v1`, '/x', '{}', new AbortController().signal),
      (e: Error & { code?: string }) => e.code === 'ECONNREFUSED',
    );
  });

  it('fails the iteration when the worker dies mid-body', async () => {
    handler = (_req, res) => {
      res.writeHead(200, { 'content-length': '1000' });
      res.write('data: x\n\n');
      setTimeout(() => res.socket?.destroy(), 20);
    };
    const res = await post();
    const chunks: string[] = [];
    await assert.rejects(async () => {
      for await (const c of res.body) chunks.push(c.toString());
    });
    assert.deepEqual(chunks, ['data: x\n\n']);
  });

  it('rejects at once when aborted while queued for a connection', async () => {
    const one = new UpstreamClient({ connections: 1 });
    const pending: ServerResponse[] = [];
    handler = (_req, res) => {
      pending.push(res);
    };
    try {
      const first = one.post(base, '/a', '{}', new AbortController().signal);
      await new Promise((r) => setTimeout(r, 30));
      const ac = new AbortController();
      const queued = one.post(base, '/b', '{}', ac.signal);
      ac.abort();
      await assert.rejects(queued, (e: Error) => e.name === 'AbortError');
      for (const r of pending) r.end('ok');
      assert.equal(await (await first).body.text(), 'ok');
    } finally {
      await one.close();
    }
  });

  it('rejects a request whose signal is already aborted without sending it', async () => {
    let hits = 0;
    handler = (_req, res) => {
      hits++;
      res.end();
    };
    const ac = new AbortController();
    ac.abort();
    await assert.rejects(post(ac.signal), (e: Error) => e.name === 'AbortError');
    assert.equal(hits, 0);
  });
});
