/**
 * The per-key quota is part of the auth layer (spec, "API keys (request boundary)":
 * 200 needs "within quota", 429 is "Quota exhausted; Retry-After gives seconds to
 * wait"): every request authenticated by the key counts, inference or not, in one
 * rolling window, on the fake clock. Other keys of the project have their own.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { inferenceFixture, type InferenceFixture } from '../support/inference.js';
import type { Res } from '../support/harness.js';

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
