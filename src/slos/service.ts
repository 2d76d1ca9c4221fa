/**
 * SLOs (the spec names the surface; the shapes are Switchyard's, docs/SLOS.md):
 * per-endpoint latency objectives. An SLO holds a TTFT target, a TPOT target
 * (ms; at least one), an objective (the fraction of requests that must meet
 * each target, in (0, 1)) and a rolling window (60 s to 30 days).
 *
 * Attainment is never stored: each read computes it in one SQL statement from
 * `usage_records` of the SLO's endpoint over the window ending at the injected
 * clock's now, `(now - window, now]` on the record's `created_at` (the request's
 * start). Only `completed` requests count. TTFT is known for streamed requests
 * only (the router does not see a non-streamed response's first token); TPOT
 * of a request is `(duration_ms - ttft_ms) / (completion_tokens - 1)` and
 * needs a TTFT and at least two completion tokens. A request meets a target
 * when its value is <= the target. Percentiles are `percentile_cont`
 * (linear interpolation), the same on PGlite and PostgreSQL. A list computes
 * every SLO's attainment in the same statement (a lateral join), so a page of
 * 100 SLOs is one query, served by `usage_endpoint_created_idx`.
 *
 * `targets(endpointId)` is the router's hot-path read: the tightest TTFT and
 * TPOT among the endpoint's SLOs, through a TTL cache. A change is published
 * as an `endpoint` invalidation (an SLO is part of an endpoint's routing
 * configuration), which drops the entry here and on every other instance.
 */
import { randomUUID } from 'node:crypto';
import { and, desc, eq, getTableName, isNull, lt, or, sql, type SQL } from 'drizzle-orm';
import type { PgColumn } from 'drizzle-orm/pg-core';
import { z } from 'zod';
import type { EndpointRepository } from '../endpoints/repository.js';
import { ServiceError } from '../errors/index.js';
import { parseBody } from '../http/validate.js';
import type { SloTargets } from '../routing/slo.js';
import type { Clock } from '../runtime/clock.js';
import { externalId, unix } from '../runtime/ids.js';
import type { InvalidationBus } from '../runtime/invalidation.js';
import { TtlCache } from '../runtime/ttl-cache.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';

export const MAX_SLOS_PER_ENDPOINT = 20;
export const DEFAULT_OBJECTIVE = 0.99;
export const DEFAULT_WINDOW_SECONDS = 3600;
export const MIN_WINDOW_SECONDS = 60;
export const MAX_WINDOW_SECONDS = 30 * 86_400;
export const MAX_TTFT_MS = 3_600_000;
export const MAX_TPOT_MS = 60_000;
const DEFAULT_PAGE = 20;
const MAX_PAGE = 100;

const { slos: S, endpoints: E, usageRecords: U } = tables;

const target = (max: number) => z.number().positive().max(max).nullable();
const objective = z.number().gt(0, 'must be greater than 0').lt(1, 'must be less than 1');
const windowSeconds = z.number().int().min(MIN_WINDOW_SECONDS).max(MAX_WINDOW_SECONDS);
const name = z.string().max(200);

const createBody = z
  .object({
    endpoint: z.string().min(1).max(200).optional(),
    name: name.optional(),
    ttft_ms: target(MAX_TTFT_MS).optional(),
    tpot_ms: target(MAX_TPOT_MS).optional(),
    objective: objective.optional(),
    window_seconds: windowSeconds.optional(),
  })
  .strict();

const updateBody = z
  .object({
    name: name.optional(),
    ttft_ms: target(MAX_TTFT_MS).optional(),
    tpot_ms: target(MAX_TPOT_MS).optional(),
    objective: objective.optional(),
    window_seconds: windowSeconds.optional(),
  })
  .strict();

const pageQuery = z.object({
  limit: z.coerce.number().int().min(1).max(MAX_PAGE).default(DEFAULT_PAGE),
  after: z.string().min(1).max(100).optional(),
});

const ID = /^slo_[0-9a-f]{24}$/;

/**
 * An SLO column referenced from inside the lateral subqueries, qualified by
 * hand: Drizzle renders columns in a single-table select list unqualified,
 * and there an unqualified `ttft_ms` would mean usage_records' own column.
 */
const outer = (c: PgColumn) => sql`${sql.identifier(getTableName(S))}.${sql.identifier(c.name)}`;

/** Which SLOs a request may see: the project's, or only one endpoint's. */
export interface SloScope {
  projectId: string;
  /** The path's endpoint, or the endpoint an API key is bound to. */
  endpointId: string | null;
}

export interface TargetAttainment {
  met: number;
  total: number;
  /** met / total; null when no request in the window had the measure. */
  attainment: number | null;
  p50_ms: number | null;
  p99_ms: number | null;
}

export interface Attainment {
  window_start: number;
  window_end: number;
  requests: number;
  ttft: TargetAttainment | null;
  tpot: TargetAttainment | null;
  met_objective: boolean | null;
}

type Row = typeof S.$inferSelect;

interface Figures {
  requests: number;
  ttftMet: number;
  ttftTotal: number;
  ttftP50: number | null;
  ttftP99: number | null;
  tpotMet: number;
  tpotTotal: number;
  tpotP50: number | null;
  tpotP99: number | null;
}

const NO_TARGETS: SloTargets = Object.freeze({});

function noTarget(): never {
  throw new ServiceError('invalid_body', {
    message: "At least one of 'ttft_ms' and 'tpot_ms' must be a positive number.",
    param: 'ttft_ms',
  });
}

const ms = (v: unknown): number | null =>
  v === null || v === undefined ? null : Math.round(Number(v) * 1000) / 1000;

function section(
  goal: number | null,
  met: number,
  total: number,
  p50: number | null,
  p99: number | null,
): TargetAttainment | null {
  if (goal === null) return null;
  return {
    met,
    total,
    attainment: total > 0 ? met / total : null,
    p50_ms: total > 0 ? ms(p50) : null,
    p99_ms: total > 0 ? ms(p99) : null,
  };
}

export function attainmentOf(
  slo: { objective: number; windowSeconds: number; ttftMs: number | null; tpotMs: number | null },
  f: Figures,
  nowMs: number,
): Attainment {
  const ttft = section(slo.ttftMs, f.ttftMet, f.ttftTotal, f.ttftP50, f.ttftP99);
  const tpot = section(slo.tpotMs, f.tpotMet, f.tpotTotal, f.tpotP50, f.tpotP99);
  // Judged on the targets that had data; null when none had any.
  const judged = [ttft, tpot].filter((t): t is TargetAttainment => t !== null && t.total > 0);
  const end = Math.floor(nowMs / 1000);
  return {
    window_start: end - slo.windowSeconds,
    window_end: end,
    requests: f.requests,
    ttft,
    tpot,
    met_objective: judged.length === 0 ? null : judged.every((t) => t.attainment! >= slo.objective),
  };
}

export class SloService {
  private readonly cache: TtlCache<SloTargets>;

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly endpoints: EndpointRepository,
    private readonly bus: InvalidationBus,
    cacheTtlMs: number,
  ) {
    this.cache = new TtlCache<SloTargets>(clock, cacheTtlMs, 10_000);
    bus.on((m) => {
      if (m.kind !== 'endpoint') return;
      if (m.id === '*') this.cache.clear();
      else this.cache.delete(m.id);
    });
  }

  /** The tightest TTFT and TPOT targets among the endpoint's SLOs ({} when none). */
  targets(endpointId: string): SloTargets | Promise<SloTargets> {
    return this.cache.get(endpointId, () => this.loadTargets(endpointId));
  }

  private async loadTargets(endpointId: string): Promise<SloTargets> {
    const [row] = await this.db
      .select({
        ttft: sql<number | null>`min(${S.ttftMs})`,
        tpot: sql<number | null>`min(${S.tpotMs})`,
      })
      .from(S)
      .where(eq(S.endpointId, endpointId));
    if (!row || (row.ttft === null && row.tpot === null)) return NO_TARGETS;
    const t: SloTargets = {};
    if (row.ttft !== null) t.ttftMs = Number(row.ttft);
    if (row.tpot !== null) t.tpotMs = Number(row.tpot);
    return Object.freeze(t);
  }

  private changed(endpointId: string): Promise<void> {
    return this.bus.publish('endpoint', endpointId);
  }

  async create(scope: SloScope, raw: unknown) {
    const body = parseBody(createBody, raw);
    const ttft = body.ttft_ms ?? null;
    const tpot = body.tpot_ms ?? null;
    if (ttft === null && tpot === null) noTarget();
    const ref = body.endpoint ?? scope.endpointId;
    if (ref === null) {
      throw new ServiceError('invalid_body', {
        message: "Missing required parameter: 'endpoint'.",
        param: 'endpoint',
      });
    }
    const endpoint = await this.endpoints.get(scope.projectId, ref);
    if (!endpoint) {
      throw new ServiceError('endpoint_not_found', {
        message: `No endpoint '${ref}' in this project.`,
        param: 'endpoint',
      });
    }
    if (scope.endpointId !== null && endpoint.id !== scope.endpointId) {
      throw new ServiceError('invalid_body', {
        message: "Invalid 'endpoint': SLOs on this path (or for this key) belong to one endpoint.",
        param: 'endpoint',
      });
    }
    const now = new Date(this.clock.now());
    const id = externalId('slo');
    await this.db.transaction(async (tx) => {
      // Serialise creations per endpoint so the cap holds under concurrency.
      await tx.execute(sql`select id from ${E} where id = ${endpoint.id} for update`);
      const [count] = await tx
        .select({ n: sql<number>`count(*)::int` })
        .from(S)
        .where(eq(S.endpointId, endpoint.id));
      if (Number(count?.n ?? 0) >= MAX_SLOS_PER_ENDPOINT) {
        throw new ServiceError('slo_limit', {
          message: `An endpoint can have at most ${MAX_SLOS_PER_ENDPOINT} SLOs.`,
        });
      }
      await tx.insert(S).values({
        id: randomUUID(),
        externalId: id,
        projectId: scope.projectId,
        endpointId: endpoint.id,
        name: body.name ?? '',
        ttftMs: ttft,
        tpotMs: tpot,
        objective: body.objective ?? DEFAULT_OBJECTIVE,
        windowSeconds: body.window_seconds ?? DEFAULT_WINDOW_SECONDS,
        createdAt: now,
        updatedAt: now,
      });
    });
    await this.changed(endpoint.id);
    return this.get(scope, id);
  }

  async get(scope: SloScope, id: string) {
    const [r] = ID.test(id) ? await this.read(scope, eq(S.externalId, id), 1) : [];
    if (!r) throw new ServiceError('slo_not_found', { param: 'slo_id' });
    return r;
  }

  async list(scope: SloScope, query: unknown) {
    const q = parseBody(pageQuery, query ?? {});
    let cursor: SQL | undefined;
    if (q.after !== undefined) {
      const [c] = ID.test(q.after) ? await this.rows(scope, eq(S.externalId, q.after)) : [];
      if (!c) {
        throw new ServiceError('invalid_body', {
          message: `Unknown cursor '${q.after}'.`,
          param: 'after',
        });
      }
      cursor = or(lt(S.createdAt, c.createdAt), and(eq(S.createdAt, c.createdAt), lt(S.id, c.id)));
    }
    const data = await this.read(scope, cursor, q.limit + 1);
    return {
      object: 'list' as const,
      data: data.slice(0, q.limit),
      has_more: data.length > q.limit,
    };
  }

  async update(scope: SloScope, id: string, raw: unknown) {
    const [found] = ID.test(id) ? await this.rows(scope, eq(S.externalId, id)) : [];
    if (!found) throw new ServiceError('slo_not_found', { param: 'slo_id' });
    const body = parseBody(updateBody, raw);
    await this.db.transaction(async (tx) => {
      // Read again under a row lock: of two PATCHes at once, the second works from the
      // first's result, so neither writes back a field the other changed, and the SLO
      // cannot lose its last target to two PATCHes each clearing one.
      const [row] = await tx.select().from(S).where(eq(S.id, found.id)).for('update');
      if (!row) throw new ServiceError('slo_not_found', { param: 'slo_id' });
      const ttft = body.ttft_ms === undefined ? row.ttftMs : body.ttft_ms;
      const tpot = body.tpot_ms === undefined ? row.tpotMs : body.tpot_ms;
      if (ttft === null && tpot === null) noTarget();
      await tx
        .update(S)
        .set({
          ttftMs: ttft,
          tpotMs: tpot,
          ...(body.name !== undefined ? { name: body.name } : {}),
          ...(body.objective !== undefined ? { objective: body.objective } : {}),
          ...(body.window_seconds !== undefined ? { windowSeconds: body.window_seconds } : {}),
          updatedAt: new Date(this.clock.now()),
        })
        .where(eq(S.id, row.id));
    });
    await this.changed(found.endpointId);
    return this.get(scope, id);
  }

  async remove(scope: SloScope, id: string) {
    const [row] = ID.test(id) ? await this.rows(scope, eq(S.externalId, id)) : [];
    if (!row) throw new ServiceError('slo_not_found', { param: 'slo_id' });
    await this.db.delete(S).where(eq(S.id, row.id));
    await this.changed(row.endpointId);
    return { id, object: 'slo' as const, deleted: true };
  }

  private visible(scope: SloScope): SQL {
    return and(
      eq(S.projectId, scope.projectId),
      scope.endpointId === null ? undefined : eq(S.endpointId, scope.endpointId),
    )!;
  }

  /** SLO rows of live endpoints (an SLO of a deleted endpoint is gone with it). */
  private rows(scope: SloScope, where: SQL): Promise<Row[]> {
    return this.db
      .select({ slo: S })
      .from(S)
      .innerJoin(E, and(eq(E.id, S.endpointId), isNull(E.deletedAt)))
      .where(and(this.visible(scope), where))
      .limit(1)
      .then((rs) => rs.map((r) => r.slo));
  }

  /** Public records with attainment, newest first, in one statement. */
  private async read(scope: SloScope, where: SQL | undefined, limit: number) {
    const nowMs = this.clock.now();
    const end = new Date(nowMs).toISOString();
    const tpotExpr = sql`case when ${U.ttftMs} is not null and ${U.completionTokens} >= 2
      then (${U.durationMs} - ${U.ttftMs})::float8 / (${U.completionTokens} - 1) end`;
    const r = this.db
      .select({
        ttft: sql<number | null>`${U.ttftMs}::float8`.as('ttft'),
        tpot: sql<number | null>`${tpotExpr}`.as('tpot'),
      })
      .from(U)
      .where(
        and(
          sql`${U.endpointId} = ${outer(S.endpointId)}`,
          eq(U.status, 'completed'),
          sql`${U.createdAt} > ${end}::timestamptz - make_interval(secs => ${outer(S.windowSeconds)})`,
          sql`${U.createdAt} <= ${end}::timestamptz`,
        ),
      )
      .as('r');
    const a = this.db
      .select({
        requests: sql<number>`count(*)::int`.as('requests'),
        ttftTotal: sql<number>`count(${r.ttft})::int`.as('ttft_total'),
        ttftMet: sql<number>`(count(*) filter (where ${r.ttft} <= ${outer(S.ttftMs)}))::int`.as(
          'ttft_met',
        ),
        ttftP50: sql<number | null>`percentile_cont(0.5) within group (order by ${r.ttft})`.as(
          'ttft_p50',
        ),
        ttftP99: sql<number | null>`percentile_cont(0.99) within group (order by ${r.ttft})`.as(
          'ttft_p99',
        ),
        tpotTotal: sql<number>`count(${r.tpot})::int`.as('tpot_total'),
        tpotMet: sql<number>`(count(*) filter (where ${r.tpot} <= ${outer(S.tpotMs)}))::int`.as(
          'tpot_met',
        ),
        tpotP50: sql<number | null>`percentile_cont(0.5) within group (order by ${r.tpot})`.as(
          'tpot_p50',
        ),
        tpotP99: sql<number | null>`percentile_cont(0.99) within group (order by ${r.tpot})`.as(
          'tpot_p99',
        ),
      })
      .from(r)
      .as('a');
    const rows = await this.db
      .select({
        slo: S,
        slug: E.slug,
        requests: a.requests,
        ttftTotal: a.ttftTotal,
        ttftMet: a.ttftMet,
        ttftP50: a.ttftP50,
        ttftP99: a.ttftP99,
        tpotTotal: a.tpotTotal,
        tpotMet: a.tpotMet,
        tpotP50: a.tpotP50,
        tpotP99: a.tpotP99,
      })
      .from(S)
      .innerJoin(E, and(eq(E.id, S.endpointId), isNull(E.deletedAt)))
      .crossJoinLateral(a)
      .where(and(this.visible(scope), where))
      .orderBy(desc(S.createdAt), desc(S.id))
      .limit(limit);
    return rows.map((x) => {
      const s = x.slo;
      const f: Figures = {
        requests: Number(x.requests),
        ttftMet: Number(x.ttftMet),
        ttftTotal: Number(x.ttftTotal),
        ttftP50: x.ttftP50 === null ? null : Number(x.ttftP50),
        ttftP99: x.ttftP99 === null ? null : Number(x.ttftP99),
        tpotMet: Number(x.tpotMet),
        tpotTotal: Number(x.tpotTotal),
        tpotP50: x.tpotP50 === null ? null : Number(x.tpotP50),
        tpotP99: x.tpotP99 === null ? null : Number(x.tpotP99),
      };
      return {
        id: s.externalId,
        object: 'slo' as const,
        endpoint_id: s.endpointId,
        endpoint: x.slug,
        name: s.name,
        ttft_ms: s.ttftMs,
        tpot_ms: s.tpotMs,
        objective: s.objective,
        window_seconds: s.windowSeconds,
        created_at: unix(s.createdAt),
        updated_at: unix(s.updatedAt),
        attainment: attainmentOf(s, f, nowMs),
      };
    });
  }
}
