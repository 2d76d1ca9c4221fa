/**
 * Who may use a stored response, with the official OpenAI SDK: `previous_response_id`
 * continues only a response of the same endpoint (same project and endpoint), whatever
 * the key; another endpoint's is not found, and none of it reaches the worker. Reading,
 * listing the input items of and deleting a stored response count against the key's
 * quota, as every other request the key authenticates does.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import {
  apiError,
  inferenceEndpoint,
  inferenceFixture,
  inferenceKey,
  type InferenceFixture,
} from '../support/inference.js';

describe('Responses API: a stored response belongs to its endpoint', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture();
  });
  after(() => f.close());

  it('previous_response_id naming another endpoint’s response is 404, and runs nothing', async () => {
    const first = await f.client.responses.create({
      model: 'x',
      input: 'The secret word is kumquat.',
      max_output_tokens: 16,
    });
    await inferenceEndpoint(f, 'other');
    // The same unbound key, through another endpoint of the project.
    const other = new OpenAI({
      baseURL: `${f.server.url}/${f.projectId}/other/v1`,
      apiKey: f.key,
      maxRetries: 0,
    });
    const received = f.worker.stats().received;
    const err = await apiError(
      other.responses.create({
        model: 'x',
        input: 'What is the secret word?',
        previous_response_id: first.id,
        max_output_tokens: 16,
      }),
    );
    assert.equal(err.status, 404);
    assert.equal(err.code, 'response_not_found');
    assert.equal(err.param, 'previous_response_id');
    assert.equal(f.worker.stats().received, received);
    // An unknown id answers the same: the two cannot be told apart.
    const unknown = await apiError(
      other.responses.create({ model: 'x', input: 'x', previous_response_id: 'resp_nope' }),
    );
    assert.deepEqual(
      [unknown.status, unknown.code, unknown.param],
      [404, 'response_not_found', 'previous_response_id'],
    );
    // Through its own endpoint it continues.
    const next = await f.client.responses.create({
      model: 'x',
      input: 'What is the secret word?',
      previous_response_id: first.id,
      max_output_tokens: 16,
    });
    assert.equal(next.previous_response_id, first.id);
  });
});

describe('Responses API: reads and deletes count against the key’s quota', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({ tier: 'self_hosted' });
  });
  after(() => f.close());

  it('retrieve, input items and delete each spend one request of the quota; past it 429', async () => {
    const client = new OpenAI({
      baseURL: f.baseURL,
      apiKey: await inferenceKey(f, { scopes: ['inference'], quotaRequests: 4, quotaWindow: 60 }),
      maxRetries: 0,
    });
    const r = await client.responses.create({ model: 'x', input: 'hi', max_output_tokens: 16 });
    const { response: got } = await client.responses.retrieve(r.id).withResponse();
    assert.equal(got.headers.get('x-ratelimit-limit'), '4');
    assert.equal(got.headers.get('x-ratelimit-remaining'), '2');
    await client.responses.inputItems.list(r.id);
    await client.responses.delete(r.id);
    // Four requests: the quota is spent, for reads and for chat alike.
    for (const call of [
      () => client.responses.retrieve(r.id),
      () => client.responses.delete(r.id),
      () => client.responses.inputItems.list(r.id),
      () =>
        client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'hi' }] }),
    ]) {
      const err = await apiError(call());
      assert.equal(err.status, 429);
      assert.equal(err.code, 'rate_limit_exceeded');
      assert.ok(Number(err.headers?.get('retry-after')) >= 1);
    }
    // The window rolls on the clock.
    f.server.clock.advance(61_000);
    assert.equal((await apiError(client.responses.retrieve(r.id))).status, 404);
  });

  it('a response counts once, when it arrives: past the quota, whatever its body, 429', async () => {
    const client = new OpenAI({
      baseURL: f.baseURL,
      apiKey: await inferenceKey(f, { scopes: ['inference'], quotaRequests: 3, quotaWindow: 60 }),
      maxRetries: 0,
    });
    const conv = await f.client.conversations.create({});
    // Each spends one request, the one refused for its body or what it names too, as on chat.
    const { response: made } = await client.responses
      .create({ model: 'x', input: 'hi', max_output_tokens: 16 })
      .withResponse();
    assert.equal(made.headers.get('x-ratelimit-limit'), '3');
    assert.equal(made.headers.get('x-ratelimit-remaining'), '2');
    const unknown = await apiError(
      client.responses.create({ model: 'x', input: 'x', previous_response_id: 'resp_nope' }),
    );
    assert.equal(unknown.status, 404);
    const bad = await apiError(client.responses.create({ model: 'x', input: [] }));
    assert.equal(bad.status, 400);
    // The quota is spent: nothing is looked up any more, whatever the request names.
    for (const body of [
      { model: 'x', input: 'hi' },
      { model: 'x', input: 'x', previous_response_id: 'resp_nope' },
      { model: 'x', input: 'x', conversation: conv.id },
      { model: 'x', input: [] },
    ]) {
      const err = await apiError(client.responses.create(body));
      assert.equal(err.status, 429, JSON.stringify(body));
      assert.equal(err.code, 'rate_limit_exceeded');
    }
    f.server.clock.advance(61_000);
  });
});
