/**
 * Issue #7, as a user sees it: an in-process router (fake clock) in front of
 * real `switchyard worker --engine sim` processes, two per endpoint, driven
 * through the `openai` SDK (no SDK retries) with mixed streaming and
 * non-streaming load, every request in flight.
 *
 * 1. One worker is SIGKILLed mid-load. No request fails that had not started
 *    streaming: every non-streaming request is answered (those on the dead
 *    worker fail over before their first byte), the only streams that fail are
 *    the dead worker's, each after content, with the `cancelled` SSE error, and
 *    every request sent after the kill is served by the survivor
 *    (`X-Service-Worker-ID`).
 * 2. The monitor's health checks (advanced on the fake clock) mark the dead
 *    worker unhealthy.
 * 3. The worker restarts on the same port (same URL): one good health check
 *    re-admits it, its breaker closes after the cool-down, requests reach it
 *    again, and the worker record and the router's /metrics show it healthy.
 *
 * 4. A worker killed while its streams are still in prefill (no token yet):
 *    nothing had reached their clients, so each fails over to the other worker
 *    and completes (chat.ts holds a stream's headers until its first token).
 *
 * Runs the built binary (`npm run build` first), like the other process tests.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import OpenAI, { APIError } from 'openai';
import { http, startTestServer, type TestServer } from '../support/harness.js';
import { spawnSwitchyard, type Spawned } from '../support/process.js';

/** No tier rate limit: the load is the point here, not the limits. */
const TIER = 'self_hosted';
const TPOT_MS = 20;
const SCRAPE_MS = 1000;
/** Tokens per answer under load: 3 s at 20 ms a token (dispatching the load takes 0.3-0.8 s). */
const LEN = 150;
const STREAMS = 32;
const UNARY = 32;
/** Endpoint slug → its model, its two workers and their extra sim flags. */
const ENDPOINTS = {
  chat: { model: 'kr-sim', workers: ['wa', 'wb'], sim: [] as string[] },
  prefill: { model: 'kr-ttft', workers: ['wc', 'wd'], sim: ['--ttft-ms', '1500'] },
};
type Slug = keyof typeof ENDPOINTS;

async function until(what: string, check: () => Promise<boolean> | boolean, ms = 10_000) {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) assert.fail(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

interface Outcome {
  i: number;
  stream: boolean;
  /** X-Service-Worker-ID; null when the request failed before its response. */
  worker: string | null;
  /** Content deltas received (streams), completion tokens (non-streaming). */
  tokens: number;
  done: boolean;
  error: unknown;
}

const describeError = (e: unknown) =>
  e instanceof APIError ? `${e.status ?? 'SSE'} ${e.code ?? ''}: ${e.message}` : String(e);

describe('a worker killed under load, re-admitted after it recovers', { timeout: 60_000 }, () => {
  let s: TestServer;
  const clients = new Map<Slug, OpenAI>();
  const procs = new Map<string, Spawned>();
  const urls = new Map<string, string>();
  const spawned: Spawned[] = [];
  const killAll = () => {
    for (const p of spawned) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  };

  /** Starts a sim worker process; port 0 picks one, a restart passes the one it had. */
  async function startWorker(slug: Slug, id: string, port: number): Promise<string> {
    const { model, sim } = ENDPOINTS[slug];
    const p = spawnSwitchyard(
      ['worker', '--engine', 'sim', '--port', String(port), '--model', model]
        .concat(['--tpot-ms', String(TPOT_MS)])
        .concat(sim),
      {},
    );
    spawned.push(p);
    procs.set(id, p);
    const url = (await p.waitFor(/serving (http:\/\/\S+\/v1)/, 15_000))[1]!;
    urls.set(id, url);
    return url;
  }

  /** SIGKILLs a worker process; resolves once it is gone (its sockets closed). */
  async function kill(id: string): Promise<void> {
    const p = procs.get(id)!;
    const exited = new Promise((r) => p.child.once('exit', r));
    p.child.kill('SIGKILL');
    await exited;
  }

  /** Advances the fake clock by whole monitor periods, letting each pass finish. */
  async function pass(periods = 1): Promise<void> {
    for (let i = 0; i < periods; i++) {
      s.clock.advance(SCRAPE_MS);
      await s.services.monitor.settled();
    }
  }

  async function workerStatus(id: string): Promise<unknown> {
    const r = await s.admin('GET', '/workers');
    assert.equal(r.status, 200, r.text);
    return (r.body.data as Array<Record<string, unknown>>).find((w) => w.id === id)?.status;
  }

  /** One of the router's per-worker gauges on /metrics, e.g. `switchyard_worker_healthy`. */
  async function gauge(name: string, id: string): Promise<number | null> {
    const text = (await http('GET', `${s.url}/metrics`)).text;
    const m = new RegExp(`^${name}\\{worker="${id}",[^}]*\\} (\\S+)$`, 'm').exec(text);
    return m ? Number(m[1]) : null;
  }

  /** Requests the sim worker itself is running (its own /metrics). */
  async function running(id: string): Promise<number> {
    const text = (await http('GET', urls.get(id)!.replace(/\/v1$/, '/metrics'))).text;
    return Number(/^switchyard_worker_requests_running(?:\{[^}]*\})? (\S+)$/m.exec(text)?.[1]);
  }

  /** Unique prompts: no prefix-cache affinity steers the choice of worker. */
  const messages = (i: number, len: number) => [
    { role: 'user' as const, content: `[sim:len=${len}] request ${i} ${randomUUID()}` },
  ];

  /** A streaming request read to its end; `live`, if given, gets its outcome as it goes. */
  async function stream(slug: Slug, i: number, len: number, live?: Outcome[]) {
    const o: Outcome = { i, stream: true, worker: null, tokens: 0, done: false, error: null };
    live?.push(o);
    try {
      const { data, response } = await clients
        .get(slug)!
        .chat.completions.create({ model: 'x', stream: true, messages: messages(i, len) })
        .withResponse();
      o.worker = response.headers.get('x-service-worker-id');
      for await (const chunk of data) {
        if (chunk.choices[0]?.delta?.content) o.tokens++;
      }
      o.done = true;
    } catch (err) {
      o.error = err;
    }
    return o;
  }

  async function unary(slug: Slug, i: number, len: number) {
    const o: Outcome = { i, stream: false, worker: null, tokens: 0, done: false, error: null };
    try {
      const { data, response } = await clients
        .get(slug)!
        .chat.completions.create({ model: 'x', messages: messages(i, len) })
        .withResponse();
      o.worker = response.headers.get('x-service-worker-id');
      o.tokens = data.usage?.completion_tokens ?? 0;
      o.done = true;
    } catch (err) {
      o.error = err;
    }
    return o;
  }

  /**
   * STREAMS + UNARY requests at once, by default S U U S S U U S… so that both
   * kinds land on both workers whatever order the router alternates them in
   * (S U S U… would put every stream on one worker under round-robin).
   * Resolves when the router has all of them in flight (its
   * `switchyard_worker_in_flight`) and `ready(streams)` holds (the streams'
   * outcomes so far).
   */
  async function load(
    slug: Slug,
    ready: (streams: Outcome[]) => boolean,
    streamAt = (i: number) => i % 4 === 0 || i % 4 === 3,
  ) {
    const live: Outcome[] = [];
    const all: Array<Promise<Outcome>> = [];
    for (let i = 0; i < STREAMS + UNARY; i++) {
      const isStream = streamAt(i);
      all.push(isStream ? stream(slug, i, LEN, live) : unary(slug, i, LEN));
    }
    const inFlight = async () => {
      let n = 0;
      for (const id of ENDPOINTS[slug].workers) {
        n += (await gauge('switchyard_worker_in_flight', id)) ?? 0;
      }
      return n;
    };
    const t0 = Date.now();
    await until('the whole load in flight', async () => (await inFlight()) === all.length);
    dispatchMs = Date.now() - t0;
    await until('the streams ready', () => ready(live));
    // Wrapped: an async function returning the promise itself would wait for it.
    return { outcomes: Promise.all(all) };
  }

  let dispatchMs = 0;

  /** `n` requests at once, half streams, half not, `len` tokens each. */
  const burst = (slug: Slug, base: number, n: number, len: number) =>
    Promise.all(
      Array.from({ length: n }, (_, i) =>
        i % 2 ? unary(slug, base + i, len) : stream(slug, base + i, len),
      ),
    );

  before(async () => {
    process.on('exit', killAll);
    s = await startTestServer({
      env: {
        SWITCHYARD_WORKER_SCRAPE_MS: String(SCRAPE_MS),
        SWITCHYARD_WORKER_FAILED_CHECKS: '3',
        LOG_LEVEL: 'info',
      },
    });
    const p = await s.admin('POST', '/projects', { slug: 'kr', name: 'KR' });
    assert.equal(p.status, 201, p.text);
    const k = await s.admin('POST', '/projects/kr/keys', { quotaRequests: 100_000 });
    assert.equal(k.status, 201, k.text);
    const starts: Array<Promise<string>> = [];
    for (const [slug, e] of Object.entries(ENDPOINTS) as Array<[Slug, (typeof ENDPOINTS)[Slug]]>) {
      for (const id of e.workers) starts.push(startWorker(slug, id, 0));
      const m = await s.admin('POST', '/models', { name: e.model, context_window: 4096 });
      assert.equal(m.status, 201, m.text);
      const r = await s.admin('POST', '/projects/kr/endpoints', {
        slug,
        name: slug,
        model: e.model,
        tier: TIER,
      });
      assert.equal(r.status, 201, r.text);
      clients.set(
        slug,
        new OpenAI({
          baseURL: `${s.url}/${String(p.body.id)}/${slug}/v1`,
          apiKey: String(k.body.key),
          maxRetries: 0,
          timeout: 20_000,
        }),
      );
    }
    await Promise.all(starts);
    for (const e of Object.values(ENDPOINTS)) {
      for (const id of e.workers) {
        const url = urls.get(id);
        const r = await s.admin('POST', '/workers', { model: e.model, tier: TIER, url, id });
        assert.equal(r.status, 201, r.text);
      }
    }
    s.services.monitor.start();
    await s.services.monitor.settled();
    for (const id of urls.keys()) assert.equal(await workerStatus(id), 'healthy');
    // Warm the router's key, endpoint and worker caches: the load is then all routing.
    for (const slug of clients.keys()) {
      for (const o of await burst(slug, -10, 4, 1)) assert.equal(o.error, null);
    }
  });

  after(async () => {
    process.off('exit', killAll);
    await s?.services.monitor.stop();
    await Promise.all(spawned.map((p) => p.stop('SIGKILL')));
    await s?.close();
  });

  it('SIGKILL mid-load: no request fails that had not started streaming; the survivor serves on', async (t) => {
    // Every stream has produced a few tokens: nothing is between dispatch and first token.
    const { outcomes } = await load('chat', (live) => live.every((o) => o.tokens >= 3));
    const runningOnVictim = await running('wa');
    await kill('wa');
    const sentAfter = await burst('chat', 1000, 20, 10);
    const during = await outcomes;

    const streams = during.filter((o) => o.stream);
    const unaries = during.filter((o) => !o.stream);
    const onA = streams.filter((o) => o.worker === 'wa');
    const onB = streams.filter((o) => o.worker === 'wb');
    assert.equal(onA.length + onB.length, STREAMS, 'every stream got its response headers');
    assert.ok(onA.length > 0 && onB.length > 0, `streams ${onA.length}/${onB.length}`);
    const unaryOnA = runningOnVictim - onA.length;
    assert.ok(unaryOnA > 0, `no non-streaming request was on the victim (${runningOnVictim})`);

    // Non-streaming: every one answered in full, by the survivor (the victim's failed over).
    for (const o of unaries) {
      assert.equal(o.error, null, `non-streaming ${o.i} failed: ${describeError(o.error)}`);
      assert.equal(o.worker, 'wb', `non-streaming ${o.i} answered by ${o.worker}`);
      assert.equal(o.tokens, LEN);
    }
    // Streams: the survivor's complete; the victim's end with `cancelled`, after content.
    for (const o of onB) {
      assert.equal(o.error, null, `stream ${o.i} on wb failed: ${describeError(o.error)}`);
      assert.equal(o.done, true);
      assert.equal(o.tokens, LEN);
    }
    for (const o of onA) {
      assert.ok(o.error instanceof APIError, `stream ${o.i} on wa: ${describeError(o.error)}`);
      assert.equal(o.error.code, 'cancelled', describeError(o.error));
      assert.ok(o.tokens >= 3 && o.tokens < LEN, `stream ${o.i}: ${o.tokens} tokens`);
    }
    // Sent after the kill: all served, all by the survivor.
    for (const o of sentAfter) {
      assert.equal(o.error, null, `request ${o.i} after the kill: ${describeError(o.error)}`);
      assert.equal(o.worker, 'wb', `request ${o.i} after the kill served by ${o.worker}`);
      assert.equal(o.done, true);
      assert.equal(o.tokens, 10);
    }
    // The connection failures opened the victim's breaker.
    assert.equal(await gauge('switchyard_worker_breaker_open', 'wa'), 1);
    const chunks = onA.map((o) => o.tokens);
    t.diagnostic(
      `${STREAMS + UNARY} requests in flight after ${dispatchMs} ms; ` +
        `wa killed running ${runningOnVictim} requests (${onA.length} streams, ${unaryOnA} ` +
        `non-streaming): its streams ended 'cancelled' after ${Math.min(...chunks)}-` +
        `${Math.max(...chunks)} tokens, its non-streaming requests failed over; ${onB.length} ` +
        `streams and all ${UNARY} non-streaming requests completed on wb; ` +
        `${sentAfter.length} requests sent after the kill all served by wb`,
    );
  });

  it('the health checks mark the dead worker unhealthy; requests go to the survivor', async () => {
    await pass(3);
    assert.equal(await workerStatus('wa'), 'unhealthy');
    assert.equal(await workerStatus('wb'), 'healthy');
    assert.equal(await gauge('switchyard_worker_healthy', 'wa'), 0);
    assert.equal(await gauge('switchyard_worker_healthy', 'wb'), 1);
    for (const o of await burst('chat', 2000, 6, 3)) {
      assert.equal(o.error, null, describeError(o.error));
      assert.equal(o.worker, 'wb');
    }
  });

  it('restarted on the same port, it is re-admitted and routed to again', async (t) => {
    const url = urls.get('wa')!;
    assert.equal(await startWorker('chat', 'wa', Number(new URL(url).port)), url, 'same URL');

    // One good health check re-admits it.
    await pass(1);
    assert.equal(await workerStatus('wa'), 'healthy');
    assert.equal(await gauge('switchyard_worker_healthy', 'wa'), 1);
    // The breaker the kill opened lets a probe through after its cool-down.
    let periods = 0;
    while ((await gauge('switchyard_worker_breaker_open', 'wa')) !== 0) {
      assert.ok(++periods <= 10, 'the breaker never closed');
      await pass(1);
    }

    // Concurrent rounds: the load spreads over both workers again.
    const served: Record<string, number> = { wa: 0, wb: 0 };
    for (let round = 0; round < 2; round++) {
      for (const o of await burst('chat', 3000 + 100 * round, 16, 20)) {
        assert.equal(o.error, null, `request ${o.i}: ${describeError(o.error)}`);
        assert.equal(o.tokens, 20);
        served[o.worker!]!++;
      }
    }
    assert.ok(served.wa! > 0, `nothing routed to the restarted worker: ${JSON.stringify(served)}`);
    await pass(1);
    assert.equal(await workerStatus('wa'), 'healthy');
    assert.equal(await gauge('switchyard_worker_healthy', 'wa'), 1);
    assert.equal(await gauge('switchyard_worker_breaker_open', 'wa'), 0);
    t.diagnostic(
      `re-admitted by 1 health check, breaker closed ${periods} period(s) later; ` +
        `the next 32 requests: ${served.wa} on wa, ${served.wb} on wb`,
    );
  });

  it('a worker killed before its streams produced a token: they fail over (no content had streamed)', async (t) => {
    // Workers with a 1.5 s time to first token; streams only, all in flight,
    // none of them has received anything yet (the router sends the stream's
    // headers with its first write): one worker is killed in their prefill.
    let live: Outcome[] = [];
    const { outcomes } = await load(
      'prefill',
      (l) => !!(live = l),
      () => true,
    );
    assert.ok(
      live.every((o) => o.worker === null && o.tokens === 0),
      'the kill must land before any stream has started',
    );
    await kill('wc');
    const during = await outcomes;
    const failed = during.filter((o) => o.error !== null);
    const onC = during.filter((o) => o.worker === 'wc').length;
    t.diagnostic(
      `wc killed with ${onC} of ${during.length} streams in prefill: ${failed.length} failed, ` +
        `${failed.filter((o) => o.tokens === 0).length} of them with no content ` +
        `(${[...new Set(failed.map((o) => describeError(o.error)))].join('; ')})`,
    );
    for (const o of failed) {
      const what = `${o.stream ? 'stream' : 'non-streaming'} ${o.i} on ${o.worker}`;
      assert.ok(o.stream && o.tokens > 0, `${what} failed after ${o.tokens} tokens`);
    }
  });
});
