/**
 * The PGlite database in its own thread (see pglite-thread.ts for why). This
 * file runs inside a `worker_threads` Worker: it owns the PGlite instance and
 * answers the main thread's messages. Transactions use PGlite's own
 * `transaction()`, so while one is open PGlite queues every other query exactly
 * as it does in-process; the main thread decides when it commits or rolls back.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { PGlite, types, type Transaction } from '@electric-sql/pglite';
import { pgliteOptions, type PgliteOpen } from './pglite-options.js';
import type { Reply, Request } from './pglite-thread.js';

const port = parentPort!;

// The parsers drizzle-orm's PGlite driver passes on every query: dates,
// timestamps and intervals stay strings (drizzle maps them itself).
const keep = (v: string) => v;
const PARSERS = {
  [types.TIMESTAMP]: keep,
  [types.TIMESTAMPTZ]: keep,
  [types.INTERVAL]: keep,
  [types.DATE]: keep,
  1231: keep, // numeric[]
  1115: keep, // timestamp[]
  1185: keep, // timestamptz[]
  1187: keep, // interval[]
  1182: keep, // date[]
};

interface OpenTx {
  tx: Transaction;
  end: (commit: boolean) => void;
}

const ROLLBACK = Symbol('rollback');
const open = new Map<number, OpenTx>();
let nextTx = 1;

function send(reply: Reply): void {
  port.postMessage(reply);
}

/** A DatabaseError's fields (code, detail, constraint, …) survive the thread hop. */
function serializeError(err: unknown): Record<string, unknown> {
  if (!(err instanceof Error)) return { message: String(err) };
  const out: Record<string, unknown> = { message: err.message, name: err.name };
  for (const [k, v] of Object.entries(err)) {
    if (typeof v === 'string' || typeof v === 'number') out[k] = v;
  }
  return out;
}

async function main(): Promise<void> {
  const pg = new PGlite(pgliteOptions(workerData as PgliteOpen));
  await pg.waitReady;
  send({ id: 0, ok: true, value: null });

  port.on('message', (m: Request) => {
    void handle(pg, m).then(
      (value) => send({ id: m.id, ok: true, value }),
      (err: unknown) => send({ id: m.id, ok: false, error: serializeError(err) }),
    );
  });
}

async function handle(pg: PGlite, m: Request): Promise<unknown> {
  switch (m.op) {
    case 'query': {
      const target = m.tx ? open.get(m.tx)?.tx : pg;
      if (!target) throw new Error('transaction is no longer open');
      const r = await target.query(m.text, m.params, { rowMode: m.rowMode, parsers: PARSERS });
      return { rows: r.rows, fields: r.fields, affectedRows: r.affectedRows };
    }
    case 'begin':
      return begin(pg);
    case 'end': {
      const t = open.get(m.tx);
      if (!t) throw new Error('transaction is no longer open');
      t.end(m.commit);
      return done.get(m.tx);
    }
    case 'close':
      await pg.close();
      return null;
  }
}

const done = new Map<number, Promise<null>>();

/** Opens a transaction and resolves with its id once PGlite has begun it. */
function begin(pg: PGlite): Promise<number> {
  const id = nextTx++;
  return new Promise<number>((started, failed) => {
    const finished = pg
      .transaction(async (tx) => {
        const commit = await new Promise<boolean>((end) => {
          open.set(id, { tx, end });
          started(id);
        });
        if (!commit) throw ROLLBACK;
      })
      .then(
        () => null,
        (err: unknown) => {
          if (err === ROLLBACK) return null;
          throw err;
        },
      )
      .finally(() => {
        open.delete(id);
        done.delete(id);
      });
    done.set(id, finished);
    // A failure to begin at all (before the callback ran).
    finished.catch(failed);
  });
}

void main().catch((err: unknown) => {
  send({ id: 0, ok: false, error: serializeError(err) });
});
