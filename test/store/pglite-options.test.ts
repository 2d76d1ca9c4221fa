/**
 * How the embedded database is opened: SWITCHYARD_PGLITE_SHARED_BUFFERS reaches
 * PostgreSQL in the router's thread and in-process alike, and a database started
 * from a dump holds the dump's data (the dump is handed to PGlite as bytes, not a
 * Blob: store/pglite-options.ts).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { sql } from 'drizzle-orm';
import { ConfigError, loadConfig } from '../../src/config/index.js';
import { openStore, tables } from '../../src/store/index.js';
import { pgliteTemplate } from '../support/pglite-template.js';

async function sharedBuffers(opts: { thread: boolean; size?: string }): Promise<string> {
  const store = await openStore({
    dataDir: 'memory://',
    pgliteThread: opts.thread,
    pgliteFrom: await pgliteTemplate(),
    pgliteSharedBuffers: opts.size,
  });
  try {
    const rows = (await store.db.execute(sql`show shared_buffers`)) as unknown as
      { rows: { shared_buffers: string }[] } | { shared_buffers: string }[];
    const list = Array.isArray(rows) ? rows : rows.rows;
    // The dump's rows are there: the seeded tiers.
    assert.equal((await store.db.select().from(tables.tiers)).length, 4);
    return list[0]!.shared_buffers;
  } finally {
    await store.close();
  }
}

describe('opening the embedded database', () => {
  it('passes shared_buffers to PostgreSQL, in its thread and in-process; 128MB when unset', async () => {
    assert.equal(await sharedBuffers({ thread: true, size: '12MB' }), '12MB');
    assert.equal(await sharedBuffers({ thread: false, size: '512kB' }), '512kB');
    assert.equal(await sharedBuffers({ thread: false }), '128MB');
  });

  it('SWITCHYARD_PGLITE_SHARED_BUFFERS takes a PostgreSQL size of at least 128kB', () => {
    assert.equal(loadConfig({}).pgliteSharedBuffers, undefined);
    assert.equal(
      loadConfig({ SWITCHYARD_PGLITE_SHARED_BUFFERS: '16MB' }).pgliteSharedBuffers,
      '16MB',
    );
    assert.equal(
      loadConfig({ SWITCHYARD_PGLITE_SHARED_BUFFERS: '1GB' }).pgliteSharedBuffers,
      '1GB',
    );
    for (const bad of ['16', '16mb', '16 MB', '64kB', '0MB', '-1MB', '1TB', '1.5GB']) {
      assert.throws(
        () => loadConfig({ SWITCHYARD_PGLITE_SHARED_BUFFERS: bad }),
        (err: unknown) =>
          err instanceof ConfigError &&
          /SWITCHYARD_PGLITE_SHARED_BUFFERS must be/.test(err.message),
        bad,
      );
    }
  });
});
