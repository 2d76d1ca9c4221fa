/**
 * Users (`usr_…`) and their project roles (owner, admin, approver, viewer),
 * created through the operator API until dashboard sign-in exists. A user
 * authenticates approval decisions with a personal bearer token `swyu_…`
 * (shown once at creation; only its SHA-256 is stored).
 */
import { randomUUID } from 'node:crypto';
import { and, asc, eq } from 'drizzle-orm';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { parseBody } from '../http/validate.js';
import { bearerToken } from '../keys/index.js';
import { externalId } from '../runtime/ids.js';
import { isUniqueViolation, tables } from '../store/index.js';
import type { ExecContext } from './context.js';
import { generateUserToken, userTokenHash } from './secrets.js';

const { users: U, projectMembers: M } = tables;

export const ROLES = ['owner', 'admin', 'approver', 'viewer'] as const;
export type Role = (typeof ROLES)[number];

/** The authenticated decider, with their role in the path's project (null: not a member). */
export interface UserRef {
  id: string;
  externalId: string;
  role: Role | null;
}

const createUserBody = z
  .object({ name: z.string().min(1).max(200), email: z.email().max(320) })
  .strict();
const memberBody = z.object({ user_id: z.string().min(1), role: z.enum(ROLES) }).strict();

type UserRow = typeof U.$inferSelect;

const publicUser = (u: UserRow) => ({
  id: u.externalId,
  object: 'user' as const,
  name: u.name,
  email: u.email,
  created_at: u.createdAt.toISOString(),
});

export class Users {
  constructor(private readonly ctx: ExecContext) {}

  async create(raw: unknown) {
    const body = parseBody(createUserBody, raw);
    const { value, hash } = generateUserToken();
    const row: UserRow = {
      id: randomUUID(),
      externalId: externalId('usr'),
      name: body.name,
      email: body.email.toLowerCase(),
      tokenHash: hash,
      // Dashboard sign-in is set up separately (dashboard/accounts.ts).
      passwordHash: null,
      totpSecret: null,
      totpPending: null,
      totpLastStep: null,
      createdAt: new Date(this.ctx.clock.now()),
    };
    try {
      await this.ctx.db.insert(U).values(row);
    } catch (err) {
      if (isUniqueViolation(err)) {
        throw new ServiceError('conflict', {
          message: `A user with e-mail '${row.email}' already exists.`,
          param: 'email',
        });
      }
      throw err;
    }
    return { ...publicUser(row), token: value };
  }

  async list() {
    const rows = await this.ctx.db.select().from(U).orderBy(asc(U.createdAt), asc(U.id));
    return { object: 'list' as const, data: rows.map(publicUser) };
  }

  /** Adds a member or changes their role. */
  async setMember(projectId: string, raw: unknown) {
    const body = parseBody(memberBody, raw);
    const [u] = await this.ctx.db.select().from(U).where(eq(U.externalId, body.user_id)).limit(1);
    if (!u) throw new ServiceError('user_not_found', { param: 'user_id' });
    const now = new Date(this.ctx.clock.now());
    await this.ctx.db
      .insert(M)
      .values({ projectId, userId: u.id, role: body.role, createdAt: now })
      .onConflictDoUpdate({ target: [M.projectId, M.userId], set: { role: body.role } });
    return { object: 'project_member' as const, user_id: u.externalId, role: body.role };
  }

  async members(projectId: string) {
    const rows = await this.ctx.db
      .select({ externalId: U.externalId, role: M.role })
      .from(M)
      .innerJoin(U, eq(U.id, M.userId))
      .where(eq(M.projectId, projectId))
      .orderBy(asc(M.createdAt));
    return {
      object: 'list' as const,
      data: rows.map((r) => ({
        object: 'project_member' as const,
        user_id: r.externalId,
        role: r.role,
      })),
    };
  }

  /**
   * The decider behind an Authorization header: no user token (nothing, or an
   * API key) → 401 `authentication_required`; a `swyu_` value that matches no
   * user → 401 `invalid_user_token`.
   */
  async authenticate(
    authorization: string | undefined,
    projectId: string | null,
  ): Promise<UserRef> {
    const token = bearerToken(authorization);
    if (!token || !token.startsWith('swyu_')) {
      throw new ServiceError('authentication_required', {
        message: 'Approval decisions need a user token: Authorization: Bearer swyu_…',
      });
    }
    const hash = userTokenHash(token);
    const [u] = hash
      ? await this.ctx.db.select().from(U).where(eq(U.tokenHash, hash)).limit(1)
      : [];
    if (!u) throw new ServiceError('invalid_user_token');
    const [m] = projectId
      ? await this.ctx.db
          .select({ role: M.role })
          .from(M)
          .where(and(eq(M.projectId, projectId), eq(M.userId, u.id)))
          .limit(1)
      : [];
    return { id: u.id, externalId: u.externalId, role: (m?.role as Role | undefined) ?? null };
  }

  /** A user by external id with their role in a project (the dashboard's token names them). */
  async ref(externalIdValue: string, projectId: string): Promise<UserRef | null> {
    const [row] = await this.ctx.db
      .select({ id: U.id, externalId: U.externalId, role: M.role })
      .from(U)
      .leftJoin(M, and(eq(M.userId, U.id), eq(M.projectId, projectId)))
      .where(eq(U.externalId, externalIdValue))
      .limit(1);
    if (!row) return null;
    return { id: row.id, externalId: row.externalId, role: (row.role as Role | null) ?? null };
  }

  /** The projects a user is a member of, with the role in each. */
  async memberships(userId: string): Promise<Array<{ projectId: string; role: Role }>> {
    const rows = await this.ctx.db
      .select({ projectId: M.projectId, role: M.role })
      .from(M)
      .where(eq(M.userId, userId))
      .orderBy(asc(M.createdAt));
    return rows.map((r) => ({ projectId: r.projectId, role: r.role as Role }));
  }
}
