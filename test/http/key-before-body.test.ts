/**
 * The API key decides before the body: a request with a missing or bad key is 401
 * (spec: "Expired, revoked, missing or malformed keys get 401") whatever its body
 * holds, on every project surface, the chat route included; with a valid key the
 * same body is the JSON error it is. And an empty body sent as `application/json`
 * is `{}`, so bodiless POSTs and DELETEs that carry the header are accepted.
 */
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { startSimWorker, type SimWorker } from '../../src/workers/sim/index.js';
import { http, seedProject, startTestServer, type TestServer } from '../support/harness.js';

const JSON_TYPE = { 'content-type': 'application/json' };

describe('the key before the body', () => {
  let s: TestServer;
  let w: SimWorker;
  let p: Awaited<ReturnType<typeof seedProject>>;
  before(async () => {
    // Webhook URLs on loopback (no DNS needed); a worker so the chat route gets to its body.
    s = await startTestServer({
      env: {
        SWITCHYARD_WEBHOOK_ALLOW_CIDRS: '127.0.0.0/8',
        SWITCHYARD_MAX_BODY_BYTES: '65536',
        SWITCHYARD_REQUEST_TIMEOUT_MS: '1000',
      },
    });
    w = await startSimWorker({ model: 'test-model' });
    p = await seedProject(s, {
      slug: 'kbb',
      scopes: ['inference', 'management', 'execution'],
    });
    const r = await s.admin('POST', '/workers', { model: 'test-model', tier: 'cpu', url: w.url });
    assert.equal(r.status, 201, r.text);
  });
  after(async () => {
    await s.close();
    await w.close();
  });

  const routes = () => [
    ['POST', `/${p.projectId}/main/v1/chat/completions`],
    ['POST', `/${p.projectId}/v1/keys`],
    ['POST', `/${p.projectId}/main/v1/webhooks`],
    ['POST', `/${p.projectId}/v1/webhooks`],
    ['POST', `/${p.projectId}/v1/slos`],
    ['POST', `/${p.projectId}/v1/exec/invocations`],
  ];

  /** What the server sends on a connection where `raw` was written, until `done` matches it. */
  const answer = async (raw: string, done: RegExp, ms = 10_000): Promise<string> => {
    const u = new URL(s.url);
    const socket = net.connect(Number(u.port), u.hostname);
    let out = '';
    socket.setEncoding('utf8');
    socket.on('error', () => undefined);
    socket.write(raw);
    try {
      return await new Promise<string>((resolve, reject) => {
        const bound = setTimeout(() => reject(new Error(`no answer in ${ms} ms: ${out}`)), ms);
        const check = () => {
          if (!done.test(out)) return;
          clearTimeout(bound);
          resolve(out);
        };
        socket.on('data', (d: string) => ((out += d), check()));
        socket.on('close', () => (clearTimeout(bound), resolve(out)));
      });
    } finally {
      socket.destroy();
    }
  };

  it('a body that stalls: no key, 401 before it arrives; with one, 408 at the request timeout', async () => {
    const head = (auth: string) =>
      `POST /${p.projectId}/main/v1/chat/completions HTTP/1.1\r\nHost: x\r\n` +
      `Content-Type: application/json\r\nContent-Length: 100\r\n${auth}\r\n{`;
    // Embeddings, responses and MCP share the chat route's check.
    for (const [path, code] of [
      ['main/v1/chat/completions', 'missing_api_key'],
      ['main/v1/embeddings', 'missing_api_key'],
      ['main/v1/responses', 'missing_api_key'],
      ['v1/mcp', 'authentication_required'],
    ] as const) {
      const raw = head('').replace('main/v1/chat/completions', path);
      const refused = await answer(raw, /\r\n\r\n\{.*\}$/s, 5_000);
      assert.match(refused, /^HTTP\/1\.1 401 /, path);
      assert.match(refused, new RegExp(`"code":"${code}"`), path);
    }
    const started = Date.now();
    const late = await answer(head(`Authorization: Bearer ${p.key}\r\n`), /\}$/);
    assert.match(late, /^HTTP\/1\.1 408 /);
    assert.match(late, /"code":"request_timeout"/);
    assert.ok(Date.now() - started >= 900, `answered after ${Date.now() - started} ms`);
  });

  it('no key, or a bad one, with a malformed or empty body: 401', async () => {
    for (const [method, path] of routes()) {
      // The execution surface's error table names the missing credential differently.
      const missing = path!.includes('/v1/exec/') ? 'authentication_required' : 'missing_api_key';
      for (const [auth, code] of [
        [undefined, missing],
        [`Bearer swy_kbb_${'x'.repeat(43)}`, 'invalid_api_key'],
        ['Bearer not-a-key', 'invalid_api_key'],
      ] as const) {
        for (const rawBody of ['{bad', '']) {
          const r = await http(method!, `${s.url}${path}`, {
            ...(auth ? { auth } : {}),
            rawBody,
            headers: JSON_TYPE,
          });
          assert.equal(r.status, 401, `${path} ${auth ?? 'no key'} ${JSON.stringify(rawBody)}`);
          assert.equal((r.body.error as Record<string, unknown>).code, code, r.text);
        }
      }
    }
  });

  it('a body refused before decoding (413 too large, 415 not JSON): 401 first without a key', async () => {
    const paths = [
      ...routes().map(([, path]) => path!),
      `/${p.projectId}/main/v1/embeddings`,
      `/${p.projectId}/main/v1/responses`,
    ];
    const big = JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content: 'x'.repeat(70_000) }],
    });
    const bodies = [
      { rawBody: big, headers: JSON_TYPE, status: 413, code: 'payload_too_large' },
      {
        rawBody: '<a/>',
        headers: { 'content-type': 'application/xml' },
        status: 415,
        code: 'unsupported_media_type',
      },
      {
        rawBody: '{"model":"m","messages":[]}',
        headers: { 'content-type': 'text/plain' },
        status: 415,
        code: 'unsupported_media_type',
      },
      // A compressed body (or a header that says so): refused, not read as JSON.
      {
        rawBody: '{"model":"m","messages":[]}',
        headers: { ...JSON_TYPE, 'content-encoding': 'gzip' },
        status: 415,
        code: 'unsupported_media_type',
      },
    ];
    for (const path of paths) {
      const exec = path.includes('/v1/exec/');
      for (const b of bodies) {
        const anonymous = await http('POST', `${s.url}${path}`, b);
        assert.equal(anonymous.status, 401, `${path} ${b.status} without a key: ${anonymous.text}`);
        const code = (anonymous.body.error as Record<string, unknown>).code;
        assert.equal(code, exec ? 'authentication_required' : 'missing_api_key', path);
        const bad = await http('POST', `${s.url}${path}`, {
          ...b,
          auth: `Bearer swy_kbb_${'x'.repeat(43)}`,
        });
        assert.equal(bad.status, 401, `${path} ${b.status} with an unknown key`);
        const keyed = await http('POST', `${s.url}${path}`, { ...b, auth: `Bearer ${p.key}` });
        assert.equal(keyed.status, b.status, `${path} with the key: ${keyed.text}`);
        assert.equal((keyed.body.error as Record<string, unknown>).code, b.code, path);
      }
    }
  });

  it('a valid key with a malformed body: the JSON error of the route', async () => {
    for (const [method, path] of routes()) {
      const r = await http(method!, `${s.url}${path}`, {
        auth: `Bearer ${p.key}`,
        rawBody: '{bad',
        headers: JSON_TYPE,
      });
      assert.equal(r.status, 400, `${path}: ${r.text}`);
      const code = (r.body.error as Record<string, unknown>).code;
      // The execution surface folds decoding errors into invalid_body (its code table).
      assert.equal(code, path!.includes('/exec/') ? 'invalid_body' : 'invalid_json', path);
    }
  });

  it('valid JSON with a prototype-poisoning key: 400 that says why, not "not valid JSON"', async () => {
    for (const [method, path] of routes()) {
      for (const rawBody of [
        '{"model":"m","messages":[],"metadata":{"__proto__":"x"}}',
        '{"a":{"constructor":{"prototype":{"x":1}}}}',
      ]) {
        const r = await http(method!, `${s.url}${path}`, {
          auth: `Bearer ${p.key}`,
          rawBody,
          headers: JSON_TYPE,
        });
        assert.equal(r.status, 400, `${path}: ${r.text}`);
        const e = r.body.error as Record<string, unknown>;
        assert.equal(e.code, 'invalid_body', path);
        assert.match(String(e.message), /valid JSON but uses the key "__proto__"/, path);
      }
    }
  });

  it('an empty body sent as application/json: {} (bodiless routes succeed, others name the field)', async () => {
    const auth = `Bearer ${p.key}`;
    const created = await http('POST', `${s.url}/${p.projectId}/v1/webhooks`, {
      auth,
      body: { url: 'https://127.0.0.1:9/hook', events: ['exec.completed'] },
    });
    assert.equal(created.status, 201, created.text);
    const id = String(created.body.id);
    const empty = { auth, rawBody: '', headers: JSON_TYPE };

    // A create with nothing in it: which field is missing, not a JSON error.
    const bare = await http('POST', `${s.url}/${p.projectId}/v1/webhooks`, empty);
    assert.equal(bare.status, 400);
    assert.deepEqual(
      [
        (bare.body.error as Record<string, unknown>).code,
        (bare.body.error as Record<string, unknown>).param,
      ],
      ['invalid_body', 'url'],
    );
    // Key rotation without new scopes, then the webhook's deletion.
    const key = await http('POST', `${s.url}/${p.projectId}/v1/keys`, {
      auth,
      body: { scopes: ['inference'] },
    });
    assert.equal(key.status, 201, key.text);
    const rotated = await http(
      'POST',
      `${s.url}/${p.projectId}/v1/keys/${String(key.body.id)}/rotate`,
      empty,
    );
    assert.equal(rotated.status, 200, rotated.text);
    const deleted = await http('DELETE', `${s.url}/${p.projectId}/v1/webhooks/${id}`, empty);
    assert.equal(deleted.status, 200, deleted.text);
    assert.equal(deleted.body.deleted, true);
  });
});
