/**
 * API key verification on the hot path.
 *
 * Algorithm: the bearer value is checked for shape (no lookup for malformed
 * values), hashed with SHA-256, and the hash is looked up in an LRU of verified
 * secrets; only a miss, or an entry older than the cache TTL, reads the
 * database (concurrent misses for one hash share one read). Hashes that match
 * no key are remembered in a second LRU: a value of 256 random bits can never
 * become valid later, so that cache needs no expiry. Entries are found by the hash
 * itself (the database by equality, the cache by key), so no separate comparison of
 * the stored and the computed hash is needed, constant-time or not: what an attacker
 * could time is a lookup of the SHA-256 of their own input.
 *
 * The outcome is one status decided here, once; the HTTP layer maps it to 401.
 * Expiry (`expiresAt`) and the rotation grace (`validUntil`) are compared with
 * the injected clock on every request, so they take effect to the millisecond
 * even for cached keys. Revocation clears this instance's cache at once and
 * other instances' through `invalidate` (wired to Redis pub/sub when enabled).
 */
import { LRUCache } from 'lru-cache';
import type { Clock, Timer } from '../runtime/clock.js';
import { bearerToken, hashKey, parseKey } from './format.js';
import type { KeyRecord } from './record.js';
import type { KeyRepository, SecretLookup } from './repository.js';

export type Verification =
  | { status: 'ok'; key: KeyRecord; hash: string }
  | { status: 'missing' | 'malformed' | 'unknown' | 'revoked' | 'expired' };

interface Cached {
  lookup: SecretLookup;
  hash: string;
  fetchedAt: number;
}

export interface KeyVerifierOptions {
  cacheSize: number;
  ttlMs: number;
}

export class KeyVerifier {
  private readonly known: LRUCache<string, Cached>;
  private readonly unknown: LRUCache<string, true>;
  private readonly pending = new Map<string, Promise<Cached | null>>();
  /**
   * Bumped by `invalidate` and `clear`: a lookup that started before is not cached
   * when it ends (it may hold the row as it was before the revocation), and
   * requests after the invalidation start a lookup of their own instead of joining
   * it. Without this, a lookup in flight when another instance's revocation arrived
   * put the unrevoked row back for a whole TTL.
   */
  private generation = 0;
  /** Key id → when it last verified, not yet written (`flushUse`). */
  private used = new Map<string, number>();
  private useTimer: Timer | null = null;

  constructor(
    private readonly repo: KeyRepository,
    private readonly clock: Clock,
    private readonly opts: KeyVerifierOptions,
  ) {
    this.known = new LRUCache({ max: opts.cacheSize });
    this.unknown = new LRUCache({ max: opts.cacheSize });
  }

  async verify(authorization: string | undefined): Promise<Verification> {
    const value = bearerToken(authorization);
    if (value === null) return { status: 'missing' };
    if (parseKey(value) === null) return { status: 'malformed' };
    const hash = hashKey(value);
    if (this.unknown.has(hash)) return { status: 'unknown' };

    const now = this.clock.now();
    let entry: Cached | null | undefined = this.known.get(hash);
    const age = entry ? now - entry.fetchedAt : Infinity;
    if (entry && age > this.opts.ttlMs && age <= 2 * this.opts.ttlMs) {
      // Stale-while-revalidate (see runtime/ttl-cache): answer from the entry,
      // refresh it in the background. Revocation and rotation invalidate the
      // entry at once (`invalidate`, across instances via the bus), so the TTL
      // only bounds how long an out-of-band database change can go unseen.
      if (!this.pending.has(hash)) void this.load(hash, entry).catch(() => undefined);
    } else if (!entry || age > this.opts.ttlMs) {
      entry = await this.load(hash, entry);
    }
    if (!entry) return { status: 'unknown' };
    const v = decide(entry, now);
    if (v.status === 'ok') this.used.set(v.key.id, now);
    return v;
  }

  /**
   * Writes the keys used since the last write to `last_used_at`, every
   * `intervalMs` on the clock, and once more from `stopRecordingUse`. The request
   * itself only sets a map entry; a failed write keeps its entries for the next.
   */
  recordUse(intervalMs: number): void {
    const tick = () => {
      void this.flushUse().finally(() => {
        if (this.useTimer) this.useTimer = this.clock.setTimer(intervalMs, tick);
      });
    };
    this.useTimer = this.clock.setTimer(intervalMs, tick);
  }

  async stopRecordingUse(): Promise<void> {
    this.useTimer?.cancel();
    this.useTimer = null;
    await this.flushUse();
  }

  /** Writes what is pending now (tests, shutdown). */
  async flushUse(): Promise<void> {
    if (this.used.size === 0) return;
    const batch = this.used;
    this.used = new Map();
    try {
      await this.repo.touch(batch);
    } catch {
      // Database away: keep the latest time per key for the next write.
      for (const [id, at] of batch) {
        if ((this.used.get(id) ?? 0) < at) this.used.set(id, at);
      }
    }
  }

  /**
   * A key by id, read from the database (no cache), decided like a presented value:
   * for in-process requests on a key's behalf (http/internal-key.ts).
   */
  async verifyById(projectId: string, keyId: string): Promise<Verification> {
    const record = await this.repo.get(projectId, keyId);
    if (!record) return { status: 'unknown' };
    return decide(
      { lookup: { record, validUntil: null }, hash: '', fetchedAt: 0 },
      this.clock.now(),
    );
  }

  /** Drops cached verifications of a key (after revoke or rotation). */
  invalidate(keyId: string): void {
    this.generation++;
    // A lookup in flight is by hash, its key not known yet: all are let go.
    this.pending.clear();
    for (const [hash, entry] of this.known.entries()) {
      if (entry.lookup.record.id === keyId) this.known.delete(hash);
    }
  }

  clear(): void {
    this.generation++;
    this.pending.clear();
    this.known.clear();
  }

  private load(hash: string, stale: Cached | undefined): Promise<Cached | null> {
    let p = this.pending.get(hash);
    if (p) return p;
    const generation = this.generation;
    p = this.repo
      .findBySecretHash(hash)
      .then(
        (found) => {
          const current = generation === this.generation;
          if (!found) {
            if (current) {
              this.known.delete(hash);
              this.unknown.set(hash, true);
            }
            return null;
          }
          const entry: Cached = { lookup: found, hash: found.hash, fetchedAt: this.clock.now() };
          if (current) this.known.set(hash, entry);
          return entry;
        },
        (err: unknown) => {
          // Database unreachable: a key verified before keeps working from the
          // cache (its expiry is still enforced by the clock); an unseen key cannot
          // be verified, so the error propagates (503 at the HTTP layer).
          if (stale) return stale;
          throw err;
        },
      )
      .finally(() => {
        if (this.pending.get(hash) === p) this.pending.delete(hash);
      });
    this.pending.set(hash, p);
    return p;
  }
}

function decide(entry: Cached, now: number): Verification {
  const { record, validUntil } = entry.lookup;
  if (record.revokedAt) return { status: 'revoked' };
  if (record.expiresAt && record.expiresAt.getTime() <= now) return { status: 'expired' };
  if (validUntil && validUntil.getTime() <= now) return { status: 'expired' };
  return { status: 'ok', key: record, hash: entry.hash };
}
