/**
 * A real `switchyard serve` process whose PostgreSQL goes away and comes back,
 * without stopping the shared server: the router reaches PostgreSQL through a
 * TCP proxy in this test (test/support/tcp-proxy.ts) that is cut and restored.
 *
 * Scenario 1, the server goes down (connections reset, new ones refused):
 * - a webhook attempt in flight when the database goes away cannot record its
 *   outcome; the delivery is attempted again after its lease once the database
 *   is back, and delivered (at-least-once; never a seventh attempt);
 * - requests with a key verified before keep flowing (cached key, endpoint,
 *   workers and balance, served stale); an unseen key gets 503 `unavailable`
 *   with Retry-After; management calls get 503 `unavailable` too;
 * - /readyz answers 503, /healthz 200; usage records stay buffered (the gauge
 *   shows them) and are all written once the database is back;
 * - the spend written after the outage fires the budget thresholds it crossed,
 *   and those events are delivered;
 * - the process never exits and recovers by itself.
 *
 * Scenario 2, a network partition (connections open, no byte passes): the same
 * claims, with the database answering nothing rather than refusing.
 *
 * No Redis on purpose: Redis pub/sub channels are global, so another test file's
 * router invalidating its endpoint or worker caches (they are cleared whole)
 * would also clear this router's, and with them the stale copies it falls back
 * on during the outage (see docs/RELIABILITY.md). Limits run in process.
 *
 * Skipped without TEST_DATABASE_URL (required in CI).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eq, inArray } from 'drizzle-orm';
import { tables } from '../../src/store/index.js';
import { http as rawHttp, seedProject, sharedServices, type Res } from '../support/harness.js';

/** The harness's client, naming the call that failed (a reset says which request died). */
const http: typeof rawHttp = async (method, url, opts) => {
  try {
    return await rawHttp(method, url, opts);
  } catch (err) {
    throw new Error(`${method} ${url}: ${String(err)}`, { cause: err });
  }
};
import { pollUntil } from '../support/poll.js';
import {
  assertAllSigned,
  startReceiver,
  type Behaviour,
  type Receiver,
} from '../support/https-receiver.js';
import { cluster } from '../support/cluster.js';
import type { Spawned } from '../support/process.js';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy.js';

const { skip } = sharedServices();

const MODEL = 'outage-model';
/** 100 cents per completion token: a one-token request is 10% of the 1,000-cent budget. */
const PRICE = 100_000_000;
const BUDGET_CENTS = 1000;
const THRESHOLDS = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100];
/** Shortened webhook schedule (test-only overrides) so retries fit in seconds. */
const SCHEDULE = {
  SWITCHYARD_WEBHOOK_RETRY_DELAYS_MS: '200,400,600,800,1000',
  SWITCHYARD_WEBHOOK_ATTEMPT_TIMEOUT_MS: '2000',
  SWITCHYARD_WEBHOOK_LEASE_MS: '3000',
};

/** The router's bounds on waiting for PostgreSQL, shortened (set in DATABASE_URL). */
const QUERY_TIMEOUT_MS = 1500;
const CONNECT_TIMEOUT_MS = 1000;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const code = (r: Res) => (r.body.error as { code?: string } | undefined)?.code;

describe('a router through a PostgreSQL outage', { skip, timeout: 150_000 }, () => {
  /** Held receiver answers, released by the test (and before anything else stops). */
  const held: Array<(b: Behaviour) => void> = [];
  after(() => {
    for (const resolve of held.splice(0)) resolve('ok');
  });
  const routers = cluster();
  let proxy: TcpProxy;
  let receiver: Receiver;
  let router: Spawned;
  let base = '';
  let projectId = '';
  let projectUuid = '';
  let mgmtKey = '';
  let secret = '';
  let hold = false;

  /** Request ids of every completion answered 200 (each one token, 10% of the budget). */
  const answered: string[] = [];
  const chat = async (key: string) => {
    const r = await http('POST', `${base}/${projectId}/chat/v1/chat/completions`, {
      auth: `Bearer ${key}`,
      body: { model: MODEL, messages: [{ role: 'user', content: '[sim:len=1] hi' }] },
    });
    if (r.status === 200) answered.push(String(r.headers['x-request-id']));
    return r;
  };
  const newKey = async (): Promise<string> => {
    const r = await http('POST', `${base}/${projectId}/v1/keys`, {
      auth: `Bearer ${mgmtKey}`,
      body: { scopes: ['inference'], quotaRequests: 10_000 },
    });
    assert.equal(r.status, 201, r.text);
    return String(r.body.key);
  };
  const metric = async (name: string): Promise<number> => {
    const r = await http('GET', `${base}/metrics`);
    const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(r.text);
    return m ? Number(m[1]) : NaN;
  };
  const D = tables.webhookDeliveries;
  const A = tables.webhookAttempts;
  const deliveries = () => routers.db.store.db.select().from(D).where(eq(D.projectId, projectUuid));
  const usageOf = async (ids: string[]) =>
    ids.length === 0
      ? []
      : routers.db.store.db
          .select({ id: tables.usageRecords.requestId })
          .from(tables.usageRecords)
          .where(inArray(tables.usageRecords.requestId, ids));
  const receivedFor = (id: string) =>
    receiver.received.filter((r) => r.headers['x-webhook-id'] === id);

  before(async () => {
    const target = new URL(routers.url);
    proxy = await startTcpProxy(target.hostname, Number(target.port || 5432));
    receiver = await startReceiver();
    receiver.behaviour = () =>
      hold ? new Promise<Behaviour>((resolve) => held.push(resolve)) : 'ok';
    const worker = await routers.simWorker(MODEL);
    // The database through the proxy, with the shortened bounds on waiting for it.
    const served = await routers.serve({
      env: {
        DATABASE_URL: `${proxy.rewrite(routers.url)}?query_timeout=${QUERY_TIMEOUT_MS}&connectionTimeoutMillis=${CONNECT_TIMEOUT_MS}`,
        SWITCHYARD_DB_POOL_SIZE: '4',
        SWITCHYARD_WEBHOOK_ALLOW_CIDRS: '127.0.0.0/8',
        NODE_EXTRA_CA_CERTS: receiver.caFile,
        ...SCHEDULE,
      },
    });
    router = served.proc;
    base = served.url;

    const seeded = await seedProject(served, {
      slug: 'outage',
      model: MODEL,
      modelBody: { completion_price_cents_per_mtok: PRICE },
      worker: { url: worker.url },
      projectBody: { credit_cents: 1_000_000_000 },
      endpointSlug: 'chat',
      scopes: ['management'],
    });
    projectId = seeded.projectId;
    projectUuid = seeded.projectUuid;
    mgmtKey = seeded.key;
    const hook = await http('POST', `${base}/${projectId}/v1/webhooks`, {
      auth: `Bearer ${mgmtKey}`,
      body: { url: receiver.url, events: ['budget.threshold_reached'] },
    });
    assert.equal(hook.status, 201, hook.text);
    secret = String(hook.body.secret);
    const alert = await http('POST', `${base}/${projectId}/v1/budget_alerts`, {
      auth: `Bearer ${mgmtKey}`,
      body: { name: 'outage', budget_amount_cents: BUDGET_CENTS, thresholds: THRESHOLDS },
    });
    assert.equal(alert.status, 201, alert.text);
  });

  after(async () => {
    await proxy?.close();
    await receiver?.close();
  });

  /**
   * Every budget threshold the written spend crossed fired exactly once, and
   * every delivery ended delivered, within 6 attempts, signed, and seen by the
   * receiver no more often than it was attempted.
   */
  async function eventsDelivered(ms: number) {
    const ids = [...answered];
    await pollUntil(
      'every answered request has its usage record',
      async () => ((await usageOf(ids)).length === ids.length ? true : undefined),
      ms,
    );
    // One completion token at 100 cents, budget 1,000 cents: 10% a request.
    const pct = ids.length * 10;
    const expected = THRESHOLDS.filter((t) => t <= pct).length;
    let last: Array<typeof D.$inferSelect> = [];
    const settled = await pollUntil(
      () =>
        `${expected} threshold events delivered (${ids.length} requests written); have ` +
        JSON.stringify(last.map((d) => [d.status, d.attemptCount, d.lastError])),
      async () => {
        const ds = await deliveries();
        last = ds;
        return ds.length === expected && ds.every((d) => d.status === 'delivered') ? ds : undefined;
      },
      ms,
    );
    const events = await routers.db.store.db
      .select({ body: tables.events.body })
      .from(tables.events)
      .where(eq(tables.events.projectId, projectUuid));
    const fired = events.map((e) => (JSON.parse(e.body) as { threshold: number }).threshold);
    assert.deepEqual(
      fired.sort((a, b) => a - b),
      THRESHOLDS.slice(0, expected),
      'each crossed threshold fired exactly once',
    );
    for (const d of settled.value) {
      assert.ok(d.attemptCount >= 1 && d.attemptCount <= 6, `${d.id}: ${d.attemptCount}`);
      const seen = receivedFor(d.id);
      assert.ok(seen.length >= 1 && seen.length <= d.attemptCount, `${d.id}: seen ${seen.length}`);
    }
    assertAllSigned(receiver.received, secret);
    return { deliveries: settled.value, after: settled.after };
  }

  it('the database goes down: cached keys flow, unseen keys and management get 503, usage and events survive', async (t) => {
    const cachedKey = await newKey();
    const unseenKey = await newKey();
    // A webhook attempt is in flight when the database goes away: the
    // receiver holds the first threshold's delivery until then.
    hold = true;
    const first = await chat(cachedKey);
    assert.equal(first.status, 200, first.text);
    await pollUntil('the first delivery is in flight', () => held.length > 0 || undefined, 15_000);
    const [inFlight] = await deliveries();
    assert.ok(inFlight);

    proxy.cut('refuse');
    const cutAt = Date.now();
    hold = false;
    // The receiver says 2xx, but the dispatcher cannot record it.
    for (const resolve of held.splice(0)) resolve('ok');

    assert.equal((await http('GET', `${base}/healthz`)).status, 200);
    const notReady = await pollUntil(
      '/readyz answers 503',
      async () => ((await http('GET', `${base}/readyz`)).status === 503 ? true : undefined),
      5000,
    );
    // Longer than the caches' 1 s TTL, so the cached key, endpoint, workers
    // and balance are all served stale after a failed refresh.
    const during: string[] = [];
    let slowest = 0;
    while (Date.now() - cutAt < 2500 || during.length < 5) {
      const t0 = Date.now();
      const r = await chat(cachedKey);
      slowest = Math.max(slowest, Date.now() - t0);
      assert.equal(r.status, 200, r.text);
      during.push(String(r.headers['x-request-id']));
      await sleep(400);
    }
    const unseen = await chat(unseenKey);
    assert.equal(unseen.status, 503, unseen.text);
    assert.equal(code(unseen), 'unavailable');
    assert.equal(unseen.headers['retry-after'], '1');
    for (const r of [
      await http('GET', `${base}/${projectId}/v1/keys`, { auth: `Bearer ${mgmtKey}` }),
      await http('POST', `${base}/${projectId}/v1/budget_alerts`, {
        auth: `Bearer ${mgmtKey}`,
        body: { name: 'during', budget_amount_cents: 1 },
      }),
    ]) {
      assert.equal(r.status, 503, r.text);
      assert.equal(code(r), 'unavailable');
      assert.equal(r.headers['retry-after'], '1');
    }
    assert.ok((await metric('switchyard_usage_records_buffered')) >= during.length);
    assert.equal(await metric('switchyard_usage_records_dropped_total'), 0, 'kept, not dropped');
    assert.equal((await usageOf(during)).length, 0, 'nothing written during the outage');
    assert.equal(router.child.exitCode, null);

    proxy.restore();
    const ready = await pollUntil(
      '/readyz answers 200',
      async () => ((await http('GET', `${base}/readyz`)).status === 200 ? true : undefined),
      10_000,
    );
    const written = await pollUntil(
      'buffered usage written',
      async () => ((await usageOf(during)).length === during.length ? true : undefined),
      10_000,
    );
    assert.equal((await chat(unseenKey)).status, 200, 'an unseen key works again');
    const ev = await eventsDelivered(20_000);
    // The attempt whose 2xx could not be recorded was attempted again after
    // its lease: at-least-once, the first marked lost.
    const d = ev.deliveries.find((x) => x.id === inFlight.id)!;
    const attempts = await routers.db.store.db
      .select()
      .from(A)
      .where(eq(A.deliveryId, d.id))
      .orderBy(A.attemptNo);
    assert.deepEqual(
      attempts.map((a) => a.outcome),
      ['lost', 'succeeded'],
    );
    assert.equal(receivedFor(d.id).length, 2);
    assert.equal(router.child.exitCode, null, 'the router never exited');
    t.diagnostic(
      `refused: /readyz 503 after ${notReady.after} ms; ${during.length} requests with a cached key ` +
        `during the outage, slowest ${slowest} ms; after restore /readyz 200 in ${ready.after} ms, ` +
        `buffered usage written in ${written.after} ms, ${ev.deliveries.length} threshold events ` +
        `delivered ${ev.after} ms later`,
    );
  });

  it('a network partition: nothing hangs past the query timeout, and it all recovers', async (t) => {
    const cachedKey = await newKey();
    const unseenKey = await newKey();
    assert.equal((await chat(cachedKey)).status, 200);
    proxy.cut('blackhole');
    const cutAt = Date.now();
    const health = await http('GET', `${base}/healthz`);
    assert.equal(health.status, 200);
    const timed = async <T>(p: Promise<T>) => {
      const t0 = Date.now();
      const v = await p;
      return { v, ms: Date.now() - t0 };
    };
    // Each request may wait for one failed refresh per stale cache (key,
    // endpoint, workers, balance) before it is served from the cache.
    const bound = 4 * (QUERY_TIMEOUT_MS + CONNECT_TIMEOUT_MS) + 3000;
    const ready = timed(http('GET', `${base}/readyz`));
    const cached: Array<Promise<{ v: Res; ms: number }>> = [];
    for (let i = 0; i < 4; i++) {
      cached.push(timed(chat(cachedKey)));
      await sleep(600);
    }
    const unseen = timed(chat(unseenKey));
    const mgmt = timed(http('GET', `${base}/${projectId}/v1/keys`, { auth: `Bearer ${mgmtKey}` }));
    const r = await ready;
    assert.equal(r.v.status, 503);
    assert.ok(r.ms < QUERY_TIMEOUT_MS + 2000, `/readyz took ${r.ms} ms`);
    const results = await Promise.all(cached);
    for (const c of results) {
      assert.equal(c.v.status, 200, c.v.text);
      assert.ok(c.ms < bound, `a cached-key request took ${c.ms} ms`);
    }
    for (const x of [await unseen, await mgmt]) {
      assert.equal(x.v.status, 503, x.v.text);
      assert.equal(code(x.v), 'unavailable');
      assert.ok(x.ms < bound, `took ${x.ms} ms`);
    }
    const partitionMs = Date.now() - cutAt;
    assert.equal(router.child.exitCode, null);

    proxy.restore();
    const back = await pollUntil(
      '/readyz answers 200',
      async () => ((await http('GET', `${base}/readyz`)).status === 200 ? true : undefined),
      15_000,
    );
    const ids = results.map((c) => String(c.v.headers['x-request-id']));
    const written = await pollUntil(
      'usage written',
      async () => ((await usageOf(ids)).length === ids.length ? true : undefined),
      15_000,
    );
    assert.equal((await chat(unseenKey)).status, 200, 'an unseen key works again');
    const ev = await eventsDelivered(20_000);
    assert.equal(router.child.exitCode, null, 'the router never exited');
    t.diagnostic(
      `partition of ${partitionMs} ms: /readyz 503 in ${r.ms} ms; cached-key requests 200 in ` +
        `${results.map((c) => c.ms).join(', ')} ms; unseen key 503 in ${(await unseen).ms} ms; ` +
        `after healing /readyz 200 in ${back.after} ms, usage written in ${written.after} ms, ` +
        `${ev.deliveries.length} threshold events delivered`,
    );
  });
});
