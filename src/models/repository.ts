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
import { asc, eq } from 'drizzle-orm';
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
    },
    now: Date,
  ): Promise<ModelRecord> {
    const row = {
      id: randomUUID(),
      promptPriceCentsPerMtok: 0,
      completionPriceCentsPerMtok: 0,
      ...input,
      createdAt: now,
    };
    await this.db.insert(models).values(row);
    return row;
  }

  async list(): Promise<ModelRecord[]> {
    return this.db.select().from(models).orderBy(asc(models.createdAt), asc(models.name));
  }

  async findByName(name: string): Promise<ModelRecord | null> {
    const rows = await this.db.select().from(models).where(eq(models.name, name)).limit(1);
    return rows[0] ?? null;
  }

  async findById(id: string): Promise<ModelRecord | null> {
    const rows = await this.db.select().from(models).where(eq(models.id, id)).limit(1);
    return rows[0] ?? null;
  }
}
