/**
 * Production behaviour of `switchyard serve`, as operators run it: HTTPS from
 * configured files (reloaded on change), plain HTTP refused in production with
 * HSTS on responses, the body limit, roles, and the graceful drain on SIGTERM
 * (streams still open at the deadline end with the `cancelled` SSE error, and
 * their usage is recorded before exit).
 */
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { once } from 'node:events';
import net from 'node:net';
import { Readable } from 'node:stream';
import { after, describe, it } from 'node:test';
import { Agent, request } from 'undici';
import { openStore, tables } from '../../src/store/index.js';
import { http } from '../support/harness.js';
import { testCertificate } from '../support/https-receiver.js';
import { spawnSwitchyard, type Spawned } from '../support/process.js';

const TOKEN = 'prod-operator-token';

function tmp(): string {
  return mkdtempSync(join(tmpdir(), 'swy-prod-'));
}

async function start(
  env: Record<string, string>,
  args: string[] = [],
): Promise<{ p: Spawned; url: string }> {
  const p = spawnSwitchyard(['serve', ...args], {
    PORT: '0',
    LOG_LEVEL: 'warn',
    SWITCHYARD_DEMO: '0',
    SWITCHYARD_ADMIN_TOKEN: TOKEN,
    ...env,
  });
  const url = (await p.waitFor(/listening on (https?:\/\/127\.0\.0\.1:\d+)/))[1]!;
  return { p, url };
}

describe('HTTPS and production mode', () => {
  const procs: Spawned[] = [];
  const dirs: string[] = [];
  after(async () => {
    for (const p of procs) await p.stop('SIGKILL');
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  /** A second `serve` expected to refuse to start (quiet logs). */
  const serveThatFails = (env: Record<string, string>) => {
    const p = spawnSwitchyard(['serve'], {
      LOG_LEVEL: 'fatal',
      SWITCHYARD_DEMO: '0',
      SWITCHYARD_ADMIN_TOKEN: TOKEN,
      ...env,
    });
    procs.push(p);
    return p;
  };

  /** Its exit code; the 60 s bound only keeps a regression from hanging the suite. */
  const exitCode = async (p: Spawned): Promise<number | null | string> => {
    let bound: NodeJS.Timeout | undefined;
    const code = await Promise.race([
      once(p.child, 'exit').then(([c]) => c as number | null),
      new Promise<string>((r) => (bound = setTimeout(r, 60_000, 'still running'))),
    ]);
    clearTimeout(bound);
    return code;
  };

  it('a port already taken: exits 1 saying so, instead of running without a listener', async () => {
    const dir = tmp();
    dirs.push(dir);
    const { p, url } = await start({ SWITCHYARD_DATA_DIR: dir });
    procs.push(p);
    const port = new URL(url).port;
    const dir2 = tmp();
    dirs.push(dir2);
    const second = serveThatFails({ PORT: port, SWITCHYARD_DATA_DIR: dir2 });
    assert.equal(await exitCode(second), 1, `exit code (stderr: ${second.stderr()})`);
    assert.match(
      second.stderr(),
      new RegExp(`cannot listen on 127\\.0\\.0\\.1:${port}: .*EADDRINUSE`),
    );
    // The first one is unaffected.
    assert.equal((await http('GET', `${url}/healthz`)).status, 200);
  });

  it('a bad setting found after storage opened exits 1 naming it (no process left without a listener); typos are refused', async () => {
    const dir = tmp();
    dirs.push(dir);
    for (const [env, message] of [
      // Read once the database is open: the process used to print this and hang.
      [{ SWITCHYARD_SECRET_KEY: 'abc' }, /SWITCHYARD_SECRET_KEY must be 32 bytes/],
      // A fail-closed deployment with a typo used to fail open.
      [{ SWITCHYARD_LIMITS_FAIL: 'close' }, /SWITCHYARD_LIMITS_FAIL must be open or closed/],
      [{ REDIS_URL: 'http://cache' }, /REDIS_URL must be a redis: or rediss: URL/],
      [{ SWITCHYARD_TRUSTED_PROXIES: 'notacidr' }, /SWITCHYARD_TRUSTED_PROXIES: invalid IP/],
    ] as const) {
      const p = serveThatFails({ PORT: '0', SWITCHYARD_DATA_DIR: dir, ...env });
      assert.equal(await exitCode(p), 1, p.stderr());
      assert.match(p.stderr(), message);
    }
  });

  it('one process per embedded database: a second serve on the same data directory exits 1', async () => {
    const dir = tmp();
    dirs.push(dir);
    const first = await start({ SWITCHYARD_DATA_DIR: dir });
    procs.push(first.p);
    const second = serveThatFails({ PORT: '0', SWITCHYARD_DATA_DIR: dir });
    assert.equal(await exitCode(second), 1, second.stderr());
    assert.match(second.stderr(), /is in use by another Switchyard process \(pid \d+\)/);
    assert.equal((await http('GET', `${first.url}/healthz`)).status, 200);
    // Stopped cleanly, the first one releases it; killed, its lock is taken over.
    assert.equal(await first.p.stop('SIGTERM'), 0);
    const third = await start({ SWITCHYARD_DATA_DIR: dir });
    procs.push(third.p);
    await third.p.stop('SIGKILL');
    const fourth = await start({ SWITCHYARD_DATA_DIR: dir });
    procs.push(fourth.p);
    assert.equal((await http('GET', `${fourth.url}/healthz`)).status, 200);
  });

  it('plain HTTP is refused in production (probes excepted) and responses carry HSTS', async () => {
    const dir = tmp();
    dirs.push(dir);
    const { p, url } = await start({ SWITCHYARD_DATA_DIR: dir, SWITCHYARD_ENV: 'production' });
    procs.push(p);
    const r = await http('GET', `${url}/admin/v1/projects`, { auth: `Bearer ${TOKEN}` });
    assert.equal(r.status, 403);
    assert.equal((r.body.error as Record<string, unknown>).code, 'https_required');
    assert.match(String(r.headers['strict-transport-security']), /max-age=\d+/);
    assert.equal((await http('GET', `${url}/healthz`)).status, 200);
    // A path Fastify refuses before routing (bad percent-encoding, an over-long
    // segment) gets the same treatment: refused over plain HTTP, with HSTS.
    for (const path of ['/%zz', `/${'a'.repeat(300)}/v1/keys`]) {
      const bad = await http('GET', `${url}${path}`);
      assert.equal(bad.status, 403, path);
      assert.equal((bad.body.error as Record<string, unknown>).code, 'https_required');
      assert.match(String(bad.headers['strict-transport-security']), /max-age=\d+/);
    }
    // A request the HTTP parser refuses (headers over the limit) is answered on the
    // raw socket: with HSTS as well.
    const u = new URL(url);
    const socket = net.connect(Number(u.port), u.hostname);
    let raw = '';
    socket.setEncoding('utf8');
    socket.on('data', (d: string) => (raw += d));
    socket.write(`GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`);
    await once(socket, 'close');
    assert.match(raw, /^HTTP\/1\.1 431 /);
    assert.match(raw, /\r\nStrict-Transport-Security: max-age=\d+/i);
  });

  it('serves TLS from the configured files and accepts requests over it', async () => {
    const dir = tmp();
    dirs.push(dir);
    const { certFile } = testCertificate();
    const keyFile = join(dir, 'key.pem');
    const cert = join(dir, 'cert.pem');
    copyFileSync(certFile, cert);
    copyFileSync(join(certFile, '..', 'key.pem'), keyFile);
    const { p, url } = await start({
      SWITCHYARD_DATA_DIR: dir,
      SWITCHYARD_ENV: 'production',
      SWITCHYARD_TLS_CERT_FILE: cert,
      SWITCHYARD_TLS_KEY_FILE: keyFile,
    });
    procs.push(p);
    assert.match(url, /^https:/);
    const dispatcher = new Agent({ connect: { ca: testCertificate().cert } });
    const res = await request(`${url}/admin/v1/projects`, {
      headers: { authorization: `Bearer ${TOKEN}` },
      dispatcher,
    });
    assert.equal(res.statusCode, 200);
    assert.match(String(res.headers['strict-transport-security']), /max-age/);
    await res.body.text();
    await dispatcher.close();
    // http:// to the TLS port: an answer in plain HTTP saying so, not a silent close.
    const plain = await request(`${url.replace(/^https:/, 'http:')}/admin/v1/projects`, {
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    assert.equal(plain.statusCode, 403);
    assert.match(String(plain.headers['x-request-id']), /^req_/);
    const body = (await plain.body.json()) as { error: { code: string; message: string } };
    assert.equal(body.error.code, 'https_required');
    assert.match(body.error.message, /HTTPS/);
    // The port still serves TLS afterwards.
    const again = new Agent({ connect: { ca: testCertificate().cert } });
    const ok = await request(`${url}/healthz`, { dispatcher: again });
    assert.equal(ok.statusCode, 200);
    await ok.body.text();
    await again.close();
  });

  it('a TLS file missing or not PEM: exits 1 saying so, before starting anything', async () => {
    const dir = tmp();
    dirs.push(dir);
    const { certFile } = testCertificate();
    const key = join(certFile, '..', 'key.pem');
    const garbage = join(dir, 'garbage.pem');
    writeFileSync(garbage, 'garbage');
    for (const [cert, reason] of [
      [join(dir, 'nope.pem'), /ENOENT/],
      [garbage, /PEM|certificate/i],
    ] as const) {
      const p = serveThatFails({
        PORT: '0',
        SWITCHYARD_DATA_DIR: dir,
        SWITCHYARD_ENV: 'production',
        SWITCHYARD_TLS_CERT_FILE: cert,
        SWITCHYARD_TLS_KEY_FILE: key,
      });
      assert.equal(await exitCode(p), 1, p.stderr());
      assert.match(p.stderr(), /cannot use the TLS certificate and key: /);
      assert.match(p.stderr(), reason);
    }
  });

  it('production without a terminal: secrets go to 0600 files of the data directory, not stdout', async () => {
    const dir = tmp();
    dirs.push(dir);
    const p = spawnSwitchyard(['serve'], {
      PORT: '0',
      LOG_LEVEL: 'warn',
      SWITCHYARD_DATA_DIR: dir,
      SWITCHYARD_ENV: 'production',
      SWITCHYARD_DEMO_ENGINE: 'sim',
      SWITCHYARD_TRUSTED_PROXIES: '127.0.0.1/32',
    });
    procs.push(p);
    const url = (await p.waitFor(/listening on (http:\/\/127\.0\.0\.1:\d+)/))[1]!;
    await p.waitFor(/Demo API key created; saved to (\S+) \(mode 0600\), not printed/);
    const out = p.stdout();
    assert.match(
      out,
      /Operator token generated; saved to \S+admin-token \(mode 0600\), not printed/,
    );
    const key = readFileSync(join(dir, 'demo-api-key'), 'utf8').trim();
    const token = readFileSync(join(dir, 'admin-token'), 'utf8').trim();
    assert.equal(statSync(join(dir, 'demo-api-key')).mode & 0o777, 0o600);
    assert.ok(!out.includes(key) && !out.includes(token), 'no secret on stdout');
    assert.ok(!p.stderr().includes(key) && !p.stderr().includes(token), 'nor on stderr');
    const projectId = out.match(/Demo project: (proj_[0-9a-f]+)/)![1]!;
    const r = await http('GET', `${url}/${projectId}/v1/endpoints`, {
      auth: `Bearer ${key}`,
      headers: { 'x-forwarded-proto': 'https' },
    });
    assert.equal(r.status, 200, r.text);
  });

  it('a trusted TLS proxy is believed through X-Forwarded-Proto', async () => {
    const dir = tmp();
    dirs.push(dir);
    const { p, url } = await start({
      SWITCHYARD_DATA_DIR: dir,
      SWITCHYARD_ENV: 'production',
      SWITCHYARD_TRUSTED_PROXIES: '127.0.0.1/32',
    });
    procs.push(p);
    for (const proto of ['https', 'HTTPS']) {
      const r = await http('GET', `${url}/admin/v1/projects`, {
        auth: `Bearer ${TOKEN}`,
        headers: { 'x-forwarded-proto': proto },
      });
      assert.equal(r.status, 200, proto);
    }
    // Over the trusted proxy's HTTPS, a path refused before routing is a 404 with HSTS.
    const bad = await http('GET', `${url}/%zz`, { headers: { 'x-forwarded-proto': 'https' } });
    assert.equal(bad.status, 404);
    assert.equal((bad.body.error as Record<string, unknown>).code, 'route_not_found');
    assert.match(String(bad.headers['strict-transport-security']), /max-age=\d+/);
  });
});

describe('body limit and roles', () => {
  const procs: Spawned[] = [];
  const dirs: string[] = [];
  after(async () => {
    for (const p of procs) await p.stop('SIGKILL');
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  it('refuses a body over SWITCHYARD_MAX_BODY_BYTES with 413 payload_too_large', async () => {
    const dir = tmp();
    dirs.push(dir);
    const { p, url } = await start({ SWITCHYARD_DATA_DIR: dir, SWITCHYARD_MAX_BODY_BYTES: '2048' });
    procs.push(p);
    const big = JSON.stringify({ slug: 'x', name: 'y'.repeat(5000) });
    const r = await http('POST', `${url}/admin/v1/projects`, {
      auth: `Bearer ${TOKEN}`,
      rawBody: big,
      headers: { 'content-type': 'application/json' },
    });
    assert.equal(r.status, 413);
    assert.equal((r.body.error as Record<string, unknown>).code, 'payload_too_large');
    // Chunked, without Content-Length: refused while streaming, not after buffering.
    // The server answers 413 and closes as soon as the limit is passed, so the
    // client may see the refusal or a broken pipe while it is still sending.
    const chunked = await request(`${url}/admin/v1/projects`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
      body: Readable.from(
        (function* () {
          for (let i = 0; i < 1000; i++) yield Buffer.alloc(1024, 0x20);
        })(),
      ),
    }).then(
      async (res) => {
        await res.body.text();
        return res.statusCode;
      },
      (err: { code?: string }) => err.code,
    );
    assert.ok(
      [413, 'EPIPE', 'ECONNRESET', 'UND_ERR_SOCKET'].includes(chunked as never),
      String(chunked),
    );
  });

  it('--roles dispatcher serves health and metrics but no API', async () => {
    const dir = tmp();
    dirs.push(dir);
    const { p, url } = await start({ SWITCHYARD_DATA_DIR: dir }, ['--roles', 'dispatcher']);
    procs.push(p);
    assert.match(p.stdout(), /roles: dispatcher/);
    assert.equal((await http('GET', `${url}/healthz`)).status, 200);
    assert.equal((await http('GET', `${url}/metrics`)).status, 200);
    assert.equal(
      (await http('GET', `${url}/admin/v1/projects`, { auth: `Bearer ${TOKEN}` })).status,
      404,
    );
  });

  it('--roles dashboard without the api role or SWITCHYARD_ROUTER_URL: exits 2 saying so', async () => {
    const dir = tmp();
    dirs.push(dir);
    const p = spawnSwitchyard(['serve', '--roles', 'dashboard'], {
      PORT: '0',
      LOG_LEVEL: 'fatal',
      SWITCHYARD_DEMO: '0',
      SWITCHYARD_DATA_DIR: dir,
    });
    procs.push(p);
    const [code] = (await once(p.child, 'exit')) as [number | null];
    assert.equal(code, 2, p.stderr());
    assert.match(p.stderr(), /dashboard role without the api role needs SWITCHYARD_ROUTER_URL/);
  });

  it('gives freed native memory back once quiet, and counts it in /metrics', async () => {
    const dir = tmp();
    dirs.push(dir);
    const { p, url } = await start({ SWITCHYARD_DATA_DIR: dir, SWITCHYARD_MEMORY_TRIM_MS: '100' });
    procs.push(p);
    // Start-up (migrations, module loading) is the first busy period: the quiet
    // intervals after it trim. Scrapes far apart: each one is work for the router, and
    // on a loaded machine a scrape every 100 ms kept every 100 ms interval above the
    // 5 % of event-loop use that counts as quiet.
    let trims = 0;
    for (let i = 0; i < 25 && trims === 0; i++) {
      await new Promise((r) => setTimeout(r, 400));
      const text = (await http('GET', `${url}/metrics`)).text;
      trims = Number(/^switchyard_memory_trims_total (\d+)/m.exec(text)?.[1] ?? 0);
      assert.match(text, /^switchyard_memory_trim_released_bytes_total \d+/m);
    }
    assert.ok(trims >= 1, 'no trim within 10 s of a quiet start');
  });
});

describe('graceful drain on SIGTERM', () => {
  const dirs: string[] = [];
  const procs: Spawned[] = [];
  after(async () => {
    for (const p of procs) await p.stop('SIGKILL');
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  /**
   * A router with `drainMs` in front of a sim worker of 200 ms per token, a project
   * `name` with an endpoint `chat` on it, and a key: `chat(body)` posts a completion.
   */
  async function drainSetup(name: string, drainMs: number) {
    const dir = tmp();
    dirs.push(dir);
    const worker = spawnSwitchyard(
      ['worker', '--engine', 'sim', '--port', '0', '--tpot-ms', '200', '--model', name],
      {},
    );
    procs.push(worker);
    const workerUrl = (await worker.waitFor(/serving (http:\/\/\S+\/v1)/))[1]!;
    const { p, url } = await start({
      SWITCHYARD_DATA_DIR: dir,
      SWITCHYARD_DRAIN_MS: String(drainMs),
    });
    procs.push(p);
    const op = (path: string, body: unknown) =>
      http('POST', `${url}/admin/v1${path}`, { auth: `Bearer ${TOKEN}`, body });
    await op('/models', { name, context_window: 4096 });
    await op('/workers', { model: name, tier: 'gpu', url: workerUrl });
    const proj = await op('/projects', { slug: name, name });
    await op(`/projects/${name}/endpoints`, {
      slug: 'chat',
      name: 'Chat',
      model: name,
      tier: 'gpu',
    });
    const key = String((await op(`/projects/${name}/keys`, {})).body.key);
    const path = `${url}/${String(proj.body.id)}/chat/v1/chat/completions`;
    const chat = (body: Record<string, unknown>) =>
      fetch(path, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'x', messages: [{ role: 'user', content: 'hi' }], ...body }),
      });
    return { p, dir, path, key, chat };
  }

  it('finishes short requests, ends long streams with cancelled at the deadline, records usage, exits 0', async () => {
    const { p, dir, chat } = await drainSetup('drain', 1500);
    // A long stream (50 tokens x 200 ms = 10 s) and a short one (2 tokens).
    const long = await chat({ stream: true, max_tokens: 50 });
    const longText = long.text();
    const short = chat({ max_tokens: 2 });
    // And a long non-streaming one: at the deadline, a 503 to retry elsewhere, not a reset.
    const longPlain = chat({ max_tokens: 50 });
    await new Promise((r) => setTimeout(r, 100));
    const t0 = Date.now();
    p.child.kill('SIGTERM');
    assert.equal((await short).status, 200, 'in-flight request finished during the drain');
    const text = await longText;
    const waited = Date.now() - t0;
    assert.match(
      text,
      /event: error\ndata: \{"error":\{"message":"[^"]*shutting down[^"]*","code":"cancelled"/,
    );
    assert.ok(!text.includes('[DONE]'));
    assert.ok(waited >= 1300 && waited < 5000, `stream ended after ${waited} ms`);
    const plain = await longPlain;
    assert.equal(plain.status, 503);
    assert.equal(plain.headers.get('retry-after'), '1');
    const plainError = ((await plain.json()) as { error: { code: string } }).error;
    assert.equal(plainError.code, 'unavailable');
    const [code] = await new Promise<[number | null]>((resolve) =>
      p.child.exitCode !== null
        ? resolve([p.child.exitCode])
        : p.child.once('exit', (c) => resolve([c])),
    );
    assert.equal(code, 0);
    // Usage of both requests was flushed before the process exited.
    const store = await openStore({ dataDir: dir });
    const rows = await store.db.select().from(tables.usageRecords);
    await store.close();
    assert.deepEqual(rows.map((r) => r.status).sort(), ['cancelled', 'cancelled', 'completed']);
    assert.ok(rows.some((r) => r.status === 'cancelled' && r.completionTokens >= 1));
  });

  it('a kept-alive connection whose request finished during the drain does not hold it to the deadline', async () => {
    const { p, path, key } = await drainSetup('ka', 20_000);
    const agent = new Agent({ keepAliveTimeout: 60_000 });
    // About a second of generation, on a connection the client keeps open.
    const pending = request(path, {
      method: 'POST',
      dispatcher: agent,
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'x',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 5,
      }),
    });
    await new Promise((r) => setTimeout(r, 200));
    const t0 = Date.now();
    p.child.kill('SIGTERM');
    const res = await pending;
    assert.equal(res.statusCode, 200);
    await res.body.text();
    const [code] = await new Promise<[number | null]>((resolve) =>
      p.child.exitCode !== null
        ? resolve([p.child.exitCode])
        : p.child.once('exit', (c) => resolve([c])),
    );
    assert.equal(code, 0);
    const took = Date.now() - t0;
    assert.ok(took < 8_000, `exited ${took} ms after SIGTERM (the drain period is 20 s)`);
    await agent.close();
  });

  it('a second SIGTERM while draining exits at once with code 1', async () => {
    const { p, chat } = await drainSetup('twice', 60_000);
    // A stream that would keep the drain waiting for 10 s.
    const long = await chat({ stream: true, max_tokens: 50 });
    void long.text().catch(() => undefined);
    const exited = once(p.child, 'exit');
    p.child.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(p.child.exitCode, null, 'still draining after the first signal');
    const t0 = Date.now();
    p.child.kill('SIGTERM');
    const [code] = (await exited) as [number | null];
    assert.equal(code, 1);
    assert.ok(Date.now() - t0 < 5000, 'at once, not after the drain period');
  });
});
