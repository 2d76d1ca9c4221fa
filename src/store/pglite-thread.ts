/**
 * PGlite off the event loop. PGlite runs PostgreSQL compiled to WebAssembly
 * synchronously in whatever thread calls it: in the router's main thread every
 * usage batch, webhook claim and key lookup froze request handling for as long
 * as the database worked (profiled: tens of ms per usage batch, the router's
 * whole p99). Here PGlite lives in a `worker_threads` Worker and this client
 * speaks to it with messages; it has the shape drizzle-orm's PGlite driver
 * uses (`query`, `transaction`), so the schema, queries and migrations are
 * unchanged.
 *
 * Hand-written because no library does it for Node: PGlite's own `PGliteWorker`
 * targets browser Web Workers, and `@electric-sql/pglite-socket` pins another
 * PGlite version and adds a wire-protocol hop.
 */
import { Worker } from 'node:worker_threads';
import type { PgliteOpen } from './pglite-options.js';

type RowMode = 'array' | 'object';

export type Request =
  | { id: number; op: 'query'; text: string; params: unknown[]; rowMode: RowMode; tx: number }
  | { id: number; op: 'begin' }
  | { id: number; op: 'end'; tx: number; commit: boolean }
  | { id: number; op: 'close' };

/** A request without its id (distributes over the union, unlike `Omit`). */
type Call = Request extends infer R ? (R extends { id: number } ? Omit<R, 'id'> : never) : never;

export type Reply =
  | { id: number; ok: true; value: unknown }
  | { id: number; ok: false; error: Record<string, unknown> };

export interface QueryResult {
  rows: unknown[];
  fields: { name: string; dataTypeID: number }[];
  affectedRows?: number;
}

interface QueryOptions {
  rowMode?: RowMode;
}

function rebuildError(e: Record<string, unknown>): Error {
  const err = new Error(String(e.message ?? 'database error'));
  Object.assign(err, e);
  return err;
}

/** The worker script next to this module: .js when built, .ts under tsx in tests. */
function workerUrl(): URL {
  const ext = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
  return new URL(`./pglite-worker${ext}`, import.meta.url);
}

export class PgliteThreadClient {
  private readonly worker: Worker;
  private readonly pending = new Map<
    number,
    { resolve: (v: unknown) => void; reject: (e: Error) => void }
  >();
  private nextId = 1;
  private dead: Error | null = null;

  private constructor(worker: Worker) {
    this.worker = worker;
    worker.on('message', (r: Reply) => {
      const p = this.pending.get(r.id);
      if (!p) return;
      this.pending.delete(r.id);
      if (r.ok) p.resolve(r.value);
      else p.reject(rebuildError(r.error));
    });
    const fail = (err: Error) => {
      this.dead = err;
      for (const p of this.pending.values()) p.reject(err);
      this.pending.clear();
    };
    worker.on('error', fail);
    worker.on('exit', (code) => fail(new Error(`the PGlite thread exited (code ${code})`)));
  }

  /** `from`: a data directory dump to start from (see OpenStoreOptions.pgliteFrom). */
  static async open(opts: PgliteOpen): Promise<PgliteThreadClient> {
    const url = workerUrl();
    const worker = url.pathname.endsWith('.ts')
      ? // Under tsx (the tests), the worker registers the TypeScript loader first:
        // Node 20 does not apply `--import` hooks to a worker's entry module.
        new Worker(
          `import('tsx/esm/api').then((m) => { m.register(); return import(${JSON.stringify(url.href)}); })`,
          { eval: true, workerData: opts },
        )
      : new Worker(url, { workerData: opts });
    await new Promise<void>((resolve, reject) => {
      const onMessage = (r: Reply) => {
        if (r.id !== 0) return;
        worker.off('message', onMessage);
        worker.off('error', reject);
        if (r.ok) resolve();
        else reject(rebuildError(r.error));
      };
      worker.on('message', onMessage);
      worker.once('error', reject);
    });
    return new PgliteThreadClient(worker);
  }

  private call<T>(req: Call): Promise<T> {
    if (this.dead) return Promise.reject(this.dead);
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.worker.postMessage({ ...req, id } as Request);
    });
  }

  query(text: string, params: unknown[] = [], opts: QueryOptions = {}): Promise<QueryResult> {
    return this.queryIn(0, text, params, opts);
  }

  private queryIn(
    tx: number,
    text: string,
    params: unknown[],
    opts: QueryOptions,
  ): Promise<QueryResult> {
    return this.call<QueryResult>({
      op: 'query',
      text,
      params,
      rowMode: opts.rowMode ?? 'object',
      tx,
    });
  }

  /** Commits when `fn` resolves, rolls back when it throws (as PGlite's own). */
  async transaction<T>(fn: (tx: { query: PgliteThreadClient['query'] }) => Promise<T>): Promise<T> {
    const tx = await this.call<number>({ op: 'begin' });
    let result: T;
    try {
      result = await fn({
        query: (text, params = [], opts = {}) => this.queryIn(tx, text, params, opts),
      });
    } catch (err) {
      await this.call({ op: 'end', tx, commit: false }).catch(() => undefined);
      throw err;
    }
    await this.call({ op: 'end', tx, commit: true });
    return result;
  }

  async close(): Promise<void> {
    if (!this.dead) await this.call({ op: 'close' }).catch(() => undefined);
    await this.worker.terminate();
  }
}
