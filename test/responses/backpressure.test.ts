/**
 * A streamed response to a client that reads slowly: the Responses stream waits for
 * the client as chat's does, so the router stops reading the chat stream (and the
 * chat route the worker's) instead of holding the whole answer in memory for it.
 * Seen from outside: while the client reads nothing, the answer cannot have been
 * consumed to its end, so the response is not stored yet; once the client reads, the
 * stream completes and the response is stored.
 */
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { tables } from '../../src/store/index.js';
import { inferenceFixture, until, type InferenceFixture } from '../support/inference.js';

/** About 7 MB of events: more than the loopback socket's buffers hold. */
const TOKENS = 30_000;

describe('Responses API: a slow client holds the stream back', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({
      tier: 'self_hosted',
      contextWindow: 200_000,
      sim: { contextWindow: 200_000, ttftMs: 0, tpotMs: 0 },
    });
  });
  after(() => f.close());

  it('nothing is read: the stream waits; reading it through completes and stores it', async () => {
    const url = new URL(`${f.baseURL}/responses`);
    const body = JSON.stringify({
      model: 'x',
      input: `[sim:len=${TOKENS}] Go on.`,
      stream: true,
      max_output_tokens: TOKENS + 1000,
    });
    const socket = connect(Number(url.port), url.hostname);
    await new Promise<void>((resolve) => socket.once('connect', resolve));
    socket.write(
      `POST ${url.pathname} HTTP/1.1\r\nhost: ${url.host}\r\n` +
        `authorization: Bearer ${f.key}\r\ncontent-type: application/json\r\n` +
        `content-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
    );
    // The client reads nothing for now.
    socket.pause();
    const stored = async () =>
      (await f.server.services.store.db.select().from(tables.responses)).length;
    await until(() => f.worker.stats().completed >= 1, 'the worker to finish', 20_000);
    // Had the stream not waited, the router would go through what the worker sent (a few
    // seconds on a busy machine) and store the response.
    for (let waited = 0; waited < 8000; waited += 250) {
      assert.equal(await stored(), 0, 'the stream went on without the client');
      await new Promise((r) => setTimeout(r, 250));
    }

    let text = '';
    socket.setEncoding('utf8');
    socket.on('data', (c: string) => (text += c));
    const ended = new Promise<void>((resolve) => socket.once('end', resolve));
    socket.resume();
    await ended;
    socket.destroy();
    assert.match(text, /^HTTP\/1\.1 200 /);
    assert.match(text, /event: response\.incomplete\n|event: response\.completed\n/);
    assert.equal(await stored(), 1);
  });
});
