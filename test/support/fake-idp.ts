/**
 * An OpenID Connect provider for tests: a real HTTP server on 127.0.0.1 that
 * speaks the authorization code flow as a real provider does, so the client
 * (src/dashboard/oidc.ts) is tested through openid-client's own requests and
 * checks rather than against mocks of them.
 *
 * - `/.well-known/openid-configuration`: discovery metadata for its issuer.
 * - `/authorize`: no login page; it logs in at once as the user chosen with
 *   `nextLogin(sub)` (else the first user) and redirects to `redirect_uri` with
 *   `code`, the given `state` and `iss` (RFC 9207, which it advertises, so the
 *   client's mix-up check is exercised). PKCE with S256 is required, as the
 *   code's binding to the verifier is what a stolen code is checked against.
 * - `/token`: `client_secret_basic` or `client_secret_post` (whichever of
 *   `authMethods` are enabled; both by default), the code (single use, 60 s),
 *   the `redirect_uri` it was issued for and the PKCE verifier are all checked;
 *   the answer carries an RS256 ID token signed with a key made here by jose.
 * - `/jwks`: the public half of that key.
 *
 * `refuseNext(error)` makes the next `/authorize` answer `error=<error>`;
 * `tamperNextToken(kind)` makes the next ID token wrong in one way (signed by
 * another key under the same `kid`, wrong nonce, wrong audience, or expired an
 * hour ago) so each of the client's checks is seen to reject it.
 */
import { createHash, randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { exportJWK, generateKeyPair, SignJWT, type JWK } from 'jose';

export interface FakeUser {
  sub: string;
  email: string;
  email_verified?: boolean;
  name?: string;
}

export type TokenTamper = 'signature' | 'nonce' | 'audience' | 'expired';
export type TokenAuthMethod = 'client_secret_basic' | 'client_secret_post';

export interface FakeIdpOptions {
  users?: FakeUser[];
  /** Listen on this port (e.g. one a test first saw closed); a free one by default. */
  port?: number;
  /** The token endpoint's client authentication methods; both by default. */
  authMethods?: TokenAuthMethod[];
  /** The registered client; random by default (e.g. fixed to configure a client before the provider is up). */
  clientId?: string;
  clientSecret?: string;
}

export interface FakeIdp {
  issuer: string;
  clientId: string;
  clientSecret: string;
  /** The next `/authorize` logs in as this user. */
  nextLogin(sub: string): void;
  /** The next `/authorize` redirects back with `error=<error>` and no code. */
  refuseNext(error: string): void;
  /** The next ID token issued is wrong in this one way. */
  tamperNextToken(kind: TokenTamper): void;
  /** Paths of every request received, in order (no query strings: they carry codes). */
  requests: string[];
  close(): Promise<void>;
}

const KID = 'fake-idp-1';
const CODE_TTL_MS = 60_000;
const TOKEN_TTL_S = 300;

const DEFAULT_USERS: FakeUser[] = [
  { sub: 'user-1', email: 'ada@example.com', email_verified: true, name: 'Ada Lovelace' },
];

interface IssuedCode {
  user: FakeUser;
  clientId: string;
  redirectUri: string;
  codeChallenge: string;
  nonce: string | undefined;
  expiresAt: number;
}

const random = (bytes = 24) => randomBytes(bytes).toString('base64url');

function json(res: ServerResponse, status: number, body: unknown, headers = {}): void {
  res.writeHead(status, {
    'content-type': 'application/json',
    'cache-control': 'no-store',
    ...headers,
  });
  res.end(JSON.stringify(body));
}

/** An RFC 6749 §5.2 error answer from the token endpoint. */
function tokenError(res: ServerResponse, status: number, error: string, description: string): void {
  json(
    res,
    status,
    { error, error_description: description },
    status === 401 ? { 'www-authenticate': 'Basic realm="fake-idp"' } : {},
  );
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

/** The client's credentials from `Authorization: Basic` (RFC 6749 §2.3.1: form-encoded, then base64). */
function basicCredentials(header: string | undefined): { id: string; secret: string } | null {
  const match = /^Basic ([A-Za-z0-9+/=]+)$/.exec(header ?? '');
  if (!match?.[1]) return null;
  const decoded = Buffer.from(match[1], 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  if (colon < 0) return null;
  const unform = (s: string) => decodeURIComponent(s.replace(/\+/g, ' '));
  try {
    return { id: unform(decoded.slice(0, colon)), secret: unform(decoded.slice(colon + 1)) };
  } catch {
    return null;
  }
}

export async function startFakeIdp(opts: FakeIdpOptions = {}): Promise<FakeIdp> {
  const users = opts.users ?? DEFAULT_USERS;
  if (users.length === 0) throw new Error('the fake IdP needs at least one user');
  const authMethods = opts.authMethods ?? ['client_secret_basic', 'client_secret_post'];
  const clientId = opts.clientId ?? `client-${random(6)}`;
  const clientSecret = opts.clientSecret ?? random();

  const { privateKey, publicKey } = await generateKeyPair('RS256');
  // Same kid, different key: the client finds "the" key and the signature fails.
  const { privateKey: forgerKey } = await generateKeyPair('RS256');
  const publicJwk: JWK = { ...(await exportJWK(publicKey)), kid: KID, alg: 'RS256', use: 'sig' };

  const codes = new Map<string, IssuedCode>();
  const requests: string[] = [];
  let nextSub: string | null = null;
  let refusal: string | null = null;
  let tamper: TokenTamper | null = null;
  let issuer = '';

  function metadata() {
    return {
      issuer,
      authorization_endpoint: `${issuer}/authorize`,
      token_endpoint: `${issuer}/token`,
      jwks_uri: `${issuer}/jwks`,
      response_types_supported: ['code'],
      subject_types_supported: ['public'],
      id_token_signing_alg_values_supported: ['RS256'],
      scopes_supported: ['openid', 'email', 'profile'],
      token_endpoint_auth_methods_supported: authMethods,
      code_challenge_methods_supported: ['S256'],
      grant_types_supported: ['authorization_code'],
      claims_supported: [
        'sub',
        'iss',
        'aud',
        'exp',
        'iat',
        'nonce',
        'email',
        'email_verified',
        'name',
      ],
      authorization_response_iss_parameter_supported: true,
    };
  }

  function authorize(url: URL, res: ServerResponse): void {
    const q = url.searchParams;
    const redirectUri = q.get('redirect_uri');
    // Without a valid client and redirect_uri there is nowhere safe to send the
    // user back to, so (as real providers do) the error is shown here instead.
    if (q.get('client_id') !== clientId || !redirectUri || !/^https?:\/\//.test(redirectUri)) {
      res.writeHead(400, { 'content-type': 'text/plain' });
      res.end('invalid client_id or redirect_uri');
      return;
    }
    const back = new URL(redirectUri);
    const state = q.get('state');
    if (state !== null) back.searchParams.set('state', state);
    back.searchParams.set('iss', issuer);
    const redirect = (params: Record<string, string>) => {
      for (const [k, v] of Object.entries(params)) back.searchParams.set(k, v);
      res.writeHead(302, { location: back.href });
      res.end();
    };

    if (refusal !== null) {
      const error = refusal;
      refusal = null;
      redirect({ error, error_description: 'refused by the test' });
      return;
    }
    const scopes = (q.get('scope') ?? '').split(' ');
    const challenge = q.get('code_challenge');
    if (q.get('response_type') !== 'code') {
      redirect({ error: 'unsupported_response_type' });
    } else if (!scopes.includes('openid')) {
      redirect({ error: 'invalid_scope', error_description: 'openid scope required' });
    } else if (!challenge || q.get('code_challenge_method') !== 'S256') {
      redirect({ error: 'invalid_request', error_description: 'PKCE with S256 is required' });
    } else {
      const sub = nextSub;
      nextSub = null;
      const user = users.find((u) => u.sub === sub) ?? users[0];
      if (!user) throw new Error('unreachable: users is not empty');
      const code = random();
      codes.set(code, {
        user,
        clientId,
        redirectUri,
        codeChallenge: challenge,
        nonce: q.get('nonce') ?? undefined,
        expiresAt: Date.now() + CODE_TTL_MS,
      });
      redirect({ code });
    }
  }

  async function idToken(issued: IssuedCode): Promise<string> {
    const kind = tamper;
    tamper = null;
    const now = Math.floor(Date.now() / 1000);
    const iat = kind === 'expired' ? now - 7200 : now;
    const claims: Record<string, unknown> = {
      email: issued.user.email,
      email_verified: issued.user.email_verified ?? false,
    };
    if (issued.user.name !== undefined) claims.name = issued.user.name;
    if (issued.nonce !== undefined) {
      claims.nonce = kind === 'nonce' ? `${issued.nonce}-other` : issued.nonce;
    }
    return new SignJWT(claims)
      .setProtectedHeader({ alg: 'RS256', kid: KID, typ: 'JWT' })
      .setIssuer(issuer)
      .setSubject(issued.user.sub)
      .setAudience(kind === 'audience' ? 'someone-else' : issued.clientId)
      .setIssuedAt(iat)
      .setExpirationTime(iat + (kind === 'expired' ? 3600 : TOKEN_TTL_S))
      .sign(kind === 'signature' ? forgerKey : privateKey);
  }

  async function token(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const form = new URLSearchParams(await readBody(req));
    const basic = basicCredentials(req.headers.authorization);
    const post = form.has('client_secret')
      ? { id: form.get('client_id') ?? '', secret: form.get('client_secret') ?? '' }
      : null;
    // RFC 6749 §2.3: a client must not use more than one method in a request.
    if (basic && post) return tokenError(res, 400, 'invalid_request', 'two client auth methods');
    const method: TokenAuthMethod | null = basic
      ? 'client_secret_basic'
      : post
        ? 'client_secret_post'
        : null;
    const creds = basic ?? post;
    if (
      method === null ||
      creds === null ||
      !authMethods.includes(method) ||
      creds.id !== clientId ||
      creds.secret !== clientSecret
    ) {
      return tokenError(res, 401, 'invalid_client', 'client authentication failed');
    }
    if (form.get('grant_type') !== 'authorization_code') {
      return tokenError(res, 400, 'unsupported_grant_type', 'only authorization_code');
    }
    const code = form.get('code') ?? '';
    const issued = codes.get(code);
    // Single use: a code is spent on its first presentation, right or wrong.
    codes.delete(code);
    if (!issued || issued.expiresAt < Date.now() || issued.clientId !== creds.id) {
      return tokenError(res, 400, 'invalid_grant', 'unknown, used or expired code');
    }
    if (form.get('redirect_uri') !== issued.redirectUri) {
      return tokenError(res, 400, 'invalid_grant', 'redirect_uri differs from the authorization');
    }
    const verifier = form.get('code_verifier') ?? '';
    const challenge = createHash('sha256').update(verifier, 'ascii').digest('base64url');
    if (challenge !== issued.codeChallenge) {
      return tokenError(res, 400, 'invalid_grant', 'PKCE verification failed');
    }
    json(res, 200, {
      access_token: random(),
      token_type: 'Bearer',
      expires_in: TOKEN_TTL_S,
      scope: 'openid email profile',
      id_token: await idToken(issued),
    });
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', issuer);
    requests.push(url.pathname);
    const route = `${req.method ?? 'GET'} ${url.pathname}`;
    switch (route) {
      case 'GET /.well-known/openid-configuration':
        return json(res, 200, metadata(), { 'cache-control': 'max-age=60' });
      case 'GET /authorize':
        return authorize(url, res);
      case 'POST /token':
        return token(req, res);
      case 'GET /jwks':
        return json(res, 200, { keys: [publicJwk] });
      default:
        return json(res, 404, { error: 'not_found' });
    }
  }

  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (!res.headersSent) json(res, 500, { error: 'server_error' });
      else res.destroy();
      console.error('fake-idp:', err);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 0, '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  issuer = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;

  return {
    issuer,
    clientId,
    clientSecret,
    requests,
    nextLogin(sub) {
      if (!users.some((u) => u.sub === sub)) throw new Error(`fake IdP has no user ${sub}`);
      nextSub = sub;
    },
    refuseNext(error) {
      refusal = error;
    },
    tamperNextToken(kind) {
      tamper = kind;
    },
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.close((err) => (err ? reject(err) : resolve()));
        // openid-client's fetch keeps connections alive; they must not hold close() open.
        server.closeAllConnections();
      }),
  };
}
