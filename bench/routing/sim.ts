/**
 * The discrete-event core of bench/routing: an event queue on simulated time and
 * simulated workers mirroring the sim engine's model (src/workers/sim/engine.ts).
 *
 * A worker, like the sim engine:
 * - tokenizes with the sim tokenizer and keys full 16-token blocks by hash chain
 *   (`tokenizePrompt`), and keeps them in the sim engine's `PrefixCache` (pinned while
 *   running, LRU when free, freed tail first);
 * - admits a queued request FIFO when a slot is free (`maxRunning`) and its missing
 *   blocks plus its output tail fit in the KV cache (or nothing is running);
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
  // Worker-side state.
  cached: number;
  tail: number;
  started: boolean;
  /** Trace (bench/routing/run.ts --tail): when the job was admitted and its prefill began. */
  admittedAt?: number;
  prefillAt?: number;
}

export interface WorkerMetrics {
  waiting: number;
  running: number;
  kvCacheUsage: number;
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
  promptTokens = 0;
  cachedTokens = 0;

  constructor(
    readonly spec: WorkerSpec,
    private readonly ev: EventQueue,
  ) {
    this.capacity = Math.floor(spec.kvCacheTokens / spec.blockSize);
  }

  submit(job: Job): void {
    job.cached = 0;
    job.tail = 0;
    job.started = false;
    this.queue.push(job);
    this.drain();
  }

  /** Leading prompt blocks in the worker's cache (trace only; the router cannot see it). */
  cachedBlocks(keys: readonly number[]): number {
    return this.alive ? this.cache.match(keys) : 0;
  }

  /**
   * Trace only: the TTFT a job submitted now would get if nothing else arrived (the
   * current prefill's remainder, the queued prefills, its own), ignoring KV admission.
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
    this.cache.acquire(job.blockKeys);
    this.running.add(job);
    job.tail = this.tailFor(job);
    this.tailBlocks += job.tail;
    this.cache.evictTo(Math.max(0, this.capacity - this.tailBlocks));
    this.prefill.push(job);
    this.pump();
  }

  private pump(): void {
    if (this.prefilling || this.prefill.length === 0) return;
    const job = this.prefill.shift()!;
    const s = this.spec;
    const ms = (s.ttftMs + (job.promptTokens - job.cached) * s.prefillMsPerToken) * s.slowdown;
    this.prefilling = true;
    this.prefillEnd = this.ev.now + ms;
    job.prefillAt = this.ev.now;
    this.ev.at(this.ev.now + ms, () => {
      if (!this.alive) return;
      this.prefilling = false;
      this.promptTokens += job.promptTokens;
      this.cachedTokens += job.cached;
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
