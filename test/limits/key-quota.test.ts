/**
 * The per-key quota is part of the auth layer (spec, "API keys (request boundary)":
 * 200 needs "within quota", 429 is "Quota exhausted; Retry-After gives seconds to
 * wait"): every request authenticated by the key counts, inference or not, in one
 * rolling window, on the fake clock. Other keys of the project have their own.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { inferenceFixture, type InferenceFixture } from '../support/inference.js';
import { http, type Res } from '../support/harness.js';

const WINDOW_S = 60;

describe('the per-key quota counts every request the key authenticates', () => {
  let f: InferenceFixture;
  let key = '';
  let other = '';
  const get = (path: string, k = key): Promise<Res> =>
    f.server.call('GET', `/${f.projectId}${path}`, { key: k });
  const chat = (k = key): Promise<Res> =>
    f.server.call('POST', `/${f.projectId}/chat/v1/chat/completions`, {
      key: k,
      body: { model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
    });
  const expect429 = (r: Res) => {
    assert.equal(r.status, 429, r.text);
    const e = r.body.error as Record<string, unknown>;
    assert.equal(e.code, 'rate_limit_exceeded');
    assert.equal(e.type, 'rate_limit_error');
    assert.ok(Number(r.headers['retry-after']) >= 1, 'Retry-After');
    assert.equal(e.retry_after, Number(r.headers['retry-after']));
  };

  before(async () => {
    f = await inferenceFixture({ tier: 'self_hosted' });
    const mk = async (quotaRequests: number) => {
      const r = await f.server.admin('POST', '/projects/inf/keys', {
        scopes: ['inference', 'management', 'execution'],
        quotaRequests,
        quotaWindow: WINDOW_S,
      });
      assert.equal(r.status, 201, r.text);
      return String(r.body.key);
    };
    key = await mk(4);
    other = await mk(100);
  });
  after(() => f.close());

  it('model listing, management, execution and chat share one window; the next is 429', async () => {
    assert.equal((await get('/v1/models')).status, 200);
    assert.equal((await get('/v1/webhooks')).status, 200);
    assert.equal((await get('/v1/exec/tools')).status, 200);
    assert.equal((await chat()).status, 200);
    // Four requests of four kinds: the quota is spent, whatever route comes next.
    expect429(await get('/v1/models'));
    expect429(await get('/v1/keys'));
    expect429(await get('/v1/exec/invocations'));
    expect429(await chat());
    // The key's quota is its own: another key of the project goes on.
    assert.equal((await get('/v1/models', other)).status, 200);
    assert.equal((await chat(other)).status, 200);
  });

  it('a refused request does not count; the window rolls on the clock', async () => {
    const r = await get('/v1/models');
    expect429(r);
    f.server.clock.advance(Number(r.headers['retry-after']) * 1000 - 1);
    expect429(await get('/v1/models'));
    f.server.clock.advance(WINDOW_S * 1000);
    assert.equal((await get('/v1/models')).status, 200);
    assert.equal((await chat()).status, 200);
  });

  it('a missing or bad key is still 401, before any quota', async () => {
    const r = await f.server.call('GET', `/${f.projectId}/v1/models`, {});
    assert.equal(r.status, 401);
  });
});

describe('outside inference the X-RateLimit-* headers follow the binding rule: the key quota or the route limit', () => {
  let f: InferenceFixture;
  let endpointId = '';
  const get = (path: string, k: string): Promise<Res> =>
    f.server.call('GET', `/${f.projectId}${path}`, { key: k });
  const mk = async (quotaRequests: number, extra: Record<string, unknown> = {}) => {
    const r = await f.server.admin('POST', '/projects/inf/keys', {
      scopes: ['inference', 'management', 'execution'],
      quotaRequests,
      quotaWindow: WINDOW_S,
      ...extra,
    });
    assert.equal(r.status, 201, r.text);
    return String(r.body.key);
  };
  const limits = (r: Res) => [
    r.status,
    Number(r.headers['x-ratelimit-limit']),
    Number(r.headers['x-ratelimit-remaining']),
  ];

  before(async () => {
    f = await inferenceFixture({ tier: 'self_hosted' });
    // The endpoint's record (its id, for a key bound to it): a PATCH changing nothing.
    const e = await f.server.admin('PATCH', '/projects/inf/endpoints/chat', {});
    assert.equal(e.status, 200, e.text);
    endpointId = String(e.body.id);
  });
  after(() => f.close());

  // Routes with the management limit (counted with the quota, or after it), and
  // routes with none (model listing, keys, budget alerts, execution).
  const routes = [
    '/v1/files',
    '/chat/v1/batches',
    '/chat/v1/chat/completions',
    '/v1/webhooks',
    '/v1/slos',
    '/v1/models',
    '/v1/keys',
    '/v1/budget_alerts',
    '/v1/exec/tools',
  ];
  for (const path of routes) {
    it(`${path}: a key with quota 3 sees limit 3, remaining 2, 1, 0, then a 429 with Reset = Retry-After`, async () => {
      f.server.clock.advance(WINDOW_S * 1000); // the project's management limit starts afresh
      const key = await mk(3);
      const seen: number[][] = [];
      for (let i = 0; i < 3; i++) seen.push(limits(await get(path, key)));
      assert.deepEqual(seen, [
        [200, 3, 2],
        [200, 3, 1],
        [200, 3, 0],
      ]);
      const r = await get(path, key);
      assert.deepEqual(limits(r), [429, 3, 0]);
      assert.equal(r.headers['x-ratelimit-reset'], r.headers['retry-after']);
      assert.equal(r.headers['retry-after'], String(WINDOW_S));
    });
  }

  it('the management limit binds when it is tighter, and its 429s spend no quota unit', async () => {
    f.server.clock.advance(WINDOW_S * 1000);
    const key = await mk(100);
    for (let i = 0; i < 60; i++) {
      const r = await get('/v1/files', key);
      assert.deepEqual(limits(r), [200, 60, 59 - i], `request ${i + 1}`);
    }
    for (let i = 0; i < 5; i++) {
      const r = await get('/v1/files', key);
      assert.deepEqual(limits(r), [429, 60, 0]);
      assert.equal(r.headers['x-ratelimit-reset'], r.headers['retry-after']);
    }
    // 60 admitted, 5 refused by the management limit: the quota spent 60, and the
    // model listing (no management limit) now spends the 61st.
    assert.deepEqual(limits(await get('/v1/models', key)), [200, 100, 39]);
  });

  it('a request refused by the endpoint binding spends no quota unit', async () => {
    f.server.clock.advance(WINDOW_S * 1000);
    const key = await mk(3, { endpointId });
    // The project-level alias names no endpoint: 403 for a bound key; an unknown one: 404.
    for (let i = 0; i < 3; i++) {
      assert.equal((await get('/v1/files', key)).status, 403);
      assert.equal((await get('/nope/v1/files', key)).status, 404);
    }
    assert.deepEqual(limits(await get('/chat/v1/files', key)), [200, 3, 2]);
  });
  it('the MCP server and the broker route send the quota headers on every answer, not only on the 429', async () => {
    f.server.clock.advance(WINDOW_S * 1000);
    const key = await mk(3);
    const mcp = () =>
      http('POST', `${f.server.url}/${f.projectId}/v1/mcp`, {
        auth: `Bearer ${key}`,
        headers: { accept: 'application/json, text/event-stream' },
        body: {
          jsonrpc: '2.0',
          id: 1,
          method: 'initialize',
          params: {
            protocolVersion: '2025-03-26',
            capabilities: {},
            clientInfo: { name: 'quota-test', version: '1' },
          },
        },
      });
    assert.deepEqual(limits(await mcp()), [200, 3, 2]);
    assert.deepEqual(limits(await mcp()), [200, 3, 1]);
    // No transport on this router: 503, still with the quota it spent.
    assert.deepEqual(limits(await get('/v1/exec/broker', key)), [503, 3, 0]);
    assert.deepEqual(limits(await mcp()), [429, 3, 0]);
  });

  it('a key lacking the scope of the broker route gets 403 every time and spends no quota unit', async () => {
    f.server.clock.advance(WINDOW_S * 1000);
    const r0 = await f.server.admin('POST', '/projects/inf/keys', {
      scopes: ['inference'],
      quotaRequests: 2,
      quotaWindow: WINDOW_S,
    });
    assert.equal(r0.status, 201, r0.text);
    const key = String(r0.body.key);
    for (let i = 0; i < 3; i++) {
      const r = await get('/v1/exec/broker', key);
      assert.equal(r.status, 403, r.text);
      assert.equal((r.body.error as Record<string, unknown>).code, 'scope_insufficient');
    }
    assert.deepEqual(limits(await get('/v1/models', key)), [200, 2, 1]);
  });
});
