/**
 * A streamed tool-bridge answer to a client that stops reading and then goes away.
 * The bridge writes one SSE frame per worker event and waits for the client's
 * socket to drain when a write is refused; the wait ends when the client leaves.
 * The worker's next events, already read in the same upstream chunk, must then
 * not wait again on a socket that is gone: the request ends, `cancelled`, and its
 * usage record is written, instead of hanging forever (never recorded, never
 * leaving the router's set of open streams, its worker's slot never released).
 * The record bills what streamed before the client left, as for any stream: the
 * answer round in progress counts, not only the rounds that ran to their end.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { tables } from '../../src/store/index.js';
import type { InferenceFixture } from '../support/inference.js';
import { bridgeFixture, until } from './agents.js';
import { listenWorker } from '../support/fake-worker.js';

/** Streams a long answer: thousands of events in a few large writes. */
async function longAnswerWorker() {
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.method !== 'POST') {
        res.end('');
        return;
      }
      const head = { id: 'chatcmpl-w', created: 1, model: 'm', object: 'chat.completion.chunk' };
      const event = (c: object) => `data: ${JSON.stringify({ ...head, ...c })}\n\n`;
      const text = 'lorem ipsum '.repeat(80);
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      let body = event({
        choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }],
      });
      for (let i = 0; i < 6000; i++) {
        body += event({ choices: [{ index: 0, delta: { content: text }, finish_reason: null }] });
      }
      body += event({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] });
      res.end(body + 'data: [DONE]\n\n');
    });
  });
  return listenWorker(server);
}

describe('tool bridge: a streaming client that stops reading, then leaves', () => {
  let f: InferenceFixture;
  let w: Awaited<ReturnType<typeof longAnswerWorker>>;
  before(async () => {
    w = await longAnswerWorker();
    ({ f } = await bridgeFixture({ workerUrl: w.url, workerId: 'long', agent: 'bp-agent' }));
  });
  after(async () => {
    await f.close();
    await w.close();
  });

  it('ends the request and records it once the client is gone', async () => {
    const url = new URL(`${f.baseURL}/chat/completions`);
    const body = JSON.stringify({
      model: 'x',
      messages: [{ role: 'user', content: 'Tell me a long story.' }],
      stream: true,
      x_exec: true,
    });
    const sock = net.connect(Number(url.port), url.hostname);
    await once(sock, 'connect');
    // A small receive buffer, and no reading after the first bytes: the router's
    // writes are refused soon.
    sock.setNoDelay(true);
    sock.write(
      `POST ${url.pathname} HTTP/1.1\r\nHost: ${url.host}\r\n` +
        `Authorization: Bearer ${f.key}\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
    const first = (await once(sock, 'data')) as [Buffer];
    const head = first[0].toString('latin1');
    assert.match(head, /^HTTP\/1\.1 200/);
    const requestId = /x-request-id: (\S+)/i.exec(head)![1]!;
    sock.pause();
    // Let the router fill the socket and wait for it to drain, then leave.
    await new Promise((r) => setTimeout(r, 1500));
    sock.destroy();

    const row = await until(
      async () => {
        await f.server.services.usage.flush();
        const [r] = await f.server.services.store.db
          .select()
          .from(tables.usageRecords)
          .where(eq(tables.usageRecords.requestId, requestId));
        return r;
      },
      10_000,
      'the usage record of the abandoned stream',
    );
    assert.equal(row.status, 'cancelled');
    // What streamed before the client left is billed, as for any stream (docs/INFERENCE.md,
    // "Usage records"): the router's estimate, the worker sent no usage before the end.
    assert.ok(row.promptTokens > 0, `prompt billed: ${row.promptTokens}`);
    assert.ok(row.completionTokens > 100, `streamed tokens billed: ${row.completionTokens}`);
  });
});
