/**
 * Batch records in OpenAI's shape (the spec shows none; DESIGN.md): `{id: "batch_…",
 * object: "batch", endpoint, errors, input_file_id, completion_window, status,
 * output_file_id, error_file_id, created_at, in_progress_at, expires_at,
 * finalizing_at, completed_at, failed_at, expired_at, cancelling_at, cancelled_at,
 * request_counts: {total, completed, failed}, metadata}` (times in Unix seconds).
 *
 * Create checks everything a client can get wrong at once (400 with `param`): the
 * body; the input file is the project's (404 `file_not_found`, `param`
 * `input_file_id`), has purpose `batch`, and every line is a request to the
 * batch's `endpoint` (files/jsonl.ts). Then, in one transaction that holds the
 * file (a concurrent delete waits for it, or wins and the create is a 404), the batch
 * row (`validating`) and one `batch_requests` row per line are written; the runner
 * (runner.ts) takes it from there. A batch runs on the endpoint of the path it was
 * created on, as the key that created it.
 *
 * Cancel: `validating`/`in_progress` → `cancelling` (the runner stops starting
 * requests and finalises as `cancelled`); cancelling a `cancelling` or `cancelled`
 * batch returns it unchanged; a finished one is 409 `invalid_state`.
 * A key bound to an endpoint sees only that endpoint's batches.
 */
import { randomBytes } from 'node:crypto';
import { and, desc, eq, inArray, lt, type SQL } from 'drizzle-orm';
import { z } from 'zod';
import type { Endpoint } from '../endpoints/repository.js';
import { ServiceError } from '../errors/index.js';
import {
  BATCH_URLS,
  BatchLineChecker,
  LineSplitter,
  readChunks,
  type FileService,
} from '../files/index.js';
import { listPage, parseField } from '../http/validate.js';
import type { KeyRecord } from '../keys/index.js';
import type { Clock } from '../runtime/clock.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';

const B = tables.batches;
const R = tables.batchRequests;
const F = tables.files;

export const COMPLETION_WINDOW_MS = 24 * 60 * 60 * 1000;
/** Input lines are written in inserts of at most 500, flushed early at 4 MiB of bodies. */
const INSERT_GROUP = 500;
const INSERT_BYTES = 4 * 1024 * 1024;
export const ACTIVE_STATUSES = ['validating', 'in_progress', 'finalizing', 'cancelling'] as const;

export type BatchRow = typeof B.$inferSelect;

const seconds = (d: Date | null) => (d ? Math.floor(d.getTime() / 1000) : null);

export function publicBatch(r: BatchRow) {
  return {
    id: r.id,
    object: 'batch' as const,
    endpoint: r.endpoint,
    errors: r.errors ?? null,
    input_file_id: r.inputFileId,
    completion_window: r.completionWindow,
    status: r.status,
    output_file_id: r.outputFileId,
    error_file_id: r.errorFileId,
    created_at: seconds(r.createdAt)!,
    in_progress_at: seconds(r.inProgressAt),
    expires_at: seconds(r.expiresAt),
    finalizing_at: seconds(r.finalizingAt),
    completed_at: seconds(r.completedAt),
    failed_at: seconds(r.failedAt),
    expired_at: seconds(r.expiredAt),
    cancelling_at: seconds(r.cancellingAt),
    cancelled_at: seconds(r.cancelledAt),
    request_counts: { total: r.total, completed: r.completed, failed: r.failed },
    metadata: r.metadata ?? null,
  };
}

export type BatchObject = ReturnType<typeof publicBatch>;

const createBody = z.object({
  input_file_id: z.string().min(1).max(100),
  endpoint: z.enum(BATCH_URLS, { message: `expected one of ${BATCH_URLS.join(', ')}` }),
  completion_window: z.literal('24h', { message: "the only supported window is '24h'" }),
  metadata: z
    .record(z.string().max(64, 'keys must be at most 64 characters'), z.string().max(512))
    .refine((m) => Object.keys(m).length <= 16, { message: 'at most 16 keys' })
    .nullable()
    .optional(),
  output_expires_after: z.unknown().optional(),
});

const listQuery = z.object({
  limit: z.coerce.number().int().min(1).max(100).default(20),
  after: z.string().min(1).max(100).optional(),
});

export class BatchService {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly files: FileService,
    /** The request body limit a line's body must fit (files/jsonl.ts). */
    private readonly maxBodyBytes = Infinity,
  ) {}

  async create(key: KeyRecord, endpoint: Endpoint, raw: unknown): Promise<BatchObject> {
    const body = parseField(createBody, raw);
    // Another endpoint's batch results are not found for a key bound elsewhere (not
    // a 400 about their purpose, which would tell them apart from a missing file).
    const file = await this.files.get(
      key.projectId,
      body.input_file_id,
      'input_file_id',
      key.endpointId,
    );
    if (file.purpose !== 'batch') {
      throw new ServiceError('invalid_value', {
        message: `The input file has purpose '${file.purpose}'; a batch needs purpose 'batch'.`,
        param: 'input_file_id',
      });
    }
    const now = this.clock.now();
    const id = `batch_${randomBytes(12).toString('hex')}`;
    const row = await this.db.transaction(async (tx) => {
      // The file, held until the batch is written: a delete meanwhile waits, and one
      // that won the race is a 404 here, not a batch of the lines read before it.
      const [held] = await tx
        .select({ id: F.id })
        .from(F)
        .where(and(eq(F.id, file.id), eq(F.status, 'processed')))
        .for('share');
      if (!held) {
        throw new ServiceError('file_not_found', {
          message: `No such file: '${body.input_file_id}'.`,
          param: 'input_file_id',
        });
      }
      await tx.insert(B).values({
        id,
        projectId: key.projectId,
        endpointId: endpoint.id,
        keyId: key.id,
        endpoint: body.endpoint,
        inputFileId: file.id,
        completionWindow: body.completion_window,
        status: 'validating',
        metadata: body.metadata ?? null,
        total: 0,
        expiresAt: new Date(now + COMPLETION_WINDOW_MS),
        createdAt: new Date(now),
      });
      const checker = new BatchLineChecker('input_file_id', this.maxBodyBytes);
      let group: (typeof R.$inferInsert)[] = [];
      let groupBytes = 0;
      let idx = 0;
      const splitter = new LineSplitter((text, lineNo) => {
        const line = checker.check(text, lineNo);
        if (!line) return;
        if (line.url !== body.endpoint) {
          throw new ServiceError('invalid_value', {
            message: `Line ${lineNo} of the batch input: 'url' ${line.url} is not the batch's endpoint ${body.endpoint}.`,
            param: 'input_file_id',
          });
        }
        const requestBody = JSON.stringify(line.body);
        group.push({ batchId: id, idx: idx++, customId: line.customId, body: requestBody });
        groupBytes += Buffer.byteLength(requestBody);
      }, checker.maxLineBytes);
      const flush = async () => {
        if (group.length) await tx.insert(R).values(group);
        group = [];
        groupBytes = 0;
      };
      for await (const chunk of readChunks(tx, file.id)) {
        splitter.push(chunk);
        // By bytes too: 500 lines of up to the body limit each would be one insert
        // (and one statement's worth of memory) of the whole file.
        if (group.length >= INSERT_GROUP || groupBytes >= INSERT_BYTES) await flush();
      }
      splitter.end();
      checker.finish();
      await flush();
      const [created] = await tx.update(B).set({ total: idx }).where(eq(B.id, id)).returning();
      return created!;
    });
    return publicBatch(row);
  }

  private scope(key: KeyRecord): SQL[] {
    const where = [eq(B.projectId, key.projectId)];
    if (key.endpointId) where.push(eq(B.endpointId, key.endpointId));
    return where;
  }

  private async row(key: KeyRecord, id: string): Promise<BatchRow> {
    const [row] = await this.db
      .select()
      .from(B)
      .where(and(eq(B.id, id), ...this.scope(key)))
      .limit(1);
    if (!row) throw new ServiceError('batch_not_found', { message: `No such batch: '${id}'.` });
    return row;
  }

  async retrieve(key: KeyRecord, id: string): Promise<BatchObject> {
    return publicBatch(await this.row(key, id));
  }

  async list(key: KeyRecord, query: unknown) {
    const q = parseField(listQuery, query ?? {});
    const where = this.scope(key);
    if (q.after) {
      const [cursor] = await this.db
        .select({ seq: B.seq })
        .from(B)
        .where(and(eq(B.id, q.after), ...this.scope(key)))
        .limit(1);
      if (!cursor) {
        throw new ServiceError('invalid_value', {
          message: `Unknown cursor '${q.after}'.`,
          param: 'after',
        });
      }
      where.push(lt(B.seq, cursor.seq));
    }
    const rows = await this.db
      .select()
      .from(B)
      .where(and(...where))
      .orderBy(desc(B.seq))
      .limit(q.limit + 1);
    return listPage(rows.map(publicBatch), q.limit);
  }

  async cancel(key: KeyRecord, id: string): Promise<BatchObject> {
    const now = new Date(this.clock.now());
    const [row] = await this.db
      .update(B)
      .set({ status: 'cancelling', cancellingAt: now })
      .where(
        and(eq(B.id, id), ...this.scope(key), inArray(B.status, ['validating', 'in_progress'])),
      )
      .returning();
    if (row) return publicBatch(row);
    const current = await this.row(key, id);
    if (current.status === 'cancelling' || current.status === 'cancelled') {
      return publicBatch(current);
    }
    throw new ServiceError('invalid_state', {
      message: `The batch is ${current.status}; only a validating or in-progress batch can be cancelled.`,
    });
  }
}
