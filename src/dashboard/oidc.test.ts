import assert from 'node:assert/strict';
import { createServer as createHttpServer } from 'node:http';
import { createServer as createTcpServer, type AddressInfo, type Socket } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { startFakeIdp, type FakeIdp, type TokenTamper } from '../../test/support/fake-idp.js';
import {
  IdentityProviders,
  IdpError,
  parseIdps,
  type IdpConfig,
  type IdpErrorCode,
  type PendingLogin,
} from './oidc.js';

const REDIRECT_BASE = 'https://dash.example.com';

const ADA = {
  sub: 'user-ada',
  email: 'ada@example.com',
  email_verified: true,
  name: 'Ada Lovelace',
};
const BOB = { sub: 'user-bob', email: 'bob@example.com' };

function configFor(idp: FakeIdp, name = 'fake'): IdpConfig {
  return {
    name,
    issuer: idp.issuer,
    clientId: idp.clientId,
    clientSecret: idp.clientSecret,
    scopes: ['openid', 'email', 'profile'],
  };
}

/** Plays the browser: asks the provider's /authorize and returns where it is sent back to. */
async function authorize(url: string): Promise<URL> {
  const res = await fetch(url, { redirect: 'manual' });
  assert.equal(res.status, 302, `authorize answered ${res.status}`);
  const location = res.headers.get('location');
  assert.ok(location, 'authorize redirects');
  return new URL(location);
}

async function signIn(providers: IdentityProviders, name = 'fake') {
  const { url, pending } = await providers.begin(name);
  const callback = await authorize(url);
  return { callback, pending, identity: await providers.complete(name, callback, pending) };
}

async function rejectsWith(
  promise: Promise<unknown>,
  code: IdpErrorCode,
  forbidden: string[] = [],
): Promise<IdpError> {
  let caught: unknown;
  await assert.rejects(promise, (err: unknown) => {
    caught = err;
    return true;
  });
  assert.ok(caught instanceof IdpError, `expected an IdpError, got ${String(caught)}`);
  assert.equal(caught.code, code, caught.message);
  for (const secret of forbidden) {
    assert.ok(!caught.message.includes(secret), `message leaks a secret: ${caught.message}`);
  }
  return caught;
}

/** A loopback port with nothing listening on it (just released by the OS). */
async function closedPort(): Promise<number> {
  const server = createTcpServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

describe('IdentityProviders against a real HTTP provider', () => {
  let idp: FakeIdp;
  let providers: IdentityProviders;

  before(async () => {
    idp = await startFakeIdp({ users: [ADA, BOB] });
    providers = new IdentityProviders([configFor(idp), configFor(idp, 'other')], {
      redirectBase: REDIRECT_BASE,
    });
  });
  after(() => idp.close());

  it('lists the configured providers in order', () => {
    assert.deepEqual(providers.names(), ['fake', 'other']);
  });

  it('signs in: begin → authorize → callback → identity', async () => {
    const { url, pending } = await providers.begin('fake');
    const authUrl = new URL(url);
    assert.equal(authUrl.origin + authUrl.pathname, `${idp.issuer}/authorize`);
    const q = authUrl.searchParams;
    assert.equal(q.get('response_type'), 'code');
    assert.equal(q.get('client_id'), idp.clientId);
    assert.equal(q.get('redirect_uri'), `${REDIRECT_BASE}/auth/fake/callback`);
    assert.equal(q.get('scope'), 'openid email profile');
    assert.equal(q.get('state'), pending.state);
    assert.equal(q.get('nonce'), pending.nonce);
    assert.equal(q.get('code_challenge_method'), 'S256');
    assert.ok(q.get('code_challenge'));
    // The verifier stays with us; only its hash travels through the browser.
    assert.ok(!url.includes(pending.codeVerifier));
    assert.equal(pending.provider, 'fake');

    const callback = await authorize(url);
    assert.equal(callback.origin + callback.pathname, `${REDIRECT_BASE}/auth/fake/callback`);
    assert.equal(callback.searchParams.get('state'), pending.state);
    assert.ok(callback.searchParams.get('code'));

    const identity = await providers.complete('fake', callback, pending);
    assert.deepEqual(identity, {
      provider: 'fake',
      subject: ADA.sub,
      email: ADA.email,
      emailVerified: true,
      name: ADA.name,
    });
  });

  it('each begin draws a fresh state, nonce and verifier', async () => {
    const a = await providers.begin('fake');
    const b = await providers.begin('fake');
    assert.notEqual(a.pending.state, b.pending.state);
    assert.notEqual(a.pending.nonce, b.pending.nonce);
    assert.notEqual(a.pending.codeVerifier, b.pending.codeVerifier);
  });

  it('logs in as the user the provider chose; unverified e-mail and missing name come through', async () => {
    idp.nextLogin(BOB.sub);
    const { identity } = await signIn(providers);
    assert.deepEqual(identity, {
      provider: 'fake',
      subject: BOB.sub,
      email: BOB.email,
      emailVerified: false,
      name: null,
    });
  });

  it('discovers once per provider and reuses it', async () => {
    const fresh = new IdentityProviders([configFor(idp)], { redirectBase: REDIRECT_BASE });
    const discoveries = () =>
      idp.requests.filter((p) => p === '/.well-known/openid-configuration').length;
    const before = discoveries();
    await Promise.all([fresh.begin('fake'), fresh.begin('fake')]);
    await signIn(fresh);
    assert.equal(discoveries() - before, 1);
  });

  it('exchanges with the registered redirect_uri even when the callback arrived at another host', async () => {
    const { url, pending } = await providers.begin('fake');
    const callback = await authorize(url);
    const seenByRoute = new URL(`http://10.0.0.7:8080/auth/fake/callback${callback.search}`);
    const identity = await providers.complete('fake', seenByRoute, pending);
    assert.equal(identity.subject, ADA.sub);
  });

  it('a code is good for one exchange only', async () => {
    const { callback, pending } = await signIn(providers);
    await rejectsWith(providers.complete('fake', callback, pending), 'login_refused', [
      callback.searchParams.get('code') ?? '?',
      idp.clientSecret,
    ]);
  });

  it('an unknown provider is unknown_provider on both legs', async () => {
    await rejectsWith(providers.begin('nope'), 'unknown_provider');
    const { pending } = await providers.begin('fake');
    await rejectsWith(
      providers.complete('nope', new URL(`${REDIRECT_BASE}/auth/nope/callback`), pending),
      'unknown_provider',
    );
  });

  it('the provider refusing (error=… on the callback) is login_refused', async () => {
    idp.refuseNext('access_denied');
    const { url, pending } = await providers.begin('fake');
    const callback = await authorize(url);
    assert.equal(callback.searchParams.get('error'), 'access_denied');
    assert.equal(callback.searchParams.get('code'), null);
    const err = await rejectsWith(providers.complete('fake', callback, pending), 'login_refused');
    assert.match(err.message, /error=access_denied/);
  });

  it('a callback with the state of another login is login_refused', async () => {
    const first = await providers.begin('fake');
    const second = await providers.begin('fake');
    const callback = await authorize(first.url);
    await rejectsWith(providers.complete('fake', callback, second.pending), 'login_refused', [
      callback.searchParams.get('code') ?? '?',
      first.pending.state,
    ]);
  });

  it('a login begun with one provider cannot be completed as another', async () => {
    const { url, pending } = await providers.begin('fake');
    const callback = await authorize(url);
    await rejectsWith(providers.complete('other', callback, pending), 'login_refused');
  });

  it('a wrong PKCE verifier is login_refused', async () => {
    const { url, pending } = await providers.begin('fake');
    const callback = await authorize(url);
    const forged: PendingLogin = { ...pending, codeVerifier: 'x'.repeat(43) };
    await rejectsWith(providers.complete('fake', callback, forged), 'login_refused');
  });

  const tampered: Array<[TokenTamper, string]> = [
    ['signature', 'signed by another key'],
    ['nonce', 'for another nonce'],
    ['audience', 'for another audience'],
    ['expired', 'that has expired'],
  ];
  for (const [kind, what] of tampered) {
    it(`an ID token ${what} is login_refused`, async () => {
      const { url, pending } = await providers.begin('fake');
      const callback = await authorize(url);
      idp.tamperNextToken(kind);
      await rejectsWith(providers.complete('fake', callback, pending), 'login_refused', [
        callback.searchParams.get('code') ?? '?',
        idp.clientSecret,
      ]);
      // Only that token was bad: the next sign-in goes through.
      assert.equal((await signIn(providers)).identity.subject, ADA.sub);
    });
  }

  it('a wrong client secret is login_refused and the secret is not in the message', async () => {
    const wrong = new IdentityProviders([{ ...configFor(idp), clientSecret: 'not-the-secret' }], {
      redirectBase: REDIRECT_BASE,
    });
    const { url, pending } = await wrong.begin('fake');
    const callback = await authorize(url);
    const err = await rejectsWith(wrong.complete('fake', callback, pending), 'login_refused', [
      'not-the-secret',
    ]);
    assert.match(err.message, /client authentication failed/);
  });

  it('discovery metadata for another issuer is provider_unreachable', async () => {
    // Same server, but "localhost" is not the issuer it names in its metadata.
    const issuer = idp.issuer.replace('127.0.0.1', 'localhost');
    const mixed = new IdentityProviders([{ ...configFor(idp), issuer }], {
      redirectBase: REDIRECT_BASE,
    });
    const err = await rejectsWith(mixed.begin('fake'), 'provider_unreachable');
    assert.match(err.message, /discovery/);
  });
});

describe('IdentityProviders: client authentication methods', () => {
  for (const method of ['client_secret_basic', 'client_secret_post'] as const) {
    it(`signs in with a provider that accepts only ${method}`, async () => {
      const idp = await startFakeIdp({ authMethods: [method] });
      try {
        const providers = new IdentityProviders([configFor(idp)], { redirectBase: REDIRECT_BASE });
        const { identity } = await signIn(providers);
        assert.equal(identity.email, 'ada@example.com');
      } finally {
        await idp.close();
      }
    });
  }
});

describe('IdentityProviders: an unreachable provider', () => {
  it('is provider_unreachable, and discovery is retried once it is up', async () => {
    const port = await closedPort();
    const client = { clientId: 'dash', clientSecret: 'dash-secret' };
    const providers = new IdentityProviders(
      [
        {
          name: 'late',
          issuer: `http://127.0.0.1:${port}`,
          ...client,
          scopes: ['openid', 'email'],
        },
      ],
      { redirectBase: REDIRECT_BASE },
    );
    const err = await rejectsWith(providers.begin('late'), 'provider_unreachable', [
      client.clientSecret,
    ]);
    assert.match(err.message, /could not be reached/);

    const idp = await startFakeIdp({ port, ...client });
    try {
      const { identity } = await signIn(providers, 'late');
      assert.equal(identity.subject, 'user-1');
    } finally {
      await idp.close();
    }
  });

  it('going down between begin and the callback is provider_unreachable', async () => {
    const idp = await startFakeIdp();
    const providers = new IdentityProviders([configFor(idp)], { redirectBase: REDIRECT_BASE });
    const { url, pending } = await providers.begin('fake');
    const callback = await authorize(url);
    await idp.close();
    await rejectsWith(providers.complete('fake', callback, pending), 'provider_unreachable');
  });

  it('a provider that never answers is provider_unreachable after the timeout', async () => {
    const sockets = new Set<Socket>();
    const silent = createHttpServer(() => {
      // Never answers.
    });
    silent.on('connection', (s: Socket) => sockets.add(s));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const { port } = silent.address() as AddressInfo;
    try {
      const providers = new IdentityProviders(
        [
          {
            name: 'slow',
            issuer: `http://127.0.0.1:${port}`,
            clientId: 'c',
            clientSecret: 's',
            scopes: ['openid'],
          },
        ],
        { redirectBase: REDIRECT_BASE, timeoutSeconds: 0.3 },
      );
      await rejectsWith(providers.begin('slow'), 'provider_unreachable');
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => silent.close(() => resolve()));
    }
  });
});

describe('parseIdps', () => {
  const SECRET = 'very-secret-value';
  const entry = (over: Record<string, unknown> = {}) => ({
    name: 'google',
    issuer: 'https://accounts.google.com',
    client_id: 'id-1',
    client_secret: SECRET,
    ...over,
  });
  const json = (...entries: unknown[]) => JSON.stringify(entries);

  it('no setting is no providers', () => {
    assert.deepEqual(parseIdps(undefined), []);
    assert.deepEqual(parseIdps(''), []);
    assert.deepEqual(parseIdps('  '), []);
    assert.deepEqual(parseIdps('[]'), []);
  });

  it('reads entries, defaulting the scopes', () => {
    assert.deepEqual(
      parseIdps(json(entry(), entry({ name: 'corp-sso', scopes: ['openid', 'email'] }))),
      [
        {
          name: 'google',
          issuer: 'https://accounts.google.com',
          clientId: 'id-1',
          clientSecret: SECRET,
          scopes: ['openid', 'email', 'profile'],
        },
        {
          name: 'corp-sso',
          issuer: 'https://accounts.google.com',
          clientId: 'id-1',
          clientSecret: SECRET,
          scopes: ['openid', 'email'],
        },
      ],
    );
  });

  const accepted: Array<[string, Record<string, unknown>]> = [
    ['http on 127.0.0.1', { issuer: 'http://127.0.0.1:4000' }],
    ['http on localhost', { issuer: 'http://localhost:4000/realms/x' }],
    ['an issuer with a path', { issuer: 'https://login.example.com/tenant-1/v2.0' }],
    ['a 32-character name', { name: 'a'.repeat(32) }],
    ['a digit first', { name: '1password' }],
  ];
  for (const [what, over] of accepted) {
    it(`accepts ${what}`, () => {
      assert.equal(parseIdps(json(entry(over))).length, 1);
    });
  }

  const refused: Array<[string, string, RegExp]> = [
    ['invalid JSON', `[{"client_secret":"${SECRET}",}]`, /not valid JSON/],
    ['a non-array', JSON.stringify(entry()), /must be a JSON array/],
    ['a non-object entry', json('google'), /\[0\] must be an object/],
    ['an unknown key', json(entry({ clientId: 'x' })), /unknown key "clientId"/],
    ['a missing name', json(entry({ name: undefined })), /\.name/],
    ['an upper-case name', json(entry({ name: 'Google' })), /\.name/],
    ['a name with a slash', json(entry({ name: 'a/b' })), /\.name/],
    ['a leading dash', json(entry({ name: '-a' })), /\.name/],
    ['a 33-character name', json(entry({ name: 'a'.repeat(33) })), /\.name/],
    ['a duplicate name', json(entry(), entry()), /\[1\] \("google"\): the name is used twice/],
    ['a missing issuer', json(entry({ issuer: undefined })), /\.issuer/],
    ['a non-URL issuer', json(entry({ issuer: 'accounts.google.com' })), /\.issuer/],
    ['an http issuer', json(entry({ issuer: 'http://accounts.google.com' })), /https:\/\//],
    ['http on another host', json(entry({ issuer: 'http://10.0.0.1' })), /https:\/\//],
    ['an issuer with a query', json(entry({ issuer: 'https://a.example?x=1' })), /query/],
    ['a missing client_id', json(entry({ client_id: undefined })), /\.client_id/],
    ['an empty client_secret', json(entry({ client_secret: '' })), /\.client_secret/],
    ['a numeric client_secret', json(entry({ client_secret: 42 })), /\.client_secret/],
    ['scopes not an array', json(entry({ scopes: 'openid email' })), /\.scopes/],
    ['a scope with a space', json(entry({ scopes: ['openid', 'a b'] })), /\.scopes/],
    ['scopes without openid', json(entry({ scopes: ['email'] })), /"openid"/],
  ];
  for (const [what, value, message] of refused) {
    it(`refuses ${what}, naming the problem and not the secret`, () => {
      assert.throws(
        () => parseIdps(value),
        (err: unknown) => {
          assert.ok(err instanceof Error);
          assert.match(err.message, message);
          assert.match(err.message, /SWITCHYARD_IDPS/);
          assert.ok(!err.message.includes(SECRET), err.message);
          return true;
        },
      );
    });
  }
});
