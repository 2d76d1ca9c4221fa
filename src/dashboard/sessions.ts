/**
 * Dashboard sessions and pending logins, in the database so every instance
 * behind a load balancer sees the same ones.
 *
 * A session is a random 32-byte token in a cookie (Secure, HttpOnly); the row
 * holds its SHA-256, so a database read does not yield usable cookies. Its end
 * is min(last activity + 480 min, start + 1440 min) (spec: each activity extends
 * the session by 480 minutes of idle timeout; the maximum lifetime is 1440
 * minutes regardless of activity). Every activity is recorded: skipping the write
 * for one soon after the last recorded one (as this once did, within a minute)
 * leaves the end at the earlier activity's, so the session ended up to a minute
 * before 480 idle minutes had passed. A dashboard request is a page or a form's
 * action, so the write is one small update per user action.
 *
 * A login that needs its second factor is a challenge: the password (or the
 * identity provider) was right, the TOTP or backup code is still due, and after
 * 5 minutes the login restarts (spec). Its token is in its own cookie.
 *
 * Every session carries its CSRF token, which each page embeds in its
 * `csrf-token` meta tag and state-changing requests send back as X-CSRF-Token.
 * Password changes and resets end all of a user's sessions and pending
 * two-factor sign-ins (`closeAll`). A sign-in that checked the old password or
 * opened its challenge before the change must not come out of it with a session:
 * `open` and `openChallenge` take a `stillValid` check made after their row is
 * written (the password is the one checked; the challenge is still there to
 * take), and delete the row again when it fails. Whatever order the statements
 * of the two interleave in, either the check sees the change or `closeAll`
 * deletes the new row.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { and, eq, lte } from 'drizzle-orm';
import type { Clock } from '../runtime/clock.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';

const { dashboardSessions: S, loginChallenges: C } = tables;

export const SESSION_IDLE_MS = 480 * 60_000;
export const SESSION_MAX_MS = 1440 * 60_000;
export const LOGIN_CHALLENGE_MS = 5 * 60_000;

export interface Opened {
  token: string;
  csrfToken: string;
  expiresAt: Date;
}

export interface ActiveSession {
  userId: string;
  csrfToken: string;
  expiresAt: Date;
}

export function newToken(): string {
  return randomBytes(32).toString('base64url');
}

export function tokenHash(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

/**
 * Constant-time equality of two tokens (CSRF). The lengths compared are the
 * bytes': a sent value with a character outside ASCII can be as long as the
 * token in characters and longer in bytes, and timingSafeEqual throws on that.
 */
export function sameToken(a: string | undefined, b: string): boolean {
  if (typeof a !== 'string') return false;
  const sent = Buffer.from(a);
  const expected = Buffer.from(b);
  return sent.length === expected.length && timingSafeEqual(sent, expected);
}

export class Sessions {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
  ) {}

  /** A new session; null (and none left) when `stillValid`, asked after the row is in, says no. */
  async open(userId: string, stillValid?: () => Promise<boolean>): Promise<Opened | null> {
    const now = this.clock.now();
    const token = newToken();
    const csrfToken = newToken();
    const expiresAt = new Date(now + SESSION_IDLE_MS);
    // A session whose browser never comes back is deleted by no `resolve`: the
    // user's ended ones go with each new one (by the user index, no table scan).
    await this.db.delete(S).where(and(eq(S.userId, userId), lte(S.expiresAt, new Date(now))));
    await this.db.insert(S).values({
      tokenHash: tokenHash(token),
      userId,
      csrfToken,
      lastSeenAt: new Date(now),
      expiresAt,
      createdAt: new Date(now),
    });
    if (stillValid && !(await stillValid())) {
      await this.close(token);
      return null;
    }
    return { token, csrfToken, expiresAt };
  }

  /** The live session behind a cookie, its activity recorded; null when absent or ended. */
  async resolve(token: string | undefined): Promise<ActiveSession | null> {
    if (!token) return null;
    const hash = tokenHash(token);
    const [row] = await this.db.select().from(S).where(eq(S.tokenHash, hash)).limit(1);
    if (!row) return null;
    const now = this.clock.now();
    if (now >= row.expiresAt.getTime()) {
      await this.db.delete(S).where(eq(S.tokenHash, hash));
      return null;
    }
    let expiresAt = row.expiresAt;
    if (now > row.lastSeenAt.getTime()) {
      expiresAt = new Date(
        Math.min(now + SESSION_IDLE_MS, row.createdAt.getTime() + SESSION_MAX_MS),
      );
      await this.db
        .update(S)
        .set({ lastSeenAt: new Date(now), expiresAt })
        .where(eq(S.tokenHash, hash));
    }
    return { userId: row.userId, csrfToken: row.csrfToken, expiresAt };
  }

  async close(token: string | undefined): Promise<void> {
    if (token) await this.db.delete(S).where(eq(S.tokenHash, tokenHash(token)));
  }

  /** Ends every session of a user (password change, admin password reset). */
  /**
   * Ends every session of the user, and every sign-in waiting for its second
   * factor: one opened with the old password must not become a session after the
   * password changed.
   */
  async closeAll(userId: string): Promise<void> {
    // Challenges first: a sign-in that still took its challenge (`takeChallenge`)
    // had written its session before, so the delete of sessions after this sees it.
    await this.db.delete(C).where(eq(C.userId, userId));
    await this.db.delete(S).where(eq(S.userId, userId));
  }

  /** A new challenge; null (and none left) when `stillValid`, asked after the row is in, says no. */
  async openChallenge(userId: string, stillValid?: () => Promise<boolean>): Promise<Opened | null> {
    const now = this.clock.now();
    const token = newToken();
    const csrfToken = newToken();
    const expiresAt = new Date(now + LOGIN_CHALLENGE_MS);
    // Old, ended challenges go with each new one: the table stays small.
    await this.db.delete(C).where(lte(C.expiresAt, new Date(now)));
    await this.db.insert(C).values({
      tokenHash: tokenHash(token),
      userId,
      csrfToken,
      expiresAt,
      createdAt: new Date(now),
    });
    if (stillValid && !(await stillValid())) {
      await this.closeChallenge(token);
      return null;
    }
    return { token, csrfToken, expiresAt };
  }

  /** The pending login behind a cookie; null when absent or older than 5 minutes. */
  async challenge(
    token: string | undefined,
  ): Promise<{ userId: string; csrfToken: string } | null> {
    if (!token) return null;
    const [row] = await this.db
      .select()
      .from(C)
      .where(and(eq(C.tokenHash, tokenHash(token))))
      .limit(1);
    if (!row) return null;
    if (this.clock.now() >= row.expiresAt.getTime()) {
      await this.closeChallenge(token);
      return null;
    }
    return { userId: row.userId, csrfToken: row.csrfToken };
  }

  async closeChallenge(token: string): Promise<void> {
    await this.db.delete(C).where(eq(C.tokenHash, tokenHash(token)));
  }

  /** Ends a challenge; false when it had already ended (a password change, another tab). */
  async takeChallenge(token: string): Promise<boolean> {
    const taken = await this.db
      .delete(C)
      .where(eq(C.tokenHash, tokenHash(token)))
      .returning({ hash: C.tokenHash });
    return taken.length === 1;
  }
}
