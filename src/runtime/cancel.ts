/**
 * A request's cancellation: what an AbortController and its AbortSignal do for one
 * chat completion, without an EventTarget. Node's AbortSignal is an EventTarget;
 * making one per request and adding and removing its listeners cost about 3 % of
 * the router's CPU per chat completion (profiled under wrk: `createAbortSignal`,
 * `addEventListener`, `removeEventListener`). Everything on the request path needs
 * one flag and a few callbacks.
 *
 * `Cancellation` has the signal's `aborted`, `reason` and `add/removeEventListener`
 * ('abort' only), and is its own `signal`, so it stands where a controller was
 * used, and code that takes an `AbortLike` accepts a real AbortSignal as well.
 */
export interface AbortLike {
  readonly aborted: boolean;
  readonly reason: unknown;
  addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }): void;
  removeEventListener(type: 'abort', listener: () => void): void;
}

export class Cancellation implements AbortLike {
  aborted = false;
  reason: unknown = undefined;
  private listeners: Array<() => void> = [];

  /** This object: the controller and its signal are one here. */
  get signal(): this {
    return this;
  }

  /** Sets `aborted` and calls every listener once; later calls do nothing. */
  abort(reason?: unknown): void {
    if (this.aborted) return;
    this.aborted = true;
    this.reason = reason ?? new DOMException('This operation was aborted', 'AbortError');
    const ls = this.listeners;
    this.listeners = [];
    for (const l of ls) l();
  }

  /** Like an AbortSignal's: a listener added after the abort is never called. */
  addEventListener(_type: 'abort', listener: () => void): void {
    if (!this.aborted) this.listeners.push(listener);
  }

  removeEventListener(_type: 'abort', listener: () => void): void {
    const i = this.listeners.indexOf(listener);
    if (i >= 0) this.listeners.splice(i, 1);
  }
}
