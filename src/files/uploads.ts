/**
 * Multipart uploads (OpenAI's Uploads API): `POST /uploads` declares a file
 * (`filename`, `purpose`, `bytes`, `mime_type`), parts are added
 * (`POST /uploads/{id}/parts`, field `data`, at most SWITCHYARD_MAX_UPLOAD_PART_BYTES
 * each), `POST /uploads/{id}/complete` with `part_ids` in order makes them one file,
 * `POST /uploads/{id}/cancel` drops them. An upload expires an hour after creation.
 *
 * Shapes: Upload `{id: "upload_…", object: "upload", bytes, created_at, filename,
 * purpose, status: pending|completed|cancelled|expired, expires_at, file: File|null}`;
 * Part `{id: "part_…", object: "upload.part", created_at, upload_id}`.
 *
 * Completion checks what a file upload checks (the parts' sizes must add up to the
 * declared `bytes`; a `batch` file must be valid batch input; `md5`, when given, must
 * match), then in one transaction claims the upload (`pending` → `completed`, so two
 * completions cannot both win), creates the file and hands the parts' chunks to it
 * (renumbered in `part_ids` order, not copied). Parts not named are dropped, with
 * those still streaming (a part is recorded before its bytes, see `addPart`).
 */
import { createHash, randomBytes } from 'node:crypto';
import { and, eq, inArray, sql } from 'drizzle-orm';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { emitEvent } from '../events/outbox.js';
import { parseField } from '../http/validate.js';
import type { Clock } from '../runtime/clock.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';
import { ChunkWriter, deleteChunks, readChunks } from './blobs.js';
import { BatchLineChecker, LineSplitter } from './jsonl.js';
import {
  checkPurpose,
  cleanFilename,
  newFileId,
  publicFile,
  type FileObject,
  type Purpose,
} from './service.js';

const U = tables.uploads;
const P = tables.uploadParts;
const C = tables.blobChunks;
const F = tables.files;

export const UPLOAD_TTL_MS = 60 * 60 * 1000;
const MAX_PARTS = 10_000;

export interface UploadObject {
  id: string;
  object: 'upload';
  bytes: number;
  created_at: number;
  filename: string;
  purpose: string;
  status: 'pending' | 'completed' | 'cancelled' | 'expired';
  expires_at: number;
  file: FileObject | null;
}

type UploadRow = typeof U.$inferSelect;

const seconds = (d: Date) => Math.floor(d.getTime() / 1000);

function publicUpload(r: UploadRow, file: FileObject | null = null): UploadObject {
  return {
    id: r.id,
    object: 'upload',
    bytes: r.bytes,
    created_at: seconds(r.createdAt),
    filename: r.filename,
    purpose: r.purpose,
    status: r.status as UploadObject['status'],
    expires_at: seconds(r.expiresAt),
    file,
  };
}

export class UploadService {
  private readonly createBody;
  private readonly completeBody = z.object({
    part_ids: z.array(z.string().min(1)).min(1).max(MAX_PARTS),
    md5: z.string().optional(),
  });

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    /** `maxBodyBytes`: the request body limit a batch line's body must fit (jsonl.ts). */
    private readonly limits: { maxFileBytes: number; maxPartBytes: number; maxBodyBytes?: number },
    private readonly onEvent: () => void = () => undefined,
  ) {
    this.createBody = z.object({
      filename: z.string().min(1).max(1024),
      purpose: z.unknown(),
      bytes: z
        .number()
        .int()
        .min(0)
        .max(limits.maxFileBytes, {
          message: `an upload holds at most ${limits.maxFileBytes} bytes`,
        }),
      mime_type: z.string().min(1).max(255),
      expires_after: z.unknown().optional(),
    });
  }

  async create(projectId: string, raw: unknown): Promise<UploadObject> {
    const body = parseField(this.createBody, raw);
    const purpose = checkPurpose(body.purpose);
    const now = this.clock.now();
    const [row] = await this.db
      .insert(U)
      .values({
        id: `upload_${randomBytes(12).toString('hex')}`,
        projectId,
        filename: cleanFilename(body.filename),
        purpose,
        bytes: body.bytes,
        mimeType: body.mime_type,
        status: 'pending',
        expiresAt: new Date(now + UPLOAD_TTL_MS),
        createdAt: new Date(now),
      })
      .returning();
    return publicUpload(row!);
  }

  /** A pending, unexpired upload of the project (an expired one is marked so first). */
  private async pending(projectId: string, id: string): Promise<UploadRow> {
    const [row] = await this.db
      .select()
      .from(U)
      .where(and(eq(U.id, id), eq(U.projectId, projectId)))
      .limit(1);
    if (!row) throw new ServiceError('upload_not_found', { message: `No such upload: '${id}'.` });
    if (row.status === 'pending' && row.expiresAt.getTime() <= this.clock.now()) {
      await this.expire(id);
      row.status = 'expired';
    }
    if (row.status !== 'pending') {
      throw new ServiceError('invalid_state', {
        message: `The upload is ${row.status}; only a pending upload takes parts or completes.`,
      });
    }
    return row;
  }

  /**
   * Stores one part from `data` (refused past the part limit). The part is recorded
   * (`streaming`) before its first byte, so whatever ends the upload drops its bytes
   * even when this process dies mid-stream; it is `stored`, and counted, once whole.
   */
  async addPart(
    projectId: string,
    uploadId: string,
    data: AsyncIterable<Buffer>,
  ): Promise<{ id: string; object: 'upload.part'; created_at: number; upload_id: string }> {
    await this.pending(projectId, uploadId);
    const id = `part_${randomBytes(12).toString('hex')}`;
    const writer = new ChunkWriter(this.db, id);
    const { maxPartBytes, maxFileBytes } = this.limits;
    // Parts not named at completion are allowed (OpenAI's rule), so the parts may
    // hold more than the declared size, but never more than the largest file.
    const stored = await this.partBytes(uploadId);
    const started = new Date(this.clock.now());
    await this.db.transaction(async (tx) => {
      await stillPending(tx, uploadId, started);
      await tx
        .insert(P)
        .values({ id, uploadId, bytes: 0, status: 'streaming', createdAt: started });
    });
    try {
      for await (const buf of data) {
        if (writer.bytes + buf.length > maxPartBytes) throw partTooLarge(maxPartBytes);
        if (stored + writer.bytes + buf.length > maxFileBytes) throw partsTooLarge(maxFileBytes);
        await writer.write(buf);
      }
      await writer.end();
      const now = new Date(this.clock.now());
      await this.db.transaction(async (tx) => {
        // Cancelled, completed or expired while the part streamed (its row and chunks
        // may be gone): the part is refused.
        await stillPending(tx, uploadId, now);
        const [row] = await tx
          .update(P)
          .set({ bytes: writer.bytes, status: 'stored', createdAt: now })
          .where(eq(P.id, id))
          .returning({ id: P.id });
        if (!row) throw new ServiceError('invalid_state', { message: 'The part was dropped.' });
      });
      // Parts streamed side by side each saw the others' bytes missing: count again.
      if ((await this.partBytes(uploadId)) > maxFileBytes) throw partsTooLarge(maxFileBytes);
      return { id, object: 'upload.part', created_at: seconds(now), upload_id: uploadId };
    } catch (err) {
      await this.db.transaction(async (tx) => {
        await deleteChunks(tx, id);
        await tx.delete(P).where(eq(P.id, id));
      });
      throw err;
    }
  }

  private async partBytes(uploadId: string): Promise<number> {
    const [row] = await this.db
      .select({ n: sql<string | number | null>`sum(${P.bytes})` })
      .from(P)
      .where(and(eq(P.uploadId, uploadId), eq(P.status, 'stored')));
    return Number(row?.n ?? 0);
  }

  async complete(projectId: string, uploadId: string, raw: unknown): Promise<UploadObject> {
    const body = parseField(this.completeBody, raw);
    const upload = await this.pending(projectId, uploadId);
    const ids = body.part_ids;
    if (new Set(ids).size !== ids.length) {
      throw new ServiceError('invalid_value', {
        message: 'A part is named more than once.',
        param: 'part_ids',
      });
    }
    const parts = await this.db
      .select({ id: P.id, bytes: P.bytes })
      .from(P)
      .where(and(eq(P.uploadId, uploadId), inArray(P.id, ids), eq(P.status, 'stored')));
    const known = new Set(parts.map((p) => p.id));
    const unknown = ids.find((id) => !known.has(id));
    if (unknown !== undefined) {
      throw new ServiceError('invalid_value', {
        message: `No part '${unknown}' in this upload.`,
        param: 'part_ids',
      });
    }
    const total = parts.reduce((n, p) => n + p.bytes, 0);
    if (total !== upload.bytes) {
      throw new ServiceError('invalid_value', {
        message: `The parts hold ${total} bytes; the upload declared ${upload.bytes}.`,
        param: 'part_ids',
      });
    }
    if (upload.purpose === 'batch' || body.md5 !== undefined) {
      await this.checkContent(ids, upload.purpose as Purpose, body.md5);
    }

    const now = new Date(this.clock.now());
    const fileId = newFileId();
    const result = await this.db.transaction(async (tx) => {
      const [claimed] = await tx
        .update(U)
        .set({ status: 'completed', fileId })
        .where(and(eq(U.id, uploadId), eq(U.status, 'pending')))
        .returning();
      if (!claimed) {
        throw new ServiceError('invalid_state', { message: 'The upload is no longer pending.' });
      }
      const [file] = await tx
        .insert(F)
        .values({
          id: fileId,
          projectId,
          filename: upload.filename,
          purpose: upload.purpose,
          bytes: total,
          status: 'processed',
          createdAt: now,
        })
        .returning();
      // The parts' chunks become the file's, renumbered in `part_ids` order.
      await tx.execute(sql`
        update ${C} set owner = ${fileId}, seq = m.n
        from (
          select c.owner, c.seq,
                 (row_number() over (order by p.ord, c.seq))::int - 1 as n
          from jsonb_array_elements_text(${JSON.stringify(ids)}::jsonb) with ordinality as p(id, ord)
          join ${C} c on c.owner = p.id
        ) m
        where ${C.owner} = m.owner and ${C.seq} = m.seq`);
      const all = await tx.select({ id: P.id }).from(P).where(eq(P.uploadId, uploadId));
      const unused = all.map((p) => p.id).filter((id) => !known.has(id));
      if (unused.length) await tx.delete(C).where(inArray(C.owner, unused));
      await tx.delete(P).where(eq(P.uploadId, uploadId));
      const fileObject = publicFile(file!);
      await emitEvent(tx, { projectId, type: 'file.uploaded', data: { ...fileObject }, now });
      return publicUpload(claimed, fileObject);
    });
    this.onEvent();
    return result;
  }

  async cancel(projectId: string, uploadId: string): Promise<UploadObject> {
    await this.pending(projectId, uploadId);
    return this.db.transaction(async (tx) => {
      const [row] = await tx
        .update(U)
        .set({ status: 'cancelled' })
        .where(and(eq(U.id, uploadId), eq(U.status, 'pending')))
        .returning();
      if (!row)
        throw new ServiceError('invalid_state', { message: 'The upload is no longer pending.' });
      await dropParts(tx, uploadId);
      return publicUpload(row);
    });
  }

  /** Marks a pending upload past its expiry `expired` and drops its parts. */
  async expire(uploadId: string): Promise<void> {
    await this.db.transaction(async (tx) => {
      const [row] = await tx
        .update(U)
        .set({ status: 'expired' })
        .where(and(eq(U.id, uploadId), eq(U.status, 'pending')))
        .returning({ id: U.id });
      if (row) await dropParts(tx, uploadId);
    });
  }

  /** Every pending upload past its expiry (the batch runner's sweep). */
  async expireDue(): Promise<number> {
    const due = await this.db
      .select({ id: U.id })
      .from(U)
      .where(and(eq(U.status, 'pending'), sql`${U.expiresAt} <= ${new Date(this.clock.now())}`))
      .limit(100);
    for (const u of due) await this.expire(u.id);
    return due.length;
  }

  private async checkContent(
    ids: string[],
    purpose: Purpose,
    md5: string | undefined,
  ): Promise<void> {
    const hash = md5 !== undefined ? createHash('md5') : null;
    const checker =
      purpose === 'batch' ? new BatchLineChecker('part_ids', this.limits.maxBodyBytes) : null;
    const splitter = checker
      ? new LineSplitter((line, n) => checker.check(line, n), checker.maxLineBytes)
      : null;
    for (const id of ids) {
      for await (const chunk of readChunks(this.db, id)) {
        hash?.update(chunk);
        splitter?.push(chunk);
      }
    }
    splitter?.end();
    checker?.finish();
    if (hash && hash.digest('hex') !== md5!.toLowerCase()) {
      throw new ServiceError('invalid_value', {
        message: "The parts' MD5 checksum does not match 'md5'.",
        param: 'md5',
      });
    }
  }
}

type Tx = Parameters<Parameters<Db['transaction']>[0]>[0];

/** Locks the upload (a cancel, completion or expiry waits) and refuses it unless pending at `now`. */
async function stillPending(tx: Tx, uploadId: string, now: Date): Promise<void> {
  const [u] = await tx
    .select({ status: U.status, expiresAt: U.expiresAt })
    .from(U)
    .where(eq(U.id, uploadId))
    .for('update');
  const status = u && u.expiresAt <= now && u.status === 'pending' ? 'expired' : u?.status;
  if (status !== 'pending') {
    throw new ServiceError('invalid_state', {
      message: `The upload is ${status}; only a pending upload takes parts or completes.`,
    });
  }
}

async function dropParts(tx: Tx, uploadId: string): Promise<void> {
  const parts = await tx.select({ id: P.id }).from(P).where(eq(P.uploadId, uploadId));
  if (parts.length)
    await tx.delete(C).where(
      inArray(
        C.owner,
        parts.map((p) => p.id),
      ),
    );
  await tx.delete(P).where(eq(P.uploadId, uploadId));
}

function partsTooLarge(max: number): ServiceError {
  return new ServiceError('payload_too_large', {
    message: `An upload's parts hold at most ${max} bytes in all (the largest file).`,
    param: 'data',
  });
}

export function partTooLarge(max: number): ServiceError {
  return new ServiceError('payload_too_large', {
    message: `An upload part holds at most ${max} bytes.`,
    param: 'data',
  });
}
