/**
 * A migrated PGlite data directory that test databases start from: creating
 * PGlite's empty cluster is most of the cost of opening one (see
 * OpenStoreOptions.pgliteFrom), and the suite opens hundreds, in-process and in
 * spawned `switchyard serve` processes (SWITCHYARD_PGLITE_TEMPLATE). Made once per
 * set of migrations and PGlite version, kept in `.tmp/` (git-ignored) and shared by
 * the test processes: scripts/run-tests.mjs makes it before the tests start, and a
 * process that finds none makes it and renames it into place.
 */
import { createHash } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { PGlite } from '@electric-sql/pglite';
import { migrationsFolder, openStore } from '../../src/store/index.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Where the template for the current migrations and PGlite version lives (it may not exist). */
export function pgliteTemplatePath(): string {
  const h = createHash('sha256');
  const pkg = JSON.parse(
    readFileSync(join(root, 'node_modules', '@electric-sql', 'pglite', 'package.json'), 'utf8'),
  ) as { version: string };
  h.update(pkg.version);
  const files = [
    ...readdirSync(migrationsFolder).filter((f) => f.endsWith('.sql')),
    'meta/_journal.json',
  ].sort();
  for (const f of files) h.update(f).update(readFileSync(join(migrationsFolder, f)));
  return join(root, '.tmp', `pglite-template-${h.digest('hex').slice(0, 16)}.tar`);
}

/**
 * The test databases' `shared_buffers` (SWITCHYARD_PGLITE_SHARED_BUFFERS): PostgreSQL's
 * default 128MB buffer pool is initialised at every open, about 0.4 s of CPU each
 * on 2 cores, and a test database holds a few hundred kilobytes.
 */
export const TEST_PGLITE_SHARED_BUFFERS = '8MB';

let made: Promise<Uint8Array> | undefined;

/** The template's bytes, made first if needed. */
export function pgliteTemplate(): Promise<Uint8Array> {
  made ??= (async () => {
    const file = pgliteTemplatePath();
    // A Buffer is a Uint8Array already: `new Uint8Array(buffer)` would copy its 40 MB.
    if (existsSync(file)) return readFileSync(file);
    const store = await openStore({ dataDir: 'memory://', pgliteThread: false });
    const client = (store.db as unknown as { $client: PGlite }).$client;
    const bytes = new Uint8Array(await (await client.dumpDataDir('none')).arrayBuffer());
    await store.close();
    mkdirSync(dirname(file), { recursive: true });
    const tmp = `${file}.${process.pid}`;
    writeFileSync(tmp, bytes);
    renameSync(tmp, file);
    return bytes;
  })();
  return made;
}
