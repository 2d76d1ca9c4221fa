/**
 * A bounded read-through cache with a time-to-live measured by the injected
 * clock. Concurrent misses for one key share one load; a failed refresh serves
 * the stale value when there is one (the database being briefly unreachable
 * must not take the hot path down), else the error propagates.
 *
 * Stale-while-revalidate: an entry past its TTL but younger than twice the TTL
 * is served at once while one refresh runs in the background. Blocking on the
 * refresh instead made every request that arrived during it wait a database
 * round trip, once per TTL per entry: at 1,000 req/s with a 1 s TTL that was
 * the router's whole p99/p99.9 (measured: tens of ms). Changes that must show
 * at once (revocation, endpoint and worker edits) are pushed by invalidation
 * (`delete`/`clear`, also across instances via the invalidation bus), not by
 * the TTL. A TTL of 0 disables caching and staleness alike.
 */
import { LRUCache } from 'lru-cache';
import type { Clock } from './clock.js';

interface Entry<V> {
  value: V;
  at: number;
}

export class TtlCache<V> {
  private readonly entries: LRUCache<string, Entry<V>>;
  private readonly pending = new Map<string, Promise<V>>();
  /**
   * Bumped by every `delete` and `clear`: a load that started before is not cached
   * when it ends, since it may have read what the invalidation was about (a row
   * read just before a suspension, committed elsewhere, would otherwise be cached
   * again after its invalidation arrived, and served for a TTL or longer).
   */
  private generation = 0;

  constructor(
    private readonly clock: Clock,
    private readonly ttlMs: number,
    max: number,
    /** False: past the TTL every read waits for the refresh (exact, e.g. credit). */
    private readonly staleWhileRevalidate = true,
  ) {
    this.entries = new LRUCache({ max });
  }

  /** The cached value when fresh; otherwise undefined (no load). */
  peek(key: string): V | undefined {
    const e = this.entries.get(key);
    return e && this.clock.now() - e.at <= this.ttlMs ? e.value : undefined;
  }

  get(key: string, load: () => Promise<V>): Promise<V> | V {
    const e = this.entries.get(key);
    const age = e ? this.clock.now() - e.at : Infinity;
    if (e && age <= this.ttlMs) return e.value;
    if (e && this.staleWhileRevalidate && age <= 2 * this.ttlMs) {
      // Serve the stale value now; refresh once in the background (a failed
      // refresh keeps the stale value, as below).
      if (!this.pending.has(key)) void this.refresh(key, load, e).catch(() => undefined);
      return e.value;
    }
    return this.pending.get(key) ?? this.refresh(key, load, e);
  }

  private refresh(key: string, load: () => Promise<V>, e: Entry<V> | undefined): Promise<V> {
    const joined = this.pending.get(key);
    if (joined) return joined;
    const generation = this.generation;
    const q: Promise<V> = load()
      .then(
        (value) => {
          if (generation === this.generation)
            this.entries.set(key, { value, at: this.clock.now() });
          return value;
        },
        (err: unknown) => {
          if (e) return e.value;
          throw err;
        },
      )
      .finally(() => {
        if (this.pending.get(key) === q) this.pending.delete(key);
      });
    this.pending.set(key, q);
    return q;
  }

  /** Drops the entry; a load in flight for it is neither joined nor cached. */
  delete(key: string): void {
    this.generation++;
    this.entries.delete(key);
    this.pending.delete(key);
  }

  clear(): void {
    this.generation++;
    this.entries.clear();
    this.pending.clear();
  }

  /**
   * Every entry due for a reload on its next read (which waits for it), like
   * `clear`, except that a reload that fails serves the old value: for data whose
   * stale copy is safer than none (the worker list during a database outage).
   */
  expireAll(): void {
    this.generation++;
    this.pending.clear();
    for (const e of this.entries.values()) e.at = -Infinity;
  }
}
