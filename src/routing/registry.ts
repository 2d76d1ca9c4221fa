/**
 * The worker registry: inference workers per (model, tier), registered
 * statically by the operator, started embedded by the router, or
 * self-registered (`switchyard worker --register`, source `registered`) with
 * heartbeats. A worker is any server speaking the OpenAI wire format,
 * registered by its base URL including `/v1`.
 *
 * `status` is the routing truth shared by every router on the database:
 * `healthy` workers are candidates, `unhealthy` ones are not (missed
 * heartbeats, failed health checks; see monitor.ts), `draining` ones are not.
 */
import { randomBytes } from 'node:crypto';
import { and, asc, eq, isNull, ne } from 'drizzle-orm';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';

const { workers, models } = tables;

export type WorkerSource = 'static' | 'registered' | 'embedded';
export type WorkerStatus = 'healthy' | 'unhealthy' | 'draining';

/** How a worker orders its waiting queue (vLLM's `--scheduling-policy`). */
export const SCHEDULING_POLICIES = ['fcfs', 'priority'] as const;
export type SchedulingPolicy = (typeof SCHEDULING_POLICIES)[number];

export interface WorkerRecord {
  id: string;
  modelId: string;
  modelName: string;
  tierId: string;
  url: string;
  source: string;
  status: string;
  lastHeartbeatAt: Date | null;
  /** Requests the worker accepts at once, when it said so (self-registration). */
  capacity: number | null;
  /** `priority`: the worker orders its queue by the `priority` the router sends. */
  schedulingPolicy: SchedulingPolicy;
  createdAt: Date;
}

export function publicWorker(w: WorkerRecord) {
  return {
    id: w.id,
    object: 'worker' as const,
    model: w.modelName,
    model_id: w.modelId,
    tier: w.tierId,
    url: w.url,
    source: w.source,
    status: w.status,
    last_heartbeat_at: w.lastHeartbeatAt ? Math.floor(w.lastHeartbeatAt.getTime() / 1000) : null,
    capacity: w.capacity,
    scheduling_policy: w.schedulingPolicy,
    created: Math.floor(w.createdAt.getTime() / 1000),
  };
}

const columns = {
  id: workers.id,
  modelId: workers.modelId,
  modelName: models.name,
  tierId: workers.tierId,
  url: workers.url,
  source: workers.source,
  status: workers.status,
  lastHeartbeatAt: workers.lastHeartbeatAt,
  capacity: workers.capacity,
  schedulingPolicy: workers.schedulingPolicy,
  createdAt: workers.createdAt,
};

export function newWorkerId(): string {
  return `wkr_${randomBytes(8).toString('hex')}`;
}

/** The unique index on a static or registered worker's (source, model, tier, URL). */
export const WORKER_URL_KEY = 'workers_source_model_tier_url_key';

/** What registering a worker writes (`WorkerRegistry.upsert`, `create`). */
export interface WorkerInput {
  id: string;
  modelId: string;
  tierId: string;
  url: string;
  source: WorkerSource;
  capacity?: number | null;
  schedulingPolicy?: SchedulingPolicy;
}

export class WorkerRegistry {
  /** Every worker, built once: the worker monitor lists them every second (monitor.ts). */
  private readonly all;

  constructor(private readonly db: Db) {
    this.all = db
      .select(columns)
      .from(workers)
      .innerJoin(models, eq(models.id, workers.modelId))
      .orderBy(asc(workers.createdAt), asc(workers.id))
      .prepare('');
  }

  /**
   * Inserts a worker, or replaces the one of the same id and source (a self-registered
   * worker registering again, an embedded one on every start). Null when a worker of
   * another source holds the id: the insert and the check are one statement, so of a
   * static and a self-registration of one id at once the first row written stays,
   * whole, and the other gets null (no row taken over; routes answer 409).
   */
  async upsert(input: WorkerInput, now: Date): Promise<WorkerRecord | null> {
    const heartbeat = input.source === 'registered' ? now : null;
    const capacity = input.capacity ?? null;
    const schedulingPolicy = input.schedulingPolicy ?? 'fcfs';
    const written = await this.db
      .insert(workers)
      .values({
        ...input,
        capacity,
        schedulingPolicy,
        status: 'healthy',
        lastHeartbeatAt: heartbeat,
        createdAt: now,
      })
      .onConflictDoUpdate({
        target: workers.id,
        set: {
          modelId: input.modelId,
          tierId: input.tierId,
          url: input.url,
          capacity,
          schedulingPolicy,
          status: 'healthy',
          lastHeartbeatAt: heartbeat,
        },
        setWhere: eq(workers.source, input.source),
      })
      .returning({ id: workers.id });
    if (written.length === 0) return null;
    const w = await this.get(input.id);
    if (!w) throw new Error('worker vanished after insert');
    return w;
  }

  /**
   * Inserts a new worker; null when its id is taken (by any source), in the same
   * statement, so a concurrent registration of the id cannot be overwritten.
   */
  async create(input: Omit<WorkerInput, 'capacity'>, now: Date): Promise<WorkerRecord | null> {
    const written = await this.db
      .insert(workers)
      .values({
        ...input,
        capacity: null,
        schedulingPolicy: input.schedulingPolicy ?? 'fcfs',
        status: 'healthy',
        lastHeartbeatAt: null,
        createdAt: now,
      })
      .onConflictDoNothing({ target: workers.id })
      .returning({ id: workers.id });
    if (written.length === 0) return null;
    const w = await this.get(input.id);
    if (!w) throw new Error('worker vanished after insert');
    return w;
  }

  async get(id: string): Promise<WorkerRecord | null> {
    const rows = await this.db
      .select(columns)
      .from(workers)
      .innerJoin(models, eq(models.id, workers.modelId))
      .where(eq(workers.id, id))
      .limit(1);
    return rows[0] ?? null;
  }

  async list(filter: { modelId?: string; tierId?: string } = {}): Promise<WorkerRecord[]> {
    if (!filter.modelId && !filter.tierId) return this.all.execute();
    const conds = [];
    if (filter.modelId) conds.push(eq(workers.modelId, filter.modelId));
    if (filter.tierId) conds.push(eq(workers.tierId, filter.tierId));
    return this.db
      .select(columns)
      .from(workers)
      .innerJoin(models, eq(models.id, workers.modelId))
      .where(conds.length ? and(...conds) : undefined)
      .orderBy(asc(workers.createdAt), asc(workers.id));
  }

  /**
   * The worker of `source` at (model, tier, url): a self-registered one is re-registered
   * in place; a second static one would be the same server twice.
   */
  async findAt(
    source: 'registered' | 'static',
    modelId: string,
    tierId: string,
    url: string,
  ): Promise<WorkerRecord | null> {
    const rows = await this.db
      .select(columns)
      .from(workers)
      .innerJoin(models, eq(models.id, workers.modelId))
      .where(
        and(
          eq(workers.modelId, modelId),
          eq(workers.tierId, tierId),
          eq(workers.url, url),
          eq(workers.source, source),
        ),
      )
      .limit(1);
    return rows[0] ?? null;
  }

  /** Records a heartbeat; null when the worker is unknown (removed: it must register again). */
  async heartbeat(id: string, now: Date): Promise<WorkerRecord | null> {
    const rows = await this.db
      .update(workers)
      .set({ lastHeartbeatAt: now })
      .where(and(eq(workers.id, id), eq(workers.source, 'registered')))
      .returning({ id: workers.id });
    return rows.length > 0 ? this.get(id) : null;
  }

  /**
   * Sets the status; true when it changed (so callers publish only real transitions).
   * `from`: only if the status is still that one (a verdict formed on an earlier read,
   * such as the monitor's, must not overwrite a drain recorded since).
   */
  async setStatus(id: string, status: WorkerStatus, from?: WorkerStatus): Promise<boolean> {
    const rows = await this.db
      .update(workers)
      .set({ status })
      .where(
        and(
          eq(workers.id, id),
          ne(workers.status, status),
          from === undefined ? undefined : eq(workers.status, from),
        ),
      )
      .returning({ id: workers.id });
    return rows.length > 0;
  }

  /**
   * Removes a self-registered worker that missed its heartbeats, unless one arrived
   * (or it registered again) since `lastHeartbeatAt` was read.
   */
  async expire(id: string, lastHeartbeatAt: Date | null): Promise<boolean> {
    const rows = await this.db
      .delete(workers)
      .where(
        and(
          eq(workers.id, id),
          lastHeartbeatAt
            ? eq(workers.lastHeartbeatAt, lastHeartbeatAt)
            : isNull(workers.lastHeartbeatAt),
        ),
      )
      .returning({ id: workers.id });
    return rows.length > 0;
  }

  async remove(id: string): Promise<boolean> {
    const rows = await this.db
      .delete(workers)
      .where(eq(workers.id, id))
      .returning({ id: workers.id });
    return rows.length > 0;
  }
}
