/**
 * Worker selection for a request: the healthy workers serving the endpoint's
 * (model, tier) pair, read through a short-lived cache so the hot path does
 * no database read, and the one with the fewest requests in flight from this
 * router (ties broken round-robin). Routing never leaves the endpoint's tier.
 *
 * Circuit breaker per worker: after 3 consecutive failures (connection refused
 * or reset, 5xx before any byte) the worker is skipped for 5 s; then one
 * request probes it (half-open); a success closes the breaker, a failure opens
 * it again. When every candidate's breaker is open, the least recently opened
 * one is still tried, so an endpoint never fails only because of the breaker.
 *
 * Health beyond the breaker (missed heartbeats, failed health checks) is the
 * registry's `status`, kept by the monitor (monitor.ts): only `healthy` workers
 * are candidates. A worker's capacity (self-registration) lowers its in-flight
 * limit below the router-wide one.
 *
 * Live signals: the monitor stores each worker's last scrape of its `/metrics`
 * here (`setSignals`); scorers read them with `signals(id)` and the router's own
 * view with `load(id)` / `limit(w)` / `isOpen(id)`.
 */
import type { Clock } from '../runtime/clock.js';
import type { Metrics } from '../runtime/metrics.js';
import { TtlCache } from '../runtime/ttl-cache.js';
import type { WorkerRecord, WorkerRegistry } from './registry.js';
import type { WorkerSignals } from './signals.js';

export const BREAKER_THRESHOLD = 3;
export const BREAKER_COOLDOWN_MS = 5000;

interface Breaker {
  failures: number;
  openUntil: number;
  probing: boolean;
}

export class WorkerPool {
  private readonly cache: TtlCache<WorkerRecord[]>;
  private readonly inFlight = new Map<string, number>();
  private readonly breakers = new Map<string, Breaker>();
  private readonly live = new Map<string, WorkerSignals>();
  private rr = 0;
  /** Signals older than this are not returned (the worker stopped answering scrapes). */
  private signalsMaxAgeMs = Infinity;

  constructor(
    private readonly registry: WorkerRegistry,
    private readonly clock: Clock,
    ttlMs = 1000,
    /** Requests one router sends one worker at most; beyond it the worker is saturated. */
    private readonly maxInFlight = 256,
    private readonly metrics?: Metrics,
  ) {
    this.cache = new TtlCache(clock, ttlMs, 1024);
  }

  candidates(modelId: string, tierId: string): Promise<WorkerRecord[]> | WorkerRecord[] {
    return this.cache.get(`${modelId}:${tierId}`, async () =>
      (await this.registry.list({ modelId, tierId })).filter((w) => w.status === 'healthy'),
    );
  }

  /** Least in-flight first; `exclude` skips workers that already failed this request. */
  pick(candidates: readonly WorkerRecord[], exclude?: ReadonlySet<string>): WorkerRecord | null {
    let best: WorkerRecord | null = null;
    let bestLoad = Infinity;
    const n = candidates.length;
    if (n === 0) return null;
    const start = this.rr++ % n;
    const now = this.clock.now();
    let fallback: WorkerRecord | null = null;
    let fallbackOpenUntil = Infinity;
    for (let i = 0; i < n; i++) {
      const w = candidates[(start + i) % n]!;
      if (exclude?.has(w.id)) continue;
      const b = this.breakers.get(w.id);
      if (b && b.failures >= BREAKER_THRESHOLD && (now < b.openUntil || b.probing)) {
        if (b.openUntil < fallbackOpenUntil) {
          fallback = w;
          fallbackOpenUntil = b.openUntil;
        }
        continue;
      }
      const load = this.inFlight.get(w.id) ?? 0;
      if (load >= this.limit(w)) continue;
      if (load < bestLoad) {
        best = w;
        bestLoad = load;
      }
    }
    const chosen = best ?? fallback;
    if (chosen) {
      const b = this.breakers.get(chosen.id);
      // Past its cool-down an open breaker lets this one request through as the probe.
      if (b && b.failures >= BREAKER_THRESHOLD && now >= b.openUntil) b.probing = true;
      this.metrics?.workerChosen.inc({ worker: chosen.id });
    }
    return chosen;
  }

  /** In-flight requests this router sends the worker at most (its capacity, if lower). */
  limit(w: Pick<WorkerRecord, 'capacity'>): number {
    return w.capacity != null && w.capacity > 0
      ? Math.min(w.capacity, this.maxInFlight)
      : this.maxInFlight;
  }

  /** True when every candidate is at its in-flight limit (429 `capacity_exceeded`). */
  saturated(candidates: readonly WorkerRecord[]): boolean {
    return (
      candidates.length > 0 &&
      candidates.every((w) => (this.inFlight.get(w.id) ?? 0) >= this.limit(w))
    );
  }

  /** A failure before any byte reached the client (connect error, reset, 5xx). */
  failure(id: string): void {
    this.metrics?.workerErrors.inc({ worker: id });
    const b = this.breakers.get(id) ?? { failures: 0, openUntil: 0, probing: false };
    b.failures++;
    b.probing = false;
    if (b.failures >= BREAKER_THRESHOLD) b.openUntil = this.clock.now() + BREAKER_COOLDOWN_MS;
    this.breakers.set(id, b);
  }

  success(id: string): void {
    if (this.breakers.has(id)) this.breakers.delete(id);
  }

  /** True while the worker's breaker is open (for metrics and tests). */
  isOpen(id: string): boolean {
    const b = this.breakers.get(id);
    return !!b && b.failures >= BREAKER_THRESHOLD && this.clock.now() < b.openUntil;
  }

  acquire(id: string): void {
    this.metrics?.workerRequests.inc({ worker: id });
    this.inFlight.set(id, (this.inFlight.get(id) ?? 0) + 1);
  }

  release(id: string): void {
    const n = (this.inFlight.get(id) ?? 1) - 1;
    if (n <= 0) this.inFlight.delete(id);
    else this.inFlight.set(id, n);
  }

  load(id: string): number {
    return this.inFlight.get(id) ?? 0;
  }

  invalidate(): void {
    this.cache.clear();
  }

  /**
   * The worker's last scraped load signals, or null when it exports none of
   * the known metric families or the last good scrape is too old.
   */
  signals(id: string): WorkerSignals | null {
    const s = this.live.get(id);
    if (!s || this.clock.now() - s.scrapedAt > this.signalsMaxAgeMs) return null;
    return s;
  }

  /** Called by the monitor after each scrape (null clears them). */
  setSignals(id: string, s: WorkerSignals | null): void {
    if (s) this.live.set(id, s);
    else this.live.delete(id);
  }

  setSignalsMaxAge(ms: number): void {
    this.signalsMaxAgeMs = ms;
  }

  /** Forgets a removed worker's live state (breaker, signals). */
  forget(id: string): void {
    this.breakers.delete(id);
    this.live.delete(id);
  }
}
