/**
 * Dashboard sign-in as a browser sees it over HTTP (spec, Dashboard: user and
 * account boundary), on the router's fake clock:
 * - password sign-in; cookies Secure, HttpOnly, SameSite=Lax; CSRF on every
 *   state-changing request, from the page's csrf-token meta tag;
 * - sessions: each activity extends them by 480 minutes, at most 1440 in all;
 *   a password change and an operator's reset end every session;
 * - TOTP: setup verifies a code; login needs the code within 5 minutes; a code
 *   works once; backup codes work once and regeneration replaces them; disabling
 *   and regenerating need a TOTP code; attempts are rate limited; seeds are
 *   sealed at rest and never logged.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { totpCode } from '../../src/dashboard/totp.js';
import { tables } from '../../src/store/index.js';
import { startTestServer, type TestServer } from '../support/harness.js';
import { errorCode, Visitor } from '../support/dashboard.js';

const MIN = 60_000;
const PASSWORD = 'correct horse battery staple';

async function user(s: TestServer, email: string, password = PASSWORD) {
  const r = await s.admin('POST', '/users', { name: email.split('@')[0], email, password });
  assert.equal(r.status, 201, r.text);
  assert.equal(r.body.password_set, true);
  return String(r.body.id);
}

function cookieLine(a: { headers: Record<string, string | string[] | undefined> }, name: string) {
  return [a.headers['set-cookie'] ?? []].flat().find((l) => l.startsWith(`${name}=`)) ?? '';
}

describe('dashboard sign-in and sessions', () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer();
  });
  after(() => s.close());

  it('signs in with a password; cookies are Secure, HttpOnly, SameSite=Lax', async () => {
    await user(s, 'ann@example.com');
    const v = new Visitor(s.url);
    const page = await v.page('/login');
    assert.match(cookieLine(page, 'swy_csrf'), /HttpOnly; Secure; SameSite=Lax/);
    assert.match(page.headers['content-security-policy'] as string, /script-src 'self'/);
    assert.equal(page.headers['x-frame-options'], 'DENY');

    const wrong = await v.send('POST', '/login', {
      body: { email: 'ann@example.com', password: 'not the password' },
    });
    assert.equal(wrong.status, 401);
    assert.equal(errorCode(wrong), 'invalid_credentials');
    const unknown = await v.send('POST', '/login', {
      body: { email: 'nobody@example.com', password: PASSWORD },
    });
    assert.equal(unknown.status, 401);
    assert.equal(errorCode(unknown), 'invalid_credentials');
    assert.equal(
      unknown.json.error && (unknown.json.error as { message: string }).message,
      (wrong.json.error as { message: string }).message,
      'the same answer for both',
    );

    const ok = await v.send('POST', '/login', {
      body: { email: 'ANN@example.com', password: PASSWORD },
    });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.json.next, '/dashboard');
    assert.match(cookieLine(ok, 'swy_session'), /HttpOnly; Secure; SameSite=Lax/);
    const dash = await v.page('/dashboard');
    assert.equal(dash.status, 200);
    assert.match(dash.text, /<h1>Projects<\/h1>/);
    assert.ok(v.csrf.length > 20);
    // Without a session: back to the sign-in page.
    const anon = await new Visitor(s.url).send('GET', '/dashboard');
    assert.equal(anon.status, 302);
    assert.equal(anon.location, '/login');
  });

  it('refuses state-changing requests without the page’s CSRF token', async () => {
    await user(s, 'csrf@example.com');
    const v = new Visitor(s.url);
    await v.page('/login');
    const bare = await v.send('POST', '/login', {
      body: { email: 'csrf@example.com', password: PASSWORD },
      csrf: null,
    });
    assert.equal(bare.status, 403);
    assert.equal(errorCode(bare), 'csrf_token_invalid');
    // Anyone may post to the sign-in form: a body past 16 KiB is refused unread.
    const huge = await v.send('POST', '/login', {
      body: { email: 'csrf@example.com', password: 'p'.repeat(20_000) },
    });
    assert.equal(huge.status, 413);
    assert.equal(errorCode(huge), 'payload_too_large');
    assert.equal(await v.login('csrf@example.com', PASSWORD), '/dashboard');
    await v.page('/account');
    for (const [path, body] of [
      ['/logout', {}],
      ['/account/password', { current_password: PASSWORD, password: 'another long password' }],
      ['/account/2fa/setup', {}],
    ] as const) {
      for (const csrf of [null, 'x'.repeat(v.csrf.length), 'short']) {
        const r = await v.send('POST', path, { body, csrf });
        assert.equal(r.status, 403, `${path} ${String(csrf)}`);
        assert.equal(errorCode(r), 'csrf_token_invalid');
      }
    }
    // The bodies a cross-site form can send are refused whatever they hold.
    for (const type of ['text/plain', 'application/x-www-form-urlencoded']) {
      const r = await v.send('POST', '/logout', { headers: { 'content-type': type } });
      assert.equal(r.status, 415, type);
    }
    // The session still stands and the right token works.
    assert.equal((await v.send('POST', '/logout', { body: {} })).status, 200);
    assert.equal((await v.send('GET', '/dashboard')).status, 302);
  });

  it('each activity extends the session by 480 minutes; 1440 minutes is the end regardless', async () => {
    await user(s, 'idle@example.com');
    const v = new Visitor(s.url);
    await v.login('idle@example.com', PASSWORD);
    // Idle 479 minutes: still signed in, and that visit extends it.
    s.clock.advance(479 * MIN);
    assert.equal((await v.send('GET', '/dashboard')).status, 200);
    s.clock.advance(479 * MIN);
    assert.equal((await v.send('GET', '/dashboard')).status, 200);
    // 480 minutes without activity: gone.
    s.clock.advance(480 * MIN);
    assert.equal((await v.send('GET', '/dashboard')).status, 302);

    const w = new Visitor(s.url);
    await w.login('idle@example.com', PASSWORD);
    // Active every 400 minutes: alive at 1200 and 1439, ended at 1440 all the same.
    for (let t = 400; t <= 1200; t += 400) {
      s.clock.advance(400 * MIN);
      assert.equal((await w.send('GET', '/dashboard')).status, 200, `at ${t} min`);
    }
    s.clock.advance(239 * MIN);
    assert.equal((await w.send('GET', '/dashboard')).status, 200, 'at 1439 min');
    s.clock.advance(1 * MIN);
    assert.equal((await w.send('GET', '/dashboard')).status, 302, 'at 1440 min');
  });

  it('the idle end is 480 minutes after the last activity, even one within a minute of the previous', async () => {
    await user(s, 'recent@example.com');
    const v = new Visitor(s.url);
    await v.login('recent@example.com', PASSWORD);
    // An activity 30 s after signing in: the session now lasts until 480 minutes after it.
    s.clock.advance(30_000);
    assert.equal((await v.send('GET', '/dashboard')).status, 200);
    s.clock.advance(480 * MIN - 1000);
    assert.equal((await v.send('GET', '/dashboard')).status, 200, '479:59 after the last activity');
  });

  it('ended sessions do not stay in the database', async () => {
    const id = await user(s, 'gone@example.com');
    const [u] = await s.services.store.db
      .select()
      .from(tables.users)
      .where(eq(tables.users.externalId, id));
    const rows = () =>
      s.services.store.db
        .select()
        .from(tables.dashboardSessions)
        .where(eq(tables.dashboardSessions.userId, u!.id));
    // Browsers that sign in and never come back (a cleared cookie, another device).
    for (let i = 0; i < 3; i++) await new Visitor(s.url).login('gone@example.com', PASSWORD);
    assert.equal((await rows()).length, 3);
    s.clock.advance(480 * MIN);
    await new Visitor(s.url).login('gone@example.com', PASSWORD);
    assert.equal((await rows()).length, 1, 'only the live session is kept');
  });

  it('a sign-in whose password was checked just before an operator reset gets no session', async () => {
    const id = await user(s, 'racing@example.com');
    const v = new Visitor(s.url);
    await v.page('/login');
    // The reset lands between the password check and the session's opening.
    const accounts = s.services.dashboard.accounts;
    const login = accounts.passwordLogin.bind(accounts);
    accounts.passwordLogin = async (email, password) => {
      const u = await login(email, password);
      const r = await s.admin('POST', `/users/${id}/password`, { password: 'set by the operator' });
      assert.equal(r.status, 200, r.text);
      return u;
    };
    const r = await v
      .send('POST', '/login', { body: { email: 'racing@example.com', password: PASSWORD } })
      .finally(() => {
        accounts.passwordLogin = login;
      });
    assert.equal(r.status, 401, r.text);
    assert.equal((await v.send('GET', '/dashboard')).status, 302, 'no session survives the reset');
  });

  it('wrong passwords are rate limited per address: 10 in 15 minutes, then even the right one waits', async () => {
    await user(s, 'guess@example.com');
    const v = new Visitor(s.url);
    await v.page('/login');
    const tryPassword = (password: string, email = 'guess@example.com') =>
      v.send('POST', '/login', { body: { email, password } });
    const wrong = await Promise.all(
      Array.from({ length: 12 }, (_, i) => tryPassword(`wrong password ${i}`)),
    );
    const statuses = wrong.map((a) => a.status).sort();
    assert.equal(statuses.filter((x) => x === 401).length, 10, statuses.join(','));
    assert.equal(statuses.filter((x) => x === 429).length, 2);
    const right = await tryPassword(PASSWORD);
    assert.equal(right.status, 429);
    assert.equal(errorCode(right), 'rate_limit_exceeded');
    assert.ok(Number(right.headers['retry-after']) > 0);
    // Another address is not affected (nor tells whether it has an account).
    assert.equal((await tryPassword('x', 'other-guess@example.com')).status, 401);
    s.clock.advance(15 * 60_000 - 1000);
    assert.equal((await tryPassword(PASSWORD, 'GUESS@example.com')).status, 429);
    // The limiter's log keeps time in steps of 1/1000 of its window (0.9 s here).
    s.clock.advance(2000);
    assert.equal((await tryPassword(PASSWORD)).status, 200);
  });

  it('the current password on a password change is limited as signing in is', async () => {
    await user(s, 'stolen@example.com');
    const v = new Visitor(s.url);
    await v.login('stolen@example.com', PASSWORD);
    await v.page('/account');
    const change = (current: string) =>
      v.send('POST', '/account/password', {
        body: { current_password: current, password: 'the thief’s new password' },
      });
    for (let i = 0; i < 10; i++) assert.equal((await change(`guess ${i}`)).status, 401);
    const right = await change(PASSWORD);
    assert.equal(right.status, 429, 'even the right one waits, as at sign-in');
    // The guesses counted against the address's sign-in limit too.
    const signIn = new Visitor(s.url);
    await signIn.page('/login');
    const login = await signIn.send('POST', '/login', {
      body: { email: 'stolen@example.com', password: PASSWORD },
    });
    assert.equal(login.status, 429);
  });

  it('a token or signature with characters outside ASCII is refused, not a 500', async () => {
    const v = new Visitor(s.url);
    // As long as the real one in characters, longer in bytes.
    const sig = `${'\u00e9'}${'x'.repeat(21)}`;
    const page = await v.page(`/login?error=Hello&sig=${encodeURIComponent(sig)}`);
    assert.equal(page.status, 200, page.text);
    assert.ok(page.text.includes('The sign-in did not complete; try again.'));
    const csrf = `${'\u00e9'}${v.csrf.slice(1)}`;
    const r = await v.send('POST', '/login', {
      body: { email: 'nobody@example.com', password: PASSWORD },
      csrf,
    });
    assert.equal(r.status, 403, r.text);
    assert.equal(errorCode(r), 'csrf_token_invalid');
  });

  it('an unknown dashboard page is a page, with the dashboard’s headers', async () => {
    const v = new Visitor(s.url);
    const r = await v.send('GET', '/dashboard/nope', { headers: { accept: 'text/html' } });
    assert.equal(r.status, 404);
    assert.match(String(r.headers['content-type']), /text\/html/);
    assert.match(String(r.headers['content-security-policy']), /frame-ancestors 'none'/);
    assert.equal(r.headers['x-frame-options'], 'DENY');
  });

  it('a password change (and an operator reset) ends every session', async () => {
    const id = await user(s, 'pw@example.com');
    const a = new Visitor(s.url);
    const b = new Visitor(s.url);
    await a.login('pw@example.com', PASSWORD);
    await b.login('pw@example.com', PASSWORD);
    await b.page('/account'); // b's page carries its session's token
    await a.page('/account');
    const wrongCurrent = await a.send('POST', '/account/password', {
      body: { current_password: 'not it at all', password: 'a brand new password' },
    });
    assert.equal(wrongCurrent.status, 401);
    const short = await a.send('POST', '/account/password', {
      body: { current_password: PASSWORD, password: 'too short' },
    });
    assert.equal(short.status, 400);
    assert.equal((short.json.error as { param: string }).param, 'password');
    const changed = await a.send('POST', '/account/password', {
      body: { current_password: PASSWORD, password: 'a brand new password' },
    });
    assert.equal(changed.status, 200, changed.text);
    for (const v of [a, b]) assert.equal((await v.send('GET', '/dashboard')).status, 302);
    // Signing out on a page whose session has ended clears its cookie and goes to sign-in.
    const out = await b.send('POST', '/logout', { body: {} });
    assert.equal(out.status, 200, out.text);
    assert.equal(out.json.next, '/login');
    assert.match(String(out.headers['set-cookie']), /swy_session=;/);
    assert.equal(await a.login('pw@example.com', 'a brand new password'), '/dashboard');

    const reset = await s.admin('POST', `/users/${id}/password`, {
      password: 'set by the operator',
    });
    assert.equal(reset.status, 200, reset.text);
    assert.equal((await a.send('GET', '/dashboard')).status, 302);
    assert.equal(await a.login('pw@example.com', 'set by the operator'), '/dashboard');
    const bad = await s.admin('POST', `/users/${id}/password`, { password: 'short' });
    assert.equal(bad.status, 400);
  });
});

describe('dashboard two-factor authentication', () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer();
  });
  after(() => s.close());

  /** Turns 2FA on for a signed-in visitor; returns the seed and the backup codes. */
  async function enable(v: Visitor): Promise<{ secret: string; codes: string[] }> {
    await v.page('/account');
    const setup = await v.send('POST', '/account/2fa/setup', { body: {} });
    assert.equal(setup.status, 200, setup.text);
    const lines = setup.json.reveal as string[];
    const secret = lines.find((l) => l.startsWith('Key: '))!.slice(5);
    assert.ok(lines.some((l) => l.startsWith('otpauth://totp/')));
    // A wrong code does not turn it on.
    const wrong = await v.send('POST', '/account/2fa/enable', { body: { code: '000000' } });
    assert.equal(wrong.status, 401);
    const on = await v.send('POST', '/account/2fa/enable', {
      body: { code: totpCode(secret, s.clock.now()) },
    });
    assert.equal(on.status, 200, on.text);
    const codes = (on.json.reveal as string[]).slice(1);
    assert.equal(codes.length, 10);
    return { secret, codes };
  }

  it('login needs the code within 5 minutes; a code works once; backup codes work once', async () => {
    await user(s, 'two@example.com');
    const v = new Visitor(s.url);
    await v.login('two@example.com', PASSWORD);
    const { secret, codes } = await enable(v);
    s.clock.advance(30_000);

    const w = new Visitor(s.url);
    assert.equal(await w.login('two@example.com', PASSWORD), '/login/2fa');
    assert.equal((await w.send('GET', '/dashboard')).status, 302, 'no session before the code');
    const challenge = await w.page('/login/2fa');
    assert.equal(challenge.status, 200);
    const wrong = await w.send('POST', '/login/2fa', { body: { code: '123456' } });
    assert.equal(wrong.status, 401);
    assert.equal(errorCode(wrong), 'invalid_code');
    const code = totpCode(secret, s.clock.now());
    const ok = await w.send('POST', '/login/2fa', { body: { code } });
    assert.equal(ok.status, 200, ok.text);
    assert.equal((await w.send('GET', '/dashboard')).status, 200);

    // The same code again, in the same 30 s: refused (a code works once).
    const x = new Visitor(s.url);
    await x.login('two@example.com', PASSWORD);
    await x.page('/login/2fa');
    assert.equal((await x.send('POST', '/login/2fa', { body: { code } })).status, 401);
    // A backup code instead, typed in capitals without its hyphen: once.
    const backup = codes[0]!.replace('-', '').toUpperCase();
    assert.equal((await x.send('POST', '/login/2fa', { body: { code: backup } })).status, 200);
    const y = new Visitor(s.url);
    await y.login('two@example.com', PASSWORD);
    await y.page('/login/2fa');
    assert.equal((await y.send('POST', '/login/2fa', { body: { code: codes[0]! } })).status, 401);

    // Five minutes after the password: the login restarts; a second before, it
    // still completes.
    const q = new Visitor(s.url);
    await q.login('two@example.com', PASSWORD);
    await q.page('/login/2fa');
    const z = new Visitor(s.url);
    await z.login('two@example.com', PASSWORD);
    await z.page('/login/2fa');
    s.clock.advance(5 * 60_000 - 1000);
    const inTime = await q.send('POST', '/login/2fa', {
      body: { code: totpCode(secret, s.clock.now()) },
    });
    assert.equal(inTime.status, 200, inTime.text);
    s.clock.advance(1000);
    const late = await z.send('POST', '/login/2fa', {
      body: { code: totpCode(secret, s.clock.now()) },
    });
    assert.equal(late.status, 401);
    assert.equal(errorCode(late), 'login_expired');
    const page = await z.send('GET', '/login/2fa');
    assert.equal(page.status, 302);
    assert.equal(page.location, '/login?expired=1');
  });

  it('wrong codes are rate limited: after 5 in 5 minutes even a right one waits', async () => {
    await user(s, 'limit@example.com');
    const v = new Visitor(s.url);
    await v.login('limit@example.com', PASSWORD);
    const { secret } = await enable(v); // one wrong code spent
    s.clock.advance(5 * 60_000);
    const w = new Visitor(s.url);
    await w.login('limit@example.com', PASSWORD);
    await w.page('/login/2fa');
    for (let i = 0; i < 5; i++) {
      assert.equal((await w.send('POST', '/login/2fa', { body: { code: '000000' } })).status, 401);
    }
    const limited = await w.send('POST', '/login/2fa', {
      body: { code: totpCode(secret, s.clock.now()) },
    });
    assert.equal(limited.status, 429);
    assert.equal(errorCode(limited), 'rate_limit_exceeded');
    assert.ok(Number(limited.headers['retry-after']) > 0);
    // A second before the wrong ones are 5 minutes old: still refused.
    s.clock.advance(5 * 60_000 - 1000);
    await w.login('limit@example.com', PASSWORD);
    await w.page('/login/2fa');
    const still = await w.send('POST', '/login/2fa', {
      body: { code: totpCode(secret, s.clock.now()) },
    });
    assert.equal(still.status, 429);
    // Once they are older than 5 minutes, the right code signs in. (The pending
    // login has ended by then: start it again.)
    s.clock.advance(1000);
    await w.login('limit@example.com', PASSWORD);
    await w.page('/login/2fa');
    const ok = await w.send('POST', '/login/2fa', {
      body: { code: totpCode(secret, s.clock.now()) },
    });
    assert.equal(ok.status, 200, ok.text);
  });

  it('a sign-in waiting for its code ends when the password changes or is reset', async () => {
    const id = await user(s, 'half@example.com');
    const v = new Visitor(s.url);
    await v.login('half@example.com', PASSWORD);
    const { secret } = await enable(v);
    for (const change of ['reset', 'own'] as const) {
      s.clock.advance(60_000);
      const old = new Visitor(s.url);
      await old.login('half@example.com', change === 'reset' ? PASSWORD : 'set by the operator');
      await old.page('/login/2fa');
      if (change === 'reset') {
        const r = await s.admin('POST', `/users/${id}/password`, {
          password: 'set by the operator',
        });
        assert.equal(r.status, 200, r.text);
      } else {
        const u = new Visitor(s.url);
        await u.login('half@example.com', 'set by the operator');
        await u.page('/login/2fa');
        s.clock.advance(30_000);
        const in2 = await u.send('POST', '/login/2fa', {
          body: { code: totpCode(secret, s.clock.now()) },
        });
        assert.equal(in2.status, 200, in2.text);
        await u.page('/account');
        const c = await u.send('POST', '/account/password', {
          body: { current_password: 'set by the operator', password: 'changed by the user' },
        });
        assert.equal(c.status, 200, c.text);
      }
      s.clock.advance(30_000);
      const late = await old.send('POST', '/login/2fa', {
        body: { code: totpCode(secret, s.clock.now()) },
      });
      assert.equal(late.status, 401, `${change}: ${late.text}`);
      assert.equal(errorCode(late), 'login_expired');
      assert.equal((await old.send('GET', '/dashboard')).status, 302);
    }
  });

  it('a code checked just before an operator reset opens no session', async () => {
    const id = await user(s, 'racecode@example.com');
    const v = new Visitor(s.url);
    await v.login('racecode@example.com', PASSWORD);
    const { secret } = await enable(v);
    s.clock.advance(30_000);
    const w = new Visitor(s.url);
    assert.equal(await w.login('racecode@example.com', PASSWORD), '/login/2fa');
    await w.page('/login/2fa');
    // The reset lands between the code check and the session's opening.
    const accounts = s.services.dashboard.accounts;
    const check = accounts.checkCode.bind(accounts);
    accounts.checkCode = async (userId, code) => {
      const kind = await check(userId, code);
      const r = await s.admin('POST', `/users/${id}/password`, { password: 'set by the operator' });
      assert.equal(r.status, 200, r.text);
      return kind;
    };
    const r = await w
      .send('POST', '/login/2fa', { body: { code: totpCode(secret, s.clock.now()) } })
      .finally(() => {
        accounts.checkCode = check;
      });
    assert.equal(r.status, 401, r.text);
    assert.equal(errorCode(r), 'login_expired');
    assert.equal((await w.send('GET', '/dashboard')).status, 302, 'no session survives the reset');
  });

  it('wrong codes sent at once: still only 5 are checked', async () => {
    await user(s, 'burst@example.com');
    const v = new Visitor(s.url);
    await v.login('burst@example.com', PASSWORD);
    await enable(v); // one wrong code spent
    s.clock.advance(5 * 60_000);
    const w = new Visitor(s.url);
    await w.login('burst@example.com', PASSWORD);
    await w.page('/login/2fa');
    // A slower user lookup (as with PGlite in its worker thread, or a remote
    // PostgreSQL) lets concurrent checks interleave where they can.
    const accounts = s.services.dashboard.accounts;
    const lookup = accounts.user.bind(accounts);
    accounts.user = async (id) => {
      await new Promise((r) => setTimeout(r, 10));
      return lookup(id);
    };
    const answers = await Promise.all(
      Array.from({ length: 30 }, () => w.send('POST', '/login/2fa', { body: { code: '000000' } })),
    ).finally(() => {
      accounts.user = lookup;
    });
    const statuses = answers.map((a) => a.status);
    assert.equal(statuses.filter((x) => x === 401).length, 5, statuses.join(','));
    assert.equal(statuses.filter((x) => x === 429).length, 25);
  });

  it('disabling and regenerating need a TOTP code; disabling removes the seed and the backup codes', async () => {
    await user(s, 'off@example.com');
    const v = new Visitor(s.url);
    await v.login('off@example.com', PASSWORD);
    const { secret, codes } = await enable(v);
    await v.page('/account');
    // A backup code is not a TOTP code here.
    s.clock.advance(30_000);
    const byBackup = await v.send('POST', '/account/2fa/disable', { body: { code: codes[1]! } });
    assert.equal(byBackup.status, 401);
    const regen = await v.send('POST', '/account/backup-codes', {
      body: { code: totpCode(secret, s.clock.now()) },
    });
    assert.equal(regen.status, 200, regen.text);
    const fresh = (regen.json.reveal as string[]).slice(1);
    assert.equal(fresh.length, 10);
    // The earlier codes stopped working; a new one works.
    const w = new Visitor(s.url);
    await w.login('off@example.com', PASSWORD);
    await w.page('/login/2fa');
    assert.equal((await w.send('POST', '/login/2fa', { body: { code: codes[2]! } })).status, 401);
    assert.equal((await w.send('POST', '/login/2fa', { body: { code: fresh[0]! } })).status, 200);

    s.clock.advance(30_000);
    const off = await v.send('POST', '/account/2fa/disable', {
      body: { code: totpCode(secret, s.clock.now()) },
    });
    assert.equal(off.status, 200, off.text);
    const [row] = await s.services.store.db
      .select()
      .from(tables.users)
      .where(eq(tables.users.email, 'off@example.com'));
    assert.equal(row!.totpSecret, null);
    const left = await s.services.store.db
      .select()
      .from(tables.userBackupCodes)
      .where(eq(tables.userBackupCodes.userId, row!.id));
    assert.equal(left.length, 0);
    assert.equal(await new Visitor(s.url).login('off@example.com', PASSWORD), '/dashboard');
  });

  it('seeds are sealed at rest; no password, seed or code reaches the log', async () => {
    await user(s, 'rest@example.com');
    const v = new Visitor(s.url);
    await v.login('rest@example.com', PASSWORD);
    const { secret, codes } = await enable(v);
    const [row] = await s.services.store.db
      .select()
      .from(tables.users)
      .where(eq(tables.users.email, 'rest@example.com'));
    assert.ok(row!.totpSecret);
    assert.match(row!.totpSecret!, /^v1\./);
    assert.ok(!row!.totpSecret!.includes(secret));
    assert.ok(row!.passwordHash!.startsWith('scrypt$'));
    const log = s.logs.join('\n');
    for (const secretValue of [PASSWORD, secret, ...codes]) {
      assert.ok(!log.includes(secretValue), 'a secret in the log');
    }
  });
});
