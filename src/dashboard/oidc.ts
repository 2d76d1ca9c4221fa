/**
 * Identity-provider sign-in for the dashboard, the protocol half (spec:
 * "Identity-provider sign-in"): the OpenID Connect authorization code flow with
 * PKCE, as a client, through openid-client. Accounts, sessions and the routes
 * are the caller's; this module only turns a provider's answer into a verified
 * identity. It is for dashboard sign-in only: nothing here yields API access.
 *
 * Flow, per sign-in:
 * 1. `begin(name)` (route `/auth/<name>`): the provider's metadata is
 *    discovered (once per provider; a failure is not cached, so the next
 *    attempt retries), and fresh `state`, `nonce` and PKCE `code_verifier` are
 *    drawn. The caller keeps the returned `PendingLogin` server-side, keyed by
 *    `state`, and redirects the browser to `url`.
 * 2. The provider authenticates the user and redirects to
 *    `<redirectBase>/auth/<name>/callback?code=…&state=…`.
 * 3. `complete(name, callbackUrl, pending)`: openid-client checks the `state`
 *    (CSRF: the callback belongs to a login this server began), the `iss`
 *    parameter when the provider advertises it (RFC 9207, mix-up), then trades
 *    the code at the token endpoint with the client secret and the PKCE
 *    verifier (a code stolen from the redirect is useless without it), and
 *    validates the ID token: issuer, audience, expiry, `nonce` (the token was
 *    minted for this login, not replayed from another) and, because
 *    `enableNonRepudiationChecks` is on, its signature against the provider's
 *    JWKS. OIDC lets a client skip the signature when the token came straight
 *    from the token endpoint over TLS; it is checked anyway because it costs
 *    one cached JWKS fetch and does not lean on TLS alone.
 *
 * The identity is the pair (provider, `sub`): `sub` is the provider's stable
 * key for the user, whereas the e-mail address can change or be reassigned.
 * `emailVerified` says whether the provider vouches for the address; linking
 * to an existing account by e-mail must require it, or anyone who can create an
 * unverified account with someone else's address at the provider takes over
 * that person's Switchyard account.
 *
 * Errors are `IdpError` with one `code`, decided here so the routes only map
 * it to a page: `unknown_provider`; `provider_unreachable` (network failure or
 * timeout, or discovery metadata that cannot be used); `login_refused`
 * (the provider answered `error=…`, or any check of the exchange failed).
 * Messages never carry the client secret, the code, tokens or the library's
 * error causes (which hold the callback parameters, code included), so they
 * can be logged and shown as they are.
 */
import type * as Oidc from 'openid-client';
import { ConfigError } from '../config/index.js';

export interface IdpConfig {
  /** The path segment in `/auth/<name>`. */
  name: string;
  /** The issuer identifier; discovery reads `<issuer>/.well-known/openid-configuration`. */
  issuer: string;
  clientId: string;
  clientSecret: string;
  scopes: string[];
}

/** What the caller keeps server-side between `begin` and `complete` (keyed by `state`). */
export interface PendingLogin {
  state: string;
  nonce: string;
  codeVerifier: string;
  provider: string;
}

export interface IdpIdentity {
  provider: string;
  /** The provider's stable identifier of the user (`sub`). */
  subject: string;
  email: string | null;
  /** True only when the provider asserts it; required before linking by e-mail. */
  emailVerified: boolean;
  name: string | null;
}

export type IdpErrorCode =
  'unknown_provider' | 'provider_unreachable' | 'login_refused' | 'not_configured';

export class IdpError extends Error {
  override readonly name = 'IdpError';
  constructor(
    readonly code: IdpErrorCode,
    message: string,
  ) {
    super(message);
  }
}

export interface IdentityProvidersOptions {
  /** The dashboard's public origin (and path prefix, if any), e.g. https://dash.example.com. */
  redirectBase: string;
  /** Limit for each request to a provider (s). Someone is waiting on a redirect. */
  timeoutSeconds?: number;
  /** The HTTP client for requests to providers; the global fetch by default. */
  fetch?: Oidc.CustomFetch;
}

const DEFAULT_SCOPES = ['openid', 'email', 'profile'];
const DEFAULT_TIMEOUT_SECONDS = 10;
const NAME_PATTERN = /^[a-z0-9][a-z0-9-]{0,31}$/;
/** RFC 6749 §A.4: scope tokens are printable ASCII without space, `"` or `\`. */
const SCOPE_PATTERN = /^[\x21\x23-\x5b\x5d-\x7e]+$/;
/** RFC 6749 §A.7: what an `error` code may contain; anything else is not echoed. */
const ERROR_CODE_PATTERN = /^[\x20\x21\x23-\x5b\x5d-\x7e]{1,64}$/;
const LOOPBACK_HOSTS = new Set(['127.0.0.1', 'localhost']);
const CONFIG_KEYS = new Set(['name', 'issuer', 'client_id', 'client_secret', 'scopes']);

/** Loopback issuers may be plain HTTP: the fake provider in tests, a local one in development. */
function isLoopbackHttp(url: URL): boolean {
  return url.protocol === 'http:' && LOOPBACK_HOSTS.has(url.hostname);
}

function nonEmptyString(value: unknown): value is string {
  return typeof value === 'string' && value.trim().length > 0;
}

/**
 * SWITCHYARD_IDPS: a JSON array of
 * `{"name","issuer","client_id","client_secret","scopes"?}`. Unknown keys are
 * refused so that a misspelt one (`clientId`) fails at start, not at the first
 * sign-in. Messages name the entry and the field, never the secret's value.
 */
export function parseIdps(value: string | undefined): IdpConfig[] {
  if (value === undefined || value.trim() === '') return [];
  let raw: unknown;
  try {
    raw = JSON.parse(value);
  } catch {
    // V8's message quotes the text around the fault, which may be the secret.
    throw new ConfigError('SWITCHYARD_IDPS is not valid JSON');
  }
  if (!Array.isArray(raw)) throw new ConfigError('SWITCHYARD_IDPS must be a JSON array');

  const seen = new Set<string>();
  return raw.map((entry: unknown, i): IdpConfig => {
    const at = `SWITCHYARD_IDPS[${i}]`;
    if (typeof entry !== 'object' || entry === null || Array.isArray(entry)) {
      throw new ConfigError(`${at} must be an object`);
    }
    const e = entry as Record<string, unknown>;
    for (const key of Object.keys(e)) {
      if (!CONFIG_KEYS.has(key)) throw new ConfigError(`${at} has an unknown key "${key}"`);
    }

    const { name } = e;
    if (typeof name !== 'string' || !NAME_PATTERN.test(name)) {
      throw new ConfigError(
        `${at}.name must be 1-32 characters of a-z, 0-9 and "-", not starting with "-"`,
      );
    }
    const where = `${at} ("${name}")`;
    if (seen.has(name)) throw new ConfigError(`${where}: the name is used twice`);
    seen.add(name);

    if (typeof e.issuer !== 'string') throw new ConfigError(`${where}.issuer must be a URL`);
    let issuer: URL;
    try {
      issuer = new URL(e.issuer);
    } catch {
      throw new ConfigError(`${where}.issuer is not a URL`);
    }
    if (issuer.protocol !== 'https:' && !isLoopbackHttp(issuer)) {
      throw new ConfigError(
        `${where}.issuer must use https:// (http:// only for 127.0.0.1 or localhost)`,
      );
    }
    // OpenID Connect Discovery §2: an issuer has no query or fragment, and
    // credentials in it would be sent to the provider on every request.
    if (issuer.search || issuer.hash || issuer.username || issuer.password) {
      throw new ConfigError(`${where}.issuer must not have credentials, a query or a fragment`);
    }

    if (!nonEmptyString(e.client_id)) {
      throw new ConfigError(`${where}.client_id must be a non-empty string`);
    }
    if (!nonEmptyString(e.client_secret)) {
      throw new ConfigError(`${where}.client_secret must be a non-empty string`);
    }

    let scopes = DEFAULT_SCOPES;
    if (e.scopes !== undefined) {
      if (
        !Array.isArray(e.scopes) ||
        !e.scopes.every((s): s is string => typeof s === 'string' && SCOPE_PATTERN.test(s))
      ) {
        throw new ConfigError(`${where}.scopes must be an array of scope names`);
      }
      // Without `openid` the provider answers with plain OAuth: no ID token, no identity.
      if (!e.scopes.includes('openid')) {
        throw new ConfigError(`${where}.scopes must include "openid"`);
      }
      scopes = [...new Set(e.scopes)];
    }

    return {
      name,
      issuer: e.issuer,
      clientId: e.client_id,
      clientSecret: e.client_secret,
      scopes: [...scopes],
    };
  });
}

/** A request to a provider that got no HTTP answer (refused, reset, DNS, timeout). */
class NetworkFailure extends Error {}

/**
 * openid-client wraps what fetch throws, so failures are told apart by
 * tagging them at the source rather than by matching library messages.
 */
function reachedNetworkFailure(err: unknown): boolean {
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    if (e instanceof NetworkFailure) return true;
  }
  return false;
}

/**
 * The most specific fixed-text reason in a library error. oauth4webapi's
 * messages name claims and parameters, not values; causes that are not Errors
 * (response bodies, callback parameters) are never read.
 */
function reasonOf(err: unknown): string {
  let reason = 'unexpected error';
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    if (e.message && e.message !== 'something went wrong') reason = e.message;
  }
  return reason;
}

/**
 * Client authentication at the token endpoint: `client_secret_basic`, the
 * OpenID default (Discovery §3: assumed when the provider lists no methods),
 * unless the provider lists only `client_secret_post`.
 */
function clientSecretAuth(client: typeof Oidc, secret: string): Oidc.ClientAuth {
  const basic = client.ClientSecretBasic(secret);
  const post = client.ClientSecretPost(secret);
  return (as, c, body, headers) => {
    const methods = as.token_endpoint_auth_methods_supported;
    const usePost =
      methods !== undefined &&
      !methods.includes('client_secret_basic') &&
      methods.includes('client_secret_post');
    (usePost ? post : basic)(as, c, body, headers);
  };
}

function usableAuthMethods(metadata: Oidc.ServerMetadata): boolean {
  const methods = metadata.token_endpoint_auth_methods_supported;
  return (
    methods === undefined ||
    methods.includes('client_secret_basic') ||
    methods.includes('client_secret_post')
  );
}

/**
 * openid-client, loaded at the first sign-in: a router without identity providers,
 * or one nobody signs in to, never holds it (with oauth4webapi, about 1 MiB of heap).
 */
let openidClient: Promise<typeof Oidc> | undefined;
function loadOpenidClient(): Promise<typeof Oidc> {
  openidClient ??= import('openid-client');
  return openidClient;
}

export class IdentityProviders {
  private readonly configs = new Map<string, IdpConfig>();
  /**
   * One discovery per provider, shared by concurrent sign-ins; bounded by the
   * number of configured providers. A rejected discovery is removed so the
   * next sign-in retries instead of failing until restart.
   */
  private readonly discovered = new Map<string, Promise<Oidc.Configuration>>();
  private readonly redirectBase: string;
  private readonly timeoutSeconds: number;
  private readonly fetch: Oidc.CustomFetch;

  constructor(configs: IdpConfig[], opts: IdentityProvidersOptions) {
    for (const config of configs) {
      if (this.configs.has(config.name)) {
        throw new ConfigError(`identity provider "${config.name}" is configured twice`);
      }
      this.configs.set(config.name, config);
    }
    let base: URL;
    try {
      base = new URL(opts.redirectBase);
    } catch {
      throw new ConfigError(`redirectBase is not a URL: ${opts.redirectBase}`);
    }
    if (base.protocol !== 'https:' && base.protocol !== 'http:') {
      throw new ConfigError(`redirectBase must be http(s): ${opts.redirectBase}`);
    }
    if (base.search || base.hash) {
      throw new ConfigError(`redirectBase must not have a query or fragment: ${opts.redirectBase}`);
    }
    this.redirectBase = base.href.replace(/\/+$/, '');
    this.timeoutSeconds = opts.timeoutSeconds ?? DEFAULT_TIMEOUT_SECONDS;
    const inner = opts.fetch ?? ((url, init) => fetch(url, init));
    this.fetch = async (url, init) => {
      try {
        return await inner(url, init);
      } catch (err) {
        throw new NetworkFailure('no answer', { cause: err });
      }
    };
  }

  /** Configured provider names, in configuration order. */
  names(): string[] {
    return [...this.configs.keys()];
  }

  /** `<redirectBase>/auth/<name>/callback`: the redirect_uri registered at the provider. */
  callbackUrl(name: string): string {
    return `${this.redirectBase}/auth/${name}/callback`;
  }

  async begin(name: string): Promise<{ url: string; pending: PendingLogin }> {
    const config = await this.configuration(name);
    const client = await loadOpenidClient();
    const pending: PendingLogin = {
      state: client.randomState(),
      nonce: client.randomNonce(),
      codeVerifier: client.randomPKCECodeVerifier(),
      provider: name,
    };
    const url = client.buildAuthorizationUrl(config, {
      redirect_uri: this.callbackUrl(name),
      scope: this.config(name).scopes.join(' '),
      state: pending.state,
      nonce: pending.nonce,
      code_challenge: await client.calculatePKCECodeChallenge(pending.codeVerifier),
      code_challenge_method: 'S256',
    });
    return { url: url.href, pending };
  }

  async complete(name: string, callbackUrl: URL, pending: PendingLogin): Promise<IdpIdentity> {
    this.config(name);
    // A login begun with one provider must not be finished by another's callback.
    if (pending.provider !== name) {
      throw new IdpError('login_refused', `sign-in with "${name}" does not match the login begun`);
    }
    const config = await this.configuration(name);
    const client = await loadOpenidClient();
    // openid-client sends the callback URL, without its query, as redirect_uri;
    // the token endpoint requires it to equal the one in the authorization
    // request byte for byte. Behind a proxy the URL the routes see may differ
    // (host, scheme), so the registered one is rebuilt with the callback's query.
    const current = new URL(this.callbackUrl(name));
    current.search = callbackUrl.search;

    let tokens: Oidc.TokenEndpointResponse & Oidc.TokenEndpointResponseHelpers;
    try {
      tokens = await client.authorizationCodeGrant(config, current, {
        expectedState: pending.state,
        expectedNonce: pending.nonce,
        pkceCodeVerifier: pending.codeVerifier,
        idTokenExpected: true,
      });
    } catch (err) {
      throw this.exchangeError(client, name, err);
    }
    const claims = tokens.claims();
    if (!claims || !nonEmptyString(claims.sub) || claims.sub.length > 255) {
      throw new IdpError('login_refused', `sign-in with "${name}" returned no usable subject`);
    }
    const email = nonEmptyString(claims.email) ? claims.email : null;
    const displayName = nonEmptyString(claims.name) ? claims.name : null;
    return {
      provider: name,
      subject: claims.sub,
      email,
      // Some providers send the string "true"; anything else is not a verification.
      emailVerified:
        email !== null && (claims.email_verified === true || claims.email_verified === 'true'),
      name: displayName,
    };
  }

  private config(name: string): IdpConfig {
    const config = this.configs.get(name);
    if (!config) throw new IdpError('unknown_provider', `no identity provider named "${name}"`);
    return config;
  }

  private configuration(name: string): Promise<Oidc.Configuration> {
    const idp = this.config(name);
    const cached = this.discovered.get(name);
    if (cached) return cached;
    const pending = this.discover(idp);
    this.discovered.set(name, pending);
    pending.catch(() => {
      if (this.discovered.get(name) === pending) this.discovered.delete(name);
    });
    return pending;
  }

  private async discover(idp: IdpConfig): Promise<Oidc.Configuration> {
    const client = await loadOpenidClient();
    const issuer = new URL(idp.issuer);
    const execute = [client.enableNonRepudiationChecks];
    // Only ever for loopback issuers, which parseIdps alone lets be http://.
    if (isLoopbackHttp(issuer)) execute.unshift(client.allowInsecureRequests);
    let config: Oidc.Configuration;
    try {
      config = await client.discovery(
        issuer,
        idp.clientId,
        undefined,
        clientSecretAuth(client, idp.clientSecret),
        { execute, timeout: this.timeoutSeconds, [client.customFetch]: this.fetch },
      );
    } catch (err) {
      const why = reachedNetworkFailure(err)
        ? 'could not be reached'
        : `returned unusable discovery metadata (${reasonOf(err)})`;
      throw new IdpError('provider_unreachable', `identity provider "${idp.name}" ${why}`);
    }
    const metadata = config.serverMetadata();
    if (!metadata.authorization_endpoint || !metadata.token_endpoint || !metadata.jwks_uri) {
      throw new IdpError(
        'provider_unreachable',
        `identity provider "${idp.name}" lacks an authorization, token or JWKS endpoint`,
      );
    }
    if (!usableAuthMethods(metadata)) {
      throw new IdpError(
        'provider_unreachable',
        `identity provider "${idp.name}" accepts neither client_secret_basic nor client_secret_post`,
      );
    }
    return config;
  }

  private exchangeError(client: typeof Oidc, name: string, err: unknown): IdpError {
    if (reachedNetworkFailure(err)) {
      return new IdpError(
        'provider_unreachable',
        `identity provider "${name}" could not be reached`,
      );
    }
    if (err instanceof client.AuthorizationResponseError) {
      const code = ERROR_CODE_PATTERN.test(err.error) ? err.error : 'invalid';
      return new IdpError('login_refused', `sign-in with "${name}" was refused: error=${code}`);
    }
    // A 401 with a challenge: the provider did not accept our client_id and
    // secret. Still a refused sign-in for the user; the message is for operators.
    if (err instanceof client.WWWAuthenticateChallengeError) {
      return new IdpError(
        'login_refused',
        `sign-in with "${name}" failed: the token endpoint answered ${err.status} ` +
          '(client authentication failed: check client_id and client_secret)',
      );
    }
    if (err instanceof client.ResponseBodyError) {
      const code = ERROR_CODE_PATTERN.test(err.error) ? err.error : 'invalid';
      return new IdpError(
        'login_refused',
        `sign-in with "${name}" failed: the token endpoint answered ${err.status} error=${code}`,
      );
    }
    return new IdpError('login_refused', `sign-in with "${name}" failed: ${reasonOf(err)}`);
  }
}
