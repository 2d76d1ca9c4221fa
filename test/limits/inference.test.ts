/**
 * Limits on chat completions, over HTTP on the fake clock: the tier's sliding
 * window with burst, the key quota taking precedence when tighter, the
 * endpoint's requests and tokens per minute, the headers, the 429 envelope and
 * the OpenAI SDK backing off on it.
 */
import assert from 'node:assert/strict';
import { after, afterEach, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import {
  inferenceFixture,
  inferenceKey,
  postChat,
  type InferenceFixture,
} from '../support/inference.js';

describe('tier limit: free is 64 per minute plus a burst of 32', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({ tier: 'free' });
  });
  after(() => f.close());

  it('admits burst + 1 at once, then 429 with Retry-After and the retry envelope', async () => {
    const key = await inferenceKey(f, { quotaRequests: 100_000 });
    const statuses: number[] = [];
    let last: Response | undefined;
    for (let i = 0; i < 34; i++) {
      last = await postChat(f, { max_tokens: 2 }, undefined, key);
      statuses.push(last.status);
      if (last.status === 200) await last.arrayBuffer();
    }
    assert.deepEqual(statuses.slice(0, 33), new Array(33).fill(200));
    assert.equal(statuses[33], 429);
    const res = last!;
    assert.equal(res.headers.get('retry-after'), '1');
    // Limit: what a full bucket admits at once (burst + 1); Reset: the Retry-After.
    assert.equal(res.headers.get('ratelimit-limit'), '33');
    assert.equal(res.headers.get('x-ratelimit-limit'), '33');
    assert.equal(res.headers.get('ratelimit-remaining'), '0');
    assert.equal(res.headers.get('ratelimit-reset'), '1');
    assert.equal(res.headers.get('x-ratelimit-warning'), 'approaching_limit');
    const body = (await res.json()) as { error: Record<string, unknown> };
    assert.equal(body.error.code, 'rate_limit_exceeded');
    assert.equal(body.error.type, 'rate_limit_error');
    assert.equal(body.error.retry_after, 1);
    assert.deepEqual(body.error.retry_strategy, {
      type: 'exponential_backoff',
      initial_delay_ms: 1000,
      max_delay_ms: 60_000,
      multiplier: 2,
      jitter: true,
    });
    // One emission interval (60 s / 64 = 937.5 ms) later, one more is admitted.
    f.server.clock.advance(937);
    assert.equal((await postChat(f, { max_tokens: 2 }, undefined, key)).status, 429);
    f.server.clock.advance(1);
    const ok = await postChat(f, { max_tokens: 2 }, undefined, key);
    assert.equal(ok.status, 200);
  });

  it('steady overload: every 60 s window admits at most 96 and about 64 once drained', async () => {
    f.server.clock.advance(10 * 60_000); // a quiet period refills the burst
    const key = await inferenceKey(f, { quotaRequests: 100_000 });
    const admitted: number[] = [];
    const start = f.server.clock.now();
    // 10x the tier rate for 4 minutes: one request every 93.75 ms -> every 94 ms.
    for (let t = 0; t < 4 * 60_000; t += 94) {
      f.server.clock.set(start + t);
      const r = await postChat(f, { max_tokens: 2 }, undefined, key);
      if (r.status === 200) admitted.push(t);
      await r.arrayBuffer();
    }
    // Any sliding window of 60 s holds at most limit + burst = 96.
    let maxInWindow = 0;
    for (let i = 0, j = 0; j < admitted.length; j++) {
      while (admitted[j]! - admitted[i]! >= 60_000) i++;
      maxInWindow = Math.max(maxInWindow, j - i + 1);
    }
    assert.ok(maxInWindow <= 96 && maxInWindow >= 95, `max in a window: ${maxInWindow}`);
    // After the burst is spent, each later minute admits the sustained 64 (±1).
    for (const m of [2, 3]) {
      const n = admitted.filter((t) => t >= m * 60_000 && t < (m + 1) * 60_000).length;
      assert.ok(Math.abs(n - 64) <= 1, `minute ${m}: ${n}`);
    }
  });
});

describe('per-key quota, endpoint limits', () => {
  let f: InferenceFixture;
  afterEach(() => f.close());

  it('a tighter key quota takes precedence and the headers reflect it', async () => {
    f = await inferenceFixture({ tier: 'cpu' });
    const key = await inferenceKey(f, { quotaRequests: 5, quotaWindow: 30 });
    for (let i = 0; i < 5; i++) {
      const r = await postChat(f, { max_tokens: 2 }, undefined, key);
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('ratelimit-limit'), '5');
      assert.equal(r.headers.get('ratelimit-remaining'), String(4 - i));
      await r.arrayBuffer();
    }
    const denied = await postChat(f, { max_tokens: 2 }, undefined, key);
    assert.equal(denied.status, 429);
    assert.equal(denied.headers.get('retry-after'), '30');
    assert.equal(denied.headers.get('ratelimit-limit'), '5');
    assert.equal(denied.headers.get('ratelimit-reset'), '30');
    f.server.clock.advance(30_000);
    assert.equal((await postChat(f, { max_tokens: 2 }, undefined, key)).status, 200);
    // Another key of the same project is not affected by this key's quota.
    const other = await inferenceKey(f, {});
    assert.equal((await postChat(f, { max_tokens: 2 }, undefined, other)).status, 200);
  });

  it("the endpoint's requests and tokens per minute", async () => {
    f = await inferenceFixture({ tier: 'self_hosted' });
    const ep = await f.server.admin('PATCH', '/projects/inf/endpoints/chat', {
      max_requests_per_minute: 3,
    });
    assert.equal(ep.status, 200);
    const key = await inferenceKey(f, { quotaRequests: 1000 });
    for (let i = 0; i < 3; i++)
      assert.equal((await postChat(f, { max_tokens: 2 }, undefined, key)).status, 200);
    const r = await postChat(f, { max_tokens: 2 }, undefined, key);
    assert.equal(r.status, 429);
    assert.equal(r.headers.get('ratelimit-limit'), '3');
    f.server.clock.advance(60_000);

    await f.server.admin('PATCH', '/projects/inf/endpoints/chat', {
      max_requests_per_minute: 1000,
      max_tokens_per_minute: 20,
    });
    const a = await postChat(f, { max_tokens: 2 }, undefined, key);
    assert.equal(a.status, 200);
    const used = ((await a.json()) as { usage: { total_tokens: number } }).usage.total_tokens;
    assert.ok(used >= 10 && used < 20, `tokens per request: ${used}`);
    assert.equal((await postChat(f, { max_tokens: 2 }, undefined, key)).status, 200);
    const t = await postChat(f, { max_tokens: 2 }, undefined, key);
    assert.equal(t.status, 429);
    assert.equal(
      ((await t.json()) as { error: { code: string } }).error.code,
      'rate_limit_exceeded',
    );
  });

  it('the OpenAI SDK backs off on Retry-After and then gives up with RateLimitError', async () => {
    f = await inferenceFixture({ tier: 'cpu' });
    const key = await inferenceKey(f, { quotaRequests: 1, quotaWindow: 1 });
    const client = new OpenAI({ baseURL: f.baseURL, apiKey: key, maxRetries: 2 });
    await client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'a' }],
    });
    const received = f.worker.stats().received;
    const started = Date.now();
    await assert.rejects(
      client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'b' }] }),
      (err: unknown) => {
        assert.ok(err instanceof OpenAI.RateLimitError);
        assert.equal(err.code, 'rate_limit_exceeded');
        return true;
      },
    );
    const elapsed = Date.now() - started;
    // Retry-After: 1 and two retries: the SDK waited about a second before each.
    assert.ok(elapsed >= 1900, `elapsed ${elapsed} ms`);
    assert.equal(f.worker.stats().received, received, 'refused requests never reach a worker');
  });
});
