/**
 * The stored response body (spec: delivery record `response_body`, stored up to
 * 1 KiB): the first 1024 bytes of what the receiver answered, cut at a character
 * boundary, so that what is stored is a prefix of the answer and never ends in a
 * replacement character the receiver did not send; a U+0000, which PostgreSQL's
 * text cannot hold, is kept as U+FFFD (the answer was recorded, not retried).
 * Real HTTPS receiver on
 * loopback, the router's own guarded sender, read through the test route and
 * the delivery records.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { emitEvent } from '../../src/events/outbox.js';
import { tables } from '../../src/store/index.js';
import { startReceiver, type Receiver } from '../support/https-receiver.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

describe('stored response body', () => {
  let s: TestServer;
  let rx: Receiver;
  let base: string;
  let key: string;
  before(async () => {
    rx = await startReceiver();
    s = await startTestServer({
      env: { SWITCHYARD_WEBHOOK_ALLOW_CIDRS: '127.0.0.0/8', SWITCHYARD_WEBHOOK_CA_FILE: rx.caFile },
    });
    const p = await seedProject(s, { slug: 'bodies', scopes: ['management'] });
    base = `/${p.projectId}/v1/webhooks`;
    key = p.key;
  });
  after(async () => {
    await s.close();
    await rx.close();
  });

  const a = (n: number) => 'a'.repeat(n);
  // [answer, what is stored]: 1 KiB of bytes, a character split by the limit left out.
  const cases: Array<[string, string, string]> = [
    ['a 4-byte character with 3 of its bytes inside the limit', a(1021) + '😀 more', a(1021)],
    ['a 4-byte character with 2 of its bytes inside the limit', a(1022) + '😀 more', a(1022)],
    ['a 3-byte character with 2 of its bytes inside the limit', a(1022) + '✓ more', a(1022)],
    ['a 2-byte character with 1 of its bytes inside the limit', a(1023) + 'é more', a(1023)],
    ['a character ending exactly at the limit', a(1020) + '😀 more', a(1020) + '😀'],
    ['2-byte characters only', 'é'.repeat(600), 'é'.repeat(512)],
    ['a short answer', 'thanks ✓', 'thanks ✓'],
    ['a NUL character', 'ok\u0000done', 'ok\uFFFDdone'],
    ['NUL characters only, 1 KiB of them', '\u0000'.repeat(1024), '\uFFFD'.repeat(341)],
  ];
  for (const [name, answer, stored] of cases) {
    it(name, async () => {
      const c = await s.call('POST', base, {
        key,
        body: { url: rx.url, events: ['exec.failed'] },
      });
      assert.equal(c.status, 201, c.text);
      const id = String(c.body.id);
      rx.behaviour = () => ({ status: 200, body: Buffer.from(answer, 'utf8') });
      const t = await s.call('POST', `${base}/${id}/test`, { key });
      assert.equal(t.status, 200, t.text);
      assert.equal(t.body.success, true);
      const list = await s.call('GET', `${base}/${id}/deliveries`, { key });
      const [d] = list.body.data as Array<Record<string, unknown>>;
      for (const got of [String(t.body.response_body), String(d!.response_body)]) {
        assert.ok(Buffer.byteLength(got) <= 1024);
        // Length and end first: a readable failure for a kilobyte of 'a'.
        assert.deepEqual([got.length, got.slice(-3)], [stored.length, stored.slice(-3)]);
        assert.equal(got, stored);
      }
      await s.call('DELETE', `${base}/${id}`, { key });
    });
  }

  it('a delivery answered 2xx with a NUL character is delivered once, not retried', async () => {
    const c = await s.call('POST', base, { key, body: { url: rx.url, events: ['exec.failed'] } });
    assert.equal(c.status, 201, c.text);
    const project = (await s.services.projects.find('bodies'))!;
    rx.received = [];
    rx.behaviour = () => ({ status: 200, body: Buffer.from('ok\u0000') });
    const e = await s.services.store.db.transaction((tx) =>
      emitEvent(tx, {
        projectId: project.id,
        type: 'exec.failed',
        data: {
          invocation_id: 'inv_1',
          error_code: 'tool_error',
          error_message: 'exit 1',
          failed_at: new Date(s.clock.now()).toISOString(),
        },
        now: new Date(s.clock.now()),
      }),
    );
    assert.equal(await s.services.dispatcher.tick(), 1);
    const read = async () =>
      (
        await s.services.store.db
          .select()
          .from(tables.webhookDeliveries)
          .where(eq(tables.webhookDeliveries.id, e.deliveries[0]!))
      )[0]!;
    const d = await read();
    assert.deepEqual(
      [d.status, d.attemptCount, d.httpStatus, d.responseBody],
      ['delivered', 1, 200, 'ok\uFFFD'],
    );
    s.clock.advance(24 * 3600_000);
    assert.equal(await s.services.dispatcher.tick(), 0);
    assert.equal(rx.received.length, 1);
    await s.call('DELETE', `${base}/${String(c.body.id)}`, { key });
  });
});
