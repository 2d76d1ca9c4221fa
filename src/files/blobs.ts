/**
 * Bytes in the database (`blob_chunks`): a file's or an upload part's content is
 * a sequence of rows of at most `CHUNK_BYTES`, ordered by `seq`. Written as it
 * arrives (one row per full chunk, so an upload is never held whole in memory),
 * read back one row at a time. In the database rather than on a router's disk so
 * that any instance serves any file.
 */
import { and, asc, eq, gt } from 'drizzle-orm';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';

export const CHUNK_BYTES = 1024 * 1024;

const C = tables.blobChunks;

/** A transaction or the database itself. */
export type Tx = Pick<Db, 'select' | 'insert' | 'update' | 'delete' | 'execute'>;

export class ChunkWriter {
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private seq = 0;
  bytes = 0;

  constructor(
    private readonly db: Db,
    private readonly owner: string,
  ) {}

  async write(data: Buffer): Promise<void> {
    this.bytes += data.length;
    this.pending.push(data);
    this.pendingBytes += data.length;
    while (this.pendingBytes >= CHUNK_BYTES) {
      const all = Buffer.concat(this.pending);
      await this.insert(all.subarray(0, CHUNK_BYTES));
      const rest = all.subarray(CHUNK_BYTES);
      this.pending = rest.length ? [rest] : [];
      this.pendingBytes = rest.length;
    }
  }

  async end(): Promise<void> {
    if (this.pendingBytes > 0) await this.insert(Buffer.concat(this.pending));
    this.pending = [];
    this.pendingBytes = 0;
  }

  private async insert(data: Buffer): Promise<void> {
    await this.db.insert(C).values({ owner: this.owner, seq: this.seq++, data: Buffer.from(data) });
  }
}

/** The owner's bytes, chunk by chunk, in order. */
export async function* readChunks(db: Tx, owner: string): AsyncGenerator<Buffer> {
  let after = -1;
  for (;;) {
    const rows = await db
      .select({ seq: C.seq, data: C.data })
      .from(C)
      .where(and(eq(C.owner, owner), gt(C.seq, after)))
      .orderBy(asc(C.seq))
      .limit(1);
    const row = rows[0];
    if (!row) return;
    after = row.seq;
    yield row.data;
  }
}

export async function deleteChunks(tx: Tx, owner: string): Promise<void> {
  await tx.delete(C).where(eq(C.owner, owner));
}
