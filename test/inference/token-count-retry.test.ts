/**
 * The engine's token-count retry and the clamp header. The model record claims an
 * 8192-token window while the sim worker has 4096, so the router's own clamp lets
 * too much through, the engine rejects it with its exact token-count error, and the
 * router retries once with the value the engine says fits. The header
 * `X-Service-Max-Tokens-Clamped` reports a reduction of the client's max_tokens
 * only (spec: "present only when max_tokens was reduced"): a client that sent none
 * gets the retry but no header.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { inferenceFixture, type InferenceFixture } from '../support/inference.js';

describe('engine token-count retry and the clamp header', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({ contextWindow: 8192 });
  });
  after(() => f.close());

  async function ask(fields: Record<string, unknown>) {
    const before = f.worker.stats().httpRequests;
    const res = await fetch(`${f.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${f.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'x',
        messages: [{ role: 'user', content: 'fit me [sim:len=4]' }],
        ...fields,
      }),
    });
    const text = await res.text();
    return {
      status: res.status,
      text,
      clamped: res.headers.get('x-service-max-tokens-clamped'),
      attempts: f.worker.stats().httpRequests - before,
    };
  }

  it('no max_tokens from the client: retried, and no clamp header, streaming or not', async () => {
    for (const stream of [false, true]) {
      const r = await ask({ stream });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.attempts, 2, 'the engine rejected the first attempt and the retry fit');
      assert.equal(r.clamped, null, `stream=${stream}: ${String(r.clamped)}`);
    }
  });

  it("messages longer than the engine's window: 400 context_length_exceeded naming messages", async () => {
    // About 5,600 tokens: under the model record's 8,192, over the worker's 4,096.
    const content = 'lorem ipsum dolor '.repeat(1_400);
    for (const fields of [{}, { max_tokens: 5 }]) {
      const r = await ask({ messages: [{ role: 'user', content }], ...fields });
      assert.equal(r.status, 400, r.text);
      const e = (JSON.parse(r.text) as { error: Record<string, unknown> }).error;
      assert.equal(e.code, 'context_length_exceeded');
      assert.equal(e.param, 'messages');
      // Not the engine's words about a max_tokens of the router's own choosing.
      assert.doesNotMatch(String(e.message), /in the completion/);
    }
  });

  it("the client's max_tokens reduced by the retry: the header says so", async () => {
    for (const stream of [false, true]) {
      const r = await ask({ max_tokens: 6000, stream });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.attempts, 2);
      assert.match(r.clamped ?? '', /^6000 -> \d+$/);
    }
  });
});
