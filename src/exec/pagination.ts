/**
 * Keyset pagination for the exec lists: newest first (`created_at`, then the
 * row id), `limit` 1..100 (default 20), `after` = the last external id of the
 * previous page. Answers `{object: "list", data, has_more}`.
 */
import { and, eq, lt, or, type SQL } from 'drizzle-orm';
import type { PgColumn, PgTable } from 'drizzle-orm/pg-core';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import type { Db } from '../store/index.js';

export const pageQuery = z.object({
  limit: z.coerce.number().int().min(1).max(100).default(20),
  after: z.string().min(1).max(100).optional(),
});

export interface Keyed {
  id: PgColumn;
  externalId: PgColumn;
  projectId: PgColumn;
  createdAt: PgColumn;
}

/** The condition selecting rows after the cursor, or undefined without one. */
export async function afterCursor(
  db: Db,
  t: PgTable & Keyed,
  projectId: string,
  after: string | undefined,
): Promise<SQL | undefined> {
  if (!after) return undefined;
  const rows = (await db
    .select({ createdAt: t.createdAt, id: t.id })
    .from(t as PgTable)
    .where(and(eq(t.projectId, projectId), eq(t.externalId, after)))
    .limit(1)) as Array<{ createdAt: Date; id: string }>;
  const c = rows[0];
  if (!c) {
    throw new ServiceError('invalid_body', {
      message: `Unknown cursor '${after}'.`,
      param: 'after',
    });
  }
  return or(lt(t.createdAt, c.createdAt), and(eq(t.createdAt, c.createdAt), lt(t.id, c.id)));
}

export function page<T>(rows: T[], limit: number) {
  return { object: 'list' as const, data: rows.slice(0, limit), has_more: rows.length > limit };
}
