/**
 * Usage recording off the hot path. Completed requests append a record to an
 * in-memory batch; a timer (or a full batch) writes the batch with one
 * statement that also adds each project's cost to its spend (so credit and
 * usage never disagree). A failed write keeps the records for the next flush
 * (bounded: past `maxBuffered` the oldest batch is dropped and its records
 * counted, so a long database outage cannot exhaust memory). `close()` flushes
 * what is left.
 *
 * Records are serialised when they are recorded, into buffers outside the V8
 * heap (`RowBatch`), and the batch travels to the database as those bytes. A
 * record waits up to the flush interval and then the database's answer; as
 * objects on the heap (and as the batch's JSON string, which the driver keeps
 * until the query completes) they were what each young-generation collection
 * of a busy router mostly copied and then promoted: about half of the bytes
 * surviving each scavenge at 1,000 requests a second (docs/BENCHMARKS.md). A
 * scavenge never copies a buffer's bytes.
 */
import { sql } from 'drizzle-orm';
import { sqlState, type Db } from '../store/index.js';
import type { tables } from '../store/index.js';
import type { Logger } from '../runtime/logger.js';

export type UsageRecord = typeof tables.usageRecords.$inferInsert;

/**
 * PostgreSQL text and jsonb cannot hold U+0000, nor jsonb a lone UTF-16 surrogate
 * (JSON.stringify writes one as `\ud800`, which jsonb refuses), and a client's
 * `user` or `metadata` may carry either: such a row would fail its whole batch.
 * A NUL is dropped and a lone surrogate becomes U+FFFD; the common case costs two
 * scans and no copy.
 */
function storable(s: string): string {
  const t = s.includes('\u0000') ? s.replaceAll('\u0000', '') : s;
  return t.isWellFormed() ? t : t.toWellFormed();
}

function storableMetadata(m: UsageRecord['metadata']): UsageRecord['metadata'] {
  if (m === null || m === undefined || typeof m !== 'object') return m;
  // The clean case (nearly every record) allocates nothing.
  const o = m as Record<string, unknown>;
  let dirty = false;
  for (const k in o) {
    const v = o[k];
    if (storable(k) !== k || (typeof v === 'string' && storable(v) !== v)) {
      dirty = true;
      break;
    }
  }
  if (!dirty) return m;
  return Object.fromEntries(
    Object.entries(m).map(([k, v]) => [storable(k), typeof v === 'string' ? storable(v) : v]),
  );
}

/** A record as the JSON array `insertBatch` reads by position. */
function rowJson(r: UsageRecord): string {
  return JSON.stringify([
    r.requestId,
    r.projectId,
    r.endpointId,
    r.keyId ?? null,
    r.workerId ?? null,
    r.model,
    r.tierId,
    r.serviceTierHint ?? null,
    r.priceMultiplier ?? 1,
    r.status,
    r.stream ?? 0,
    r.promptTokens ?? 0,
    r.completionTokens ?? 0,
    r.cachedTokens ?? 0,
    r.reasoningTokens ?? null,
    r.acceptedPredictionTokens ?? null,
    r.rejectedPredictionTokens ?? null,
    r.ttftMs ?? null,
    r.durationMs,
    r.costMicrocents ?? 0,
    r.user == null ? null : storable(r.user),
    storableMetadata(r.metadata) ?? null,
    // Epoch milliseconds: toISOString cost as much as serialising the rest of the row.
    (r.createdAt ?? new Date()).getTime(),
  ]);
}

const OPEN = 0x5b; // [
const COMMA = 0x2c;
const CLOSE = 0x5d; // ]

/**
 * Up to `batchSize` rows as the UTF-8 text of one JSON array of row arrays,
 * growing as needed. `bytes()` closes the array (the buffer keeps room for the
 * `]`); appending after it is not allowed, except to a batch put back after a
 * failed write, which reopens it.
 */
export class RowBatch {
  private buf: Buffer;
  private len = 1;
  rows = 0;

  constructor(capacity = 16 * 1024) {
    // allocUnsafeSlow: a buffer of its own, not a slice of Node's shared pool
    // (which would keep the whole 8 KiB pool alive for as long as the batch lives).
    this.buf = Buffer.allocUnsafeSlow(Math.max(capacity, 64));
    this.buf[0] = OPEN;
  }

  append(json: string): void {
    const need = this.len + 1 + Buffer.byteLength(json) + 1;
    if (need > this.buf.length) {
      const next = Buffer.allocUnsafeSlow(Math.max(need, this.buf.length * 2));
      this.buf.copy(next, 0, 0, this.len);
      this.buf = next;
    }
    if (this.rows > 0) this.buf[this.len++] = COMMA;
    this.len += this.buf.write(json, this.len);
    this.rows++;
  }

  /** The batch as a JSON array (a view of the buffer: valid until the next append). */
  bytes(): Buffer {
    this.buf[this.len] = CLOSE;
    return this.buf.subarray(0, this.len + 1);
  }
}

/**
 * One statement for the whole batch: the rows travel as a single parameter (the
 * JSON text of an array of arrays, sent as bytes), are inserted, and the cost of
 * the rows actually inserted (a retried batch is never billed twice) is added to
 * each project's spend in the same statement, so usage and credit never disagree.
 * Written by hand because this is the router's busiest write: building a
 * multi-row INSERT through the query builder cost more CPU than the database
 * spent storing the rows, and with PGlite every extra round trip (BEGIN, one
 * UPDATE per project, COMMIT) runs on the event loop (profiled at thousands of
 * requests a second). One parameter also avoids the 65,535-parameter limit.
 * Arrays, not objects: the key names would be half of the parameter's bytes.
 */
async function insertBatch(db: Db, rows: Buffer): Promise<{ stored: number; charged: string[] }> {
  const result = await db.execute(sql`
    with ins as (
    insert into usage_records (
      request_id, project_id, endpoint_id, key_id, worker_id, model, tier_id,
      service_tier_hint, price_multiplier, status, stream, prompt_tokens,
      completion_tokens, cached_tokens, reasoning_tokens, accepted_prediction_tokens,
      rejected_prediction_tokens, ttft_ms, duration_ms, cost_microcents, "user",
      metadata, created_at)
    select
      r->>0, (r->>1)::uuid, (r->>2)::uuid, (r->>3)::uuid, r->>4, r->>5, r->>6,
      r->>7, (r->>8)::real, r->>9, (r->>10)::integer, (r->>11)::integer,
      (r->>12)::integer, (r->>13)::integer, (r->>14)::integer, (r->>15)::integer,
      (r->>16)::integer, (r->>17)::integer, (r->>18)::integer, (r->>19)::bigint, r->>20,
      nullif(r->21, 'null'::jsonb), to_timestamp((r->>22)::double precision / 1000)
    from jsonb_array_elements(convert_from(${rows}::bytea, 'UTF8')::jsonb) as x(r)
    on conflict (request_id) do nothing
    returning project_id, cost_microcents),
    charged as (
      update projects p set spent_microcents = p.spent_microcents + s.total
      from (select project_id, sum(cost_microcents) as total from ins
            where cost_microcents > 0 group by project_id) s
      where p.id = s.project_id
      returning p.id)
    select (select count(*) from ins)::int as stored,
           coalesce((select json_agg(id) from charged), '[]'::json) as charged`);
  const row = (result as unknown as { rows: Array<{ stored: number; charged: string[] | string }> })
    .rows[0]!;
  const charged =
    typeof row.charged === 'string' ? (JSON.parse(row.charged) as string[]) : row.charged;
  return { stored: Number(row.stored), charged };
}

/** SQLSTATE class 22 (data exception): the statement's data is at fault, not the connection. */
function isDataError(err: unknown): boolean {
  return sqlState(err)?.startsWith('22') ?? false;
}

export interface UsageRecorderOptions {
  flushIntervalMs?: number;
  batchSize?: number;
  maxBuffered?: number;
}

export class UsageRecorder {
  /** Batches waiting, oldest first; only the last one is appended to. */
  private queue: RowBatch[] = [];
  private buffered = 0;
  /** Records ever accepted, and how many of them have left the queue (written or dropped). */
  private accepted = 0;
  private taken = 0;
  /** Size of the batch being written now (0 when none). */
  private writing = 0;
  private timer: NodeJS.Timeout | null = null;
  /** The one write in progress; every writer waits for it before taking a batch. */
  private flushing: Promise<string[] | null> | null = null;
  /** A write failed: full batches wait for the retry timer, not for the next record. */
  private backingOff = false;
  /** `close()` was called: a failed write arms no retry timer against the closing database. */
  private closed = false;
  private readonly interval: number;
  private readonly batchSize: number;
  private readonly maxBuffered: number;
  dropped = 0;
  /** Rows stored (a record already stored, e.g. a retried batch, is not counted). */
  written = 0;
  /** Called after a batch commits, with the projects whose spend changed. */
  onSpend: ((projectIds: Set<string>) => Promise<unknown>) | null = null;

  constructor(
    private readonly db: Db,
    private readonly logger: Logger,
    opts: UsageRecorderOptions = {},
  ) {
    // At most 64 rows per statement, written when 64 are buffered or after the
    // interval. Each batch has a fixed cost on the event loop (building the statement,
    // the driver's buffers, the budget-alert check of its projects) and one round
    // trip; 20 ms (the old default, from when PGlite ran on the event loop) meant a
    // batch of ~20 rows at 1,000 req/s. The interval is also what a crash can lose.
    this.interval = opts.flushIntervalMs ?? 100;
    this.batchSize = opts.batchSize ?? 64;
    this.maxBuffered = opts.maxBuffered ?? 100_000;
  }

  record(r: UsageRecord): void {
    let tail = this.queue.at(-1);
    if (!tail || tail.rows >= this.batchSize) {
      tail = new RowBatch();
      this.queue.push(tail);
    }
    tail.append(rowJson(r));
    this.buffered++;
    this.accepted++;
    while (this.buffered > this.maxBuffered && this.queue.length > 1) {
      const oldest = this.queue.shift()!;
      this.buffered -= oldest.rows;
      this.taken += oldest.rows;
      this.dropped += oldest.rows;
    }
    if (this.queue.length > 1 || tail.rows >= this.batchSize) {
      // A write in progress goes on with full batches by itself (see flush); after a
      // failed one the retry timer is next, so a database outage is not retried at
      // the request rate.
      if (!this.flushing && !this.backingOff) void this.flush();
    } else if (!this.timer) {
      this.timer = setTimeout(() => {
        this.timer = null;
        void this.flush();
      }, this.interval);
      this.timer.unref();
    }
  }

  /** Records not yet stored: buffered, plus the batch being written (it may fail and return). */
  get pending(): number {
    return this.buffered + this.writing;
  }

  /**
   * Writes the records buffered when it is called, one batch at a time, and goes on
   * while full batches are waiting; resolves when they are stored or a write failed
   * (the records then stay buffered for a retry). Concurrent calls take turns.
   *
   * A loop, not a recursion: an `await this.flush()` at the end of each batch kept
   * every earlier call suspended, each holding its batch, for as long as records
   * kept arriving, so under steady load every usage record stayed reachable until the
   * load stopped.
   */
  async flush(): Promise<void> {
    const target = this.accepted;
    for (;;) {
      while (this.flushing) await this.flushing;
      const head = this.queue[0];
      if (!head) return;
      if (this.taken >= target && head.rows < this.batchSize) return;
      this.flushing = this.writeBatch();
      let charged: string[] | null;
      try {
        charged = await this.flushing;
      } finally {
        this.flushing = null;
      }
      if (charged === null) return;
      if (charged.length > 0 && this.onSpend) await this.onSpend(new Set(charged));
    }
  }

  /**
   * The batch at the head of the queue: the projects it charged, or null when the
   * write failed (the batch is put back at the head).
   */
  private async writeBatch(): Promise<string[] | null> {
    const batch = this.queue.shift()!;
    this.buffered -= batch.rows;
    this.taken += batch.rows;
    this.writing = batch.rows;
    let result: { stored: number; charged: string[] };
    try {
      result = await insertBatch(this.db, batch.bytes());
    } catch (err) {
      if (isDataError(err)) {
        // The database is fine; a row is not (a value it cannot store). Retrying the
        // batch would fail forever and hold back every batch behind it: write its
        // rows one by one and drop only the ones refused.
        this.writing = 0;
        return this.salvage(batch, err);
      }
      this.putBack(batch, err);
      return null;
    } finally {
      this.writing = 0;
    }
    this.written += result.stored;
    this.backingOff = false;
    return result.charged;
  }

  /**
   * A batch refused for its data: each row alone; a row the database refuses for its
   * data is dropped (logged with its request id, counted in `dropped`); any other
   * failure puts the rows not yet written back at the head of the queue.
   */
  private async salvage(batch: RowBatch, cause: unknown): Promise<string[] | null> {
    const rows = JSON.parse(batch.bytes().toString('utf8')) as unknown[][];
    const charged = new Set<string>();
    for (let i = 0; i < rows.length; i++) {
      const one = new RowBatch(256);
      one.append(JSON.stringify(rows[i]));
      try {
        const r = await insertBatch(this.db, one.bytes());
        this.written += r.stored;
        for (const id of r.charged) charged.add(id);
      } catch (err) {
        if (isDataError(err)) {
          this.dropped++;
          this.logger.error(
            { err, requestId: rows[i]![0], cause },
            'usage record refused by the database; dropped',
          );
          continue;
        }
        const rest = new RowBatch();
        for (const row of rows.slice(i)) rest.append(JSON.stringify(row));
        this.putBack(rest, err);
        if (charged.size > 0 && this.onSpend) await this.onSpend(charged);
        return null;
      }
    }
    this.backingOff = false;
    return [...charged];
  }

  /** A write failed: the batch goes back to the head, retried after a pause. */
  private putBack(batch: RowBatch, err: unknown): void {
    this.logger.warn({ err, records: batch.rows }, 'usage flush failed; will retry');
    this.queue.unshift(batch);
    this.buffered += batch.rows;
    this.taken -= batch.rows;
    this.backingOff = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.backingOff = false;
      void this.flush();
    }, this.interval * 4);
    this.timer.unref();
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    // Retry a few times so a shutdown during a brief outage still persists usage. A
    // write under way counts too: its batch is out of `buffered` until it is stored, or
    // put back if it fails.
    for (let i = 0; i < 3 && (this.buffered > 0 || this.flushing); i++) await this.flush();
  }
}
