/**
 * Usage recording off the hot path. Completed requests append a record to an
 * in-memory batch; a timer (or a full batch) writes the batch with one
 * statement that also adds each project's cost to its spend (so credit and
 * usage never disagree). A failed write keeps the records for the next flush
 * (bounded: past `maxBuffered` the oldest are dropped and counted, so a long
 * database outage cannot exhaust memory). `close()` flushes what is left.
 */
import { sql } from 'drizzle-orm';
import type { Db } from '../store/index.js';
import type { tables } from '../store/index.js';
import type { Logger } from '../runtime/logger.js';

export type UsageRecord = typeof tables.usageRecords.$inferInsert;

/**
 * One statement for the whole batch: the rows travel as a single JSON
 * parameter (an array of arrays), are inserted, and the cost of the rows
 * actually inserted (a retried batch is never billed twice) is added to each
 * project's spend in the same statement, so usage and credit never disagree.
 * Written by hand because this is the router's busiest write: building a
 * multi-row INSERT through the query builder cost more CPU than the database
 * spent storing the rows, and with PGlite every extra round trip (BEGIN, one
 * UPDATE per project, COMMIT) runs on the event loop (profiled at thousands of
 * requests a second). One parameter also avoids the 65,535-parameter limit.
 */
async function insertBatch(
  db: Db,
  batch: UsageRecord[],
): Promise<{ stored: number; charged: string[] }> {
  // Arrays, not objects: the key names would be half of the parameter's bytes, and
  // the parameter stays alive (and is copied by every scavenge) until the database
  // answers.
  const rows = batch.map((r) => [
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
    r.user ?? null,
    r.metadata ?? null,
    (r.createdAt ?? new Date()).toISOString(),
  ]);
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
      nullif(r->21, 'null'::jsonb), (r->>22)::timestamptz
    from jsonb_array_elements(${JSON.stringify(rows)}::jsonb) as x(r)
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

export interface UsageRecorderOptions {
  flushIntervalMs?: number;
  batchSize?: number;
  maxBuffered?: number;
}

export class UsageRecorder {
  private buffer: UsageRecord[] = [];
  /** Size of the batch being written now (0 when none). */
  private writing = 0;
  private timer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> | null = null;
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
    this.buffer.push(r);
    if (this.buffer.length > this.maxBuffered) {
      this.buffer.shift();
      this.dropped++;
    }
    if (this.buffer.length >= this.batchSize) void this.flush();
    else if (!this.timer) {
      this.timer = setTimeout(() => {
        this.timer = null;
        void this.flush();
      }, this.interval);
      this.timer.unref();
    }
  }

  /** Records not yet stored: buffered, plus the batch being written (it may fail and return). */
  get pending(): number {
    return this.buffer.length + this.writing;
  }

  /** Writes everything buffered so far; concurrent calls share one write. */
  async flush(): Promise<void> {
    while (this.flushing) await this.flushing;
    if (this.buffer.length === 0) return;
    const batch = this.buffer.splice(0, this.batchSize);
    this.writing = batch.length;
    let ok = false;
    let spent = new Set<string>();
    let stored = 0;
    this.flushing = insertBatch(this.db, batch)
      .then((r) => {
        stored = r.stored;
        spent = new Set(r.charged);
      })
      .then(
        () => {
          ok = true;
          this.written += stored;
        },
        (err: unknown) => {
          this.logger.warn({ err, records: batch.length }, 'usage flush failed; will retry');
          this.buffer.unshift(...batch);
          if (!this.timer) {
            this.timer = setTimeout(() => {
              this.timer = null;
              void this.flush();
            }, this.interval * 4);
            this.timer.unref();
          }
        },
      )
      .finally(() => {
        this.flushing = null;
        this.writing = 0;
      });
    await this.flushing;
    if (ok && spent.size > 0 && this.onSpend) await this.onSpend(spent);
    if (ok && this.buffer.length > 0) await this.flush();
  }

  async close(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    // Retry a few times so a shutdown during a brief outage still persists usage.
    for (let i = 0; i < 3 && this.buffer.length > 0; i++) await this.flush();
  }
}
