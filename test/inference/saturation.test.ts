/**
 * Saturation answers: a worker that answers 429 is saturated, not broken, so the
 * request goes to another worker of the endpoint's pool; with none free the client
 * gets 429 `capacity_exceeded` with the worker's `Retry-After` (else 1). Every 429
 * carries `Retry-After`, `retry_after` and `retry_strategy` (spec, Errors → Envelope),
 * the same fields as the rate limits'; the router's own (its workers all busy) is in
 * failover.test.ts.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import { startSimWorker, type SimWorker } from '../../src/workers/sim/index.js';
import { startTestServer, type TestServer } from '../support/harness.js';
import { listenWorker } from '../support/fake-worker.js';

const RETRY_STRATEGY_KEYS = ['initial_delay_ms', 'jitter', 'max_delay_ms', 'multiplier', 'type'];

/** An OpenAI-compatible worker that is always saturated: 429 to every completion. */
async function saturatedWorker() {
  const state = { hits: 0, retryAfter: '7' as string | null };
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.method !== 'POST') {
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.end('');
        return;
      }
      state.hits++;
      const headers: Record<string, string> = { 'content-type': 'application/json' };
      if (state.retryAfter !== null) headers['retry-after'] = state.retryAfter;
      res.writeHead(429, headers);
      res.end(
        JSON.stringify({
          error: { message: 'Too many requests', type: 'rate_limit_error', code: 429 },
        }),
      );
    });
  });
  return {
    ...(await listenWorker(server)),
    state,
  };
}

interface Answer {
  status: number;
  headers: Headers;
  text: string;
  error: Record<string, unknown> | undefined;
}

async function chat(url: string, key: string, body: Record<string, unknown>): Promise<Answer> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'x', messages: [{ role: 'user', content: 'hi' }], ...body }),
    signal: AbortSignal.timeout(20_000),
  });
  const text = await res.text();
  let error: Record<string, unknown> | undefined;
  try {
    error = (JSON.parse(text) as { error?: Record<string, unknown> }).error;
  } catch {
    error = undefined;
  }
  return { status: res.status, headers: res.headers, text, error };
}

function assertRetryFields(a: Answer, seconds: number): void {
  assert.equal(a.headers.get('retry-after'), String(seconds));
  assert.equal(a.error?.retry_after, seconds);
  const strategy = a.error?.retry_strategy as Record<string, unknown> | undefined;
  assert.ok(strategy, `no retry_strategy in ${a.text}`);
  assert.deepEqual(Object.keys(strategy).sort(), RETRY_STRATEGY_KEYS);
  assert.equal(strategy.type, 'exponential_backoff');
  assert.equal(strategy.initial_delay_ms, seconds * 1000);
}

describe('a worker answering 429', () => {
  let s: TestServer;
  let busy: Awaited<ReturnType<typeof saturatedWorker>>;
  let good: SimWorker;
  let url: string;
  let key: string;
  before(async () => {
    s = await startTestServer({ env: { SWITCHYARD_ROUTE_CACHE_TTL_MS: '0' } });
    busy = await saturatedWorker();
    good = await startSimWorker({ model: 'sm' });
    await s.admin('POST', '/models', { name: 'sm', context_window: 4096 });
    await s.admin('POST', '/workers', { model: 'sm', tier: 'gpu', url: busy.url, id: 'busy' });
    const p = await s.admin('POST', '/projects', { slug: 'sat', name: 'Sat' });
    await s.admin('POST', '/projects/sat/endpoints', {
      slug: 'chat',
      name: 'C',
      model: 'sm',
      tier: 'gpu',
    });
    const k = await s.admin('POST', '/projects/sat/keys', { quotaRequests: 10_000 });
    url = `${s.url}/${String(p.body.id)}/chat/v1/chat/completions`;
    key = String(k.body.key);
  });
  after(async () => {
    await s.close();
    await busy.close();
    await good.close();
  });

  it("no other worker free: 429 capacity_exceeded with the worker's Retry-After, streaming or not", async () => {
    for (const stream of [false, true, false, true]) {
      const a = await chat(url, key, { max_tokens: 2, stream });
      assert.equal(a.status, 429, a.text);
      assert.equal(a.error?.code, 'capacity_exceeded');
      assert.equal(a.error?.type, 'rate_limit_error');
      assertRetryFields(a, 7);
      // The limits admitted and counted it: their headers are an admission's.
      assert.ok(Number(a.headers.get('ratelimit-remaining')) > 0);
      assert.equal(a.headers.get('x-ratelimit-limit'), a.headers.get('ratelimit-limit'));
    }
    assert.equal(busy.state.hits, 4);
    // Saturated is not broken: four 429s in a row leave the worker's breaker closed.
    assert.equal(s.services.pool.isOpen('busy'), false);
  });

  it('a worker without Retry-After gives 1; an HTTP-date Retry-After is converted to seconds', async () => {
    busy.state.retryAfter = null;
    assertRetryFields(await chat(url, key, { max_tokens: 2 }), 1);
    busy.state.retryAfter = new Date(s.clock.now() + 30_000).toUTCString();
    assertRetryFields(await chat(url, key, { max_tokens: 2 }), 30);
    busy.state.retryAfter = '7';
  });

  it("a worker's Retry-After past an hour (or past any number) is passed on as an hour, an integer", async () => {
    for (const value of ['999999999999999999999999', '9'.repeat(400), '86400']) {
      busy.state.retryAfter = value;
      for (const stream of [false, true]) {
        const a = await chat(url, key, { max_tokens: 2, stream });
        assert.equal(a.status, 429, a.text);
        assertRetryFields(a, 3600);
        assert.equal((a.error?.retry_strategy as Record<string, unknown>).max_delay_ms, 3_600_000);
      }
    }
    busy.state.retryAfter = new Date(s.clock.now() + 10 * 86_400_000).toUTCString();
    assertRetryFields(await chat(url, key, { max_tokens: 2 }), 3600);
    busy.state.retryAfter = '7';
  });

  it('another worker of the pool takes the request; the client never sees the 429', async () => {
    await s.admin('POST', '/workers', { model: 'sm', tier: 'gpu', url: good.url, id: 'good' });
    const before = busy.state.hits;
    for (let i = 0; i < 20 && busy.state.hits < before + 2; i++) {
      const a = await chat(url, key, { max_tokens: 2, stream: i % 2 === 1 });
      assert.equal(a.status, 200, a.text);
      assert.equal(a.headers.get('x-service-worker-id'), 'good');
    }
    assert.ok(busy.state.hits >= before + 1, 'the saturated worker was never tried first');
  });
});
