/**
 * Who may use a stored response, with the official OpenAI SDK: `previous_response_id`
 * continues only a response of the same endpoint (same project and endpoint), whatever
 * the key; another endpoint's is not found, and none of it reaches the worker.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import {
  apiError,
  inferenceEndpoint,
  inferenceFixture,
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
