/**
 * The discrete-event core of bench/routing: an event queue on simulated time and
 * simulated workers mirroring the sim engine's model (src/workers/sim/engine.ts).
 *
 * A worker, like the sim engine:
 * - tokenizes with the sim tokenizer and keys full 16-token blocks by hash chain
 *   (`tokenizePrompt`), and keeps them in the sim engine's `PrefixCache` (pinned while
 *   running, LRU when free, freed tail first);
 * - admits a queued request FIFO (by priority with `priorityOrder`, below) when a slot
 *   is free (`maxRunning`) and its missing blocks plus its output tail fit in the KV
 *   cache (or nothing is running);
 * - reports `cached_tokens` = matched leading blocks × 16, at most prompt tokens − 1.
 * Where it departs from the sim engine, to be more like a GPU:
 * - prefills run one at a time per worker (compute-bound), so time to first token
 *   grows with the queue of uncached prompt tokens ahead: ttft = wait +
 *   (ttftMs + uncached × prefillMsPerToken) × slowdown;
 * - TPOT grows with the batch: tpotMs × slowdown × (1 + batchSlope × running), fixed
 *   at the request's first token;
 * - the output tail (ceil((prompt remainder + max output) / 16) blocks) is reserved
 *   at admission instead of grown per step.
 * `kill` stops a worker: requests without a first token are handed back (the router
 * fails them over), requests already streaming fail.
 *
 * With `priorityOrder` (bench/routing/run.ts --priority), the worker models vLLM's
 * `--scheduling-policy priority`: its waiting queue is ordered by (priority, arrival
 * here), lower first, a job without a priority counting as 0, so jobs that all lack
 * one keep arrival order and run exactly as without the option. The order applies to
 * admission (the head still blocks when its KV does not fit, as in vLLM) and to the
 * serial prefill queue of admitted jobs: in vLLM a waiting request is scheduled when
 * the step's token budget reaches it, so the prefill order is the waiting order. A
 * prefill in progress is never interrupted (vLLM schedules running requests, partial
 * prefills included, before waiting ones). vLLM's priority preemption (it evicts the
 * running request with the largest (priority, arrival) when a running request cannot
 * grow its KV) is not modelled: the output tail is reserved at admission here, so a
 * running request never runs out of blocks.
 * Reordering admitted prefills needs one more rule: a prompt's blocks enter the cache
 * at admission, but only a prefill computes them. In arrival order every block a job
 * matches at admission is computed before its own prefill starts; out of order it may
 * not be. So with `priorityOrder` a job's `cached_tokens` is counted when its prefill
 * starts, over computed blocks only: if a later job with the same prefix sorts first,
 * it pays the cold prefill and the earlier one then hits (as in vLLM, where a waiting
 * request's prefix match is taken when it is scheduled).
 */
import { PrefixCache } from '../../src/workers/sim/prefix-cache.js';

export class EventQueue {
  private heap: Array<{ at: number; seq: number; fn: () => void }> = [];
  private seq = 0;
  now = 0;

  at(time: number, fn: () => void): void {
    const e = { at: Math.max(time, this.now), seq: this.seq++, fn };
    const h = this.heap;
    h.push(e);
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (less(h[p]!, h[i]!)) break;
      [h[p], h[i]] = [h[i]!, h[p]!];
      i = p;
    }
  }

  run(): void {
    const h = this.heap;
    while (h.length > 0) {
      const top = h[0]!;
      const last = h.pop()!;
      if (h.length > 0) {
        h[0] = last;
        let i = 0;
        for (;;) {
          const l = 2 * i + 1;
          const r = l + 1;
          let m = i;
          if (l < h.length && less(h[l]!, h[m]!)) m = l;
          if (r < h.length && less(h[r]!, h[m]!)) m = r;
          if (m === i) break;
          [h[m], h[i]] = [h[i]!, h[m]!];
          i = m;
        }
      }
      this.now = top.at;
      top.fn();
    }
  }
}

function less(a: { at: number; seq: number }, b: { at: number; seq: number }): boolean {
  return a.at < b.at || (a.at === b.at && a.seq < b.seq);
}

export interface WorkerSpec {
  id: string;
  maxRunning: number;
  kvCacheTokens: number;
  blockSize: number;
  ttftMs: number;
  prefillMsPerToken: number;
  tpotMs: number;
  batchSlope: number;
  slowdown: number;
}

/** One attempt of a request on one worker. */
export interface Job {
  promptTokens: number;
  blockKeys: readonly number[];
  outTokens: number;
  onFirstToken(now: number, cachedTokens: number): void;
  onFinish(now: number, tpotMs: number): void;
  /** vLLM's request `priority` (lower runs first); absent = 0. Read with `priorityOrder`. */
  priority?: number;
  // Worker-side state.
  cached: number;
  tail: number;
  started: boolean;
  /** Arrival order on the worker: ties of priority go to the earlier job. */
  seq: number;
  /** Trace (bench/routing/run.ts --tail): when the job was admitted and its prefill began. */
  admittedAt?: number;
  /** Cancelled by the router (`SimWorker.cancel`) while its prefill ran: no first token. */
  cancelled?: boolean;
  prefillAt?: number;
}

export interface WorkerMetrics {
  waiting: number;
  running: number;
  kvCacheUsage: number;
}

export interface SimWorkerOptions {
  /** Order waiting and prefill queues by (priority, arrival) instead of arrival. */
  priorityOrder?: boolean;
}

export class SimWorker {
  alive = true;
  private readonly cache = new PrefixCache();
  private readonly capacity: number;
  private tailBlocks = 0;
  private readonly queue: Job[] = [];
  private readonly running = new Set<Job>();
  private readonly prefill: Job[] = [];
  private prefilling = false;
  private prefillEnd = 0;
  private seq = 0;
  /** With `priorityOrder`: keys of admitted jobs' blocks that no prefill has computed yet. */
  private readonly uncomputed = new Set<number>();
  promptTokens = 0;
  cachedTokens = 0;

  constructor(
    readonly spec: WorkerSpec,
    private readonly ev: EventQueue,
    private readonly options: SimWorkerOptions = {},
  ) {
    this.capacity = Math.floor(spec.kvCacheTokens / spec.blockSize);
  }

  submit(job: Job): void {
    job.cached = 0;
    job.tail = 0;
    job.started = false;
    job.seq = this.seq++;
    this.enqueue(this.queue, job);
    this.drain();
  }

  /** Appends in arrival order, or inserts by (priority, arrival) with `priorityOrder`. */
  private enqueue(list: Job[], job: Job): void {
    if (!this.options.priorityOrder) {
      list.push(job);
      return;
    }
    const p = job.priority ?? 0;
    // After every job that sorts before or with it: binary search on (priority, seq).
    let lo = 0;
    let hi = list.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      const m = list[mid]!;
      const mp = m.priority ?? 0;
      if (mp < p || (mp === p && m.seq < job.seq)) lo = mid + 1;
      else hi = mid;
    }
    list.splice(lo, 0, job);
  }

  /** Leading prompt blocks in the worker's cache (trace only; the router cannot see it). */
  cachedBlocks(keys: readonly number[]): number {
    return this.alive ? this.cache.match(keys) : 0;
  }

  /**
   * Trace only: the TTFT a job submitted now would get if nothing else arrived (the
   * current prefill's remainder, the queued prefills, its own), ignoring KV admission
   * and priorities (with `priorityOrder`, an upper bound for a job that sorts first).
   */
  wouldTake(promptTokens: number, blockKeys: readonly number[]): number {
    if (!this.alive) return Infinity;
    const s = this.spec;
    const cost = (j: Job): number =>
      (s.ttftMs + (j.promptTokens - j.cached) * s.prefillMsPerToken) * s.slowdown;
    let t = this.prefilling ? Math.max(0, this.prefillEnd - this.ev.now) : 0;
    for (const j of this.prefill) t += cost(j);
    for (const j of this.queue) {
      const c = this.cache.match(j.blockKeys, Math.floor((j.promptTokens - 1) / s.blockSize));
      t += (s.ttftMs + (j.promptTokens - c * s.blockSize) * s.prefillMsPerToken) * s.slowdown;
    }
    const own = this.cache.match(blockKeys, Math.floor((promptTokens - 1) / s.blockSize));
    return t + (s.ttftMs + (promptTokens - own * s.blockSize) * s.prefillMsPerToken) * s.slowdown;
  }

  /** Trace only: the job's own prefill time here (its uncached tokens at this cache). */
  ownPrefill(promptTokens: number, blockKeys: readonly number[]): number {
    const s = this.spec;
    const own = this.cache.match(blockKeys, Math.floor((promptTokens - 1) / s.blockSize));
    return (s.ttftMs + (promptTokens - own * s.blockSize) * s.prefillMsPerToken) * s.slowdown;
  }

  /**
   * The router closed the request before its first token (a hedge that lost, run.ts
   * --hedge). Queued or admitted but not yet prefilling: it leaves at once and frees its
   * slot and blocks. Prefilling: as in vLLM, where an abort takes effect at the next
   * engine step, the prefill runs to its end (its blocks stay cached), then the job is
   * released without a first token. Returns whether its prefill had started.
   */
  cancel(job: Job): boolean {
    if (!this.alive || job.started) return false;
    const q = this.queue.indexOf(job);
    if (q >= 0) {
      this.queue.splice(q, 1);
      return false;
    }
    const p = this.prefill.indexOf(job);
    if (p >= 0) {
      this.prefill.splice(p, 1);
      this.release(job);
      return false;
    }
    if (this.running.has(job)) job.cancelled = true;
    return true;
  }

  metrics(): WorkerMetrics {
    return {
      waiting: this.queue.length,
      running: this.running.size,
      kvCacheUsage: Math.min(1, (this.cache.pinnedBlocks + this.tailBlocks) / this.capacity),
    };
  }

  /** Stops the worker; returns the jobs that had not produced a first token. */
  kill(): { notStarted: Job[]; streaming: Job[] } {
    this.alive = false;
    const notStarted = [...this.queue];
    const streaming: Job[] = [];
    for (const j of this.running) (j.started ? streaming : notStarted).push(j);
    this.queue.length = 0;
    this.running.clear();
    this.prefill.length = 0;
    this.uncomputed.clear();
    return { notStarted, streaming };
  }

  private tailFor(job: Job): number {
    const bs = this.spec.blockSize;
    return Math.ceil(((job.promptTokens % bs) + job.outTokens) / bs);
  }

  private canAdmit(job: Job): boolean {
    if (this.running.size >= this.spec.maxRunning) return false;
    if (this.running.size === 0) return true;
    const missing = job.blockKeys.length - this.cache.match(job.blockKeys);
    return this.cache.pinnedBlocks + this.tailBlocks + missing + this.tailFor(job) <= this.capacity;
  }

  private drain(): void {
    while (this.alive && this.queue.length > 0 && this.canAdmit(this.queue[0]!)) {
      this.start(this.queue.shift()!);
    }
  }

  private start(job: Job): void {
    const bs = this.spec.blockSize;
    const limit = Math.floor((job.promptTokens - 1) / bs);
    job.cached = this.cache.match(job.blockKeys, limit) * bs;
    job.admittedAt = this.ev.now;
    if (this.options.priorityOrder) {
      for (const k of job.blockKeys) if (!this.cache.has(k)) this.uncomputed.add(k);
    }
    this.cache.acquire(job.blockKeys);
    this.running.add(job);
    job.tail = this.tailFor(job);
    this.tailBlocks += job.tail;
    this.cache.evictTo(Math.max(0, this.capacity - this.tailBlocks));
    this.enqueue(this.prefill, job);
    this.pump();
  }

  private pump(): void {
    if (this.prefilling || this.prefill.length === 0) return;
    const job = this.prefill.shift()!;
    const s = this.spec;
    if (this.options.priorityOrder) {
      const limit = Math.floor((job.promptTokens - 1) / s.blockSize);
      let n = 0;
      while (n < limit && !this.uncomputed.has(job.blockKeys[n]!)) n++;
      job.cached = n * s.blockSize;
      // This prefill computes the rest; the next one starts after it ends.
      for (const k of job.blockKeys) this.uncomputed.delete(k);
    }
    const ms = (s.ttftMs + (job.promptTokens - job.cached) * s.prefillMsPerToken) * s.slowdown;
    this.prefilling = true;
    this.prefillEnd = this.ev.now + ms;
    job.prefillAt = this.ev.now;
    this.ev.at(this.ev.now + ms, () => {
      if (!this.alive) return;
      this.prefilling = false;
      this.promptTokens += job.promptTokens;
      this.cachedTokens += job.cached;
      if (job.cancelled) {
        this.release(job);
        this.pump();
        return;
      }
      job.started = true;
      job.onFirstToken(this.ev.now, job.cached);
      const tpot = s.tpotMs * s.slowdown * (1 + s.batchSlope * this.running.size);
      this.ev.at(this.ev.now + Math.max(0, job.outTokens - 1) * tpot, () => {
        if (!this.alive) return;
        this.release(job);
        job.onFinish(this.ev.now, tpot);
      });
      this.pump();
    });
  }

  private release(job: Job): void {
    if (!this.running.delete(job)) return;
    this.tailBlocks -= job.tail;
    this.cache.release(job.blockKeys);
    this.cache.evictTo(Math.max(0, this.capacity - this.tailBlocks));
    this.drain();
  }
}
