/**
 * Gives the memory that glibc's malloc keeps after a load peak back to the
 * system, once the router has gone quiet.
 *
 * Under load the router's native side (Buffers' backing stores, socket reads,
 * V8's compiler zones on its helper threads) allocates and frees tens of MiB
 * through malloc. glibc returns freed memory to the system only from the top
 * of each arena, so a few live allocations above the freed ones keep the whole
 * range resident: after 15 s of wrk the router's RSS settled about 24 MiB above
 * its idle size, and `malloc_trim(0)` (which also releases whole free pages in
 * the middle of every arena) brought it back (docs/BENCHMARKS.md, "Memory
 * after a load peak"). Node never calls it, and glibc's tunables cannot make
 * it release mid-arena pages, so it is called here, through ffi-rs: the one
 * libc function, with a fixed signature and no input from requests.
 *
 * When: every `intervalMs` the event loop's utilization over the interval is
 * read. An interval under `quietUtilization` is quiet. The first
 * `trimsAfterBusy` quiet intervals after a busy one each trim (V8 frees
 * backing stores over several garbage collections after the load ends, so one
 * trim is not enough); after that, a quiet process trims again only when its
 * RSS has grown by `growthBytes` since the last trim. A busy process never
 * trims: under steady load the freed memory is reused at once, and giving it
 * back would only cost page faults. Each trim took 0.1–2 ms on the event loop.
 *
 * The JavaScript heap is the same story one level up. After a load, V8's old
 * generation holds the load's garbage until its next full collection, and V8's
 * own memory reducer, which would run one once allocation slows, does so at most
 * a few times per activation and may have spent them in an earlier lull: a
 * router left idle for minutes after the benchmark still had 32.5 MiB of old
 * generation, where one full collection leaves about 24. So the first quiet
 * interval after a busy one also runs one full collection (`collect`) before
 * trimming, as the JVM's G1 (periodic collections when idle) and Go's runtime do.
 * It pauses the event loop, about 10–25 ms for this heap, so it must not land on
 * traffic that resumed at the end of a quiet interval: the loop must stay quiet
 * for `confirmMs` (200 ms) more, else the collection waits for the next tick.
 *
 * `malloc_trim` cannot reach one part: the top chunk of a thread's arena (glibc
 * trims only the main arena's top; in thread arenas it releases pages of free
 * chunks in its bins). V8's compiler thread builds its optimised code in zones
 * that, under load, grew its arena to about 36 MiB; when they were freed they
 * merged into that arena's top, and whether glibc shrank it on that free depends
 * on its trim threshold, which it raises (up to 64 MiB) each time a large block
 * that had its own mapping is freed. In about half of the benchmark's runs the
 * 30 MiB stayed resident for good (RSS 119 against 93 MiB, docs/BENCHMARKS.md,
 * "A thread's arena"). So `start` fixes glibc's thresholds (`mallopt`, which
 * also turns off that raising): a free that leaves more than 4 MiB at an arena's
 * top gives it back; blocks of 1 MiB and more get their own mapping (returned on
 * free). SWITCHYARD_MEMORY_TRIM_MS=0 turns the whole thing off, thresholds too.
 */
import { runInNewContext } from 'node:vm';
import { setFlagsFromString } from 'node:v8';
import { performance, type EventLoopUtilization } from 'node:perf_hooks';
import type { Clock, Timer } from './clock.js';
import type { Logger } from './logger.js';

export interface MemorySample {
  /** Share of the last interval the event loop was busy, 0–1. */
  utilization: number;
  /** Resident set size now, bytes. */
  rss: number;
}

export interface MemoryTrimmerOptions {
  clock: Clock;
  logger: Pick<Logger, 'info' | 'debug'>;
  /** Period of the check (ms). */
  intervalMs: number;
  /** Reads the event loop's utilization since the previous call, and the RSS. */
  sample?: () => MemorySample;
  /** Releases free memory; resolves false when it cannot here (no glibc). */
  trim?: () => Promise<boolean>;
  /** Sets the allocator's thresholds once, at start; resolves false when it cannot. */
  tune?: () => Promise<boolean>;
  /** One full garbage collection of the JavaScript heap (V8's, by default). */
  collect?: () => void;
  /** How long the event loop must stay quiet right before a collection (ms). */
  confirmMs?: number;
  /** Waits `ms`; the injected clock's timer by default. */
  wait?: (ms: number) => Promise<void>;
  quietUtilization?: number;
  trimsAfterBusy?: number;
  growthBytes?: number;
  /** Called after each trim with the RSS before and after (metrics). */
  onTrim?: (before: number, after: number) => void;
}

export class MemoryTrimmer {
  private timer: Timer | null = null;
  private readonly sample: () => MemorySample;
  private readonly trim: () => Promise<boolean>;
  private readonly tune: () => Promise<boolean>;
  private readonly collect: () => void;
  private readonly confirmMs: number;
  private readonly wait: (ms: number) => Promise<void>;
  private stopped = false;
  private readonly quiet: number;
  private readonly trimsAfterBusy: number;
  private readonly growth: number;
  /** Quiet-interval trims left since the last busy interval. */
  private owed: number;
  private rssAfterTrim = Infinity;
  private disabled = false;
  private running = false;

  constructor(private readonly o: MemoryTrimmerOptions) {
    this.sample = o.sample ?? eventLoopSampler();
    this.trim = o.trim ?? mallocTrim;
    this.tune = o.tune ?? tuneMalloc;
    this.collect = o.collect ?? fullCollection;
    this.confirmMs = o.confirmMs ?? 200;
    this.wait =
      o.wait ?? ((ms) => new Promise<void>((resolve) => void o.clock.setTimer(ms, resolve)));
    this.quiet = o.quietUtilization ?? 0.05;
    this.trimsAfterBusy = o.trimsAfterBusy ?? 4;
    this.growth = o.growthBytes ?? 8 * 1024 * 1024;
    // Start-up (migrations, module loading) counts as the first busy period.
    this.owed = this.trimsAfterBusy;
  }

  start(): void {
    if (this.timer || this.o.intervalMs <= 0) return;
    void this.tune().then(
      (ok) => {
        if (!ok) this.o.logger.debug('malloc thresholds: not available here (needs glibc)');
      },
      () => undefined,
    );
    this.sample(); // the first interval starts now
    this.arm();
  }

  stop(): void {
    this.stopped = true;
    this.timer?.cancel();
    this.timer = null;
  }

  private arm(): void {
    this.timer = this.o.clock.setTimer(this.o.intervalMs, () => void this.tick());
  }

  /** One check; public so tests can drive it without timers. */
  async tick(): Promise<void> {
    if (this.running || this.disabled) return;
    this.running = true;
    try {
      const s = this.sample();
      if (s.utilization >= this.quiet) {
        this.owed = this.trimsAfterBusy;
        return;
      }
      const grown = s.rss - this.rssAfterTrim >= this.growth;
      if (this.owed === 0 && !grown) return;
      // The first quiet interval after a busy one: the load's garbage goes first,
      // if the loop is still quiet now (see the module comment).
      if (this.owed === this.trimsAfterBusy) {
        await this.wait(this.confirmMs);
        if (this.stopped || this.sample().utilization >= this.quiet) return;
        this.collect();
      }
      if (this.owed > 0) this.owed--;
      if (!(await this.trim())) {
        this.disabled = true;
        this.o.logger.info('memory trim: not available here (needs glibc); left off');
        return;
      }
      const after = this.sample().rss;
      this.rssAfterTrim = after;
      this.o.onTrim?.(s.rss, after);
      this.o.logger.debug(
        { rssBeforeMiB: mib(s.rss), rssAfterMiB: mib(after) },
        'memory trim: freed native memory returned to the system',
      );
    } finally {
      this.running = false;
      if (this.timer && !this.disabled) this.arm();
    }
  }
}

function mib(bytes: number): number {
  return Math.round((bytes / 1048576) * 10) / 10;
}

/** Event-loop utilization since the previous call, from perf_hooks. */
export function eventLoopSampler(): () => MemorySample {
  let last: EventLoopUtilization = performance.eventLoopUtilization();
  return () => {
    const now = performance.eventLoopUtilization();
    const delta = performance.eventLoopUtilization(now, last);
    last = now;
    return { utilization: delta.utilization, rss: process.memoryUsage.rss() };
  };
}

let gcFn: (() => void) | undefined;

/**
 * V8's full collection (`gc()` of --expose-gc), taken from a throwaway context so
 * the application's global scope never gets a `gc` function. Node's documented way
 * to reach it after start-up; the flag only affects contexts created later.
 */
export function fullCollection(): void {
  if (!gcFn) {
    setFlagsFromString('--expose-gc');
    gcFn = runInNewContext('gc') as () => void;
  }
  gcFn();
}

type Ffi = typeof import('ffi-rs');

let libc: Promise<Ffi | null> | undefined;

/**
 * ffi-rs with the C library opened, loaded once; null where there is no glibc
 * (musl, macOS) or the binding cannot load.
 */
function glibc(): Promise<Ffi | null> {
  libc ??= (async () => {
    if (process.platform !== 'linux') return null;
    try {
      const ffi = await import('ffi-rs');
      ffi.open({ library: 'libc', path: 'libc.so.6' });
      return ffi;
    } catch {
      return null;
    }
  })();
  return libc;
}

// mallopt parameters (malloc.h).
const M_TRIM_THRESHOLD = -1;
const M_MMAP_THRESHOLD = -3;

/** glibc's thresholds set by `tuneMalloc` (see the module comment). */
export const MALLOC_THRESHOLDS = { trim: 4 * 1024 * 1024, mmap: 1024 * 1024 };

/**
 * Fixes glibc's trim and mmap thresholds (`mallopt`), which also stops glibc from
 * raising them at run time. Resolves false where there is no glibc or `mallopt`
 * refused a value.
 */
export async function tuneMalloc(thresholds = MALLOC_THRESHOLDS): Promise<boolean> {
  const ffi = await glibc();
  if (!ffi) return false;
  const mallopt = (param: number, value: number) =>
    ffi.load({
      library: 'libc',
      funcName: 'mallopt',
      retType: ffi.DataType.I32,
      paramsType: [ffi.DataType.I32, ffi.DataType.I32],
      paramsValue: [param, value],
    }) as number;
  try {
    // mallopt returns 1 on success, 0 on an invalid value.
    return (
      mallopt(M_TRIM_THRESHOLD, thresholds.trim) === 1 &&
      mallopt(M_MMAP_THRESHOLD, thresholds.mmap) === 1
    );
  } catch {
    return false;
  }
}

let trimFn: (() => number) | null | undefined;

/**
 * `malloc_trim(0)` from the C library, loaded on first use. Resolves false
 * where there is no glibc (musl, macOS) or the binding cannot load.
 */
export async function mallocTrim(): Promise<boolean> {
  if (trimFn === undefined) {
    trimFn = await loadMallocTrim(); // loading trims once
    return trimFn !== null;
  }
  if (!trimFn) return false;
  trimFn();
  return true;
}

async function loadMallocTrim(): Promise<(() => number) | null> {
  const ffi = await glibc();
  if (!ffi) return null;
  const trim = () =>
    ffi.load({
      library: 'libc',
      funcName: 'malloc_trim',
      retType: ffi.DataType.I32,
      paramsType: [ffi.DataType.U64],
      paramsValue: [0],
    }) as number;
  // Without glibc (musl) finding the symbol fails: no trim.
  try {
    trim(); // throws here, not later, where the symbol is missing
    return trim;
  } catch {
    return null;
  }
}
