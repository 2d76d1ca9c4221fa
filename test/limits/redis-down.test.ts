/**
 * Redis unreachable: limits fail open by default (requests flow, a log line and
 * a metric say so) or closed with SWITCHYARD_LIMITS_FAIL=closed (503
 * `unavailable`); nothing crashes.
 */
import assert from 'node:assert/strict';
import { afterEach, describe, it } from 'node:test';
import { inferenceFixture, postChat, type InferenceFixture } from '../support/inference.js';

const DEAD_REDIS = 'redis://127.0.0.1:1';

describe('limits when Redis is unreachable', () => {
  let f: InferenceFixture;
  afterEach(() => f.close());

  const ask = () => postChat(f, { max_tokens: 2 });

  it('fail open: requests are served, with a log line and a metric', async () => {
    f = await inferenceFixture({ env: { REDIS_URL: DEAD_REDIS } });
    for (let i = 0; i < 3; i++) {
      const r = await ask();
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('ratelimit-limit'), null);
      await r.arrayBuffer();
    }
    const metrics = await (await fetch(`${f.server.url}/metrics`)).text();
    assert.match(
      metrics,
      /switchyard_limiter_decisions_total\{scope="inference",outcome="error"\} 3/,
    );
    assert.ok(f.server.logs.some((l) => l.includes('rate limiter unavailable')));
  });

  it('fail closed: 503 unavailable with Retry-After', async () => {
    f = await inferenceFixture({
      env: { REDIS_URL: DEAD_REDIS, SWITCHYARD_LIMITS_FAIL: 'closed' },
    });
    const r = await ask();
    assert.equal(r.status, 503);
    assert.equal(r.headers.get('retry-after'), '1');
    const body = (await r.json()) as { error: { code: string } };
    assert.equal(body.error.code, 'unavailable');
  });
});
