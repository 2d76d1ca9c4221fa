/**
 * The worker scorer and the wait queue inside the live router, driven over HTTP
 * against real `sim` workers: prefix affinity with the workers' real
 * `cached_tokens`, the per-worker and per-endpoint metrics, `service_tier`
 * admission (flex stops at 85 % of the in-flight limit, priority may use 115 %),
 * the router's wait queue (order by tier, depth, time-out on the fake clock), and
 * the `priority` sent to a worker that orders its queue by it.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { setImmediate as tick } from 'node:timers/promises';
import { clockSleep, startSimWorker, type SimWorker } from '../../src/workers/sim/index.js';
import type { RouteHints } from '../../src/routing/pool.js';
import { http, startTestServer, type Res, type TestServer } from '../support/harness.js';

interface Setup {
  s: TestServer;
  workers: SimWorker[];
  url: string;
  key: string;
  endpointId: string;
}

async function setup(
  env: Record<string, string>,
  sims: Array<Parameters<typeof startSimWorker>[0]>,
  fakeClockSims = false,
): Promise<Setup> {
  const s = await startTestServer({ env });
  const workers: SimWorker[] = [];
  for (const o of sims) {
    workers.push(
      await startSimWorker({
        model: 'rm',
        contextWindow: 8192,
        ...(fakeClockSims ? { sleep: clockSleep(s.clock), clock: s.clock } : {}),
        ...o,
      }),
    );
  }
  const ok = (r: Res) => {
    assert.ok(r.status < 300, r.text);
    return r;
  };
  ok(await s.admin('POST', '/models', { name: 'rm', context_window: 8192 }));
  for (const [i, w] of workers.entries()) {
    // A sim ordering its queue by priority is registered as such (the operator's part).
    const policy = w.engine.options.schedulingPolicy;
    ok(
      await s.admin('POST', '/workers', {
        model: 'rm',
        tier: 'gpu',
        url: w.url,
        id: `w-${i}`,
        ...(policy === 'priority' ? { scheduling_policy: policy } : {}),
      }),
    );
  }
  const p = ok(await s.admin('POST', '/projects', { slug: 'rt', name: 'Routed' }));
  const e = ok(
    await s.admin('POST', '/projects/rt/endpoints', {
      slug: 'chat',
      name: 'C',
      model: 'rm',
      tier: 'gpu',
    }),
  );
  const k = ok(await s.admin('POST', '/projects/rt/keys', {}));
  return {
    s,
    workers,
    url: `${s.url}/${String(p.body.id)}/chat/v1/chat/completions`,
    key: String(k.body.key),
    endpointId: String(e.body.id),
  };
}

function chat(
  t: Setup,
  messages: Array<{ role: string; content: string }>,
  extra: Record<string, unknown> = {},
  headers: Record<string, string> = {},
): Promise<Res> {
  return http('POST', t.url, {
    auth: `Bearer ${t.key}`,
    body: { model: 'x', messages, max_tokens: 4, ...extra },
    headers,
  });
}

/** Advances the fake clock in steps until every promise settled (the sims sleep on it). */
async function drive<T>(
  clock: TestServer['clock'],
  ps: Array<Promise<T>>,
  stepMs = 1000,
): Promise<T[]> {
  let settled = false;
  const all = Promise.all(ps).finally(() => {
    settled = true;
  });
  for (let i = 0; i < 2000 && !settled; i++) {
    clock.advance(stepMs);
    await new Promise((r) => setTimeout(r, 2));
  }
  return all;
}

async function teardown(t: Setup | undefined): Promise<void> {
  if (!t) return;
  await t.s.close();
  for (const w of t.workers) await w.close();
}

/** Distinct, deterministic text of about `chars` characters. */
function text(seed: string, chars: number): string {
  let out = '';
  for (let i = 0; out.length < chars; i++) out += `${seed} line ${i}: the quick brown fox. `;
  return out;
}

describe('prefix affinity in the live router', () => {
  let t: Setup;
  before(async () => {
    t = await setup({}, [{}, {}]);
  });
  after(() => teardown(t));

  it("multi-turn chats stay on the worker holding their prefix; cached_tokens are the worker's", async () => {
    const sessions = ['alpha', 'bravo', 'charlie', 'delta'].map((name) => ({
      name,
      messages: [{ role: 'system', content: text(name, 6000) }] as Array<{
        role: string;
        content: string;
      }>,
      served: [] as string[],
      cached: [] as number[],
    }));
    for (let round = 0; round < 5; round++) {
      for (const sess of sessions) {
        sess.messages.push({ role: 'user', content: `${sess.name} question ${round}` });
        const r = await chat(t, sess.messages);
        assert.equal(r.status, 200, r.text);
        sess.served.push(String(r.headers['x-service-worker-id']));
        const usage = r.body.usage as { prompt_tokens_details: { cached_tokens: number } };
        sess.cached.push(usage.prompt_tokens_details.cached_tokens);
        const msg = (r.body.choices as Array<{ message: { content: string } }>)[0]!.message;
        sess.messages.push({ role: 'assistant', content: msg.content });
      }
    }
    for (const sess of sessions) {
      assert.equal(new Set(sess.served).size, 1, `${sess.name} moved: ${sess.served.join(',')}`);
      assert.equal(sess.cached[0], 0);
      for (const c of sess.cached.slice(1)) assert.ok(c >= 1000, `${sess.name}: cached ${c}`);
    }
    // Sessions without a cached prefix anywhere are spread, not piled on one worker.
    const used = new Set(sessions.map((x) => x.served[0]));
    assert.equal(used.size, 2);
  });

  it('round-robin would have lost the cache: a fresh worker reports no cached tokens', async () => {
    // The prefix of "alpha" is on one worker only: sent there it hits, elsewhere it does not.
    const sys = { role: 'system', content: text('alpha', 6000) };
    const r = await chat(t, [sys, { role: 'user', content: 'alpha question 0' }]);
    const on = String(r.headers['x-service-worker-id']);
    const other = t.workers[on === 'w-0' ? 1 : 0]!;
    const direct = await http('POST', `${other.url}/chat/completions`, {
      body: { model: 'rm', messages: [sys, { role: 'user', content: 'x' }], max_tokens: 1 },
    });
    const usage = direct.body.usage as { prompt_tokens_details: { cached_tokens: number } };
    assert.equal(usage.prompt_tokens_details.cached_tokens, 0);
  });

  it('per-worker and per-endpoint metrics: cached and prompt tokens, outcomes, chosen counts', async () => {
    const m = await http('GET', `${t.s.url}/metrics`);
    const value = (re: RegExp) => {
      let sum = 0;
      for (const line of m.text.split('\n')) {
        const hit = re.exec(line);
        if (hit) sum += Number(hit[1]);
      }
      return sum;
    };
    const prompt = value(/^switchyard_worker_prompt_tokens_total\{worker="w-\d"\} (\d+)/);
    const cached = value(/^switchyard_worker_cached_tokens_total\{worker="w-\d"\} (\d+)/);
    assert.ok(prompt > 0 && cached > 0 && cached < prompt, `${cached} / ${prompt}`);
    assert.ok(cached / prompt > 0.5, `cache-hit ratio ${cached / prompt}`);
    const completed = value(
      new RegExp(
        `^switchyard_endpoint_requests_total\\{endpoint="${t.endpointId}",outcome="completed"\\} (\\d+)`,
      ),
    );
    assert.equal(completed, 21);
    assert.equal(
      value(
        new RegExp(
          `^switchyard_endpoint_cached_tokens_total\\{endpoint="${t.endpointId}"\\} (\\d+)`,
        ),
      ),
      cached,
    );
    assert.equal(value(/^switchyard_worker_chosen_total\{worker="w-\d"\} (\d+)/), 21);
    // Closing the loop is visible: how far the index's predictions were from the workers'.
    assert.match(m.text, /^switchyard_prefix_index_error_tokens\{stat="mean_abs"\} \d/m);
  });
});

describe('SWITCHYARD_ROUTING_POLICY=least-loaded (the fallback and A/B baseline)', () => {
  let t: Setup;
  before(async () => {
    t = await setup({ SWITCHYARD_ROUTING_POLICY: 'least-loaded' }, [{}, {}]);
  });
  after(() => teardown(t));

  it('ignores prefix affinity: a conversation alternates between idle workers and loses its cache', async () => {
    const messages = [{ role: 'system', content: text('solo', 6000) }];
    const served: string[] = [];
    const cached: number[] = [];
    for (let round = 0; round < 4; round++) {
      messages.push({ role: 'user', content: `question ${round}` });
      const r = await chat(t, messages);
      assert.equal(r.status, 200, r.text);
      served.push(String(r.headers['x-service-worker-id']));
      const usage = r.body.usage as { prompt_tokens_details: { cached_tokens: number } };
      cached.push(usage.prompt_tokens_details.cached_tokens);
      const msg = (r.body.choices as Array<{ message: { content: string } }>)[0]!.message;
      messages.push({ role: 'assistant', content: msg.content });
    }
    assert.equal(new Set(served).size, 2, served.join(','));
    // The second round lands on the other worker: nothing of its prefix is cached there.
    assert.equal(cached[1], 0);
  });

  it('an unknown policy is a configuration error', async () => {
    const { loadConfig, ConfigError } = await import('../../src/config/index.js');
    assert.throws(
      () => loadConfig({ SWITCHYARD_ROUTING_POLICY: 'random' }),
      (e: unknown) => e instanceof ConfigError && /SWITCHYARD_ROUTING_POLICY/.test(e.message),
    );
    assert.equal(loadConfig({}).routingPolicy, 'score');
  });
});

describe('routing hints reach the scorer', () => {
  let t: Setup;
  before(async () => {
    t = await setup({}, [{}]);
  });
  after(() => teardown(t));

  it("headers win; without them the endpoint's SLO records are the hints; service_tier passes", async () => {
    const seen: RouteHints[] = [];
    const pool = t.s.services.pool;
    const route = pool.route.bind(pool);
    pool.route = (candidates, hints, exclude) => {
      seen.push(hints);
      return route(candidates, hints, exclude);
    };
    const mk = await t.s.admin('POST', '/projects/rt/keys', {
      scopes: ['inference', 'management'],
    });
    const key = String(mk.body.key);
    const projectId = t.url.split('/')[3]!;
    const slo = (body: unknown) =>
      http('POST', `${t.s.url}/${projectId}/chat/v1/slos`, { auth: `Bearer ${key}`, body });
    assert.equal((await slo({ name: 'a', ttft_ms: 800, tpot_ms: 40 })).status, 201);
    assert.equal((await slo({ name: 'b', ttft_ms: 300 })).status, 201);
    const msg = [{ role: 'user', content: 'hello' }];
    assert.equal((await chat(t, msg, { service_tier: 'priority' })).status, 200);
    assert.equal(
      (await chat(t, msg, {}, { 'x-slo-ttft-ms': '120', 'x-slo-tpot-ms': 'fast' })).status,
      200,
    );
    assert.equal(seen.length, 2);
    assert.deepEqual(seen[0]!.slo, { ttftMs: 300, tpotMs: 40 });
    assert.equal(seen[0]!.tier, 'priority');
    // A valid header replaces the records; an invalid one is ignored, not an error.
    assert.deepEqual(seen[1]!.slo, { ttftMs: 120 });
    assert.equal(seen[1]!.tier, 'default');
    assert.ok(seen[0]!.blocks.chars > 0 && seen[0]!.promptTokens > 0);
  });
});

describe('service_tier admission and the wait queue', () => {
  let t: Setup | undefined;
  after(() => teardown(t));

  /** Starts a request and resolves when the router has it in flight or queued. */
  async function start(
    setupT: Setup,
    tier: string | undefined,
    order: string[],
    name: string,
    settled: () => number,
  ): Promise<{ done: Promise<Res> }> {
    const before = settled();
    const done = chat(
      setupT,
      [{ role: 'user', content: name }],
      tier ? { service_tier: tier } : {},
    ).then((r) => {
      order.push(name);
      return r;
    });
    for (let i = 0; i < 500 && settled() === before; i++)
      await new Promise((r) => setTimeout(r, 2));
    assert.notEqual(settled(), before, `${name} never reached the router`);
    return { done };
  }

  /** The wait queue's depth, and that plus the one worker's load (what `start` waits on). */
  function probes(setupT: Setup): { waiting: () => number; settled: () => number } {
    const pool = setupT.s.services.pool;
    const waiting = () => pool.queueDepths().reduce((n, q) => n + q.depth, 0);
    return { waiting, settled: () => pool.load('w-0') + waiting() };
  }

  /** One worker taking one request at a time (10 s to a first token) behind the wait queue. */
  function saturated(depth: number, timeoutMs: number): Promise<Setup> {
    return setup(
      {
        SWITCHYARD_WORKER_MAX_INFLIGHT: '1',
        SWITCHYARD_ROUTER_QUEUE_DEPTH: String(depth),
        SWITCHYARD_ROUTER_QUEUE_TIMEOUT_MS: String(timeoutMs),
      },
      [{ ttftMs: 10_000, prefillMsPerToken: 0 }],
      true,
    );
  }

  it('flex stops at 85 % of the in-flight limit; default and priority go on', async () => {
    t = await setup(
      { SWITCHYARD_WORKER_MAX_INFLIGHT: '10', SWITCHYARD_ROUTER_QUEUE_DEPTH: '0' },
      [{ ttftMs: 60_000, prefillMsPerToken: 0 }],
      true,
    );
    const pool = t.s.services.pool;
    const order: string[] = [];
    const load = () => pool.load('w-0');
    const held: Array<Promise<Res>> = [];
    for (let i = 0; i < 8; i++) held.push((await start(t, undefined, order, `d${i}`, load)).done);
    assert.equal(load(), 8);
    const flex = await chat(t, [{ role: 'user', content: 'f' }], { service_tier: 'flex' });
    assert.equal(flex.status, 429, flex.text);
    assert.equal((flex.body.error as { code: string }).code, 'capacity_exceeded');
    assert.equal(flex.headers['retry-after'], '1');
    held.push((await start(t, 'auto', order, 'd8', load)).done);
    held.push((await start(t, undefined, order, 'd9', load)).done);
    assert.equal(load(), 10);
    const dflt = await chat(t, [{ role: 'user', content: 'x' }]);
    assert.equal(dflt.status, 429);
    held.push((await start(t, 'priority', order, 'p10', load)).done);
    assert.equal(load(), 11);
    const p2 = await chat(t, [{ role: 'user', content: 'p' }], { service_tier: 'priority' });
    assert.equal(p2.status, 429);
    for (const r of await drive(t.s.clock, held, 10_000)) assert.equal(r.status, 200, r.text);
    await teardown(t);
    t = undefined;
  });

  it('saturated: requests wait, and are served priority first, then default, then flex', async () => {
    t = await saturated(3, 60_000);
    const { waiting, settled } = probes(t);
    const order: string[] = [];
    const a = await start(t, undefined, order, 'first', settled);
    const b = await start(t, 'flex', order, 'flex', settled);
    const c = await start(t, undefined, order, 'default', settled);
    const d = await start(t, 'priority', order, 'priority', settled);
    assert.equal(waiting(), 3);
    const m = await http('GET', `${t.s.url}/metrics`);
    assert.match(m.text, /switchyard_router_queue_depth\{model="rm",tier="gpu"\} 3/);
    // The queue is full: one more is refused at once.
    const over = await chat(t, [{ role: 'user', content: 'over' }], { service_tier: 'priority' });
    assert.equal(over.status, 429);
    assert.equal((over.body.error as { code: string }).code, 'capacity_exceeded');
    for (const r of await drive(t.s.clock, [a.done, b.done, c.done, d.done])) {
      assert.equal(r.status, 200, r.text);
    }
    assert.deepEqual(order, ['first', 'priority', 'default', 'flex']);
    assert.equal(waiting(), 0);
  });

  it('a request that waits past SWITCHYARD_ROUTER_QUEUE_TIMEOUT_MS gets 429 with Retry-After', async () => {
    await teardown(t);
    t = await saturated(4, 3_000);
    const { waiting, settled } = probes(t);
    const order: string[] = [];
    const a = await start(t, undefined, order, 'holder', settled);
    const w = await start(t, undefined, order, 'waiter', settled);
    t.s.clock.advance(2_999);
    await tick();
    assert.equal(waiting(), 1);
    t.s.clock.advance(1);
    const r = await w.done;
    assert.equal(r.status, 429, r.text);
    assert.equal(r.headers['retry-after'], '1');
    assert.equal(waiting(), 0);
    assert.equal((await drive(t.s.clock, [a.done]))[0]!.status, 200);
  });

  it('a client that leaves while queued gives up its place', async () => {
    assert.ok(t);
    const pool = t.s.services.pool;
    const { waiting, settled } = probes(t);
    const order: string[] = [];
    const holder = await start(t, undefined, order, 'holder', settled);
    const ac = new AbortController();
    const gone = fetch(t.url, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'x', messages: [{ role: 'user', content: 'bye' }] }),
      signal: ac.signal,
    }).catch(() => null);
    for (let i = 0; i < 500 && waiting() === 0; i++) await new Promise((r) => setTimeout(r, 2));
    assert.equal(waiting(), 1);
    ac.abort();
    await gone;
    for (let i = 0; i < 500 && waiting() === 1; i++) await new Promise((r) => setTimeout(r, 2));
    assert.equal(waiting(), 0);
    assert.equal((await drive(t.s.clock, [holder.done]))[0]!.status, 200);
    assert.equal(pool.load('w-0'), 0);
  });
});

describe('queue order at a worker with scheduling_policy priority', () => {
  let t: Setup | undefined;
  after(() => teardown(t));

  it('a warm request overtakes an earlier cold prefill in the worker queue; fcfs keeps arrival order', async () => {
    const system = text('tenant', 6000);
    const order = async (policy: 'fcfs' | 'priority'): Promise<string[]> => {
      await teardown(t);
      // One slot, prefill 1 ms per uncached token: a cold 1,700-token prompt holds it ~1.7 s.
      t = await setup(
        {},
        [{ maxRunning: 1, ttftMs: 10, prefillMsPerToken: 1, schedulingPolicy: policy }],
        true,
      );
      const setup_ = t;
      const sim = setup_.workers[0]!;
      // The tenant's system prompt is cached on the worker and known to the router's index.
      const [warmup] = await drive(setup_.s.clock, [
        chat(setup_, [
          { role: 'system', content: system },
          { role: 'user', content: 'hello' },
        ]),
      ]);
      assert.equal(warmup!.status, 200);
      const done: string[] = [];
      const send = (tag: string, messages: Array<{ role: string; content: string }>) =>
        chat(setup_, messages).then((r) => {
          assert.equal(r.status, 200, r.text);
          done.push(tag);
          return r;
        });
      const until = async (cond: () => boolean) => {
        for (let i = 0; i < 400 && !cond(); i++) await new Promise((r) => setTimeout(r, 5));
        assert.ok(cond());
      };
      const blocker = send('blocker', [{ role: 'user', content: text('blocker', 6000) }]);
      await until(() => sim.stats().running === 1);
      const cold = send('cold', [{ role: 'user', content: text('cold', 6000) }]);
      await until(() => sim.stats().waiting === 1);
      const warm = send('warm', [
        { role: 'system', content: system },
        { role: 'user', content: 'hello again' },
      ]);
      await until(() => sim.stats().waiting === 2);
      const [, , w] = await drive(setup_.s.clock, [blocker, cold, warm], 50);
      const usage = w!.body.usage as { prompt_tokens_details: { cached_tokens: number } };
      assert.ok(usage.prompt_tokens_details.cached_tokens > 1000, 'the warm prompt hit the cache');
      // The classes the router sent, on its /metrics (only for a priority worker).
      const m = await http('GET', `${setup_.s.url}/metrics`);
      const sent = (cls: string) =>
        Number(
          new RegExp(
            `^switchyard_worker_priority_class_total\\{worker="w-0",class="${cls}"\\} (\\d+)`,
            'm',
          ).exec(m.text)?.[1] ?? 0,
        );
      assert.deepEqual(
        [sent('warm'), sent('cold'), sent('follow')],
        policy === 'priority' ? [1, 3, 0] : [0, 0, 0], // cold: the warm-up, the blocker, the cold one
      );
      return done;
    };
    assert.deepEqual(await order('priority'), ['blocker', 'warm', 'cold']);
    assert.deepEqual(await order('fcfs'), ['blocker', 'cold', 'warm']);
  });

  it("a client's own priority is not forwarded: an fcfs worker would refuse it", async () => {
    await teardown(t);
    t = await setup({}, [{}]);
    const r = await chat(t, [{ role: 'user', content: 'hi' }], { priority: -5 });
    assert.equal(r.status, 200, r.text);
    const workers = await t.s.admin('GET', '/workers');
    const list = workers.body.data as Array<{ scheduling_policy: string }>;
    assert.deepEqual(
      list.map((w) => w.scheduling_policy),
      ['fcfs'],
    );
    const bad = await t.s.admin('POST', '/workers', {
      model: 'rm',
      tier: 'gpu',
      url: 'http://127.0.0.1:9/v1',
      scheduling_policy: 'lifo',
    });
    assert.equal(bad.status, 400);
    assert.equal((bad.body.error as { param: string }).param, 'scheduling_policy');
  });
});
