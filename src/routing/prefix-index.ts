/**
 * Approximate prefix-cache index: which worker recently served which prompt prefix,
 * so a request can be sent where its prefix is probably still in the KV cache.
 *
 * Algorithm:
 * - The prompt (messages rendered canonically, `renderForIndex`) is cut into blocks of
 *   `blockChars` characters; block i's hash is hash(hash of block i-1, block text), so
 *   one hash names the whole prefix up to its block (vLLM / SGLang block hashing). A
 *   trailing partial block is not hashed: engines only cache full blocks.
 * - Per worker, an LRU of block hashes (a Map in recency order with a stamp per entry).
 *   When a request is routed, its blocks are touched tail first, so the prompt's first
 *   blocks are the most recent, as engines free a sequence's blocks tail first.
 * - The predicted hit on a worker is the number of leading blocks present, converted
 *   to tokens with a chars-per-token ratio learned from reported prompt_tokens.
 * - Capacity per worker in blocks follows the worker's KV-cache size when known
 *   (`setKvCacheTokens`: tokens × the learned chars per token ÷ block size, recomputed
 *   as that ratio is learned), else `defaultCapacityBlocks`.
 * - When the request finishes (`release`), its blocks are touched again, tail first:
 *   an engine frees a sequence's blocks at completion, so that is when they become its
 *   most recently used free blocks.
 *
 * Closing the loop (`observe`): after a response the worker's `cached_tokens` says
 * how much of the prefix it really had.
 * - Fewer than predicted: the worker evicted blocks the index still holds, so its
 *   cache keeps less of this router's traffic than the index's LRU assumes. The
 *   worker's capacity in the index shrinks by `gain` × the error in blocks (never below
 *   `minCapacityBlocks`) and the least recently used entries beyond it are dropped. The
 *   prompt's own blocks stay: the worker has just recomputed them.
 * - More than predicted: the worker kept blocks the index had dropped (or another
 *   router warmed them); the prompt's blocks are already recorded, and the capacity
 *   grows by `gain` × the error, up to `maxCapacityFactor` × the configured one.
 * Errors within one block count as agreement (index and engine blocks differ in size).
 * An earlier design that dropped every entry older than the first missed block (an
 * exact-LRU inference) made predictions worse in bench/routing: the worker's LRU
 * order differs from the router's, so it over-evicted; proportional control halves
 * the mean absolute error instead (docs/ROUTING.md).
 * Prediction error (predicted − reported, tokens) is accumulated for metrics.
 *
 * Invariants: each worker's map holds at most its capacity; every map is dropped by
 * `forget` when the worker leaves the pool, so memory is bounded by workers × capacity.
 */

export interface PrefixIndexOptions {
  /** Characters per block. Default 64 (about 16 tokens). */
  blockChars?: number;
  /** Blocks remembered per worker when its KV-cache size is unknown. Default 16,384. */
  defaultCapacityBlocks?: number;
  /** Floor of the corrected capacity. Default 256. */
  minCapacityBlocks?: number;
  /** Ceiling of the corrected capacity, × the configured one. Default 4. */
  maxCapacityFactor?: number;
  /** Initial chars per token before any observation. Default 4. */
  charsPerToken?: number;
  /** Share of a prediction error (in blocks) applied to the capacity. Default 1. */
  gain?: number;
  /** Turn the `observe` correction off (baselines in bench/routing). Default true. */
  correct?: boolean;
}

/** A prompt's block hashes, computed once per request. */
export interface PromptBlocks {
  hashes: readonly number[];
  /** Length of the rendered prompt in characters. */
  chars: number;
}

/** What `route` remembers of a routed prompt for `observe`. */
export interface RoutedPrompt {
  blocks: PromptBlocks;
  /** Stamps of the matched blocks before this request touched them. */
  stamps: readonly number[];
}

export interface PredictionStats {
  observations: number;
  /** Σ |predicted − reported| / n, tokens. */
  meanAbsErrorTokens: number;
  /** Σ (predicted − reported) / n, tokens: > 0 means the index is optimistic. */
  meanErrorTokens: number;
  overPredicted: number;
  underPredicted: number;
  /** Blocks dropped by corrections. */
  correctedEvictions: number;
}

interface WorkerBlocks {
  /** hash → stamp, in recency order (first = least recent). */
  lru: Map<number, number>;
  capacity: number;
  configured: number;
  /** KV-cache size in tokens, when known: `configured` follows the learned chars/token. */
  kvTokens?: number;
  /** The chars-per-token ratio `configured` was computed with. */
  cptAt?: number;
}

/** Canonical rendering: role, name and text of each message, so equal prefixes hash equally. */
export function renderForIndex(
  messages: ReadonlyArray<{ role: string; content?: unknown; name?: unknown }>,
): string {
  let out = '';
  for (const m of messages) {
    out += `\u001e${m.role}${typeof m.name === 'string' ? `:${m.name}` : ''}\n`;
    out += contentText(m.content);
  }
  return out;
}

function contentText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  let out = '';
  for (const part of content as unknown[]) {
    if (part && typeof part === 'object') {
      const p = part as { type?: unknown; text?: unknown };
      out += p.type === 'text' && typeof p.text === 'string' ? p.text : `<${String(p.type)}>`;
    }
  }
  return out;
}

/** FNV-1a over UTF-16 units with a murmur-style finaliser, seeded by the parent hash. */
function blockHash(parent: number, text: string, from: number, to: number): number {
  let h = (0x811c9dc5 ^ parent) >>> 0;
  for (let i = from; i < to; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  // Mix the parent in again so equal blocks under different prefixes differ widely.
  return (h ^ Math.imul(parent, 0x27d4eb2d)) >>> 0;
}

export class PrefixIndex {
  readonly blockChars: number;
  private readonly defaultCapacity: number;
  private readonly minCapacity: number;
  private readonly maxFactor: number;
  private readonly correct: boolean;
  private readonly gain: number;
  private cpt: number;
  private readonly workers = new Map<string, WorkerBlocks>();
  private stamp = 0;
  private readonly err = { n: 0, sum: 0, abs: 0, over: 0, under: 0, evicted: 0 };

  constructor(o: PrefixIndexOptions = {}) {
    this.blockChars = Math.max(1, o.blockChars ?? 64);
    this.defaultCapacity = Math.max(1, o.defaultCapacityBlocks ?? 16_384);
    this.minCapacity = Math.max(1, o.minCapacityBlocks ?? 256);
    this.maxFactor = Math.max(1, o.maxCapacityFactor ?? 4);
    this.cpt = o.charsPerToken ?? 4;
    this.correct = o.correct ?? true;
    this.gain = o.gain ?? 1;
  }

  /** Chained block hashes of a rendered prompt. */
  blocks(text: string): PromptBlocks {
    const n = Math.floor(text.length / this.blockChars);
    const hashes: number[] = new Array<number>(n);
    let parent = 0;
    for (let i = 0; i < n; i++) {
      parent = blockHash(parent, text, i * this.blockChars, (i + 1) * this.blockChars);
      hashes[i] = parent;
    }
    return { hashes, chars: text.length };
  }

  /** Current chars-per-token estimate (learned from `observe`). */
  get charsPerToken(): number {
    return this.cpt;
  }

  estimateTokens(chars: number): number {
    return Math.ceil(chars / this.cpt);
  }

  blocksToTokens(blocks: number): number {
    return Math.floor((blocks * this.blockChars) / this.cpt);
  }

  /** Ties the worker's capacity to its KV cache: kvTokens × chars/token ÷ block size. */
  setKvCacheTokens(workerId: string, kvCacheTokens: number): void {
    if (!(kvCacheTokens > 0)) return;
    const w = this.worker(workerId);
    w.kvTokens = kvCacheTokens;
    w.cptAt = this.cpt;
    w.configured = this.kvBlocks(kvCacheTokens);
    w.capacity = w.configured;
    this.trim(w);
  }

  capacityOf(workerId: string): number {
    const w = this.workers.get(workerId);
    if (!w) return this.defaultCapacity;
    this.rescale(w);
    return w.capacity;
  }

  sizeOf(workerId: string): number {
    return this.workers.get(workerId)?.lru.size ?? 0;
  }

  /** Leading blocks of the prompt the worker probably still holds. */
  match(workerId: string, blocks: PromptBlocks): number {
    const w = this.workers.get(workerId);
    if (!w) return 0;
    this.rescale(w);
    const h = blocks.hashes;
    let i = 0;
    while (i < h.length && w.lru.has(h[i]!)) i++;
    return i;
  }

  /** Predicted cached tokens on the worker, capped below the prompt's token count. */
  predictCachedTokens(workerId: string, blocks: PromptBlocks, promptTokens?: number): number {
    const t = this.blocksToTokens(this.match(workerId, blocks));
    const cap = (promptTokens ?? this.estimateTokens(blocks.chars)) - 1;
    return Math.max(0, Math.min(t, cap));
  }

  /** Records that the prompt is being served by the worker; returns what `observe` needs. */
  route(workerId: string, blocks: PromptBlocks): RoutedPrompt {
    const w = this.worker(workerId);
    this.rescale(w);
    const h = blocks.hashes;
    const stamps: number[] = [];
    for (let i = 0; i < h.length; i++) {
      const s = w.lru.get(h[i]!);
      if (s === undefined) break;
      stamps.push(s);
    }
    for (let i = h.length - 1; i >= 0; i--) {
      w.lru.delete(h[i]!);
      w.lru.set(h[i]!, ++this.stamp);
    }
    this.trim(w);
    return { blocks, stamps };
  }

  /**
   * The request finished on the worker: an engine frees a sequence's blocks when it
   * completes, so they become its most recently used ones (tail first) then, not at
   * dispatch. Re-touches the prompt's blocks, re-adding any the index had dropped.
   */
  release(workerId: string, routed: RoutedPrompt): void {
    const w = this.workers.get(workerId);
    if (!w) return;
    this.rescale(w);
    const h = routed.blocks.hashes;
    for (let i = h.length - 1; i >= 0; i--) {
      w.lru.delete(h[i]!);
      w.lru.set(h[i]!, ++this.stamp);
    }
    this.trim(w);
  }

  /**
   * Feeds back what the worker reported (see the module comment). `promptTokens`, when
   * given, calibrates the chars-per-token ratio first.
   */
  observe(
    workerId: string,
    predictedCachedTokens: number,
    reportedCachedTokens: number,
    routed: RoutedPrompt,
    promptTokens?: number,
  ): void {
    if (promptTokens !== undefined && promptTokens > 0 && routed.blocks.chars > 0) {
      const sample = routed.blocks.chars / promptTokens;
      if (Number.isFinite(sample)) this.cpt += 0.05 * (sample - this.cpt);
    }
    const diff = predictedCachedTokens - reportedCachedTokens;
    this.err.n++;
    this.err.sum += diff;
    this.err.abs += Math.abs(diff);
    // Within one block is agreement: block sizes of index and engine differ.
    const slack = this.blockChars / this.cpt;
    if (diff > slack) this.err.over++;
    else if (diff < -slack) this.err.under++;
    if (!this.correct) return;
    const w = this.workers.get(workerId);
    if (!w) return;
    this.rescale(w);
    // Proportional control of the capacity: the error in blocks moves it by `gain`
    // of that error, so over- and under-predictions balance out where the index's LRU
    // keeps as much as the worker's cache really does for this router's traffic.
    const errBlocks = (diff * this.cpt) / this.blockChars;
    if (Math.abs(diff) <= slack) return;
    const before = w.lru.size;
    w.capacity = Math.round(
      Math.min(
        w.configured * this.maxFactor,
        Math.max(Math.min(this.minCapacity, w.configured), w.capacity - this.gain * errBlocks),
      ),
    );
    this.trim(w);
    this.err.evicted += before - w.lru.size;
  }

  /** Drops a worker that left the pool. */
  forget(workerId: string): void {
    this.workers.delete(workerId);
  }

  predictionStats(): PredictionStats {
    const n = this.err.n;
    return {
      observations: n,
      meanAbsErrorTokens: n ? this.err.abs / n : 0,
      meanErrorTokens: n ? this.err.sum / n : 0,
      overPredicted: this.err.over,
      underPredicted: this.err.under,
      correctedEvictions: this.err.evicted,
    };
  }

  private worker(id: string): WorkerBlocks {
    let w = this.workers.get(id);
    if (!w) {
      w = { lru: new Map(), capacity: this.defaultCapacity, configured: this.defaultCapacity };
      this.workers.set(id, w);
    }
    return w;
  }

  private kvBlocks(kvTokens: number): number {
    return Math.max(this.minCapacity, Math.floor((kvTokens * this.cpt) / this.blockChars));
  }

  /**
   * A KV cache holds tokens, the index holds blocks of characters: when the learned
   * chars-per-token ratio moves, the configured capacity moves with it, and the
   * correction learned by `observe` (capacity − configured, in blocks) is kept.
   */
  private rescale(w: WorkerBlocks): void {
    if (w.kvTokens === undefined || w.cptAt === this.cpt) return;
    w.cptAt = this.cpt;
    const configured = this.kvBlocks(w.kvTokens);
    if (configured === w.configured) return;
    w.capacity = Math.round(
      Math.min(
        configured * this.maxFactor,
        Math.max(Math.min(this.minCapacity, configured), w.capacity + configured - w.configured),
      ),
    );
    w.configured = configured;
    this.trim(w);
  }

  private trim(w: WorkerBlocks): void {
    while (w.lru.size > w.capacity) {
      const oldest = w.lru.keys().next().value as number;
      w.lru.delete(oldest);
    }
  }
}
