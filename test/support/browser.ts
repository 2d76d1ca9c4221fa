/**
 * A real browser for end-to-end tests: Debian's Chromium (/usr/bin/chromium,
 * package `chromium`; .ci/run installs it) driven by playwright-core, headless,
 * with the flags this machine needs (docs: /work/.library/env/machines/node-svc.md):
 * without the background-networking ones Chromium keeps dialling Google's hosts,
 * and the closed network refuses every one of those connections.
 *
 * Each launch gets a new, empty user-data-dir in the temporary directory, made
 * by Playwright (it refuses a `--user-data-dir` argument of ours) and removed by
 * it on close; `close()` here removes it too, should Chromium have died first.
 *
 * A missing browser skips the browser tests on a developer's machine, with the
 * reason; in CI (CI set) it fails them: a browser test that quietly stops running
 * is worse than none.
 */
import { existsSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type Browser, type BrowserContext, type Cookie } from 'playwright-core';

/** Debian's Chromium; SWY_CHROMIUM names another build (a developer's machine). */
export const CHROMIUM = process.env.SWY_CHROMIUM || '/usr/bin/chromium';

export const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

const PROFILE_PREFIX = 'playwright_chromiumdev_profile-';

/** True in CI (.ci/run exports CI=true). */
export function onCi(): boolean {
  const ci = process.env.CI;
  return ci !== undefined && ci !== '' && ci !== '0' && ci.toLowerCase() !== 'false';
}

/** Why no browser test can run here, or null when Chromium is installed. */
export function chromiumMissing(): string | null {
  return existsSync(CHROMIUM)
    ? null
    : `Chromium is not installed (${CHROMIUM} is absent): apt-get install -y chromium`;
}

/**
 * The `skip` option for a suite of browser tests: the reason locally when
 * Chromium is missing; false in CI, where `launchBrowser()` then fails.
 */
export function skipWithoutBrowser(): string | false {
  const missing = chromiumMissing();
  if (!missing || onCi()) return false;
  return `${missing} (skipped locally; CI fails instead)`;
}

function profiles(): Set<string> {
  try {
    return new Set(readdirSync(tmpdir()).filter((n) => n.startsWith(PROFILE_PREFIX)));
  } catch {
    return new Set();
  }
}

/** Headless Chromium; `close()` also removes its temporary user-data-dir. */
export async function launchBrowser(): Promise<Browser> {
  const missing = chromiumMissing();
  if (missing) throw new Error(missing);
  const before = profiles();
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    timeout: 30_000,
  });
  // Ours is the one profile that appeared during the launch; with more (another
  // process launching at the same time) none is touched here.
  const added = [...profiles()].filter((n) => !before.has(n));
  const mine = added.length === 1 ? [join(tmpdir(), added[0]!)] : [];
  const close = browser.close.bind(browser);
  browser.close = async (options?: { reason?: string }) => {
    try {
      await close(options);
    } finally {
      for (const dir of mine) rmSync(dir, { recursive: true, force: true });
    }
  };
  return browser;
}

/** A cookie of the context by name; fails the test when absent. */
export async function cookieNamed(context: BrowserContext, name: string): Promise<Cookie> {
  const all = await context.cookies();
  const c = all.find((x) => x.name === name);
  if (!c) {
    throw new Error(`no cookie ${name}; the browser has: ${all.map((x) => x.name).join(', ')}`);
  }
  return c;
}
