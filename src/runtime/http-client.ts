/**
 * The parts of undici that Switchyard uses, loaded on their own: the connection
 * pool (workers), the agent and its connector (webhooks' SSRF guard) and the
 * request API (worker health checks, webhook deliveries, registration, the admin
 * CLI).
 *
 * Why not `import … from 'undici'`: the package entry also loads fetch, WebSocket,
 * EventSource, CacheStorage, the cookie and MIME helpers, the proxy, retry and
 * HTTP/2 agents, the cache interceptors and the mock agents. That is 4.2 MiB of V8
 * heap in every router for code it never calls; these four parts are 1.3 MiB
 * (`node --expose-gc`, heap used after two collections, undici 7.30). undici has no
 * `exports` map, so its files are importable by path; the types are undici's own.
 * If a file moves in a later undici, these requires fail at start-up, not later.
 */
import { createRequire } from 'node:module';
import type * as Undici from 'undici';

const load = createRequire(import.meta.url);

// What undici's entry does: every dispatcher (Pool, Agent, …) gets request(),
// stream(), pipeline(), connect() and upgrade().
Object.assign(
  (load('undici/lib/dispatcher/dispatcher.js') as { prototype: object }).prototype,
  load('undici/lib/api/index.js') as object,
);

export const Pool = load('undici/lib/dispatcher/pool.js') as typeof Undici.Pool;
export const Agent = load('undici/lib/dispatcher/agent.js') as typeof Undici.Agent;
export const buildConnector = load('undici/lib/core/connect.js') as typeof Undici.buildConnector;
const { getGlobalDispatcher } = load('undici/lib/global.js') as {
  getGlobalDispatcher: typeof Undici.getGlobalDispatcher;
};

export type RequestOptions = Omit<Undici.Dispatcher.RequestOptions, 'origin' | 'path'> & {
  /** The dispatcher to send through; undici's global agent by default. */
  dispatcher?: Undici.Dispatcher;
};

/**
 * undici's `request(url, options)`: one request through `dispatcher` (or the
 * global agent), answered with status, headers and a body stream.
 */
export function request(
  url: string | URL,
  { dispatcher = getGlobalDispatcher(), ...options }: RequestOptions,
): Promise<Undici.Dispatcher.ResponseData> {
  const u = new URL(url);
  return dispatcher.request({ ...options, origin: u.origin, path: u.pathname + u.search });
}
