/**
 * Failover before the first byte: a worker that refuses connections or fails
 * with 5xx before answering is skipped for another of the same (model, tier);
 * after three failures its breaker opens for 5 s, then one request probes it.
 * A worker that fails after streaming started is not retried (tested in
 * timeouts.test.ts). Saturation gives 429 `capacity_exceeded`.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { clockSleep, startSimWorker, type SimWorker } from '../../src/workers/sim/index.js';
import { startTestServer, type TestServer } from '../support/harness.js';
import { listenWorker } from '../support/fake-worker.js';

describe('failover between workers', () => {
  let s: TestServer;
  let good: SimWorker;
  let flaky: SimWorker;
  let client: OpenAI;
  before(async () => {
    s = await startTestServer({ env: { SWITCHYARD_ROUTE_CACHE_TTL_MS: '0' } });
    good = await startSimWorker({ model: 'fm' });
    flaky = await startSimWorker({ model: 'fm' });
    await s.admin('POST', '/models', { name: 'fm', context_window: 4096 });
    await s.admin('POST', '/workers', { model: 'fm', tier: 'gpu', url: flaky.url, id: 'flaky' });
    await s.admin('POST', '/workers', { model: 'fm', tier: 'gpu', url: good.url, id: 'good' });
    // A worker of another tier must never be used by a gpu endpoint.
    await s.admin('POST', '/workers', { model: 'fm', tier: 'cpu', url: good.url, id: 'cpu-only' });
    const p = await s.admin('POST', '/projects', { slug: 'fo', name: 'FO' });
    await s.admin('POST', '/projects/fo/endpoints', {
      slug: 'chat',
      name: 'C',
      model: 'fm',
      tier: 'gpu',
    });
    const k = await s.admin('POST', '/projects/fo/keys', { quotaRequests: 10_000 });
    client = new OpenAI({
      baseURL: `${s.url}/${String(p.body.id)}/chat/v1`,
      apiKey: String(k.body.key),
      maxRetries: 0,
    });
  });
  after(async () => {
    await s.close();
    await good.close();
    await flaky.close().catch(() => undefined);
  });

  const ask = () =>
    client.chat.completions
      .create({ model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 })
      .withResponse();

  it('a 5xx before any byte fails over to the other worker; no request fails', async () => {
    flaky.setFailMode({ kind: 'status', status: 503 });
    const served = new Set<string>();
    for (let i = 0; i < 6; i++) {
      const { response } = await ask();
      served.add(response.headers.get('x-service-worker-id')!);
    }
    assert.deepEqual([...served], ['good']);
    assert.ok(flaky.stats().injectedFailures >= 1);
    // Three failures opened the breaker: the flaky worker is not even tried now.
    assert.equal(s.services.pool.isOpen('flaky'), true);
    const before = flaky.stats().httpRequests;
    for (let i = 0; i < 4; i++) await ask();
    assert.equal(flaky.stats().httpRequests, before);
  });

  it('after the cool-down one request probes; a success closes the breaker', async () => {
    flaky.setFailMode(null);
    s.clock.advance(5000);
    const seen = new Set<string>();
    for (let i = 0; i < 6; i++)
      seen.add((await ask()).response.headers.get('x-service-worker-id')!);
    assert.ok(seen.has('flaky'), 're-admitted after recovering');
    assert.equal(s.services.pool.isOpen('flaky'), false);
  });

  it('a worker that is down (connection refused) is skipped', async () => {
    await flaky.close();
    for (let i = 0; i < 4; i++) {
      const { response } = await ask();
      assert.equal(response.headers.get('x-service-worker-id'), 'good');
    }
  });
});

describe('capacity', () => {
  let s: TestServer;
  let w: SimWorker;
  after(async () => {
    await s.close();
    await w.close();
  });

  it('all workers saturated: 429 capacity_exceeded with Retry-After', async () => {
    s = await startTestServer({
      env: { SWITCHYARD_WORKER_MAX_INFLIGHT: '1', SWITCHYARD_ROUTER_QUEUE_DEPTH: '0' },
    });
    const { clockSleep } = await import('../../src/workers/sim/index.js');
    w = await startSimWorker({
      model: 'cm',
      ttftMs: 10_000,
      sleep: clockSleep(s.clock),
      clock: s.clock,
    });
    await s.admin('POST', '/models', { name: 'cm', context_window: 4096 });
    await s.admin('POST', '/workers', { model: 'cm', tier: 'gpu', url: w.url });
    const p = await s.admin('POST', '/projects', { slug: 'cap', name: 'Cap' });
    await s.admin('POST', '/projects/cap/endpoints', {
      slug: 'chat',
      name: 'C',
      model: 'cm',
      tier: 'gpu',
    });
    const k = await s.admin('POST', '/projects/cap/keys', {});
    const url = `${s.url}/${String(p.body.id)}/chat/v1/chat/completions`;
    const post = () =>
      fetch(url, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${String(k.body.key)}`,
          'content-type': 'application/json',
        },
        body: JSON.stringify({
          model: 'x',
          messages: [{ role: 'user', content: 'hi' }],
          max_tokens: 2,
        }),
        signal: AbortSignal.timeout(20_000),
      });
    const first = post();
    while (w.stats().received < 1) await new Promise((r) => setTimeout(r, 5));
    const second = await post();
    assert.equal(second.status, 429);
    assert.equal(second.headers.get('retry-after'), '1');
    const body = (await second.json()) as { error: Record<string, unknown> };
    assert.equal(body.error.code, 'capacity_exceeded');
    // Every 429 carries what rate_limit_exceeded carries (spec, Errors → Envelope).
    assert.equal(body.error.retry_after, 1);
    const strategy = body.error.retry_strategy as Record<string, unknown>;
    assert.deepEqual(Object.keys(strategy).sort(), [
      'initial_delay_ms',
      'jitter',
      'max_delay_ms',
      'multiplier',
      'type',
    ]);
    assert.equal(strategy.type, 'exponential_backoff');
    assert.equal(strategy.initial_delay_ms, 1000);
    s.clock.advance(10_000);
    // The sim's per-token sleeps run on the fake clock too: keep it ticking.
    let done = false;
    void first.finally(() => (done = true));
    while (!done) {
      s.clock.advance(1);
      await new Promise((r) => setTimeout(r, 1));
    }
    assert.equal((await first).status, 200);
  });
});

describe('a half-open probe that ends without a verdict', () => {
  let s: TestServer;
  let good: SimWorker;
  let flaky: SimWorker;
  let client: OpenAI;
  before(async () => {
    s = await startTestServer({ env: { SWITCHYARD_ROUTE_CACHE_TTL_MS: '0' } });
    good = await startSimWorker({ model: 'pm' });
    flaky = await startSimWorker({ model: 'pm' });
    await s.admin('POST', '/models', { name: 'pm', context_window: 4096 });
    await s.admin('POST', '/workers', { model: 'pm', tier: 'gpu', url: flaky.url, id: 'flaky' });
    await s.admin('POST', '/workers', { model: 'pm', tier: 'gpu', url: good.url, id: 'good' });
    const p = await s.admin('POST', '/projects', { slug: 'pr', name: 'PR' });
    await s.admin('POST', '/projects/pr/endpoints', {
      slug: 'chat',
      name: 'C',
      model: 'pm',
      tier: 'gpu',
    });
    const k = await s.admin('POST', '/projects/pr/keys', { quotaRequests: 10_000 });
    client = new OpenAI({
      baseURL: `${s.url}/${String(p.body.id)}/chat/v1`,
      apiKey: String(k.body.key),
      maxRetries: 0,
    });
  });
  after(async () => {
    await s.close();
    await good.close();
    await flaky.close();
  });

  const ask = async () =>
    (
      await client.chat.completions
        .create({ model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 })
        .withResponse()
    ).response.headers.get('x-service-worker-id')!;

  it('a probe answered 429 (saturated, neither success nor failure) lets a later request probe again', async () => {
    flaky.setFailMode({ kind: 'status', status: 503 });
    for (let i = 0; i < 6; i++) assert.equal(await ask(), 'good');
    assert.equal(s.services.pool.isOpen('flaky'), true);
    s.clock.advance(5000);
    // The probe finds the worker saturated: the request fails over to the other worker.
    flaky.setFailMode({ kind: 'status', status: 429 });
    const probed = flaky.stats().httpRequests;
    for (let i = 0; i < 4; i++) assert.equal(await ask(), 'good');
    assert.ok(flaky.stats().httpRequests > probed, 'probed, answered 429');
    // The worker is fine again: once the cool-down has passed, another request probes it.
    flaky.setFailMode(null);
    s.clock.advance(60_000);
    const seen = new Set<string>();
    for (let i = 0; i < 8; i++) seen.add(await ask());
    assert.ok(seen.has('flaky'), 'the worker is probed again and re-admitted');
    assert.equal(s.services.pool.isOpen('flaky'), false);
  });
});

/** A worker that holds every completion it gets until `reset()` drops their connections. */
async function hangingWorker() {
  const held: Socket[] = [];
  const server = http.createServer((req, res) => {
    req.resume();
    if (req.method !== 'POST') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ object: 'list', data: [] }));
      return;
    }
    held.push(req.socket);
  });
  return {
    ...(await listenWorker(server)),
    held: () => held.length,
    reset: () => {
      for (const s of held.splice(0)) s.resetAndDestroy();
    },
  };
}

describe('what the scorer learns from a request that failed over', () => {
  let s: TestServer;
  let hang: Awaited<ReturnType<typeof hangingWorker>>;
  let good: SimWorker;
  after(async () => {
    await s.close();
    await good.close();
    await hang.close();
  });

  it('the worker that answered is not charged with the time the failed one took', async () => {
    s = await startTestServer({ env: { SWITCHYARD_ROUTE_CACHE_TTL_MS: '0' } });
    hang = await hangingWorker();
    good = await startSimWorker({
      model: 'lm',
      ttftMs: 0,
      tpotMs: 0,
      prefillMsPerToken: 0,
      sleep: clockSleep(s.clock),
      clock: s.clock,
    });
    await s.admin('POST', '/models', { name: 'lm', context_window: 4096 });
    await s.admin('POST', '/workers', { model: 'lm', tier: 'gpu', url: hang.url, id: 'a-hang' });
    await s.admin('POST', '/workers', { model: 'lm', tier: 'gpu', url: good.url, id: 'b-good' });
    const p = await s.admin('POST', '/projects', { slug: 'lr', name: 'LR' });
    await s.admin('POST', '/projects/lr/endpoints', {
      slug: 'chat',
      name: 'C',
      model: 'lm',
      tier: 'gpu',
    });
    const k = await s.admin('POST', '/projects/lr/keys', {});
    const res = fetch(`${s.url}/${String(p.body.id)}/chat/v1/chat/completions`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${String(k.body.key)}`,
        'content-type': 'application/json',
      },
      body: JSON.stringify({
        model: 'x',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 3,
        stream: true,
      }),
    });
    // Ties rotate from the first registered worker: the hanging one gets the request.
    while (hang.held() < 1) await new Promise((r) => setTimeout(r, 2));
    // It fails 10 s later, before any byte; the other worker answers at once.
    s.clock.advance(10_000);
    hang.reset();
    const r = await res;
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('x-service-worker-id'), 'b-good');
    assert.match(await r.text(), /\[DONE\]/);
    const learned = s.services.pool.scorer.snapshot().find((w) => w.workerId === 'b-good');
    assert.ok(learned?.msPerToken !== undefined, 'the answer was learned from');
    assert.ok(
      learned.msPerToken < 1,
      `b-good learned ${learned.msPerToken} ms per token for a first token it sent at once`,
    );
  });
});

describe('a worker that breaks off its own 5xx answer', () => {
  let s: TestServer;
  let bad: http.Server;
  let good: SimWorker;
  let hits = 0;
  after(async () => {
    await s.close();
    await good.close();
    bad.closeAllConnections();
    bad.close();
  });

  it('is failed over like any 5xx before the first byte', async () => {
    s = await startTestServer({ env: { SWITCHYARD_ROUTE_CACHE_TTL_MS: '0' } });
    bad = http.createServer((req, res) => {
      req.resume();
      if (req.method !== 'POST') {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ object: 'list', data: [] }));
        return;
      }
      hits++;
      // Headers and the start of an error body, then the connection is reset.
      res.writeHead(503, { 'content-type': 'application/json', 'content-length': '200' });
      res.write('{"error": {"message": "overl');
      setImmediate(() => req.socket.resetAndDestroy());
    });
    bad.listen(0, '127.0.0.1');
    await once(bad, 'listening');
    good = await startSimWorker({ model: 'bm' });
    const badUrl = `http://127.0.0.1:${(bad.address() as AddressInfo).port}/v1`;
    await s.admin('POST', '/models', { name: 'bm', context_window: 4096 });
    await s.admin('POST', '/workers', { model: 'bm', tier: 'gpu', url: badUrl, id: 'a-bad' });
    await s.admin('POST', '/workers', { model: 'bm', tier: 'gpu', url: good.url, id: 'b-good' });
    const p = await s.admin('POST', '/projects', { slug: 'bb', name: 'BB' });
    await s.admin('POST', '/projects/bb/endpoints', {
      slug: 'chat',
      name: 'C',
      model: 'bm',
      tier: 'gpu',
    });
    const k = await s.admin('POST', '/projects/bb/keys', {});
    const client = new OpenAI({
      baseURL: `${s.url}/${String(p.body.id)}/chat/v1`,
      apiKey: String(k.body.key),
      maxRetries: 0,
    });
    for (const stream of [false, true]) {
      const before = hits;
      const { response } = await client.chat.completions
        .create({ model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, stream })
        .withResponse();
      assert.equal(response.status, 200);
      assert.equal(response.headers.get('x-service-worker-id'), 'b-good');
      assert.equal(hits, before + 1, 'tried the broken worker first');
      if (stream) await response.text();
    }
  });
});
