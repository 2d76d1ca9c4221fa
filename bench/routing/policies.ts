/**
 * The routing policies compared by bench/routing. Every policy sees the same router
 * state: its own in-flight count per worker (exact) and each worker's exported
 * waiting/running/KV usage as last scraped (every `SCRAPE_MS`). The baselines admit a
 * request to a worker while its in-flight count is below MAX_IN_FLIGHT, whatever the
 * tier; Switchyard applies its tier-dependent admission (src/routing/score.ts).
 *
 * - round-robin;
 * - least-queue: fewest in-flight, ties by rotation;
 * - SGLang cache-aware (sgl-router `cache_aware`): an approximate radix tree per worker
 *   (here 16-character chained blocks, no eviction, like its 2^26-character default);
 *   if loads are imbalanced (max − min > 64 and max > 1.5 × min) the least-loaded
 *   worker, else the worker with the longest prefix match if match / prompt > 0.3,
 *   else the worker with the smallest tree; ties by lower load (kinder than sgl-router,
 *   which takes the first);
 * - llm-d default scheduler profile: queue scorer (min-max normalised scraped waiting
 *   queue) × 2, KV-cache utilisation scorer (1 − usage) × 2, prefix-cache scorer
 *   (matched / total blocks of 64 characters, LRU of 31,250 blocks per worker, at most
 *   256 blocks matched) × 3, highest wins, ties by rotation;
 * - switchyard: the real `WorkerScorer` and `PrefixIndex` from src/routing; and the same
 *   without the index's `observe` correction ("no loop"), to show what the loop does.
 *   With a `PriorityRule` (run.ts --priority, an experiment) both also attach a vLLM
 *   `priority` to each request; the baselines never do.
 */
import { PrefillOrder } from '../../src/routing/prefill-order.js';
import { PrefixIndex } from '../../src/routing/prefix-index.js';
import { WorkerScorer, type Route, type ScoreConstants } from '../../src/routing/score.js';
import type { WorkerMetrics } from './sim.js';
import type { TraceRequest } from './workloads.js';

export const SCRAPE_MS = 50;
export const MAX_IN_FLIGHT = 64;

export interface RouterView {
  readonly alive: readonly string[];
  /** Simulated time, ms. */
  readonly now: number;
  inFlight(id: string): number;
  scraped(id: string): WorkerMetrics | undefined;
  kvCacheTokens(id: string): number;
  /** Oracle only (reads the simulated worker): TTFT if sent now, and own prefill time. */
  exact?(id: string, req: TraceRequest): { ttft: number; work: number };
}

export interface Outcome {
  ttftMs: number;
  tpotMs: number;
  promptTokens: number;
  cachedTokens: number;
}

export interface Attempt {
  workerId: string;
  /** The policy's predicted cached tokens, when it has one (trace only). */
  predictedCachedTokens?: number;
  predictedTtftMs?: number;
  /** vLLM's request `priority` (lower runs first), when the policy sets one. */
  priority?: number;
  firstToken?(): void;
  finish?(o: Outcome): void;
  fail?(): void;
}

export interface Policy {
  readonly name: string;
  choose(req: TraceRequest, view: RouterView, exclude: ReadonlySet<string>): Attempt | null;
}

function admissible(view: RouterView, exclude: ReadonlySet<string>): string[] {
  return view.alive.filter((id) => !exclude.has(id) && view.inFlight(id) < MAX_IN_FLIGHT);
}

export class RoundRobin implements Policy {
  readonly name = 'round-robin';
  private i = 0;
  choose(_req: TraceRequest, view: RouterView, exclude: ReadonlySet<string>): Attempt | null {
    const ids = admissible(view, exclude);
    if (ids.length === 0) return null;
    return { workerId: ids[this.i++ % ids.length]! };
  }
}

export class LeastQueue implements Policy {
  readonly name = 'least-queue';
  private i = 0;
  choose(_req: TraceRequest, view: RouterView, exclude: ReadonlySet<string>): Attempt | null {
    const ids = admissible(view, exclude);
    if (ids.length === 0) return null;
    const start = this.i++;
    let best: string | null = null;
    for (let k = 0; k < ids.length; k++) {
      const id = ids[(start + k) % ids.length]!;
      if (best === null || view.inFlight(id) < view.inFlight(best)) best = id;
    }
    return { workerId: best! };
  }
}

export class SglangCacheAware implements Policy {
  readonly name = 'sglang cache-aware';
  private readonly tree = new PrefixIndex({
    blockChars: 16,
    defaultCapacityBlocks: 1 << 22,
    correct: false,
  });
  constructor(
    private readonly threshold = 0.3,
    private readonly balanceAbs = 64,
    private readonly balanceRel = 1.5,
  ) {}

  choose(req: TraceRequest, view: RouterView, exclude: ReadonlySet<string>): Attempt | null {
    const ids = admissible(view, exclude);
    if (ids.length === 0) return null;
    const loads = ids.map((id) => view.inFlight(id));
    const max = Math.max(...loads);
    const min = Math.min(...loads);
    let chosen: string;
    if (max - min > this.balanceAbs && max > this.balanceRel * min) {
      chosen = ids[loads.indexOf(min)]!;
    } else {
      let best = -1;
      let bestMatch = -1;
      for (let k = 0; k < ids.length; k++) {
        const m = this.tree.match(ids[k]!, req.blocks16);
        if (m > bestMatch || (m === bestMatch && loads[k]! < loads[best]!)) {
          best = k;
          bestMatch = m;
        }
      }
      const rate = req.blocks16.hashes.length ? bestMatch / req.blocks16.hashes.length : 0;
      if (rate > this.threshold) {
        chosen = ids[best]!;
      } else {
        let small = 0;
        for (let k = 1; k < ids.length; k++) {
          const a = this.tree.sizeOf(ids[k]!);
          const b = this.tree.sizeOf(ids[small]!);
          if (a < b || (a === b && loads[k]! < loads[small]!)) small = k;
        }
        chosen = ids[small]!;
      }
    }
    this.tree.route(chosen, req.blocks16);
    return { workerId: chosen };
  }
}

export class LlmdDefault implements Policy {
  readonly name = 'llm-d default';
  private readonly index = new PrefixIndex({
    blockChars: 64,
    defaultCapacityBlocks: 31_250,
    correct: false,
  });
  private i = 0;
  constructor(private readonly w = { queue: 2, kv: 2, prefix: 3 }) {}

  choose(req: TraceRequest, view: RouterView, exclude: ReadonlySet<string>): Attempt | null {
    const ids = admissible(view, exclude);
    if (ids.length === 0) return null;
    const q = ids.map((id) => view.scraped(id)?.waiting ?? 0);
    const qMax = Math.max(...q);
    const qMin = Math.min(...q);
    const total = Math.min(256, req.blocks64.hashes.length);
    const start = this.i++;
    let best: string | null = null;
    let bestScore = -Infinity;
    for (let k = 0; k < ids.length; k++) {
      const j = (start + k) % ids.length;
      const id = ids[j]!;
      const queue = qMax === qMin ? 1 : (qMax - q[j]!) / (qMax - qMin);
      const kv = 1 - (view.scraped(id)?.kvCacheUsage ?? 0);
      const prefix = total ? Math.min(256, this.index.match(id, req.blocks64)) / total : 0;
      const s = this.w.queue * queue + this.w.kv * kv + this.w.prefix * prefix;
      if (s > bestScore) {
        best = id;
        bestScore = s;
      }
    }
    this.index.route(best!, req.blocks64);
    return { workerId: best! };
  }
}

/**
 * Experiment (run.ts --priority): the vLLM `priority` Switchyard attaches to a request,
 * from what the router knows at dispatch, not from the worker's cache: e = the chosen
 * worker's learned ms per token × the work the scorer booked for the request there
 * (prompt − the prefix index's predicted cached tokens + τ). Then
 *   eft: round(arrival + k·e)   earliest estimated finish; the arrival term ages a long
 *                                prompt, so it cannot starve behind a stream of short ones;
 *   sjf: round(k·e)             shortest estimated prefill first, no aging;
 *   lst: round(arrival + d − k·e)  least slack first: the latest time the prefill can start
 *                                and still finish d ms after arrival, where d is the
 *                                request's X-SLO-TTFT-Ms, else `deadlineMs` (0: none, so
 *                                no SLO acts); k = 0 is earliest deadline first. Long
 *                                prompts go earlier (most of the worst TTFTs are cold
 *                                prompts; on `tenants` the warm ones then queue longer
 *                                and p99 rises, so this is a measured dead end);
 *   hit: round(arrival + C·[cold])  two classes, arrival order within each: a request
 *                                whose booked work exceeds 1/k of its prompt (k = 2: a
 *                                predicted hit under half the prompt) is cold and sorts
 *                                after every warm one (C = COLD_CLASS_MS, ~3 h); no
 *                                reordering among cold prompts, so none starves;
 * and service_tier moves the request by `tierMs`: `priority` −tierMs, `flex` +tierMs.
 *
 * `follow`: the index counts a prompt's blocks as cached on a worker from its dispatch,
 * but the engine has them only once that request's prefill ran. A request whose
 * predicted hit includes blocks another request of this router is still to prefill
 * there (no first token yet) would, sorted by its small estimate, run first and pay
 * the cold prefill itself. With `follow` it takes max(own priority, that request's),
 * so it runs after the prefill that makes its hit real. The router knows this from
 * its own in-flight requests, not from the worker.
 */
/** `hit`: the offset that puts every cold request after every warm one. */
const COLD_CLASS_MS = 1e7;

export interface PriorityRule {
  /** `classes`: the live router's PrefillOrder (src/routing/prefill-order.ts); tierMs, follow unused. */
  order: 'eft' | 'sjf' | 'lst' | 'hit' | 'classes';
  /** The rule's weight; for `classes`, the cold offset in ms (0: PrefillOrder's own). */
  k: number;
  tierMs: number;
  follow: boolean;
  /** `lst`: d for requests without an X-SLO-TTFT-Ms header; 0 uses no SLO at all. */
  deadlineMs: number;
}

/** A request without a first token whose blocks beyond its predicted hit are not computed yet. */
interface PendingPrefill {
  priority: number;
}

export class Switchyard implements Policy {
  readonly name: string;
  readonly scorer: WorkerScorer;
  private readonly sized = new Set<string>();
  private readonly prefillOrder: PrefillOrder;
  /** `follow`: per worker, block hash → requests still to compute that block there. */
  private readonly pending = new Map<string, Map<number, Set<PendingPrefill>>>();

  /**
   * `correct: false` runs the same score without the cached_tokens feedback loop;
   * `constants` overrides score constants (the bench's `--constants` option);
   * `priority` attaches a vLLM priority to each request (the bench's `--priority`).
   */
  constructor(
    correct = true,
    constants?: Partial<ScoreConstants>,
    private readonly priority?: PriorityRule,
  ) {
    this.name = correct ? 'switchyard' : 'switchyard, no loop';
    this.prefillOrder = new PrefillOrder(
      priority?.order === 'classes' && priority.k > 0 ? priority.k : undefined,
    );
    this.scorer = new WorkerScorer({
      index: new PrefixIndex({ blockChars: 64, correct }),
      maxInFlight: MAX_IN_FLIGHT,
      ...(constants ? { constants } : {}),
    });
  }

  choose(req: TraceRequest, view: RouterView, exclude: ReadonlySet<string>): Attempt | null {
    for (const id of view.alive) {
      if (this.sized.has(id)) continue;
      this.sized.add(id);
      this.scorer.index.setKvCacheTokens(id, view.kvCacheTokens(id));
    }
    const choice = this.scorer.choose(
      view.alive.map((id) => {
        const m = view.scraped(id);
        return {
          id,
          exported: m
            ? { waiting: m.waiting, running: m.running, kvCacheUsage: m.kvCacheUsage }
            : null,
        };
      }),
      {
        blocks: req.blocks64,
        slo: req.slo,
        tier: req.tier,
        nowMs: view.now,
      },
      exclude,
    );
    if (!choice.ok) return null;
    const route: Route = choice.route;
    const scorer = this.scorer;
    let priority: number | undefined;
    let computed: () => void = () => {};
    if (this.priority?.order === 'classes') {
      // The live router's rule (src/routing/prefill-order.ts), as shipped.
      const ticket = this.prefillOrder.assign(route, req.at);
      priority = ticket.priority;
      computed = ticket.release;
    } else if (this.priority) {
      priority = this.priorityOf(req, route, this.priority);
      computed = this.markPending(route, priority);
    }
    return {
      workerId: route.workerId,
      predictedCachedTokens: route.predictedCachedTokens,
      predictedTtftMs: route.predictedTtftMs,
      ...(priority !== undefined ? { priority } : {}),
      firstToken: () => {
        computed();
        scorer.firstToken(route, { nowMs: view.now });
      },
      finish: (o) => {
        computed();
        scorer.finish(route, o);
      },
      fail: () => {
        computed();
        scorer.fail(route, { nowMs: view.now });
      },
    };
  }

  /**
   * `follow`: records the blocks this request will compute on its worker (those past
   * its predicted hit, `route.prompt.stamps.length`); returns the call that clears them.
   */
  private markPending(route: Route, priority: number): () => void {
    if (!this.priority?.follow) return () => {};
    const byHash = this.pending.get(route.workerId) ?? new Map<number, Set<PendingPrefill>>();
    this.pending.set(route.workerId, byHash);
    const rec: PendingPrefill = { priority };
    const mine = route.prompt.blocks.hashes.slice(route.prompt.stamps.length);
    for (const h of mine) {
      const set = byHash.get(h) ?? new Set<PendingPrefill>();
      set.add(rec);
      byHash.set(h, set);
    }
    let done = false;
    return () => {
      if (done) return;
      done = true;
      for (const h of mine) {
        const set = byHash.get(h);
        set?.delete(rec);
        if (set?.size === 0) byHash.delete(h);
      }
    };
  }

  /** See `PriorityRule`. Arrival is the router's (a failover keeps its original age). */
  private priorityOf(req: TraceRequest, route: Route, rule: PriorityRule): number {
    const learned = this.scorer.snapshot();
    const known = learned.flatMap((s) => (s.msPerToken === undefined ? [] : [s.msPerToken]));
    const m =
      learned.find((s) => s.workerId === route.workerId)?.msPerToken ??
      (known.length ? known.reduce((a, b) => a + b, 0) / known.length : undefined) ??
      this.scorer.constants.priorMsPerToken;
    const tier = req.tier === 'priority' ? -rule.tierMs : req.tier === 'flex' ? rule.tierMs : 0;
    const e = m * route.workTokens;
    let own: number;
    if (rule.order === 'hit') {
      // Two classes, arrival order within each: requests whose booked work is at most
      // 1/k of the prompt (a predicted prefix hit) before the cold ones.
      const cold = route.workTokens > route.promptTokens / rule.k;
      own = Math.round(req.at + tier + (cold ? COLD_CLASS_MS : 0));
    } else if (rule.order === 'lst') {
      const d = rule.deadlineMs > 0 ? (req.slo.ttftMs ?? rule.deadlineMs) : 0;
      own = Math.round(req.at + d - rule.k * e + tier);
    } else {
      own = Math.round((rule.order === 'eft' ? req.at : 0) + rule.k * e + tier);
    }
    if (!rule.follow) return own;
    // The earliest of the requests still to compute a block of this prompt's hit.
    const byHash = this.pending.get(route.workerId);
    let provider = -Infinity;
    for (const h of route.prompt.blocks.hashes.slice(0, route.prompt.stamps.length)) {
      for (const p of byHash?.get(h) ?? []) {
        provider = provider === -Infinity ? p.priority : Math.min(provider, p.priority);
      }
    }
    return Math.max(own, provider);
  }
}

/**
 * Not a router: reads the simulated workers' exact queues and caches (--oracle). Greedy
 * on the exact TTFT; with `target`, a request that misses it everywhere goes where it
 * costs the least worker time (within 15 %), the most backlogged of those.
 */
export class Oracle implements Policy {
  readonly name: string;
  constructor(private readonly target?: number) {
    this.name = target ? `oracle hopeless>${target}` : 'oracle greedy';
  }
  choose(req: TraceRequest, view: RouterView, exclude: ReadonlySet<string>): Attempt | null {
    const ids = admissible(view, exclude);
    if (ids.length === 0 || !view.exact) return null;
    const e = ids.map((id) => view.exact!(id, req));
    let best = 0;
    for (let i = 1; i < ids.length; i++) if (e[i]!.ttft < e[best]!.ttft) best = i;
    if (this.target !== undefined && e[best]!.ttft > this.target) {
      const least = Math.min(...e.map((x) => x.work));
      best = -1;
      for (let i = 0; i < ids.length; i++) {
        if (e[i]!.work > least * 1.15) continue;
        if (best < 0 || e[i]!.ttft > e[best]!.ttft) best = i;
      }
    }
    return { workerId: ids[best]! };
  }
}

export function allPolicies(
  constants?: Partial<ScoreConstants>,
  priority?: PriorityRule,
): Policy[] {
  return [
    new RoundRobin(),
    new LeastQueue(),
    new SglangCacheAware(),
    new LlmdDefault(),
    new Switchyard(false, constants, priority),
    new Switchyard(true, constants, priority),
  ];
}
