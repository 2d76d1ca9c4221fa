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
 */
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

export class Switchyard implements Policy {
  readonly name: string;
  readonly scorer: WorkerScorer;
  private readonly sized = new Set<string>();

  /**
   * `correct: false` runs the same score without the cached_tokens feedback loop;
   * `constants` overrides score constants (the bench's `--constants` option).
   */
  constructor(correct = true, constants?: Partial<ScoreConstants>) {
    this.name = correct ? 'switchyard' : 'switchyard, no loop';
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
    return {
      workerId: route.workerId,
      predictedCachedTokens: route.predictedCachedTokens,
      predictedTtftMs: route.predictedTtftMs,
      firstToken: () => scorer.firstToken(route, { nowMs: view.now }),
      finish: (o) => scorer.finish(route, o),
      fail: () => scorer.fail(route, { nowMs: view.now }),
    };
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

export function allPolicies(constants?: Partial<ScoreConstants>): Policy[] {
  return [
    new RoundRobin(),
    new LeastQueue(),
    new SglangCacheAware(),
    new LlmdDefault(),
    new Switchyard(false, constants),
    new Switchyard(true, constants),
  ];
}
