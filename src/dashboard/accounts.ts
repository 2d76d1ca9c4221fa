/**
 * Dashboard accounts: passwords, TOTP two-factor authentication with backup codes,
 * and identities at providers (spec, Dashboard: user and account boundary).
 *
 * - Password sign-in answers the same way for an unknown e-mail address and a
 *   wrong password, and spends the same scrypt work on both (a fixed dummy hash).
 * - With 2FA on, a right password only opens a 5-minute challenge (sessions.ts);
 *   a TOTP code or an unused backup code completes it. After 5 wrong codes in 5
 *   minutes a user's codes are refused (429) until the window moves on (the shared
 *   limiter, so across instances too; right codes never count), and a TOTP code
 *   is usable once (its time step is recorded).
 * - Setup: a new seed is kept sealed as pending until a code from it verifies;
 *   then it becomes the seed and 10 backup codes are shown once. Disabling, and
 *   regenerating backup codes, need a valid TOTP code; disabling removes the seed
 *   and every backup code. Seeds are sealed at rest (at-rest.ts) with the user's
 *   id as context, so a sealed seed moved to another row does not open.
 * - A password change, and an operator's password reset, end every session.
 * - A provider's identity signs in the user it is linked to; an unknown one links
 *   to the account with the same e-mail address if the provider verified that
 *   address, else a new account is made (never linked to an unverified address:
 *   that would hand an account to whoever can claim its address at the provider).
 *   A signed-in user can link more identities and unlink them.
 */
import { randomUUID } from 'node:crypto';
import { and, eq, isNull } from 'drizzle-orm';
import { ServiceError } from '../errors/index.js';
import { generateUserToken } from '../exec/secrets.js';
import type { Limits } from '../http/limits.js';
import type { Clock } from '../runtime/clock.js';
import { externalId } from '../runtime/ids.js';
import type { Db } from '../store/index.js';
import { isUniqueViolation, tables } from '../store/index.js';
import type { SecretBox } from './at-rest.js';
import { backupCodeHash, looksLikeBackupCode, newBackupCodes } from './backup-codes.js';
import type { IdpIdentity } from './oidc.js';
import { hashPassword, passwordProblem, verifyPassword } from './passwords.js';
import type { Sessions } from './sessions.js';
import { newTotpSecret, totpUri, verifyTotp } from './totp.js';

const { users: U, userBackupCodes: B, userIdentities: I } = tables;

export const CODE_ATTEMPTS = 5;
export const CODE_WINDOW_MS = 5 * 60_000;
/** Wrong passwords per address before sign-in with a password waits (not in the spec). */
export const PASSWORD_ATTEMPTS = 10;
export const PASSWORD_WINDOW_MS = 15 * 60_000;

export type UserRow = typeof U.$inferSelect;

export interface AccountView {
  id: string;
  externalId: string;
  name: string;
  email: string;
  hasPassword: boolean;
  twoFactor: boolean;
  backupCodesLeft: number;
  identities: Array<{ provider: string; email: string | null }>;
}

// Checked when the e-mail address is unknown, so both failures cost the same.
const DUMMY_HASH = hashPassword('not a password of anyone, ever');

export class Accounts {
  /** Per limited key, the end of the checks queued so far (see `limited`). */
  private readonly queues = new Map<string, Promise<void>>();

  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly box: SecretBox,
    private readonly sessions: Sessions,
    private readonly limits: Limits,
  ) {}

  async user(id: string): Promise<UserRow | null> {
    const [u] = await this.db.select().from(U).where(eq(U.id, id)).limit(1);
    return u ?? null;
  }

  async view(id: string): Promise<AccountView | null> {
    const u = await this.user(id);
    if (!u) return null;
    const codes = await this.db
      .select({ hash: B.codeHash })
      .from(B)
      .where(and(eq(B.userId, id), isNull(B.usedAt)));
    const identities = await this.db
      .select({ provider: I.provider, email: I.email })
      .from(I)
      .where(eq(I.userId, id));
    return {
      id: u.id,
      externalId: u.externalId,
      name: u.name,
      email: u.email,
      hasPassword: u.passwordHash !== null,
      twoFactor: u.totpSecret !== null,
      backupCodesLeft: codes.length,
      identities,
    };
  }

  /**
   * The user whose password this is, or 401 `invalid_credentials`; 429 after 10
   * wrong passwords for the address in 15 minutes (counted per address, whether or
   * not an account has it, so the answer tells nothing about which exist).
   */
  passwordLogin(email: string, password: string): Promise<UserRow> {
    const address = email.trim().toLowerCase();
    return this.limited(
      {
        key: `dash-password:${address}`,
        limit: PASSWORD_ATTEMPTS,
        windowMs: PASSWORD_WINDOW_MS,
        wrong: 'invalid_credentials',
        message: 'Too many wrong passwords for this address; wait a few minutes and try again.',
      },
      () => this.passwordLoginNow(address, password),
    );
  }

  private async passwordLoginNow(email: string, password: string): Promise<UserRow> {
    const [u] = await this.db.select().from(U).where(eq(U.email, email)).limit(1);
    const ok = await verifyPassword(password, u?.passwordHash ?? (await DUMMY_HASH));
    if (!u || !u.passwordHash || !ok) throw new ServiceError('invalid_credentials');
    return u;
  }

  /**
   * Checks a second-factor code: a TOTP code, or an unused backup code (used up
   * by this). 401 `invalid_code` when wrong; 429 after 5 tries in 5 minutes.
   */
  async checkCode(userId: string, code: string): Promise<'totp' | 'backup'> {
    return this.attempt(userId, () => this.checkCodeOnce(userId, code));
  }

  private async checkCodeOnce(userId: string, code: string): Promise<'totp' | 'backup'> {
    const u = await this.user(userId);
    if (!u?.totpSecret) throw new ServiceError('invalid_code');
    if (looksLikeBackupCode(code)) {
      const used = await this.db
        .update(B)
        .set({ usedAt: new Date(this.clock.now()) })
        .where(and(eq(B.userId, userId), eq(B.codeHash, backupCodeHash(code)), isNull(B.usedAt)))
        .returning({ hash: B.codeHash });
      if (used.length === 1) return 'backup';
      throw new ServiceError('invalid_code');
    }
    await this.useTotp(u, this.box.open(u.totpSecret, u.id), code);
    return 'totp';
  }

  /** Verifies a TOTP code against a seed and records its step (a code works once). */
  private async useTotp(u: UserRow, secret: string, code: string): Promise<void> {
    const v = verifyTotp(secret, code, this.clock.now(), u.totpLastStep);
    if (!v.ok) throw new ServiceError('invalid_code');
    // Conditional on the step read: of two concurrent uses of one code, one wins.
    const set = await this.db
      .update(U)
      .set({ totpLastStep: v.step })
      .where(
        and(
          eq(U.id, u.id),
          u.totpLastStep === null ? isNull(U.totpLastStep) : eq(U.totpLastStep, u.totpLastStep),
        ),
      )
      .returning({ id: U.id });
    if (set.length !== 1) throw new ServiceError('invalid_code');
  }

  /**
   * Sets a password: a user changing theirs gives the current one (when they have
   * one); an operator's reset gives none. Every session of the user ends.
   */
  async setPassword(userId: string, next: string, current?: string): Promise<void> {
    const problem = passwordProblem(next);
    if (problem) throw new ServiceError('invalid_body', { message: problem, param: 'password' });
    const u = await this.user(userId);
    if (!u) throw new ServiceError('user_not_found');
    const hash = u.passwordHash;
    if (current !== undefined && hash) {
      // The same limit as signing in, on the same address: the current password is
      // what stops the holder of a stolen session taking the account, so it cannot
      // be guessed here without bound either.
      await this.limited(
        {
          key: `dash-password:${u.email.trim().toLowerCase()}`,
          limit: PASSWORD_ATTEMPTS,
          windowMs: PASSWORD_WINDOW_MS,
          wrong: 'invalid_credentials',
          message: 'Too many wrong passwords for this address; wait a few minutes and try again.',
        },
        async () => {
          if (!(await verifyPassword(current, hash))) {
            throw new ServiceError('invalid_credentials', {
              message: 'The current password is wrong.',
              param: 'current_password',
            });
          }
        },
      );
    }
    await this.db
      .update(U)
      .set({ passwordHash: await hashPassword(next) })
      .where(eq(U.id, userId));
    await this.sessions.closeAll(userId);
  }

  /** An operator's password reset (or first password), by the user's `usr_` id. */
  async resetPassword(userExternalId: string, password: string): Promise<string> {
    const [u] = await this.db
      .select({ id: U.id })
      .from(U)
      .where(eq(U.externalId, userExternalId))
      .limit(1);
    if (!u) throw new ServiceError('user_not_found', { param: 'user' });
    await this.setPassword(u.id, password);
    return u.id;
  }

  /** Starts 2FA setup: a new seed, pending until `enableTotp` verifies a code from it. */
  async beginTotp(userId: string): Promise<{ secret: string; uri: string }> {
    const u = await this.user(userId);
    if (!u) throw new ServiceError('user_not_found');
    if (u.totpSecret) {
      throw new ServiceError('invalid_state', {
        message: 'Two-factor authentication is already on.',
      });
    }
    const secret = newTotpSecret();
    await this.db
      .update(U)
      .set({ totpPending: this.box.seal(secret, u.id) })
      .where(eq(U.id, userId));
    // The label is `issuer:account`: a colon in the address would split it.
    return { secret, uri: totpUri(secret, u.email.replaceAll(':', '')) };
  }

  /** Turns 2FA on with a code from the pending seed; returns the backup codes (shown once). */
  async enableTotp(userId: string, code: string): Promise<string[]> {
    const u = await this.user(userId);
    if (!u?.totpPending) {
      throw new ServiceError('invalid_state', { message: 'Start two-factor setup first.' });
    }
    const secret = this.box.open(u.totpPending, u.id);
    await this.attempt(userId, () => this.useTotp(u, secret, code));
    await this.db
      .update(U)
      .set({ totpSecret: u.totpPending, totpPending: null })
      .where(eq(U.id, userId));
    return this.replaceBackupCodes(userId);
  }

  /** Turns 2FA off (a valid TOTP code needed): the seed and every backup code go. */
  async disableTotp(userId: string, code: string): Promise<void> {
    await this.requireTotp(userId, code);
    await this.db
      .update(U)
      .set({ totpSecret: null, totpPending: null, totpLastStep: null })
      .where(eq(U.id, userId));
    await this.db.delete(B).where(eq(B.userId, userId));
  }

  /** New backup codes (a valid TOTP code needed); every earlier one stops working. */
  async regenerateBackupCodes(userId: string, code: string): Promise<string[]> {
    await this.requireTotp(userId, code);
    return this.replaceBackupCodes(userId);
  }

  /** A TOTP code specifically (not a backup code): the spec's rule for disabling and regenerating. */
  private async requireTotp(userId: string, code: string): Promise<void> {
    const u = await this.user(userId);
    if (!u?.totpSecret) {
      throw new ServiceError('invalid_state', { message: 'Two-factor authentication is off.' });
    }
    const secret = this.box.open(u.totpSecret, u.id);
    await this.attempt(userId, () => this.useTotp(u, secret, code));
  }

  /** A code check under the rate limit: refused (429) after 5 wrong codes in 5 minutes. */
  private attempt<T>(userId: string, verify: () => Promise<T>): Promise<T> {
    return this.limited(
      {
        key: `dash-code:${userId}`,
        limit: CODE_ATTEMPTS,
        windowMs: CODE_WINDOW_MS,
        wrong: 'invalid_code',
        message: 'Too many wrong two-factor codes; wait a few minutes and try again.',
      },
      verify,
    );
  }

  /**
   * A check under a failure limit: refused (429) once `limit` wrong answers (errors
   * with code `wrong`) are in the window; right answers never count.
   *
   * Across router instances the limit holds through the shared limiter: each check
   * first takes a slot (`Limits.takeTry`, atomic with Redis), keeps it when its answer
   * is wrong and gives it back otherwise, whatever `verify` throws. Within one
   * instance checks of one key also run one at a time, so that answers sent at once
   * wait for the one before them instead of finding its slot taken (a 429 meant
   * only for answers checked at the same moment on another instance).
   */
  private async limited<T>(
    rule: { key: string; limit: number; windowMs: number; wrong: string; message: string },
    verify: () => Promise<T>,
  ): Promise<T> {
    const before = this.queues.get(rule.key) ?? Promise.resolve();
    let done!: () => void;
    const mine = new Promise<void>((resolve) => (done = resolve));
    const tail = before.then(() => mine);
    this.queues.set(rule.key, tail);
    await before;
    try {
      const slot = await this.limits.takeTry(rule.key, rule.limit, rule.windowMs, rule.message);
      let wrong = false;
      try {
        return await verify();
      } catch (err) {
        wrong = err instanceof ServiceError && err.code === rule.wrong;
        throw err;
      } finally {
        if (slot) await (wrong ? this.limits.tryFailed(slot) : this.limits.tryDone(slot));
      }
    } finally {
      done();
      if (this.queues.get(rule.key) === tail) this.queues.delete(rule.key);
    }
  }

  private async replaceBackupCodes(userId: string): Promise<string[]> {
    const { codes, hashes } = newBackupCodes();
    const now = new Date(this.clock.now());
    await this.db.transaction(async (tx) => {
      await tx.delete(B).where(eq(B.userId, userId));
      await tx.insert(B).values(hashes.map((codeHash) => ({ userId, codeHash, createdAt: now })));
    });
    return codes;
  }

  /**
   * The user an identity signs in (or, with `linkTo`, the signed-in user it is
   * linked to). See the module comment for the linking rule.
   */
  async signInWith(identity: IdpIdentity, linkTo: string | null): Promise<UserRow> {
    const [known] = await this.db
      .select({ userId: I.userId })
      .from(I)
      .where(and(eq(I.provider, identity.provider), eq(I.subject, identity.subject)))
      .limit(1);
    if (known) {
      if (linkTo && known.userId !== linkTo) {
        throw new ServiceError('conflict', {
          message: 'This identity is already linked to another account.',
        });
      }
      return (await this.user(known.userId))!;
    }
    let user: UserRow | null = linkTo ? await this.user(linkTo) : null;
    const email = identity.email?.trim().toLowerCase() ?? null;
    if (!user && email && identity.emailVerified) {
      const [byEmail] = await this.db.select().from(U).where(eq(U.email, email)).limit(1);
      user = byEmail ?? null;
    }
    if (!user) {
      if (!email || !identity.emailVerified) {
        throw new ServiceError('identity_login_failed', {
          message:
            'The identity provider did not give a verified e-mail address, so no account can be made.',
        });
      }
      user = await this.createUser(identity.name ?? email, email);
    }
    try {
      await this.db.insert(I).values({
        provider: identity.provider,
        subject: identity.subject,
        userId: user.id,
        email,
        createdAt: new Date(this.clock.now()),
      });
    } catch (err) {
      if (!isUniqueViolation(err)) throw err;
    }
    return user;
  }

  private async createUser(name: string, email: string): Promise<UserRow> {
    const row: UserRow = {
      id: randomUUID(),
      externalId: externalId('usr'),
      name,
      email,
      // The personal token for approval decisions over the API is made by the
      // operator API; an account made here gets one nobody knows.
      tokenHash: generateUserToken().hash,
      passwordHash: null,
      totpSecret: null,
      totpPending: null,
      totpLastStep: null,
      createdAt: new Date(this.clock.now()),
    };
    try {
      await this.db.insert(U).values(row);
    } catch (err) {
      if (isUniqueViolation(err)) {
        throw new ServiceError('conflict', {
          message: `An account with e-mail '${email}' already exists; sign in with it to link this identity.`,
        });
      }
      throw err;
    }
    return row;
  }

  /**
   * Unlinks an identity; the last way in (no password, no other identity) stays.
   * The check and the delete hold the user's row: two unlinks at once (of the two
   * identities of a user without a password) each saw the other identity still
   * there, and both went through.
   */
  async unlink(userId: string, provider: string): Promise<void> {
    if (!(await this.user(userId))) throw new ServiceError('user_not_found');
    await this.db.transaction(async (tx) => {
      const [u] = await tx
        .select({ passwordHash: U.passwordHash })
        .from(U)
        .where(eq(U.id, userId))
        .for('update');
      if (!u) throw new ServiceError('user_not_found');
      const mine = await tx.select().from(I).where(eq(I.userId, userId));
      const gone = mine.filter((i) => i.provider === provider);
      if (gone.length === 0)
        throw new ServiceError('not_found', { message: 'No such linked identity.' });
      if (!u.passwordHash && gone.length === mine.length) {
        throw new ServiceError('invalid_state', {
          message: 'Set a password first: this identity is your only way to sign in.',
        });
      }
      await tx.delete(I).where(and(eq(I.userId, userId), eq(I.provider, provider)));
    });
  }
}
