// Runs every *.test.ts under test/ and src/, and the benchmark's own *.test.mjs under
// bench/, with node's test runner. The TypeScript is compiled first into a mirror of
// the checkout (scripts/compile-tests.mjs) and the tests run as plain JavaScript;
// SWY_TEST_TSX=1 runs the sources through tsx's loader instead.
// Node 20's runner has no glob support, so the file list is built here.
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { compiledPath, compileTests, removeMirror } from './compile-tests.mjs';

function collect(dir, out) {
  for (const name of readdirSync(dir)) {
    if (name === 'node_modules') continue;
    const p = join(dir, name);
    if (statSync(p).isDirectory()) collect(p, out);
    else if (name.endsWith('.test.ts') || name.endsWith('.test.mjs')) out.push(p);
  }
  return out;
}

const filter = process.argv.slice(2);
let files = [...collect('test', []), ...collect('src', []), ...collect('bench', [])].sort();
if (filter.length) files = files.filter((f) => filter.some((x) => f.includes(x)));
// SWY_TEST_EXCLUDE=a,b skips files whose path contains any of them (local runs).
const exclude = (process.env.SWY_TEST_EXCLUDE ?? '').split(',').filter(Boolean);
if (exclude.length) files = files.filter((f) => !exclude.some((x) => f.includes(x)));
// Files that spawn real processes first: they are the longest (up to two minutes of
// waiting for servers to start and stop) and leave CPU free while they wait, so the
// two runner slots end together instead of one finishing such a file alone at the end.
// (test/support/cluster.ts starts them through its serve/spawnServe/simWorker/spawn.)
const spawns = (f) =>
  /spawnSwitchyard\(|spawn\(process\.execPath|\.(serve|spawnServe|simWorker|spawn)\(/.test(
    readFileSync(f, 'utf8'),
  );
files = [...files.filter(spawns), ...files.filter((f) => !spawns(f))];
const viaTsx = process.env.SWY_TEST_TSX === '1';
const mirror = viaTsx ? null : await compileTests();
const run = (f) => (mirror && f.endsWith('.ts') ? compiledPath(mirror, f) : f);
const loader = viaTsx ? ['--import', 'tsx'] : ['--enable-source-maps'];
// The migrated PGlite database the tests' databases start from (test/support/pglite-template.ts),
// made once here so that every test process, and every binary they spawn, finds it.
const template = spawnSync(
  process.execPath,
  [
    ...loader,
    '--input-type=module',
    '-e',
    `import(${JSON.stringify(pathToFileURL(run('test/support/pglite-template.ts')).href)}).then((m) => m.pgliteTemplate())`,
  ],
  { stdio: 'inherit' },
);
if (template.status !== 0) console.error('PGlite template not made; each test makes its own');
const r = spawnSync(
  process.execPath,
  [...loader, '--test', '--test-concurrency=2', '--test-reporter=spec', ...files.map(run)],
  // A test file that never exits (a leaked handle after a failure) must fail the
  // run, not hang CI: the whole suite gets 20 minutes.
  { stdio: 'inherit', env: { ...process.env, NODE_ENV: 'test' }, timeout: 20 * 60 * 1000 },
);
if (r.error) console.error(`test run aborted: ${r.error.message}`);
if (mirror) removeMirror(mirror);
process.exit(r.status ?? 1);
