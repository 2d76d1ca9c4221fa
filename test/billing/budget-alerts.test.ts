/**
 * Budget alerts: spend crossing a threshold sends the spec's legacy,
 * un-enveloped body (camelCase, ISO timestamp), signed like every delivery,
 * once per threshold per month.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { eq } from 'drizzle-orm';
import { after, before, describe, it } from 'node:test';
import { MAX_BUDGET_ALERTS_PER_PROJECT } from '../../src/billing/budget-alerts.js';
import { tables } from '../../src/store/index.js';
import type { Sender } from '../../src/webhooks/sender.js';
import { verifyWebhook } from '../../src/webhooks/signing.js';
import { inferenceFixture, type InferenceFixture } from '../support/inference.js';

/** A priced endpoint whose webhook deliveries are collected in `sent` instead of sent. */
function pricedFixture(
  sent: Array<{ headers: Record<string, string>; body: string }>,
  env?: Record<string, string>,
): Promise<InferenceFixture> {
  const sender: Sender = {
    async send(_url, headers, body) {
      sent.push({ headers, body });
      return { status: 200, body: 'ok' };
    },
  };
  return inferenceFixture({
    prices: [100_000, 100_000],
    creditCents: 10_000,
    keyScopes: ['inference', 'management'],
    ...(env ? { env } : {}),
    deps: {
      webhookSender: sender,
      webhookResolver: async () => [{ address: '93.184.215.14', family: 4 }],
    },
  });
}

/** One small priced completion, its usage written and the resulting deliveries sent. */
async function spend(f: InferenceFixture): Promise<void> {
  await f.client.chat.completions.create({
    model: 'x',
    messages: [{ role: 'user', content: 'spend' }],
    max_tokens: 4,
  });
  await f.server.services.usage.flush();
  await f.server.services.dispatcher.tick();
}

/** An alert written to the database directly, as another instance would. */
async function alertFromElsewhere(f: InferenceFixture): Promise<void> {
  const db = f.server.services.store.db;
  const [p] = await db
    .select({ id: tables.projects.id })
    .from(tables.projects)
    .where(eq(tables.projects.externalId, f.projectId));
  await db.insert(tables.budgetAlerts).values({
    id: randomUUID(),
    projectId: p!.id,
    name: 'elsewhere',
    budgetAmountCents: 1,
    thresholds: [50],
    fired: {},
    createdAt: new Date(f.server.clock.now()),
  });
}

describe('budget alerts', () => {
  let f: InferenceFixture;
  const sent: Array<{ headers: Record<string, string>; body: string }> = [];
  before(async () => {
    f = await pricedFixture(sent);
  });
  after(() => f.close());

  it('fires each crossed threshold once, with the legacy body, signed', async () => {
    const mk = (path: string, body: unknown) =>
      f.server.call('POST', `/${f.projectId}/v1/${path}`, { key: f.key, body });
    const hook = await mk('webhooks', {
      url: 'https://hooks.example.com/b',
      events: ['budget.threshold_reached'],
    });
    assert.equal(hook.status, 201, hook.text);
    const other = await mk('webhooks', {
      url: 'https://hooks.example.com/o',
      events: ['exec.failed'],
    });
    assert.equal(other.status, 201);
    // Each request costs ~(prompt + completion) x 0.1 cent; a 2-cent budget.
    const alert = await mk('budget_alerts', {
      name: 'tiny',
      budget_amount_cents: 2,
      thresholds: [50, 100],
    });
    assert.equal(alert.status, 201, alert.text);
    const r = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'spend' }],
      max_tokens: 4,
    });
    const cents = Math.floor((r.usage!.total_tokens * 100_000) / 1_000_000);
    assert.ok(cents >= 1, `spent ${cents} cents`);
    await f.server.services.usage.flush();
    await f.server.services.dispatcher.tick();
    // Crossings and the percentage come from the exact spend, not whole cents.
    const exact = (r.usage!.total_tokens * 100_000) / 1_000_000;
    const expected = [50, 100].filter((t) => (exact / 2) * 100 >= t);
    assert.equal(sent.length, expected.length);
    for (const [i, s] of sent.entries()) {
      const body = JSON.parse(s.body) as Record<string, unknown>;
      assert.deepEqual(Object.keys(body).sort(), [
        'alertId',
        'alertName',
        'budgetAmountCents',
        'currentSpendCents',
        'eventType',
        'projectId',
        'projectName',
        'spendPercentage',
        'threshold',
        'timestamp',
      ]);
      assert.equal(body.eventType, 'budget.threshold_reached');
      assert.equal(body.alertId, alert.body.id);
      assert.equal(body.threshold, expected[i]);
      assert.equal(body.currentSpendCents, cents);
      assert.equal(body.spendPercentage, Math.round((exact / 2) * 100 * 100) / 100);
      assert.equal(body.budgetAmountCents, 2);
      assert.match(String(body.projectId), /^[0-9a-f-]{36}$/);
      assert.match(String(body.timestamp), /^\d{4}-\d\d-\d\dT/);
      assert.ok(!('id' in body) && !('object' in body) && !('type' in body));
      assert.equal(
        verifyWebhook({
          secret: String(hook.body.secret),
          body: s.body,
          timestamp: s.headers['x-webhook-timestamp'],
          signature: s.headers['x-webhook-signature'],
          nowSeconds: Math.floor(f.server.clock.now() / 1000),
        }).ok,
        true,
      );
    }
    // More spend in the same month does not fire the same thresholds again.
    const before = sent.length;
    await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'more' }],
      max_tokens: 4,
    });
    await f.server.services.usage.flush();
    await f.server.services.dispatcher.tick();
    const fired = new Set(sent.map((s) => (JSON.parse(s.body) as { threshold: number }).threshold));
    assert.equal(fired.size, sent.length);
    assert.ok(sent.length >= before);
  });
});

describe('budget alert ids', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await pricedFixture([]);
  });
  after(() => f.close());

  it('DELETE of an unknown id, or one that is not a UUID, is 404 budget_alert_not_found, never a 500', async () => {
    const created = await f.server.call('POST', `/${f.projectId}/v1/budget_alerts`, {
      key: f.key,
      body: { name: 'kept', budget_amount_cents: 100 },
    });
    assert.equal(created.status, 201, created.text);
    // UUID-length strings of hex digits and dashes that PostgreSQL's uuid type refuses.
    for (const id of [
      '-'.repeat(36),
      'a'.repeat(36),
      `${String(created.body.id).slice(0, 35)}-`,
      randomUUID(),
    ]) {
      const r = await f.server.call('DELETE', `/${f.projectId}/v1/budget_alerts/${id}`, {
        key: f.key,
      });
      assert.equal(r.status, 404, r.text);
      const e = r.body.error as { code: string; param: string | null };
      assert.equal(e.code, 'budget_alert_not_found');
      assert.equal(e.param, 'budget_alert_id', 'names the path parameter, as webhook_id does');
    }
    const list = await f.server.call('GET', `/${f.projectId}/v1/budget_alerts`, { key: f.key });
    assert.deepEqual(
      (list.body.data as Array<{ id: string }>).map((a) => a.id),
      [created.body.id],
    );
  });
});

describe('budget alerts per project', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await pricedFixture([]);
  });
  after(() => f.close());

  it(`at most ${MAX_BUDGET_ALERTS_PER_PROJECT}: one more is 400 budget_alert_limit, and a deletion frees a place`, async () => {
    const create = (name: string) =>
      f.server.call('POST', `/${f.projectId}/v1/budget_alerts`, {
        key: f.key,
        body: { name, budget_amount_cents: 100 },
      });
    const made: string[] = [];
    for (let i = 0; i < MAX_BUDGET_ALERTS_PER_PROJECT; i++) {
      const r = await create(`a${i}`);
      assert.equal(r.status, 201, r.text);
      made.push(String(r.body.id));
    }
    const over = await create('one more');
    assert.equal(over.status, 400, over.text);
    assert.equal((over.body.error as { code: string }).code, 'budget_alert_limit');
    const list = await f.server.call('GET', `/${f.projectId}/v1/budget_alerts`, { key: f.key });
    assert.equal((list.body.data as unknown[]).length, MAX_BUDGET_ALERTS_PER_PROJECT);
    const del = await f.server.call('DELETE', `/${f.projectId}/v1/budget_alerts/${made[0]}`, {
      key: f.key,
    });
    assert.equal(del.status, 200, del.text);
    assert.equal((await create('again')).status, 201);
  });
});

describe('budget alerts at the end of a month', () => {
  let f: InferenceFixture;
  const sent: Array<{ headers: Record<string, string>; body: string }> = [];
  before(async () => {
    // Usage is written only when the test flushes it.
    f = await pricedFixture(sent, { SWITCHYARD_USAGE_FLUSH_MS: '3600000' });
  });
  after(() => f.close());

  it("a crossing by requests of the month's last moments fires for that month, even when evaluated in the next", async () => {
    const hook = await f.server.call('POST', `/${f.projectId}/v1/webhooks`, {
      key: f.key,
      body: { url: 'https://hooks.example.com/b', events: ['budget.threshold_reached'] },
    });
    assert.equal(hook.status, 201, hook.text);
    const alert = await f.server.call('POST', `/${f.projectId}/v1/budget_alerts`, {
      key: f.key,
      body: { name: 'month end', budget_amount_cents: 1, thresholds: [100] },
    });
    assert.equal(alert.status, 201, alert.text);
    // A request that starts in the last second of November: its usage (and its cost)
    // belong to November, but the batch with it is written, and evaluated, in December.
    const monthEnd = Date.UTC(2026, 11, 1);
    f.server.clock.advance(monthEnd - 500 - f.server.clock.now());
    const r = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'spend' }],
      max_tokens: 4,
    });
    const cents = Math.floor((r.usage!.total_tokens * 100_000) / 1_000_000);
    assert.ok(cents >= 1, `spent ${cents} cents`);
    f.server.clock.advance(1_000);
    await f.server.services.usage.flush();
    await f.server.services.dispatcher.tick();
    assert.equal(sent.length, 1, "November's crossing was never reported");
    const body = JSON.parse(sent[0]!.body) as Record<string, unknown>;
    assert.equal(body.alertId, alert.body.id);
    assert.equal(body.threshold, 100);
    assert.equal(body.currentSpendCents, cents);
    // Reported once: December's own spend starts from nothing.
    const dec = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'december' }],
      max_tokens: 1,
    });
    f.server.clock.advance(1_001);
    await f.server.services.usage.flush();
    await f.server.services.dispatcher.tick();
    const decExact = (dec.usage!.total_tokens * 100_000) / 1_000_000;
    const bodies = sent.map((s) => JSON.parse(s.body) as { currentSpendCents: number });
    assert.equal(bodies.length, decExact >= 1 ? 2 : 1);
    if (decExact >= 1) assert.equal(bodies[1]!.currentSpendCents, Math.floor(decExact));
  });
});

describe('budget alerts of projects without alerts', () => {
  let f: InferenceFixture;
  const sent: Array<{ headers: Record<string, string>; body: string }> = [];
  before(async () => {
    f = await pricedFixture(sent);
  });
  after(() => f.close());

  it('are not re-read on every usage batch; an alert added elsewhere is seen within 5 s', async () => {
    const hook = await f.server.call('POST', `/${f.projectId}/v1/webhooks`, {
      key: f.key,
      body: { url: 'https://hooks.example.com/b', events: ['budget.threshold_reached'] },
    });
    assert.equal(hook.status, 201, hook.text);
    await spend(f); // read once: no alerts
    await alertFromElsewhere(f);
    await spend(f);
    assert.equal(sent.length, 0, 'the cached "no alerts" is trusted for 5 s');
    f.server.clock.advance(5_001);
    await spend(f);
    assert.equal(sent.length, 1);
    const body = JSON.parse(sent[0]!.body) as { alertName: string; threshold: number };
    assert.equal(body.alertName, 'elsewhere');
    assert.equal(body.threshold, 50);
  });

  it('evaluates a project at most once a second; a batch inside the second is evaluated at its end', async () => {
    f.server.clock.advance(1_001);
    await spend(f); // evaluated now: nothing new to fire
    assert.equal(sent.length, 1);
    const late = await f.server.call('POST', `/${f.projectId}/v1/budget_alerts`, {
      key: f.key,
      body: { name: 'late', budget_amount_cents: 1, thresholds: [100] },
    });
    assert.equal(late.status, 201, late.text);
    await spend(f); // inside the second: deferred
    assert.equal(sent.length, 1, 'evaluated again within the second');
    f.server.clock.advance(1_000);
    for (let i = 0; i < 100 && sent.length < 2; i++) {
      await new Promise((r) => setTimeout(r, 20));
      await f.server.services.dispatcher.tick();
    }
    assert.equal(sent.length, 2, 'the deferred evaluation did not run at the end of the second');
    const body = JSON.parse(sent[1]!.body) as { alertName: string; threshold: number };
    assert.equal(body.alertName, 'late');
    assert.equal(body.threshold, 100);
  });
});

describe('budget alerts created through another instance', () => {
  let f: InferenceFixture;
  const sent: Array<{ headers: Record<string, string>; body: string }> = [];
  before(async () => {
    f = await pricedFixture(sent);
  });
  after(() => f.close());

  it('a crossing by the last batch before the project goes quiet is reported when the cached "no alerts" ends', async () => {
    const hook = await f.server.call('POST', `/${f.projectId}/v1/webhooks`, {
      key: f.key,
      body: { url: 'https://hooks.example.com/b', events: ['budget.threshold_reached'] },
    });
    assert.equal(hook.status, 201, hook.text);
    await spend(f); // read: no alerts, trusted for 5 s
    await alertFromElsewhere(f);
    await spend(f); // the project's last batch: judged on the cached "no alerts"
    assert.equal(sent.length, 0);
    // No more spend: the end of the 5 s alone brings the evaluation.
    f.server.clock.advance(5_000);
    for (let i = 0; i < 100 && sent.length < 1; i++) {
      await new Promise((r) => setTimeout(r, 20));
      await f.server.services.dispatcher.tick();
    }
    assert.equal(sent.length, 1, 'the crossing was not reported without further spend');
    const body = JSON.parse(sent[0]!.body) as { alertName: string; threshold: number };
    assert.equal(body.alertName, 'elsewhere');
    assert.equal(body.threshold, 50);
  });
});
