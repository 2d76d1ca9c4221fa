/**
 * Models offered by the platform: name, context window, capabilities (such as
 * `tool_calling`), owner. The list entry shape is the spec's Model.
 *
 * Capabilities gate the routes and request features that need them:
 * `tool_calling`, `json_schema`, `logprobs` (chat request fields), `reasoning`,
 * `vision`, `embeddings` (POST .../v1/embeddings) and `rerank` (POST .../v1/rerank
 * and .../v1/score); an endpoint whose model lacks one answers 400
 * `model_capability_missing`.
 */
import { randomUUID } from 'node:crypto';
import { and, asc, eq, isNull, or, sql } from 'drizzle-orm';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';

const { models } = tables;

export const CAPABILITIES = [
  'tool_calling',
  'json_schema',
  'logprobs',
  'reasoning',
  'vision',
  'embeddings',
  'rerank',
] as const;

export interface ModelRecord {
  id: string;
  name: string;
  contextWindow: number;
  capabilities: string[];
  ownedBy: string;
  promptPriceCentsPerMtok: number;
  completionPriceCentsPerMtok: number;
  /** The project that created it (Models API); null for a platform model. */
  projectId: string | null;
  deletedAt: Date | null;
  createdAt: Date;
}

export interface ModelEntry {
  id: string;
  object: 'model';
  created: number;
  owned_by: string;
}

export function modelEntry(m: ModelRecord): ModelEntry {
  return {
    id: m.name,
    object: 'model',
    created: Math.floor(m.createdAt.getTime() / 1000),
    owned_by: m.ownedBy,
  };
}

/** Operator view: the list entry plus what the operator configured. */
export function operatorModel(m: ModelRecord) {
  return {
    ...modelEntry(m),
    uuid: m.id,
    context_window: m.contextWindow,
    capabilities: m.capabilities,
    prompt_price_cents_per_mtok: m.promptPriceCentsPerMtok,
    completion_price_cents_per_mtok: m.completionPriceCentsPerMtok,
  };
}

export class ModelRepository {
  constructor(private readonly db: Db) {}

  async create(
    input: {
      name: string;
      contextWindow: number;
      capabilities: string[];
      ownedBy: string;
      promptPriceCentsPerMtok?: number;
      completionPriceCentsPerMtok?: number;
      projectId?: string | null;
    },
    now: Date,
  ): Promise<ModelRecord> {
    const row: ModelRecord = {
      id: randomUUID(),
      promptPriceCentsPerMtok: 0,
      completionPriceCentsPerMtok: 0,
      projectId: null,
      deletedAt: null,
      ...input,
      createdAt: now,
    };
    await this.db.insert(models).values(row);
    return row;
  }

  /**
   * Live models: the platform's, plus one project's own when `projectId` is given
   * (`null`: the platform's only; omitted: every live model, for the operator). A
   * project's own model hides a platform model of the same name from it.
   */
  async list(projectId?: string | null): Promise<ModelRecord[]> {
    const rows = await this.db
      .select()
      .from(models)
      .where(and(isNull(models.deletedAt), visibleTo(projectId)))
      .orderBy(asc(models.createdAt), asc(models.name));
    if (!projectId) return rows;
    const own = new Set(rows.filter((m) => m.projectId !== null).map((m) => m.name));
    return rows.filter((m) => m.projectId !== null || !own.has(m.name));
  }

  /**
   * A live model by name that `projectId` may see (`null`: the platform's only); the
   * project's own before the platform's. Names repeat across projects, so there is no
   * lookup by name alone: `named` lists them all.
   */
  async findByName(name: string, projectId: string | null): Promise<ModelRecord | null> {
    const rows = await this.db
      .select()
      .from(models)
      .where(and(eq(models.name, name), isNull(models.deletedAt), visibleTo(projectId)))
      // `false` sorts first: the project's own row before the platform's.
      .orderBy(sql`${models.projectId} is null`)
      .limit(1);
    return rows[0] ?? null;
  }

  /** Every live model of that name: the platform's first, then projects' own. */
  async named(name: string): Promise<ModelRecord[]> {
    return this.db
      .select()
      .from(models)
      .where(and(eq(models.name, name), isNull(models.deletedAt)))
      .orderBy(sql`${models.projectId} is not null`, asc(models.createdAt));
  }

  /** A project's change to its own model; null when it is gone. */
  async update(
    id: string,
    patch: { contextWindow?: number | undefined; capabilities?: string[] | undefined },
  ): Promise<ModelRecord | null> {
    const set: Partial<typeof models.$inferInsert> = {};
    if (patch.contextWindow !== undefined) set.contextWindow = patch.contextWindow;
    if (patch.capabilities !== undefined) set.capabilities = patch.capabilities;
    if (Object.keys(set).length === 0) return this.findById(id);
    const rows = await this.db
      .update(models)
      .set(set)
      .where(and(eq(models.id, id), isNull(models.deletedAt)))
      .returning();
    return rows[0] ?? null;
  }

  /** Soft delete: endpoints and workers that name the model keep their reference. */
  async softDelete(id: string, now: Date): Promise<boolean> {
    const rows = await this.db
      .update(models)
      .set({ deletedAt: now })
      .where(and(eq(models.id, id), isNull(models.deletedAt)))
      .returning({ id: models.id });
    return rows.length > 0;
  }

  async findById(id: string): Promise<ModelRecord | null> {
    const rows = await this.db.select().from(models).where(eq(models.id, id)).limit(1);
    return rows[0] ?? null;
  }
}

function visibleTo(projectId: string | null | undefined) {
  if (projectId === undefined) return undefined;
  if (projectId === null) return isNull(models.projectId);
  return or(isNull(models.projectId), eq(models.projectId, projectId));
}
