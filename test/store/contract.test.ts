/**
 * The storage contract, run on every configured driver: PGlite always, and
 * PostgreSQL whenever TEST_DATABASE_URL is set (required in CI).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { sql } from 'drizzle-orm';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { isUniqueViolation, migrationsFolder, openStore, tables } from '../../src/store/index.js';
import { drivers, freshDatabase } from '../support/harness.js';

const journal = JSON.parse(
  readFileSync(join(migrationsFolder, 'meta', '_journal.json'), 'utf8'),
) as {
  entries: unknown[];
};
const MIGRATIONS = journal.entries.length;

if (process.env.CI === 'true' && !process.env.TEST_DATABASE_URL) {
  throw new Error('CI=true but TEST_DATABASE_URL is unset: the PostgreSQL path must run in CI');
}

/**
 * PGlite as the router runs it, in its worker thread (the rest of the suite opens it
 * in-process, test/support/harness.ts).
 */
const THREAD = { thread: true };

for (const driver of drivers()) {
  describe(`storage contract on ${driver}`, () => {
    it('applies every migration and seeds the four tiers as data', async () => {
      const db = await freshDatabase(driver, THREAD);
      try {
        assert.equal(db.store.driver, driver);
        assert.equal(await db.store.ping(), true);
        const tiers = await db.store.db.select().from(tables.tiers);
        const byId = Object.fromEntries(tiers.map((t) => [t.id, t]));
        assert.deepEqual(Object.keys(byId).sort(), ['cpu', 'free', 'gpu', 'self_hosted']);
        assert.deepEqual(
          [
            byId.free!.requestsPerMinute,
            byId.free!.burst,
            byId.free!.requestDeadlineMs,
            byId.free!.idleTimeoutMs,
          ],
          [64, 32, 30_000, 120_000],
        );
        assert.deepEqual(
          [
            byId.cpu!.requestsPerMinute,
            byId.cpu!.burst,
            byId.cpu!.requestDeadlineMs,
            byId.cpu!.idleTimeoutMs,
          ],
          [128, 64, 300_000, 600_000],
        );
        assert.deepEqual(
          [
            byId.gpu!.requestsPerMinute,
            byId.gpu!.burst,
            byId.gpu!.requestDeadlineMs,
            byId.gpu!.idleTimeoutMs,
          ],
          [256, 128, 300_000, 600_000],
        );
        assert.deepEqual(
          [
            byId.self_hosted!.requestsPerMinute,
            byId.self_hosted!.burst,
            byId.self_hosted!.requestDeadlineMs,
            byId.self_hosted!.idleTimeoutMs,
          ],
          [null, null, 1_800_000, 3_600_000],
        );
      } finally {
        await db.drop();
      }
    });

    it('records applied migrations and re-running them is a no-op', async () => {
      const db = await freshDatabase(driver, THREAD);
      try {
        const r = await db.store.db.execute(
          sql`select count(*)::int as n from drizzle.__drizzle_migrations`,
        );
        const rows = (r as unknown as { rows: Array<{ n: number }> }).rows;
        assert.ok(MIGRATIONS >= 3);
        assert.equal(rows[0]!.n, MIGRATIONS);
        if (driver === 'postgres') {
          // A second instance opening the same database migrates nothing new.
          const again = await openStore({ dataDir: '', databaseUrl: db.url, poolSize: 2 });
          const r2 = await again.db.execute(
            sql`select count(*)::int as n from drizzle.__drizzle_migrations`,
          );
          assert.equal((r2 as unknown as { rows: Array<{ n: number }> }).rows[0]!.n, MIGRATIONS);
          await again.close();
        }
      } finally {
        await db.drop();
      }
    });

    it('enforces the schema: unique slugs, endpoint statuses, tier references', async () => {
      const db = await freshDatabase(driver, THREAD);
      const d = db.store.db;
      try {
        const now = new Date();
        const pid = crypto.randomUUID();
        await d.insert(tables.projects).values({
          id: pid,
          externalId: 'proj_a',
          slug: 'a',
          name: 'A',
          createdAt: now,
        });
        await assert.rejects(
          d.insert(tables.projects).values({
            id: crypto.randomUUID(),
            externalId: 'proj_b',
            slug: 'a',
            name: 'B',
            createdAt: now,
          }),
        );
        const mid = crypto.randomUUID();
        await d.insert(tables.models).values({
          id: mid,
          name: 'm',
          contextWindow: 1024,
          ownedBy: 'x',
          createdAt: now,
        });
        const endpoint = (status: string, tierId = 'cpu', slug = status) =>
          d.insert(tables.endpoints).values({
            id: crypto.randomUUID(),
            projectId: pid,
            slug,
            name: slug,
            modelId: mid,
            tierId,
            status,
            maxRequestsPerMinute: 1,
            maxTokensPerMinute: 1,
            createdAt: now,
          });
        for (const s of ['active', 'provisioning', 'suspended', 'error']) await endpoint(s);
        await assert.rejects(endpoint('deleted'));
        await assert.rejects(endpoint('active', 'platinum', 'x'));
        await assert.rejects(endpoint('active', 'cpu', 'active')); // duplicate live slug
      } finally {
        await db.drop();
      }
    });

    it('migration 0015 keeps the oldest of duplicated custom domains and workers, then forbids them', async () => {
      const db = await freshDatabase(driver, THREAD);
      const d = db.store.db;
      try {
        // The state before 0015: its indexes absent, duplicates let in by racing requests.
        await d.execute(sql`drop index endpoints_custom_domain_key`);
        await d.execute(sql`drop index workers_source_model_tier_url_key`);
        const pid = crypto.randomUUID();
        const mid = crypto.randomUUID();
        const t = (s: number) => new Date(Date.UTC(2026, 10, 1, 0, 0, s));
        await d
          .insert(tables.projects)
          .values({ id: pid, externalId: 'proj_m', slug: 'm', name: 'M', createdAt: t(0) });
        await d
          .insert(tables.models)
          .values({ id: mid, name: 'm', contextWindow: 1024, ownedBy: 'x', createdAt: t(0) });
        const ep = (slug: string, domain: string | null, at: number, deleted = false) => ({
          id: crypto.randomUUID(),
          projectId: pid,
          slug,
          name: slug,
          modelId: mid,
          tierId: 'cpu',
          customDomain: domain,
          maxRequestsPerMinute: 1,
          maxTokensPerMinute: 1,
          createdAt: t(at),
          deletedAt: deleted ? t(at) : null,
        });
        await d
          .insert(tables.endpoints)
          .values([
            ep('gone', 'api.example.com', 1, true),
            ep('first', 'api.example.com', 2),
            ep('second', 'API.example.com', 3),
            ep('other', 'other.example.com', 4),
          ]);
        const w = (id: string, source: string, url: string, at: number) => ({
          id,
          modelId: mid,
          tierId: 'cpu',
          url,
          source,
          createdAt: t(at),
        });
        await d
          .insert(tables.workers)
          .values([
            w('s1', 'static', 'http://a/v1', 1),
            w('s2', 'static', 'http://a/v1', 2),
            w('r1', 'registered', 'http://a/v1', 3),
            w('r2', 'registered', 'http://a/v1', 4),
            w('e1', 'embedded', 'http://e/v1', 5),
            w('e2', 'embedded', 'http://e/v1', 6),
          ]);
        const file = readdirSync(migrationsFolder).find((f) => f.startsWith('0015_'))!;
        for (const statement of readFileSync(join(migrationsFolder, file), 'utf8').split(
          '--> statement-breakpoint',
        )) {
          await d.execute(sql.raw(statement));
        }
        const domains = await d
          .select({ slug: tables.endpoints.slug, domain: tables.endpoints.customDomain })
          .from(tables.endpoints);
        assert.deepEqual(Object.fromEntries(domains.map((r) => [r.slug, r.domain])), {
          gone: 'api.example.com',
          first: 'api.example.com',
          second: null,
          other: 'other.example.com',
        });
        const workers = await d.select({ id: tables.workers.id }).from(tables.workers);
        assert.deepEqual(workers.map((r) => r.id).sort(), ['e1', 'e2', 'r1', 's1']);
        await assert.rejects(
          d.insert(tables.endpoints).values(ep('third', 'Api.Example.COM', 7)),
          (err: unknown) => isUniqueViolation(err, 'endpoints_custom_domain_key'),
        );
        await assert.rejects(
          d.insert(tables.workers).values(w('s3', 'static', 'http://a/v1', 8)),
          (err: unknown) => isUniqueViolation(err, 'workers_source_model_tier_url_key'),
        );
      } finally {
        await db.drop();
      }
    });
  });
}
