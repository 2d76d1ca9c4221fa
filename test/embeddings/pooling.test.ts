/**
 * Embeddings, rerank and score through the router to a `sim` worker: the official
 * OpenAI SDK for embeddings, plain HTTP for rerank and score (the SDK has neither).
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { after, afterEach, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { tables } from '../../src/store/index.js';
import {
  embedText,
  similarity,
  startSimWorker,
  type SimWorker,
} from '../../src/workers/sim/index.js';
import { listenWorker } from '../support/fake-worker.js';
import { inferenceFixture, until, type InferenceFixture } from '../support/inference.js';

const CAPS = ['embeddings', 'rerank'];

/** The fields these tests read of an answer (each answer has some of them). */
interface Answer {
  error: { code: string; param: string | null; type: string; message: string };
  id: string;
  object: string;
  model: string;
  results: Array<{ index: number; relevance_score: number; document?: { text: string } }>;
  data: Array<{ index: number; object: string; score: number }>;
  usage: { prompt_tokens: number; total_tokens: number };
}

async function post(
  f: InferenceFixture,
  path: string,
  body: unknown,
  init: { key?: string | null; signal?: AbortSignal; raw?: string } = {},
) {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  const key = init.key === undefined ? f.key : init.key;
  if (key !== null) headers.authorization = `Bearer ${key}`;
  const res = await fetch(`${f.baseURL}${path}`, {
    method: 'POST',
    headers,
    body: init.raw ?? JSON.stringify(body),
    ...(init.signal ? { signal: init.signal } : {}),
  });
  const text = await res.text();
  return {
    status: res.status,
    headers: res.headers,
    body: JSON.parse(text) as Answer,
  };
}

function close(a: readonly number[], b: readonly number[]): void {
  assert.equal(a.length, b.length);
  // float32 on the wire (base64): about 7 significant digits.
  for (let i = 0; i < a.length; i++) assert.ok(Math.abs(a[i]! - b[i]!) < 1e-6, `at ${i}`);
}

describe('embeddings with the OpenAI SDK', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({ capabilities: CAPS });
  });
  after(() => f.close());

  it('answers OpenAI’s shape; the SDK’s default base64 request decodes to the vectors', async () => {
    const { data, response } = await f.client.embeddings
      .create({ model: 'anything', input: ['the cat sat', 'a dog ran'] })
      .withResponse();
    assert.equal(data.object, 'list');
    assert.equal(data.model, 'sim-model');
    assert.equal(data.data.length, 2);
    assert.deepEqual(
      data.data.map((d) => [d.object, d.index]),
      [
        ['embedding', 0],
        ['embedding', 1],
      ],
    );
    close(data.data[0]!.embedding, embedText('the cat sat'));
    close(data.data[1]!.embedding, embedText('a dog ran'));
    assert.ok(data.usage.prompt_tokens > 0);
    assert.equal(data.usage.total_tokens, data.usage.prompt_tokens);
    assert.equal(response.headers.get('x-service-worker-id'), 'sim-1');
    assert.match(response.headers.get('x-request-id') ?? '', /.+/);
    assert.deepEqual(Object.keys(data).sort(), ['data', 'model', 'object', 'usage']);
  });

  it('float encoding, a single string, token ids and dimensions', async () => {
    const floats = await f.client.embeddings.create({
      model: 'x',
      input: 'hello world',
      encoding_format: 'float',
    });
    assert.deepEqual(floats.data[0]!.embedding, embedText('hello world'));

    const short = await f.client.embeddings.create({
      model: 'x',
      input: 'hello world',
      dimensions: 8,
      encoding_format: 'float',
    });
    assert.equal(short.data[0]!.embedding.length, 8);
    const norm = Math.sqrt(short.data[0]!.embedding.reduce((s, x) => s + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-9);

    const ids = await f.client.embeddings.create({
      model: 'x',
      input: [
        [1, 2, 3],
        [4, 5],
      ],
      encoding_format: 'float',
    });
    assert.equal(ids.data.length, 2);
    assert.equal(ids.usage.prompt_tokens, 5);
  });

  it('rejects bad input with the field named (SDK error classes)', async () => {
    const cases: Array<[Record<string, unknown>, string, string]> = [
      [{}, 'missing_required_parameter', 'input'],
      [{ input: '' }, 'invalid_value', 'input'],
      [{ input: [] }, 'invalid_value', 'input'],
      [{ input: ['ok', ''] }, 'invalid_value', 'input[1]'],
      [{ input: ['ok', 3] }, 'invalid_type', 'input[1]'],
      [{ input: [[1, 2], [-1]] }, 'invalid_value', 'input[1][0]'],
      [{ input: [[1, 'a']] }, 'invalid_type', 'input[0][1]'],
      [{ input: 5 }, 'invalid_type', 'input'],
      [{ input: [1, 2, 'a'] }, 'invalid_type', 'input[2]'],
      [{ input: Array.from({ length: 2049 }, () => 'x') }, 'invalid_value', 'input'],
      [{ input: 'x', encoding_format: 'int8' }, 'invalid_value', 'encoding_format'],
      [{ input: 'x', dimensions: 0 }, 'invalid_value', 'dimensions'],
      [{ input: 'x', dimensions: 'big' }, 'invalid_type', 'dimensions'],
      [{ input: 'x', user: 5 }, 'invalid_type', 'user'],
    ];
    for (const [body, code, param] of cases) {
      const err = await f.client.embeddings.create({ model: 'x', ...body } as never).then(
        () => null,
        (e: unknown) => e,
      );
      assert.ok(err instanceof OpenAI.BadRequestError, `${JSON.stringify(body).slice(0, 60)}`);
      assert.equal(err.code, code, JSON.stringify(body).slice(0, 60));
      assert.equal(err.param, param);
      assert.equal((err.error as { type?: string }).type, 'invalid_request_error');
      // A field that is there but wrong is never reported as missing.
      if (param.split(/[.[]/)[0]! in body) {
        assert.doesNotMatch(err.message, /Missing required/, param);
      }
    }
  });

  it('takes null for an optional field as its absence; the worker (vLLM) sees no null', async () => {
    const r = await post(f, '/embeddings', {
      input: 'hello world',
      encoding_format: null,
      dimensions: null,
      user: null,
    });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const data = (r.body as unknown as { data: Array<{ embedding: number[] }> }).data;
    assert.deepEqual(data[0]!.embedding, embedText('hello world'));
  });

  it('checks the key before the body: no key and bad JSON is 401', async () => {
    const r = await post(f, '/embeddings', null, { key: null, raw: '{"input": ' });
    assert.equal(r.status, 401);
    const bad = await post(f, '/embeddings', null, { raw: '{"input": ' });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.code, 'invalid_json');
  });

  it('passes a worker’s context-length rejection on as a 400', async () => {
    const err = await f.client.embeddings.create({ model: 'x', input: 'word '.repeat(5000) }).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(err instanceof OpenAI.BadRequestError);
    assert.equal(err.code, 'upstream_rejected');
    assert.match(err.message, /maximum context length/);
  });

  it("does not forward a client's priority (the fcfs sim, as vLLM, would refuse it)", async () => {
    const direct = await fetch(`${f.worker.url}/embeddings`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'x', input: 'hi', priority: 3 }),
    });
    assert.equal(direct.status, 400);
    assert.match(await direct.text(), /Priority scheduling is not enabled/);
    const r = await f.client.embeddings.create({
      model: 'x',
      input: 'hi',
      // @ts-expect-error: vLLM's extension, not in OpenAI's types
      priority: 3,
    });
    assert.equal(r.data.length, 1);
  });

  it('writes a usage record per request with the prompt tokens', async () => {
    await f.server.services.usage.flush();
    const before = (await f.server.services.store.db.select().from(tables.usageRecords)).length;
    const r = await f.client.embeddings
      .create({ model: 'x', input: 'count me', user: 'u-42' })
      .withResponse();
    await f.server.services.usage.flush();
    const rows = await f.server.services.store.db.select().from(tables.usageRecords);
    assert.equal(rows.length, before + 1);
    const row = rows.find((x) => x.requestId === r.response.headers.get('x-request-id'));
    assert.ok(row);
    assert.equal(row.status, 'completed');
    assert.equal(row.promptTokens, r.data.usage.prompt_tokens);
    assert.equal(row.completionTokens, 0);
    assert.equal(row.user, 'u-42');
    assert.equal(row.workerId, 'sim-1');
  });
});

describe('rerank and score', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({ capabilities: CAPS });
  });
  after(() => f.close());

  const docs = ['The cat sat on the mat.', 'Stock markets fell.', 'A cat and a hat.'];

  it('reranks best first with documents, cut to top_n', async () => {
    const r = await post(f, '/rerank', { model: 'x', query: 'cat on a mat', documents: docs });
    assert.equal(r.status, 200);
    assert.equal(r.body.id, r.headers.get('x-request-id'));
    assert.equal(r.body.model, 'sim-model');
    assert.equal(r.headers.get('x-service-worker-id'), 'sim-1');
    const scores = docs.map((d) => similarity('cat on a mat', d));
    const order = [0, 1, 2].sort((a, b) => scores[b]! - scores[a]! || a - b);
    assert.deepEqual(
      r.body.results.map((x: { index: number }) => x.index),
      order,
    );
    assert.equal(r.body.results[0]!.relevance_score, scores[order[0]!]);
    assert.deepEqual(r.body.results[0]!.document, { text: docs[order[0]!] });
    assert.ok(r.body.usage.total_tokens > 0);

    const top = await post(f, '/rerank', {
      query: 'cat on a mat',
      documents: docs.map((text) => ({ text })),
      top_n: 1,
      return_documents: false,
    });
    assert.equal(top.status, 200);
    assert.deepEqual(top.body.results, [{ index: order[0], relevance_score: scores[order[0]!] }]);

    // vLLM's other paths, relative to the endpoint (Cohere's v2 client: `<base>/v2/rerank`).
    for (const path of ['/../v2/rerank', '/../rerank']) {
      const alias = await post(f, path, { query: 'cat on a mat', documents: docs, top_n: 1 });
      assert.equal(alias.status, 200, path);
      assert.equal(alias.body.results[0]!.index, order[0], path);
    }
    const score = await post(f, '/../score', { text_1: 'cat', text_2: 'cat' });
    assert.deepEqual(score.body.data, [{ index: 0, object: 'score', score: 1 }]);
  });

  it('takes null top_n and return_documents as their absence', async () => {
    const r = await post(f, '/rerank', {
      query: 'cat',
      documents: ['a cat', 'a dog'],
      top_n: null,
      return_documents: null,
    });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.results.length, 2);
    assert.ok(r.body.results.every((x) => x.document !== undefined));
  });

  it('rejects bad rerank requests with the field named', async () => {
    const cases: Array<[Record<string, unknown>, string, string]> = [
      [{ documents: docs }, 'missing_required_parameter', 'query'],
      [{ query: 'q', documents: [] }, 'invalid_value', 'documents'],
      [{ query: 'q', documents: ['a', { text: '' }] }, 'invalid_value', 'documents[1].text'],
      [{ query: 'q', documents: ['a', { text: 7 }] }, 'invalid_type', 'documents[1].text'],
      [{ query: 'q', documents: ['a', 7] }, 'invalid_type', 'documents[1]'],
      [{ query: 'q', documents: ['a'], top_n: 0 }, 'invalid_value', 'top_n'],
      [
        { query: 'q', documents: ['a'], return_documents: 'yes' },
        'invalid_type',
        'return_documents',
      ],
    ];
    for (const [body, code, param] of cases) {
      const r = await post(f, '/rerank', body);
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.equal(r.body.error.code, code, JSON.stringify(body));
      assert.equal(r.body.error.param, param, JSON.stringify(body));
    }
  });

  it('scores 1:1, 1:N and N:N pairs in request order', async () => {
    const one = await post(f, '/score', { text_1: 'cat', text_2: 'cat' });
    assert.equal(one.status, 200);
    assert.equal(one.body.object, 'list');
    assert.equal(one.body.id, one.headers.get('x-request-id'));
    assert.deepEqual(one.body.data, [{ index: 0, object: 'score', score: 1 }]);

    const many = await post(f, '/score', { text_1: 'the cat', text_2: docs });
    assert.deepEqual(
      many.body.data.map((d: { score: number }) => d.score),
      docs.map((d) => similarity('the cat', d)),
    );
    const pairs = await post(f, '/score', {
      text_1: ['a cat', 'markets'],
      text_2: docs.slice(0, 2),
    });
    assert.deepEqual(
      pairs.body.data.map((d: { score: number }) => d.score),
      [similarity('a cat', docs[0]!), similarity('markets', docs[1]!)],
    );
    assert.equal(pairs.body.usage.total_tokens, pairs.body.usage.prompt_tokens);

    const mismatch = await post(f, '/score', { text_1: ['a', 'b'], text_2: ['a', 'b', 'c'] });
    assert.equal(mismatch.status, 400);
    assert.equal(mismatch.body.error.param, 'text_2');
    const empty = await post(f, '/score', { text_1: 'a', text_2: [] });
    assert.equal(empty.body.error.param, 'text_2');
  });
});

describe('capabilities', () => {
  let f: InferenceFixture;
  afterEach(() => f?.close());

  it('an endpoint whose model lacks the capability answers 400 model_capability_missing', async () => {
    f = await inferenceFixture({ capabilities: ['tool_calling'] });
    const err = await f.client.embeddings.create({ model: 'x', input: 'a' }).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(err instanceof OpenAI.BadRequestError);
    assert.equal(err.code, 'model_capability_missing');
    for (const [path, body] of [
      ['/rerank', { query: 'a', documents: ['b'] }],
      ['/score', { text_1: 'a', text_2: 'b' }],
    ] as const) {
      const r = await post(f, path, body);
      assert.equal(r.status, 400);
      assert.equal(r.body.error.code, 'model_capability_missing');
    }
    assert.equal(f.worker.stats().received, 0);
  });
});

describe('workers failing, saturated, slow', () => {
  let f: InferenceFixture;
  let second: SimWorker | null = null;
  afterEach(async () => {
    await f?.close();
    await second?.close();
    second = null;
  });

  it('fails over before the first byte to another worker of the endpoint', async () => {
    f = await inferenceFixture({ capabilities: CAPS });
    second = await startSimWorker({ model: 'sim-model', contextWindow: 4096 });
    const reg = await f.server.admin('POST', '/workers', {
      model: 'sim-model',
      tier: 'cpu',
      url: second.url,
      id: 'sim-2',
    });
    assert.equal(reg.status, 201);
    // sim-1 resets the connection, then answers 503; sim-2 serves every request.
    f.worker.setFailMode({ kind: 'reset', times: 2 });
    for (let i = 0; i < 6; i++) {
      if (i === 2) f.worker.setFailMode({ kind: 'status', status: 503 });
      const r = await post(f, '/embeddings', { input: `text ${i}` });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.headers.get('x-service-worker-id'), 'sim-2');
    }
    // sim-1 was tried and failed (not merely skipped).
    assert.ok(f.worker.stats().injectedFailures >= 1, 'sim-1 never picked');
  });

  it('a worker that ignores dimensions (llama.cpp) is 502, not vectors of another size', async () => {
    f = await inferenceFixture({ capabilities: CAPS });
    // The full vector whatever `dimensions` said, floats to a base64 request, as
    // llama.cpp's server answers.
    const server = createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        const inputs = [(JSON.parse(body) as { input: string | string[] }).input].flat();
        res.setHeader('content-type', 'application/json');
        res.end(
          JSON.stringify({
            object: 'list',
            data: inputs.map((t, index) => ({
              object: 'embedding',
              index,
              embedding: embedText(t),
            })),
            usage: { prompt_tokens: 2, total_tokens: 2 },
          }),
        );
      });
    });
    const llama = await listenWorker(server);
    try {
      const reg = await f.server.admin('POST', '/workers', {
        model: 'sim-model',
        tier: 'cpu',
        url: llama.url,
        id: 'llama-1',
      });
      assert.equal(reg.status, 201, reg.text);
      // sim-1 honours dimensions: out of the way, so that llama-1 answers.
      f.worker.setFailMode({ kind: 'status', status: 503 });
      const r = await post(f, '/embeddings', { input: 'hello', dimensions: 8 });
      assert.equal(r.status, 502, JSON.stringify(r.body));
      assert.equal(r.body.error.code, 'upstream_error');
      assert.match(r.body.error.message, /64 values for dimensions 8/);
      const sdk = await f.client.embeddings
        .create({ model: 'x', input: ['a', 'b'], dimensions: 8 })
        .then(
          () => null,
          (e: unknown) => e,
        );
      assert.ok(sdk instanceof OpenAI.APIError && sdk.status === 502, String(sdk));
      // Without dimensions the full vector is the answer.
      const full = await post(f, '/embeddings', { input: 'hello' });
      assert.equal(full.status, 200, JSON.stringify(full.body));
      assert.equal(full.headers.get('x-service-worker-id'), 'llama-1');
    } finally {
      f.worker.setFailMode(null);
      await llama.close();
    }
  });

  it('a lone worker’s 5xx is 502 upstream_error; its 429 is 429 capacity_exceeded', async () => {
    f = await inferenceFixture({ capabilities: CAPS });
    f.worker.setFailMode({ kind: 'status', status: 500, times: 1 });
    const r = await post(f, '/score', { text_1: 'a', text_2: 'b' });
    assert.equal(r.status, 502);
    assert.equal(r.body.error.code, 'upstream_error');
    f.worker.setFailMode({ kind: 'status', status: 429, times: 1 });
    const busy = await post(f, '/rerank', { query: 'a', documents: ['b'] });
    assert.equal(busy.status, 429);
    assert.equal(busy.body.error.code, 'capacity_exceeded');
    assert.ok(Number(busy.headers.get('retry-after')) >= 1);
    assert.equal((await post(f, '/score', { text_1: 'a', text_2: 'b' })).status, 200);
  });

  it('past the tier deadline: 408 timeout_error and the worker’s request aborted', async () => {
    f = await inferenceFixture({
      tier: 'free',
      capabilities: CAPS,
      simOnFakeClock: true,
      sim: { ttftMs: 40_000 },
    });
    const pending = post(f, '/embeddings', { input: 'slow' });
    await until(() => f.worker.stats().running >= 1, 'the worker to start the request');
    f.server.clock.advance(30_000);
    const r = await pending;
    assert.equal(r.status, 408);
    assert.equal(r.body.error.type, 'timeout_error');
    assert.equal(r.body.error.code, 'request_timeout');
    await until(() => f.worker.stats().aborted >= 1, 'the upstream abort');
    await f.server.services.usage.flush();
    const rows = await f.server.services.store.db.select().from(tables.usageRecords);
    assert.deepEqual(
      rows.map((x) => x.status),
      ['timeout'],
    );
    // The worker read the input: billed at the router's estimate, as a chat prompt is.
    assert.ok(rows[0]!.promptTokens > 0, 'the input is billed');
  });

  it('a client that leaves aborts the worker’s request', async () => {
    f = await inferenceFixture({
      capabilities: CAPS,
      simOnFakeClock: true,
      sim: { ttftMs: 10_000 },
    });
    const ac = new AbortController();
    const pending = post(f, '/rerank', { query: 'a', documents: ['b'] }, { signal: ac.signal });
    await until(() => f.worker.stats().running >= 1, 'the worker to start the request');
    ac.abort();
    await assert.rejects(pending);
    await until(() => f.worker.stats().aborted >= 1, 'the upstream abort');
    assert.equal(f.worker.stats().completed, 0);
    // The worker read the input: billed at the router's estimate, as a chat prompt is.
    let rows: Array<typeof tables.usageRecords.$inferSelect> = [];
    for (let i = 0; i < 100 && rows.length === 0; i++) {
      await new Promise((r) => setTimeout(r, 20));
      await f.server.services.usage.flush();
      rows = await f.server.services.store.db.select().from(tables.usageRecords);
    }
    assert.deepEqual(
      rows.map((x) => x.status),
      ['cancelled'],
    );
    assert.ok(rows[0]!.promptTokens > 0, 'the input is billed');
  });
});
