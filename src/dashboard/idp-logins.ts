/**
 * Identity-provider logins in flight, kept server-side (in the database, so the
 * callback may reach any instance) and keyed by their OAuth `state`: the nonce
 * and the PKCE verifier never travel through the browser. A login is taken once
 * (deleted as it is read) and is good for 10 minutes.
 */
import { eq, lte } from 'drizzle-orm';
import type { Clock } from '../runtime/clock.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';
import type { PendingLogin } from './oidc.js';

const { idpLogins: L } = tables;

export class IdpLogins {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
  ) {}

  /** Keeps a login begun by `IdentityProviders.begin`; `linkUserId` when a signed-in user links. */
  async save(login: PendingLogin, linkUserId: string | null, ttlMs: number): Promise<void> {
    const now = this.clock.now();
    await this.db.delete(L).where(lte(L.expiresAt, new Date(now)));
    await this.db.insert(L).values({
      state: login.state,
      provider: login.provider,
      nonce: login.nonce,
      codeVerifier: login.codeVerifier,
      linkUserId,
      expiresAt: new Date(now + ttlMs),
      createdAt: new Date(now),
    });
  }

  /** The login with this state at this provider, once; null if unknown, used or expired. */
  async take(
    state: string,
    provider: string,
  ): Promise<{ login: PendingLogin; linkUserId: string | null } | null> {
    const [row] = await this.db.delete(L).where(eq(L.state, state)).returning();
    if (!row || row.provider !== provider || this.clock.now() >= row.expiresAt.getTime()) {
      return null;
    }
    return {
      login: {
        state: row.state,
        nonce: row.nonce,
        codeVerifier: row.codeVerifier,
        provider: row.provider,
      },
      linkUserId: row.linkUserId,
    };
  }
}
