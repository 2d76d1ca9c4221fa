/**
 * A client that goes away before its request reached a worker (while the router was
 * still looking up what the request needs: SLO targets, the worker list, the
 * balance) is noticed when the request is about to be sent: nothing goes to a worker,
 * its slot is free at once, and no usage is recorded, streaming or not.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setImmediate as tick } from 'node:timers/promises';
import { afterEach, describe, it } from 'node:test';
import { tables } from '../../src/store/index.js';
import { inferenceFixture, postChat, until, type InferenceFixture } from '../support/inference.js';

describe('a client that leaves before its request reaches a worker', () => {
  let f: InferenceFixture;
  afterEach(() => f?.close());

  for (const stream of [false, true]) {
    it(`is not sent to a worker (${stream ? 'streaming' : 'non-streaming'})`, async () => {
      f = await inferenceFixture({
        simOnFakeClock: true,
        sim: { ttftMs: 1000, prefillMsPerToken: 0 },
      });
      // Hold the request in one of its lookups before the worker is picked.
      const slos = f.server.services.slos;
      const targets = slos.targets.bind(slos);
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      let entered = false;
      slos.targets = async (id: string) => {
        entered = true;
        await gate;
        return targets(id);
      };
      let closed = false;
      f.server.app.server.once('request', (_req: IncomingMessage, res: ServerResponse) =>
        res.once('close', () => (closed = true)),
      );
      const ac = new AbortController();
      const sent = postChat(f, { max_tokens: 3, stream }, ac.signal).catch(() => null);
      await until(() => entered, 'the request to reach its lookups');
      ac.abort();
      await sent;
      await until(() => closed, 'the router to see the connection close');
      release();
      for (let i = 0; i < 50; i++) await tick();
      f.server.clock.advance(5000);
      for (let i = 0; i < 50; i++) await tick();
      assert.equal(f.worker.stats().received, 0, 'nothing sent to the worker');
      assert.equal(f.server.services.pool.load('sim-1'), 0, 'no slot held');
      await f.server.services.usage.flush();
      const rows = await f.server.services.store.db.select().from(tables.usageRecords);
      assert.deepEqual(
        rows.map((r) => r.status),
        [],
      );
    });
  }
});
