/**
 * Spec, delivery rule 1: a 2xx response within 30 seconds is success. The status
 * line decides; the body is read only for the stored 1 KiB. A receiver that
 * answers 200 and then keeps its response open, or whose connection breaks after
 * the 200, has accepted the delivery: it is delivered, not retried (each retry
 * would deliver the event again, up to six times, and end as `failed`).
 * Real HTTPS receiver on loopback, the router's own guarded sender.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { emitEvent } from '../../src/events/outbox.js';
import { tables } from '../../src/store/index.js';
import { startReceiver, type Behaviour, type Receiver } from '../support/https-receiver.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

describe('a 2xx whose body does not complete', () => {
  let s: TestServer;
  let rx: Receiver;
  let projectUuid: string;
  before(async () => {
    rx = await startReceiver();
    s = await startTestServer({
      env: { SWITCHYARD_WEBHOOK_ALLOW_CIDRS: '127.0.0.0/8', SWITCHYARD_WEBHOOK_CA_FILE: rx.caFile },
    });
    const p = await seedProject(s, { slug: 'answered', scopes: ['management'] });
    projectUuid = (await s.services.projects.find('answered'))!.id;
    const r = await s.call('POST', `/${p.projectId}/v1/webhooks`, {
      key: p.key,
      body: { url: rx.url, events: ['exec.completed'] },
    });
    assert.equal(r.status, 201, r.text);
  });
  after(async () => {
    await s.close();
    await rx.close();
  });

  async function deliverOnce(behaviour: Behaviour) {
    rx.received = [];
    rx.behaviour = () => behaviour;
    const e = await s.services.store.db.transaction((tx) =>
      emitEvent(tx, {
        projectId: projectUuid,
        type: 'exec.completed',
        data: {
          invocation_id: 'inv_1',
          status: 'completed',
          duration_ms: 3,
          exit_code: 0,
          completed_at: new Date(s.clock.now()).toISOString(),
        },
        now: new Date(s.clock.now()),
      }),
    );
    const tick = s.services.dispatcher.tick();
    for (let i = 0; i < 500 && rx.received.length === 0; i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(rx.received.length, 1, 'the attempt reached the receiver');
    await new Promise((r) => setTimeout(r, 100));
    // The 30-second limit runs on the fake clock.
    s.clock.advance(30_000);
    await tick;
    const [d] = await s.services.store.db
      .select()
      .from(tables.webhookDeliveries)
      .where(eq(tables.webhookDeliveries.id, e.deliveries[0]!));
    return d!;
  }

  for (const behaviour of ['ok-unfinished', 'ok-reset'] as const) {
    it(`${behaviour}: delivered, with what the body had`, async () => {
      const d = await deliverOnce(behaviour);
      assert.equal(d.status, 'delivered', String(d.lastError));
      assert.equal(d.httpStatus, 200);
      assert.equal(d.responseBody, 'thanks');
      assert.equal(d.attemptCount, 1);
    });
  }
});
