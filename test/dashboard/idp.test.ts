/**
 * Identity-provider sign-in through the real router (spec, Dashboard:
 * "Identity-provider sign-in"): `/auth/<idp>` → the provider (the fake one in
 * test/support/fake-idp.ts, a real HTTP OpenID Connect provider) →
 * `/auth/<idp>/callback` → a session, the second-factor step, or
 * `/login?error=…`. Accounts are made or linked (by a verified e-mail address
 * only), a signed-in user links and unlinks identities, and the session that
 * comes out of it is for the dashboard only, never the API.
 */
import assert from 'node:assert/strict';
import { createServer, type AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { eq } from 'drizzle-orm';
import { totpCode } from '../../src/dashboard/totp.js';
import { tables } from '../../src/store/index.js';
import { Visitor, type Answer } from '../support/dashboard.js';
import { startFakeIdp, type FakeIdp, type TokenTamper } from '../support/fake-idp.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

const PASSWORD = 'correct horse battery staple';

// The provider's users; each test uses its own so that the tests do not lean on each other.
const ADA = { sub: 'sub-ada', email: 'ada@example.com', email_verified: true, name: 'Ada' };
const GRACE = {
  sub: 'sub-grace',
  // The operator made grace@example.com; the provider spells it with capitals.
  email: 'Grace@Example.com',
  email_verified: true,
  name: 'Grace Hopper',
};
const MALLORY = { sub: 'sub-mallory', email: 'victim@example.com', email_verified: false };
const NOBODY = { sub: 'sub-nobody', email: 'nobody@example.com', email_verified: false };
const EVE = { sub: 'sub-eve', email: 'eve@example.com', email_verified: true };
const LINKER = { sub: 'sub-linker', email: 'linda-elsewhere@example.org', email_verified: true };
const TFA = { sub: 'sub-tfa', email: 'tfa@example.com', email_verified: true, name: 'Tess' };
const API = { sub: 'sub-api', email: 'api@example.com', email_verified: true };
const CAROL = { sub: 'sub-carol', email: 'carol@example.com', email_verified: true };
const LATE = { sub: 'sub-late', email: 'late@example.com', email_verified: true };
const DAN = { sub: 'sub-dan', email: 'dan@example.com', email_verified: true };
const MAL = { sub: 'sub-mal', email: 'mal@example.com', email_verified: true };
const DUO = { sub: 'sub-duo', email: 'duo@example.com', email_verified: true };

const ERROR_PAGE = /^\/login\?error=./;

describe('identity-provider sign-in through the router', () => {
  let idp: FakeIdp;
  let s: TestServer;
  /** A configured provider nobody answers for (a port seen free). */
  let deadIssuer: string;

  before(async () => {
    const probe = createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    deadIssuer = `http://127.0.0.1:${(probe.address() as AddressInfo).port}`;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    idp = await startFakeIdp({
      users: [ADA, GRACE, MALLORY, NOBODY, EVE, LINKER, TFA, API, CAROL, LATE, DAN, MAL, DUO],
    });
    s = await startTestServer({
      env: {
        SWITCHYARD_IDPS: JSON.stringify([
          {
            name: 'fake',
            issuer: idp.issuer,
            client_id: idp.clientId,
            client_secret: idp.clientSecret,
          },
          { name: 'dead', issuer: deadIssuer, client_id: 'c', client_secret: 's' },
        ]),
      },
    });
    // openid-client checks the ID token's iat/exp against the real clock; the
    // server's sessions, pending logins and TOTP codes use the fake one.
    s.clock.set(Date.now());
  });

  after(async () => {
    await s?.close();
    await idp?.close();
  });

  // ---- the browser's part ----

  /**
   * The way to the provider's /authorize: GET /auth/fake to sign in; signed in, the
   * account page's "Link" (a POST with the page's CSRF token) to link.
   */
  async function toProvider(v: Visitor, provider = 'fake'): Promise<string> {
    let to: string;
    if (v.cookies.has('swy_session')) {
      await v.page('/account');
      const r = await v.send('POST', `/account/identities/${provider}/link`, { body: {} });
      assert.equal(r.status, 200, r.text);
      to = String(r.json.next);
    } else {
      const a = await v.send('GET', `/auth/${provider}`);
      assert.equal(a.status, 302, a.text);
      to = String(a.location);
    }
    assert.ok(to.startsWith(`${idp.issuer}/authorize?`), `to the provider: ${to}`);
    return to;
  }

  /** The provider logs `sub` in and sends the browser back: the callback URL. */
  async function atProvider(authorizeUrl: string, sub: string): Promise<URL> {
    idp.nextLogin(sub);
    const res = await request(authorizeUrl, { method: 'GET' });
    await res.body.text();
    assert.equal(res.statusCode, 302, 'the provider redirects back');
    const location = res.headers.location;
    assert.equal(typeof location, 'string');
    const back = new URL(String(location));
    assert.equal(`${back.origin}${back.pathname}`, `${s.url}/auth/fake/callback`);
    return back;
  }

  /** GET of the callback URL on the router, with the visitor's cookies. */
  function callback(v: Visitor, back: URL): Promise<Answer> {
    return v.send('GET', `${back.pathname}${back.search}`);
  }

  /** The whole round trip; the router's answer to the callback. */
  async function viaProvider(v: Visitor, sub: string): Promise<Answer> {
    return callback(v, await atProvider(await toProvider(v), sub));
  }

  async function users(): Promise<Array<{ id: string; email: string; name: string }>> {
    const r = await s.admin('GET', '/users');
    assert.equal(r.status, 200, r.text);
    return r.body.data as Array<{ id: string; email: string; name: string }>;
  }

  async function createUser(body: Record<string, string>): Promise<string> {
    const r = await s.admin('POST', '/users', body);
    assert.equal(r.status, 201, r.text);
    return String(r.body.id);
  }

  /** The signed-in visitor's /account page (asserting it is one). */
  async function account(v: Visitor): Promise<string> {
    const a = await v.page('/account');
    assert.equal(a.status, 200, `account page: ${a.status} ${String(a.location)}`);
    return a.text;
  }

  function assertRefused(a: Answer, v: Visitor): void {
    assert.equal(a.status, 302, a.text);
    assert.match(String(a.location), ERROR_PAGE);
    assert.equal(v.cookies.has('swy_session'), false, 'no session');
    assert.equal(v.cookies.has('swy_login'), false, 'no second-factor step');
  }

  // ---- (1) a new verified address: a new account ----

  it('a new verified e-mail address makes an account and opens a session on /dashboard', async () => {
    const before = await users();
    const v = new Visitor(s.url);
    const a = await viaProvider(v, ADA.sub);
    assert.equal(a.status, 302, a.text);
    assert.equal(a.location, '/dashboard');
    assert.ok(v.cookies.has('swy_session'), 'session cookie');
    const setCookie = [a.headers['set-cookie'] ?? []]
      .flat()
      .find((c) => c.startsWith('swy_session='));
    assert.match(String(setCookie), /HttpOnly/i);
    assert.match(String(setCookie), /Secure/i);

    const after = await users();
    assert.equal(after.length, before.length + 1);
    const made = after.filter((u) => u.email === ADA.email);
    assert.equal(made.length, 1);
    assert.equal(made[0]!.name, ADA.name);

    const dash = await v.page('/dashboard');
    assert.equal(dash.status, 200);
    const acct = await account(v);
    assert.ok(acct.includes(ADA.email));
    assert.ok(acct.includes('/account/identities/fake/unlink'), 'the identity is linked');
    // The provider saw the whole code flow.
    assert.ok(idp.requests.includes('/authorize'));
    assert.ok(idp.requests.includes('/token'));
  });

  // ---- (2) an existing account with the same address: linked ----

  it('links to the existing account with the same (verified) address, once', async () => {
    const id = await createUser({ name: 'Grace', email: 'grace@example.com' });
    const before = await users();

    const v = new Visitor(s.url);
    const a = await viaProvider(v, GRACE.sub);
    assert.equal(a.location, '/dashboard', String(a.location));
    assert.ok(v.cookies.has('swy_session'));
    const acct = await account(v);
    assert.ok(acct.includes(id), 'signed in as the operator-made user');
    assert.ok(acct.includes('grace@example.com'));
    assert.deepEqual(await users(), before, 'no new account');

    // Again, from another browser: the identity now signs in the same user.
    const w = new Visitor(s.url);
    const b = await viaProvider(w, GRACE.sub);
    assert.equal(b.location, '/dashboard');
    assert.ok((await account(w)).includes(id));
    assert.deepEqual(await users(), before, 'still no new account');
  });

  // ---- (3) unverified addresses ----

  it('an unverified address matching an account is not linked: the sign-in is refused', async () => {
    await createUser({ name: 'Victim', email: 'victim@example.com', password: PASSWORD });
    const before = await users();

    const v = new Visitor(s.url);
    assertRefused(await viaProvider(v, MALLORY.sub), v);
    assert.deepEqual(await users(), before);

    // The victim's account has no identity linked.
    const victim = new Visitor(s.url);
    assert.equal(await victim.login('victim@example.com', PASSWORD), '/dashboard');
    const acct = await account(victim);
    assert.ok(acct.includes('None linked.'), 'nothing linked to the victim');

    // And a second try is refused the same way (nothing was linked the first time).
    const w = new Visitor(s.url);
    assertRefused(await viaProvider(w, MALLORY.sub), w);
  });

  it('an unverified new address is refused and makes no account', async () => {
    const before = await users();
    const v = new Visitor(s.url);
    const a = await viaProvider(v, NOBODY.sub);
    assertRefused(a, v);
    assert.deepEqual(await users(), before);
    assert.ok(!(await users()).some((u) => u.email === NOBODY.email));
    // The refusal is shown on the sign-in page (escaped text, no markup).
    const shown = await v.page(String(a.location));
    assert.equal(shown.status, 200);
    assert.match(shown.text, /<p class="error">[^<]+<\/p>/);
  });

  // ---- (4) the provider refuses, the token is wrong, the state is wrong ----

  it('a refusal by the provider ends on /login?error=… with no session and no account', async () => {
    const before = await users();
    const v = new Visitor(s.url);
    const authorize = await toProvider(v);
    idp.refuseNext('access_denied');
    const back = await atProvider(authorize, EVE.sub);
    assert.equal(back.searchParams.get('error'), 'access_denied');
    assert.equal(back.searchParams.has('code'), false);
    assertRefused(await callback(v, back), v);
    assert.deepEqual(await users(), before);
  });

  for (const kind of ['signature', 'nonce', 'audience', 'expired'] as TokenTamper[]) {
    it(`a tampered ID token (${kind}) is refused: no session, no account`, async () => {
      const before = await users();
      const v = new Visitor(s.url);
      idp.tamperNextToken(kind);
      assertRefused(await viaProvider(v, EVE.sub), v);
      assert.deepEqual(await users(), before);
    });
  }

  it('a callback with an unknown, missing or already used state is refused', async () => {
    const before = await users();
    const v = new Visitor(s.url);
    assertRefused(await v.send('GET', '/auth/fake/callback?code=abc&state=never-issued'), v);
    assertRefused(await v.send('GET', '/auth/fake/callback?code=abc'), v);

    // A real state, used once (successfully), then replayed from another browser.
    const back = await atProvider(await toProvider(v), ADA.sub);
    const first = await callback(v, back);
    assert.equal(first.location, '/dashboard');
    const w = new Visitor(s.url);
    assertRefused(await callback(w, back), w);

    // A state begun for this provider, completed under another provider's name.
    const x = new Visitor(s.url);
    const other = await atProvider(await toProvider(x), ADA.sub);
    assertRefused(await x.send('GET', `/auth/other/callback${other.search}`), x);
    assert.deepEqual(await users(), before);
  });

  // ---- (5) an unknown provider ----

  it('an unknown provider name ends on /login?error=…', async () => {
    const v = new Visitor(s.url);
    const seen = idp.requests.length;
    const a = await v.send('GET', '/auth/nope');
    assertRefused(a, v);
    const page = await v.page(String(a.location));
    assert.ok(page.text.includes('No such identity provider.'), page.text);
    // Only the router's own messages are shown: text a link from elsewhere put in
    // the URL (or a real message with a wrong signature) is replaced.
    for (const path of [
      '/login?error=Your%20account%20is%20locked%2C%20call%20%2B1-555-0100',
      `/login?error=Your%20account%20is%20locked&sig=${new URL(String(a.location), s.url).searchParams.get('sig')}`,
      '/account?error=Call%20%2B1-555-0100',
    ]) {
      const forged = await v.page(path);
      assert.ok(!forged.text.includes('locked') && !forged.text.includes('555'), path);
    }
    const generic = await v.page('/login?error=Your%20account%20is%20locked');
    assert.ok(generic.text.includes('The sign-in did not complete; try again.'));
    assertRefused(await v.send('GET', '/auth/nope/callback?code=abc&state=xyz'), v);
    assert.equal(idp.requests.length, seen, 'the provider was not asked');
  });

  it('a provider that cannot be reached ends on /login?error=…', async () => {
    const v = new Visitor(s.url);
    const a = await v.send('GET', '/auth/dead');
    assertRefused(a, v);
    const page = await v.page(String(a.location));
    assert.ok(page.text.includes('The identity provider cannot be reached.'), page.text);
  });

  // ---- (6) linking from a signed-in session, and unlinking ----

  it('a signed-in user links an identity, signs in with it, and unlinks it', async () => {
    const lindaId = await createUser({
      name: 'Linda',
      email: 'linda@example.com',
      password: PASSWORD,
    });
    const v = new Visitor(s.url);
    assert.equal(await v.login('linda@example.com', PASSWORD), '/dashboard');
    assert.ok((await account(v)).includes('None linked.'));
    const before = await users();

    // The identity's address is not Linda's: linking is by the session, not by e-mail.
    const a = await viaProvider(v, LINKER.sub);
    assert.equal(a.status, 302, a.text);
    assert.equal(a.location, '/account');
    let acct = await account(v);
    assert.ok(acct.includes(lindaId));
    assert.ok(acct.includes(LINKER.email), 'the identity is listed');
    assert.ok(acct.includes('/account/identities/fake/unlink'));
    assert.deepEqual(await users(), before, 'no new account');

    // The identity now signs Linda in from another browser.
    const w = new Visitor(s.url);
    assert.equal((await viaProvider(w, LINKER.sub)).location, '/dashboard');
    assert.ok((await account(w)).includes(lindaId));

    // Unlinking needs the session's CSRF token.
    const noCsrf = await v.send('POST', '/account/identities/fake/unlink', {
      body: {},
      csrf: null,
    });
    assert.equal(noCsrf.status, 403, noCsrf.text);
    const wrong = await v.send('POST', '/account/identities/fake/unlink', {
      body: {},
      csrf: 'not-the-token',
    });
    assert.equal(wrong.status, 403, wrong.text);
    await account(v); // the page's csrf-token
    const un = await v.send('POST', '/account/identities/fake/unlink', { body: {} });
    assert.equal(un.status, 200, un.text);
    assert.equal(un.json.next, '/account');
    acct = await account(v);
    assert.ok(acct.includes('None linked.'), 'unlinked');
    assert.ok(!acct.includes(LINKER.email));
    // Unlinking what is not linked is a 404.
    const again = await v.send('POST', '/account/identities/fake/unlink', { body: {} });
    assert.equal(again.status, 404, again.text);

    // The identity no longer signs Linda in: its (different, verified) address makes a new account.
    const x = new Visitor(s.url);
    assert.equal((await viaProvider(x, LINKER.sub)).location, '/dashboard');
    const xAcct = await account(x);
    assert.ok(!xAcct.includes(lindaId), 'not Linda');
    assert.ok(xAcct.includes(LINKER.email));
  });

  it('linking starts only from a POST with the page token, never from a GET another site can trigger', async () => {
    await createUser({ name: 'Erin', email: 'erin@example.com', password: PASSWORD });
    const v = new Visitor(s.url);
    assert.equal(await v.login('erin@example.com', PASSWORD), '/dashboard');
    const before = (await account(v)).includes('None linked.');
    assert.ok(before);
    // A signed-in GET /auth/fake (a link on another site) starts nothing.
    const get = await v.send('GET', '/auth/fake');
    assert.equal(get.status, 302);
    assert.equal(get.location, '/account');
    assert.equal(v.cookies.has('swy_idp'), false);
    // The POST without the page's token is refused.
    const forged = await v.send('POST', '/account/identities/fake/link', { body: {}, csrf: null });
    assert.equal(forged.status, 403);
    assert.equal(v.cookies.has('swy_idp'), false);
    // The account page offers it as a form (POST), not as a link.
    const acct = await account(v);
    assert.match(acct, /action="\/account\/identities\/fake\/link"/);
    assert.doesNotMatch(acct, /href="\/auth\/fake"/);
    const unknown = await v.send('POST', '/account/identities/nope/link', { body: {} });
    assert.equal(unknown.status, 401, unknown.text);
    assert.equal(
      unknown.json.error && (unknown.json.error as { code: string }).code,
      'identity_login_failed',
    );
  });

  it('an account whose only way in is the identity cannot unlink it', async () => {
    const v = new Visitor(s.url);
    assert.equal((await viaProvider(v, ADA.sub)).location, '/dashboard');
    await account(v);
    const un = await v.send('POST', '/account/identities/fake/unlink', { body: {} });
    assert.equal(un.status, 409, un.text);
    assert.ok((await account(v)).includes('/account/identities/fake/unlink'), 'still linked');
  });

  it('two identities unlinked at once: one stays, the account keeps a way in', async () => {
    const v = new Visitor(s.url);
    assert.equal((await viaProvider(v, DUO.sub)).location, '/dashboard');
    const [u] = await s.services.store.db
      .select()
      .from(tables.users)
      .where(eq(tables.users.email, DUO.email));
    // A second identity, at another provider.
    await s.services.store.db.insert(tables.userIdentities).values({
      provider: 'other',
      subject: 'sub-duo-other',
      userId: u!.id,
      email: DUO.email,
      createdAt: new Date(s.clock.now()),
    });
    await account(v);
    // The two lookups of the user answer together (as a remote PostgreSQL can), so
    // each request reads the identities before either deletes one.
    const accounts = s.services.dashboard.accounts;
    const lookup = accounts.user.bind(accounts);
    const waiting: Array<() => void> = [];
    accounts.user = async (id) => {
      await new Promise<void>((resolve) => {
        waiting.push(resolve);
        if (waiting.length === 2) for (const go of waiting.splice(0)) go();
      });
      return lookup(id);
    };
    const answers = await Promise.all(
      ['fake', 'other'].map((p) => v.send('POST', `/account/identities/${p}/unlink`, { body: {} })),
    ).finally(() => {
      accounts.user = lookup;
    });
    const statuses = answers.map((a) => a.status).sort();
    assert.deepEqual(statuses, [200, 409], answers.map((a) => a.text).join(' '));
    const left = await s.services.store.db
      .select()
      .from(tables.userIdentities)
      .where(eq(tables.userIdentities.userId, u!.id));
    assert.equal(left.length, 1, 'one way in stays');
  });

  // ---- (7) two-factor authentication after the provider ----

  it('a user with two-factor on goes to /login/2fa after the provider, not /dashboard', async () => {
    await createUser({ name: 'Tess', email: 'tfa@example.com', password: PASSWORD });
    const setup = new Visitor(s.url);
    assert.equal(await setup.login('tfa@example.com', PASSWORD), '/dashboard');
    await account(setup);
    const begun = await setup.send('POST', '/account/2fa/setup', { body: {} });
    assert.equal(begun.status, 200, begun.text);
    const key = (begun.json.reveal as string[]).find((l) => l.startsWith('Key: '));
    assert.ok(key, begun.text);
    const secret = key.slice('Key: '.length);
    const on = await setup.send('POST', '/account/2fa/enable', {
      body: { code: totpCode(secret, s.clock.now()) },
    });
    assert.equal(on.status, 200, on.text);

    const v = new Visitor(s.url);
    const a = await viaProvider(v, TFA.sub);
    assert.equal(a.status, 302, a.text);
    assert.equal(a.location, '/login/2fa');
    assert.ok(v.cookies.has('swy_login'), 'the second-factor step');
    assert.equal(v.cookies.has('swy_session'), false, 'no session yet');
    const dash = await v.send('GET', '/dashboard');
    assert.equal(dash.status, 302);
    assert.equal(dash.location, '/login');

    // The code completes it (the next time step: the setup's code is spent).
    const step = await v.page('/login/2fa');
    assert.equal(step.status, 200);
    s.clock.advance(30_000);
    const done = await v.send('POST', '/login/2fa', {
      body: { code: totpCode(secret, s.clock.now()) },
    });
    assert.equal(done.status, 200, done.text);
    assert.equal(done.json.next, '/dashboard');
    assert.ok(v.cookies.has('swy_session'));
    assert.equal((await v.page('/dashboard')).status, 200);
  });

  // ---- (8) never API access ----

  it('the session from a provider sign-in gives no API access', async () => {
    const { projectId, projectSlug } = await seedProject(s);
    const v = new Visitor(s.url);
    assert.equal((await viaProvider(v, API.sub)).location, '/dashboard');
    const me = (await users()).find((u) => u.email === API.email);
    assert.ok(me);
    const m = await s.admin('POST', `/projects/${projectSlug}/members`, {
      user_id: me.id,
      role: 'owner',
    });
    assert.equal(m.status, 201, m.text);
    const dash = await v.page('/dashboard');
    assert.equal(dash.status, 200);
    assert.ok(dash.text.includes(projectId), 'a member of the project in the dashboard');

    const withCookie = await v.send('GET', `/${projectId}/v1/models`);
    assert.equal(withCookie.status, 401, withCookie.text);
    const token = v.cookies.get('swy_session');
    assert.ok(token);
    const asBearer = await new Visitor(s.url).send('GET', `/${projectId}/v1/models`, {
      headers: { authorization: `Bearer ${token}` },
    });
    assert.equal(asBearer.status, 401, asBearer.text);
  });

  // ---- the pending login is bound to the browser (and session) that began it ----
  // These three fail today: /auth/<idp>/callback (src/dashboard/routes.ts) finishes
  // the pending login of whatever browser brings its state, and a link for the
  // user recorded at /auth/<idp> whether or not that user is still signed in.
  // RFC 9700 §2.1 / RFC 6749 §10.12: the state (or PKCE verifier) must be bound
  // to the user agent that began the flow.

  it('a link begun in one browser cannot be completed by another (OAuth CSRF)', async () => {
    // The attacker, signed in, starts linking and sends the /authorize URL to
    // Carol; her browser, signed in at the provider as Carol, returns to the
    // callback without the attacker's cookies.
    const attackerId = await createUser({
      name: 'Attacker',
      email: 'attacker@example.com',
      password: PASSWORD,
    });
    const attacker = new Visitor(s.url);
    assert.equal(await attacker.login('attacker@example.com', PASSWORD), '/dashboard');
    const authorize = await toProvider(attacker);

    const carol = new Visitor(s.url);
    const back = await atProvider(authorize, CAROL.sub);
    const a = await callback(carol, back);
    assert.ok(
      !(await account(attacker)).includes(CAROL.email),
      `Carol's identity is linked to the attacker's account (callback answered ${String(a.location)})`,
    );

    // Consequence: Carol signing in with the provider lands in the attacker's account.
    const later = new Visitor(s.url);
    assert.equal((await viaProvider(later, CAROL.sub)).location, '/dashboard');
    assert.ok(!(await account(later)).includes(attackerId), "signed in as the attacker's account");
  });

  it('a sign-in begun in one browser cannot be completed by another (login CSRF)', async () => {
    // Mal begins a sign-in, logs in at the provider as himself and keeps the
    // callback URL instead of following it; Dan's browser is made to open it.
    const mal = new Visitor(s.url);
    const back = await atProvider(await toProvider(mal), MAL.sub);
    const dan = new Visitor(s.url);
    const a = await callback(dan, back);
    assert.equal(
      dan.cookies.has('swy_session'),
      false,
      `a browser that did not begin the sign-in got a session (${String(a.location)})`,
    );
  });

  it('a link is not completed for a user whose session ended before the callback', async () => {
    await createUser({ name: 'Dana', email: 'dana@example.com', password: PASSWORD });
    const v = new Visitor(s.url);
    assert.equal(await v.login('dana@example.com', PASSWORD), '/dashboard');
    const authorize = await toProvider(v);
    await account(v);
    const out = await v.send('POST', '/logout', { body: {} });
    assert.equal(out.status, 200, out.text);
    assert.equal(v.cookies.has('swy_session'), false);

    const a = await callback(v, await atProvider(authorize, DAN.sub));
    const again = new Visitor(s.url);
    assert.equal(await again.login('dana@example.com', PASSWORD), '/dashboard');
    assert.ok(
      !(await account(again)).includes(DAN.email),
      `linked to a signed-out user (callback answered ${String(a.location)})`,
    );
  });

  // ---- last: moves the fake clock ----

  it('a pending sign-in expires after 10 minutes', async () => {
    const before = await users();
    const v = new Visitor(s.url);
    const back = await atProvider(await toProvider(v), LATE.sub);
    s.clock.advance(10 * 60_000 + 1_000);
    assertRefused(await callback(v, back), v);
    assert.deepEqual(await users(), before);
  });
});
