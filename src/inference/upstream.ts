/**
 * Outbound HTTP to inference workers: one keep-alive undici Pool per worker
 * origin. The router never links an engine into its hot path; it proxies.
 *
 * Requests go through undici's `dispatch` with a handler of our own instead of
 * `pool.request`: the response body is a queue of the chunks undici hands over,
 * read whole (`text()`) or chunk by chunk (`for await`), not a Node `Readable`.
 * `request` builds a stream, its async iterator and an abort-signal wrapper per
 * call; measured against the same local server, dispatch cost about 30 µs less CPU
 * and 5.7 KB less garbage per request (client and server in one process, one
 * pinned core), on the router's hottest path.
 */
import type { IncomingHttpHeaders } from 'node:http';
import type { Dispatcher, Pool as UndiciPool } from 'undici';
import { Pool } from '../runtime/http-client.js';
import { ServiceError } from '../errors/index.js';
import type { AbortLike } from '../runtime/cancel.js';
import type { Clock, Timer } from '../runtime/clock.js';

/** A worker's response body: read it whole or iterate its chunks, once. */
export interface UpstreamBody extends AsyncIterable<Buffer> {
  /** The whole body as UTF-8. */
  text(): Promise<string>;
  /**
   * The reader is done before the body ended (a stream's `data: [DONE]`): what
   * still arrives is dropped, so the connection goes back to the pool when the
   * worker ends its response, and the request is aborted (the connection closed) if
   * it has not ended `ms` later on `clock`. Leaving a `for await` after this aborts
   * nothing.
   */
  discard(clock: Clock, ms: number): void;
}

export interface UpstreamResponse {
  statusCode: number;
  headers: IncomingHttpHeaders;
  body: UpstreamBody;
}

const REQUEST_HEADERS = {
  'content-type': 'application/json',
  accept: 'application/json, text/event-stream',
} as const;

/**
 * How long a worker may take to end its response after its `data: [DONE]` (the client
 * has its answer by then) before its connection is closed (`UpstreamBody.discard`).
 */
export const AFTER_DONE_MS = 1000;

/**
 * The largest body `text()` reads (a non-streamed completion, a worker's error):
 * 64 MiB is far above any completion (a million-token context is a few MiB of text
 * per choice), and an endless or absurd body must not take the router's memory.
 */
export const MAX_TEXT_BYTES = 64 * 1024 * 1024;

/** Buffered body bytes above which a chunk-by-chunk reader pauses the socket. */
const HIGH_WATER = 64 * 1024;

function abortReason(signal: AbortLike): Error {
  const r: unknown = signal.reason;
  return r instanceof Error ? r : new DOMException('This operation was aborted', 'AbortError');
}

type Waiter = {
  resolve: (r: IteratorResult<Buffer>) => void;
  reject: (e: Error) => void;
};

/**
 * One request and its response. Before the headers it settles the `post()` promise
 * (with the response, or with the connection error); after them, the body reader.
 * The caller's signal aborts it at any point; leaving a `for await` early aborts it
 * too (a body nobody reads must not hold a connection).
 */
class Exchange implements Dispatcher.DispatchHandler, UpstreamBody {
  private controller: Dispatcher.DispatchController | null = null;
  private started = false;
  private readonly chunks: Buffer[] = [];
  private head = 0;
  private buffered = 0;
  private ended = false;
  private failure: Error | null = null;
  /** The reader gave up (early `return` from iteration): later events are ignored. */
  private closed = false;
  private waiter: Waiter | null = null;
  /** Bounds how long a discarded body may take to end (`discard`). */
  private discardTimer: Timer | null = null;
  private whole: { resolve: (s: string) => void; reject: (e: Error) => void } | null = null;
  private readonly onAbort = () => this.cancel(abortReason(this.signal));

  constructor(
    private readonly signal: AbortLike,
    private readonly resolve: (r: UpstreamResponse) => void,
    private readonly reject: (e: Error) => void,
  ) {
    signal.addEventListener('abort', this.onAbort, { once: true });
  }

  private cancel(reason: Error): void {
    if (this.controller) {
      this.controller.abort(reason);
      return;
    }
    // Still queued for a connection: the caller hears now, and onRequestStart
    // aborts the request when it reaches a socket.
    this.failure ??= reason;
    this.done();
    this.reject(reason);
  }

  private done(): void {
    this.signal.removeEventListener('abort', this.onAbort);
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    if (this.failure) controller.abort(this.failure);
  }

  onResponseStart(
    _controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: IncomingHttpHeaders,
  ): void {
    if (statusCode < 200) return; // 1xx: the real answer follows
    this.started = true;
    this.resolve({ statusCode, headers, body: this });
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.closed) return;
    const w = this.waiter;
    if (w) {
      this.waiter = null;
      w.resolve({ value: chunk, done: false });
      return;
    }
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    if (this.whole === null && this.buffered > HIGH_WATER) controller.pause();
    else if (this.whole !== null && this.buffered > MAX_TEXT_BYTES) this.tooLarge(controller);
  }

  /** A body read whole passed `MAX_TEXT_BYTES`: 502 for the reader, the request aborted. */
  private tooLarge(controller: Dispatcher.DispatchController): void {
    const whole = this.whole!;
    this.whole = null;
    this.closed = true;
    this.chunks.length = 0;
    this.head = 0;
    this.buffered = 0;
    this.done();
    whole.reject(
      new ServiceError('upstream_error', {
        message: `The inference worker's answer is larger than ${MAX_TEXT_BYTES / 1024 / 1024} MiB.`,
      }),
    );
    controller.abort(new DOMException('The response body is too large', 'AbortError'));
  }

  onResponseEnd(): void {
    this.done();
    this.discardTimer?.cancel();
    this.ended = true;
    if (this.whole) {
      this.whole.resolve(this.drain());
      this.whole = null;
    }
    const w = this.waiter;
    if (w) {
      this.waiter = null;
      w.resolve({ value: undefined, done: true });
    }
  }

  onResponseError(_controller: Dispatcher.DispatchController, err: Error): void {
    this.done();
    this.discardTimer?.cancel();
    if (!this.started) {
      this.reject(err);
      return;
    }
    this.failure = err;
    if (this.whole) {
      this.whole.reject(err);
      this.whole = null;
    }
    const w = this.waiter;
    if (w) {
      this.waiter = null;
      w.reject(err);
    }
  }

  private drain(): string {
    const parts = this.head === 0 ? this.chunks : this.chunks.slice(this.head);
    const text =
      parts.length === 1 ? parts[0]!.toString('utf8') : Buffer.concat(parts).toString('utf8');
    this.chunks.length = 0;
    this.head = 0;
    this.buffered = 0;
    return text;
  }

  discard(clock: Clock, ms: number): void {
    if (this.ended || this.failure || this.closed) return;
    // Closed: later data is dropped as it arrives and the iterator reads as ended.
    this.closed = true;
    this.chunks.length = 0;
    this.head = 0;
    this.buffered = 0;
    if (this.controller?.paused) this.controller.resume();
    this.discardTimer = clock.setTimer(ms, () => {
      if (this.ended || this.failure) return;
      this.done();
      this.controller?.abort(
        new DOMException('The response did not end after its [DONE]', 'AbortError'),
      );
    });
  }

  text(): Promise<string> {
    if (this.failure && this.started) return Promise.reject(this.failure);
    if (this.ended) return Promise.resolve(this.drain());
    if (this.controller?.paused) this.controller.resume();
    return new Promise((resolve, reject) => {
      this.whole = { resolve, reject };
    });
  }

  [Symbol.asyncIterator](): AsyncIterator<Buffer> {
    return {
      next: () => {
        if (this.head < this.chunks.length) {
          const value = this.chunks[this.head]!;
          this.chunks[this.head++] = undefined as unknown as Buffer;
          this.buffered -= value.length;
          if (this.head === this.chunks.length) {
            this.chunks.length = 0;
            this.head = 0;
          }
          if (this.controller?.paused && this.buffered <= HIGH_WATER / 2) {
            this.controller.resume();
          }
          return Promise.resolve({ value, done: false });
        }
        if (this.failure) return Promise.reject(this.failure);
        if (this.ended || this.closed) return Promise.resolve({ value: undefined, done: true });
        return new Promise<IteratorResult<Buffer>>((resolve, reject) => {
          this.waiter = { resolve, reject };
        });
      },
      return: () => {
        if (!this.ended && !this.failure && !this.closed) {
          this.closed = true;
          this.done();
          this.controller?.abort(new DOMException('The response body was abandoned', 'AbortError'));
        }
        this.chunks.length = 0;
        this.head = 0;
        this.buffered = 0;
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }
}

export class UpstreamClient {
  private readonly pools = new Map<string, UndiciPool>();
  /** Base URL -> (origin, path prefix), parsed once per worker, not per request. */
  private readonly targets = new Map<string, { origin: string; prefix: string }>();

  constructor(private readonly opts: { connections?: number } = {}) {}

  private pool(origin: string): UndiciPool {
    let p = this.pools.get(origin);
    if (!p) {
      p = new Pool(origin, {
        connections: this.opts.connections ?? 256,
        // An idle connection is closed after 10 s, whatever longer keep-alive the
        // worker offers (undici honours a server's `Keep-Alive: timeout` up to
        // keepAliveMaxTimeout, 10 min by default): after a burst the pool held every
        // connection it had opened, up to 256 per worker, for the sim's 60 s, about
        // 1 MiB of the router's heap plus sockets on both sides (docs/BENCHMARKS.md,
        // "A thread's arena"). Under steady traffic connections never sit idle that long.
        keepAliveTimeout: 10_000,
        keepAliveMaxTimeout: 10_000,
        // Deadlines are the router's (tier deadline, idle timeout); undici's own
        // timers are disabled so they never fire first.
        headersTimeout: 0,
        bodyTimeout: 0,
      });
      this.pools.set(origin, p);
    }
    return p;
  }

  /** POSTs JSON to `<workerBaseUrl><path>`. */
  post(
    workerBaseUrl: string,
    path: string,
    body: string,
    signal: AbortLike,
    /** Extra request headers (trace context); the fixed ones otherwise. */
    extraHeaders?: Record<string, string>,
  ): Promise<UpstreamResponse> {
    if (signal.aborted) return Promise.reject(abortReason(signal));
    let t = this.targets.get(workerBaseUrl);
    if (!t) {
      const u = new URL(workerBaseUrl);
      t = { origin: u.origin, prefix: u.pathname.replace(/\/$/, '') };
      if (this.targets.size > 10_000) this.targets.clear();
      this.targets.set(workerBaseUrl, t);
    }
    const pool = this.pool(t.origin);
    const opts: Dispatcher.DispatchOptions = {
      method: 'POST',
      path: t.prefix + path,
      headers: extraHeaders ? { ...REQUEST_HEADERS, ...extraHeaders } : REQUEST_HEADERS,
      body,
    };
    return new Promise((resolve, reject) => {
      pool.dispatch(opts, new Exchange(signal, resolve, reject));
    });
  }

  /**
   * Keeps the pools of these workers' origins and closes the others (their in-flight
   * requests finish first): a pool per origin ever served would otherwise outlive its
   * worker, one per pod of an autoscaled fleet (the worker monitor calls this).
   */
  retain(workerUrls: Iterable<string>): void {
    const keep = new Set<string>();
    for (const url of workerUrls) {
      try {
        keep.add(new URL(url).origin);
      } catch {
        // not a URL: no pool was made for it
      }
    }
    for (const [origin, pool] of this.pools) {
      if (keep.has(origin)) continue;
      this.pools.delete(origin);
      void pool.close().catch(() => undefined);
    }
    for (const [url, t] of this.targets) if (!keep.has(t.origin)) this.targets.delete(url);
  }

  /** Origins with a connection pool (for tests and metrics). */
  get origins(): string[] {
    return [...this.pools.keys()];
  }

  async close(): Promise<void> {
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.close()));
  }
}
