/**
 * A batch of embeddings (`endpoint: "/v1/embeddings"`) with the official OpenAI SDK
 * against a `sim` worker whose model has the `embeddings` capability: the input file
 * is uploaded and the batch created with the SDK, the runner sends each line through
 * the real embeddings route, and the output and error files (downloaded with the SDK)
 * hold OpenAI's embeddings answers and the refused lines with their 400s. A file with
 * a chat-completions line is refused when an embeddings batch is created from it.
 */
import assert from 'node:assert/strict';
import { after, afterEach, before, beforeEach, describe, it } from 'node:test';
import { BatchRunner } from '../../src/batches/runner.js';
import { fromBase64 } from '../../src/embeddings/response.js';
import { tables } from '../../src/store/index.js';
import { DEFAULT_EMBEDDING_DIM, embedText } from '../../src/workers/sim/index.js';
import { apiError, inferenceFixture, type InferenceFixture } from '../support/inference.js';
import { chatLine, readLines, uploadBatchInput, waitForStatus } from './support.js';

function embeddingsLine(customId: string, body: Record<string, unknown>): string {
  return JSON.stringify({
    custom_id: customId,
    method: 'POST',
    url: '/v1/embeddings',
    body: { model: 'anything', ...body },
  });
}

/** OpenAI's embeddings response, as the output file's `response.body` carries it. */
interface EmbeddingsBody {
  object: string;
  model: string;
  data: Array<{ object: string; index: number; embedding: number[] | string }>;
  usage: { prompt_tokens: number; total_tokens: number };
}

interface ErrorBody {
  error: { message: string; type: string; code: string; param: string | null };
}

function close(a: readonly number[], b: readonly number[]): void {
  assert.equal(a.length, b.length);
  // float32 on the wire (base64): about 7 significant digits.
  for (let i = 0; i < a.length; i++) assert.ok(Math.abs(a[i]! - b[i]!) < 1e-6, `at ${i}`);
}

describe('an embeddings batch with the OpenAI SDK', () => {
  let f: InferenceFixture;
  let runner: BatchRunner | null = null;
  before(async () => {
    f = await inferenceFixture({ capabilities: ['embeddings'] });
  });
  after(() => f.close());
  // The shared management limit is 60 a minute per project; each test starts a new minute.
  beforeEach(() => f.server.clock.advance(61_000));
  afterEach(async () => {
    await runner?.stop();
    runner = null;
  });

  it('runs to completed: one embeddings answer per good line, refused lines in the error file', async () => {
    const received = f.worker.stats().received;
    const inputFileId = await uploadBatchInput(f, [
      embeddingsLine('single', { input: 'the cat sat' }),
      embeddingsLine('list', { input: ['a dog ran', 'the bird flew', 'fish swim'] }),
      // Refused by the router's validation: never reaches the worker.
      embeddingsLine('bad-format', { input: 'x', encoding_format: 'int8' }),
      embeddingsLine('short', { input: 'hello world', dimensions: 8, encoding_format: 'float' }),
      embeddingsLine('empty', { input: '' }),
      embeddingsLine('b64', { input: ['base sixty four'], encoding_format: 'base64' }),
      // Refused by the worker: more dimensions than the model has.
      embeddingsLine('too-wide', { input: 'wide', dimensions: DEFAULT_EMBEDDING_DIM + 1 }),
      embeddingsLine('ids', { input: [1, 2, 3, 4, 5] }),
    ]);
    const file = await f.client.files.retrieve(inputFileId);
    assert.equal(file.purpose, 'batch');

    const created = await f.client.batches.create({
      input_file_id: inputFileId,
      endpoint: '/v1/embeddings',
      completion_window: '24h',
    });
    assert.equal(created.status, 'validating');
    assert.equal(created.endpoint, '/v1/embeddings');
    assert.deepEqual(created.request_counts, { total: 8, completed: 0, failed: 0 });

    runner = new BatchRunner(f.server.services, f.server.app, { pollMs: 10 });
    runner.start();
    await waitForStatus(f, created.id, ['completed']);
    const done = await f.client.batches.retrieve(created.id);
    assert.equal(done.status, 'completed');
    assert.equal(done.endpoint, '/v1/embeddings');
    assert.deepEqual(done.request_counts, { total: 8, completed: 5, failed: 3 });
    assert.ok(done.in_progress_at && done.finalizing_at && done.completed_at);
    assert.equal(done.errors, null);
    assert.ok(done.output_file_id && done.error_file_id);
    // The worker ran the good lines only (it refused 'too-wide' before running it).
    assert.equal(f.worker.stats().received - received, 5);

    // The output file: the successes, in input order.
    const outputFile = await f.client.files.retrieve(done.output_file_id);
    assert.equal(outputFile.purpose, 'batch_output');
    const text = await (await f.client.files.content(done.output_file_id)).text();
    assert.equal(Buffer.byteLength(text), outputFile.bytes);
    assert.ok(text.endsWith('\n'));
    const output = await readLines(f, done.output_file_id);
    assert.deepEqual(
      output.map((l) => l.custom_id),
      ['single', 'list', 'short', 'b64', 'ids'],
    );
    const bodies = new Map<string, EmbeddingsBody>();
    for (const l of output) {
      assert.match(l.id, /^batch_req_[0-9a-f]{24}$/);
      assert.equal(l.error, null);
      assert.ok(l.response);
      assert.equal(l.response.status_code, 200, l.custom_id);
      assert.equal(typeof l.response.request_id, 'string');
      assert.ok(l.response.request_id);
      const body = l.response.body as unknown as EmbeddingsBody;
      assert.deepEqual(Object.keys(body).sort(), ['data', 'model', 'object', 'usage']);
      assert.equal(body.object, 'list');
      assert.equal(body.model, 'sim-model');
      body.data.forEach((d, i) => {
        assert.equal(d.object, 'embedding');
        assert.equal(d.index, i);
      });
      assert.ok(Number.isInteger(body.usage.prompt_tokens) && body.usage.prompt_tokens > 0);
      assert.equal(body.usage.total_tokens, body.usage.prompt_tokens);
      bodies.set(l.custom_id, body);
    }
    const floats = (id: string) =>
      bodies.get(id)!.data.map((d) => {
        assert.ok(Array.isArray(d.embedding), `${id}: ${typeof d.embedding}`);
        for (const x of d.embedding) assert.equal(typeof x, 'number');
        return d.embedding;
      });
    // No encoding_format: floats, as OpenAI answers; the model's full dimension.
    assert.deepEqual(floats('single'), [embedText('the cat sat')]);
    assert.deepEqual(floats('list'), [
      embedText('a dog ran'),
      embedText('the bird flew'),
      embedText('fish swim'),
    ]);
    for (const v of floats('list')) assert.equal(v.length, DEFAULT_EMBEDDING_DIM);
    const [short] = floats('short');
    assert.equal(short!.length, 8);
    assert.equal(floats('ids')[0]!.length, DEFAULT_EMBEDDING_DIM);
    assert.equal(bodies.get('ids')!.usage.prompt_tokens, 5);
    // base64 when a line asks for it: little-endian float32 of the same vector.
    const b64 = bodies.get('b64')!.data[0]!.embedding;
    assert.equal(typeof b64, 'string');
    close(fromBase64(b64 as string), embedText('base sixty four'));

    // The error file: the refused lines, in input order, each with its 400 answer.
    const errorFile = await f.client.files.retrieve(done.error_file_id);
    assert.equal(errorFile.purpose, 'batch_output');
    const errors = await readLines(f, done.error_file_id);
    assert.deepEqual(
      errors.map((e) => e.custom_id),
      ['bad-format', 'empty', 'too-wide'],
    );
    const expected: Record<string, [string, string]> = {
      'bad-format': ['invalid_value', 'encoding_format'],
      empty: ['invalid_value', 'input'],
      // The sim answers as vLLM does (a flat error body); its param is kept.
      'too-wide': ['upstream_rejected', 'dimensions'],
    };
    for (const e of errors) {
      assert.match(e.id, /^batch_req_[0-9a-f]{24}$/);
      // The request ran and was answered: the answer is kept, `error` stays null.
      assert.equal(e.error, null);
      assert.ok(e.response);
      assert.equal(e.response.status_code, 400, e.custom_id);
      const { error } = e.response.body as unknown as ErrorBody;
      assert.equal(error.type, 'invalid_request_error');
      assert.deepEqual([error.code, error.param], expected[e.custom_id], e.custom_id);
    }
    assert.match((errors[2]!.response!.body as unknown as ErrorBody).error.message, /dimensions/);

    // Each success went through the embeddings path as the batch's key: a usage record each.
    await f.server.services.usage.flush();
    const db = f.server.services.store.db;
    const usage = await db.select().from(tables.usageRecords);
    const [key] = await db.select().from(tables.apiKeys);
    for (const l of output) {
      const row = usage.find((u) => u.requestId === l.response!.request_id);
      assert.ok(row, l.custom_id);
      assert.equal(row.status, 'completed');
      assert.equal(row.keyId, key!.id);
      assert.equal(row.promptTokens, bodies.get(l.custom_id)!.usage.prompt_tokens);
      assert.equal(row.completionTokens, 0);
    }
    assert.equal((await db.select().from(tables.batchRequests)).length, 0);
  });

  it('refuses at create time an embeddings batch whose file holds a chat-completions line', async () => {
    const mixed = await uploadBatchInput(f, [
      embeddingsLine('e1', { input: 'fine' }),
      '',
      chatLine('chat-1'),
      embeddingsLine('e2', { input: 'also fine' }),
    ]);
    const db = f.server.services.store.db;
    const batchesBefore = (await db.select().from(tables.batches)).length;
    const received = f.worker.stats().received;
    const create = (fileId: string, endpoint: '/v1/embeddings' | '/v1/chat/completions') =>
      apiError(
        f.client.batches.create({ input_file_id: fileId, endpoint, completion_window: '24h' }),
      );
    const err = await create(mixed, '/v1/embeddings');
    assert.equal(err.status, 400);
    assert.equal(err.code, 'invalid_value');
    assert.equal(err.param, 'input_file_id');
    assert.equal(err.type, 'invalid_request_error');
    assert.match(
      (err.error as { message: string }).message,
      /^Line 3 of the batch input: 'url' \/v1\/chat\/completions is not the batch's endpoint \/v1\/embeddings\.$/,
    );
    // Nothing was kept of the refused batch.
    assert.equal((await db.select().from(tables.batches)).length, batchesBefore);
    assert.equal((await db.select().from(tables.batchRequests)).length, 0);
    // Nor is a file of embeddings lines a chat-completions batch.
    const embeddingsOnly = await uploadBatchInput(f, [embeddingsLine('e1', { input: 'x' })]);
    const wrongWay = await create(embeddingsOnly, '/v1/chat/completions');
    assert.equal(wrongWay.status, 400);
    assert.equal(wrongWay.param, 'input_file_id');
    assert.match((wrongWay.error as { message: string }).message, /^Line 1 of the batch input: /);
    assert.equal(f.worker.stats().received, received);
  });
});
