/**
 * The `priority` the router sends a worker that orders its waiting queue by it
 * (vLLM's `--scheduling-policy priority`: lower first, ties by arrival; the `sim`
 * engine's `--scheduling-policy priority` does the same). Under saturation a
 * worker's queue holds cold prompts, whose prefill is long, and warm ones, whose
 * prefix is cached and whose prefill is short; in arrival order a warm request
 * waits behind every cold prefill ahead of it. Two classes fix that without
 * starving anyone:
 *
 *   warm  the scorer booked at most half the prompt as work on the chosen worker
 *         (the uncached tokens its prefix index predicts, plus the fixed
 *         per-request overhead τ of score.ts): priority = the arrival time in ms
 *         (the router's clock, Unix epoch, so that several router instances agree);
 *   cold  everything else: arrival + COLD_OFFSET_MS (500 ms).
 *
 * A cold request is overtaken only by warm ones that arrived less than 500 ms after
 * it, and no cold prompt overtakes another (shortest-first orders starved long cold
 * prompts in bench/routing: p99.9 from 1.3 s to 2.1–5.6 s). An unbounded offset
 * (every warm request first) starved cold ones over HTTP when the workers' slots,
 * not prefill, were the bottleneck: p99 TTFT 3.9 s against 0.7 s in arrival order
 * (bench/routing/http.mjs --max-running=1); 500 ms was also the best offset in the
 * simulation (250, 500, 1,000, 2,000 ms and unbounded: docs/ROUTING.md).
 *
 * Follow: the index counts a prompt's blocks as cached on a worker from the moment
 * a request carrying them is sent there, but the engine has them only once that
 * request's prefill ran. A warm request whose predicted hit includes blocks that
 * requests still without their first token will compute there takes the priority
 * of the earliest of them when that is later than its own, so it queues right
 * after the prefill that makes its hit real instead of jumping ahead and paying
 * the cold prefill itself. The router knows this from its own requests in flight;
 * nothing is asked of the worker.
 *
 * Measured in bench/routing (`--priority=classes[:offset]`) and over HTTP
 * (bench/routing/http.mjs, `+priority`): docs/ROUTING.md, "Queue order at the worker".
 */
import type { Route } from './score.js';

/** Added to a cold request's arrival: warm requests of the next 500 ms go first. */
export const COLD_OFFSET_MS = 500;

/** A request's priority and the call that clears its pending blocks (idempotent). */
export interface PrefillTicket {
  priority: number;
  /** `follow`: warm, queued after the prefill its hit waits for. */
  class: 'warm' | 'cold' | 'follow';
  release(): void;
}

interface Pending {
  priority: number;
}

/** A booked work of at most 1/K of the prompt is warm. */
const WARM_SHARE = 2;

export class PrefillOrder {
  /** Per worker: block hash → requests still to compute that block there. */
  private readonly pending = new Map<string, Map<number, Set<Pending>>>();

  constructor(private readonly coldOffsetMs = COLD_OFFSET_MS) {}

  /**
   * The priority of `route` on its worker, for a request that arrived at `arrivalMs`
   * (epoch ms); its blocks past the predicted hit become pending until `release`.
   */
  assign(route: Route, arrivalMs: number): PrefillTicket {
    const hashes = route.prompt.blocks.hashes;
    const hit = route.prompt.stamps.length;
    const cold = route.workTokens > route.promptTokens / WARM_SHARE;
    let priority = Math.round(arrivalMs) + (cold ? this.coldOffsetMs : 0);
    let cls: PrefillTicket['class'] = cold ? 'cold' : 'warm';
    const byHash = this.pending.get(route.workerId);
    if (!cold && byHash) {
      // Follow the earliest of the requests still computing a block of this
      // prompt's hit (the rule bench/routing measured: max(own, min(providers))).
      let provider = Infinity;
      for (let i = 0; i < hit; i++) {
        const set = byHash.get(hashes[i]!);
        if (set) for (const p of set) if (p.priority < provider) provider = p.priority;
      }
      if (provider !== Infinity && provider > priority) {
        priority = provider;
        cls = 'follow';
      }
    }
    if (hit >= hashes.length) return { priority, class: cls, release: () => {} };
    const rec: Pending = { priority };
    const map = byHash ?? new Map<number, Set<Pending>>();
    if (!byHash) this.pending.set(route.workerId, map);
    for (let i = hit; i < hashes.length; i++) {
      const h = hashes[i]!;
      const set = map.get(h);
      if (set) set.add(rec);
      else map.set(h, new Set([rec]));
    }
    let done = false;
    return {
      priority,
      class: cls,
      release: () => {
        if (done) return;
        done = true;
        for (let i = hit; i < hashes.length; i++) {
          const h = hashes[i]!;
          const set = map.get(h);
          if (!set) continue;
          set.delete(rec);
          if (set.size === 0) map.delete(h);
        }
        if (map.size === 0 && this.pending.get(route.workerId) === map) {
          this.pending.delete(route.workerId);
        }
      },
    };
  }

  /** Blocks pending on a worker (tests, metrics). */
  pendingBlocks(workerId: string): number {
    return this.pending.get(workerId)?.size ?? 0;
  }
}
