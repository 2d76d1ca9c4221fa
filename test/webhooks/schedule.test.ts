/**
 * The delivery schedule on the fake clock: six attempts at exactly 0, +1 min,
 * +5 min, +15 min, +1 h, +4 h after each preceding failure, then permanently
 * failed; another delivery succeeds on attempt 3. Each attempt is signed and
 * recorded; the stub receiver sees exactly what was sent.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { emitEvent } from '../../src/events/outbox.js';
import { tables } from '../../src/store/index.js';
import { RETRY_DELAYS_MS } from '../../src/webhooks/dispatcher.js';
import type { Sender } from '../../src/webhooks/sender.js';
import { verifyWebhook } from '../../src/webhooks/signing.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

interface Received {
  at: number;
  headers: Record<string, string>;
  body: string;
}

class StubReceiver implements Sender {
  received: Received[] = [];
  answers: number[] = [];
  constructor(private readonly now: () => number) {}
  async send(_url: string, headers: Record<string, string>, body: string) {
    this.received.push({ at: this.now(), headers, body });
    const status = this.answers.shift() ?? 500;
    return { status, body: `answer ${status} `.repeat(200) };
  }
}

const publicResolver = async () => [{ address: '93.184.215.14', family: 4 }];

describe('webhook delivery schedule', () => {
  let s: TestServer;
  let stub: StubReceiver;
  let projectUuid: string;
  let webhook: { id: string; secret: string };
  let setActive: (active: boolean) => Promise<void>;
  before(async () => {
    let clockNow = () => 0;
    stub = new StubReceiver(() => clockNow());
    s = await startTestServer({ deps: { webhookSender: stub, webhookResolver: publicResolver } });
    clockNow = () => s.clock.now();
    const p = await seedProject(s, { slug: 'hooks', scopes: ['management'] });
    projectUuid = (await s.services.projects.find('hooks'))!.id;
    const r = await s.call('POST', `/${p.projectId}/v1/webhooks`, {
      key: p.key,
      body: { url: 'https://hooks.example.com/in', events: ['exec.completed'] },
    });
    assert.equal(r.status, 201, r.text);
    webhook = { id: String(r.body.id), secret: String(r.body.secret) };
    setActive = async (active) => {
      const u = await s.call('PUT', `/${p.projectId}/v1/webhooks/${webhook.id}`, {
        key: p.key,
        body: { is_active: active },
      });
      assert.equal(u.status, 200, u.text);
    };
  });
  after(() => s.close());

  async function emit(): Promise<string> {
    const e = await s.services.store.db.transaction((tx) =>
      emitEvent(tx, {
        projectId: projectUuid,
        type: 'exec.completed',
        data: {
          invocation_id: 'inv_1',
          status: 'completed',
          duration_ms: 12,
          exit_code: 0,
          completed_at: new Date(s.clock.now()).toISOString(),
        },
        now: new Date(s.clock.now()),
      }),
    );
    assert.equal(e.deliveries.length, 1);
    return e.deliveries[0]!;
  }

  async function delivery(id: string) {
    const [d] = await s.services.store.db
      .select()
      .from(tables.webhookDeliveries)
      .where(eq(tables.webhookDeliveries.id, id));
    return d!;
  }

  it('six attempts at the exact offsets, then permanently failed', async () => {
    stub.received = [];
    const id = await emit();
    const t0 = s.clock.now();
    assert.equal(await s.services.dispatcher.tick(), 1);
    let expectedAt = t0;
    for (const delay of RETRY_DELAYS_MS) {
      s.clock.advance(delay - 1);
      assert.equal(await s.services.dispatcher.tick(), 0, `nothing due 1 ms before +${delay}`);
      s.clock.advance(1);
      assert.equal(await s.services.dispatcher.tick(), 1, `attempt due at +${delay}`);
      expectedAt += delay;
      assert.equal(stub.received.at(-1)!.at, expectedAt);
    }
    assert.equal(stub.received.length, 6);
    // The spec's schedule, written out: a wrong constant must fail this test.
    assert.deepEqual(
      stub.received.slice(1).map((r, i) => r.at - stub.received[i]!.at),
      [60_000, 300_000, 900_000, 3_600_000, 14_400_000],
    );
    const d = await delivery(id);
    assert.equal(d.status, 'failed');
    assert.equal(d.attemptCount, 6);
    assert.equal(d.httpStatus, 500);
    assert.equal(d.responseBody!.length, 1024);
    s.clock.advance(24 * 3600_000);
    assert.equal(await s.services.dispatcher.tick(), 0, 'no seventh attempt');
    const attempts = await s.services.store.db
      .select()
      .from(tables.webhookAttempts)
      .where(eq(tables.webhookAttempts.deliveryId, id));
    assert.deepEqual(
      attempts.map((a) => [a.attemptNo, a.outcome, a.httpStatus]),
      [1, 2, 3, 4, 5, 6].map((n) => [n, 'failed', 500]),
    );
    // Every attempt was signed over the exact bytes sent, and the body is the envelope.
    for (const r of stub.received) {
      assert.equal(r.headers['x-webhook-id'], id);
      assert.equal(r.headers['content-type'], 'application/json');
      assert.match(r.headers['user-agent']!, /^Switchyard-Webhooks\//);
      const v = verifyWebhook({
        secret: webhook.secret,
        body: r.body,
        timestamp: r.headers['x-webhook-timestamp'],
        signature: r.headers['x-webhook-signature'],
        nowSeconds: Math.floor(r.at / 1000),
      });
      assert.deepEqual(v, { ok: true });
      const env = JSON.parse(r.body) as Record<string, unknown>;
      assert.deepEqual(Object.keys(env).sort(), ['created_at', 'data', 'id', 'object', 'type']);
      assert.match(String(env.id), /^evt_[0-9a-f]{24}$/);
      assert.equal(env.object, 'event');
      assert.equal(env.type, 'exec.completed');
      assert.ok(Number.isInteger(env.created_at));
    }
    assert.equal(new Set(stub.received.map((r) => r.body)).size, 1, 'same bytes every attempt');
  });

  it('succeeds on attempt 3', async () => {
    stub.received = [];
    stub.answers = [503, 302, 204];
    const id = await emit();
    await s.services.dispatcher.tick();
    s.clock.advance(RETRY_DELAYS_MS[0]);
    await s.services.dispatcher.tick();
    s.clock.advance(RETRY_DELAYS_MS[1]);
    await s.services.dispatcher.tick();
    const d = await delivery(id);
    assert.equal(d.status, 'delivered');
    assert.equal(d.attemptCount, 3);
    assert.equal(d.httpStatus, 204);
    assert.equal(stub.received.length, 3);
    s.clock.advance(24 * 3600_000);
    assert.equal(await s.services.dispatcher.tick(), 0);
  });

  it('a disabled webhook’s waiting retries wait with it, and go on once it is enabled', async () => {
    stub.received = [];
    stub.answers = [500, 204];
    const id = await emit();
    assert.equal(await s.services.dispatcher.tick(), 1);
    await setActive(false);
    s.clock.advance(RETRY_DELAYS_MS[0] * 10);
    assert.equal(await s.services.dispatcher.tick(), 0, 'nothing sent while disabled');
    assert.equal(await s.services.dispatcher.anyDue(), false, 'the idle poll sees nothing due');
    const waiting = await delivery(id);
    assert.deepEqual([waiting.status, waiting.attemptCount], ['pending', 1]);
    await setActive(true);
    assert.equal(await s.services.dispatcher.anyDue(), true);
    assert.equal(await s.services.dispatcher.tick(), 1);
    const d = await delivery(id);
    assert.deepEqual([d.status, d.attemptCount, d.httpStatus], ['delivered', 2, 204]);
    assert.equal(stub.received.length, 2);
  });

  it('a receiver that does not answer within 30 s is a failed attempt', async () => {
    const hanging: Sender = {
      send: (_u, _h, _b, signal) =>
        new Promise((_resolve, reject) =>
          signal.addEventListener('abort', () => reject(new Error('aborted'))),
        ),
    };
    const { Dispatcher } = await import('../../src/webhooks/dispatcher.js');
    const d2 = new Dispatcher(s.services.store.db, s.clock, hanging, s.services.logger);
    const id = await emit();
    // The server's own timers (the key-use writer's, say) are pending already.
    const others = s.clock.pendingTimers;
    const running = d2.tick();
    // The claim is a database round trip (PGlite answers from its own thread); then
    // the attempt arms its 30 s timer.
    for (const until = Date.now() + 10_000; s.clock.pendingTimers === others && Date.now() < until;)
      await new Promise((r) => setTimeout(r, 1));
    assert.equal(s.clock.pendingTimers, others + 1, 'the attempt timer is armed');
    s.clock.advance(29_999);
    // Still waiting 1 ms before the 30 s limit: the attempt has not ended.
    const early = await Promise.race([
      running.then(() => 'ended'),
      new Promise((r) => setTimeout(r, 50, 'waiting')),
    ]);
    assert.equal(early, 'waiting');
    s.clock.advance(1);
    assert.equal(await running, 1);
    const d = await delivery(id);
    assert.equal(d.status, 'pending');
    assert.equal(d.attemptCount, 1);
    assert.match(d.lastError!, /no response within 30 s/);
  });
});
