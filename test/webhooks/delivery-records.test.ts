/**
 * Delivery records keep the spec's types (`http_status` integer,
 * `response_body` string) when there is no HTTP answer to show: before the
 * first attempt, after a network error and after a timeout (0 and '', as in
 * the test-delivery result), and in the record a redelivery returns.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { emitEvent } from '../../src/events/outbox.js';
import type { Sender } from '../../src/webhooks/sender.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

type Answer = 'refuse' | 'hang' | number;

/** A receiver that answers as told, fails to connect, or never answers. */
class ScriptedReceiver implements Sender {
  answers: Answer[] = [];
  async send(_url: string, _h: Record<string, string>, _b: string, signal: AbortSignal) {
    const a = this.answers.shift() ?? 200;
    if (a === 'refuse') {
      throw Object.assign(new Error('connect ECONNREFUSED 93.184.215.14:443'), {
        code: 'ECONNREFUSED',
      });
    }
    if (a === 'hang') {
      await new Promise((_resolve, reject) => {
        signal.addEventListener('abort', () => reject(new Error('aborted')), { once: true });
      });
    }
    return { status: Number(a), body: `answer ${String(a)}` };
  }
}

const publicResolver = async () => [{ address: '93.184.215.14', family: 4 }];

describe('webhook delivery records without an HTTP answer', () => {
  let s: TestServer;
  let rx: ScriptedReceiver;
  let base: string;
  let key: string;
  let projectUuid: string;
  before(async () => {
    rx = new ScriptedReceiver();
    s = await startTestServer({ deps: { webhookSender: rx, webhookResolver: publicResolver } });
    const p = await seedProject(s, { slug: 'records', scopes: ['management'] });
    key = p.key;
    projectUuid = (await s.services.projects.find('records'))!.id;
    const w = await s.call('POST', `/${p.projectId}/v1/webhooks`, {
      key,
      body: { url: 'https://hooks.example.com/in', events: ['exec.timeout'] },
    });
    assert.equal(w.status, 201, w.text);
    base = `/${p.projectId}/v1/webhooks/${String(w.body.id)}`;
  });
  after(() => s.close());

  async function emit(): Promise<void> {
    await s.services.store.db.transaction((tx) =>
      emitEvent(tx, {
        projectId: projectUuid,
        type: 'exec.timeout',
        data: {
          invocation_id: 'inv_1',
          timeout_ms: 1000,
          elapsed_ms: 1001,
          timed_out_at: new Date(s.clock.now()).toISOString(),
        },
        now: new Date(s.clock.now()),
      }),
    );
  }

  async function latest(): Promise<Record<string, unknown>> {
    const r = await s.call('GET', `${base}/deliveries?limit=1`, { key });
    assert.equal(r.status, 200, r.text);
    return (r.body.data as Array<Record<string, unknown>>)[0]!;
  }

  function assertSpecTypes(d: Record<string, unknown>): void {
    assert.ok(Number.isInteger(d.http_status), `http_status ${String(d.http_status)}`);
    assert.equal(typeof d.response_body, 'string');
  }

  it('before the first attempt: http_status 0, response_body empty', async () => {
    await emit();
    const d = await latest();
    assert.equal(d.status, 'pending');
    assert.equal(d.attempt_count, 0);
    assertSpecTypes(d);
    assert.equal(d.http_status, 0);
    assert.equal(d.response_body, '');
  });

  it('after a network error: 0 and empty, the reason in last_error', async () => {
    rx.answers = ['refuse'];
    await s.services.dispatcher.tick();
    const d = await latest();
    assert.equal(d.attempt_count, 1);
    assert.equal(d.status, 'pending');
    assertSpecTypes(d);
    assert.equal(d.http_status, 0);
    assert.equal(d.response_body, '');
    assert.match(String(d.last_error), /ECONNREFUSED/);
  });

  it('after a timeout: 0 and empty', async () => {
    rx.answers = ['hang'];
    s.clock.advance(60_000);
    const tick = s.services.dispatcher.tick();
    // The 30-second response timeout runs on the fake clock, armed before the
    // receiver is called.
    for (let i = 0; i < 200 && rx.answers.length > 0; i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(rx.answers.length, 0, 'the attempt reached the receiver');
    s.clock.advance(30_000);
    await tick;
    const d = await latest();
    assert.equal(d.attempt_count, 2);
    assertSpecTypes(d);
    assert.equal(d.http_status, 0);
    assert.equal(d.response_body, '');
    assert.match(String(d.last_error), /no response within 30 s/);
  });

  it('a redelivery returns its record with 0 and empty before its first attempt', async () => {
    rx.answers = [200];
    s.clock.advance(5 * 60_000);
    await s.services.dispatcher.tick();
    const delivered = await latest();
    assert.equal(delivered.status, 'delivered');
    assert.equal(delivered.http_status, 200);
    assert.equal(delivered.response_body, 'answer 200');
    const re = await s.call('POST', `${base}/deliveries/${String(delivered.id)}/redeliver`, {
      key,
    });
    assert.equal(re.status, 201, re.text);
    assert.equal(re.body.attempt_count, 0);
    assertSpecTypes(re.body);
    assert.equal(re.body.http_status, 0);
    assert.equal(re.body.response_body, '');
  });
});
