/** Projects: the tenants. External id `proj_<hex>`, a unique slug, credit. */
import { randomUUID } from 'node:crypto';
import { and, asc, eq, isNull, or, sql } from 'drizzle-orm';
import { externalId } from '../runtime/ids.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';

const { projects } = tables;

export interface Project {
  id: string;
  externalId: string;
  slug: string;
  name: string;
  creditCents: number;
  spentMicrocents: number;
  billingStatus: string;
  createdAt: Date;
}

export const MICROCENTS_PER_CENT = 1_000_000;

/**
 * The most credit a project holds: balances are reckoned in micro-cents, and credit ×
 * 10^6 stays an exact integer up to here (about $90 million; no top-up goes past it).
 */
export const MAX_CREDIT_CENTS = Math.floor(Number.MAX_SAFE_INTEGER / MICROCENTS_PER_CENT);

/** Credit left in micro-cents; zero or less means `insufficient_quota`. */
export function remainingMicrocents(p: { creditCents: number; spentMicrocents: number }): number {
  return p.creditCents * MICROCENTS_PER_CENT - p.spentMicrocents;
}

export interface PublicProject {
  id: string;
  object: 'project';
  uuid: string;
  slug: string;
  name: string;
  credit_cents: number;
  spent_cents: number;
  remaining_credit_cents: number;
  billing_status: string;
  created: number;
}

export function publicProject(p: Project): PublicProject {
  return {
    id: p.externalId,
    object: 'project',
    uuid: p.id,
    slug: p.slug,
    name: p.name,
    credit_cents: p.creditCents,
    spent_cents: p.spentMicrocents / MICROCENTS_PER_CENT,
    remaining_credit_cents: remainingMicrocents(p) / MICROCENTS_PER_CENT,
    billing_status: p.billingStatus,
    created: Math.floor(p.createdAt.getTime() / 1000),
  };
}

const columns = {
  id: projects.id,
  externalId: projects.externalId,
  slug: projects.slug,
  name: projects.name,
  creditCents: projects.creditCents,
  spentMicrocents: projects.spentMicrocents,
  billingStatus: projects.billingStatus,
  createdAt: projects.createdAt,
};

export class ProjectRepository {
  constructor(private readonly db: Db) {}

  async create(
    input: { slug: string; name: string; creditCents?: number },
    now: Date,
  ): Promise<Project> {
    const row = {
      id: randomUUID(),
      externalId: externalId('proj', 10),
      slug: input.slug,
      name: input.name,
      creditCents: input.creditCents ?? 0,
      spentMicrocents: 0,
      billingStatus: 'active',
      createdAt: now,
    };
    await this.db.insert(projects).values(row);
    return row;
  }

  /** Resolves a project by its external id (`proj_…`) or its slug. */
  async find(ref: string): Promise<Project | null> {
    const rows = await this.db
      .select(columns)
      .from(projects)
      .where(
        and(isNull(projects.deletedAt), or(eq(projects.externalId, ref), eq(projects.slug, ref))),
      )
      .limit(1);
    return rows[0] ?? null;
  }

  async findByExternalId(externalIdValue: string): Promise<Project | null> {
    const rows = await this.db
      .select(columns)
      .from(projects)
      .where(and(isNull(projects.deletedAt), eq(projects.externalId, externalIdValue)))
      .limit(1);
    return rows[0] ?? null;
  }

  async getById(id: string): Promise<Project | null> {
    const rows = await this.db.select(columns).from(projects).where(eq(projects.id, id)).limit(1);
    return rows[0] ?? null;
  }

  /**
   * Changes a project; `over_limit` (and nothing changed) when `addCreditCents` would
   * take the credit past MAX_CREDIT_CENTS, judged in the same statement as the add.
   */
  async update(
    id: string,
    patch: {
      name?: string;
      creditCents?: number;
      addCreditCents?: number;
      billingStatus?: 'active' | 'delinquent';
    },
  ): Promise<Project | null | 'over_limit'> {
    const set: Record<string, unknown> = {};
    if (patch.name !== undefined) set.name = patch.name;
    if (patch.creditCents !== undefined) set.creditCents = patch.creditCents;
    const add = patch.addCreditCents;
    if (add !== undefined) set.creditCents = sql`${projects.creditCents} + ${add}`;
    if (patch.billingStatus !== undefined) set.billingStatus = patch.billingStatus;
    if (Object.keys(set).length > 0) {
      const rows = await this.db
        .update(projects)
        .set(set)
        .where(
          and(
            eq(projects.id, id),
            add !== undefined
              ? sql`${projects.creditCents} <= ${MAX_CREDIT_CENTS - add}`
              : undefined,
          ),
        )
        .returning({ id: projects.id });
      if (rows.length === 0 && add !== undefined && (await this.getById(id))) return 'over_limit';
    }
    return this.getById(id);
  }

  async list(): Promise<Project[]> {
    return this.db
      .select(columns)
      .from(projects)
      .where(isNull(projects.deletedAt))
      .orderBy(asc(projects.createdAt), asc(projects.id));
  }
}
