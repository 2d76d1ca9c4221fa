/**
 * Two router instances sharing PostgreSQL and Redis, as a browser sees them over
 * HTTP: the two-factor limit (5 wrong codes in 5 minutes) and the password limit
 * (10 wrong passwords in 15 minutes) hold for the pair, however the answers are
 * spread over the instances and sent at once; right answers are never counted,
 * not even while they are being checked, and a check that fails for another
 * reason gives its try back.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { totpCode } from '../../src/dashboard/totp.js';
import { errorCode, Visitor } from '../support/dashboard.js';
import {
  freshDatabase,
  startTestServer,
  type TestDatabase,
  type TestServer,
} from '../support/harness.js';

const dbUrl = process.env.TEST_DATABASE_URL;
const redisUrl = process.env.TEST_REDIS_URL;
if (process.env.CI === 'true' && (!dbUrl || !redisUrl)) {
  throw new Error('CI=true needs TEST_DATABASE_URL and TEST_REDIS_URL');
}

const PASSWORD = 'correct horse battery staple';
const MIN = 60_000;

/** The same browser, pointed at another instance (the same cookies and CSRF token). */
function sameBrowser(v: Visitor, base: string): Visitor {
  const o = new Visitor(base);
  for (const [k, val] of v.cookies) o.cookies.set(k, val);
  o.csrf = v.csrf;
  return o;
}

describe(
  'dashboard attempt limits across instances',
  { skip: dbUrl && redisUrl ? false : 'needs PostgreSQL and Redis' },
  () => {
    let db: TestDatabase;
    let a: TestServer;
    let b: TestServer;
    let servers: TestServer[];
    before(async () => {
      db = await freshDatabase('postgres');
      // One sealing key for both, as a deployment must have.
      const env = {
        REDIS_URL: redisUrl!,
        SWITCHYARD_SECRET_KEY: randomBytes(32).toString('base64url'),
      };
      a = await startTestServer({ shared: { url: db.url! }, env });
      b = await startTestServer({ shared: { url: db.url! }, env });
      servers = [a, b];
    });
    after(async () => {
      await a.close();
      await b.close();
      await db.drop();
    });

    /** Both instances on one clock reading (the fake clocks are separate). */
    function advance(ms: number): void {
      for (const s of servers) s.clock.advance(ms);
    }

    /**
     * Slower user lookups (as with a remote PostgreSQL under load) on both
     * instances, so that concurrent checks interleave wherever they can.
     */
    async function slowLookups<T>(run: () => Promise<T>): Promise<T> {
      const undo = servers.map((s) => {
        const accounts = s.services.dashboard.accounts;
        const lookup = accounts.user.bind(accounts);
        accounts.user = async (id) => {
          await new Promise((r) => setTimeout(r, 10));
          return lookup(id);
        };
        return () => {
          accounts.user = lookup;
        };
      });
      try {
        return await run();
      } finally {
        for (const u of undo) u();
      }
    }

    /** A user with 2FA on, signed in with the password on `a`, waiting for the code. */
    async function twoFactorUser(email: string): Promise<{
      secret: string;
      backup: string[];
      /** Signs in with the password (on `at`, a by default): the same browser on a and on b. */
      login: (at?: TestServer) => Promise<[Visitor, Visitor]>;
    }> {
      const r = await a.admin('POST', '/users', { name: 'u', email, password: PASSWORD });
      assert.equal(r.status, 201, r.text);
      const v = new Visitor(a.url);
      await v.login(email, PASSWORD);
      await v.page('/account');
      const setup = await v.send('POST', '/account/2fa/setup', { body: {} });
      assert.equal(setup.status, 200, setup.text);
      const secret = (setup.json.reveal as string[]).find((l) => l.startsWith('Key: '))!.slice(5);
      const on = await v.send('POST', '/account/2fa/enable', {
        body: { code: totpCode(secret, a.clock.now()) },
      });
      assert.equal(on.status, 200, on.text);
      const backup = (on.json.reveal as string[]).slice(1);
      return {
        secret,
        backup,
        login: async (at = a) => {
          const w = new Visitor(at.url);
          assert.equal(await w.login(email, PASSWORD), '/login/2fa');
          await w.page('/login/2fa');
          return [sameBrowser(w, a.url), sameBrowser(w, b.url)];
        },
      };
    }

    it('wrong codes sent at once to both instances: exactly 5 are checked, the rest 429', async () => {
      const u = await twoFactorUser('both@example.com');
      const [onA, onB] = await u.login();
      const answers = await slowLookups(() =>
        Promise.all(
          Array.from({ length: 30 }, (_, i) =>
            (i % 2 ? onB : onA).send('POST', '/login/2fa', { body: { code: '000000' } }),
          ),
        ),
      );
      const statuses = answers.map((x) => x.status);
      assert.equal(statuses.filter((x) => x === 401).length, 5, statuses.join(','));
      assert.equal(statuses.filter((x) => x === 429).length, 25, statuses.join(','));
      // Locked on both instances, right code included, until the window moves on.
      advance(30_000);
      for (const v of [onA, onB]) {
        const right = await v.send('POST', '/login/2fa', {
          body: { code: u.backup.pop()! },
        });
        assert.equal(right.status, 429, right.text);
        assert.equal(errorCode(right), 'rate_limit_exceeded');
        assert.ok(Number(right.headers['retry-after']) > 1);
      }
      advance(5 * MIN);
      const [again] = await u.login();
      const ok = await again.send('POST', '/login/2fa', {
        body: { code: totpCode(u.secret, a.clock.now()) },
      });
      assert.equal(ok.status, 200, ok.text);
    });

    it('right codes are never counted: 4 wrong ones and right ones at once, then the 5th wrong is checked', async () => {
      const u = await twoFactorUser('right@example.com');
      const browsers = await Promise.all(Array.from({ length: 4 }, () => u.login()));
      // The 4 wrong codes at once, over both instances.
      const wrong = await slowLookups(() =>
        Promise.all(
          browsers.map(([onA, onB], i) =>
            (i % 2 ? onB : onA).send('POST', '/login/2fa', { body: { code: '000000' } }),
          ),
        ),
      );
      assert.deepEqual(
        wrong.map((x) => x.status),
        [401, 401, 401, 401],
      );
      // Right ones, one after another on alternating instances: none is refused.
      for (let i = 0; i < 6; i++) {
        const [onA, onB] = await u.login();
        const right = await (i % 2 ? onB : onA).send('POST', '/login/2fa', {
          body: { code: u.backup[i]! },
        });
        assert.equal(right.status, 200, `right code ${i}: ${right.text}`);
      }
      // The 5th wrong code is still checked (401), the 6th is refused.
      const [onA, onB] = await u.login();
      assert.equal(
        (await onB.send('POST', '/login/2fa', { body: { code: '000000' } })).status,
        401,
      );
      assert.equal(
        (await onA.send('POST', '/login/2fa', { body: { code: '000000' } })).status,
        429,
      );
    });

    it('while a try is being checked on one instance, the one that would exceed the limit waits 1 s', async () => {
      const u = await twoFactorUser('inflight@example.com');
      const [onA, onB] = await u.login();
      for (let i = 0; i < 4; i++) {
        const r = await (i % 2 ? onB : onA).send('POST', '/login/2fa', { body: { code: '1' } });
        assert.equal(r.status, 401, r.text);
      }
      // A right code held on instance a between its slot and its answer.
      const accounts = a.services.dashboard.accounts;
      const lookup = accounts.user.bind(accounts);
      let reached!: () => void;
      const inside = new Promise<void>((r) => (reached = r));
      let letGo!: () => void;
      const held = new Promise<void>((r) => (letGo = r));
      accounts.user = async (id) => {
        reached();
        await held;
        return lookup(id);
      };
      const first = onA.send('POST', '/login/2fa', { body: { code: u.backup[0]! } });
      await inside;
      const [, other] = await u.login(b);
      const waits = await other.send('POST', '/login/2fa', { body: { code: u.backup[1]! } });
      accounts.user = lookup;
      letGo();
      assert.equal(waits.status, 429, waits.text);
      assert.equal(errorCode(waits), 'rate_limit_exceeded');
      assert.equal(waits.headers['retry-after'], '1');
      assert.equal((await first).status, 200);
      // Its slot is back: the same code, a second later, signs in.
      advance(1000);
      const ok = await other.send('POST', '/login/2fa', { body: { code: u.backup[1]! } });
      assert.equal(ok.status, 200, ok.text);
    });

    it('a check that fails for another reason gives its try back', async () => {
      const u = await twoFactorUser('other@example.com');
      // A third instance whose sealing key differs (a misconfigured rolling deploy):
      // every code check there throws while opening the seed.
      const c = await startTestServer({
        shared: { url: db.url! },
        env: { REDIS_URL: redisUrl!, SWITCHYARD_SECRET_KEY: randomBytes(32).toString('base64url') },
      });
      try {
        const [onA] = await u.login();
        const onC = sameBrowser(onA, c.url);
        for (let i = 0; i < 8; i++) {
          const r = await onC.send('POST', '/login/2fa', {
            body: { code: totpCode(u.secret, c.clock.now()) },
          });
          assert.ok(r.status >= 500, `${r.status} ${r.text}`);
        }
      } finally {
        await c.close();
      }
      // None of them counted: 4 wrong codes are still checked, then a right one signs in.
      const [onA, onB] = await u.login();
      for (let i = 0; i < 4; i++) {
        const r = await (i % 2 ? onB : onA).send('POST', '/login/2fa', {
          body: { code: '000000' },
        });
        assert.equal(r.status, 401, r.text);
      }
      advance(30_000);
      const ok = await onB.send('POST', '/login/2fa', {
        body: { code: totpCode(u.secret, b.clock.now()) },
      });
      assert.equal(ok.status, 200, ok.text);
    });

    it('wrong passwords sent at once to both instances: exactly 10 are checked', async () => {
      // Counted per address in Redis, which outlives the run: an address of its own.
      const email = `pw-${randomBytes(4).toString('hex')}@example.com`;
      const r = await a.admin('POST', '/users', {
        name: 'p',
        email,
        password: PASSWORD,
      });
      assert.equal(r.status, 201, r.text);
      const pages = await Promise.all(
        Array.from({ length: 30 }, async (_, i) => {
          const v = new Visitor(i % 2 ? b.url : a.url);
          await v.page('/login');
          return v;
        }),
      );
      const answers = await Promise.all(
        pages.map((v) => v.send('POST', '/login', { body: { email, password: 'wrong!' } })),
      );
      const statuses = answers.map((x) => x.status);
      assert.equal(statuses.filter((x) => x === 401).length, 10, statuses.join(','));
      assert.equal(statuses.filter((x) => x === 429).length, 20, statuses.join(','));
    });
  },
);
