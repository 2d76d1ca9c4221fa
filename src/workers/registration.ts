/**
 * The worker side of self-registration (`switchyard worker --register
 * <router-url> --token <worker token>`): registers the worker's model, tier,
 * advertised URL and capacity with the router
 * (`POST /admin/v1/workers/register`), then heartbeats at the interval the
 * router answers (`POST /admin/v1/workers/{id}/heartbeat`). A heartbeat
 * answered 404 means the router removed the worker (missed heartbeats): it
 * registers again. `drain()` asks the router to stop sending it new requests
 * (status `draining`, workers/drain.ts) while heartbeats go on; once draining it
 * never registers again. `stop()` deregisters, so the router forgets it before
 * the server closes.
 *
 * Timing is on the injected clock. The first registration's answer decides
 * start-up: a refused token or an unknown model is a configuration error the
 * caller reports; an unreachable router is retried with backoff.
 *
 * Stopped (or drained) before the first registration succeeded, it makes no other
 * attempt: a backoff wait ends at once and `start()` rejects with
 * RegistrationStopped. A registration already sent is given `START_GRACE_MS` for
 * its answer: if the router took it, `stop()` deregisters it; after that the call
 * is aborted (a router that recorded it anyway drops it when its heartbeats do not
 * come).
 */
import { request } from '../runtime/http-client.js';
import type { Clock, Timer } from '../runtime/clock.js';

export interface RegistrationOptions {
  /** The router's base URL, e.g. `http://router:8080`. */
  routerUrl: string;
  token: string;
  model: string;
  /** The project whose own model `model` names, when projects share the name. */
  project?: string;
  tier: string;
  /** The worker's OpenAI base URL as the router reaches it, ending in `/v1`. */
  url: string;
  capacity?: number;
  /** `priority`: the worker orders its queue by the request's `priority` (the router sends one). */
  schedulingPolicy?: 'fcfs' | 'priority';
  id?: string;
  clock: Clock;
  log?: (line: string) => void;
  /** HTTP timeout per call (ms, real time). */
  timeoutMs?: number;
}

export class RegistrationError extends Error {}

/** `stop()` or `drain()` came before the first registration succeeded. */
export class RegistrationStopped extends Error {
  constructor() {
    super('stopped before the first registration');
  }
}

const RETRY_MIN_MS = 1000;
const RETRY_MAX_MS = 30_000;
/** How long `stop()` waits for the answer to a registration sent before it. */
export const START_GRACE_MS = 500;

interface Answer {
  status: number;
  body: Record<string, unknown>;
}

export class WorkerRegistration {
  private id: string | null = null;
  private intervalMs = 5000;
  private timer: Timer | null = null;
  private stopped = false;
  private draining = false;
  private retryMs = RETRY_MIN_MS;
  private pending: Promise<void> = Promise.resolve();
  /** The first registration's call while it is in flight. */
  private attempt: Promise<void> | null = null;
  /** Ends the backoff wait between first tries early (stop, drain). */
  private wake: (() => void) | null = null;
  private backoffTimer: Timer | null = null;
  /** Aborts the first registration's call (stop, after the grace). */
  private readonly starting = new AbortController();

  constructor(private readonly o: RegistrationOptions) {}

  get workerId(): string | null {
    return this.id;
  }

  /**
   * Registers (retrying while the router is unreachable), then keeps
   * heartbeating. Rejects with RegistrationError when the router refuses.
   */
  async start(): Promise<string> {
    for (;;) {
      if (this.stopped || this.draining) throw new RegistrationStopped();
      try {
        this.attempt = this.register(this.starting.signal);
        await this.attempt;
        this.schedule(this.intervalMs);
        return this.id!;
      } catch (err) {
        if (err instanceof RegistrationError) throw err;
        if (this.stopped || this.draining) throw new RegistrationStopped();
        this.log(`registration with ${this.o.routerUrl} failed (${msg(err)}); retrying`);
      } finally {
        this.attempt = null;
      }
      await new Promise<void>((resolve) => {
        this.wake = resolve;
        this.backoffTimer = this.o.clock.setTimer(this.backoff(), resolve);
      });
      this.wake = null;
      this.backoffTimer = null;
    }
  }

  /** No further first tries: the backoff wait, if any, ends now. */
  private interruptStart(): void {
    this.backoffTimer?.cancel();
    this.backoffTimer = null;
    this.wake?.();
  }

  /**
   * Asks the router to send no new requests (`POST /admin/v1/workers/{id}/drain`);
   * heartbeats go on, and a router that forgot the worker is not asked to take it
   * back. True when the router confirmed.
   */
  async drain(): Promise<boolean> {
    this.draining = true;
    this.interruptStart();
    if (!this.id) return false;
    try {
      const res = await this.call('POST', `/admin/v1/workers/${encodeURIComponent(this.id)}/drain`);
      if (res.status !== 200) throw new Error(`HTTP ${res.status}`);
      this.log(`draining ${this.id}`);
      return true;
    } catch (err) {
      this.log(`drain request failed (${msg(err)})`);
      return false;
    }
  }

  /** Stops heartbeating and deregisters (best effort: the router removes it anyway). */
  async stop(): Promise<void> {
    this.stopped = true;
    this.interruptStart();
    this.timer?.cancel();
    this.timer = null;
    const attempt = this.attempt?.catch(() => undefined);
    if (attempt) {
      // Sent before the stop: deregistered below if the router answers in time.
      let expired!: () => void;
      const late = new Promise<void>((resolve) => (expired = resolve));
      const grace = this.o.clock.setTimer(START_GRACE_MS, () => expired());
      await Promise.race([attempt, late]);
      grace.cancel();
      this.starting.abort();
      await attempt;
    }
    await this.pending;
    if (!this.id) return;
    try {
      await this.call('POST', `/admin/v1/workers/${encodeURIComponent(this.id)}/deregister`);
      this.log(`deregistered ${this.id}`);
    } catch (err) {
      this.log(`deregistration failed (${msg(err)})`);
    }
  }

  private async register(signal?: AbortSignal): Promise<void> {
    const res = await this.call('POST', '/admin/v1/workers/register', signal, {
      model: this.o.model,
      ...(this.o.project ? { project: this.o.project } : {}),
      tier: this.o.tier,
      url: this.o.url,
      ...(this.o.capacity ? { capacity: this.o.capacity } : {}),
      ...(this.o.schedulingPolicy ? { scheduling_policy: this.o.schedulingPolicy } : {}),
      ...((this.id ?? this.o.id) ? { id: this.id ?? this.o.id } : {}),
    });
    if (res.status >= 500) throw new Error(`HTTP ${res.status}`);
    if (res.status !== 200 && res.status !== 201) {
      const e = res.body.error as { message?: string } | undefined;
      throw new RegistrationError(`router refused registration: ${e?.message ?? res.status}`);
    }
    this.id = String(res.body.id);
    this.adopt(res.body);
    this.retryMs = RETRY_MIN_MS;
    this.log(`registered with ${this.o.routerUrl} as ${this.id}`);
  }

  private adopt(body: Record<string, unknown>): void {
    const ms = body.heartbeat_interval_ms;
    if (typeof ms === 'number' && Number.isFinite(ms) && ms >= 100) this.intervalMs = ms;
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = this.o.clock.setTimer(ms, () => {
      this.pending = this.beat();
    });
  }

  private async beat(): Promise<void> {
    let next = this.intervalMs;
    try {
      const res = await this.call(
        'POST',
        `/admin/v1/workers/${encodeURIComponent(this.id!)}/heartbeat`,
      );
      if (res.status === 404 && this.draining) {
        this.log(`router forgot ${this.id}; draining, so not registering again`);
      } else if (res.status === 404) {
        this.log(`router forgot ${this.id}; registering again`);
        await this.register();
      } else if (res.status === 200) {
        this.adopt(res.body);
        next = this.intervalMs;
      } else {
        throw new Error(`HTTP ${res.status}`);
      }
    } catch (err) {
      this.log(`heartbeat failed (${msg(err)})`);
      next = Math.min(this.intervalMs, this.backoff());
    }
    this.schedule(next);
  }

  private backoff(): number {
    const ms = this.retryMs;
    this.retryMs = Math.min(this.retryMs * 2, RETRY_MAX_MS);
    return ms;
  }

  private async call(
    method: 'POST',
    path: string,
    signal?: AbortSignal,
    body?: unknown,
  ): Promise<Answer> {
    const timeout = this.o.timeoutMs ?? 5000;
    const res = await request(this.o.routerUrl.replace(/\/+$/, '') + path, {
      method,
      ...(signal ? { signal } : {}),
      headers: {
        authorization: `Bearer ${this.o.token}`,
        ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
      },
      body: body !== undefined ? JSON.stringify(body) : undefined,
      headersTimeout: timeout,
      bodyTimeout: timeout,
    });
    const text = await res.body.text();
    let parsed: Record<string, unknown> = {};
    try {
      parsed = text ? (JSON.parse(text) as Record<string, unknown>) : {};
    } catch {
      parsed = {};
    }
    return { status: res.statusCode, body: parsed };
  }

  private log(line: string): void {
    this.o.log?.(line);
  }
}

function msg(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
