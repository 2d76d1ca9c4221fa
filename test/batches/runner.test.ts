/**
 * The batch runner across instances and its internal authentication:
 * two runners on one database run every request exactly once (counted at the
 * worker); a live lease keeps a batch from a second runner and an expired one
 * lets it take over; a stop does not wait out a batch's Retry-After; the internal
 * credential is refused from the network; a cancel that lands just before the batch is
 * finalised ends it cancelled.
 */
import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import OpenAI, { toFile } from 'openai';
import { BatchRunner } from '../../src/batches/runner.js';
import { INTERNAL_KEY_HEADER, internalKeyCredential } from '../../src/http/internal-key.js';
import { tables } from '../../src/store/index.js';
import { http } from '../support/harness.js';
import { inferenceFixture, until, type InferenceFixture } from '../support/inference.js';
import { chatLine, readLines, uploadBatchInput, waitForStatus } from './support.js';

describe('batch runner', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture();
  });
  after(() => f.close());
  beforeEach(() => f.server.clock.advance(61_000));

  const create = async (prefix: string, n: number) => {
    const input = await uploadBatchInput(
      f,
      Array.from({ length: n }, (_, i) => chatLine(`${prefix}-${i}`)),
    );
    return f.client.batches.create({
      input_file_id: input,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    });
  };

  it('two runners on one database run each request exactly once', async () => {
    const before = f.worker.stats().received;
    const batches = [await create('a', 6), await create('b', 6), await create('c', 6)];
    const one = new BatchRunner(f.server.services, f.server.app, { pollMs: 5, concurrency: 2 });
    const two = new BatchRunner(f.server.services, f.server.app, { pollMs: 5, concurrency: 2 });
    one.start();
    two.start();
    try {
      for (const b of batches) await waitForStatus(f, b.id, ['completed']);
    } finally {
      await Promise.all([one.stop(), two.stop()]);
    }
    assert.equal(f.worker.stats().received - before, 18);
    assert.equal(one.stats.requests + two.stats.requests, 18);
    assert.equal(one.stats.finalized + two.stats.finalized, 3);
    for (const [i, b] of batches.entries()) {
      const done = await f.client.batches.retrieve(b.id);
      assert.deepEqual(done.request_counts, { total: 6, completed: 6, failed: 0 });
      const lines = await readLines(f, done.output_file_id!);
      const prefix = ['a', 'b', 'c'][i]!;
      assert.deepEqual(
        lines.map((l) => l.custom_id),
        Array.from({ length: 6 }, (_, j) => `${prefix}-${j}`),
      );
    }
  });

  it('a live lease keeps the batch from another runner; an expired one is taken over', async () => {
    const batch = await create('l', 2);
    const a = new BatchRunner(f.server.services, f.server.app, { pollMs: 5, leaseMs: 30_000 });
    const b = new BatchRunner(f.server.services, f.server.app, { pollMs: 5, leaseMs: 30_000 });
    const first = await a.claim();
    assert.equal(first?.id, batch.id);
    assert.equal(await b.claim(), null);
    // Runner `a` died holding it: once the lease has run out, `b` takes over with a new token.
    f.server.clock.advance(30_001);
    const second = await b.claim();
    assert.equal(second?.id, batch.id);
    assert.equal(second!.token, first!.token + 1);
    // Let `b`'s lease run out as well, then a running runner finishes the batch.
    f.server.clock.advance(30_001);
    b.start();
    try {
      await waitForStatus(f, batch.id, ['completed']);
    } finally {
      await b.stop();
    }
    const done = await f.client.batches.retrieve(batch.id);
    assert.deepEqual(done.request_counts, { total: 2, completed: 2, failed: 0 });
  });

  it('stops promptly while a batch waits out a Retry-After, and gives its lease back', async () => {
    // A key whose quota (upload, create, one request) runs out for an hour: the
    // second request is a 429 whose Retry-After the runner waits (at most 30 s).
    const k = await f.server.admin('POST', '/projects/inf/keys', {
      scopes: ['inference'],
      quotaRequests: 3,
      quotaWindow: 3600,
    });
    const client = new OpenAI({ baseURL: f.baseURL, apiKey: String(k.body.key), maxRetries: 0 });
    const input = await client.files.create({
      file: await toFile(Buffer.from(`${chatLine('w-0')}\n${chatLine('w-1')}\n`), 'w.jsonl'),
      purpose: 'batch',
    });
    const batch = await client.batches.create({
      input_file_id: input.id,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    });
    const runner = new BatchRunner(f.server.services, f.server.app, { pollMs: 5, concurrency: 1 });
    const before = f.worker.stats().received;
    runner.start();
    await until(() => runner.stats.requests >= 2, 'the second request', 200_000);
    // Let the idle loop go round a few times while the batch waits.
    await new Promise((r) => setTimeout(r, 50));
    const started = Date.now();
    await runner.stop();
    const took = Date.now() - started;
    assert.ok(took < 5000, `stop took ${took} ms`);
    assert.equal(f.worker.stats().received - before, 1);
    const [row] = await f.server.services.store.db
      .select({ status: tables.batches.status, leaseUntil: tables.batches.leaseUntil })
      .from(tables.batches)
      .where(eq(tables.batches.id, batch.id));
    assert.deepEqual(row, { status: 'in_progress', leaseUntil: null });
  });

  it('refuses the internal credential from the network, even a genuine one', async () => {
    const [key] = await f.server.services.store.db.select().from(tables.apiKeys);
    const body = { model: 'x', messages: [{ role: 'user', content: 'hi' }] };
    for (const value of [
      'forged.00000000-0000-0000-0000-000000000000.00000000-0000-0000-0000-000000000000',
      internalKeyCredential(key!.projectId, key!.id),
    ]) {
      const res = await http('POST', `${f.baseURL}/chat/completions`, {
        body,
        headers: { [INTERNAL_KEY_HEADER]: value },
      });
      assert.equal(res.status, 401, res.text);
      assert.equal((res.body.error as { code: string }).code, 'missing_api_key');
    }
    // In-process with a forged token: no key either.
    const forged = await f.server.app.inject({
      method: 'POST',
      url: `/${f.projectId}/chat/v1/chat/completions`,
      headers: {
        'content-type': 'application/json',
        [INTERNAL_KEY_HEADER]: `${'0'.repeat(64)}.${key!.projectId}.${key!.id}`,
      },
      payload: JSON.stringify(body),
    });
    assert.equal(forged.statusCode, 401);
    // And the genuine one in-process is good for inference only, not for management routes.
    const keys = await f.server.app.inject({
      method: 'GET',
      url: `/${f.projectId}/v1/keys`,
      headers: { [INTERNAL_KEY_HEADER]: internalKeyCredential(key!.projectId, key!.id) },
    });
    assert.equal(keys.statusCode, 401);
    const ok = await f.server.app.inject({
      method: 'POST',
      url: `/${f.projectId}/chat/v1/chat/completions`,
      headers: {
        'content-type': 'application/json',
        [INTERNAL_KEY_HEADER]: internalKeyCredential(key!.projectId, key!.id),
      },
      payload: JSON.stringify(body),
    });
    assert.equal(ok.statusCode, 200, ok.body);
  });

  it('a cancel that lands after the last request ran, before the batch is finalised, ends it cancelled', async () => {
    const batch = await create('x', 1);
    const r = new BatchRunner(f.server.services, f.server.app, { pollMs: 5 });
    // The oldest claimable batch first: one an earlier test gave back may come before it.
    let claimed = await r.claim();
    while (claimed !== null && claimed.id !== batch.id) claimed = await r.claim();
    assert.equal(claimed?.id, batch.id);
    // The runner found no pending request and goes to finalise it as completed; the
    // cancel lands in between.
    assert.equal((await f.client.batches.cancel(batch.id)).status, 'cancelling');
    await (r as unknown as { finalize(b: unknown, o: string): Promise<void> }).finalize(
      claimed,
      'completed',
    );
    const done = await f.client.batches.retrieve(batch.id);
    assert.equal(done.status, 'cancelled');
    assert.ok(done.cancelled_at !== null && done.completed_at === null, JSON.stringify(done));
    const types = (
      await f.server.services.store.db
        .select({ type: tables.events.type, body: tables.events.body })
        .from(tables.events)
    )
      .filter((e) => e.body.includes(batch.id))
      .map((e) => e.type);
    assert.ok(
      types.includes('batch.cancelled') && !types.includes('batch.completed'),
      types.join(),
    );
  });
});
