/**
 * What Node's HTTP server would answer by itself, answered by the router: an
 * `Expect: 100-continue` gets its `100 Continue` only once the project key verifies
 * (a refused client is told so before it sends its body), any other expectation a
 * 417 in the envelope, an HTTP/1.1 request without `Host` a 400 in the envelope, and
 * two `Authorization` headers are no credential at all (401), not the first of them.
 */
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { startSimWorker, type SimWorker } from '../../src/workers/sim/index.js';
import { http, seedProject, startTestServer, type TestServer } from '../support/harness.js';

describe('Expect, Host and repeated Authorization', () => {
  let s: TestServer;
  let w: SimWorker;
  let p: Awaited<ReturnType<typeof seedProject>>;
  before(async () => {
    s = await startTestServer();
    w = await startSimWorker({ model: 'test-model' });
    p = await seedProject(s, { slug: 'expect' });
    const r = await s.admin('POST', '/workers', { model: 'test-model', tier: 'cpu', url: w.url });
    assert.equal(r.status, 201, r.text);
  });
  after(async () => {
    await s.close();
    await w.close();
  });

  /** A raw connection: what it has received so far, and a wait for a pattern in it. */
  const connect = () => {
    const u = new URL(s.url);
    const socket = net.connect(Number(u.port), u.hostname);
    let out = '';
    socket.setEncoding('utf8');
    socket.on('error', () => undefined);
    socket.on('data', (d: string) => (out += d));
    const until = (re: RegExp, ms = 10_000) =>
      new Promise<string>((resolve, reject) => {
        const started = Date.now();
        const poll = () => {
          if (re.test(out)) resolve(out);
          else if (Date.now() - started > ms) reject(new Error(`no ${re} in ${ms} ms: ${out}`));
          else setTimeout(poll, 5);
        };
        poll();
      });
    return { socket, until, received: () => out };
  };

  const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
  const chatHead = (auth: string) =>
    `POST /${p.projectId}/main/v1/chat/completions HTTP/1.1\r\nHost: x\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
    `Expect: 100-continue\r\n${auth}\r\n`;

  it('100 Continue once the key verifies; a bad or missing key gets its 401 and no 100', async () => {
    const good = connect();
    good.socket.write(chatHead(`Authorization: Bearer ${p.key}\r\n`));
    await good.until(/^HTTP\/1\.1 100 Continue\r\n\r\n/);
    good.socket.write(body);
    const ok = await good.until(/"chat\.completion"/);
    assert.match(ok, /\r\n\r\nHTTP\/1\.1 200 OK\r\n/);
    good.socket.destroy();

    for (const auth of [`Authorization: Bearer ${p.key.slice(0, -2)}xx\r\n`, '']) {
      const bad = connect();
      bad.socket.write(chatHead(auth));
      const answer = await bad.until(/"invalid_api_key"|"missing_api_key"/);
      assert.match(answer, /^HTTP\/1\.1 401 Unauthorized\r\n/, 'no 100 Continue before the 401');
      assert.doesNotMatch(answer, /100 Continue/);
      bad.socket.destroy();
    }

    // Off the project surfaces the key is not the credential: 100 at once, as Node does.
    const health = connect();
    health.socket.write(
      'POST /admin/v1/projects HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
        'Content-Length: 2\r\nExpect: 100-continue\r\n\r\n',
    );
    await health.until(/^HTTP\/1\.1 100 Continue\r\n\r\n/);
    health.socket.destroy();
  });

  it('an expectation other than 100-continue is 417 expectation_failed in the envelope', async () => {
    const c = connect();
    c.socket.write(`GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n`);
    const answer = await c.until(/\}\}$/);
    assert.match(answer, /^HTTP\/1\.1 417 Expectation Failed\r\n/);
    assert.match(answer, /\r\nx-request-id: req_[0-9a-f]{32}\r\n/i);
    const envelope = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)) as {
      error: Record<string, unknown>;
    };
    assert.equal(envelope.error.code, 'expectation_failed');
    assert.equal(envelope.error.type, 'invalid_request_error');
    assert.match(String(envelope.error.message), /teapot/);
    c.socket.destroy();
  });

  it('HTTP/1.1 without Host is 400 malformed_request in the envelope; HTTP/1.0 needs none', async () => {
    const c = connect();
    c.socket.write('GET /healthz HTTP/1.1\r\n\r\n');
    const answer = await c.until(/\}\}$/);
    assert.match(answer, /^HTTP\/1\.1 400 Bad Request\r\n/);
    assert.match(answer, /\r\nx-request-id: req_[0-9a-f]{32}\r\n/i);
    assert.match(answer, /"code":"malformed_request"/);
    assert.match(answer, /Host header/);
    c.socket.destroy();

    const old = connect();
    old.socket.write('GET /healthz HTTP/1.0\r\n\r\n');
    assert.match(await old.until(/"status":"ok"/), /^HTTP\/1\.1 200 OK\r\n/);
    old.socket.destroy();
  });

  it('two Authorization headers are refused 401, whichever of them is valid', async () => {
    const good = `Bearer ${p.key}`;
    const other = `Bearer ${p.key.slice(0, -2)}xx`;
    const url = `${s.url}/${p.projectId}/v1/models`;
    assert.equal((await http('GET', url, { auth: good })).status, 200);
    for (const pair of [
      [good, other],
      [other, good],
      [good, good],
    ]) {
      const c = connect();
      c.socket.write(
        `GET /${p.projectId}/v1/models HTTP/1.1\r\nHost: x\r\n` +
          `Authorization: ${pair[0]}\r\nAuthorization: ${pair[1]}\r\n\r\n`,
      );
      const answer = await c.until(/\}\}$|\]\}$/);
      assert.match(answer, /^HTTP\/1\.1 401 Unauthorized\r\n/, answer);
      assert.match(answer, /"code":"invalid_api_key"/);
      c.socket.destroy();
    }
  });
});
