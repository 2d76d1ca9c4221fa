/**
 * Workspaces (`ws_<hex>`): the project-scoped context an invocation runs in.
 * Lookups decide, in order: absent → `missing_workspace_id`; not `ws_<hex>`
 * (a UUID included) → `invalid_workspace_id`; the database failing →
 * `workspace_lookup_failed` (500, retryable); unknown → `workspace_not_found`;
 * another project's → `project_mismatch` (403).
 */
import { randomUUID } from 'node:crypto';
import { and, desc, eq } from 'drizzle-orm';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { parseBody } from '../http/validate.js';
import { externalId } from '../runtime/ids.js';
import { tables } from '../store/index.js';
import type { ExecContext } from './context.js';
import { afterCursor, page, pageQuery } from './pagination.js';
import { publicWorkspace, type WorkspaceRow } from './records.js';

const { workspaces: W } = tables;

export const WORKSPACE_ID = /^ws_[0-9a-f]{8,64}$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

const createBody = z
  .object({
    name: z.string().max(200).optional(),
    metadata: z
      .record(z.string().max(64), z.string().max(512))
      .refine((m) => Object.keys(m).length <= 16, { message: 'at most 16 pairs' })
      .optional(),
  })
  .strict();

export class Workspaces {
  constructor(private readonly ctx: ExecContext) {}

  async create(projectId: string, raw: unknown) {
    const body = parseBody(createBody, raw ?? {});
    const row: WorkspaceRow = {
      id: randomUUID(),
      externalId: externalId('ws'),
      projectId,
      name: body.name ?? '',
      metadata: body.metadata ?? {},
      createdAt: new Date(this.ctx.clock.now()),
    };
    await this.ctx.db.insert(W).values(row);
    return publicWorkspace(row);
  }

  async list(projectId: string, query: unknown) {
    const q = parseBody(pageQuery, query ?? {});
    const cursor = await afterCursor(this.ctx.db, W, projectId, q.after);
    const rows = await this.ctx.db
      .select()
      .from(W)
      .where(and(eq(W.projectId, projectId), cursor))
      .orderBy(desc(W.createdAt), desc(W.id))
      .limit(q.limit + 1);
    return page(rows.map(publicWorkspace), q.limit);
  }

  async get(projectId: string, id: unknown) {
    return publicWorkspace(await this.resolve(projectId, id, 'workspace_id'));
  }

  async resolve(projectId: string, id: unknown, param = 'workspace_id'): Promise<WorkspaceRow> {
    if (id === undefined || id === null || id === '') {
      throw new ServiceError('missing_workspace_id', { param });
    }
    if (typeof id !== 'string' || !WORKSPACE_ID.test(id)) {
      throw new ServiceError('invalid_workspace_id', {
        message:
          typeof id === 'string' && UUID.test(id)
            ? 'workspace_id must be the external ws_<hex> id; UUIDs are not accepted.'
            : 'workspace_id must have the form ws_<hex>.',
        param,
      });
    }
    let rows: WorkspaceRow[];
    try {
      rows = await this.ctx.db.select().from(W).where(eq(W.externalId, id)).limit(1);
    } catch (err) {
      throw new ServiceError('workspace_lookup_failed', { cause: err, param });
    }
    const w = rows[0];
    if (!w) throw new ServiceError('workspace_not_found', { param });
    if (w.projectId !== projectId) {
      throw new ServiceError('project_mismatch', {
        message: 'The workspace belongs to another project.',
        param,
      });
    }
    return w;
  }
}
