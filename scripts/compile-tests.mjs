// Compiles src/ and test/ for the test run, so that the test processes load plain
// JavaScript instead of going through tsx's loader, which costs each of the ~140 test
// processes about a second of CPU (module resolution and loading through the loader
// thread) before the first test starts.
//
// The output is a mirror of the checkout, `<root>/.tmp-tests-<pid>/`, one level below
// the root like src/ and test/ are, so every path a module computes from its own
// location (`drizzle/`, `bin/`, fixtures, the PGlite template in `.tmp/`) lands on the
// same file: each .ts file becomes a .js file beside a symlink to its source (tests
// that start a child with `--import tsx` on a .ts path still find it), every other
// file of src/ and test/ is a symlink, and every other top-level entry of the checkout
// (node_modules, drizzle, bin, dist, package.json, ...) is a symlink too.
//
// esbuild does only the type stripping (no bundling, no type check: `npm test` runs
// tsc first); `verbatimModuleSyntax` keeps every type-only import marked, so nothing
// depends on type information.
import { build } from 'esbuild';
import { mkdirSync, readdirSync, rmSync, statSync, symlinkSync } from 'node:fs';
import { join, relative } from 'node:path';

const PREFIX = '.tmp-tests-';

/** Removes mirrors left by runs whose process is gone (a killed run cannot clean up). */
function removeStale(root) {
  for (const name of readdirSync(root)) {
    if (!name.startsWith(PREFIX)) continue;
    const pid = Number(name.slice(PREFIX.length));
    let alive = false;
    try {
      process.kill(pid, 0);
      alive = true;
    } catch (err) {
      alive = err.code === 'EPERM';
    }
    if (!alive || pid === process.pid) rmSync(join(root, name), { recursive: true, force: true });
  }
}

/** Builds the mirror and returns its directory. `remove()` deletes it. */
export async function compileTests(root = process.cwd()) {
  removeStale(root);
  // The PGlite template's directory must exist before it is linked.
  mkdirSync(join(root, '.tmp'), { recursive: true });
  const out = join(root, `${PREFIX}${process.pid}`);
  mkdirSync(out);
  const sources = [];
  const mirror = (dir) => {
    for (const name of readdirSync(dir)) {
      if (name === 'node_modules') continue;
      const path = join(dir, name);
      const dest = join(out, relative(root, path));
      if (statSync(path).isDirectory()) {
        mkdirSync(dest);
        mirror(path);
        continue;
      }
      symlinkSync(path, dest);
      if (name.endsWith('.ts') && !name.endsWith('.d.ts')) sources.push(path);
    }
  };
  for (const name of readdirSync(root)) {
    if (name === '.git' || name.startsWith(PREFIX)) continue;
    const path = join(root, name);
    if (name === 'src' || name === 'test') {
      mkdirSync(join(out, name));
      mirror(path);
    } else {
      symlinkSync(path, join(out, name));
    }
  }
  await build({
    entryPoints: sources,
    outdir: out,
    outbase: root,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    sourcemap: 'inline',
    logLevel: 'warning',
  });
  return out;
}

/** Where the mirror puts the compiled form of a source path relative to the root. */
export function compiledPath(out, path) {
  return join(out, path.replace(/\.ts$/, '.js'));
}

export function removeMirror(out) {
  rmSync(out, { recursive: true, force: true });
}
