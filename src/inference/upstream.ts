/**
 * Outbound HTTP to inference workers: one keep-alive undici Pool per worker
 * origin. The router never links an engine into its hot path; it proxies.
 */
import { Pool, type Dispatcher } from 'undici';

export interface UpstreamResponse {
  statusCode: number;
  headers: Dispatcher.ResponseData['headers'];
  body: Dispatcher.ResponseData['body'];
}

const REQUEST_HEADERS = {
  'content-type': 'application/json',
  accept: 'application/json, text/event-stream',
} as const;

export class UpstreamClient {
  private readonly pools = new Map<string, Pool>();
  /** Base URL -> (origin, path prefix), parsed once per worker, not per request. */
  private readonly targets = new Map<string, { origin: string; prefix: string }>();

  constructor(private readonly opts: { connections?: number } = {}) {}

  private pool(origin: string): Pool {
    let p = this.pools.get(origin);
    if (!p) {
      p = new Pool(origin, {
        connections: this.opts.connections ?? 256,
        keepAliveTimeout: 30_000,
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
    signal: AbortSignal,
    /** Extra request headers (trace context); the fixed ones otherwise. */
    extraHeaders?: Record<string, string>,
  ): Promise<UpstreamResponse> {
    let t = this.targets.get(workerBaseUrl);
    if (!t) {
      const u = new URL(workerBaseUrl);
      t = { origin: u.origin, prefix: u.pathname.replace(/\/$/, '') };
      if (this.targets.size > 10_000) this.targets.clear();
      this.targets.set(workerBaseUrl, t);
    }
    return this.pool(t.origin).request({
      method: 'POST',
      path: t.prefix + path,
      headers: extraHeaders ? { ...REQUEST_HEADERS, ...extraHeaders } : REQUEST_HEADERS,
      body,
      signal,
    });
  }

  async close(): Promise<void> {
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.close()));
  }
}
