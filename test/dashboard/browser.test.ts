/**
 * The dashboard in a real browser (headless Chromium through playwright-core,
 * test/support/browser.ts) against the router in-process, the way a user goes:
 * sign in, open a project, create an API key (and use it over plain HTTP), turn
 * on two-factor authentication, sign in again with it, and the protections a
 * browser enforces: CSRF, Content-Security-Policy, X-Frame-Options and the
 * session cookie's flags as Chromium stored them.
 *
 * Pages are opened on http://localhost:<port>: the cookies are Secure, and
 * Chromium keeps Secure cookies over plain http on localhost only.
 *
 * The server's clock is the harness's FakeClock, which stands still: TOTP codes
 * are computed at `s.clock.now()`, and the clock is moved on a 30 s step between
 * two codes (a code is usable once per step).
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import type { Browser, BrowserContext, Page, Response } from 'playwright-core';
import { totpCode } from '../../src/dashboard/totp.js';
import { cookieNamed, launchBrowser, skipWithoutBrowser } from '../support/browser.js';
import { http, seedProject, startTestServer, type TestServer } from '../support/harness.js';

const PASSWORD = 'a long browser password';
const EMAIL = 'bea@example.com';
const STEP_MS = 30_000;

/** Navigates and returns the document's response (never null for a page load). */
async function open(page: Page, url: string): Promise<Response> {
  const res = await page.goto(url);
  assert.ok(res, `no response for ${url}`);
  return res;
}

/** The text of a form's `.reveal` element once the script shows it. */
async function revealed(page: Page, form: string): Promise<string> {
  const reveal = page.locator(`${form} .reveal`);
  await reveal.waitFor({ state: 'visible' });
  return reveal.innerText();
}

/** The error a form shows once the script shows it. */
async function formError(page: Page, form: string): Promise<string> {
  const error = page.locator(`${form} .error`);
  await error.waitFor({ state: 'visible' });
  return error.innerText();
}

/** Fills the sign-in form and sends it; resolves once on the next page. */
async function signIn(page: Page, base: string, next: RegExp, email = EMAIL): Promise<void> {
  await open(page, `${base}/login`);
  await page.fill('#login input[name="email"]', email);
  await page.fill('#login input[name="password"]', PASSWORD);
  await page.click('#login button[type="submit"]');
  await page.waitForURL(next);
}

async function signOut(page: Page): Promise<void> {
  await page.click('header form[action="/logout"] button');
  await page.waitForURL(/\/login$/);
}

describe('dashboard in a real browser (Chromium)', { skip: skipWithoutBrowser() }, () => {
  let s: TestServer;
  let browser: Browser | undefined;
  let context: BrowserContext;
  let page: Page;
  let base: string;
  let project: Awaited<ReturnType<typeof seedProject>>;
  /** What Chromium reports that a Content-Security-Policy blocked, and script errors. */
  const problems: string[] = [];

  /** A user with a password, owner of the seeded project. */
  async function member(name: string, email: string): Promise<void> {
    const u = await s.admin('POST', '/users', { name, email, password: PASSWORD });
    assert.equal(u.status, 201, u.text);
    assert.equal(u.body.password_set, true);
    const m = await s.admin('POST', `/projects/${project.projectSlug}/members`, {
      user_id: u.body.id,
      role: 'owner',
    });
    assert.equal(m.status, 201, m.text);
  }

  before(async () => {
    s = await startTestServer();
    base = `http://localhost:${new URL(s.url).port}`;
    project = await seedProject(s);
    await member('Bea', EMAIL);

    browser = await launchBrowser();
    context = await browser.newContext();
    context.setDefaultTimeout(10_000);
    page = await context.newPage();
    page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
    page.on('console', (msg) => {
      if (/Content Security Policy|Refused to/i.test(msg.text())) problems.push(msg.text());
    });
  });

  after(async () => {
    await browser?.close();
    await s?.close();
  });

  it('signs in, creates a key, turns on 2FA and signs in with it; CSRF, CSP and cookies hold', async () => {
    // a) Sign in: a wrong password is shown in the page, the right one leads to the projects.
    const login = await open(page, `${base}/login`);
    assert.equal(login.status(), 200);
    await page.fill('#login input[name="email"]', EMAIL);
    await page.fill('#login input[name="password"]', 'not the password at all');
    await page.click('#login button[type="submit"]');
    assert.equal(await formError(page, '#login'), 'The e-mail address or password is wrong.');
    await page.fill('#login input[name="password"]', PASSWORD);
    await page.click('#login button[type="submit"]');
    await page.waitForURL(/\/dashboard$/);
    assert.equal(await page.locator('h1').innerText(), 'Projects');
    const link = page.getByRole('link', { name: `Project ${project.projectSlug}` });
    await link.click();
    await page.waitForURL(new RegExp(`/dashboard/projects/${project.projectId}$`));
    assert.equal(await page.locator('h1').innerText(), `Project ${project.projectSlug}`);
    assert.match(await page.locator('main').innerText(), /your role: owner/);

    // b) A new API key, revealed once, works against the API over plain HTTP.
    await page.fill('#new-key input[name="name"]', 'from-the-browser');
    await page.click('#new-key button[type="submit"]');
    const keyText = await revealed(page, '#new-key');
    const key = /shown once\): (\S+)/.exec(keyText)?.[1];
    assert.ok(key && key !== 'undefined', `no key in: ${keyText}`);
    assert.ok(await page.locator('#new-key button[type="submit"]').isDisabled());
    const models = await http('GET', `${s.url}/${project.projectId}/v1/models`, {
      auth: `Bearer ${key}`,
    });
    assert.equal(models.status, 200, models.text);
    assert.equal(models.body.object, 'list');
    const wrongKey = await http('GET', `${s.url}/${project.projectId}/v1/models`, {
      auth: `Bearer ${key.slice(0, -4)}xxxx`,
    });
    assert.equal(wrongKey.status, 401, wrongKey.text);
    await page.reload();
    assert.match(await page.locator('#keys table').innerText(), /from-the-browser/);

    // f) Security headers on the pages, and the cookies as Chromium keeps them.
    for (const path of ['/login', '/dashboard', `/dashboard/projects/${project.projectId}`]) {
      const headers = (await open(page, `${base}${path}`)).headers();
      const csp = headers['content-security-policy'] ?? '';
      assert.match(csp, /(^|;)\s*script-src 'self'\s*(;|$)/, `${path}: ${csp}`);
      assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/, `${path}: ${csp}`);
      assert.match(csp, /frame-ancestors 'none'/, `${path}: ${csp}`);
      assert.equal(headers['x-frame-options'], 'DENY', path);
      assert.equal(headers['cache-control'], 'no-store', path);
    }
    const session = await cookieNamed(context, 'swy_session');
    const csrfCookie = await cookieNamed(context, 'swy_csrf');
    for (const c of [session, csrfCookie]) {
      assert.equal(c.httpOnly, true, `${c.name} httpOnly`);
      assert.equal(c.secure, true, `${c.name} secure`);
      assert.equal(c.sameSite, 'Lax', `${c.name} sameSite`);
      assert.equal(c.domain, 'localhost', `${c.name} domain`);
      assert.equal(c.path, '/', `${c.name} path`);
    }
    // The session lasts at most 1440 minutes (by the browser's own clock).
    const inADay = Date.now() / 1000 + 1440 * 60;
    assert.ok(Math.abs(session.expires - inADay) < 120, `swy_session expires ${session.expires}`);
    // The page's script cannot read them either.
    assert.doesNotMatch(String(await page.evaluate('document.cookie')), /swy_/);

    // e) Without the X-CSRF-Token header (all a cross-site form could send) a
    // state-changing request is refused, and the session stays.
    const refused = await page.evaluate(async () => {
      const r = await fetch('/logout', { method: 'POST' });
      return { status: r.status, body: (await r.json()) as { error?: { code?: string } } };
    });
    assert.equal(refused.status, 403, JSON.stringify(refused.body));
    assert.equal(refused.body.error?.code, 'csrf_token_invalid');
    const wrongHeader = await page.evaluate(async () => {
      const r = await fetch('/logout', { method: 'POST', headers: { 'x-csrf-token': 'forged' } });
      return r.status;
    });
    assert.equal(wrongHeader, 403);
    await open(page, `${base}/dashboard`);
    assert.equal(new URL(page.url()).pathname, '/dashboard', 'still signed in');

    // c) Two-factor setup: the key is revealed, a code from it turns 2FA on and
    // the backup codes are revealed once.
    await open(page, `${base}/account`);
    await page.click('#setup-2fa button[type="submit"]');
    const setup = await revealed(page, '#setup-2fa');
    const secret = /^Key: ([A-Z2-7]+)$/m.exec(setup)?.[1];
    assert.ok(secret, `no key in: ${setup}`);
    assert.match(setup, /^otpauth:\/\/totp\//m);
    await page.fill('#enable-2fa input[name="code"]', totpCode(secret, s.clock.now()));
    await page.click('#enable-2fa button[type="submit"]');
    const enabled = await revealed(page, '#enable-2fa');
    const backupCodes = enabled.match(/^[a-z2-9]{5}-[a-z2-9]{5}$/gm) ?? [];
    assert.equal(backupCodes.length, 10, enabled);
    await page.reload();
    assert.match(await page.locator('main').innerText(), /On\. 10 backup codes left\./);

    // d) Signing in again asks for the second factor: a wrong code is shown in the
    // page, the next step's code signs in.
    await signOut(page);
    await open(page, `${base}/dashboard`);
    assert.equal(new URL(page.url()).pathname, '/login', 'signed out');
    await signIn(page, base, /\/login\/2fa$/);
    const pending = await cookieNamed(context, 'swy_login');
    assert.equal(pending.httpOnly, true);
    assert.equal(pending.secure, true);
    assert.equal(pending.sameSite, 'Lax');
    assert.ok(Math.abs(pending.expires - (Date.now() / 1000 + 300)) < 60, 'a 5-minute login');
    assert.ok(
      !(await context.cookies()).some((c) => c.name === 'swy_session'),
      'no session before the second factor',
    );
    const now = s.clock.now();
    const live = new Set([-1, 0, 1].map((d) => totpCode(secret, now + d * STEP_MS)));
    let wrong = totpCode(secret, now);
    while (live.has(wrong)) wrong = String((Number(wrong) + 1) % 1_000_000).padStart(6, '0');
    await page.fill('#code input[name="code"]', wrong);
    await page.click('#code button[type="submit"]');
    assert.equal(
      await formError(page, '#code'),
      'The two-factor code is wrong, expired or already used.',
    );
    assert.equal(new URL(page.url()).pathname, '/login/2fa');
    s.clock.advance(STEP_MS);
    await page.fill('#code input[name="code"]', totpCode(secret, s.clock.now()));
    await page.click('#code button[type="submit"]');
    await page.waitForURL(/\/dashboard$/);
    assert.equal(await page.locator('h1').innerText(), 'Projects');
    const names = (await context.cookies()).map((c) => c.name);
    assert.ok(names.includes('swy_session') && !names.includes('swy_login'), names.join(', '));

    // A backup code signs in once as well.
    await signOut(page);
    await signIn(page, base, /\/login\/2fa$/);
    await page.fill('#code input[name="code"]', backupCodes[0]!.toUpperCase());
    await page.click('#code button[type="submit"]');
    await page.waitForURL(/\/dashboard$/);
    await open(page, `${base}/account`);
    assert.match(await page.locator('main').innerText(), /On\. 9 backup codes left\./);

    assert.deepEqual(problems, [], 'no script errors and nothing blocked by the CSP');
  });

  // The spec: every POST must carry the page's X-CSRF-Token. A cross-site form
  // cannot send that header, and SameSite=Lax keeps the session cookie off its
  // POST; a text/plain form (no CORS preflight, and a body type the router
  // accepts) must then change nothing for the signed-in user.
  it('a cross-site form cannot sign the user out', async () => {
    await member('Cal', 'cal@example.com');
    const ctx = await browser!.newContext();
    ctx.setDefaultTimeout(10_000);
    // Another site: 127.0.0.1 is not localhost.
    const evil = createServer((_req, res) => {
      res.setHeader('content-type', 'text/html; charset=utf-8');
      res.end(
        `<!doctype html><form method="post" enctype="text/plain" action="${base}/logout">` +
          `<input name="x" value="y"><button type="submit">Win a prize</button></form>`,
      );
    });
    try {
      await new Promise<void>((resolve) => evil.listen(0, '127.0.0.1', resolve));
      const evilUrl = `http://127.0.0.1:${(evil.address() as AddressInfo).port}/`;
      const p = await ctx.newPage();
      await signIn(p, base, /\/dashboard$/, 'cal@example.com');
      await cookieNamed(ctx, 'swy_session');

      await open(p, evilUrl);
      const [answer] = await Promise.all([
        p.waitForResponse((r) => r.url() === `${base}/logout`),
        p.click('button[type="submit"]'),
      ]);
      const status = answer.status();
      const body = await answer.text();
      const left = (await ctx.cookies()).map((c) => c.name);
      await open(p, `${base}/dashboard`);
      const landed = new URL(p.url()).pathname;
      assert.ok(
        left.includes('swy_session') && landed === '/dashboard',
        `a cross-site POST to /logout (no X-CSRF-Token, no session cookie: SameSite=Lax) ` +
          `was answered ${status} ${body} and signed the user out: cookies left [${left.join(', ')}], ` +
          `/dashboard now leads to ${landed}`,
      );
    } finally {
      evil.close();
      await ctx.close();
    }
  });
});
