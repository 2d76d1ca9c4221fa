/**
 * Requests Node's HTTP parser refuses before any route runs (a malformed header
 * line, headers over the limit, bytes past the Content-Length) are answered in the
 * spec's error envelope with an X-Request-ID, like every other error, not in
 * Fastify's own `{error, message, statusCode}` shape.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { startTestServer, type TestServer } from '../support/harness.js';

/** The raw answer to `raw`, read until the server closes the connection. */
async function rawExchange(url: string, raw: string): Promise<string> {
  const u = new URL(url);
  const socket = net.connect(Number(u.port), u.hostname);
  let out = '';
  socket.setEncoding('utf8');
  socket.on('data', (d: string) => (out += d));
  socket.on('error', () => undefined);
  await once(socket, 'connect');
  socket.write(raw);
  await once(socket, 'close');
  return out;
}

function parse(answer: string): { status: number; headers: string; body: Record<string, unknown> } {
  const [head = '', ...rest] = answer.split('\r\n\r\n');
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1]);
  return {
    status,
    headers: head,
    body: JSON.parse(rest.join('\r\n\r\n')) as Record<string, unknown>,
  };
}

describe('requests the HTTP parser refuses', () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer();
  });
  after(() => s.close());

  it('answer in the error envelope with an X-Request-ID', async () => {
    const cases: Array<[string, number, string]> = [
      ['GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n', 400, 'malformed_request'],
      [
        `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`,
        431,
        'headers_too_large',
      ],
    ];
    for (const [raw, status, code] of cases) {
      const r = parse(await rawExchange(s.url, raw));
      assert.equal(r.status, status, code);
      assert.match(r.headers, /\r\nX-Request-ID: req_[0-9a-f]{32}\r\n/i);
      assert.match(r.headers, /\r\nContent-Type: application\/json/i);
      const e = r.body.error as Record<string, unknown>;
      assert.equal(e.code, code);
      assert.equal(e.type, 'invalid_request_error');
      assert.equal(e.param, null);
      assert.equal(typeof e.message, 'string');
    }
  });
});
