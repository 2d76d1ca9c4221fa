/**
 * Shutdown drain as a client on a kept-alive connection sees it: a request in
 * flight when close() starts completes normally; a request that arrives on the
 * same connection afterwards gets 503 `unavailable` in the spec's error
 * envelope, with X-Request-ID and `Connection: close`.
 */
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { ADMIN_TOKEN, seedProject, startTestServer, type TestServer } from '../support/harness.js';

interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** Splits HTTP/1.1 responses with Content-Length bodies out of a byte stream. */
function parseResponses(raw: string): RawResponse[] {
  const out: RawResponse[] = [];
  let rest = raw;
  while (rest.length > 0) {
    const end = rest.indexOf('\r\n\r\n');
    if (end < 0) break;
    const [statusLine, ...lines] = rest.slice(0, end).split('\r\n');
    const headers: Record<string, string> = {};
    for (const l of lines) {
      const i = l.indexOf(':');
      headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
    }
    const length = Number(headers['content-length'] ?? 0);
    const body = rest.slice(end + 4, end + 4 + length);
    out.push({ status: Number(statusLine!.split(' ')[1]), headers, body });
    rest = rest.slice(end + 4 + length);
  }
  return out;
}

function readAll(sock: Socket): Promise<string> {
  return new Promise((resolve, reject) => {
    let data = '';
    sock.setEncoding('utf8');
    sock.on('data', (c: string) => (data += c));
    sock.on('end', () => resolve(data));
    sock.on('error', reject);
  });
}

/**
 * A slow upload on a kept-alive connection: its headers and part of its body, the
 * rest (and a second request) once close() has begun. Returns both responses.
 */
async function drainScenario(
  s: TestServer,
  req: { upload: string; body: object; late: string; auth: string; headers?: string },
): Promise<[RawResponse, RawResponse]> {
  const extraHeaders = req.headers ?? '';
  const port = Number(new URL(s.url).port);
  const sock = connect(port, '127.0.0.1');
  await new Promise<void>((resolve) => sock.once('connect', resolve));
  const responses = readAll(sock);
  const seen = new Promise<void>((resolve) => s.app.server.once('request', () => resolve()));
  const body = JSON.stringify(req.body);
  sock.write(
    `POST ${req.upload} HTTP/1.1\r\nHost: localhost\r\n` +
      `Authorization: Bearer ${req.auth}\r\nContent-Type: application/json\r\n${extraHeaders}` +
      `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: keep-alive\r\n\r\n` +
      body.slice(0, 5),
  );
  await seen;
  const closed = s.app.close();
  // The listener stops once close() has started (after the preClose hooks).
  for (let i = 0; i < 200 && s.app.server.listening; i++) {
    await new Promise((r) => setTimeout(r, 5));
  }
  assert.equal(s.app.server.listening, false);
  sock.write(
    body.slice(5) +
      `GET ${req.late} HTTP/1.1\r\nHost: localhost\r\n${extraHeaders}` +
      `Authorization: Bearer ${req.auth}\r\nConnection: keep-alive\r\n\r\n`,
  );
  const [inFlight, late, ...more] = parseResponses(await responses);
  await closed;
  assert.equal(more.length, 0);
  return [inFlight!, late!];
}

describe('shutdown drain', () => {
  let s: TestServer;
  let p: Awaited<ReturnType<typeof seedProject>>;
  before(async () => {
    s = await startTestServer();
    p = await seedProject(s, { slug: 'drain', scopes: ['management', 'inference'] });
  });
  after(() => s.close());

  it('requests on a kept-alive connection during the drain get the 503 envelope', async () => {
    const [inFlight, late] = await drainScenario(s, {
      upload: `/${p.projectId}/v1/keys`,
      body: { name: 'during-drain' },
      late: `/${p.projectId}/v1/models`,
      auth: p.key,
    });
    assert.equal(inFlight.status, 201, inFlight.body);
    assert.equal(JSON.parse(inFlight.body).name, 'during-drain');

    assert.equal(late.status, 503, late.body);
    assert.match(late.headers['x-request-id'] ?? '', /^req_[0-9a-f]{32}$/);
    assert.notEqual(late.headers['x-request-id'], inFlight.headers['x-request-id']);
    assert.equal(late.headers.connection, 'close');
    assert.match(late.headers['content-type'] ?? '', /^application\/json/);
    const envelope = JSON.parse(late.body) as { error: Record<string, unknown> };
    assert.deepEqual(Object.keys(envelope), ['error']);
    assert.deepEqual(Object.keys(envelope.error).sort(), ['code', 'message', 'param', 'type']);
    assert.equal(envelope.error.code, 'unavailable');
    assert.equal(envelope.error.type, 'server_error');
    assert.equal(envelope.error.param, null);
    assert.equal(typeof envelope.error.message, 'string');
  });
});

describe('shutdown drain in production', () => {
  let s: TestServer;
  before(async () => {
    // HTTPS as a trusted TLS proxy reports it: production refuses plain HTTP.
    s = await startTestServer({
      env: { SWITCHYARD_ENV: 'production', SWITCHYARD_TRUSTED_PROXIES: '127.0.0.1/32' },
    });
  });
  after(() => s.close());

  it("the drain's 503 carries Strict-Transport-Security like every production response", async () => {
    const [inFlight, late] = await drainScenario(s, {
      upload: '/admin/v1/projects',
      body: { slug: 'during-drain', name: 'during-drain' },
      late: '/admin/v1/projects',
      auth: ADMIN_TOKEN,
      headers: 'X-Forwarded-Proto: https\r\n',
    });
    assert.equal(inFlight.status, 201, inFlight.body);
    assert.match(inFlight.headers['strict-transport-security'] ?? '', /max-age=\d+/);
    assert.equal(late.status, 503, late.body);
    assert.match(late.headers['strict-transport-security'] ?? '', /max-age=\d+/);
  });
});
