/**
 * Inference endpoints: a project's slug bound to one model and one tier.
 * `toEndpointRecord` is the one place the spec's Endpoint shape is built.
 *
 * Status: `active` when a healthy worker serves the (model, tier) pair,
 * `provisioning` while none is registered, `suspended` by an operator, `error`
 * while workers are registered but none is healthy. The worker monitor keeps
 * `status`, `provisioning_state` (`ready`, `waiting_for_worker`,
 * `no_healthy_worker`) and `provisioned_worker_id` in step with the pool
 * (`provisioningFor`, routing/monitor.ts); suspended endpoints are left alone.
 * Deleted endpoints are soft-deleted and never listed.
 */
import { randomUUID } from 'node:crypto';
import { and, asc, eq, inArray, isNull, sql } from 'drizzle-orm';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';

const { endpoints, models } = tables;

/** A path segment of this shape names an endpoint by its id, any other by its slug. */
export const ENDPOINT_ID_SHAPE = /^[0-9a-f-]{36}$/i;
/**
 * The ids themselves. A segment of the shape above that is not one names no endpoint:
 * given to PostgreSQL's uuid type it failed the query (500 on every path it was in).
 */
const ENDPOINT_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export const ENDPOINT_STATUSES = ['active', 'provisioning', 'suspended', 'error'] as const;
export type EndpointStatus = (typeof ENDPOINT_STATUSES)[number];

export interface Endpoint {
  id: string;
  projectId: string;
  slug: string;
  name: string;
  modelId: string;
  modelName: string;
  contextWindow: number;
  capabilities: string[];
  promptPriceCentsPerMtok: number;
  completionPriceCentsPerMtok: number;
  tierId: string;
  status: string;
  customDomain: string | null;
  maxRequestsPerMinute: number;
  maxTokensPerMinute: number;
  provisioningState: string | null;
  provisionedWorkerId: string | null;
  createdAt: Date;
}

export interface EndpointRecord {
  id: string;
  object: 'endpoint';
  slug: string;
  name: string;
  model_id: string;
  model_name: string;
  tier_id: string;
  status: string;
  custom_domain: string | null;
  max_requests_per_minute: number;
  max_tokens_per_minute: number;
  provisioning_state: string | null;
  provisioned_worker_id: string | null;
  created: number;
}

export function toEndpointRecord(e: Endpoint): EndpointRecord {
  return {
    id: e.id,
    object: 'endpoint',
    slug: e.slug,
    name: e.name,
    model_id: e.modelId,
    model_name: e.modelName,
    tier_id: e.tierId,
    status: e.status,
    custom_domain: e.customDomain,
    max_requests_per_minute: e.maxRequestsPerMinute,
    max_tokens_per_minute: e.maxTokensPerMinute,
    provisioning_state: e.provisioningState,
    provisioned_worker_id: e.provisionedWorkerId,
    created: Math.floor(e.createdAt.getTime() / 1000),
  };
}

const columns = {
  id: endpoints.id,
  projectId: endpoints.projectId,
  slug: endpoints.slug,
  name: endpoints.name,
  modelId: endpoints.modelId,
  modelName: models.name,
  contextWindow: models.contextWindow,
  capabilities: models.capabilities,
  promptPriceCentsPerMtok: models.promptPriceCentsPerMtok,
  completionPriceCentsPerMtok: models.completionPriceCentsPerMtok,
  tierId: endpoints.tierId,
  status: endpoints.status,
  customDomain: endpoints.customDomain,
  maxRequestsPerMinute: endpoints.maxRequestsPerMinute,
  maxTokensPerMinute: endpoints.maxTokensPerMinute,
  provisioningState: endpoints.provisioningState,
  provisionedWorkerId: endpoints.provisionedWorkerId,
  createdAt: endpoints.createdAt,
};

export interface NewEndpoint {
  projectId: string;
  slug: string;
  name: string;
  modelId: string;
  tierId: string;
  maxRequestsPerMinute: number;
  maxTokensPerMinute: number;
  customDomain?: string | null;
  status: EndpointStatus;
  provisioningState: string | null;
  provisionedWorkerId: string | null;
}

export interface EndpointPatch {
  name?: string;
  status?: EndpointStatus;
  maxRequestsPerMinute?: number;
  maxTokensPerMinute?: number;
  customDomain?: string | null;
  provisioningState?: string | null;
  provisionedWorkerId?: string | null;
}

/** What an endpoint's record says about the pool serving it. */
export interface Provisioning {
  status: 'active' | 'provisioning' | 'error';
  provisioningState: 'ready' | 'waiting_for_worker' | 'no_healthy_worker';
  provisionedWorkerId: string | null;
}

/**
 * The provisioning an endpoint should show, given the workers of its (model,
 * tier): the current worker is kept while it stays healthy, so the record
 * does not churn as load moves between workers.
 */
export function provisioningFor(
  pool: { healthy: readonly string[]; registered: number },
  current: string | null,
): Provisioning {
  if (pool.healthy.length > 0) {
    return {
      status: 'active',
      provisioningState: 'ready',
      provisionedWorkerId: current && pool.healthy.includes(current) ? current : pool.healthy[0]!,
    };
  }
  if (pool.registered > 0) {
    return { status: 'error', provisioningState: 'no_healthy_worker', provisionedWorkerId: null };
  }
  return {
    status: 'provisioning',
    provisioningState: 'waiting_for_worker',
    provisionedWorkerId: null,
  };
}

/** The unique index on a live endpoint's custom domain (without case). */
export const CUSTOM_DOMAIN_KEY = 'endpoints_custom_domain_key';

export class EndpointRepository {
  /**
   * The endpoints that follow their worker pool, built once: the worker monitor
   * reconciles them every second (routing/monitor.ts).
   */
  private readonly followers;

  constructor(private readonly db: Db) {
    this.followers = db
      .select({
        id: endpoints.id,
        modelId: endpoints.modelId,
        tierId: endpoints.tierId,
        status: endpoints.status,
        provisioningState: endpoints.provisioningState,
        provisionedWorkerId: endpoints.provisionedWorkerId,
      })
      .from(endpoints)
      .where(
        and(
          isNull(endpoints.deletedAt),
          inArray(endpoints.status, ['active', 'provisioning', 'error']),
        ),
      )
      .prepare('');
  }

  async create(input: NewEndpoint, now: Date): Promise<Endpoint> {
    const id = randomUUID();
    await this.db.insert(endpoints).values({ id, ...input, createdAt: now });
    const e = await this.get(input.projectId, id);
    if (!e) throw new Error('endpoint vanished after insert');
    return e;
  }

  async get(projectId: string, idOrSlug: string): Promise<Endpoint | null> {
    const byId = ENDPOINT_ID_SHAPE.test(idOrSlug);
    if (byId && !ENDPOINT_ID.test(idOrSlug)) return null;
    const rows = await this.db
      .select(columns)
      .from(endpoints)
      .innerJoin(models, eq(models.id, endpoints.modelId))
      .where(
        and(
          eq(endpoints.projectId, projectId),
          isNull(endpoints.deletedAt),
          byId ? eq(endpoints.id, idOrSlug) : eq(endpoints.slug, idOrSlug),
        ),
      )
      .limit(1);
    return rows[0] ?? null;
  }

  async list(projectId: string): Promise<Endpoint[]> {
    return this.db
      .select(columns)
      .from(endpoints)
      .innerJoin(models, eq(models.id, endpoints.modelId))
      .where(and(eq(endpoints.projectId, projectId), isNull(endpoints.deletedAt)))
      .orderBy(asc(endpoints.createdAt), asc(endpoints.slug));
  }

  async update(projectId: string, id: string, patch: EndpointPatch): Promise<Endpoint | null> {
    // Fields left out of a PATCH arrive as `undefined`: an empty change reads the record.
    const set = Object.fromEntries(Object.entries(patch).filter(([, v]) => v !== undefined));
    if (Object.keys(set).length > 0) {
      await this.db
        .update(endpoints)
        .set(set)
        .where(
          and(
            eq(endpoints.projectId, projectId),
            eq(endpoints.id, id),
            isNull(endpoints.deletedAt),
          ),
        );
    }
    return this.get(projectId, id);
  }

  /** A live endpoint (any project) on the custom domain, compared without case. */
  async findByCustomDomain(domain: string): Promise<{ id: string } | null> {
    const rows = await this.db
      .select({ id: endpoints.id })
      .from(endpoints)
      .where(
        and(
          sql`lower(${endpoints.customDomain}) = ${domain.toLowerCase()}`,
          isNull(endpoints.deletedAt),
        ),
      )
      .limit(1);
    return rows[0] ?? null;
  }

  async softDelete(projectId: string, id: string, now: Date): Promise<boolean> {
    const rows = await this.db
      .update(endpoints)
      .set({ deletedAt: now })
      .where(
        and(eq(endpoints.projectId, projectId), eq(endpoints.id, id), isNull(endpoints.deletedAt)),
      )
      .returning({ id: endpoints.id });
    return rows.length > 0;
  }

  /**
   * Brings every non-suspended endpoint's provisioning in line with its pool
   * (`pools` by `<model id>:<tier>`); returns how many records changed.
   */
  async reconcileProvisioning(
    pools: ReadonlyMap<string, { healthy: readonly string[]; registered: number }>,
  ): Promise<number> {
    const rows = await this.followers.execute();
    let changed = 0;
    for (const e of rows) {
      const want = provisioningFor(
        pools.get(`${e.modelId}:${e.tierId}`) ?? { healthy: [], registered: 0 },
        e.provisionedWorkerId,
      );
      if (
        want.status === e.status &&
        want.provisioningState === e.provisioningState &&
        want.provisionedWorkerId === e.provisionedWorkerId
      ) {
        continue;
      }
      // Guarded by the status read, so an operator's concurrent suspension wins.
      const done = await this.db
        .update(endpoints)
        .set(want)
        .where(
          and(eq(endpoints.id, e.id), eq(endpoints.status, e.status), isNull(endpoints.deletedAt)),
        )
        .returning({ id: endpoints.id });
      changed += done.length;
    }
    return changed;
  }

  /** Endpoints waiting for a worker of (model, tier) become active once one exists. */
  async activateWaiting(modelId: string, tierId: string, workerId: string): Promise<number> {
    const rows = await this.db
      .update(endpoints)
      .set({ status: 'active', provisioningState: 'ready', provisionedWorkerId: workerId })
      .where(
        and(
          eq(endpoints.modelId, modelId),
          eq(endpoints.tierId, tierId),
          eq(endpoints.status, 'provisioning'),
          isNull(endpoints.deletedAt),
        ),
      )
      .returning({ id: endpoints.id });
    return rows.length;
  }
}
