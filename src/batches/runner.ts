/**
 * The batch runner (role `dispatcher`; any number of instances on one database).
 *
 * Claim: one short transaction takes the oldest active batch (`validating`,
 * `in_progress`, `finalizing`, `cancelling`) with no live lease, `FOR UPDATE SKIP
 * LOCKED` so runners never wait on each other, and gives it a lease
 * (`lease_until`, renewed while the runner works on it) and a new fencing token
 * (`lease_token` + 1); `validating` becomes `in_progress`. A runner that dies
 * leaves its lease to run out; another runner then claims the batch and carries on
 * from the requests still `pending`. Every write of a runner is fenced by its
 * token: once another runner holds the batch, the old one's results are discarded
 * (a request in flight when its runner lost the lease may run twice; none runs
 * twice otherwise). An idle poll is one select without a transaction.
 *
 * Run: the batch's pending requests, in input order, at most
 * SWITCHYARD_BATCH_CONCURRENCY (4) at a time per batch and two batches per runner,
 * so batches do not crowd out interactive traffic. Each request is a real request
 * through the app (`app.inject` of `POST /<project>/<endpoint>/v1/…`), authenticated
 * as the key that created the batch (http/internal-key.ts), so the key's status
 * and scopes, the limits, routing, usage records and billing apply as to any
 * request. A 2xx is `completed`, anything else `failed` with the answer kept,
 * except 429 and 503 (limits, capacity, a provisioning endpoint): the request stays
 * pending and the batch waits `Retry-After` (at most 30 s) before going on. After
 * each request the counts are updated; the batch's status comes back with them,
 * so a cancel is seen at the next request.
 *
 * Finalise (one fenced transaction): `cancelling` → `cancelled` (requests not run
 * stay out of both files), past `expires_at` by the injected clock → `expired`
 * (requests not run go to the error file with code `batch_expired` and count as
 * failed), no request pending → `completed`. The output file (purpose
 * `batch_output`) holds the completed requests' lines `{id, custom_id, response:
 * {status_code, request_id, body}, error: null}` in input order, the error file the
 * failed ones; the `batch_requests` rows are dropped. `batch.completed` and
 * `batch.cancelled` events are emitted (the spec lists no event for expiry).
 */
import { randomBytes } from 'node:crypto';
import { and, asc, eq, inArray, sql, type Placeholder } from 'drizzle-orm';
import type { FastifyInstance } from 'fastify';
import { emitEvent } from '../events/outbox.js';
import { FileService, newFileId, UploadService } from '../files/index.js';
import { INTERNAL_KEY_HEADER, internalKeyCredential } from '../http/internal-key.js';
import type { Services } from '../runtime/services.js';
import { tables } from '../store/index.js';
import { ACTIVE_STATUSES, publicBatch } from './service.js';

const B = tables.batches;
const R = tables.batchRequests;
const F = tables.files;
const C = tables.blobChunks;

export const LEASE_MS = 60_000;
const MAX_BACKOFF_MS = 30_000;
/** A file still `uploading` after this long was abandoned by a router that died. */
const STALE_UPLOAD_MS = 24 * 60 * 60 * 1000;
/** Output lines per stored chunk of a result file. */
const LINES_PER_CHUNK = 256;
/** A batch some runner should take up: active, with no lease or an expired one. */
function dueBatch(now: Date | Placeholder) {
  return and(
    inArray(B.status, [...ACTIVE_STATUSES]),
    sql`(${B.leaseUntil} is null or ${B.leaseUntil} <= ${now})`,
  );
}

const EXPIRED_MESSAGE = 'This request could not be executed before the completion window expired.';

export interface BatchRunnerOptions {
  pollMs?: number;
  leaseMs?: number;
  /** Requests of one batch in flight at once (default: SWITCHYARD_BATCH_CONCURRENCY). */
  concurrency?: number;
  /** Batches one runner works on at once. */
  maxBatches?: number;
}

interface Claimed {
  id: string;
  token: number;
  projectId: string;
  keyId: string;
  endpoint: string;
  /** The endpoint's id: its result files are visible to its keys (and unbound ones). */
  endpointId: string;
  /** `/<project external id>/<endpoint slug>`: where the batch's requests go. */
  base: string;
}

interface Line {
  idx: number;
  customId: string;
  body: string;
}

type Outcome = { kind: 'done'; ok: boolean; result: string } | { kind: 'retry'; afterMs: number };

class LostLease extends Error {}

export class BatchRunner {
  private running = false;
  private loop: Promise<void> | null = null;
  private wake: (() => void) | null = null;
  /** Wake-ups of the batches waiting out a Retry-After (a stop ends their wait). */
  private readonly backoffs = new Set<() => void>();
  private readonly active = new Set<Promise<void>>();
  private readonly pollMs: number;
  private readonly leaseMs: number;
  private readonly concurrency: number;
  private readonly maxBatches: number;
  private readonly probe;
  private readonly files: FileService;
  private readonly uploads: UploadService;
  /** Requests this runner has sent (tests). */
  stats = { requests: 0, finalized: 0 };

  constructor(
    private readonly s: Services,
    private readonly app: FastifyInstance,
    opts: BatchRunnerOptions = {},
  ) {
    this.pollMs = opts.pollMs ?? 1000;
    this.leaseMs = opts.leaseMs ?? LEASE_MS;
    this.concurrency = opts.concurrency ?? s.config.batchConcurrency;
    this.maxBatches = opts.maxBatches ?? 2;
    this.files = new FileService(s.store.db, s.clock);
    this.uploads = new UploadService(s.store.db, s.clock, {
      maxFileBytes: s.config.maxFileBytes,
      maxPartBytes: s.config.maxUploadPartBytes,
    });
    const now = sql.placeholder('now');
    this.probe = s.store.db.select({ id: B.id }).from(B).where(dueBatch(now)).limit(1).prepare('');
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    this.loop = (async () => {
      let polls = 0;
      while (this.running) {
        let claimed: Claimed | null = null;
        if (this.active.size < this.maxBatches) {
          try {
            if (polls++ % 60 === 0) await this.sweep();
            const due = await this.probe.execute({ now: new Date(this.s.clock.now()) });
            if (due.length > 0) claimed = await this.claim();
          } catch (err) {
            this.s.logger.warn({ err }, 'batch claim failed');
          }
        }
        if (claimed) {
          const p: Promise<void> = this.run(claimed)
            .catch((err: unknown) =>
              this.s.logger.warn({ err, batch: claimed.id }, 'batch run failed'),
            )
            .finally(() => {
              this.active.delete(p);
              this.wake?.();
            });
          this.active.add(p);
          continue;
        }
        await this.sleep(this.pollMs);
      }
      await Promise.all(this.active);
    })();
  }

  /** Nudges an idle loop. */
  poke(): void {
    this.wake?.();
  }

  /** Stops claiming; batches in hand finish their requests in flight and give their lease back. */
  async stop(): Promise<void> {
    this.running = false;
    this.wake?.();
    for (const wake of [...this.backoffs]) wake();
    await this.loop;
  }

  /**
   * The idle loop's sleep (`poke` ends it), or with `backoff` a batch's wait for a
   * Retry-After, which has its own wake-up so that neither takes the other's.
   */
  private sleep(ms: number, backoff = false): Promise<void> {
    return new Promise<void>((resolve) => {
      const wake = () => {
        clearTimeout(t);
        if (backoff) this.backoffs.delete(wake);
        else if (this.wake === wake) this.wake = null;
        resolve();
      };
      const t = setTimeout(wake, ms);
      if (backoff) this.backoffs.add(wake);
      else this.wake = wake;
    });
  }

  /** Takes one claimable batch (or none). */
  async claim(): Promise<Claimed | null> {
    const now = new Date(this.s.clock.now());
    const db = this.s.store.db;
    const row = await db.transaction(async (tx) => {
      const [due] = await tx
        .select({ id: B.id })
        .from(B)
        .where(dueBatch(now))
        .orderBy(asc(B.seq))
        .limit(1)
        .for('update', { skipLocked: true });
      if (!due) return null;
      const [claimed] = await tx
        .update(B)
        .set({
          leaseUntil: new Date(now.getTime() + this.leaseMs),
          leaseToken: sql`${B.leaseToken} + 1`,
          inProgressAt: sql`coalesce(${B.inProgressAt}, case when ${B.status} = 'validating' then ${now}::timestamptz end)`,
          status: sql`case when ${B.status} = 'validating' then 'in_progress' else ${B.status} end`,
        })
        .where(eq(B.id, due.id))
        .returning();
      return claimed ?? null;
    });
    if (!row) return null;
    const [where] = await db
      .select({ project: tables.projects.externalId, slug: tables.endpoints.slug })
      .from(tables.endpoints)
      .innerJoin(tables.projects, eq(tables.projects.id, tables.endpoints.projectId))
      .where(eq(tables.endpoints.id, row.endpointId))
      .limit(1);
    return {
      id: row.id,
      token: row.leaseToken,
      projectId: row.projectId,
      keyId: row.keyId,
      endpoint: row.endpoint,
      endpointId: row.endpointId,
      base: `/${where?.project ?? '-'}/${encodeURIComponent(where?.slug ?? '-')}`,
    };
  }

  private async run(b: Claimed): Promise<void> {
    const db = this.s.store.db;
    // Real time on purpose: the lease is kept alive while this process works on the batch.
    const heartbeat = setInterval(
      () => void this.renew(b).catch(() => undefined),
      this.leaseMs / 4,
    );
    heartbeat.unref();
    try {
      for (;;) {
        const [state] = await db
          .select({ status: B.status, expiresAt: B.expiresAt })
          .from(B)
          .where(and(eq(B.id, b.id), eq(B.leaseToken, b.token)))
          .limit(1);
        if (!state) return;
        if (state.status === 'cancelling') return await this.finalize(b, 'cancelled');
        if (this.s.clock.now() >= state.expiresAt.getTime())
          return await this.finalize(b, 'expired');
        if (!this.running) return await this.release(b);
        const lines = await db
          .select({ idx: R.idx, customId: R.customId, body: R.body })
          .from(R)
          .where(and(eq(R.batchId, b.id), eq(R.status, 'pending')))
          .orderBy(asc(R.idx))
          .limit(this.concurrency * 8);
        if (lines.length === 0) return await this.finalize(b, 'completed');
        const { lost, backoffMs } = await this.runLines(b, lines);
        if (lost) return;
        if (backoffMs > 0 && this.running)
          await this.sleep(Math.min(backoffMs, MAX_BACKOFF_MS), true);
      }
    } catch (err) {
      if (err instanceof LostLease) return;
      throw err;
    } finally {
      clearInterval(heartbeat);
    }
  }

  /** Runs `lines` with bounded concurrency until done, halted (cancel, expiry, stop) or backing off. */
  private async runLines(b: Claimed, lines: Line[]): Promise<{ lost: boolean; backoffMs: number }> {
    const queue = [...lines];
    let halt = false;
    let lost = false;
    let backoffMs = 0;
    const worker = async () => {
      while (!halt && this.running && queue.length > 0) {
        const line = queue.shift()!;
        const outcome = await this.execute(b, line);
        if (outcome.kind === 'retry') {
          halt = true;
          backoffMs = Math.max(backoffMs, outcome.afterMs);
          continue;
        }
        const state = await this.record(b, line, outcome);
        if (!state) {
          halt = lost = true;
        } else if (
          state.status !== 'in_progress' ||
          this.s.clock.now() >= state.expiresAt.getTime()
        ) {
          halt = true;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(this.concurrency, lines.length) }, worker));
    return { lost, backoffMs };
  }

  /** One request through the app, as the batch's key. */
  private async execute(b: Claimed, line: Line): Promise<Outcome> {
    this.stats.requests++;
    let res;
    try {
      res = await this.app.inject({
        method: 'POST',
        url: `${b.base}${b.endpoint}`,
        headers: {
          'content-type': 'application/json',
          [INTERNAL_KEY_HEADER]: internalKeyCredential(b.projectId, b.keyId),
        },
        payload: line.body,
      });
    } catch (err) {
      this.s.logger.warn({ err, batch: b.id }, 'batch request could not be sent');
      return { kind: 'retry', afterMs: 1000 };
    }
    if (res.statusCode === 429 || res.statusCode === 503) {
      const after = Number(res.headers['retry-after']);
      return { kind: 'retry', afterMs: Number.isFinite(after) && after > 0 ? after * 1000 : 1000 };
    }
    let body: unknown = res.body;
    try {
      body = JSON.parse(res.body);
    } catch {
      // Not JSON: kept as text.
    }
    const requestId = res.headers['x-request-id'];
    const result = JSON.stringify({
      id: `batch_req_${randomBytes(12).toString('hex')}`,
      custom_id: line.customId,
      response: {
        status_code: res.statusCode,
        request_id: typeof requestId === 'string' ? requestId : null,
        body,
      },
      error: null,
    });
    return { kind: 'done', ok: res.statusCode >= 200 && res.statusCode < 300, result };
  }

  /** Records one request's outcome (fenced); the batch's status and expiry, or null if the lease is lost. */
  private async record(
    b: Claimed,
    line: Line,
    outcome: Extract<Outcome, { kind: 'done' }>,
  ): Promise<{ status: string; expiresAt: Date } | null> {
    const now = this.s.clock.now();
    try {
      return await this.s.store.db.transaction(async (tx) => {
        const updated = await tx
          .update(R)
          .set({ status: outcome.ok ? 'completed' : 'failed', result: outcome.result })
          .where(and(eq(R.batchId, b.id), eq(R.idx, line.idx), eq(R.status, 'pending')))
          .returning({ idx: R.idx });
        const [state] = await tx
          .update(B)
          .set({
            ...(updated.length
              ? outcome.ok
                ? { completed: sql`${B.completed} + 1` }
                : { failed: sql`${B.failed} + 1` }
              : {}),
            leaseUntil: new Date(now + this.leaseMs),
          })
          .where(and(eq(B.id, b.id), eq(B.leaseToken, b.token)))
          .returning({ status: B.status, expiresAt: B.expiresAt });
        if (!state) throw new LostLease();
        return state;
      });
    } catch (err) {
      if (err instanceof LostLease) return null;
      throw err;
    }
  }

  private async renew(b: Claimed): Promise<void> {
    await this.s.store.db
      .update(B)
      .set({ leaseUntil: new Date(this.s.clock.now() + this.leaseMs) })
      .where(and(eq(B.id, b.id), eq(B.leaseToken, b.token)));
  }

  /** Gives the batch back (stopping): another runner may claim it at once. */
  private async release(b: Claimed): Promise<void> {
    await this.s.store.db
      .update(B)
      .set({ leaseUntil: null })
      .where(and(eq(B.id, b.id), eq(B.leaseToken, b.token)));
  }

  private async finalize(
    b: Claimed,
    outcome: 'completed' | 'cancelled' | 'expired',
  ): Promise<void> {
    const now = new Date(this.s.clock.now());
    const emitted = await this.s.store.db.transaction(async (tx) => {
      const [cur] = await tx
        .select({ id: B.id, status: B.status })
        .from(B)
        .where(and(eq(B.id, b.id), eq(B.leaseToken, b.token)))
        .for('update');
      if (!cur) return false;
      // A cancel that landed after the runner found nothing left to run: the client was
      // told `cancelling`, so the batch ends cancelled (its results all in the output).
      if (outcome === 'completed' && cur.status === 'cancelling') outcome = 'cancelled';
      let expired = 0;
      if (outcome === 'expired') {
        const rows = await tx
          .update(R)
          .set({
            status: 'failed',
            result: sql`json_build_object(
              'id', 'batch_req_' || substr(md5(random()::text || ${R.idx}::text), 1, 24),
              'custom_id', ${R.customId},
              'response', null,
              'error', json_build_object('code', 'batch_expired', 'message', ${EXPIRED_MESSAGE}::text)
            )::text`,
          })
          .where(and(eq(R.batchId, b.id), eq(R.status, 'pending')))
          .returning({ idx: R.idx });
        expired = rows.length;
      }
      const resultFile = async (status: 'completed' | 'failed', name: string) => {
        const [first] = await tx
          .select({ idx: R.idx })
          .from(R)
          .where(and(eq(R.batchId, b.id), eq(R.status, status)))
          .limit(1);
        if (!first) return null;
        const fileId = newFileId();
        await tx.insert(F).values({
          id: fileId,
          projectId: b.projectId,
          filename: `${b.id}_${name}.jsonl`,
          purpose: 'batch_output',
          endpointId: b.endpointId,
          bytes: 0,
          status: 'processed',
          createdAt: now,
        });
        await tx.execute(sql`
          insert into ${C} (owner, seq, data)
          select ${fileId}, ${R.idx} / ${sql.raw(String(LINES_PER_CHUNK))},
                 convert_to(string_agg(${R.result} || E'\\n', '' order by ${R.idx}), 'UTF8')
          from ${R}
          where ${R.batchId} = ${b.id} and ${R.status} = ${status}
          group by ${R.idx} / ${sql.raw(String(LINES_PER_CHUNK))}`);
        await tx.execute(sql`
          update ${F} set bytes = (
            select coalesce(sum(octet_length(${C.data})), 0) from ${C} where ${C.owner} = ${fileId}
          ) where ${F.id} = ${fileId}`);
        return fileId;
      };
      const outputFileId = await resultFile('completed', 'output');
      const errorFileId = await resultFile('failed', 'error');
      await tx.delete(R).where(eq(R.batchId, b.id));
      const [done] = await tx
        .update(B)
        .set({
          status: outcome,
          outputFileId,
          errorFileId,
          failed: sql`${B.failed} + ${expired}`,
          finalizingAt: now,
          leaseUntil: null,
          ...(outcome === 'completed' ? { completedAt: now } : {}),
          ...(outcome === 'cancelled' ? { cancelledAt: now } : {}),
          ...(outcome === 'expired' ? { expiredAt: now } : {}),
        })
        .where(eq(B.id, b.id))
        .returning();
      if (outcome !== 'expired') {
        await emitEvent(tx, {
          projectId: b.projectId,
          type: outcome === 'completed' ? 'batch.completed' : 'batch.cancelled',
          data: { ...publicBatch(done!) },
          now,
        });
      }
      return true;
    });
    if (emitted) {
      this.stats.finalized++;
      this.s.dispatcher.poke();
    }
  }

  /** Housekeeping: uploads past their hour, and files whose upload never finished (a crash). */
  private async sweep(): Promise<void> {
    await this.uploads.expireDue();
    await this.files.discardStale(STALE_UPLOAD_MS);
  }
}
