/**
 * Worker scoring: one number per candidate worker, the predicted cost of sending this
 * request there in milliseconds (score = −cost, the highest score wins). The formula,
 * its constants and how `service_tier` acts are in docs/ROUTING.md; in short:
 *
 *   u  = max(0, prompt tokens − predicted cached tokens on w)        prefix affinity
 *   A  = max(router's pending prefill work on w, exported waiting × mean work)   load
 *   T̂  = m_w × (A + u + τ)                                           predicted TTFT
 *   R  = max(router's running on w, exported running)
 *   P̂  = b_w × (1 + κ·(R + 1))                                       predicted TPOT
 *   kv = 1 + K_kv × max(0, usage − knee) / (1 − knee)                KV-cache pressure
 *   busy = min(1, min over admitting candidates of m_w·A_w ÷ busyWaitMs)
 *   miss(x, target) = S_miss·[x > target] + λ·max(0, x − target)
 *   cost = T̂·kv + W_tpot·P̂ + (β + β_busy·busy)·m_w·u
 *        + miss(T̂·kv, SLO TTFT) + miss(P̂, SLO TPOT)      (only for targets the request has)
 *
 * m_w (ms per token of prefill work, queue included) and b_w (TPOT at an empty
 * batch) are per-worker EWMAs of observed TTFT and TPOT, each normalised by the work
 * the request found when it was dispatched, so a slow or overloaded worker is seen
 * as such within a few responses. "Pending prefill work" is Σ (u + τ) of this
 * router's requests on w that have not produced their first token yet, less the
 * progress of the oldest of them when the caller passes its clock (`nowMs`): it has
 * been prefilling since the previous first token on w, at m_w per token.
 * β·m_w·u is the worker time the uncached tokens take from the requests after this
 * one (and the cache they evict): T̂ alone is this request's own latency only. That
 * cost is real only when the requests after this one will have to queue anyway: while
 * some candidate is idle they can go there. So β_busy scales with `busy`, the
 * predicted queue wait of the least busy candidate (0 when one is idle, 1 from
 * busyWaitMs up): at low load the choice is T̂'s alone, under a backlog a cold prefill
 * (or a second copy of a prefix another worker holds) pays for the time it takes.
 * The SLO term is a step plus a hinge: S_miss steers the request to a worker that is
 * predicted to meet its target when one is; λ keeps the target's weight once none is,
 * so a request that will miss anyway is not traded (by the β terms) for a bigger miss.
 *
 * service_tier: adding ±15 to every worker's score changes no choice, so the hint
 * acts on admission instead: a worker admits a request while the router's in-flight
 * count on it is below maxInFlight × (1 + adjustment / 100), i.e. flex stops at 85 %,
 * default and auto at 100 %, priority may use the last 15 % of headroom. With no
 * admitting worker the request gets 429 `capacity_exceeded` (flex first), and
 * `tierRank` orders any router-side wait queue (priority, then default/auto, then flex).
 *
 * Pure parts (`scoreWorker`, `admits`) are plain functions over plain data; the
 * `WorkerScorer` class holds the per-worker state and the prefix index. Time comes
 * from the caller (observed latencies, optional `nowMs`), so nothing here reads a clock.
 */
import { PrefixIndex, type PromptBlocks, type RoutedPrompt } from './prefix-index.js';
import { TIER_ADJUSTMENT, type ServiceTierHint, type SloTargets } from './slo.js';

export interface ScoreConstants {
  /** τ: fixed prefill work per request, in token-equivalents. */
  requestOverheadTokens: number;
  /** m before any worker has been observed, ms per token. */
  priorMsPerToken: number;
  /** κ: relative TPOT growth per running sequence. */
  batchSlope: number;
  /** W_tpot: weight of the predicted TPOT (ms of cost per ms of TPOT). */
  tpotWeight: number;
  /** KV usage above which pressure adds cost. */
  kvKnee: number;
  /** K_kv: at 100 % usage the TTFT estimate is multiplied by 1 + K_kv. */
  kvWeight: number;
  /** S_miss: cost of a predicted SLO miss, ms. */
  sloMissMs: number;
  /** EWMA weight of each new observation. */
  ewmaAlpha: number;
  /**
   * β: cost of each uncached token beyond this request's TTFT, × m_w: the worker
   * time it takes from later requests (and the cache entries it evicts).
   */
  uncachedWeight: number;
  /** β_busy: added to β in proportion to how busy the least busy candidate is. */
  busyUncachedWeight: number;
  /** Predicted queue wait (ms) of the least busy candidate at which β_busy is full. */
  busyWaitMs: number;
  /**
   * λ: ms of cost per ms by which a prediction exceeds the request's SLO target, on
   * top of S_miss: a request that will miss its target still prefers the smaller miss.
   */
  sloOvershootWeight: number;
}

export const DEFAULT_SCORE_CONSTANTS: Readonly<ScoreConstants> = {
  requestOverheadTokens: 64,
  priorMsPerToken: 0.5,
  batchSlope: 0.02,
  tpotWeight: 1,
  kvKnee: 0.8,
  kvWeight: 1,
  sloMissMs: 2000,
  ewmaAlpha: 0.2,
  uncachedWeight: 0,
  busyUncachedWeight: 0.5,
  busyWaitMs: 100,
  sloOvershootWeight: 2,
};

/** What the router knows of one worker when scoring (all plain data). */
export interface WorkerView {
  id: string;
  /** Σ (u + τ) of this router's requests on the worker without a first token. */
  pendingPrefillTokens: number;
  /** This router's requests on the worker past their first token. */
  running: number;
  /** Scraped from the worker's /metrics; null or absent when unknown. */
  exportedWaiting?: number | null;
  exportedRunning?: number | null;
  kvCacheUsage?: number | null;
  /** m_w and b_w; undefined before the first observation. */
  msPerToken?: number;
  tpotBaseMs?: number;
}

export interface RequestView {
  promptTokens: number;
  slo: SloTargets;
}

export interface PoolView {
  /** Fallback m for workers not yet observed. */
  msPerToken: number;
  /** Fallback b for workers not yet observed (0 while none is). */
  tpotBaseMs: number;
  /** EWMA of (u + τ) over routed requests, to turn exported waiting into work. */
  meanWorkTokens: number;
  /**
   * 0–1: how busy the least busy candidate is (its predicted queue wait ÷ busyWaitMs,
   * capped); scales β_busy. Absent: 0.
   */
  busy?: number;
}

export interface WorkerScore {
  workerId: string;
  /** −cost: higher is better. */
  score: number;
  cost: number;
  predictedCachedTokens: number;
  predictedTtftMs: number;
  predictedTpotMs: number;
  /** Prefill work ahead of the request, token-equivalents. */
  aheadTokens: number;
  kvFactor: number;
  sloPenaltyMs: number;
}

/** The score of one worker; pure. */
export function scoreWorker(
  w: WorkerView,
  req: RequestView,
  predictedCachedTokens: number,
  pool: PoolView,
  k: ScoreConstants = DEFAULT_SCORE_CONSTANTS,
): WorkerScore {
  const cached = Math.max(0, Math.min(predictedCachedTokens, req.promptTokens));
  const uncached = req.promptTokens - cached;
  const ahead = Math.max(w.pendingPrefillTokens, (w.exportedWaiting ?? 0) * pool.meanWorkTokens);
  const m = w.msPerToken ?? pool.msPerToken;
  const ttft = m * (ahead + uncached + k.requestOverheadTokens);
  const running = Math.max(w.running, w.exportedRunning ?? 0);
  const tpot = (w.tpotBaseMs ?? pool.tpotBaseMs) * (1 + k.batchSlope * (running + 1));
  const usage = Math.min(1, Math.max(0, w.kvCacheUsage ?? 0));
  const kvFactor = 1 + (k.kvWeight * Math.max(0, usage - k.kvKnee)) / (1 - k.kvKnee);
  const predictedTtft = ttft * kvFactor;
  let slo = 0;
  if (req.slo.ttftMs !== undefined) slo += sloPenalty(predictedTtft, req.slo.ttftMs, k);
  if (req.slo.tpotMs !== undefined) slo += sloPenalty(tpot, req.slo.tpotMs, k);
  const beta = k.uncachedWeight + k.busyUncachedWeight * Math.min(1, Math.max(0, pool.busy ?? 0));
  const cost = predictedTtft + k.tpotWeight * tpot + slo + beta * m * uncached;
  return {
    workerId: w.id,
    score: -cost,
    cost,
    predictedCachedTokens: cached,
    predictedTtftMs: predictedTtft,
    predictedTpotMs: tpot,
    aheadTokens: ahead,
    kvFactor,
    sloPenaltyMs: slo,
  };
}

/** S_miss·[predicted > target] + λ·max(0, predicted − target), ms; pure. */
export function sloPenalty(predictedMs: number, targetMs: number, k: ScoreConstants): number {
  if (!(predictedMs > targetMs)) return 0;
  return k.sloMissMs + k.sloOvershootWeight * (predictedMs - targetMs);
}

/** In-flight limit of one worker for a tier: maxInFlight × (1 + adjustment / 100). */
export function admissionLimit(maxInFlight: number, tier: ServiceTierHint): number {
  return Math.floor((maxInFlight * (100 + TIER_ADJUSTMENT[tier])) / 100);
}

export function admits(inFlight: number, maxInFlight: number, tier: ServiceTierHint): boolean {
  return inFlight < admissionLimit(maxInFlight, tier);
}

/** Order of a router-side wait queue under saturation: higher first, then arrival. */
export function tierRank(tier: ServiceTierHint): number {
  return tier === 'priority' ? 2 : tier === 'flex' ? 0 : 1;
}

// ------------------------------------------------------------------ stateful part

/** A candidate as the router passes it: id plus the worker's scraped signals. */
export interface Candidate {
  id: string;
  exported?: {
    running?: number | null;
    waiting?: number | null;
    kvCacheUsage?: number | null;
  } | null;
}

export interface RouteRequest {
  /** `index.blocks(renderForIndex(messages))`. */
  blocks: PromptBlocks;
  /** Prompt tokens if the router counted them; else estimated from the characters. */
  promptTokens?: number;
  slo: SloTargets;
  tier: ServiceTierHint;
  /**
   * The caller's clock (any monotonic ms). When given here and to `firstToken`, the
   * prefill already done on the oldest queued request is credited (see `pendingAt`).
   */
  nowMs?: number;
}

/** A routed request; pass it back to `firstToken`, `finish` or `fail`. */
export interface Route {
  readonly workerId: string;
  readonly predictedCachedTokens: number;
  readonly predictedTtftMs: number;
  readonly promptTokens: number;
  /** Internal bookkeeping. */
  readonly aheadTokens: number;
  readonly workTokens: number;
  readonly prompt: RoutedPrompt;
  started: boolean;
  done: boolean;
  runningAtFirstToken: number;
}

export type Choice =
  | { ok: true; route: Route; scores: WorkerScore[] }
  | { ok: false; code: 'capacity_exceeded' | 'unavailable'; retryAfterMs: number };

export interface Outcome {
  ttftMs?: number;
  /** Mean time per output token after the first. */
  tpotMs?: number;
  promptTokens?: number;
  cachedTokens?: number;
}

interface WorkerState {
  inFlight: number;
  pendingPrefillTokens: number;
  running: number;
  msPerToken: number | undefined;
  tpotBaseMs: number | undefined;
  /** Routes on the worker without a first token, in dispatch order. */
  queued: Set<Route>;
  /** Since when the oldest of `queued` has been prefilling, on the caller's clock. */
  progressAt: number | undefined;
}

export interface WorkerScorerOptions {
  index?: PrefixIndex;
  /** Default-tier in-flight limit per worker (see `admissionLimit`). Default 256. */
  maxInFlight?: number;
  constants?: Partial<ScoreConstants>;
}

export class WorkerScorer {
  readonly index: PrefixIndex;
  readonly constants: ScoreConstants;
  readonly maxInFlight: number;
  private readonly workers = new Map<string, WorkerState>();
  /**
   * The state each route was counted in: a worker forgotten and back under its id has
   * a new one, which its earlier requests' ends must not touch.
   */
  private readonly owners = new WeakMap<Route, WorkerState>();
  private meanWork: number;
  private rr = 0;

  constructor(o: WorkerScorerOptions = {}) {
    this.index = o.index ?? new PrefixIndex();
    this.constants = { ...DEFAULT_SCORE_CONSTANTS, ...o.constants };
    this.maxInFlight = o.maxInFlight ?? 256;
    this.meanWork = 512;
  }

  /** Scores every admissible candidate and routes to the best (ties: rotating start). */
  choose(
    candidates: readonly Candidate[],
    req: RouteRequest,
    exclude?: ReadonlySet<string>,
  ): Choice {
    const promptTokens = req.promptTokens ?? this.index.estimateTokens(req.blocks.chars);
    const view: RequestView = { promptTokens, slo: req.slo };
    const pool = this.poolView();
    const scores: WorkerScore[] = [];
    let best: WorkerScore | null = null;
    let eligible = 0;
    const n = candidates.length;
    const start = n > 0 ? this.rr++ % n : 0;
    const views: WorkerView[] = [];
    let minWait = Infinity;
    for (let i = 0; i < n; i++) {
      const c = candidates[(start + i) % n]!;
      if (exclude?.has(c.id)) continue;
      eligible++;
      const st = this.workers.get(c.id);
      if (!admits(st?.inFlight ?? 0, this.maxInFlight, req.tier)) continue;
      const w: WorkerView = {
        id: c.id,
        pendingPrefillTokens: st ? this.pendingAt(st, req.nowMs, pool) : 0,
        running: st?.running ?? 0,
        exportedWaiting: c.exported?.waiting,
        exportedRunning: c.exported?.running,
        kvCacheUsage: c.exported?.kvCacheUsage,
        msPerToken: st?.msPerToken,
        tpotBaseMs: st?.tpotBaseMs,
      };
      views.push(w);
      const ahead = Math.max(
        w.pendingPrefillTokens,
        (w.exportedWaiting ?? 0) * pool.meanWorkTokens,
      );
      minWait = Math.min(minWait, (w.msPerToken ?? pool.msPerToken) * ahead);
    }
    if (this.constants.busyUncachedWeight > 0 && views.length > 0) {
      pool.busy = Math.min(1, minWait / Math.max(1e-9, this.constants.busyWaitMs));
    }
    for (const w of views) {
      const s = scoreWorker(
        w,
        view,
        this.index.predictCachedTokens(w.id, req.blocks, promptTokens),
        pool,
        this.constants,
      );
      scores.push(s);
      if (!best || s.cost < best.cost) best = s;
    }
    if (!best) {
      return eligible === 0
        ? { ok: false, code: 'unavailable', retryAfterMs: 1000 }
        : { ok: false, code: 'capacity_exceeded', retryAfterMs: 1000 };
    }
    const k = this.constants;
    const work = promptTokens - best.predictedCachedTokens + k.requestOverheadTokens;
    this.meanWork += k.ewmaAlpha * (work - this.meanWork);
    const st = this.state(best.workerId);
    st.inFlight++;
    st.pendingPrefillTokens += work;
    // An empty queue: the worker starts this prefill now.
    if (st.queued.size === 0) st.progressAt = req.nowMs;
    const route: Route = {
      workerId: best.workerId,
      predictedCachedTokens: best.predictedCachedTokens,
      predictedTtftMs: best.predictedTtftMs,
      promptTokens,
      aheadTokens: best.aheadTokens,
      workTokens: work,
      prompt: this.index.route(best.workerId, req.blocks),
      started: false,
      done: false,
      runningAtFirstToken: 0,
    };
    st.queued.add(route);
    this.owners.set(route, st);
    return { ok: true, route, scores };
  }

  /** The first byte of the response arrived: the request leaves the prefill queue. */
  firstToken(route: Route, at?: { nowMs?: number }): void {
    if (route.started || route.done) return;
    route.started = true;
    // A worker forgotten meanwhile (it left the pool) is not brought back by its requests.
    const st = this.stateOf(route);
    if (!st) return;
    this.leaveQueue(st, route, at?.nowMs);
    route.runningAtFirstToken = st.running;
    st.running++;
  }

  /** The response completed: update the EWMAs and correct the prefix index. */
  finish(route: Route, outcome: Outcome): void {
    if (route.done) return;
    this.firstToken(route);
    route.done = true;
    const k = this.constants;
    const st = this.stateOf(route);
    if (!st) return;
    st.inFlight = Math.max(0, st.inFlight - 1);
    st.running = Math.max(0, st.running - 1);
    const prompt = outcome.promptTokens ?? route.promptTokens;
    const cached = outcome.cachedTokens ?? route.predictedCachedTokens;
    if (outcome.ttftMs !== undefined && outcome.ttftMs >= 0) {
      const work = route.aheadTokens + Math.max(0, prompt - cached) + k.requestOverheadTokens;
      st.msPerToken = ewma(st.msPerToken, outcome.ttftMs / work, k.ewmaAlpha);
    }
    if (outcome.tpotMs !== undefined && outcome.tpotMs > 0) {
      const base = outcome.tpotMs / (1 + k.batchSlope * (route.runningAtFirstToken + 1));
      st.tpotBaseMs = ewma(st.tpotBaseMs, base, k.ewmaAlpha);
    }
    this.index.release(route.workerId, route.prompt);
    if (outcome.cachedTokens !== undefined) {
      this.index.observe(
        route.workerId,
        route.predictedCachedTokens,
        outcome.cachedTokens,
        route.prompt,
        outcome.promptTokens,
      );
    }
  }

  /** The request failed or was abandoned (before or after its first byte). */
  fail(route: Route, at?: { nowMs?: number }): void {
    if (route.done) return;
    route.done = true;
    const st = this.stateOf(route);
    if (!st) return;
    st.inFlight = Math.max(0, st.inFlight - 1);
    if (route.started) st.running = Math.max(0, st.running - 1);
    else this.leaveQueue(st, route, at?.nowMs);
  }

  inFlight(workerId: string): number {
    return this.workers.get(workerId)?.inFlight ?? 0;
  }

  /** A worker left the pool: drop its state and its index entries. */
  forget(workerId: string): void {
    this.workers.delete(workerId);
    this.index.forget(workerId);
  }

  /** Per-worker learned figures, for /metrics. */
  snapshot(): Array<{
    workerId: string;
    inFlight: number;
    pendingPrefillTokens: number;
    running: number;
    msPerToken: number | undefined;
    tpotBaseMs: number | undefined;
  }> {
    return [...this.workers].map(([workerId, s]) => ({
      workerId,
      inFlight: s.inFlight,
      pendingPrefillTokens: s.pendingPrefillTokens,
      running: s.running,
      msPerToken: s.msPerToken,
      tpotBaseMs: s.tpotBaseMs,
    }));
  }

  /**
   * Prefill work still ahead on the worker, token-equivalents: the work of its queued
   * routes, less what the oldest one (the engine prefills in arrival order) has done
   * since it started: elapsed ÷ m_w, capped at its own work since it has no first
   * token yet. Without a clock, nothing is credited.
   */
  private pendingAt(st: WorkerState, nowMs: number | undefined, pool: PoolView): number {
    const pending = st.pendingPrefillTokens;
    if (nowMs === undefined || st.progressAt === undefined) return pending;
    const head = st.queued.values().next().value as Route | undefined;
    if (!head) return pending;
    const m = st.msPerToken ?? pool.msPerToken;
    // A worker learned at 0 ms per token (its first tokens came within the millisecond)
    // has done its head's work at once; elapsed ÷ m would be 0 ÷ 0 = NaN within the
    // same millisecond, and a NaN here makes every candidate's cost NaN (via `busy`).
    const done =
      m > 0 ? Math.min(head.workTokens, Math.max(0, nowMs - st.progressAt) / m) : head.workTokens;
    return Math.max(0, pending - done);
  }

  /** A route leaves the prefill queue (first token or failure). */
  private leaveQueue(st: WorkerState, route: Route, nowMs: number | undefined): void {
    st.pendingPrefillTokens = Math.max(0, st.pendingPrefillTokens - route.workTokens);
    const wasHead = st.queued.values().next().value === route;
    st.queued.delete(route);
    // The next queued route starts now; a head that left at an unknown time leaves
    // the next one's start unknown too (no credit until the next event).
    if (nowMs !== undefined) st.progressAt = nowMs;
    else if (wasHead) st.progressAt = undefined;
  }

  private poolView(): PoolView {
    let m = 0;
    let mn = 0;
    let b = 0;
    let bn = 0;
    for (const s of this.workers.values()) {
      if (s.msPerToken !== undefined) {
        m += s.msPerToken;
        mn++;
      }
      if (s.tpotBaseMs !== undefined) {
        b += s.tpotBaseMs;
        bn++;
      }
    }
    return {
      msPerToken: mn ? m / mn : this.constants.priorMsPerToken,
      tpotBaseMs: bn ? b / bn : 0,
      meanWorkTokens: this.meanWork,
    };
  }

  /** The route's worker state, unless the worker was forgotten since the route was made. */
  private stateOf(route: Route): WorkerState | undefined {
    const st = this.workers.get(route.workerId);
    return st && this.owners.get(route) === st ? st : undefined;
  }

  private state(id: string): WorkerState {
    let s = this.workers.get(id);
    if (!s) {
      s = {
        inFlight: 0,
        pendingPrefillTokens: 0,
        running: 0,
        msPerToken: undefined,
        tpotBaseMs: undefined,
        queued: new Set(),
        progressAt: undefined,
      };
      this.workers.set(id, s);
    }
    return s;
  }
}

function ewma(prev: number | undefined, sample: number, alpha: number): number {
  if (!Number.isFinite(sample)) return prev ?? 0;
  return prev === undefined ? sample : prev + alpha * (sample - prev);
}
