/**
 * The internal proxy token (spec, Dashboard: "after validating a session cookie,
 * the dashboard frontend mints a short-lived signed JWT (shared secret) and
 * forwards it to the router, which resolves user, project and scopes from it. It
 * is accepted only on that internal path and never used by API clients.")
 *
 * HS256 over a key derived (HKDF-SHA-256) from the dashboard key that dashboard
 * and API instances share, so one secret serves the seeds at rest and the token.
 * Claims: `iss` switchyard-dashboard, `aud` switchyard-router, `sub` the user
 * (`usr_…`), `prj` the project (`proj_…`), `scp` the scopes the user's role gives,
 * `role`, `iat`, `exp` 60 s later. One token per call, for one project: a token
 * that leaks is worth a minute on one project. Verification takes the time from
 * the injected clock. The router accepts it on `/internal/v1/*` only
 * (internal-routes.ts); API-key routes only ever look for API keys.
 */
import { hkdfSync } from 'node:crypto';
import type * as Jose from 'jose';
import { ServiceError } from '../errors/index.js';
import { ROLES, type Role } from '../exec/users.js';
import type { Scope } from '../keys/index.js';
import type { Clock } from '../runtime/clock.js';

export const INTERNAL_ISSUER = 'switchyard-dashboard';
export const INTERNAL_AUDIENCE = 'switchyard-router';
export const INTERNAL_TOKEN_TTL_S = 60;

export interface InternalClaims {
  user: string;
  project: string;
  role: Role;
  scopes: Scope[];
}

/**
 * What a project role may do through the dashboard: owners and admins manage
 * keys and webhooks (with the scopes a key of theirs could grant) and decide
 * approvals; approvers decide approvals; viewers read.
 */
export function scopesOf(role: Role): Scope[] {
  if (role === 'owner' || role === 'admin') return ['inference', 'management', 'execution'];
  if (role === 'approver') return ['execution'];
  return [];
}

export function deriveKey(master: Buffer, purpose: string): Buffer {
  return Buffer.from(hkdfSync('sha256', master, Buffer.alloc(0), `switchyard/${purpose}`, 32));
}

/**
 * jose, loaded at the first dashboard call: the API role alone never holds it
 * (about 1 MiB of heap; docs/BENCHMARKS.md, "A thread's arena").
 */
let jose: Promise<typeof Jose> | undefined;
function loadJose(): Promise<typeof Jose> {
  jose ??= import('jose');
  return jose;
}

export class InternalTokens {
  private readonly key: Buffer;

  constructor(
    master: Buffer,
    private readonly clock: Clock,
  ) {
    this.key = deriveKey(master, 'internal-proxy-token');
  }

  async mint(c: InternalClaims): Promise<string> {
    const { SignJWT } = await loadJose();
    const now = Math.floor(this.clock.now() / 1000);
    return new SignJWT({ prj: c.project, role: c.role, scp: c.scopes })
      .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
      .setIssuer(INTERNAL_ISSUER)
      .setAudience(INTERNAL_AUDIENCE)
      .setSubject(c.user)
      .setIssuedAt(now)
      .setExpirationTime(now + INTERNAL_TOKEN_TTL_S)
      .sign(this.key);
  }

  /** The claims of a valid token; 401 `authentication_required` otherwise. */
  async verify(token: string | undefined): Promise<InternalClaims> {
    if (!token) {
      throw new ServiceError('authentication_required', {
        message: 'The internal path needs the dashboard token.',
      });
    }
    const { jwtVerify, errors } = await loadJose();
    try {
      const { payload } = await jwtVerify(token, this.key, {
        issuer: INTERNAL_ISSUER,
        audience: INTERNAL_AUDIENCE,
        algorithms: ['HS256'],
        currentDate: new Date(this.clock.now()),
        maxTokenAge: INTERNAL_TOKEN_TTL_S,
      });
      const role = payload.role;
      const scopes = payload.scp;
      if (
        typeof payload.sub !== 'string' ||
        typeof payload.prj !== 'string' ||
        typeof role !== 'string' ||
        !(ROLES as readonly string[]).includes(role) ||
        !Array.isArray(scopes) ||
        !scopes.every((x) => typeof x === 'string')
      ) {
        throw new Error('claims');
      }
      return {
        user: payload.sub,
        project: payload.prj,
        role: role as Role,
        scopes: scopes as Scope[],
      };
    } catch (err) {
      throw new ServiceError('authentication_required', {
        message:
          err instanceof errors.JWTExpired
            ? 'The dashboard token has expired.'
            : 'The dashboard token is not valid.',
      });
    }
  }
}
