/**
 * Sliding logs for 'window' and 'sum' rules: entries (q, n) meaning n units
 * were counted in the bucket ending at q, oldest first. An entry counts while
 * q > now - windowMs. With 1 ms buckets and whole-ms times this is the exact
 * sliding-window log; with wider buckets each unit is attributed to the end of
 * its bucket (q >= the true time), so it counts a little longer, never
 * shorter: the limit is never exceeded, at the price of the window being up to
 * one bucket longer (bounds in index.ts).
 */
import type { Decision } from './types.js';

/** Entries kept per key stay at or below this (plus one bucket). */
export const MAX_LOG_ENTRIES = 1000;

/** Exact 1 ms log while the limit bounds the entries; buckets of windowMs / 1000 above. */
export function windowGrainMs(limit: number, windowMs: number): number {
  return limit <= MAX_LOG_ENTRIES ? 1 : Math.ceil(windowMs / MAX_LOG_ENTRIES);
}

/** Usage is added on every request, so sums always use buckets of windowMs / 1000. */
export function sumGrainMs(windowMs: number): number {
  return Math.ceil(windowMs / MAX_LOG_ENTRIES);
}

/**
 * The bucket a unit counted at nowMs goes to. Never before the newest entry,
 * so the log stays sorted even if a clock steps back (that only makes the
 * limit stricter for a while).
 */
export function bucketAt(nowMs: number, grainMs: number, lastQ: number | undefined): number {
  const q = Math.ceil(nowMs / grainMs) * grainMs;
  return lastQ !== undefined && lastQ > q ? lastQ : q;
}

/**
 * A log kept in memory: parallel arrays with a moving head, so pruning the
 * oldest entry is O(1) and compaction is amortised.
 */
export class SlidingLog {
  private qs: number[] = [];
  private ns: number[] = [];
  private head = 0;
  /** Sum of n over live entries. */
  total = 0;

  constructor(
    /** The window last used with this key (for sweeps). */
    public windowMs: number,
  ) {}

  /** Drops entries whose bucket ended at least windowMs ago. */
  prune(nowMs: number, windowMs: number): void {
    this.windowMs = windowMs;
    const cut = nowMs - windowMs;
    const qs = this.qs;
    let h = this.head;
    while (h < qs.length && qs[h]! <= cut) {
      this.total -= this.ns[h]!;
      h++;
    }
    if (h === qs.length) {
      this.qs = [];
      this.ns = [];
      this.head = 0;
      this.total = 0;
    } else if (h > 64 && h * 2 > qs.length) {
      this.qs = qs.slice(h);
      this.ns = this.ns.slice(h);
      this.head = 0;
    } else {
      this.head = h;
    }
  }

  get last(): number | undefined {
    return this.qs.length > this.head ? this.qs[this.qs.length - 1] : undefined;
  }

  get entries(): number {
    return this.qs.length - this.head;
  }

  /** Counts `n` in bucket q (q >= last, from bucketAt). */
  record(q: number, n: number): void {
    const i = this.qs.length - 1;
    if (i >= this.head && this.qs[i] === q) this.ns[i]! += n;
    else {
      this.qs.push(q);
      this.ns.push(n);
    }
    this.total += n;
  }

  /** Takes one unit out of bucket q, if the log holds it; true when it did. */
  remove(q: number): boolean {
    for (let i = this.qs.length - 1; i >= this.head; i--) {
      const at = this.qs[i]!;
      if (at < q) return false;
      if (at !== q) continue;
      if (this.ns[i]! > 1) this.ns[i]! -= 1;
      else {
        this.qs.splice(i, 1);
        this.ns.splice(i, 1);
      }
      this.total -= 1;
      return true;
    }
    return false;
  }

  /** When the log would hold less than `limit` (absent other traffic): the end of the bucket whose expiry gets it there, plus the window. */
  retryAt(limit: number, windowMs: number): number {
    let left = this.total;
    for (let i = this.head; i < this.qs.length; i++) {
      left -= this.ns[i]!;
      if (left < limit) return this.qs[i]! + windowMs;
    }
    return this.qs.length > this.head ? this.qs[this.qs.length - 1]! + windowMs : 0;
  }

  /** First ms at which every entry has expired. */
  expiresAt(): number {
    const last = this.last;
    return last === undefined ? -Infinity : last + this.windowMs;
  }
}

/**
 * The decision for a 'window' rule over a pruned log holding `total` with
 * newest bucket `lastQ`. `admittedAt` is the bucket the request went to when
 * it was counted, undefined when it was not; `retryAt` (from
 * SlidingLog.retryAt) only matters when total >= limit.
 */
export function windowDecision(
  limit: number,
  windowMs: number,
  nowMs: number,
  total: number,
  lastQ: number | undefined,
  admittedAt: number | undefined,
  retryAt: number,
): Decision {
  if (admittedAt !== undefined) {
    return {
      allowed: true,
      limit,
      remaining: Math.max(0, limit - total - 1),
      resetMs: admittedAt + windowMs - nowMs,
      retryAfterMs: 0,
    };
  }
  const allowed = total < limit;
  return {
    allowed,
    limit,
    remaining: Math.max(0, limit - total),
    resetMs: lastQ === undefined ? 0 : lastQ + windowMs - nowMs,
    retryAfterMs: allowed ? 0 : retryAt - nowMs,
  };
}

/** The decision for a 'sum' rule (admission adds nothing, so there is one case). */
export function sumDecision(
  limit: number,
  windowMs: number,
  nowMs: number,
  total: number,
  lastQ: number | undefined,
  retryAt: number,
): Decision {
  return windowDecision(limit, windowMs, nowMs, total, lastQ, undefined, retryAt);
}
