/**
 * Worker selection for a request: the healthy workers serving the endpoint's
 * (model, tier) pair, read through a short-lived cache so the hot path does
 * no database read, and among them the scorer's choice (`route`, below; or the
 * fewest requests in flight with `least-loaded`). Routing never leaves the
 * endpoint's tier.
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
 *
 * Choosing (`route`): the pool filters the candidates (not already tried, breaker
 * closed or half-open, under the in-flight limit for the request's `service_tier`:
 * flex 85 %, default/auto 100 %, priority 115 % of the limit, see score.ts
 * `admissionLimit`) and the WorkerScorer (score.ts) picks among them by predicted
 * cost: load, KV-cache pressure, prefix-cache affinity, SLO headers. The lease it
 * returns goes back through `firstToken`, `finish` (observed TTFT, TPOT and
 * `cached_tokens` correct the scorer and the prefix index) or `abandon`.
 *
 * Queue order at the worker: a worker registered with `scheduling_policy: priority`
 * orders its waiting queue by the `priority` its requests carry; its leases carry the
 * one PrefillOrder gives (prefill-order.ts: warm before cold, arrival within each,
 * a warm request after the prefill its hit waits for), whose pending blocks are
 * released at the first token or with the lease.
 *
 * Wait queue (`admit`): when no candidate admits the request, it waits in a queue
 * per (model, tier) ordered by `service_tier` (priority, default/auto, flex) then
 * arrival, for at most `queueTimeoutMs` (capped by the caller's deadline); each
 * released slot hands the head of the queue a worker. Beyond `queueDepth` waiting
 * requests, or at the wait's end, the request gets 429 `capacity_exceeded`.
 */
import type { Clock, Timer } from '../runtime/clock.js';
import type { Metrics } from '../runtime/metrics.js';
import { TtlCache } from '../runtime/ttl-cache.js';
import { PrefillOrder } from './prefill-order.js';
import type { PromptBlocks } from './prefix-index.js';
import type { WorkerRecord, WorkerRegistry } from './registry.js';
import { admissionLimit, tierRank, WorkerScorer, type Candidate, type Route } from './score.js';
import type { WorkerSignals } from './signals.js';
import type { ServiceTierHint, SloTargets } from './slo.js';

/** What the scorer needs to know of one request. */
export interface RouteHints {
  blocks: PromptBlocks;
  promptTokens: number;
  slo: SloTargets;
  tier: ServiceTierHint;
}

/** A worker given to one request; hand it back with `finish` or `abandon` exactly once. */
export interface Lease {
  worker: WorkerRecord;
  route: Route;
  released: boolean;
  /**
   * The `priority` to send the worker (prefill-order.ts), when it orders its queue by
   * one (`scheduling_policy: priority`); undefined otherwise.
   */
  priority?: number;
  /** Clears the request's pending prefill blocks (at the first token or the end). */
  prefilled?: () => void;
  /** The half-open probe of the worker's open breaker. */
  probe?: boolean;
}

export interface WaitOptions {
  /** Upper bound of the wait (the request's own deadline), ms. */
  maxWaitMs: number;
  /** Aborts the wait (the client went away). */
  signal?: AbortSignal;
}

export interface QueueSettings {
  /** Requests that may wait per (model, tier); 0 disables the queue. */
  depth: number;
  /** Longest wait, ms. */
  timeoutMs: number;
}

interface Waiter {
  candidates: readonly WorkerRecord[];
  hints: RouteHints;
  rank: number;
  seq: number;
  resolve: (lease: Lease | null) => void;
  timer: Timer;
  done: boolean;
}

export type RoutingPolicy = 'score' | 'least-loaded';

/** Why `admit` returned no lease. */
export type AdmitFailure = 'unavailable' | 'capacity_exceeded';

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
  /** Admission is the pool's (per-worker limits); the scorer only ranks. */
  readonly scorer = new WorkerScorer({ maxInFlight: Infinity });
  /** Priorities for workers with `scheduling_policy: priority`. */
  readonly prefillOrder = new PrefillOrder();
  private readonly queues = new Map<string, Waiter[]>();
  /**
   * The healthy workers of each (model, tier) as last read (queue key): a request waits
   * for these, not for the list it was given when it started to wait, so a worker that
   * joined serves it and a worker that was drained or removed meanwhile does not.
   */
  private readonly current = new Map<string, WorkerRecord[]>();
  private waitSeq = 0;
  private queue: QueueSettings = { depth: 64, timeoutMs: 5000 };
  private policy: RoutingPolicy = 'score';

  constructor(
    private readonly registry: WorkerRegistry,
    private readonly clock: Clock,
    ttlMs = 1000,
    /** Requests one router sends one worker at most; beyond it the worker is saturated. */
    private readonly maxInFlight = 256,
    private readonly metrics?: Metrics,
  ) {
    this.cache = new TtlCache(clock, ttlMs, 1024);
    metrics?.setQueueDepth(() => this.queueDepths());
    metrics?.setIndexStats(() => this.scorer.index.predictionStats());
  }

  setQueue(q: QueueSettings): void {
    this.queue = q;
  }

  /** `score` (default) or `least-loaded` (fewest in flight, ties rotate): an operator's fallback and the A/B baseline. */
  setPolicy(p: RoutingPolicy): void {
    this.policy = p;
  }

  candidates(modelId: string, tierId: string): Promise<WorkerRecord[]> | WorkerRecord[] {
    return this.cache.get(`${modelId}:${tierId}`, async () => {
      const list = (await this.registry.list({ modelId, tierId })).filter(
        (w) => w.status === 'healthy',
      );
      this.current.set(queueKey({ modelId, tierId }), list);
      return list;
    });
  }

  /**
   * The scorer's choice among the candidates that admit this request now (see the
   * header), acquired; null when none does. `exclude`: workers this request tried.
   */
  route(
    candidates: readonly WorkerRecord[],
    hints: RouteHints,
    exclude?: ReadonlySet<string>,
  ): Lease | null {
    const n = candidates.length;
    if (n === 0) return null;
    const now = this.clock.now();
    const open: Candidate[] = [];
    let fallback: WorkerRecord | null = null;
    let fallbackOpenUntil = Infinity;
    for (let i = 0; i < n; i++) {
      const w = candidates[i]!;
      if (exclude?.has(w.id)) continue;
      if ((this.inFlight.get(w.id) ?? 0) >= this.tierLimit(w, hints.tier)) continue;
      const b = this.breakers.get(w.id);
      if (b && b.failures >= BREAKER_THRESHOLD && (now < b.openUntil || b.probing)) {
        if (b.openUntil < fallbackOpenUntil) {
          fallback = w;
          fallbackOpenUntil = b.openUntil;
        }
        continue;
      }
      const s = this.signals(w.id);
      open.push(
        s
          ? {
              id: w.id,
              exported: { running: s.running, waiting: s.waiting, kvCacheUsage: s.kvCacheUsage },
            }
          : { id: w.id },
      );
    }
    let chosen: WorkerRecord | null = null;
    let route: Route | null = null;
    if (open.length > 0) {
      if (this.policy === 'least-loaded') open.splice(0, open.length, this.leastLoaded(open));
      const c = this.scorer.choose(open, { ...hints, nowMs: now });
      if (c.ok) {
        route = c.route;
        chosen = candidates.find((w) => w.id === c.route.workerId) ?? null;
      }
    } else if (fallback) {
      // Every admitting worker's breaker is open: the least recently opened one is tried.
      const c = this.scorer.choose([{ id: fallback.id }], { ...hints, nowMs: now });
      if (c.ok) {
        route = c.route;
        chosen = fallback;
      }
    }
    if (!chosen || !route) return null;
    const b = this.breakers.get(chosen.id);
    // Past its cool-down an open breaker lets this one request through as the probe.
    const probe = !!b && b.failures >= BREAKER_THRESHOLD && now >= b.openUntil && !b.probing;
    if (probe) b.probing = true;
    this.metrics?.workerChosen.inc({ worker: chosen.id });
    this.acquire(chosen.id);
    const lease: Lease = { worker: chosen, route, released: false };
    if (probe) lease.probe = true;
    if (chosen.schedulingPolicy !== 'priority') return lease;
    const ticket = this.prefillOrder.assign(route, now);
    this.metrics?.workerPriorityClass.inc({ worker: chosen.id, class: ticket.class });
    lease.priority = ticket.priority;
    lease.prefilled = ticket.release;
    return lease;
  }

  /**
   * `route`, or a place in the wait queue when every candidate is at its limit.
   * Resolves with a lease, or with the reason there is none.
   */
  async admit(
    candidates: readonly WorkerRecord[],
    hints: RouteHints,
    wait: WaitOptions,
  ): Promise<Lease | AdmitFailure> {
    if (candidates.length === 0) return 'unavailable';
    const key = queueKey(candidates[0]!);
    const q = this.queues.get(key);
    // Requests already waiting go first unless this one outranks them all.
    const rank = tierRank(hints.tier);
    if (!q || q.length === 0 || rank > q[0]!.rank) {
      const lease = this.route(candidates, hints);
      if (lease) return lease;
    }
    const timeoutMs = Math.min(this.queue.timeoutMs, wait.maxWaitMs);
    if ((q?.length ?? 0) >= this.queue.depth || timeoutMs <= 0 || wait.signal?.aborted) {
      return 'capacity_exceeded';
    }
    return new Promise<Lease | AdmitFailure>((resolve) => {
      const queue = q ?? [];
      if (!q) this.queues.set(key, queue);
      const onAbort = () => leave();
      const leave = () => {
        if (w.done) return;
        w.done = true;
        w.timer.cancel();
        wait.signal?.removeEventListener('abort', onAbort);
        const i = queue.indexOf(w);
        if (i >= 0) queue.splice(i, 1);
        if (queue.length === 0) this.queues.delete(key);
        resolve('capacity_exceeded');
      };
      const w: Waiter = {
        candidates,
        hints,
        rank,
        seq: this.waitSeq++,
        resolve: (lease) => {
          wait.signal?.removeEventListener('abort', onAbort);
          resolve(lease ?? 'capacity_exceeded');
        },
        timer: this.clock.setTimer(timeoutMs, leave),
        done: false,
      };
      wait.signal?.addEventListener('abort', onAbort, { once: true });
      // Higher rank first, then arrival.
      let i = queue.length;
      while (i > 0 && queue[i - 1]!.rank < rank) i--;
      queue.splice(i, 0, w);
    });
  }

  private leastLoaded(open: Candidate[]): Candidate {
    const n = open.length;
    const start = this.rr++ % n;
    let best = open[start]!;
    for (let i = 1; i < n; i++) {
      const c = open[(start + i) % n]!;
      if ((this.inFlight.get(c.id) ?? 0) < (this.inFlight.get(best.id) ?? 0)) best = c;
    }
    return best;
  }

  /** The first token reached the router: the request leaves the worker's prefill queue. */
  firstToken(lease: Lease): void {
    lease.prefilled?.();
    this.scorer.firstToken(lease.route, { nowMs: this.clock.now() });
  }

  /** The request completed on `lease.worker`; what was observed corrects the scorer. */
  finish(
    lease: Lease,
    o: { ttftMs?: number; tpotMs?: number; promptTokens?: number; cachedTokens?: number },
  ): void {
    if (lease.released) return;
    this.scorer.finish(lease.route, o);
    this.metrics?.observeWorker(lease.worker.id, o);
    this.releaseLease(lease);
  }

  /** The request failed, was cancelled, or moves to another worker. */
  abandon(lease: Lease): void {
    if (lease.released) return;
    this.scorer.fail(lease.route, { nowMs: this.clock.now() });
    this.releaseLease(lease);
  }

  private releaseLease(lease: Lease): void {
    lease.released = true;
    lease.prefilled?.();
    if (lease.probe) {
      // A probe that ended with neither `success` nor `failure` (the client left, the
      // worker was saturated or refused the request's body) proved nothing: the next
      // request may probe, instead of the worker staying out of the pool for good.
      const b = this.breakers.get(lease.worker.id);
      if (b) b.probing = false;
    }
    this.release(lease.worker.id);
    this.pump(queueKey(lease.worker));
  }

  /** Hands freed capacity to the waiting requests, head first, while they are admitted. */
  private pump(key: string): void {
    const q = this.queues.get(key);
    if (!q) return;
    const current = this.current.get(key);
    while (q.length > 0) {
      const w = q[0]!;
      const lease = this.route(current ?? w.candidates, w.hints);
      if (!lease) break;
      q.shift();
      w.done = true;
      w.timer.cancel();
      w.resolve(lease);
    }
    if (q.length === 0) this.queues.delete(key);
  }

  /** Requests waiting per (model name, tier), for /metrics; same-named models add up. */
  queueDepths(): Array<{ model: string; tier: string; depth: number }> {
    const out = new Map<string, { model: string; tier: string; depth: number }>();
    for (const q of this.queues.values()) {
      const w = q[0]?.candidates[0];
      if (!w) continue;
      const label = `${w.modelName}\u0000${w.tierId}`;
      const entry = out.get(label);
      if (entry) entry.depth += q.length;
      else out.set(label, { model: w.modelName, tier: w.tierId, depth: q.length });
    }
    return [...out.values()];
  }

  /** In-flight requests this router sends the worker at most (its capacity, if lower). */
  limit(w: Pick<WorkerRecord, 'capacity'>): number {
    return w.capacity != null && w.capacity > 0
      ? Math.min(w.capacity, this.maxInFlight)
      : this.maxInFlight;
  }

  /**
   * The worker's in-flight limit for a `service_tier` (score.ts `admissionLimit`),
   * at least 1 so that a small limit never shuts flex out of an idle worker.
   */
  tierLimit(w: Pick<WorkerRecord, 'capacity'>, tier: ServiceTierHint): number {
    return Math.max(1, admissionLimit(this.limit(w), tier));
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

  /**
   * A worker changed (here or, through the bus, on another instance): the next
   * request reloads the pool. If that reload fails (this instance cut off from the
   * database), the pool as last read still serves: another instance marking a
   * worker unhealthy because this one could not record its heartbeats must not
   * leave this one with no worker at all.
   */
  invalidate(): void {
    this.cache.expireAll();
  }

  /**
   * Capacity may have appeared (a worker joined, a limit changed): the worker list of
   * each queue is read again (after `invalidate`, a reload) and the queue served from it.
   */
  pumpAll(): void {
    for (const [key, q] of this.queues) {
      const w = q[0]?.candidates[0];
      if (!w) continue;
      const serve = () => this.pump(key);
      void Promise.resolve(this.candidates(w.modelId, w.tierId)).then(serve, serve);
    }
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
    this.scorer.forget(id);
  }
}

/** One wait queue per (model, tier). */
function queueKey(w: Pick<WorkerRecord, 'modelId' | 'tierId'>): string {
  // The model's id, not its name: two projects' own models may share a name.
  return `${w.modelId}\u0000${w.tierId}`;
}
