/**
 * Files of a project, in OpenAI's shapes (the spec shows none; DESIGN.md: the
 * de-facto OpenAI wire format): `{id: "file-…", object: "file", bytes, created_at,
 * filename, purpose, status: "processed", expires_at: null, status_details: null}`.
 *
 * A file is written in two steps so its bytes never wait in memory: `start` makes
 * an `uploading` row (invisible to every read), the content is appended as chunks
 * (blobs.ts), and `finish` makes it `processed` and emits `file.uploaded`. A file
 * that fails on the way (too large, bad batch input, client gone) is discarded.
 * Lists are ordered by creation (`seq`), newest first unless `order=asc`; `after`
 * is the id of the last file of the previous page.
 */
import { randomBytes } from 'node:crypto';
import { and, asc, desc, eq, gt, isNull, lt, or, type SQL } from 'drizzle-orm';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { emitEvent } from '../events/outbox.js';
import { listPage, parseField } from '../http/validate.js';
import type { Clock } from '../runtime/clock.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';
import { deleteChunks, readChunks } from './blobs.js';

/** What a client may upload for; `batch_output` files are the batch runner's own. */
export const PURPOSES = [
  'assistants',
  'batch',
  'fine-tune',
  'user_data',
  'evals',
  'vision',
] as const;
export type Purpose = (typeof PURPOSES)[number] | 'batch_output';

const F = tables.files;
const MAX_PAGE = 10_000;

export interface FileObject {
  id: string;
  object: 'file';
  bytes: number;
  created_at: number;
  filename: string;
  purpose: string;
  status: 'processed';
  expires_at: null;
  status_details: null;
}

type FileRow = typeof F.$inferSelect;

export function publicFile(
  r: Pick<FileRow, 'id' | 'bytes' | 'createdAt' | 'filename' | 'purpose'>,
): FileObject {
  return {
    id: r.id,
    object: 'file',
    bytes: r.bytes,
    created_at: Math.floor(r.createdAt.getTime() / 1000),
    filename: r.filename,
    purpose: r.purpose,
    status: 'processed',
    expires_at: null,
    status_details: null,
  };
}

export function newFileId(): string {
  return `file-${randomBytes(12).toString('hex')}`;
}

/** A purpose a client may upload for; else 400 `invalid_value` on `param`. */
export function checkPurpose(raw: unknown, param = 'purpose'): Purpose {
  if (raw === undefined || raw === '') {
    throw new ServiceError('missing_required_parameter', {
      message: `Missing required parameter: '${param}'.`,
      param,
    });
  }
  if (typeof raw !== 'string' || !(PURPOSES as readonly string[]).includes(raw)) {
    throw new ServiceError('invalid_value', {
      message: `Invalid '${param}': expected one of ${PURPOSES.join(', ')}.`,
      param,
    });
  }
  return raw as Purpose;
}

/** A filename as stored: no path, no control characters, at most 255 characters. */
export function cleanFilename(raw: string | undefined): string {
  const base = (raw ?? '').replace(/^.*[/\\]/, '');
  // eslint-disable-next-line no-control-regex
  const clean = base.replace(/[\u0000-\u001f\u007f]/g, '').slice(0, 255);
  return clean === '' ? 'file' : clean;
}

const listQuery = z.object({
  purpose: z.string().min(1).optional(),
  limit: z.coerce.number().int().min(1).max(MAX_PAGE).default(MAX_PAGE),
  after: z.string().min(1).max(100).optional(),
  order: z.enum(['asc', 'desc']).default('desc'),
});

export class FileService {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    /** Called after an event was emitted (wakes this process's webhook dispatcher). */
    private readonly onEvent: () => void = () => undefined,
  ) {}

  /** A new, invisible file row; its content goes to `blob_chunks` under the returned id. */
  async start(projectId: string, filename: string): Promise<string> {
    const id = newFileId();
    await this.db.insert(F).values({
      id,
      projectId,
      filename: cleanFilename(filename),
      purpose: 'pending',
      bytes: 0,
      status: 'uploading',
      createdAt: new Date(this.clock.now()),
    });
    return id;
  }

  async finish(id: string, purpose: Purpose, bytes: number): Promise<FileObject> {
    const now = new Date(this.clock.now());
    const file = await this.db.transaction(async (tx) => {
      const [row] = await tx
        .update(F)
        .set({ purpose, bytes, status: 'processed', createdAt: now })
        .where(and(eq(F.id, id), eq(F.status, 'uploading')))
        .returning();
      if (!row)
        throw new ServiceError('file_not_found', { message: 'The file vanished while uploading.' });
      const file = publicFile(row);
      await emitEvent(tx, {
        projectId: row.projectId,
        type: 'file.uploaded',
        data: { ...file },
        now,
      });
      return file;
    });
    this.onEvent();
    return file;
  }

  /** Drops a file that was not finished (and its content). */
  async discard(id: string): Promise<void> {
    await this.db.transaction(async (tx) => {
      await deleteChunks(tx, id);
      await tx.delete(F).where(and(eq(F.id, id), eq(F.status, 'uploading')));
    });
  }

  /** Drops files still `uploading` after `ageMs` (their router died mid-upload). */
  async discardStale(ageMs: number): Promise<number> {
    const stale = await this.db
      .select({ id: F.id })
      .from(F)
      .where(and(eq(F.status, 'uploading'), lt(F.createdAt, new Date(this.clock.now() - ageMs))))
      .limit(100);
    for (const f of stale) await this.discard(f.id);
    return stale.length;
  }

  /**
   * A processed file of the project, or 404 `file_not_found` (`param` names the
   * field). `boundTo`: the endpoint the caller's key is bound to (null: not bound), which
   * does not see another endpoint's batch results.
   */
  async get(
    projectId: string,
    id: string,
    param: string | null = null,
    boundTo: string | null = null,
  ): Promise<FileRow> {
    const [row] = await this.db
      .select()
      .from(F)
      .where(fileOf(projectId, id, boundTo))
      .limit(1);
    if (!row) {
      throw new ServiceError('file_not_found', { message: `No such file: '${id}'.`, param });
    }
    return row;
  }

  async retrieve(projectId: string, id: string, boundTo: string | null = null) {
    return publicFile(await this.get(projectId, id, null, boundTo));
  }

  async list(projectId: string, query: unknown, boundTo: string | null = null) {
    const q = parseField(listQuery, query ?? {});
    const where: SQL[] = [eq(F.projectId, projectId), eq(F.status, 'processed')];
    const visible = visibleTo(boundTo);
    if (visible) where.push(visible);
    if (q.purpose) where.push(eq(F.purpose, q.purpose));
    if (q.after) {
      // A file the caller cannot see is an unknown cursor (as any other id).
      const [cursor] = await this.db
        .select({ seq: F.seq })
        .from(F)
        .where(fileOf(projectId, q.after, boundTo))
        .limit(1);
      if (!cursor) {
        throw new ServiceError('invalid_value', {
          message: `Unknown cursor '${q.after}'.`,
          param: 'after',
        });
      }
      where.push(q.order === 'asc' ? gt(F.seq, cursor.seq) : lt(F.seq, cursor.seq));
    }
    const rows = await this.db
      .select()
      .from(F)
      .where(and(...where))
      .orderBy(q.order === 'asc' ? asc(F.seq) : desc(F.seq))
      .limit(q.limit + 1);
    return listPage(rows.map(publicFile), q.limit);
  }

  async remove(
    projectId: string,
    id: string,
    boundTo: string | null = null,
  ): Promise<{ id: string; object: 'file'; deleted: true }> {
    const now = new Date(this.clock.now());
    await this.db.transaction(async (tx) => {
      const [row] = await tx
        .delete(F)
        .where(fileOf(projectId, id, boundTo))
        .returning();
      if (!row) throw new ServiceError('file_not_found', { message: `No such file: '${id}'.` });
      await deleteChunks(tx, id);
      await emitEvent(tx, {
        projectId,
        type: 'file.deleted',
        data: { id, object: 'file', deleted: true },
        now,
      });
    });
    this.onEvent();
    return { id, object: 'file', deleted: true };
  }

  /** The file's bytes in order (a file deleted meanwhile ends early). */
  content(id: string): AsyncGenerator<Buffer> {
    return readChunks(this.db, id);
  }
}

/** The processed file `id` of the project, as a caller bound to `boundTo` sees it. */
function fileOf(projectId: string, id: string, boundTo: string | null): SQL | undefined {
  return and(
    eq(F.id, id),
    eq(F.projectId, projectId),
    eq(F.status, 'processed'),
    visibleTo(boundTo),
  );
}

/**
 * The files a key bound to `boundTo` sees: the project's uploads, and the batch
 * results of its own endpoint (not another endpoint's, whose batches it cannot
 * see either). Null: no restriction.
 */
function visibleTo(boundTo: string | null): SQL | undefined {
  return boundTo === null ? undefined : or(isNull(F.endpointId), eq(F.endpointId, boundTo));
}
