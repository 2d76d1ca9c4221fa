/**
 * A non-streamed tool-bridge request the client leaves while the worker has a round:
 * as any chat request ended that way (docs/INFERENCE.md, "Usage records"), the
 * prompt the worker read is billed at the router's estimate and the request is
 * recorded `cancelled`. A round the worker failed before answering stays free.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { tables } from '../../src/store/index.js';
import type { InferenceFixture } from '../support/inference.js';
import { bridgeFixture, until } from './agents.js';
import { listenWorker } from '../support/fake-worker.js';

/** A worker that takes requests and never answers; `next()` resolves at the next one. */
async function silentWorker() {
  let arrived: (() => void) | null = null;
  const server = http.createServer((req) => {
    req.resume();
    if (req.method === 'POST') req.on('end', () => arrived?.());
  });
  return {
    ...(await listenWorker(server)),
    next: () => new Promise<void>((r) => (arrived = r)),
  };
}

describe('tool bridge: a non-streamed request the client leaves', () => {
  let f: InferenceFixture;
  let w: Awaited<ReturnType<typeof silentWorker>>;
  before(async () => {
    w = await silentWorker();
    ({ f } = await bridgeFixture({ workerUrl: w.url, workerId: 'silent', agent: 'bc-agent' }));
  });
  after(async () => {
    await f.close();
    await w.close();
  });

  it('bills the prompt the worker read and records the request cancelled', async () => {
    const ac = new AbortController();
    const arrived = w.next();
    const res = fetch(`${f.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${f.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'x',
        messages: [{ role: 'user', content: 'Read the file /etc/hostname, please. '.repeat(20) }],
        x_exec: true,
      }),
      signal: ac.signal,
    }).catch((err: unknown) => err);
    await arrived;
    ac.abort();
    assert.ok((await res) instanceof Error, 'the client left');

    const row = await until(
      async () => {
        await f.server.services.usage.flush();
        const rows = await f.server.services.store.db
          .select()
          .from(tables.usageRecords)
          .where(eq(tables.usageRecords.workerId, 'silent'));
        return rows[0];
      },
      10_000,
      'the usage record of the abandoned request',
    );
    assert.equal(row.status, 'cancelled');
    assert.ok(row.promptTokens > 100, `prompt billed: ${row.promptTokens}`);
    assert.equal(row.completionTokens, 0);
  });
});
