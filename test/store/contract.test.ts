/**
 * The storage contract, run on every configured driver: PGlite always, and
 * PostgreSQL whenever TEST_DATABASE_URL is set (required in CI).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { sql } from 'drizzle-orm';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { migrationsFolder, openStore, tables } from '../../src/store/index.js';
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
  });
}
