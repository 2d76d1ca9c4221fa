/**
 * The webhook API over HTTP with a real HTTPS receiver on loopback (allowed by
 * the operator setting, its certificate trusted through the CA setting): the
 * spec's routes and shapes, limits (20 endpoints, 16 metadata pairs, 10 tests
 * an hour, the 60/minute management limit), SSRF refusals, reserved types,
 * pagination, deletion with its deliveries, redelivery and attempts.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { emitEvent } from '../../src/events/outbox.js';
import { tables } from '../../src/store/index.js';
import { verifyWebhook } from '../../src/webhooks/signing.js';
import { startReceiver, type Receiver } from '../support/https-receiver.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

function err(r: { body: Record<string, unknown> }): Record<string, unknown> {
  return (r.body.error ?? {}) as Record<string, unknown>;
}

describe('webhook API', () => {
  let s: TestServer;
  let rx: Receiver;
  let p: Awaited<ReturnType<typeof seedProject>>;
  let base: string;
  before(async () => {
    rx = await startReceiver();
    s = await startTestServer({
      env: { SWITCHYARD_WEBHOOK_ALLOW_CIDRS: '127.0.0.0/8', SWITCHYARD_WEBHOOK_CA_FILE: rx.caFile },
    });
    p = await seedProject(s, {
      slug: 'wh',
      scopes: ['management', 'inference'],
      quotaRequests: 100_000,
    });
    base = `/${p.projectId}/main/v1/webhooks`;
  });
  after(async () => {
    await s.close();
    await rx.close();
  });

  const call = (method: string, path: string, body?: unknown) =>
    s.call(method, path, { key: p.key, body });

  it('creates an endpoint (secret only here) and reads, lists, updates it', async () => {
    const r = await call('POST', base, {
      url: rx.url,
      events: ['exec.completed', 'exec.ambiguous'],
      description: 'primary',
      metadata: { team: 'ops' },
    });
    assert.equal(r.status, 201, r.text);
    assert.match(String(r.body.secret), /^whsec_[A-Za-z0-9_-]{20,}$/);
    assert.match(String(r.body.id), /^[0-9a-f-]{36}$/);
    assert.deepEqual(Object.keys(r.body).sort(), [
      'created_at',
      'description',
      'events',
      'id',
      'is_active',
      'metadata',
      'object',
      'secret',
      'updated_at',
      'url',
    ]);
    assert.equal(r.body.object, 'webhook_endpoint');
    assert.equal(r.body.is_active, true);
    const id = String(r.body.id);
    const got = await call('GET', `${base}/${id}`);
    assert.equal(got.status, 200);
    assert.equal('secret' in got.body, false);
    // The same endpoint is visible on the project-level path.
    assert.equal((await call('GET', `/${p.projectId}/v1/webhooks/${id}`)).status, 200);
    s.clock.advance(2000);
    const u = await call('PUT', `${base}/${id}`, { description: 'renamed', is_active: false });
    assert.equal(u.status, 200, u.text);
    assert.equal(u.body.description, 'renamed');
    assert.equal(u.body.is_active, false);
    assert.deepEqual(u.body.events, ['exec.completed', 'exec.ambiguous']);
    assert.deepEqual(u.body.metadata, { team: 'ops' });
    assert.equal(Number(u.body.updated_at) - Number(u.body.created_at), 2);
    const m = await call('PUT', `${base}/${id}`, { metadata: { x: '1' }, is_active: true });
    assert.deepEqual(m.body.metadata, { x: '1' });
    // The limit itself is allowed (16 pairs), and a type listed twice is kept once.
    const sixteen = Object.fromEntries(Array.from({ length: 16 }, (_, i) => [`k${i}`, 'v']));
    const full = await call('PUT', `${base}/${id}`, {
      metadata: sixteen,
      events: ['exec.completed', 'exec.failed', 'exec.completed'],
    });
    assert.equal(full.status, 200, full.text);
    assert.deepEqual(full.body.metadata, sixteen);
    assert.deepEqual(full.body.events, ['exec.completed', 'exec.failed']);
    const empty = await call('PUT', `${base}/${id}`, { events: [] });
    assert.equal(empty.status, 400);
    assert.equal(err(empty).param, 'events');
  });

  it('refuses bad input with 400 naming the field, and internal URLs (SSRF)', async () => {
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ events: ['exec.completed'] }, 'url'],
      [{ url: 'http://example.com/h', events: ['exec.completed'] }, 'url'],
      [{ url: 'https://169.254.169.254/latest', events: ['exec.completed'] }, 'url'],
      [{ url: 'https://10.0.0.1/h', events: ['exec.completed'] }, 'url'],
      [{ url: 'https://[::ffff:10.0.0.1]/h', events: ['exec.completed'] }, 'url'],
      [{ url: 'https://localhost.internal/h', events: ['exec.completed'] }, 'url'],
      [{ url: rx.url }, 'events'],
      [{ url: rx.url, events: [] }, 'events'],
      [{ url: rx.url, events: ['no.such.event'] }, 'events[0]'],
      [
        {
          url: rx.url,
          events: ['exec.completed'],
          metadata: Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, 'v'])),
        },
        'metadata',
      ],
      [
        { url: rx.url, events: ['exec.completed'], metadata: { ['k'.repeat(65)]: 'v' } },
        'metadata',
      ],
      [{ url: rx.url, events: ['exec.completed'], secret: 'mine' }, 'secret'],
    ];
    for (const [body, param] of cases) {
      const r = await call('POST', base, body);
      assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
      assert.equal(err(r).code, 'invalid_body');
      assert.ok(
        String(err(r).param).startsWith(param),
        `${JSON.stringify(body)} -> ${String(err(r).param)}`,
      );
    }
    assert.equal((await call('GET', `${base}/not-a-uuid`)).status, 404);
    assert.equal((await call('GET', `/${p.projectId}/nosuch/v1/webhooks`)).status, 404);
  });

  it('test delivery: a signed webhook.test envelope, the spec result shape', async () => {
    const c = await call('POST', base, { url: rx.url, events: ['exec.failed'] });
    const id = String(c.body.id);
    const secret = String(c.body.secret);
    rx.received = [];
    const r = await call('POST', `${base}/${id}/test`);
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.body, {
      success: true,
      http_status: 200,
      response_body: 'thanks',
      error_message: null,
    });
    const got = rx.received[0]!;
    assert.equal(
      verifyWebhook({
        secret,
        body: got.body,
        timestamp: got.headers['x-webhook-timestamp'],
        signature: got.headers['x-webhook-signature'],
        nowSeconds: Math.floor(s.clock.now() / 1000),
      }).ok,
      true,
    );
    assert.equal(JSON.parse(got.body).type, 'webhook.test');
    assert.match(got.headers['x-webhook-id']!, /^del_/);
    rx.behaviour = () => 'redirect';
    const redirected = await call('POST', `${base}/${id}/test`);
    assert.equal(redirected.body.success, false);
    assert.equal(redirected.body.http_status, 302);
    rx.behaviour = () => 'ok';
    // 10 per webhook per hour.
    for (let i = 2; i < 10; i++)
      assert.equal((await call('POST', `${base}/${id}/test`)).status, 200);
    const limited = await call('POST', `${base}/${id}/test`);
    assert.equal(limited.status, 429);
    assert.equal(err(limited).code, 'rate_limit_exceeded');
    assert.ok(Number(limited.headers['retry-after']) > 0);
    assert.equal(typeof err(limited).retry_after, 'number');
    // The headers describe the rule that refused (the hourly test budget), their reset
    // equal to Retry-After; the inference-only headers are not sent here.
    assert.equal(limited.headers['x-ratelimit-limit'], '10');
    assert.equal(limited.headers['x-ratelimit-remaining'], '0');
    assert.equal(limited.headers['x-ratelimit-reset'], limited.headers['retry-after']);
    assert.equal(limited.headers['ratelimit-limit'], undefined);
    assert.equal(limited.headers['ratelimit-limit'], undefined);
    assert.equal(limited.headers['x-ratelimit-warning'], undefined);
    s.clock.advance(3600_000);
    assert.equal((await call('POST', `${base}/${id}/test`)).status, 200);
  });

  it('delivers emitted events, lists deliveries with a cursor, shows attempts, redelivers', async () => {
    const c = await call('POST', base, { url: rx.url, events: ['exec.timeout'] });
    const id = String(c.body.id);
    const project = (await s.services.projects.find('wh'))!;
    rx.received = [];
    for (let i = 0; i < 3; i++) {
      await s.services.store.db.transaction((tx) =>
        emitEvent(tx, {
          projectId: project.id,
          type: 'exec.timeout',
          data: {
            invocation_id: `inv_${i}`,
            timeout_ms: 1000,
            elapsed_ms: 1001,
            timed_out_at: new Date().toISOString(),
          },
          now: new Date(s.clock.now()),
        }),
      );
      s.clock.advance(1000);
    }
    rx.behaviour = (r) => (JSON.parse(r.body).data.invocation_id === 'inv_1' ? 'fail' : 'ok');
    await s.services.dispatcher.tick();
    const list = await call('GET', `${base}/${id}/deliveries?limit=2`);
    assert.equal(list.status, 200);
    assert.equal(list.body.object, 'list');
    assert.equal(list.body.has_more, true);
    const page1 = list.body.data as Array<Record<string, unknown>>;
    assert.equal(page1.length, 2);
    for (const d of page1) {
      assert.equal(d.object, 'webhook_delivery');
      assert.match(String(d.id), /^del_/);
      assert.equal(d.event_type, 'exec.timeout');
      assert.equal(d.attempt_count, 1);
    }
    const next = await call(
      'GET',
      `${base}/${id}/deliveries?limit=2&after=${String(page1[1]!.id)}`,
    );
    assert.equal(next.body.has_more, false);
    const all = [...page1, ...(next.body.data as Array<Record<string, unknown>>)];
    assert.equal(new Set(all.map((d) => d.id)).size, 3);
    const failed = all.find((d) => d.status === 'pending')!;
    assert.equal(failed.http_status, 500);
    assert.equal(all.filter((d) => d.status === 'delivered').length, 2);
    const attempts = await call('GET', `${base}/${id}/deliveries/${String(failed.id)}/attempts`);
    assert.deepEqual(
      (attempts.body.data as Array<Record<string, unknown>>).map((a) => [
        a.attempt,
        a.outcome,
        a.http_status,
      ]),
      [[1, 'failed', 500]],
    );
    const bad = await call('GET', `${base}/${id}/deliveries?limit=500`);
    assert.equal(bad.status, 400);
    assert.equal(err(bad).param, 'limit');
    // A cursor that names nothing is bad input, whatever its form (was a 500 for a non-UUID).
    for (const path of [
      `${base}?after=zzz`,
      `${base}?after=00000000-0000-4000-8000-000000000000`,
      `${base}/${id}/deliveries?after=zzz`,
    ]) {
      const r = await call('GET', path);
      assert.equal(r.status, 400, `${path}: ${r.text}`);
      assert.deepEqual([err(r).code, err(r).param], ['invalid_body', 'after']);
    }
    const delivered = all.find((d) => d.status === 'delivered')!;
    rx.behaviour = () => 'ok';
    const re = await call('POST', `${base}/${id}/deliveries/${String(delivered.id)}/redeliver`);
    assert.equal(re.status, 201, re.text);
    assert.notEqual(re.body.id, delivered.id);
    await s.services.dispatcher.tick();
    assert.equal(rx.received.filter((r) => r.headers['x-webhook-id'] === re.body.id).length, 1);
  });

  it('reserved types are accepted but never emitted', async () => {
    const c = await call('POST', base, { url: rx.url, events: ['exec.workspace_created'] });
    assert.equal(c.status, 201);
    const project = (await s.services.projects.find('wh'))!;
    await assert.rejects(
      s.services.store.db.transaction((tx) =>
        emitEvent(tx, {
          projectId: project.id,
          type: 'exec.workspace_created',
          data: {},
          now: new Date(),
        }),
      ),
      /reserved/,
    );
  });

  it('delete returns a JSON confirmation and removes the delivery records', async () => {
    const c = await call('POST', base, { url: rx.url, events: ['exec.timeout'] });
    const id = String(c.body.id);
    await call('POST', `${base}/${id}/test`);
    const r = await call('DELETE', `${base}/${id}`);
    assert.equal(r.status, 200);
    assert.deepEqual(r.body, { id, object: 'webhook_endpoint', deleted: true });
    const left = await s.services.store.db
      .select()
      .from(tables.webhookDeliveries)
      .where(eq(tables.webhookDeliveries.endpointId, id));
    assert.equal(left.length, 0);
    assert.equal((await call('GET', `${base}/${id}`)).status, 404);
  });

  it('at most 20 endpoints per project', async () => {
    const list = await call('GET', `${base}?limit=100`);
    const have = (list.body.data as unknown[]).length;
    for (let i = have; i < 20; i++) {
      assert.equal(
        (await call('POST', base, { url: rx.url, events: ['exec.failed'] })).status,
        201,
      );
    }
    const over = await call('POST', base, { url: rx.url, events: ['exec.failed'] });
    assert.equal(over.status, 400);
    assert.equal(err(over).code, 'webhook_endpoint_limit');
    const paged = await call('GET', `${base}?limit=7`);
    assert.equal((paged.body.data as unknown[]).length, 7);
    assert.equal(paged.body.has_more, true);
  });

  it('the management limit: 60 per minute per project, inference not counted', async () => {
    s.clock.advance(120_000);
    let last: Awaited<ReturnType<typeof call>> | undefined;
    for (let i = 0; i < 60; i++) {
      last = await call('GET', `${base}?limit=1`);
      assert.equal(last.status, 200);
      // Inference routes in between do not count against it.
      await call('GET', `/${p.projectId}/v1/models`);
    }
    assert.equal(last!.headers['x-ratelimit-limit'], '60');
    assert.equal(last!.headers['x-ratelimit-remaining'], '0');
    const limited = await call('GET', `${base}?limit=1`);
    assert.equal(limited.status, 429);
    assert.equal(err(limited).code, 'rate_limit_exceeded');
    assert.equal(limited.headers['retry-after'], '60');
    s.clock.advance(60_000);
    assert.equal((await call('GET', `${base}?limit=1`)).status, 200);
  });
});
