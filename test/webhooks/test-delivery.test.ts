/**
 * A test delivery (`POST /v1/webhooks/{id}/test`) is one attempt, never retried
 * (docs/WEBHOOKS.md; the dispatcher's `final`), even when the router dies during
 * it: the attempt was claimed and may have reached the receiver, so once its lease
 * runs out the background dispatcher records it lost and fails the delivery
 * instead of sending the receiver a second `webhook.test`.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { eventId, insertEvent } from '../../src/events/outbox.js';
import { tables } from '../../src/store/index.js';
import { LEASE_MS } from '../../src/webhooks/dispatcher.js';
import type { Sender } from '../../src/webhooks/sender.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

class CountingReceiver implements Sender {
  bodies: string[] = [];
  async send(_url: string, _headers: Record<string, string>, body: string) {
    this.bodies.push(body);
    return { status: 500, body: 'no' };
  }
}

const publicResolver = async () => [{ address: '93.184.215.14', family: 4 }];

describe('a test delivery whose router died mid-attempt', () => {
  let s: TestServer;
  let rx: CountingReceiver;
  let projectUuid: string;
  let webhookId: string;
  before(async () => {
    rx = new CountingReceiver();
    s = await startTestServer({ deps: { webhookSender: rx, webhookResolver: publicResolver } });
    const p = await seedProject(s, { slug: 'tests', scopes: ['management'] });
    projectUuid = (await s.services.projects.find('tests'))!.id;
    const r = await s.call('POST', `/${p.projectId}/v1/webhooks`, {
      key: p.key,
      body: { url: 'https://hooks.example.com/in', events: ['exec.completed'] },
    });
    assert.equal(r.status, 201, r.text);
    webhookId = String(r.body.id);
  });
  after(() => s.close());

  it('is not attempted a second time after its lease', async () => {
    // What WebhookService.test does up to the send: the pre-leased delivery, then
    // its claim (attempt 1 counted); the process is killed before the outcome.
    const now = new Date(s.clock.now());
    const evt = eventId();
    const body = JSON.stringify({
      id: evt,
      object: 'event',
      type: 'webhook.test',
      created_at: Math.floor(now.getTime() / 1000),
      data: { webhook_id: webhookId, message: 'test' },
    });
    const emitted = await s.services.store.db.transaction((tx) =>
      insertEvent(tx, {
        id: evt,
        projectId: projectUuid,
        type: 'webhook.test',
        body,
        now,
        onlyEndpoint: webhookId,
        leaseUntil: new Date(now.getTime() + LEASE_MS),
      }),
    );
    const id = emitted.deliveries[0]!;
    const claimed = await s.services.dispatcher.claim(1, id);
    assert.equal(claimed.length, 1);
    assert.equal(claimed[0]!.final, true);

    // Any dispatcher, after the lease and long after.
    s.clock.advance(LEASE_MS + 1);
    await s.services.dispatcher.tick();
    s.clock.advance(24 * 3600_000);
    await s.services.dispatcher.tick();
    assert.deepEqual(rx.bodies, [], 'no second webhook.test');

    const [d] = await s.services.store.db
      .select()
      .from(tables.webhookDeliveries)
      .where(eq(tables.webhookDeliveries.id, id));
    assert.equal(d!.status, 'failed');
    assert.equal(d!.attemptCount, 1);
    const attempts = await s.services.store.db
      .select()
      .from(tables.webhookAttempts)
      .where(eq(tables.webhookAttempts.deliveryId, id));
    assert.deepEqual(
      attempts.map((a) => [a.attemptNo, a.outcome]),
      [[1, 'lost']],
    );
  });
});
