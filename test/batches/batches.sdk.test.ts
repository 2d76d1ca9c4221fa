/**
 * The Batch API with the official OpenAI SDK against a `sim` worker: a batch of
 * chat completions runs to `completed` through the real inference path (usage
 * records, the creating key), its output file holds one valid completion per line
 * in input order and failed lines go to the error file; cancel; expiry by the
 * injected clock; a revoked key fails the remaining lines; refusals with `param`;
 * other projects cannot see a batch.
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, afterEach, before, beforeEach, describe, it } from 'node:test';
import { eq, sql } from 'drizzle-orm';
import OpenAI from 'openai';
import { BatchRunner } from '../../src/batches/runner.js';
import { tables } from '../../src/store/index.js';
import {
  apiError,
  inferenceEndpoint,
  inferenceFixture,
  type InferenceFixture,
} from '../support/inference.js';
import { validateCompletion } from '../support/openai-schemas.js';
import { chatLine, readLines, uploadBatchInput, waitForStatus } from './support.js';

describe('batches with the OpenAI SDK', () => {
  let f: InferenceFixture;
  let runner: BatchRunner | null = null;
  const startRunner = () => {
    runner = new BatchRunner(f.server.services, f.server.app, { pollMs: 10 });
    runner.start();
    return runner;
  };
  before(async () => {
    f = await inferenceFixture();
  });
  after(() => f.close());
  // The shared management limit is 60 a minute per project; each test starts a new minute.
  beforeEach(() => f.server.clock.advance(61_000));
  afterEach(async () => {
    await runner?.stop();
    runner = null;
  });

  it('runs a batch of chat completions to completed; output in input order, usage recorded', async () => {
    const before = f.worker.stats().received;
    const ids = ['q-1', 'q-2', 'q-3', 'q-4', 'q-5', 'q-6'];
    const inputFileId = await uploadBatchInput(f, [
      ...ids.map((id) => chatLine(id)),
      // A request the chat route refuses: it lands in the error file.
      JSON.stringify({
        custom_id: 'bad',
        method: 'POST',
        url: '/v1/chat/completions',
        body: { model: 'x', messages: [] },
      }),
    ]);
    const created = await f.client.batches.create({
      input_file_id: inputFileId,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
      metadata: { job: 'nightly' },
    });
    assert.match(created.id, /^batch_[0-9a-f]{24}$/);
    assert.equal(created.object, 'batch');
    assert.equal(created.status, 'validating');
    assert.equal(created.endpoint, '/v1/chat/completions');
    assert.equal(created.input_file_id, inputFileId);
    assert.equal(created.completion_window, '24h');
    assert.deepEqual(created.request_counts, { total: 7, completed: 0, failed: 0 });
    assert.deepEqual(created.metadata, { job: 'nightly' });
    assert.equal(created.expires_at, created.created_at + 24 * 3600);
    assert.equal(created.output_file_id, null);
    assert.equal(created.errors, null);

    startRunner();
    await waitForStatus(f, created.id, ['completed']);
    const done = await f.client.batches.retrieve(created.id);
    assert.equal(done.status, 'completed');
    assert.deepEqual(done.request_counts, { total: 7, completed: 6, failed: 1 });
    assert.ok(done.in_progress_at && done.finalizing_at && done.completed_at);
    assert.equal(done.cancelled_at, null);
    assert.ok(done.output_file_id && done.error_file_id);
    assert.equal(f.worker.stats().received - before, 6);

    const output = await f.client.files.retrieve(done.output_file_id);
    assert.equal(output.purpose, 'batch_output');
    const lines = await readLines(f, done.output_file_id);
    assert.deepEqual(
      lines.map((l) => l.custom_id),
      ids,
    );
    const text = await (await f.client.files.content(done.output_file_id)).text();
    assert.equal(Buffer.byteLength(text), output.bytes);
    for (const l of lines) {
      assert.match(l.id, /^batch_req_[0-9a-f]{24}$/);
      assert.equal(l.error, null);
      assert.equal(l.response!.status_code, 200);
      assert.deepEqual(validateCompletion(l.response!.body), []);
      assert.equal(l.response!.request_id, l.response!.body.id);
      assert.equal(l.response!.body.object, 'chat.completion');
      assert.equal(l.response!.body.model, 'sim-model');
    }
    const errors = await readLines(f, done.error_file_id);
    assert.equal(errors.length, 1);
    assert.equal(errors[0]!.custom_id, 'bad');
    assert.equal(errors[0]!.response!.status_code, 400);
    assert.equal(
      (errors[0]!.response!.body as { error: { param: string } }).error.param,
      'messages',
    );

    // Each request went through the inference path: a usage record per completion, as the key.
    await f.server.services.usage.flush();
    const usage = await f.server.services.store.db.select().from(tables.usageRecords);
    const requestIds = new Set(lines.map((l) => l.response!.request_id));
    const mine = usage.filter((u) => requestIds.has(u.requestId));
    assert.equal(mine.length, 6);
    const [key] = await f.server.services.store.db.select().from(tables.apiKeys);
    for (const u of mine) {
      assert.equal(u.status, 'completed');
      assert.equal(u.keyId, key!.id);
      assert.ok(u.completionTokens > 0);
    }
    // The working rows are gone once the files are written.
    assert.equal((await f.server.services.store.db.select().from(tables.batchRequests)).length, 0);

    const list = await f.client.batches.list({ limit: 10 });
    assert.equal(list.data[0]!.id, created.id);
  });

  it('cancels: cancelling, then cancelled by the runner without running the requests', async () => {
    const before = f.worker.stats().received;
    const inputFileId = await uploadBatchInput(
      f,
      ['c1', 'c2', 'c3'].map((id) => chatLine(id)),
    );
    const batch = await f.client.batches.create({
      input_file_id: inputFileId,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    });
    const cancelling = await f.client.batches.cancel(batch.id);
    assert.equal(cancelling.status, 'cancelling');
    assert.equal(typeof cancelling.cancelling_at, 'number');
    assert.equal((await f.client.batches.cancel(batch.id)).status, 'cancelling');
    startRunner();
    await waitForStatus(f, batch.id, ['cancelled']);
    const cancelled = await f.client.batches.retrieve(batch.id);
    assert.equal(cancelled.status, 'cancelled');
    assert.equal(typeof cancelled.cancelled_at, 'number');
    assert.deepEqual(cancelled.request_counts, { total: 3, completed: 0, failed: 0 });
    assert.equal(cancelled.output_file_id, null);
    assert.equal(f.worker.stats().received, before);
    // A finished batch cannot be cancelled again into another state.
    assert.equal((await f.client.batches.cancel(batch.id)).status, 'cancelled');
  });

  it('cancels a running batch: requests not yet started are not run', async () => {
    const before = f.worker.stats().received;
    const inputFileId = await uploadBatchInput(
      f,
      Array.from({ length: 40 }, (_, i) => chatLine(`r${i}`)),
    );
    const batch = await f.client.batches.create({
      input_file_id: inputFileId,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    });
    runner = new BatchRunner(f.server.services, f.server.app, { pollMs: 10, concurrency: 1 });
    runner.start();
    const r = runner;
    for (let i = 0; i < 2000 && r.stats.requests < 3; i++)
      await new Promise((x) => setTimeout(x, 2));
    await f.client.batches.cancel(batch.id);
    await waitForStatus(f, batch.id, ['cancelled']);
    const done = await f.client.batches.retrieve(batch.id);
    const ran = f.worker.stats().received - before;
    assert.ok(ran >= 3 && ran < 40, `ran ${ran}`);
    assert.equal(done.request_counts!.completed, ran);
    assert.equal((await readLines(f, done.output_file_id!)).length, ran);
  });

  it('expires after the 24 h window by the injected clock; requests not run go to the error file', async () => {
    const before = f.worker.stats().received;
    const inputFileId = await uploadBatchInput(
      f,
      ['e1', 'e2'].map((id) => chatLine(id)),
    );
    const batch = await f.client.batches.create({
      input_file_id: inputFileId,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    });
    f.server.clock.advance(24 * 3600 * 1000);
    startRunner();
    await waitForStatus(f, batch.id, ['expired']);
    const expired = await f.client.batches.retrieve(batch.id);
    assert.equal(expired.status, 'expired');
    assert.equal(typeof expired.expired_at, 'number');
    assert.deepEqual(expired.request_counts, { total: 2, completed: 0, failed: 2 });
    assert.equal(expired.output_file_id, null);
    const errors = await readLines(f, expired.error_file_id!);
    assert.deepEqual(
      errors.map((e) => [e.custom_id, e.response, e.error?.code]),
      [
        ['e1', null, 'batch_expired'],
        ['e2', null, 'batch_expired'],
      ],
    );
    assert.equal(f.worker.stats().received, before);
  });

  it('runs as the creating key: once it is revoked, the remaining requests fail with 401', async () => {
    const k = await f.server.admin('POST', '/projects/inf/keys', { scopes: ['inference'] });
    const client = new OpenAI({ baseURL: f.baseURL, apiKey: String(k.body.key), maxRetries: 0 });
    const inputFileId = (
      await client.files.create({
        file: await (
          await import('openai')
        ).toFile(Buffer.from(['v1', 'v2'].map((id) => chatLine(id)).join('\n')), 'b.jsonl'),
        purpose: 'batch',
      })
    ).id;
    const batch = await client.batches.create({
      input_file_id: inputFileId,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    });
    await f.server.admin('DELETE', `/projects/inf/keys/${String(k.body.id)}`);
    startRunner();
    await waitForStatus(f, batch.id, ['completed']);
    const done = await f.client.batches.retrieve(batch.id);
    assert.deepEqual(done.request_counts, { total: 2, completed: 0, failed: 2 });
    const errors = await readLines(f, done.error_file_id!);
    for (const e of errors) {
      assert.equal(e.response!.status_code, 401);
      assert.equal((e.response!.body as { error: { code: string } }).error.code, 'invalid_api_key');
    }
  });

  it('refuses bad input with 400 and the param, unknown ids with 404', async () => {
    const chatFile = await uploadBatchInput(f, [chatLine('x')]);
    const cases: [Record<string, unknown>, number, string, string][] = [
      [{ endpoint: '/v1/embeddings' }, 400, 'invalid_value', 'input_file_id'],
      [{ endpoint: '/v1/responses' }, 400, 'invalid_value', 'endpoint'],
      [{ completion_window: '48h' }, 400, 'invalid_value', 'completion_window'],
      [{ input_file_id: 'file-nope' }, 404, 'file_not_found', 'input_file_id'],
      // OpenAI's codes: a missing field, a wrong type, a bad value each have their own.
      [{ input_file_id: undefined }, 400, 'missing_required_parameter', 'input_file_id'],
      [{ input_file_id: 7 }, 400, 'invalid_type', 'input_file_id'],
      [{ metadata: { k: 1 } }, 400, 'invalid_type', 'metadata.k'],
    ];
    for (const [patch, status, code, param] of cases) {
      const body = {
        input_file_id: chatFile,
        endpoint: '/v1/chat/completions',
        completion_window: '24h',
        ...patch,
      };
      const err = await apiError(f.client.batches.create(body as never));
      assert.equal(err.status, status, JSON.stringify(patch));
      assert.equal(err.code, code, JSON.stringify(patch));
      assert.equal(err.param, param, JSON.stringify(patch));
    }
    const notes = await f.client.files.create({
      file: await (await import('openai')).toFile(Buffer.from('hello'), 'n.txt'),
      purpose: 'user_data',
    });
    const wrongPurpose = await apiError(
      f.client.batches.create({
        input_file_id: notes.id,
        endpoint: '/v1/chat/completions',
        completion_window: '24h',
      }),
    );
    assert.equal(wrongPurpose.status, 400);
    assert.equal(wrongPurpose.param, 'input_file_id');
    const missing = await apiError(f.client.batches.retrieve('batch_nope'));
    assert.equal(missing.status, 404);
    assert.equal(missing.code, 'batch_not_found');
    assert.equal((await apiError(f.client.batches.cancel('batch_nope'))).status, 404);
  });

  it('a key bound to another endpoint does not see this endpoint’s batch results', async () => {
    const inputFileId = await uploadBatchInput(f, [chatLine('r1')]);
    const batch = await f.client.batches.create({
      input_file_id: inputFileId,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    });
    startRunner();
    await waitForStatus(f, batch.id, ['completed']);
    const done = await f.client.batches.retrieve(batch.id);
    const results = [done.output_file_id!, done.error_file_id].filter((x): x is string => !!x);
    const k = await f.server.admin('POST', '/projects/inf/keys', {
      scopes: ['inference'],
      endpointId: await inferenceEndpoint(f, 'side'),
    });
    const side = new OpenAI({
      baseURL: `${f.server.url}/${f.projectId}/side/v1`,
      apiKey: String(k.body.key),
      maxRetries: 0,
    });
    const listed = (await side.files.list()).data.map((x) => x.id);
    for (const id of results) {
      assert.ok(!listed.includes(id), 'not listed');
      assert.equal((await apiError(side.files.retrieve(id))).status, 404);
      assert.equal((await apiError(side.files.content(id))).status, 404);
      assert.equal((await apiError(side.files.delete(id))).status, 404);
      // Nor used as a list cursor or a batch's input: answered as an unknown id.
      const cursor = await apiError(side.files.list({ after: id }));
      assert.equal(cursor.status, 400);
      assert.equal(cursor.param, 'after');
      const input = await apiError(
        side.batches.create({
          input_file_id: id,
          endpoint: '/v1/chat/completions',
          completion_window: '24h',
        }),
      );
      assert.equal(input.status, 404);
      assert.equal(input.code, 'file_not_found');
      // The unbound key that made the batch still has them.
      assert.equal((await f.client.files.retrieve(id)).id, id);
    }
    // Uploads belong to the project: the bound key sees the input file.
    assert.ok(listed.includes(inputFileId));
    assert.equal((await side.files.retrieve(inputFileId)).id, inputFileId);
  });

  it('writes the input lines in inserts of a few MiB, not 500 lines of any size', async () => {
    const db = f.server.services.store.db;
    // Each insert into batch_requests the create makes, in bytes of request bodies.
    const inserts: number[] = [];
    const original = db.transaction.bind(db);
    const spy: typeof db.transaction = (fn, config) =>
      original(
        (tx) =>
          fn(
            new Proxy(tx, {
              get(t, p) {
                const v: unknown = Reflect.get(t, p, t);
                if (p !== 'insert') return typeof v === 'function' ? v.bind(t) : v;
                return (table: Parameters<typeof t.insert>[0]) => {
                  const b = t.insert(table);
                  if (table !== tables.batchRequests) return b;
                  return {
                    values: (rows: { body: string }[]) => {
                      inserts.push(rows.reduce((n, r) => n + Buffer.byteLength(r.body), 0));
                      return b.values(rows);
                    },
                  };
                };
              },
            }),
          ),
        config,
      );
    db.transaction = spy;
    try {
      // 520 requests of 14 KiB: 7 MiB, nearly all of it in the first 500-line group.
      const big = 'y'.repeat(14 * 1024);
      const inputFileId = await uploadBatchInput(
        f,
        Array.from({ length: 520 }, (_, i) =>
          chatLine(`big-${i}`, { messages: [{ role: 'user', content: big }] }),
        ),
      );
      const batch = await f.client.batches.create({
        input_file_id: inputFileId,
        endpoint: '/v1/chat/completions',
        completion_window: '24h',
      });
      assert.equal(batch.request_counts?.total, 520);
      await f.client.batches.cancel(batch.id);
    } finally {
      Reflect.deleteProperty(db, 'transaction');
    }
    assert.ok(inserts.length > 1, JSON.stringify(inserts));
    // 4 MiB, and what the last 1 MiB chunk read added.
    for (const n of inserts) assert.ok(n <= 5.5 * 1024 * 1024, JSON.stringify(inserts));
  });

  it('keeps batches to their project', async () => {
    const inputFileId = await uploadBatchInput(f, [chatLine('p1')]);
    const batch = await f.client.batches.create({
      input_file_id: inputFileId,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    });
    const op = await f.server.admin('POST', '/projects', { slug: 'other', name: 'Other' });
    await f.server.admin('POST', '/projects/other/endpoints', {
      slug: 'chat',
      name: 'Chat',
      model: 'sim-model',
      tier: 'cpu',
    });
    const k = await f.server.admin('POST', '/projects/other/keys', { scopes: ['inference'] });
    const onOurPath = new OpenAI({ baseURL: f.baseURL, apiKey: String(k.body.key), maxRetries: 0 });
    const cross = await apiError(onOurPath.batches.retrieve(batch.id));
    assert.equal(cross.status, 403);
    assert.equal(cross.code, 'cross_project_access');
    const theirs = new OpenAI({
      baseURL: `${f.server.url}/${String(op.body.id)}/chat/v1`,
      apiKey: String(k.body.key),
      maxRetries: 0,
    });
    assert.equal((await apiError(theirs.batches.retrieve(batch.id))).status, 404);
    assert.equal((await apiError(theirs.batches.cancel(batch.id))).status, 404);
    assert.deepEqual((await theirs.batches.list()).data, []);
    // Nor can their batch read our input file.
    const err = await apiError(
      theirs.batches.create({
        input_file_id: inputFileId,
        endpoint: '/v1/chat/completions',
        completion_window: '24h',
      }),
    );
    assert.equal(err.status, 404);
    await f.client.batches.cancel(batch.id);
  });
});

describe('batch create on PostgreSQL', { skip: !process.env.TEST_DATABASE_URL }, () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({ driver: 'postgres' });
  });
  after(() => f.close());
  beforeEach(() => f.server.clock.advance(61_000));

  /** Real time: until a statement starting with `prefix` waits for a lock. */
  const waitingOnLock = async (prefix: string) => {
    const db = f.server.services.store.db;
    const rows = await db.execute(
      sql`select 1 from pg_stat_activity where wait_event_type = 'Lock' and query like ${`${prefix}%`}`,
    );
    return (rows as unknown as { rows: unknown[] }).rows.length > 0;
  };

  it('a file deleted while the batch is created: the batch gets every line or none', async () => {
    const db = f.server.services.store.db;
    // Lines of exactly 1 KiB: the first 1 MiB chunk of the file ends at a line's end.
    const line = (i: number) => {
      const l = chatLine(`r-${i}`, { messages: [{ role: 'user', content: '' }] });
      const pad = 1023 - Buffer.byteLength(l);
      return chatLine(`r-${i}`, { messages: [{ role: 'user', content: 'x'.repeat(pad) }] });
    };
    const lines = Array.from({ length: 2048 }, (_, i) => line(i));
    assert.ok(lines.every((l) => Buffer.byteLength(l) === 1023));
    const inputFileId = await uploadBatchInput(f, lines);
    // Another connection holds batch_requests: the create stops at its first insert,
    // after it read the first chunk, until the file was deleted.
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let locked!: () => void;
    const isLocked = new Promise<void>((r) => (locked = r));
    const lock = db.transaction(async (tx) => {
      await tx.execute(sql`lock table batch_requests in exclusive mode`);
      locked();
      await held;
    });
    await isLocked;
    const create = f.client.batches
      .create({
        input_file_id: inputFileId,
        endpoint: '/v1/chat/completions',
        completion_window: '24h',
      })
      .then(
        (b) => ({ ok: true as const, b }),
        (err: unknown) => ({ ok: false as const, err }),
      );
    while (!(await waitingOnLock('insert into "batch_requests"'))) await sleep(10);
    let deleted = false;
    const del = f.client.files.delete(inputFileId).then((r) => {
      deleted = true;
      return r;
    });
    // The delete either goes through now or waits for the create.
    while (!deleted && !(await waitingOnLock('delete from "files"'))) await sleep(10);
    release();
    await lock;
    const created = await create;
    assert.equal((await del).deleted, true);
    if (created.ok) {
      assert.equal(created.b.request_counts?.total, 2048);
      const rows = await db
        .select({ idx: tables.batchRequests.idx })
        .from(tables.batchRequests)
        .where(eq(tables.batchRequests.batchId, created.b.id));
      assert.equal(rows.length, 2048);
      await f.client.batches.cancel(created.b.id);
    } else {
      const err = created.err as InstanceType<typeof OpenAI.APIError>;
      assert.ok(err instanceof OpenAI.APIError, String(err));
      assert.equal(err.status, 404);
      assert.equal(err.code, 'file_not_found');
    }
  });
});
