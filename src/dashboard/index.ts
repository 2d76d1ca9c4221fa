/**
 * The dashboard (spec: user and account boundary): sign-in with a password and
 * TOTP, or with an identity provider; cookie sessions; CSRF; and the internal
 * proxy token through which it acts on the router for the signed-in user.
 * docs/DASHBOARD.md has the whole picture.
 *
 * One key (SWITCHYARD_SECRET_KEY, else a file in the data directory) seals TOTP
 * seeds and signs the internal token, each with its own derived key; dashboard
 * and API instances must share it.
 */
import { createHmac } from 'node:crypto';
import type { Config } from '../config/index.js';
import type { Limits } from '../http/limits.js';
import type { Clock } from '../runtime/clock.js';
import type { Db } from '../store/index.js';
import { Accounts } from './accounts.js';
import { loadSecretKey, SecretBox } from './at-rest.js';
import { IdpLogins } from './idp-logins.js';
import { deriveKey, InternalTokens } from './internal-token.js';
import { IdentityProviders, parseIdps, type IdpConfig } from './oidc.js';
import { Sessions } from './sessions.js';

export { internalRoutes } from './internal-routes.js';

export interface Dashboard {
  sessions: Sessions;
  accounts: Accounts;
  tokens: InternalTokens;
  idps: IdpConfig[];
  idpLogins: IdpLogins;
  /**
   * The providers, with callbacks under the configured public URL; in development
   * without one, under the origin the request came to (the last one seen: a
   * development machine has one).
   */
  providers(requestOrigin: string): IdentityProviders;
  /** Where the key came from, for the start banner. */
  keySource: 'env' | 'file' | 'memory';
  /**
   * The signature of an error message a redirect shows on the next page
   * (`?error=…&sig=…`): only messages the router wrote are shown, never text a link
   * from elsewhere put in the URL ("your account is locked, call …").
   */
  noticeSig(message: string): string;
}

export function createDashboard(o: {
  config: Config;
  db: Db;
  clock: Clock;
  limits: Limits;
}): Dashboard {
  const { key, source } = loadSecretKey({
    fromEnv: o.config.secretKey,
    dataDir: o.config.dataDir,
  });
  const sessions = new Sessions(o.db, o.clock);
  const box = new SecretBox(deriveKey(key, 'totp-seeds'));
  const noticeKey = deriveKey(key, 'page-notices');
  const idps = parseIdps(o.config.idps);
  let current: { base: string; providers: IdentityProviders } | null = null;
  return {
    sessions,
    accounts: new Accounts(o.db, o.clock, box, sessions, o.limits),
    tokens: new InternalTokens(key, o.clock),
    idps,
    idpLogins: new IdpLogins(o.db, o.clock),
    providers(requestOrigin) {
      const base = o.config.publicBaseUrl ?? requestOrigin;
      if (!current || current.base !== base) {
        current = { base, providers: new IdentityProviders(idps, { redirectBase: base }) };
      }
      return current.providers;
    },
    keySource: source,
    noticeSig: (message) =>
      createHmac('sha256', noticeKey).update(message).digest('base64url').slice(0, 22),
  };
}
