/**
 * The management side (scope `management`): join keys (minted with the secret
 * shown once, listed, revoked) and agents (listed, read, updated,
 * soft-deleted, CURVE key rotated). Events: `join_key.created`,
 * `join_key.revoked`, `agent.updated`, `agent.deleted`, `agent.key_rotated`
 * (payloads in docs/EXEC.md).
 */
import { randomUUID } from 'node:crypto';
import { and, asc, desc, eq, inArray, isNull, ne } from 'drizzle-orm';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { parseBody } from '../http/validate.js';
import { externalId } from '../runtime/ids.js';
import { isUniqueViolation, tables } from '../store/index.js';
import { emit, type ExecContext } from './context.js';
import { CURVE_KEY, REGISTRATION_NAME, type Directory } from './directory.js';
import type { Invocations } from './invocations.js';
import { publicAgent, publicJoinKey, type AgentRow, type JoinKeyRow } from './records.js';
import { generateJoinKey } from './secrets.js';

const { joinKeys: J, agents: A } = tables;

const createJoinKeyBody = z
  .object({
    name: z.string().max(200).optional(),
    expires_at: z.iso.datetime({ offset: true }).nullable().optional(),
    max_uses: z.number().int().min(1).max(1_000_000).nullable().optional(),
    registration_name: z
      .string()
      .regex(REGISTRATION_NAME, 'must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$')
      .nullable()
      .optional(),
  })
  .strict();

const metadata = z
  .record(z.string().max(64), z.string().max(512))
  .refine((m) => Object.keys(m).length <= 16, { message: 'at most 16 pairs' });

const updateAgentBody = z
  .object({ description: z.string().max(1000).optional(), metadata: metadata.optional() })
  .strict();

const rotateBody = z
  .object({ curve_public_key: z.string().regex(CURVE_KEY, 'must be 40 Z85 characters') })
  .strict();

const listAgentsQuery = z.object({
  include_deleted: z.enum(['true', 'false']).optional(),
});

export class Management {
  constructor(
    private readonly ctx: ExecContext,
    private readonly directory: Directory,
    private readonly invocations: Invocations,
  ) {}

  private now(): Date {
    return new Date(this.ctx.clock.now());
  }

  async createJoinKey(projectId: string, raw: unknown) {
    const body = parseBody(createJoinKeyBody, raw ?? {});
    const now = this.now();
    if (body.expires_at && new Date(body.expires_at).getTime() <= now.getTime()) {
      throw new ServiceError('invalid_body', {
        message: 'expires_at must be in the future.',
        param: 'expires_at',
      });
    }
    const { value, hash, prefix } = generateJoinKey();
    const row: JoinKeyRow = {
      id: randomUUID(),
      externalId: externalId('jk'),
      projectId,
      name: body.name ?? '',
      secretHash: hash,
      prefix,
      registrationName: body.registration_name ?? null,
      expiresAt: body.expires_at ? new Date(body.expires_at) : null,
      maxUses: body.max_uses ?? null,
      useCount: 0,
      revokedAt: null,
      createdAt: now,
    };
    await this.ctx.db.transaction(async (tx) => {
      await tx.insert(J).values(row);
      await emit(
        tx,
        projectId,
        'join_key.created',
        {
          join_key_id: row.externalId,
          name: row.name,
          registration_name: row.registrationName,
          expires_at: row.expiresAt?.toISOString() ?? null,
          max_uses: row.maxUses,
          created_at: now.toISOString(),
        },
        now,
      );
    });
    this.ctx.poke();
    return { ...publicJoinKey(row, now.getTime()), key: value };
  }

  async listJoinKeys(projectId: string) {
    const rows = await this.ctx.db
      .select()
      .from(J)
      .where(eq(J.projectId, projectId))
      .orderBy(desc(J.createdAt), desc(J.id));
    const now = this.ctx.clock.now();
    return { object: 'list' as const, data: rows.map((k) => publicJoinKey(k, now)) };
  }

  private async joinKey(projectId: string, id: string): Promise<JoinKeyRow> {
    const [k] = await this.ctx.db
      .select()
      .from(J)
      .where(and(eq(J.projectId, projectId), eq(J.externalId, id)))
      .limit(1);
    if (!k) throw new ServiceError('join_key_not_found', { param: 'join_key_id' });
    return k;
  }

  async getJoinKey(projectId: string, id: string) {
    return publicJoinKey(await this.joinKey(projectId, id), this.ctx.clock.now());
  }

  /** Permanent; revoking a revoked key changes nothing and emits nothing. Enrolled agents stay. */
  async revokeJoinKey(projectId: string, id: string) {
    const k = await this.joinKey(projectId, id);
    const now = this.now();
    await this.ctx.db.transaction(async (tx) => {
      const rows = await tx
        .update(J)
        .set({ revokedAt: now })
        .where(and(eq(J.id, k.id), isNull(J.revokedAt)))
        .returning({ id: J.id });
      if (rows.length > 0) {
        await emit(
          tx,
          projectId,
          'join_key.revoked',
          { join_key_id: k.externalId, revoked_at: now.toISOString() },
          now,
        );
      }
    });
    this.ctx.poke();
    return this.getJoinKey(projectId, id);
  }

  private async joinKeyIds(ids: Array<string | null>): Promise<Map<string, string>> {
    const want = ids.filter((x): x is string => x !== null);
    const out = new Map<string, string>();
    if (want.length === 0) return out;
    const rows = await this.ctx.db
      .select({ id: J.id, ext: J.externalId })
      .from(J)
      .where(inArray(J.id, [...new Set(want)]));
    for (const r of rows) out.set(r.id, r.ext);
    return out;
  }

  private async agentView(rows: AgentRow[]) {
    const jk = await this.joinKeyIds(rows.map((r) => r.joinKeyId));
    const now = this.ctx.clock.now();
    return rows.map((a) => publicAgent(a, now, a.joinKeyId ? (jk.get(a.joinKeyId) ?? null) : null));
  }

  async listAgents(projectId: string, query: unknown) {
    const q = parseBody(listAgentsQuery, query ?? {});
    const rows = await this.ctx.db
      .select()
      .from(A)
      .where(
        and(
          eq(A.projectId, projectId),
          q.include_deleted === 'true' ? undefined : ne(A.status, 'deleted'),
        ),
      )
      .orderBy(asc(A.registrationName), asc(A.createdAt));
    return { object: 'list' as const, data: await this.agentView(rows) };
  }

  private async agent(projectId: string, id: string): Promise<AgentRow> {
    const [a] = await this.ctx.db
      .select()
      .from(A)
      .where(and(eq(A.projectId, projectId), eq(A.externalId, id)))
      .limit(1);
    if (!a) throw new ServiceError('agent_not_found', { param: 'agent_id' });
    return a;
  }

  async getAgent(projectId: string, id: string) {
    return (await this.agentView([await this.agent(projectId, id)]))[0]!;
  }

  private live(a: AgentRow): AgentRow {
    if (a.deletedAt) {
      throw new ServiceError('invalid_state', { message: 'The agent has been deleted.' });
    }
    return a;
  }

  async updateAgent(projectId: string, id: string, raw: unknown) {
    const a = this.live(await this.agent(projectId, id));
    const body = parseBody(updateAgentBody, raw ?? {});
    const now = this.now();
    const changed = Object.keys(body);
    await this.ctx.db.transaction(async (tx) => {
      await tx
        .update(A)
        .set({ ...body, updatedAt: now })
        .where(eq(A.id, a.id));
      await emit(
        tx,
        projectId,
        'agent.updated',
        { agent_id: a.externalId, changed, updated_at: now.toISOString() },
        now,
      );
    });
    this.ctx.poke();
    return this.getAgent(projectId, id);
  }

  /** Soft delete: the key stops passing ZAP; in-flight invocations fail (`agent_deleted`). */
  async deleteAgent(projectId: string, id: string) {
    const a = this.live(await this.agent(projectId, id));
    const now = this.now();
    const inflight = await this.ctx.db.transaction((tx) =>
      this.directory.softDelete(tx, a, now, 'deleted_by_api'),
    );
    // Deleted meanwhile by a delete that read it live at the same time: as if after it.
    if (inflight === null) {
      throw new ServiceError('invalid_state', { message: 'The agent has been deleted.' });
    }
    this.ctx.poke();
    for (const inv of inflight) await this.invocations.cancelOnAgent(inv);
    return { ...(await this.getAgent(projectId, id)), deleted: true };
  }

  /**
   * Replaces the agent's CURVE public key (the agent generated a new keypair);
   * the old key stops passing ZAP at once. The agent stays enrolled and must
   * reconnect with the new key.
   */
  async rotateKey(projectId: string, id: string, raw: unknown) {
    const a = this.live(await this.agent(projectId, id));
    const body = parseBody(rotateBody, raw ?? {});
    const now = this.now();
    try {
      await this.ctx.db.transaction(async (tx) => {
        await tx
          .update(A)
          .set({ curvePublicKey: body.curve_public_key, updatedAt: now })
          .where(eq(A.id, a.id));
        await emit(
          tx,
          projectId,
          'agent.key_rotated',
          {
            agent_id: a.externalId,
            curve_public_key: body.curve_public_key,
            rotated_at: now.toISOString(),
          },
          now,
        );
      });
    } catch (err) {
      if (isUniqueViolation(err)) {
        throw new ServiceError('conflict', {
          message: 'This CURVE key already identifies another agent.',
          param: 'curve_public_key',
        });
      }
      throw err;
    }
    this.ctx.poke();
    return this.getAgent(projectId, id);
  }
}
