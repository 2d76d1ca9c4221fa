/**
 * The rate-limit headers of the chat route as a client reads them (docs/LIMITS.md,
 * "Headers and refusals"), over HTTP on the fake clock: one reading for every rule
 * (Limit = the most Remaining can be, Remaining = admissions possible now, Reset =
 * seconds until Remaining is back to Limit), and on a 429 the headers describe the
 * refusing rule, with Remaining 0 and Reset equal to Retry-After.
 */
import assert from 'node:assert/strict';
import { afterEach, describe, it } from 'node:test';
import {
  inferenceFixture,
  type InferenceFixture,
  inferenceKey,
  postChat,
} from '../support/inference.js';

interface Limited {
  status: number;
  limit: number;
  remaining: number;
  reset: number;
  retryAfter: number | null;
}

async function chat(f: InferenceFixture, key: string): Promise<Limited> {
  const r = await postChat(f, { max_tokens: 2 }, undefined, key);
  const body = (await r.json()) as { error?: { retry_after?: number } };
  const num = (name: string) => Number(r.headers.get(name));
  // The RateLimit-* headers and their X- twins always say the same.
  for (const h of ['limit', 'remaining', 'reset']) {
    assert.equal(r.headers.get(`ratelimit-${h}`), r.headers.get(`x-ratelimit-${h}`), h);
  }
  const retryAfter = r.headers.get('retry-after');
  if (r.status === 429) assert.equal(body.error?.retry_after, Number(retryAfter));
  return {
    status: r.status,
    limit: num('x-ratelimit-limit'),
    remaining: num('x-ratelimit-remaining'),
    reset: num('x-ratelimit-reset'),
    retryAfter: retryAfter === null ? null : Number(retryAfter),
  };
}

describe('rate-limit headers on the chat route', () => {
  let f: InferenceFixture;
  afterEach(() => f.close());

  it('tier rule (free: 64/min + 32, GCRA): Limit is burst + 1, Remaining counts down to 0, Reset is until the bucket is full; a 429 has Reset = Retry-After', async () => {
    f = await inferenceFixture({ tier: 'free' });
    const key = await inferenceKey(f, { quotaRequests: 100_000 });
    // A fresh bucket admits 33 at once: the first answer says 32 more can follow now,
    // and the bucket is full again one emission interval (937.5 ms) later.
    const first = await chat(f, key);
    assert.deepEqual(first, { status: 200, limit: 33, remaining: 32, reset: 1, retryAfter: null });
    let last: Limited = first;
    for (let i = 1; i < 33; i++) {
      last = await chat(f, key);
      assert.equal(last.status, 200);
      assert.equal(last.limit, 33);
      assert.equal(last.remaining, 32 - i, `request ${i + 1}`);
      assert.ok(last.remaining <= last.limit);
    }
    // 33 admitted: full again after 33 intervals (30.9375 s).
    assert.deepEqual(last, { status: 200, limit: 33, remaining: 0, reset: 31, retryAfter: null });
    // The 34th is refused until the next interval ends; Reset says the same as Retry-After.
    const refused = await chat(f, key);
    assert.deepEqual(refused, { status: 429, limit: 33, remaining: 0, reset: 1, retryAfter: 1 });
    f.server.clock.advance(937);
    assert.equal((await chat(f, key)).status, 429);
    f.server.clock.advance(1);
    const next = await chat(f, key);
    assert.equal(next.status, 200);
    assert.equal(next.remaining, 0);
    // Reset seconds after an answer, Remaining is back to Limit: 33 pass at once again.
    f.server.clock.advance(next.reset * 1000);
    for (let i = 0; i < 33; i++) assert.equal((await chat(f, key)).status, 200, `burst ${i + 1}`);
    assert.equal((await chat(f, key)).status, 429);
  });

  it('a stream and a 400 after authentication carry the headers too; the warning only below 20 %', async () => {
    f = await inferenceFixture({ tier: 'free' });
    const key = await inferenceKey(f, { quotaRequests: 100_000 });
    const headersOf = (r: Response) => ({
      limit: r.headers.get('x-ratelimit-limit'),
      remaining: r.headers.get('x-ratelimit-remaining'),
      warning: r.headers.get('x-ratelimit-warning'),
    });
    const streamed = await postChat(f, { max_tokens: 2, stream: true }, undefined, key);
    assert.equal(streamed.status, 200);
    await streamed.text();
    assert.deepEqual(headersOf(streamed), { limit: '33', remaining: '32', warning: null });
    const bad = await postChat(f, { temperature: 9 }, undefined, key);
    assert.equal(bad.status, 400);
    await bad.text();
    assert.deepEqual(headersOf(bad), { limit: '33', remaining: '31', warning: null });
    // 33 * 0.2 = 6.6: Remaining 7 is not below it, 6 is.
    for (let i = 0; i < 24; i++) assert.equal((await chat(f, key)).status, 200);
    const seven = await postChat(f, { max_tokens: 2 }, undefined, key);
    await seven.text();
    assert.deepEqual(headersOf(seven), {
      limit: '33',
      remaining: '6',
      warning: 'approaching_limit',
    });
  });

  it("a key quota's 429 (rolling window) has Reset = Retry-After: the next admission, not the window's end", async () => {
    f = await inferenceFixture({ tier: 'self_hosted' });
    const key = await inferenceKey(f, { quotaRequests: 3, quotaWindow: 60 });
    const seen: Limited[] = [];
    for (let i = 0; i < 3; i++) {
      seen.push(await chat(f, key));
      f.server.clock.advance(10_000);
    }
    // Admitted at 0, 10 and 20 s: each answer's Reset is until its own admission expires.
    assert.deepEqual(
      seen.map((r) => [r.status, r.limit, r.remaining, r.reset]),
      [
        [200, 3, 2, 60],
        [200, 3, 1, 60],
        [200, 3, 0, 60],
      ],
    );
    // At 30 s: the first admission frees up at 60 s, so both say 30.
    const refused = await chat(f, key);
    assert.deepEqual(refused, { status: 429, limit: 3, remaining: 0, reset: 30, retryAfter: 30 });
    f.server.clock.advance(30_000 - 1);
    assert.equal((await chat(f, key)).status, 429);
    f.server.clock.advance(1);
    assert.equal((await chat(f, key)).status, 200);
  });

  it('a tokens-per-minute refusal reports that rule (Remaining 0, Reset = Retry-After), and Retry-After is the exact wait rounded up', async () => {
    f = await inferenceFixture({ tier: 'cpu' });
    const patched = await f.server.admin('PATCH', '/projects/inf/endpoints/chat', {
      max_tokens_per_minute: 20,
    });
    assert.equal(patched.status, 200, patched.text);
    const key = await inferenceKey(f, { quotaRequests: 1000 });
    // Each request uses 10-19 tokens (the inference tests check it): two reach 20.
    const a = await chat(f, key);
    assert.equal(a.status, 200);
    // Admitted: the binding request rule (the cpu tier: 128/min + 64, so 65 at once).
    assert.deepEqual([a.limit, a.remaining], [65, 64]);
    assert.equal((await chat(f, key)).status, 200);
    const t = await chat(f, key);
    assert.equal(t.status, 429);
    // The tokens-per-minute rule refused: its numbers (tokens), not the tier's.
    assert.equal(t.limit, 20);
    assert.equal(t.remaining, 0);
    assert.equal(t.reset, t.retryAfter);
    // Tokens count in 60 ms buckets, each until its bucket's end + 60 s: the wait is
    // 60 s to 60.06 s, so Retry-After is 60 or 61 (a ceiling), and never too long:
    // one second before it the endpoint still refuses, at it the endpoint admits.
    const wait = t.retryAfter!;
    assert.ok(wait === 60 || wait === 61, `Retry-After ${wait}`);
    f.server.clock.advance((wait - 1) * 1000);
    const early = await chat(f, key);
    assert.deepEqual(
      [early.status, early.limit, early.reset, early.retryAfter],
      [429, 20, 1, 1],
      'one second early',
    );
    f.server.clock.advance(1000);
    assert.equal((await chat(f, key)).status, 200);
  });
});
