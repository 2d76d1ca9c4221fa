/**
 * Key lifecycle shared by the key management API and the operator API:
 * create (value shown once), rotate (new value shown once, the old one valid
 * for 24 hours, optional new scopes; refused with 409 `invalid_state` once the
 * key is revoked or expired), revoke (permanent). Every change is published so
 * all router instances drop cached verifications.
 *
 * Through the key management API the caller is itself a key (an `Actor`), and a key
 * grants nothing beyond what it holds: a key it creates, or the new value a
 * rotation hands back, may carry `inference` (the default scope, which issuing
 * keys for applications is about) and otherwise only scopes the caller has (403
 * `scope_insufficient`, `param: scopes`): a management key cannot mint itself
 * `execution` or `research`. Revocation is always allowed. The operator API has
 * no actor.
 */
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { parseBody } from '../http/validate.js';
import type { Clock } from '../runtime/clock.js';
import type { InvalidationBus } from '../runtime/invalidation.js';
import { publicKey, ROTATION_GRACE_MS, type PublicKey } from './record.js';
import { InactiveKeyError, type KeyRepository } from './repository.js';
import { createKeyBody } from './schemas.js';
import { DEFAULT_SCOPES, SCOPES } from './scopes.js';

const rotateKeyBody = z
  .object({
    scopes: z
      .array(z.enum(SCOPES))
      .min(1)
      .refine((a) => new Set(a).size === a.length, 'must not repeat a scope')
      .optional(),
  })
  .strict();

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

interface ProjectRef {
  id: string;
  slug: string;
}

/** The key calling the key management API. */
export interface Actor {
  scopes: readonly string[];
}

function withinActor(actor: Actor | undefined, scopes: readonly string[]): void {
  if (!actor) return;
  const missing = scopes.filter((s) => s !== 'inference' && !actor.scopes.includes(s));
  if (missing.length === 0) return;
  throw new ServiceError('scope_insufficient', {
    message: `A key can only grant scopes it holds; this one lacks ${missing.map((m) => `'${m}'`).join(', ')}.`,
    param: 'scopes',
  });
}

export class KeyService {
  constructor(
    private readonly repo: KeyRepository,
    private readonly endpointExists: (projectId: string, endpointId: string) => Promise<boolean>,
    private readonly bus: InvalidationBus,
    private readonly clock: Clock,
  ) {}

  async create(
    project: ProjectRef,
    rawBody: unknown,
    actor?: Actor,
  ): Promise<PublicKey & { key: string }> {
    const body = parseBody(createKeyBody, rawBody ?? {});
    const scopes = body.scopes ?? [...DEFAULT_SCOPES];
    withinActor(actor, scopes);
    if (body.endpointId && !(await this.endpointExists(project.id, body.endpointId))) {
      throw new ServiceError('endpoint_not_found', {
        message: 'endpointId names no endpoint of this project.',
        param: 'endpointId',
      });
    }
    const now = this.clock.now();
    if (body.expiresAt && new Date(body.expiresAt).getTime() <= now) {
      throw new ServiceError('invalid_body', {
        message: 'expiresAt must be in the future.',
        param: 'expiresAt',
      });
    }
    const { record, value } = await this.repo.create(
      project,
      {
        name: body.name,
        scopes,
        expiresAt: body.expiresAt ? new Date(body.expiresAt) : null,
        allowedIps: body.allowedIps,
        blockedIps: body.blockedIps,
        quotaRequests: body.quotaRequests,
        quotaWindow: body.quotaWindow,
        endpointId: body.endpointId ?? null,
      },
      new Date(now),
    );
    return { ...publicKey(record, now), key: value };
  }

  async list(projectId: string): Promise<PublicKey[]> {
    const now = this.clock.now();
    return (await this.repo.list(projectId)).map((k) => publicKey(k, now));
  }

  async get(projectId: string, id: string): Promise<PublicKey> {
    const k = UUID.test(id) ? await this.repo.get(projectId, id) : null;
    if (!k) throw new ServiceError('key_not_found', { param: 'id' });
    return publicKey(k, this.clock.now());
  }

  async rotate(
    project: ProjectRef,
    id: string,
    rawBody: unknown,
    actor?: Actor,
  ): Promise<PublicKey & { key: string }> {
    const body = parseBody(rotateKeyBody, rawBody ?? {});
    if (!UUID.test(id)) throw new ServiceError('key_not_found', { param: 'id' });
    if (actor) {
      // The new value acts with these scopes: the caller must hold them all.
      const current = body.scopes ?? (await this.repo.get(project.id, id))?.scopes;
      if (!current) throw new ServiceError('key_not_found', { param: 'id' });
      withinActor(actor, current);
    }
    const now = this.clock.now();
    let r;
    try {
      r = await this.repo.rotate(
        project,
        id,
        { scopes: body.scopes, graceMs: ROTATION_GRACE_MS },
        new Date(now),
      );
    } catch (err) {
      if (err instanceof InactiveKeyError) {
        const which = err.status === 'revoked' ? 'A revoked' : 'An expired';
        throw new ServiceError('invalid_state', { message: `${which} key cannot be rotated.` });
      }
      throw err;
    }
    if (!r) throw new ServiceError('key_not_found', { param: 'id' });
    await this.bus.publish('key', id);
    return { ...publicKey(r.record, now), key: r.value };
  }

  async revoke(projectId: string, id: string): Promise<PublicKey> {
    const k = UUID.test(id)
      ? await this.repo.revoke(projectId, id, new Date(this.clock.now()))
      : null;
    if (!k) throw new ServiceError('key_not_found', { param: 'id' });
    await this.bus.publish('key', id);
    return publicKey(k, this.clock.now());
  }
}
