/**
 * The operator API: token checks, bad input as 400 `invalid_body` naming the
 * field, conflicts, and the records it creates.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { statSync, readFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { AdminAuth } from '../../src/http/admin-auth.js';
import { ServiceError } from '../../src/errors/index.js';
import { tables } from '../../src/store/index.js';
import { freshDatabase, http, startTestServer, type TestServer } from '../support/harness.js';

describe('operator API', () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer();
  });
  after(() => s.close());

  it('refuses requests without the operator token, or with a wrong one', async () => {
    for (const auth of [undefined, 'Bearer wrong', 'Basic test-operator-token', 'Bearer ']) {
      const r = await http('GET', `${s.url}/admin/v1/projects`, { auth });
      assert.equal(r.status, 401);
      assert.equal((r.body.error as Record<string, unknown>).code, 'invalid_admin_token');
    }
    // An API key is not an operator token.
    await s.admin('POST', '/projects', { slug: 'tok', name: 'T' });
    const k = await s.admin('POST', '/projects/tok/keys', { scopes: ['management'] });
    const r = await http('GET', `${s.url}/admin/v1/projects`, {
      auth: `Bearer ${String(k.body.key)}`,
    });
    assert.equal(r.status, 401);
  });

  it('creates a project with an external id and rejects a duplicate slug', async () => {
    const r = await s.admin('POST', '/projects', { slug: 'acme', name: 'Acme', credit_cents: 500 });
    assert.equal(r.status, 201);
    assert.match(String(r.body.id), /^proj_[0-9a-f]{20}$/);
    assert.equal(r.body.slug, 'acme');
    assert.equal(r.body.credit_cents, 500);
    const dup = await s.admin('POST', '/projects', { slug: 'acme', name: 'Again' });
    assert.equal(dup.status, 409);
    assert.equal((dup.body.error as Record<string, unknown>).param, 'slug');
    const byId = await s.admin('GET', `/projects/${String(r.body.id)}`);
    assert.equal(byId.body.slug, 'acme');
    const list = await s.admin('GET', '/projects');
    assert.equal(list.body.object, 'list');
    assert.ok((list.body.data as Array<{ slug: string }>).some((p) => p.slug === 'acme'));
  });

  const badBodies: Array<[string, string, unknown, string | null]> = [
    ['/projects', 'missing slug', { name: 'x' }, 'slug'],
    ['/projects', 'bad slug', { slug: 'Has_Underscore', name: 'x' }, 'slug'],
    ['/projects', 'wrong type', { slug: 'ok', name: 5 }, 'name'],
    ['/projects', 'negative credit', { slug: 'ok2', name: 'x', credit_cents: -1 }, 'credit_cents'],
    ['/projects', 'unknown field', { slug: 'ok3', name: 'x', colour: 'red' }, 'colour'],
    ['/projects', 'not an object', [1, 2], null],
    ['/models', 'context window too small', { name: 'm', context_window: 1 }, 'context_window'],
    [
      '/models',
      'unknown capability',
      { name: 'm', context_window: 512, capabilities: ['x'] },
      'capabilities[0]',
    ],
    ['/workers', 'bad tier', { model: 'm', tier: 'platinum', url: 'http://h/v1' }, 'tier'],
    ['/workers', 'url without /v1', { model: 'm', tier: 'cpu', url: 'http://h:1' }, 'url'],
    ['/workers', 'non-http url', { model: 'm', tier: 'cpu', url: 'ftp://h/v1' }, 'url'],
    // The router sends requests to the URL's path: /v1 in its query or fragment is not it.
    ['/workers', '/v1 in the query', { model: 'm', tier: 'cpu', url: 'http://h:1/?p=/v1' }, 'url'],
    [
      '/workers',
      '/v1 in the fragment',
      { model: 'm', tier: 'cpu', url: 'http://h:1/x#/v1' },
      'url',
    ],
    // It would be shown by the operator API and logged with the worker's health.
    [
      '/workers',
      'url with credentials',
      { model: 'm', tier: 'cpu', url: 'http://user:secret@h:1/v1' },
      'url',
    ],
    ['/workers', 'url with a user', { model: 'm', tier: 'cpu', url: 'http://user@h:1/v1' }, 'url'],
    [
      '/projects/acme/endpoints',
      'endpoint slug v1',
      { slug: 'v1', name: 'x', model: 'm', tier: 'cpu' },
      'slug',
    ],
    // Such a path segment is taken for an endpoint id: the endpoint could not be reached.
    [
      '/projects/acme/endpoints',
      'endpoint slug shaped like a UUID',
      { slug: '0f8e2a4c-1b3d-4e5f-8a9b-0c1d2e3f4a5b', name: 'x', model: 'm', tier: 'cpu' },
      'slug',
    ],
  ];
  for (const [path, what, body, param] of badBodies) {
    it(`400 invalid_body for ${path}: ${what}`, async () => {
      const r = await s.admin('POST', path, body);
      assert.equal(r.status, 400, r.text);
      const err = r.body.error as Record<string, unknown>;
      assert.equal(err.code, 'invalid_body');
      assert.equal(err.type, 'invalid_request_error');
      assert.equal(err.param, param);
    });
  }

  it('400 for malformed JSON and for an empty JSON body, in the envelope', async () => {
    const r = await http('POST', `${s.url}/admin/v1/projects`, {
      auth: 'Bearer test-operator-token',
      rawBody: '{"slug": ',
      headers: { 'content-type': 'application/json' },
    });
    assert.equal(r.status, 400);
    assert.equal((r.body.error as Record<string, unknown>).code, 'invalid_json');
  });

  it('404 in the envelope for unknown routes, with X-Request-ID', async () => {
    for (const path of ['/nope', '/admin/v1/nope', '/proj_x/v1/nothing/here']) {
      const r = await http('GET', s.url + path, { auth: 'Bearer test-operator-token' });
      assert.ok(r.status === 404 || r.status === 401, `${path}: ${r.status}`);
      assert.ok(r.body.error, path);
      assert.match(String(r.headers['x-request-id']), /^req_/);
    }
    const r = await http('GET', s.url + '/nope');
    assert.equal(r.status, 404);
    assert.equal((r.body.error as Record<string, unknown>).code, 'route_not_found');
  });

  it('registers models and workers; endpoints wait for a worker, then become active', async () => {
    assert.equal(
      (
        await s.admin('POST', '/models', {
          name: 'org/llama-x',
          context_window: 8192,
          capabilities: ['tool_calling'],
        })
      ).status,
      201,
    );
    await s.admin('POST', '/projects', { slug: 'prov', name: 'Prov' });
    const e = await s.admin('POST', '/projects/prov/endpoints', {
      slug: 'chat',
      name: 'Chat',
      model: 'org/llama-x',
      tier: 'gpu',
    });
    assert.equal(e.status, 201, e.text);
    assert.equal(e.body.status, 'provisioning');
    assert.equal(e.body.provisioned_worker_id, null);
    assert.equal(e.body.max_requests_per_minute, 256 + 128);
    const w = await s.admin('POST', '/workers', {
      model: 'org/llama-x',
      tier: 'gpu',
      url: 'http://127.0.0.1:9/v1',
      id: 'gpu-1',
    });
    assert.equal(w.status, 201, w.text);
    assert.equal(w.body.id, 'gpu-1');
    const again = await s.admin('POST', '/workers', {
      model: 'org/llama-x',
      tier: 'gpu',
      url: 'http://127.0.0.1:9/v1',
      id: 'gpu-1',
    });
    assert.equal(again.status, 409);
    const list = await s.admin('GET', '/projects/prov/endpoints');
    const ep = (list.body.data as Array<Record<string, unknown>>)[0]!;
    assert.equal(ep.status, 'active');
    assert.equal(ep.provisioning_state, 'ready');
    assert.equal(ep.provisioned_worker_id, 'gpu-1');
    assert.equal((await s.admin('DELETE', '/workers/gpu-1')).status, 200);
    assert.equal((await s.admin('DELETE', '/workers/gpu-1')).status, 404);
    const missingModel = await s.admin('POST', '/projects/prov/endpoints', {
      slug: 'x',
      name: 'X',
      model: 'nope',
      tier: 'gpu',
    });
    assert.equal(missingModel.status, 404);
    assert.equal((missingModel.body.error as Record<string, unknown>).param, 'model');
  });

  it('creates keys with the spec attributes and returns the value once', async () => {
    await s.admin('POST', '/projects', { slug: 'keys', name: 'Keys' });
    const r = await s.admin('POST', '/projects/keys/keys', {
      name: 'ci',
      scopes: ['inference', 'execution'],
      allowedIps: ['10.0.0.1', '2001:db8::/32'],
      quotaRequests: 10,
      quotaWindow: 30,
    });
    assert.equal(r.status, 201, r.text);
    assert.match(String(r.body.key), /^swy_keys_[A-Za-z0-9_-]{43}$/);
    assert.equal(r.body.prefix, String(r.body.key).slice(0, 'swy_keys_'.length + 4));
    assert.deepEqual(r.body.scopes, ['inference', 'execution']);
    assert.equal(r.body.quotaRequests, 10);
    assert.equal(r.body.quotaWindow, 30);
    assert.equal(r.body.expiresAt, null);
    const list = await s.admin('GET', '/projects/keys/keys');
    const listed = (list.body.data as Array<Record<string, unknown>>)[0]!;
    assert.equal(listed.id, r.body.id);
    assert.equal('key' in listed, false);
    assert.ok(!JSON.stringify(list.body).includes(String(r.body.key)));
    const one = await s.admin('GET', `/projects/keys/keys/${String(r.body.id)}`);
    assert.equal(one.status, 200, one.text);
    assert.deepEqual(one.body, listed);
    const missing = await s.admin('GET', `/projects/keys/keys/${randomUUID()}`);
    assert.equal(missing.status, 404);
    const defaults = await s.admin('POST', '/projects/keys/keys', {});
    assert.deepEqual(defaults.body.scopes, ['inference']);
    assert.equal(defaults.body.quotaRequests, 60);
    assert.equal(defaults.body.quotaWindow, 60);
    for (const [body, param] of [
      [{ scopes: [] }, 'scopes'],
      [{ scopes: ['admin'] }, 'scopes[0]'],
      [{ scopes: ['inference', 'inference'] }, 'scopes'],
      [{ allowedIps: ['1.2.3.4', 'not-an-ip'] }, 'allowedIps[1]'],
      [{ blockedIps: ['10.0.0.0/33'] }, 'blockedIps[0]'],
      [{ allowedIps: ['fe80::1%eth0'] }, 'allowedIps[0]'],
      [{ expiresAt: 'tomorrow' }, 'expiresAt'],
      [{ endpointId: 'abc' }, 'endpointId'],
      [{ endpointId: '00000000-0000-4000-8000-000000000000' }, 'endpointId'],
      [{ quotaRequests: 0 }, 'quotaRequests'],
    ] as const) {
      const bad = await s.admin('POST', '/projects/keys/keys', body);
      assert.ok(bad.status === 400 || bad.status === 404, JSON.stringify(body));
      assert.equal((bad.body.error as Record<string, unknown>).param, param, JSON.stringify(body));
    }
  });
});

describe('operator token bootstrap', () => {
  it('is generated once, written 0600, stored only as a hash, and reused', async () => {
    const db = await freshDatabase('pglite');
    const dir = mkdtempSync(join(tmpdir(), 'swy-admin-'));
    try {
      const first = await AdminAuth.init(db.store.db, { token: undefined, dataDir: dir });
      assert.ok(first.generated);
      const file = join(dir, 'admin-token');
      assert.equal(statSync(file).mode & 0o777, 0o600);
      assert.equal(readFileSync(file, 'utf8').trim(), first.generated);
      const rows = await db.store.db.select().from(tables.settings);
      assert.ok(!JSON.stringify(rows).includes(first.generated!));
      first.auth.check(`Bearer ${first.generated}`);
      assert.throws(() => first.auth.check('Bearer nope'), ServiceError);
      const second = await AdminAuth.init(db.store.db, { token: undefined, dataDir: dir });
      assert.equal(second.generated, null);
      second.auth.check(`Bearer ${first.generated}`);
    } finally {
      await db.drop();
    }
  });
});

describe('health', () => {
  it('/healthz is up and /readyz checks the database', async () => {
    const s = await startTestServer();
    try {
      const h = await http('GET', `${s.url}/healthz`);
      assert.equal(h.status, 200);
      assert.match(String(h.headers['x-request-id']), /^req_/);
      assert.equal((await http('GET', `${s.url}/readyz`)).status, 200);
      await s.services.store.close();
      const r = await http('GET', `${s.url}/readyz`);
      assert.equal(r.status, 503);
      assert.equal(r.body.status, 'unavailable');
    } finally {
      await s.close();
    }
  });
});

describe('endpoint limits fit their columns', () => {
  it('refuses values above 2^31-1 with 400 instead of failing in the database', async () => {
    const s = await startTestServer();
    try {
      await s.admin('POST', '/models', { name: 'm', context_window: 1024 });
      await s.admin('POST', '/projects', { slug: 'big', name: 'Big' });
      const r = await s.admin('POST', '/projects/big/endpoints', {
        slug: 'e',
        name: 'E',
        model: 'm',
        tier: 'gpu',
        max_tokens_per_minute: 10_000_000_000,
      });
      assert.equal(r.status, 400);
      assert.equal((r.body.error as Record<string, unknown>).param, 'max_tokens_per_minute');
      const ok = await s.admin('POST', '/projects/big/endpoints', {
        slug: 'e',
        name: 'E',
        model: 'm',
        tier: 'gpu',
        max_tokens_per_minute: 2_147_483_647,
      });
      assert.equal(ok.status, 201, ok.text);
    } finally {
      await s.close();
    }
  });
});
