/**
 * The sim inference engine: a deterministic simulated LLM (generator.ts) behind a
 * timing and capacity model that behaves like a continuous-batching server.
 *
 * Lifecycle of a request: `prepare` renders and tokenizes the prompt, rejects it
 * with the imitated engine's exact token-count error when prompt + budget exceeds
 * the context window, and plans every output token. `run` then queues it (FIFO, or
 * by the request's `priority` then arrival under `schedulingPolicy: 'priority'`, as
 * vLLM's `--scheduling-policy priority`) until a slot is free (`maxRunning`) and the
 * KV cache can hold it, admits it (looking up
 * and pinning its prefix blocks), waits the prefill time, and releases one decode
 * step (one token per unfinished choice) every `tpotMs`.
 *
 * Timing (all scaled by `slowdown`, all waits through the injected `sleep`):
 *   time to first token = ttftMs + uncached prompt tokens × prefillMsPerToken
 *   each later token    = tpotMs
 * so a prefix-cache hit really lowers TTFT. Zero delays skip sleeping entirely.
 *
 * KV model (units of `blockSize`-token blocks, capacity = kvCacheTokens / blockSize):
 * - a running sequence pins its prompt's full blocks (shared with other sequences
 *   and with the prefix cache) and privately holds n × ceil((prompt remainder +
 *   generated) / blockSize) tail blocks;
 * - blocks of finished sequences stay cached (LRU) and are evicted when pinned +
 *   tail + cached blocks would exceed capacity;
 * - `cached_tokens` = matched leading blocks × blockSize, looked up at admission and
 *   limited to prompt tokens - 1 (the last prompt token is always recomputed, as in
 *   vLLM);
 * - `kv_cache_usage_perc` = (pinned + tail blocks) / capacity, vLLM's definition in
 *   which evictable cached blocks count as free; `kvUsageIncludesCache` adds them.
 * A request is admitted only if its new blocks fit, except when nothing is running
 * (a request bigger than the cache must not wait forever).
 *
 * Abort: the `signal` passed to `run` ends queueing, prefill or decoding at once,
 * frees the slot and counts the request in `aborted`.
 *
 * Pooling requests (embeddings, rerank, score: `runPooling`) are sequences with a
 * prompt and nothing to decode: queued and admitted like the others, then one
 * prefill (ttftMs + prompt tokens × prefillMsPerToken), no prefix-cache blocks.
 */
import { systemClock, type Clock } from '../../runtime/clock.js';
import { contextLengthError, simError, type ErrorStyle, type SimHttpError } from './errors.js';
import { planChoices, type ChoicePlan } from './generator.js';
import { PrefixCache } from './prefix-cache.js';
import { buildCompletion } from './response.js';
import { renderPrompt, tokenizePrompt } from './tokenizer.js';
import type { ChatCompletion, ChatRequest } from './wire.js';

/** Waits `ms` milliseconds; must resolve early (not reject) when `signal` aborts. */
export type Sleep = (ms: number, signal?: AbortSignal) => Promise<void>;

/** The engine only reads the time (queue-time measurement, `created`). */
export type NowClock = Pick<Clock, 'now'>;

export const realSleep: Sleep = (ms, signal) =>
  new Promise<void>((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener('abort', done, { once: true });
  });

/**
 * A `Sleep` driven by a `Clock`'s timers, so a test holding the shared FakeClock
 * can drive the sim too. FakeClock fires timers synchronously inside `advance`, so
 * a sleep started by a woken continuation waits for the next `advance`;
 * `ManualSleep` interleaves those for multi-step timelines.
 */
export function clockSleep(clock: Clock): Sleep {
  return (ms, signal) =>
    new Promise<void>((resolve) => {
      if (signal?.aborted) {
        resolve();
        return;
      }
      const done = (): void => {
        timer.cancel();
        signal?.removeEventListener('abort', done);
        resolve();
      };
      const timer = clock.setTimer(ms, done);
      signal?.addEventListener('abort', done, { once: true });
    });
}

export interface SimEngineOptions {
  /** Served model name (responses, /v1/models, metric labels). Default `switchyard-sim`. */
  model?: string;
  /** Reject requests naming another model with 404, as vLLM does. Default false. */
  strictModel?: boolean;
  /** Context window in tokens (prompt + completion). Default 4096. */
  contextWindow?: number;
  /** Sequences decoded concurrently; the rest wait in a FIFO queue. Default 256. */
  maxRunning?: number;
  /** KV-cache capacity in tokens. Default 32 × contextWindow. */
  kvCacheTokens?: number;
  /** Prefix-cache block size in tokens. Default 16. */
  blockSize?: number;
  /** Base time to first token in ms. Default 0. */
  ttftMs?: number;
  /** Time per output token in ms. Default 0. */
  tpotMs?: number;
  /** Prefill cost per uncached prompt token in ms. Default ttftMs / 512. */
  prefillMsPerToken?: number;
  /** Multiplies every delay (heterogeneous workers). Default 1. */
  slowdown?: number;
  /** Dialect of error bodies. Default `vllm`. */
  errorStyle?: ErrorStyle;
  /** Count evictable cached blocks in kv usage (vLLM does not). Default false. */
  kvUsageIncludesCache?: boolean;
  /**
   * Prefills computed at once. Default unlimited: every admitted sequence prefills on
   * its own. 1 models an engine whose prefills share one compute budget (vLLM's
   * per-step token budget): an admitted request waits for the prefills ahead of it,
   * in the waiting queue's order.
   */
  prefillConcurrency?: number;
  /**
   * Order of the waiting queue, as vLLM's `--scheduling-policy`: `fcfs` (default,
   * arrival; a request `priority` other than 0 is refused) or `priority` (by the
   * request's `priority`, lower first, then arrival).
   */
  schedulingPolicy?: 'fcfs' | 'priority';
  sleep?: Sleep;
  clock?: NowClock;
}

export interface ResolvedEngineOptions {
  model: string;
  strictModel: boolean;
  contextWindow: number;
  maxRunning: number;
  kvCacheTokens: number;
  blockSize: number;
  ttftMs: number;
  tpotMs: number;
  prefillMsPerToken: number;
  slowdown: number;
  errorStyle: ErrorStyle;
  kvUsageIncludesCache: boolean;
  schedulingPolicy: 'fcfs' | 'priority';
  prefillConcurrency: number;
  sleep: Sleep;
  clock: NowClock;
}

export function resolveEngineOptions(o: SimEngineOptions = {}): ResolvedEngineOptions {
  const contextWindow = o.contextWindow ?? 4096;
  const ttftMs = o.ttftMs ?? 0;
  return {
    model: o.model ?? 'switchyard-sim',
    strictModel: o.strictModel ?? false,
    contextWindow,
    maxRunning: Math.max(1, o.maxRunning ?? 256),
    kvCacheTokens: o.kvCacheTokens ?? contextWindow * 32,
    blockSize: Math.max(1, o.blockSize ?? 16),
    ttftMs,
    tpotMs: o.tpotMs ?? 0,
    // Scaled from ttftMs so "zero delays" stays zero and a 512-token uncached
    // prompt costs one base TTFT on top.
    prefillMsPerToken: o.prefillMsPerToken ?? ttftMs / 512,
    slowdown: o.slowdown ?? 1,
    errorStyle: o.errorStyle ?? 'vllm',
    kvUsageIncludesCache: o.kvUsageIncludesCache ?? false,
    schedulingPolicy: o.schedulingPolicy ?? 'fcfs',
    prefillConcurrency: Math.max(1, o.prefillConcurrency ?? Infinity),
    sleep: o.sleep ?? realSleep,
    clock: o.clock ?? systemClock,
  };
}

export interface PreparedRequest {
  request: ChatRequest;
  promptText: string;
  promptTokens: number;
  blockKeys: number[];
  /** Resolved completion budget. */
  maxTokens: number;
  plans: ChoicePlan[];
  /** Decode steps: the longest choice's token count. */
  steps: number;
  completionTokens: number;
  /** Queue order under the `priority` scheduling policy (the request's, else 0). */
  priority: number;
}

/** What the scheduler reads of a request: a prepared chat request, or a pooling one. */
export type Schedulable = Pick<
  PreparedRequest,
  'promptTokens' | 'blockKeys' | 'plans' | 'steps'
> & {
  priority?: number;
};

export type PrepareResult =
  { ok: true; prepared: PreparedRequest } | { ok: false; error: SimHttpError };

export interface RunHooks {
  signal?: AbortSignal;
  /** Called when the request leaves the queue, with its prefix-cache hit. */
  onAdmitted?(cachedTokens: number): void;
  /** Called after decode step `step` (0-based); returning false stops generation. */
  onStep?(step: number): boolean | void;
}

export type RunStatus = 'completed' | 'aborted' | 'stopped';

export interface RunResult {
  status: RunStatus;
  cachedTokens: number;
  queuedMs: number;
}

export interface SimEngineStats {
  running: number;
  waiting: number;
  /** Requests that entered `run`. */
  received: number;
  completed: number;
  /** Requests ended by their abort signal (client disconnects). */
  aborted: number;
  /** Requests stopped by a hook (injected failures). */
  stopped: number;
  /** 0..1, see the module comment. */
  kvCacheUsage: number;
  cachedBlocks: number;
  pinnedBlocks: number;
  evictedBlocks: number;
  /** Prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries). */
  prefixCacheQueries: number;
  /** Prompt tokens served from the prefix cache (vLLM's prefix_cache_hits). */
  prefixCacheHits: number;
  promptTokens: number;
  generationTokens: number;
}

interface Sequence {
  p: Schedulable;
  width: number;
  remainder: number;
  tail: number;
  cachedTokens: number;
}

interface Waiter {
  seq: Sequence;
  /** Queue position under the `priority` policy (ties: arrival, by insertion). */
  priority: number;
  resolve(admitted: boolean): void;
  signal: AbortSignal | undefined;
  onAbort(): void;
}

export class SimEngine {
  readonly options: ResolvedEngineOptions;
  private readonly cache = new PrefixCache();
  private readonly capacityBlocks: number;
  private readonly queue: Waiter[] = [];
  /** Prefills running, and admitted sequences waiting for one (`prefillConcurrency`). */
  private prefilling = 0;
  private readonly prefillQueue: Waiter[] = [];
  private readonly running = new Set<Sequence>();
  private tailBlocks = 0;
  private readonly counters = {
    received: 0,
    completed: 0,
    aborted: 0,
    stopped: 0,
    prefixCacheQueries: 0,
    prefixCacheHits: 0,
    promptTokens: 0,
    generationTokens: 0,
  };

  constructor(options: SimEngineOptions = {}) {
    this.options = resolveEngineOptions(options);
    this.capacityBlocks = Math.max(
      1,
      Math.floor(this.options.kvCacheTokens / this.options.blockSize),
    );
  }

  /** Renders, tokenizes, checks the context window and plans the output. */
  prepare(request: ChatRequest): PrepareResult {
    const o = this.options;
    if (o.strictModel && request.model && request.model !== o.model) {
      return {
        ok: false,
        error: simError(
          o.errorStyle,
          404,
          `The model \`${request.model}\` does not exist.`,
          'model',
        ),
      };
    }
    const checked = this.checkPriority(request.priority);
    if (!checked.ok) return checked;
    const priority = checked.priority;
    const promptText = renderPrompt(request.messages, request.tools);
    const tp = tokenizePrompt(promptText, o.blockSize);
    const requested = request.max_completion_tokens ?? request.max_tokens ?? undefined;
    const overflow =
      requested === undefined
        ? tp.tokens >= o.contextWindow
        : tp.tokens + requested > o.contextWindow;
    if (overflow) {
      return {
        ok: false,
        error: contextLengthError(o.errorStyle, {
          promptTokens: tp.tokens,
          maxTokens: requested,
          contextWindow: o.contextWindow,
        }),
      };
    }
    const maxTokens = requested ?? o.contextWindow - tp.tokens;
    const plans = planChoices({ request, promptText, maxTokens });
    let steps = 0;
    let completionTokens = 0;
    for (const plan of plans) {
      steps = Math.max(steps, plan.tokens.length);
      completionTokens += plan.tokens.length;
    }
    return {
      ok: true,
      prepared: {
        request,
        promptText,
        promptTokens: tp.tokens,
        blockKeys: tp.blockKeys,
        maxTokens,
        plans,
        steps,
        completionTokens,
        priority,
      },
    };
  }

  /** Queues, prefills and decodes a prepared request under the timing model. */
  async run(p: Schedulable, hooks: RunHooks = {}): Promise<RunResult> {
    const o = this.options;
    const { signal } = hooks;
    const seq: Sequence = {
      p,
      width: p.plans.length,
      remainder: p.promptTokens % o.blockSize,
      tail: 0,
      cachedTokens: 0,
    };
    this.counters.received++;
    const enqueuedAt = o.clock.now();
    const admitted = await this.admit(seq, signal);
    const queuedMs = o.clock.now() - enqueuedAt;
    if (!admitted) {
      this.counters.aborted++;
      return { status: 'aborted', cachedTokens: 0, queuedMs };
    }
    const result = (status: RunStatus): RunResult => {
      this.counters[status]++;
      return { status, cachedTokens: seq.cachedTokens, queuedMs };
    };
    try {
      hooks.onAdmitted?.(seq.cachedTokens);
      const prefillMs =
        (o.ttftMs + (p.promptTokens - seq.cachedTokens) * o.prefillMsPerToken) * o.slowdown;
      if (!(await this.prefillSlot(seq, signal))) return result('aborted');
      try {
        if (prefillMs > 0) await o.sleep(prefillMs, signal);
      } finally {
        this.prefillDone();
      }
      if (signal?.aborted) return result('aborted');
      this.counters.promptTokens += p.promptTokens;
      const tpot = o.tpotMs * o.slowdown;
      for (let k = 0; k < p.steps; k++) {
        if (k > 0 && tpot > 0) await o.sleep(tpot, signal);
        if (signal?.aborted) return result('aborted');
        this.advance(seq, k);
        if (hooks.onStep?.(k) === false) return result('stopped');
      }
      return result('completed');
    } finally {
      this.release(seq);
    }
  }

  /**
   * A pooling request of `promptTokens` tokens (embeddings, rerank, score): the same
   * queue and slots as generation, one prefill, no decode steps, no cached blocks.
   */
  runPooling(promptTokens: number, hooks: RunHooks = {}, priority = 0): Promise<RunResult> {
    return this.run({ promptTokens, blockKeys: [], plans: [], steps: 0, priority }, hooks);
  }

  /**
   * A request's `priority` as vLLM reads it, for chat and pooling requests alike: an
   * integer, 0 when absent; any other value needs the `priority` scheduling policy.
   */
  checkPriority(
    value: unknown,
  ): { ok: true; priority: number } | { ok: false; error: SimHttpError } {
    const o = this.options;
    if (value === undefined || value === null) return { ok: true, priority: 0 };
    if (typeof value !== 'number' || !Number.isSafeInteger(value)) {
      return {
        ok: false,
        error: simError(o.errorStyle, 400, 'priority must be an integer', 'priority'),
      };
    }
    if (value !== 0 && o.schedulingPolicy !== 'priority') {
      // vLLM's own check (its scheduler orders by priority only under that policy).
      return {
        ok: false,
        error: simError(
          o.errorStyle,
          400,
          `Got priority ${value} but Priority scheduling is not enabled.`,
          'priority',
        ),
      };
    }
    return { ok: true, priority: value };
  }

  /** prepare + run + the non-streaming response body; `response` is null if aborted. */
  async complete(
    request: ChatRequest,
    hooks: RunHooks = {},
    meta: { id?: string; systemFingerprint?: string | null } = {},
  ): Promise<
    | { ok: true; prepared: PreparedRequest; result: RunResult; response: ChatCompletion | null }
    | { ok: false; error: SimHttpError }
  > {
    const prep = this.prepare(request);
    if (!prep.ok) return prep;
    const result = await this.run(prep.prepared, hooks);
    const response =
      result.status === 'completed'
        ? buildCompletion(prep.prepared, result.cachedTokens, {
            id: meta.id ?? 'chatcmpl-sim',
            created: Math.floor(this.options.clock.now() / 1000),
            model: this.options.model,
            systemFingerprint: meta.systemFingerprint ?? null,
          })
        : null;
    return { ok: true, prepared: prep.prepared, result, response };
  }

  stats(): SimEngineStats {
    const used =
      this.cache.pinnedBlocks +
      this.tailBlocks +
      (this.options.kvUsageIncludesCache ? this.cache.freeBlocks : 0);
    return {
      running: this.running.size,
      waiting: this.queue.length,
      ...this.counters,
      kvCacheUsage: Math.min(1, used / this.capacityBlocks),
      cachedBlocks: this.cache.size,
      pinnedBlocks: this.cache.pinnedBlocks,
      evictedBlocks: this.cache.evictions,
    };
  }

  /** Whether a block key is cached (tests inspect eviction through it). */
  isCached(key: number): boolean {
    return this.cache.has(key);
  }

  /** Drops every unpinned cached block (vLLM's /reset_prefix_cache). */
  resetPrefixCache(): void {
    this.cache.evictTo(this.cache.pinnedBlocks);
  }

  // ------------------------------------------------------------ scheduling

  private tailFor(seq: Sequence, generated: number): number {
    return seq.width * Math.ceil((seq.remainder + generated) / this.options.blockSize);
  }

  private canAdmit(seq: Sequence): boolean {
    if (this.running.size >= this.options.maxRunning) return false;
    if (this.running.size === 0) return true;
    const keys = seq.p.blockKeys;
    const missing = keys.length - this.cache.match(keys);
    const need = missing + this.tailFor(seq, 1);
    return this.cache.pinnedBlocks + this.tailBlocks + need <= this.capacityBlocks;
  }

  private admit(seq: Sequence, signal: AbortSignal | undefined): Promise<boolean> {
    if (signal?.aborted) return Promise.resolve(false);
    if (this.queue.length === 0 && this.canAdmit(seq)) {
      this.start(seq);
      return Promise.resolve(true);
    }
    return new Promise<boolean>((resolve) => {
      // An abort may unblock the ones behind the head; a new head may fit at once.
      const at = this.enqueue(this.queue, seq, signal, resolve, () => this.drain());
      if (at === 0) this.drain();
    });
  }

  /**
   * Queues `seq` in `queue` (at the end under `fcfs`, by (priority, arrival) under
   * `priority`) until `resolve` is called with true; an abort takes it out, resolves
   * false and runs `afterAbort`. Returns its index.
   */
  private enqueue(
    queue: Waiter[],
    seq: Sequence,
    signal: AbortSignal | undefined,
    resolve: (admitted: boolean) => void,
    afterAbort?: () => void,
  ): number {
    const waiter: Waiter = {
      seq,
      priority: seq.p.priority ?? 0,
      resolve,
      signal,
      onAbort: () => {
        const i = queue.indexOf(waiter);
        if (i >= 0) queue.splice(i, 1);
        resolve(false);
        afterAbort?.();
      },
    };
    signal?.addEventListener('abort', waiter.onAbort, { once: true });
    let i = queue.length;
    if (this.options.schedulingPolicy === 'priority') {
      while (i > 0 && queue[i - 1]!.priority > waiter.priority) i--;
    }
    queue.splice(i, 0, waiter);
    return i;
  }

  private drain(): void {
    while (this.queue.length > 0 && this.canAdmit(this.queue[0]!.seq)) {
      const w = this.queue.shift()!;
      w.signal?.removeEventListener('abort', w.onAbort);
      this.start(w.seq);
      w.resolve(true);
    }
  }

  private start(seq: Sequence): void {
    const bs = this.options.blockSize;
    const keys = seq.p.blockKeys;
    const limit = Math.floor((seq.p.promptTokens - 1) / bs);
    seq.cachedTokens = this.cache.match(keys, limit) * bs;
    this.cache.acquire(keys);
    this.counters.prefixCacheQueries += seq.p.promptTokens;
    this.counters.prefixCacheHits += seq.cachedTokens;
    this.running.add(seq);
    seq.tail = this.tailFor(seq, 0);
    this.tailBlocks += seq.tail;
    this.cache.evictTo(Math.max(0, this.capacityBlocks - this.tailBlocks));
  }

  private advance(seq: Sequence, step: number): void {
    for (const plan of seq.p.plans) if (plan.tokens.length > step) this.counters.generationTokens++;
    const tail = this.tailFor(seq, step + 1);
    if (tail !== seq.tail) {
      this.tailBlocks += tail - seq.tail;
      seq.tail = tail;
      this.cache.evictTo(Math.max(0, this.capacityBlocks - this.tailBlocks));
    }
  }

  /** Waits for a prefill slot (queue order as the waiting queue's); false if aborted. */
  private prefillSlot(seq: Sequence, signal: AbortSignal | undefined): Promise<boolean> {
    if (signal?.aborted) return Promise.resolve(false);
    if (this.prefilling < this.options.prefillConcurrency && this.prefillQueue.length === 0) {
      this.prefilling++;
      return Promise.resolve(true);
    }
    return new Promise<boolean>((resolve) => {
      this.enqueue(this.prefillQueue, seq, signal, resolve);
    });
  }

  private prefillDone(): void {
    this.prefilling--;
    while (this.prefilling < this.options.prefillConcurrency && this.prefillQueue.length > 0) {
      const w = this.prefillQueue.shift()!;
      w.signal?.removeEventListener('abort', w.onAbort);
      this.prefilling++;
      w.resolve(true);
    }
  }

  private release(seq: Sequence): void {
    if (!this.running.delete(seq)) return;
    this.tailBlocks -= seq.tail;
    this.cache.release(seq.p.blockKeys);
    this.cache.evictTo(Math.max(0, this.capacityBlocks - this.tailBlocks));
    this.drain();
  }
}
