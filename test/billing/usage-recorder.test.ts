/**
 * The usage recorder on every storage driver: one batched INSERT, spend added
 * in the same transaction, a retried batch never billed twice, a failed write
 * kept for the next flush; rows with multi-byte text and rows larger than a batch
 * buffer's first allocation. Then, on a fake database: flush() returns once the
 * records it was called for are written while new ones keep arriving, and a long
 * outage drops the oldest batches instead of growing without bound.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { RowBatch, UsageRecorder } from '../../src/billing/usage-recorder.js';
import type { Db } from '../../src/store/index.js';
import { createLogger } from '../../src/runtime/logger.js';
import { tables } from '../../src/store/index.js';
import { drivers, freshDatabase } from '../support/harness.js';

for (const driver of drivers()) {
  describe(`usage recorder on ${driver}`, () => {
    it('writes batches, charges spend once, survives a failed write', async () => {
      const db = await freshDatabase(driver);
      try {
        const pid = crypto.randomUUID();
        await db.store.db
          .insert(tables.projects)
          .values({ id: pid, externalId: 'proj_u', slug: 'u', name: 'U', createdAt: new Date() });
        const u = new UsageRecorder(db.store.db, createLogger('silent'), { batchSize: 2 });
        const rec = (i: number) => ({
          requestId: `chatcmpl-${i}`,
          projectId: pid,
          endpointId: pid,
          model: 'm',
          tierId: 'cpu',
          status: 'completed',
          durationMs: 5,
          promptTokens: 3,
          completionTokens: 4,
          costMicrocents: 10,
          metadata: { k: `v${i}` },
          user: i === 0 ? 'alice' : null,
          createdAt: new Date(Date.UTC(2026, 10, 24, 12, 0, i, 123)),
        });
        const stored = async (requestId: string) =>
          (
            await db.store.db
              .select()
              .from(tables.usageRecords)
              .where(eq(tables.usageRecords.requestId, requestId))
          )[0];
        for (let i = 0; i < 5; i++) u.record(rec(i));
        await u.flush();
        // The same request id again (a retried batch) is neither stored nor billed twice.
        u.record(rec(0));
        await u.flush();
        const rows = await db.store.db.select().from(tables.usageRecords);
        assert.equal(rows.length, 5);
        const first = rows.find((r) => r.requestId === 'chatcmpl-0')!;
        assert.deepEqual(first.metadata, { k: 'v0' });
        assert.equal(first.user, 'alice');
        assert.equal(first.createdAt.toISOString(), '2026-11-24T12:00:00.123Z');
        assert.equal(first.completionTokens, 4);
        const [p] = await db.store.db
          .select()
          .from(tables.projects)
          .where(eq(tables.projects.id, pid));
        assert.equal(p!.spentMicrocents, 50);
        assert.equal(u.written, 5);

        // Multi-byte text and rows that outgrow a batch buffer's first 16 KiB travel intact.
        const big = Object.fromEntries(
          Array.from({ length: 16 }, (_, k) => [`key-${k}-ü`, `${'é✓🚀'.repeat(100)}${k}`]),
        );
        for (let i = 10; i < 14; i++) u.record({ ...rec(i), user: 'ålice 🚀', metadata: big });
        await u.flush();
        const wide = await db.store.db
          .select()
          .from(tables.usageRecords)
          .where(eq(tables.usageRecords.requestId, 'chatcmpl-13'));
        assert.equal(wide[0]!.user, 'ålice 🚀');
        assert.deepEqual(wide[0]!.metadata, big);
        assert.equal(u.written, 9);

        // A client's NUL (U+0000), which PostgreSQL cannot store, is dropped from
        // `user` and `metadata` instead of failing the batch.
        u.record({ ...rec(20), user: 'u\u0000v', metadata: { 'k\u0000': 'a\u0000b' } });
        await u.flush();
        const nul = await stored('chatcmpl-20');
        assert.equal(nul?.user, 'uv');
        assert.deepEqual(nul?.metadata, { k: 'ab' });
        assert.equal(u.written, 10);

        // A lone UTF-16 surrogate, which jsonb refuses, becomes U+FFFD; a pair stays.
        u.record({ ...rec(30), user: 'u\ud800', metadata: { 'k\udc00': 'a\ud83d\ude00\ud83d' } });
        await u.flush();
        const lone = await stored('chatcmpl-30');
        assert.equal(lone?.user, 'u\uFFFD');
        assert.deepEqual(lone?.metadata, { 'k\uFFFD': 'a\u{1F600}\uFFFD' });
        assert.equal(u.written, 11);

        // A row the database refuses for its data (a token count past int4) is
        // dropped and counted; the rest of its batch, and the batches behind it, are
        // stored and billed; nothing is retried forever.
        u.record(rec(21));
        u.record({ ...rec(22), promptTokens: 2 ** 40 });
        u.record(rec(23));
        u.record(rec(24));
        await u.flush();
        await u.flush();
        const ids = (await db.store.db.select().from(tables.usageRecords)).map((r) => r.requestId);
        for (const id of ['chatcmpl-21', 'chatcmpl-23', 'chatcmpl-24'])
          assert.ok(ids.includes(id), id);
        assert.ok(!ids.includes('chatcmpl-22'));
        assert.equal(u.dropped, 1);
        assert.equal(u.pending, 0);
        assert.equal(u.written, 14);
        const [after] = await db.store.db
          .select()
          .from(tables.projects)
          .where(eq(tables.projects.id, pid));
        assert.equal(after!.spentMicrocents, 50 + 4 * 10 + 10 + 10 + 3 * 10);

        await db.store.close();
        u.record(rec(9));
        await u.flush();
        assert.equal(u.pending, 1, 'kept for the next flush');
      } finally {
        await db.drop();
      }
    });
  });
}

/** A database whose every write calls `during` first (load arriving while it writes). */
function fakeDb(during: (call: number) => void, fail = false): { db: Db; calls: () => number } {
  let calls = 0;
  const db = {
    execute: async () => {
      during(++calls);
      await new Promise((r) => setImmediate(r));
      if (fail) throw new Error('database down');
      return { rows: [{ stored: 1, charged: [] }] };
    },
  } as unknown as Db;
  return { db, calls: () => calls };
}

const row = (i: number) => ({
  requestId: `chatcmpl-${i}`,
  projectId: '00000000-0000-4000-8000-000000000000',
  endpointId: '00000000-0000-4000-8000-000000000000',
  model: 'm',
  tierId: 'cpu',
  status: 'completed',
  durationMs: 1,
  createdAt: new Date(),
});

describe('usage recorder under load', () => {
  it('flush() returns once its own records are written while new ones keep arriving', async () => {
    let next = 100;
    let u: UsageRecorder | null = null;
    // One new record during every write, fewer than a batch: a recorder that kept
    // flushing while anything was buffered (the old recursion) would never return
    // before the load stopped, holding every batch it had written.
    const { db, calls } = fakeDb((call) => {
      if (call < 50) u!.record(row(next++));
    });
    u = new UsageRecorder(db, createLogger('silent'), { batchSize: 4, flushIntervalMs: 60_000 });
    for (let i = 0; i < 6; i++) u.record(row(i));
    // Six records: one full batch already on its way (record() starts it), then the rest.
    await u.flush();
    assert.ok(calls() <= 3, `flush() returned after ${calls()} writes`);
    assert.ok(u.pending > 0 && u.pending < 4, 'later records wait for their own flush');
  });

  it('keeps at most maxBuffered records (plus one batch) through an outage, counting the dropped', async () => {
    const { db, calls } = fakeDb(() => undefined, true);
    const u = new UsageRecorder(db, createLogger('silent'), {
      batchSize: 10,
      maxBuffered: 25,
      flushIntervalMs: 60_000,
    });
    for (let i = 0; i < 100; i++) {
      u.record(row(i));
      await new Promise((r) => setImmediate(r));
    }
    assert.ok(u.pending <= 25 + 10, `pending ${u.pending}`);
    assert.equal(u.pending + u.dropped, 100, 'every record is either kept or counted as dropped');
    // After the failed write the retry timer decides, not the arrival of each record.
    assert.equal(calls(), 1, 'one write attempted, not one per record');
    await u.close();
  });
});

describe('usage recorder on shutdown', () => {
  it('close() waits for the write in progress and writes its records again if it failed', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let calls = 0;
    let stored = 0;
    const db = {
      execute: async () => {
        // The first write (the timer's, under way when the shutdown begins) fails
        // after a moment, as a connection reset would; the database then answers.
        if (++calls === 1) {
          await gate;
          throw new Error('connection reset');
        }
        stored++;
        return { rows: [{ stored: 1, charged: [] }] };
      },
    } as unknown as Db;
    const u = new UsageRecorder(db, createLogger('silent'), { flushIntervalMs: 60_000 });
    u.record(row(1));
    void u.flush();
    await new Promise((r) => setImmediate(r));
    assert.equal(u.pending, 1, 'the record is being written');
    const closed = u.close();
    release();
    await closed;
    assert.equal(stored, 1, 'written before close() returned');
    assert.equal(u.pending, 0);
  });

  it('after close() no retry timer is left writing to the closed database', async () => {
    const { db, calls } = fakeDb(() => undefined, true);
    const u = new UsageRecorder(db, createLogger('silent'), { flushIntervalMs: 1 });
    u.record(row(1));
    await u.close();
    const after = calls();
    // The retry timer would fire every 4 ms: give it several periods.
    await new Promise((r) => setTimeout(r, 40));
    assert.equal(calls(), after, 'no write attempted after close()');
    assert.equal(u.pending, 1, 'what could not be written is still counted as pending');
  });
});

describe('RowBatch', () => {
  it('is one JSON array of the appended rows, growing past its first buffer', () => {
    const b = new RowBatch(64);
    assert.deepEqual(JSON.parse(b.bytes().toString('utf8')), []);
    const rows = Array.from({ length: 50 }, (_, i) => [i, 'ü🚀'.repeat(i), null]);
    for (const r of rows) b.append(JSON.stringify(r));
    assert.equal(b.rows, 50);
    assert.deepEqual(JSON.parse(b.bytes().toString('utf8')), rows);
    // A batch put back after a failed write takes more rows.
    b.append(JSON.stringify(['late']));
    assert.deepEqual(JSON.parse(b.bytes().toString('utf8')), [...rows, ['late']]);
  });
});
