/**
 * Database access for API keys. The only place that reads or writes
 * `api_keys` and `api_key_secrets`.
 */
import { randomUUID } from 'node:crypto';
import { and, asc, eq, gt, isNull, lte, sql } from 'drizzle-orm';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';
import { displayPrefix, generateKey, parseKey } from './format.js';
import type { KeyRecord, KeyStatus } from './record.js';
import { isScope, type Scope } from './scopes.js';

const { apiKeys, apiKeySecrets, projects } = tables;

export interface NewKey {
  name?: string;
  scopes: Scope[];
  expiresAt?: Date | null;
  allowedIps?: string[];
  blockedIps?: string[];
  quotaRequests?: number;
  quotaWindow?: number;
  endpointId?: string | null;
}

export interface SecretLookup {
  record: KeyRecord;
  /** Null for the current value; the end of the rotation grace for an old one. */
  validUntil: Date | null;
}

const keyColumns = {
  id: apiKeys.id,
  projectId: apiKeys.projectId,
  projectExternalId: projects.externalId,
  projectSlug: projects.slug,
  name: apiKeys.name,
  prefix: apiKeys.prefix,
  scopes: apiKeys.scopes,
  expiresAt: apiKeys.expiresAt,
  allowedIps: apiKeys.allowedIps,
  blockedIps: apiKeys.blockedIps,
  quotaRequests: apiKeys.quotaRequests,
  quotaWindow: apiKeys.quotaWindow,
  endpointId: apiKeys.endpointId,
  revokedAt: apiKeys.revokedAt,
  rotatedAt: apiKeys.rotatedAt,
  lastUsedAt: apiKeys.lastUsedAt,
  createdAt: apiKeys.createdAt,
};

type KeyRow = Omit<KeyRecord, 'scopes'> & { scopes: string[] };

function toRecord(row: KeyRow): KeyRecord {
  return { ...row, scopes: row.scopes.filter(isScope) };
}

export class KeyRepository {
  constructor(private readonly db: Db) {}

  async create(
    project: { id: string; slug: string },
    input: NewKey,
    now: Date,
  ): Promise<{ record: KeyRecord; value: string }> {
    const { value, hash, prefix } = generateKey(project.slug);
    const id = randomUUID();
    await this.db.transaction(async (tx) => {
      await tx.insert(apiKeys).values({
        id,
        projectId: project.id,
        name: input.name ?? '',
        prefix,
        scopes: input.scopes,
        expiresAt: input.expiresAt ?? null,
        allowedIps: input.allowedIps ?? [],
        blockedIps: input.blockedIps ?? [],
        quotaRequests: input.quotaRequests ?? 60,
        quotaWindow: input.quotaWindow ?? 60,
        endpointId: input.endpointId ?? null,
        createdAt: now,
      });
      await tx.insert(apiKeySecrets).values({ hash, keyId: id, validUntil: null, createdAt: now });
    });
    const record = await this.get(project.id, id);
    if (!record) throw new Error('key vanished after insert');
    return { record, value };
  }

  async get(projectId: string, id: string): Promise<KeyRecord | null> {
    const rows = await this.db
      .select(keyColumns)
      .from(apiKeys)
      .innerJoin(projects, eq(projects.id, apiKeys.projectId))
      .where(and(eq(apiKeys.projectId, projectId), eq(apiKeys.id, id)))
      .limit(1);
    return rows[0] ? toRecord(rows[0]) : null;
  }

  /**
   * Records when keys were last used (key id → epoch ms), in one statement; a
   * time never moves a key's `last_used_at` backwards (another instance may have
   * written a later one).
   */
  async touch(used: ReadonlyMap<string, number>): Promise<void> {
    if (used.size === 0) return;
    const rows = [...used].map(
      ([id, at]) => sql`(${id}::uuid, ${new Date(at).toISOString()}::timestamptz)`,
    );
    await this.db.execute(sql`
      UPDATE api_keys AS k SET last_used_at = v.t
      FROM (VALUES ${sql.join(rows, sql`, `)}) AS v(id, t)
      WHERE k.id = v.id AND (k.last_used_at IS NULL OR k.last_used_at < v.t)`);
  }

  async list(projectId: string): Promise<KeyRecord[]> {
    const rows = await this.db
      .select(keyColumns)
      .from(apiKeys)
      .innerJoin(projects, eq(projects.id, apiKeys.projectId))
      .where(eq(apiKeys.projectId, projectId))
      .orderBy(asc(apiKeys.createdAt), asc(apiKeys.id));
    return rows.map(toRecord);
  }

  /**
   * Rotation: a new value becomes current; the value that was current stays valid
   * until `now + graceMs` (values already in grace keep their own end); the
   * display prefix resets; `scopes`, when given, replace the key's scopes. Values
   * whose grace has ended are deleted. Returns null for an unknown key; throws
   * `InactiveKeyError` for a revoked key, and for an expired one (expiry counts
   * as revocation: a rotation would hand out a value that is already dead).
   */
  async rotate(
    project: { id: string; slug: string },
    id: string,
    opts: { scopes?: Scope[]; graceMs: number },
    now: Date,
  ): Promise<{ record: KeyRecord; value: string } | null> {
    const { value, hash, prefix } = generateKey(project.slug);
    const found = await this.db.transaction(async (tx) => {
      const rows = await tx
        .select({
          id: apiKeys.id,
          revokedAt: apiKeys.revokedAt,
          expiresAt: apiKeys.expiresAt,
          scopes: apiKeys.scopes,
        })
        .from(apiKeys)
        .where(and(eq(apiKeys.projectId, project.id), eq(apiKeys.id, id)))
        .for('update');
      const row = rows[0];
      if (!row) return false;
      if (row.revokedAt) throw new InactiveKeyError('revoked');
      if (row.expiresAt && row.expiresAt.getTime() <= now.getTime()) {
        throw new InactiveKeyError('expired');
      }
      // The value rotated out keeps working for its grace period with the scopes it
      // was issued with that the key still has. A scope the rotation removes leaves
      // every older value at once (one that kept `management` could rotate the key
      // back up); a scope it adds goes to the new value only.
      const keep = (held: string[]) =>
        opts.scopes ? held.filter((x) => opts.scopes!.includes(x as Scope)) : held;
      await tx
        .update(apiKeySecrets)
        .set({ validUntil: new Date(now.getTime() + opts.graceMs), scopes: keep(row.scopes) })
        .where(and(eq(apiKeySecrets.keyId, id), isNull(apiKeySecrets.validUntil)));
      await tx
        .delete(apiKeySecrets)
        .where(and(eq(apiKeySecrets.keyId, id), lte(apiKeySecrets.validUntil, now)));
      if (opts.scopes) {
        const older = await tx
          .select({ hash: apiKeySecrets.hash, scopes: apiKeySecrets.scopes })
          .from(apiKeySecrets)
          .where(and(eq(apiKeySecrets.keyId, id), gt(apiKeySecrets.validUntil, now)));
        for (const o of older) {
          const kept = keep(o.scopes ?? []);
          if (kept.length === (o.scopes ?? []).length) continue;
          await tx
            .update(apiKeySecrets)
            .set({ scopes: kept })
            .where(eq(apiKeySecrets.hash, o.hash));
        }
      }
      await tx.insert(apiKeySecrets).values({ hash, keyId: id, validUntil: null, createdAt: now });
      await tx
        .update(apiKeys)
        .set({ prefix, rotatedAt: now, ...(opts.scopes ? { scopes: opts.scopes } : {}) })
        .where(eq(apiKeys.id, id));
      return true;
    });
    if (!found) return null;
    const record = await this.get(project.id, id);
    return record ? { record, value } : null;
  }

  /** Permanent revocation; revoking a revoked key changes nothing. */
  async revoke(projectId: string, id: string, now: Date): Promise<KeyRecord | null> {
    await this.db
      .update(apiKeys)
      .set({ revokedAt: now })
      .where(and(eq(apiKeys.projectId, projectId), eq(apiKeys.id, id), isNull(apiKeys.revokedAt)));
    return this.get(projectId, id);
  }

  /** Finds the key a secret value belongs to, by the value's hash. */
  async findBySecretHash(hash: string): Promise<(SecretLookup & { hash: string }) | null> {
    const rows = await this.db
      .select({
        ...keyColumns,
        hash: apiKeySecrets.hash,
        validUntil: apiKeySecrets.validUntil,
        secretScopes: apiKeySecrets.scopes,
      })
      .from(apiKeySecrets)
      .innerJoin(apiKeys, eq(apiKeys.id, apiKeySecrets.keyId))
      .innerJoin(projects, eq(projects.id, apiKeys.projectId))
      .where(eq(apiKeySecrets.hash, hash))
      .limit(1);
    const row = rows[0];
    if (!row) return null;
    const { hash: h, validUntil, secretScopes, ...rest } = row;
    // A rotated-out value acts with the scopes it had (rotate() records them).
    const record = toRecord(secretScopes ? { ...rest, scopes: secretScopes } : rest);
    return { record, validUntil, hash: h };
  }
}

/** The key can no longer change: it is revoked or expired (`status` says which). */
export class InactiveKeyError extends Error {
  constructor(readonly status: Exclude<KeyStatus, 'active'>) {
    super(`the key is ${status}`);
  }
}

/** The display prefix a value would get (for tests and tooling). */
export function prefixOf(value: string): string | null {
  const p = parseKey(value);
  return p ? displayPrefix(p.projectSlug, p.token) : null;
}
