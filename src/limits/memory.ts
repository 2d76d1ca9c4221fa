/**
 * The in-process backend (no REDIS_URL): one router's limits in three maps,
 * one per rule kind. Synchronous, because this is the hot path: an
 * acquire of four rules is a few map lookups and integer arithmetic.
 *
 * Memory is bounded twice over. A sweep, run from acquire/add at most once
 * per `sweepIntervalMs` of the injected clock (no timers), drops every key
 * whose state has fully expired; dropping such a key changes no decision,
 * since an expired state and no state decide alike. And each map holds at
 * most `maxKeys` keys, evicting approximately least recently used ones
 * (keymap.ts); that does forget live counts, so size `maxKeys` well above the
 * number of keys active within one window.
 */
import {
  gcraAllows,
  gcraDebt,
  gcraDecision,
  gcraExpiresAt,
  gcraNext,
  type GcraState,
} from './gcra.js';
import { SlidingLog, bucketAt, sumGrainMs, windowDecision, windowGrainMs } from './log.js';
import { GenerationalMap } from './keymap.js';
import { toAmount, toBucket, toMs, validateRules, validateSumArgs } from './rules.js';
import type { Decision, LimiterBackend, Rule } from './types.js';

export interface MemoryLimiterOptions {
  /** Keys kept per rule kind before eviction. Default 100 000. */
  maxKeys?: number;
  /** Minimum time between sweeps of expired keys, by the injected clock. Default 10 s. */
  sweepIntervalMs?: number;
}

export class MemoryLimiter implements LimiterBackend {
  private readonly bursts: GenerationalMap<GcraState>;
  private readonly windows: GenerationalMap<SlidingLog>;
  private readonly sums: GenerationalMap<SlidingLog>;
  private readonly sweepIntervalMs: number;
  private nextSweepAt = -Infinity;
  // Reused across calls: acquire is synchronous, so no two calls interleave.
  private readonly debts: number[] = [];
  private readonly states: (GcraState | undefined)[] = [];
  private readonly logs: (SlidingLog | undefined)[] = [];

  constructor(opts: MemoryLimiterOptions = {}) {
    const max = opts.maxKeys ?? 100_000;
    this.bursts = new GenerationalMap(max);
    this.windows = new GenerationalMap(max);
    this.sums = new GenerationalMap(max);
    this.sweepIntervalMs = opts.sweepIntervalMs ?? 10_000;
  }

  acquire(rules: readonly Rule[], nowMs: number): Decision[] {
    validateRules(rules);
    const now = toMs(nowMs);
    if (now >= this.nextSweepAt) this.sweep(now);
    const n = rules.length;
    const debts = this.debts;
    const states = this.states;
    const logs = this.logs;

    // Phase 1: read every rule's state (pruning expired entries changes no
    // decision), decide whether all allow.
    let all = true;
    for (let i = 0; i < n; i++) {
      const r = rules[i]!;
      if (r.kind === 'burst') {
        const st = this.bursts.get(r.key);
        const d = gcraDebt(st, r.limit, now);
        states[i] = st;
        debts[i] = d;
        if (!gcraAllows(d, r.burst, r.windowMs)) all = false;
      } else {
        const log = (r.kind === 'window' ? this.windows : this.sums).get(r.key);
        if (log !== undefined) log.prune(now, r.windowMs);
        logs[i] = log;
        if ((log?.total ?? 0) >= r.limit) all = false;
      }
    }

    // Phase 2: count the request against every rule only if all allowed.
    const out = new Array<Decision>(n);
    for (let i = 0; i < n; i++) {
      const r = rules[i]!;
      if (r.kind === 'burst') {
        const d = debts[i]!;
        const st = states[i];
        states[i] = undefined;
        if (all) {
          const next = gcraNext(d, r.limit, r.windowMs, now);
          if (st === undefined) this.bursts.set(r.key, next);
          else Object.assign(st, next);
        }
        out[i] = gcraDecision(d, r.limit, r.burst, r.windowMs, all);
        continue;
      }
      const log = logs[i];
      logs[i] = undefined;
      const total = log?.total ?? 0;
      const lastQ = log?.last;
      const retryAt = total >= r.limit && log !== undefined ? log.retryAt(r.limit, r.windowMs) : 0;
      if (r.kind === 'window' && all) {
        const q = bucketAt(now, windowGrainMs(r.limit, r.windowMs), lastQ);
        let l = log;
        if (l === undefined) {
          l = new SlidingLog(r.windowMs);
          this.windows.set(r.key, l);
        }
        l.record(q, 1);
        out[i] = windowDecision(r.limit, r.windowMs, now, total, lastQ, q, 0);
      } else {
        out[i] = windowDecision(r.limit, r.windowMs, now, total, lastQ, undefined, retryAt);
      }
    }
    return out;
  }

  add(key: string, amount: number, windowMs: number, nowMs: number): void {
    validateSumArgs(key, windowMs);
    const a = toAmount(amount);
    const now = toMs(nowMs);
    if (a === 0) return;
    if (now >= this.nextSweepAt) this.sweep(now);
    let log = this.sums.get(key);
    if (log === undefined) {
      log = new SlidingLog(windowMs);
      this.sums.set(key, log);
    } else {
      log.prune(now, windowMs);
    }
    log.record(bucketAt(now, sumGrainMs(windowMs), log.last), a);
  }

  release(key: string, windowMs: number, atMs: number, nowMs: number): void {
    validateSumArgs(key, windowMs);
    const q = toBucket(atMs);
    const now = toMs(nowMs);
    const log = this.windows.get(key);
    if (log === undefined) return;
    log.prune(now, windowMs);
    log.remove(q);
  }

  async close(): Promise<void> {
    this.bursts.clear();
    this.windows.clear();
    this.sums.clear();
  }

  /** Keys currently held, per kind (for tests and metrics). */
  get size(): { burst: number; window: number; sum: number } {
    return { burst: this.bursts.size, window: this.windows.size, sum: this.sums.size };
  }

  /** Drops every key whose state has fully expired at nowMs. */
  sweep(nowMs: number): void {
    this.nextSweepAt = nowMs + this.sweepIntervalMs;
    this.bursts.deleteWhere((s) => gcraExpiresAt(s) <= nowMs);
    this.windows.deleteWhere((l) => l.expiresAt() <= nowMs);
    this.sums.deleteWhere((l) => l.expiresAt() <= nowMs);
  }
}
