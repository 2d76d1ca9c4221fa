/**
 * The llama worker's own failures reach its log (`onFailure`, wired to the
 * worker's logger by `switchyard worker` and `switchyard serve`): a 5xx answered
 * and a stream ended by an error after its headers, each with its request id. A
 * client's bad request is the client's, and is not reported. The engine here is a
 * stand-in whose generation throws; the HTTP handler is the real one.
 */
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import type { LlamaEngine, RunOptions } from './engine.js';
import { createLlamaHandler } from './server.js';

describe('llama worker failures', () => {
  const reported: Array<{ err: unknown; requestId: string | undefined }> = [];
  let server: Server;
  let url: string;
  before(async () => {
    const engine = {
      info: () => ({
        modelName: 'stand-in',
        modelPath: '/nowhere.gguf',
        contextSize: 512,
        trainContextSize: 512,
        sequences: 1,
        threads: 1,
        vocabularySize: 10,
        chatWrapper: 'none',
        llamaCppRelease: 'none',
        systemFingerprint: 'fp_test',
      }),
      capabilities: () => [],
      complete: (_req: unknown, run: RunOptions = {}) => {
        run.onStart?.();
        return Promise.reject(new Error('the context could not be created'));
      },
    } as unknown as LlamaEngine;
    server = createServer(
      createLlamaHandler(engine, {
        onFailure: (err, requestId) => reported.push({ err, requestId }),
      }),
    );
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/chat/completions`;
  });
  after(() => new Promise<void>((r) => server.close(() => r())));

  const post = (body: unknown, requestId: string) =>
    fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': requestId },
      body: JSON.stringify(body),
    });
  const chat = { model: 'm', messages: [{ role: 'user', content: 'hi' }] };

  it('a 5xx answered is reported with the cause and the request id', async () => {
    reported.length = 0;
    const res = await post(chat, 'chatcmpl-one');
    assert.equal(res.status, 500);
    const body = (await res.json()) as { error: { code: string } };
    assert.equal(body.error.code, 'internal_error');
    assert.equal(reported.length, 1);
    assert.equal(reported[0]!.requestId, 'chatcmpl-one');
    assert.match(String((reported[0]!.err as Error).message), /context could not be created/);
  });

  it('a stream that fails after its headers is reported, and ends with the error event', async () => {
    reported.length = 0;
    const res = await post({ ...chat, stream: true }, 'chatcmpl-two');
    assert.equal(res.status, 200);
    const text = await res.text();
    assert.match(text, /"internal_error"/);
    assert.match(text, /data: \[DONE\]/);
    assert.equal(reported.length, 1);
    assert.equal(reported[0]!.requestId, 'chatcmpl-two');
  });

  it("a client's bad request is not the worker's failure: not reported", async () => {
    reported.length = 0;
    const res = await post({ model: 'm', messages: 'hi' }, 'chatcmpl-three');
    assert.equal(res.status, 400);
    assert.equal(reported.length, 0);
  });
});
