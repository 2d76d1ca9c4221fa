/**
 * Webhook endpoints and their delivery records (spec: Webhook endpoint,
 * Webhook delivery record). Endpoints belong to a project (at most 20, with
 * at most 16 metadata pairs); URLs must be https and are checked against the
 * SSRF policy at creation and update (and again at every connect).
 *
 * Lists are newest first; `after` is the id of the last item of the previous
 * page and returns the items that follow it; `limit` is 1..100 (default 20).
 */
import { randomUUID } from 'node:crypto';
import { and, desc, eq, lt, or, sql, type SQL } from 'drizzle-orm';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { ALL_EVENT_TYPES } from '../events/catalogue.js';
import { deliveryId, eventId, insertEvent } from '../events/outbox.js';
import type { Limits } from '../http/limits.js';
import { parseBody } from '../http/validate.js';
import type { Clock } from '../runtime/clock.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';
import type { Dispatcher } from './dispatcher.js';
import { LEASE_MS } from './dispatcher.js';
import { generateSecret } from './signing.js';
import { validateWebhookUrl, type AddressPolicy, type Resolver } from './ssrf.js';

export const MAX_ENDPOINTS_PER_PROJECT = 20;
export const MAX_METADATA_PAIRS = 16;
export const TESTS_PER_HOUR = 10;
const DEFAULT_PAGE = 20;
const MAX_PAGE = 100;

const { webhookEndpoints: W, webhookDeliveries: D, webhookAttempts: A } = tables;

const metadata = z
  .record(z.string().max(64, 'keys must be at most 64 characters'), z.string().max(512))
  .refine((m) => Object.keys(m).length <= MAX_METADATA_PAIRS, {
    message: `at most ${MAX_METADATA_PAIRS} pairs`,
  });
const eventsList = z
  .array(z.string().refine((t) => ALL_EVENT_TYPES.includes(t), { message: 'unknown event type' }))
  .min(1, 'must list at least one event type')
  .max(64)
  // A type listed twice is one subscription: stored and shown once.
  .transform((types) => [...new Set(types)]);

const createBody = z
  .object({
    url: z.string().min(1),
    events: eventsList,
    description: z.string().max(1000).optional(),
    metadata: metadata.optional(),
  })
  .strict();

const updateBody = z
  .object({
    url: z.string().min(1).optional(),
    events: eventsList.optional(),
    description: z.string().max(1000).optional(),
    is_active: z.boolean().optional(),
    metadata: metadata.optional(),
  })
  .strict();

const pageQuery = z.object({
  limit: z.coerce.number().int().min(1).max(MAX_PAGE).default(DEFAULT_PAGE),
  after: z.string().min(1).max(100).optional(),
});

type EndpointRow = typeof W.$inferSelect;
type DeliveryRow = typeof D.$inferSelect;

const unix = (d: Date) => Math.floor(d.getTime() / 1000);

export function publicEndpoint(w: EndpointRow) {
  return {
    id: w.id,
    object: 'webhook_endpoint' as const,
    url: w.url,
    description: w.description,
    events: w.events,
    is_active: w.isActive === 1,
    metadata: w.metadata,
    created_at: unix(w.createdAt),
    updated_at: unix(w.updatedAt),
  };
}

/**
 * The spec types `http_status` as integer and `response_body` as string: before
 * the first attempt, and after one that got no response (network error,
 * timeout), they are 0 and '' (as in the test-delivery result); `last_error`
 * says why.
 */
export function publicDelivery(d: DeliveryRow) {
  return {
    id: d.id,
    object: 'webhook_delivery' as const,
    event_type: d.eventType,
    http_status: d.httpStatus ?? 0,
    response_body: d.responseBody ?? '',
    status: d.status,
    attempt_count: d.attemptCount,
    created_at: unix(d.createdAt),
    // Beyond the spec's fields, what receivers' operators ask for.
    event_id: d.eventId,
    next_attempt_at: d.status === 'pending' ? unix(d.nextAttemptAt) : null,
    last_error: d.lastError,
  };
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
export class WebhookService {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly policy: AddressPolicy,
    private readonly dispatcher: Dispatcher,
    private readonly limits: Limits,
    private readonly resolver?: Resolver,
  ) {}

  private async checkUrl(url: string): Promise<string> {
    const r = await validateWebhookUrl(url, this.policy, this.resolver);
    if (!r.ok) {
      throw new ServiceError('invalid_body', {
        message: `Invalid 'url': ${r.message}`,
        param: 'url',
      });
    }
    return r.url.toString();
  }

  async create(projectId: string, raw: unknown) {
    const body = parseBody(createBody, raw);
    const url = await this.checkUrl(body.url);
    const now = new Date(this.clock.now());
    const secret = generateSecret();
    const row = await this.db.transaction(async (tx) => {
      // Serialise creations per project so the cap holds under concurrency.
      await tx.execute(sql`select id from projects where id = ${projectId} for update`);
      const [count] = await tx
        .select({ n: sql<number>`count(*)::int` })
        .from(W)
        .where(eq(W.projectId, projectId));
      if ((count?.n ?? 0) >= MAX_ENDPOINTS_PER_PROJECT) {
        throw new ServiceError('webhook_endpoint_limit', {
          message: `A project can have at most ${MAX_ENDPOINTS_PER_PROJECT} webhook endpoints.`,
        });
      }
      const r = {
        id: randomUUID(),
        projectId,
        url,
        description: body.description ?? '',
        secret,
        events: body.events,
        isActive: 1,
        metadata: body.metadata ?? {},
        createdAt: now,
        updatedAt: now,
      };
      await tx.insert(W).values(r);
      return r;
    });
    return { ...publicEndpoint(row), secret };
  }

  private async row(projectId: string, id: string): Promise<EndpointRow> {
    const rows = UUID.test(id)
      ? await this.db
          .select()
          .from(W)
          .where(and(eq(W.projectId, projectId), eq(W.id, id)))
          .limit(1)
      : [];
    if (!rows[0]) throw new ServiceError('webhook_not_found', { param: 'webhook_id' });
    return rows[0];
  }

  async get(projectId: string, id: string) {
    return publicEndpoint(await this.row(projectId, id));
  }

  async list(projectId: string, query: unknown) {
    const q = parseBody(pageQuery, query ?? {});
    const cursor = q.after ? await this.cursorOf(W, projectId, q.after) : undefined;
    const rows = await this.db
      .select()
      .from(W)
      .where(and(eq(W.projectId, projectId), cursor ? before(W, cursor) : undefined))
      .orderBy(desc(W.createdAt), desc(W.id))
      .limit(q.limit + 1);
    return page(rows.map(publicEndpoint), q.limit);
  }

  private async cursorOf(
    t: typeof W | typeof D,
    projectId: string,
    after: string,
  ): Promise<{ createdAt: Date; id: string }> {
    // Webhook ids are UUIDs in a uuid column: anything else is no cursor, not a query error.
    const rows =
      t === W && !UUID.test(after)
        ? []
        : await this.db
            .select({ createdAt: t.createdAt, id: t.id })
            .from(t)
            .where(and(eq(t.projectId, projectId), eq(t.id, after)))
            .limit(1);
    if (!rows[0]) {
      throw new ServiceError('invalid_body', {
        message: `Unknown cursor '${after}'.`,
        param: 'after',
      });
    }
    return rows[0];
  }

  async update(projectId: string, id: string, raw: unknown) {
    const existing = await this.row(projectId, id);
    const body = parseBody(updateBody, raw);
    const set: Partial<EndpointRow> = { updatedAt: new Date(this.clock.now()) };
    if (body.url !== undefined) set.url = await this.checkUrl(body.url);
    if (body.events !== undefined) set.events = body.events;
    if (body.description !== undefined) set.description = body.description;
    if (body.is_active !== undefined) set.isActive = body.is_active ? 1 : 0;
    if (body.metadata !== undefined) set.metadata = body.metadata;
    await this.db.update(W).set(set).where(eq(W.id, existing.id));
    return this.get(projectId, id);
  }

  async remove(projectId: string, id: string) {
    const existing = await this.row(projectId, id);
    // Deliveries and their attempts go with it (ON DELETE CASCADE).
    await this.db.delete(W).where(eq(W.id, existing.id));
    return { id: existing.id, object: 'webhook_endpoint' as const, deleted: true };
  }

  /** A synthetic signed delivery of a `webhook.test` event, attempted now, once. */
  async test(projectId: string, id: string) {
    const w = await this.row(projectId, id);
    await this.limits.window(
      `whtest:${w.id}`,
      TESTS_PER_HOUR,
      3_600_000,
      `At most ${TESTS_PER_HOUR} test deliveries per webhook endpoint per hour.`,
    );
    const now = new Date(this.clock.now());
    const evt = eventId();
    const body = JSON.stringify({
      id: evt,
      object: 'event',
      type: 'webhook.test',
      created_at: unix(now),
      data: { webhook_id: w.id, message: 'This is a test delivery from Switchyard.' },
    });
    const emitted = await this.db.transaction((tx) =>
      insertEvent(tx, {
        id: evt,
        projectId,
        type: 'webhook.test',
        body,
        now,
        onlyEndpoint: w.id,
        leaseUntil: new Date(now.getTime() + LEASE_MS),
      }),
    );
    const delivery = emitted.deliveries[0];
    const claimed = delivery ? await this.dispatcher.claim(1, delivery) : [];
    if (!claimed[0]) {
      return {
        success: false,
        http_status: 0,
        response_body: '',
        error_message: 'The webhook endpoint is disabled.',
      };
    }
    const o = await this.dispatcher.attempt(claimed[0]);
    return {
      success: o.success,
      http_status: o.httpStatus ?? 0,
      response_body: o.responseBody ?? '',
      error_message: o.error,
    };
  }

  async deliveries(projectId: string, id: string, query: unknown) {
    const w = await this.row(projectId, id);
    const q = parseBody(pageQuery, query ?? {});
    const cursor = q.after ? await this.cursorOf(D, projectId, q.after) : undefined;
    const rows = await this.db
      .select()
      .from(D)
      .where(and(eq(D.endpointId, w.id), cursor ? before(D, cursor) : undefined))
      .orderBy(desc(D.createdAt), desc(D.id))
      .limit(q.limit + 1);
    return page(rows.map(publicDelivery), q.limit);
  }

  private async delivery(projectId: string, webhookId: string, id: string): Promise<DeliveryRow> {
    const w = await this.row(projectId, webhookId);
    const rows = await this.db
      .select()
      .from(D)
      .where(and(eq(D.endpointId, w.id), eq(D.id, id)))
      .limit(1);
    if (!rows[0]) throw new ServiceError('delivery_not_found', { param: 'delivery_id' });
    return rows[0];
  }

  async attempts(projectId: string, webhookId: string, id: string) {
    const d = await this.delivery(projectId, webhookId, id);
    const rows = await this.db.select().from(A).where(eq(A.deliveryId, d.id)).orderBy(A.attemptNo);
    return {
      object: 'list' as const,
      data: rows.map((a) => ({
        object: 'webhook_delivery_attempt' as const,
        delivery_id: a.deliveryId,
        attempt: a.attemptNo,
        outcome: a.outcome,
        http_status: a.httpStatus,
        response_body: a.responseBody,
        error: a.error,
        duration_ms: a.durationMs,
        started_at: unix(a.startedAt),
      })),
      has_more: false,
    };
  }

  /** Manual redelivery: a fresh delivery of the same event, with its own six attempts. */
  async redeliver(projectId: string, webhookId: string, id: string) {
    const d = await this.delivery(projectId, webhookId, id);
    if (d.status === 'pending') {
      throw new ServiceError('invalid_state', {
        message: 'The delivery is still being attempted.',
      });
    }
    const now = new Date(this.clock.now());
    const row = {
      id: deliveryId(),
      endpointId: d.endpointId,
      eventId: d.eventId,
      projectId: d.projectId,
      eventType: d.eventType,
      status: 'pending',
      attemptCount: 0,
      nextAttemptAt: now,
      createdAt: now,
      updatedAt: now,
    };
    await this.db.insert(D).values(row);
    this.dispatcher.poke();
    const [created] = await this.db.select().from(D).where(eq(D.id, row.id));
    return publicDelivery(created!);
  }
}

function before(t: typeof W | typeof D, c: { createdAt: Date; id: string }): SQL | undefined {
  return or(lt(t.createdAt, c.createdAt), and(eq(t.createdAt, c.createdAt), lt(t.id, c.id)));
}

function page<T>(rows: T[], limit: number) {
  return { object: 'list' as const, data: rows.slice(0, limit), has_more: rows.length > limit };
}
