/**
 * The sim worker's pooling tasks: the deterministic vectors and scores
 * (pooling.ts), and `/v1/embeddings`, `/rerank`, `/score` over HTTP in vLLM's
 * shapes, through the engine's queue and timing, with failure injection.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import OpenAI from 'openai';
import { FakeClock } from '../../runtime/clock.js';
import { clockSleep } from './engine.js';
import {
  DEFAULT_EMBEDDING_DIM,
  embedText,
  embedTokens,
  float32Base64,
  shorten,
  similarity,
} from './pooling.js';
import { simWorkers } from '../../../test/support/sim.js';
import { countTokens } from './tokenizer.js';

const worker = simWorkers();

function norm(v: readonly number[]): number {
  return Math.sqrt(v.reduce((s, x) => s + x * x, 0));
}

function cosine(a: readonly number[], b: readonly number[]): number {
  return a.reduce((s, x, i) => s + x * b[i]!, 0) / (norm(a) * norm(b));
}

async function post(
  url: string,
  body: unknown,
): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

describe('sim pooling: vectors and scores', () => {
  it('embeds text deterministically as a unit vector of the default size', () => {
    const a = embedText('The quick brown fox');
    assert.equal(a.length, DEFAULT_EMBEDDING_DIM);
    assert.ok(Math.abs(norm(a) - 1) < 1e-9);
    assert.deepEqual(embedText('The quick brown fox'), a);
    assert.notDeepEqual(embedText('The quick brown fix'), a);
    assert.equal(embedText('x', 8).length, 8);
  });

  it('puts texts that share words closer than unrelated ones', () => {
    const q = embedText('the capital of France');
    const near = cosine(q, embedText('Paris is the capital of France'));
    const far = cosine(q, embedText('zebras gallop swiftly'));
    assert.ok(near > far + 0.2, `${near} vs ${far}`);
    // Case does not matter: features are lowercased.
    assert.ok(cosine(embedText('HELLO World'), embedText('hello world')) > 0.999);
  });

  it('never returns a zero vector (featureless input gets a seeded one)', () => {
    for (const t of ['', ' ', '!?', '\n\n']) {
      const v = embedText(t);
      assert.ok(Math.abs(norm(v) - 1) < 1e-9, JSON.stringify(t));
      assert.deepEqual(embedText(t), v);
    }
    assert.notDeepEqual(embedText('!?'), embedText('?!'));
  });

  it('embeds token ids deterministically; order matters through the pairs', () => {
    const v = embedTokens([1, 2, 3]);
    assert.equal(v.length, DEFAULT_EMBEDDING_DIM);
    assert.ok(Math.abs(norm(v) - 1) < 1e-9);
    assert.deepEqual(embedTokens([1, 2, 3]), v);
    assert.notDeepEqual(embedTokens([3, 2, 1]), v);
  });

  it('shortens like a Matryoshka model: the head, normalised again', () => {
    const v = embedText('some text');
    const s = shorten(v, 8);
    assert.equal(s.length, 8);
    assert.ok(Math.abs(norm(s) - 1) < 1e-9);
    const k = s[0]! / v[0]!;
    for (let i = 0; i < 8; i++) assert.ok(Math.abs(s[i]! - v[i]! * k) < 1e-12);
  });

  it('scores with the Jaccard index of character trigrams', () => {
    assert.equal(similarity('abcd', 'abcd'), 1);
    assert.equal(similarity('ABCD', 'abcd'), 1);
    // {abc, bcd} vs {abc, bce}: one common of three.
    assert.equal(similarity('abcd', 'abce'), 1 / 3);
    assert.equal(similarity('abc', 'xyz'), 0);
    assert.equal(similarity('ab', 'ab'), 1);
    assert.equal(similarity('', ''), 0);
    assert.equal(similarity('foo bar', 'bar foo'), similarity('bar foo', 'foo bar'));
  });

  it('encodes base64 as little-endian float32 bytes', () => {
    const b = Buffer.from(float32Base64([1, -2.5, 0.1]), 'base64');
    assert.equal(b.length, 12);
    assert.equal(b.readFloatLE(0), 1);
    assert.equal(b.readFloatLE(4), -2.5);
    assert.equal(b.readFloatLE(8), Math.fround(0.1));
  });
});

describe('sim pooling over HTTP', () => {
  it('serves /v1/embeddings in vLLM shape, float and base64', async () => {
    const w = await worker({ model: 'emb' });
    const r = await post(`${w.url}/embeddings`, { input: ['hello world', 'bye'], model: 'x' });
    assert.equal(r.status, 200);
    const b = r.body as {
      id: string;
      object: string;
      created: number;
      model: string;
      data: Array<{ index: number; object: string; embedding: number[] }>;
      usage: Record<string, unknown>;
    };
    assert.match(b.id, /^embd-/);
    assert.equal(b.object, 'list');
    assert.equal(typeof b.created, 'number');
    assert.equal(b.model, 'emb');
    assert.deepEqual(
      b.data.map((d) => [d.index, d.object]),
      [
        [0, 'embedding'],
        [1, 'embedding'],
      ],
    );
    assert.deepEqual(b.data[0]!.embedding, embedText('hello world'));
    const tokens = countTokens('hello world') + countTokens('bye');
    assert.deepEqual(b.usage, {
      prompt_tokens: tokens,
      total_tokens: tokens,
      completion_tokens: 0,
      prompt_tokens_details: null,
    });

    const b64 = await post(`${w.url}/embeddings`, {
      input: 'hello world',
      encoding_format: 'base64',
    });
    const data = (b64.body.data as Array<{ embedding: string }>)[0]!;
    assert.equal(data.embedding, float32Base64(embedText('hello world')));

    const tok = await post(`${w.url}/embeddings`, { input: [[5, 6, 7], [8]] });
    assert.deepEqual(
      (tok.body.data as Array<{ embedding: number[] }>)[1]!.embedding,
      embedTokens([8]),
    );
    assert.deepEqual(tok.body.usage, {
      prompt_tokens: 4,
      total_tokens: 4,
      completion_tokens: 0,
      prompt_tokens_details: null,
    });
  });

  it('works with the OpenAI SDK directly (which asks for base64 and decodes it)', async () => {
    const w = await worker({ embeddingDim: 16 });
    const client = new OpenAI({ baseURL: w.url, apiKey: 'sk-sim', maxRetries: 0 });
    const res = await client.embeddings.create({ model: 'm', input: ['alpha beta'] });
    const got = res.data[0]!.embedding;
    const want = embedText('alpha beta', 16).map((x) => Math.fround(x));
    assert.deepEqual(Array.from(got), want);
    const short = await client.embeddings.create({ model: 'm', input: 'a', dimensions: 4 });
    assert.equal(short.data[0]!.embedding.length, 4);
  });

  it('rejects bad embeddings requests as vLLM does', async () => {
    const w = await worker({ contextWindow: 8, embeddingDim: 16 });
    const url = `${w.url}/embeddings`;
    for (const body of [
      {},
      { input: [] },
      { input: [1, -1] },
      { input: [['a']] },
      { input: 'a', encoding_format: 'bytes' },
      { input: 'a', dimensions: 0 },
      { input: 'a', dimensions: 17 },
    ]) {
      const r = await post(url, body);
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.equal(r.body.object, 'error');
    }
    const long = await post(url, { input: 'one two three four five six seven eight nine' });
    assert.equal(long.status, 400);
    assert.match(String(long.body.message), /maximum context length is 8 tokens/);
  });

  it('serves /rerank (and /v1/rerank, /v2/rerank): best first, top_n', async () => {
    const w = await worker({ model: 'rr' });
    const root = w.url.replace(/\/v1$/, '');
    const documents = ['zebras gallop', 'Paris is the capital of France', 'capital letters'];
    for (const path of ['/rerank', '/v1/rerank', '/v2/rerank']) {
      const r = await post(root + path, { query: 'capital of France', documents });
      assert.equal(r.status, 200, path);
      const b = r.body as {
        id: string;
        model: string;
        usage: { total_tokens: number };
        results: Array<{ index: number; document: { text: string }; relevance_score: number }>;
      };
      assert.match(b.id, /^rerank-/);
      assert.equal(b.model, 'rr');
      assert.deepEqual(
        b.results.map((x) => x.index),
        [1, 2, 0],
      );
      assert.equal(b.results[0]!.document.text, documents[1]);
      assert.equal(b.results[0]!.relevance_score, similarity('capital of France', documents[1]!));
      const q = countTokens('capital of France');
      assert.equal(
        b.usage.total_tokens,
        documents.reduce((s, d) => s + q + countTokens(d), 0),
      );
    }
    const top = await post(`${root}/rerank`, { query: 'capital', documents, top_n: 1 });
    assert.equal((top.body.results as unknown[]).length, 1);
    assert.equal((await post(`${root}/rerank`, { query: 'q', documents: [] })).status, 400);
    assert.equal((await post(`${root}/rerank`, { query: 1, documents: ['a'] })).status, 400);
  });

  it('serves /score (and /v1/score) with 1:1, 1:N and N:N pairing', async () => {
    const w = await worker({ model: 'sc' });
    const root = w.url.replace(/\/v1$/, '');
    const one = await post(`${root}/score`, { text_1: 'abcd', text_2: 'abce' });
    assert.equal(one.status, 200);
    assert.match(String(one.body.id), /^score-/);
    assert.equal(one.body.object, 'list');
    assert.deepEqual(one.body.data, [{ index: 0, object: 'score', score: 1 / 3 }]);
    const many = await post(`${root}/v1/score`, { text_1: 'abcd', text_2: ['abcd', 'xyz'] });
    assert.deepEqual(
      (many.body.data as Array<{ score: number }>).map((d) => d.score),
      [1, 0],
    );
    const pairs = await post(`${root}/score`, { text_1: ['abc', 'xyz'], text_2: ['abc', 'abc'] });
    assert.deepEqual(
      (pairs.body.data as Array<{ score: number }>).map((d) => d.score),
      [1, 0],
    );
    const bad = await post(`${root}/score`, { text_1: ['a', 'b'], text_2: ['a', 'b', 'c'] });
    assert.equal(bad.status, 400);
    assert.match(String(bad.body.message), /1:1, 1:N or N:N/);
  });

  it('runs pooling requests through the engine: counted, and the prefill takes its time', async () => {
    const clock = new FakeClock(0);
    const w = await worker({ ttftMs: 100, prefillMsPerToken: 0, sleep: clockSleep(clock), clock });
    const pending = post(`${w.url}/embeddings`, { input: 'a b c' });
    while (w.stats().running < 1) await new Promise((r) => setTimeout(r, 2));
    assert.equal(w.stats().completed, 0);
    clock.advance(100);
    assert.equal((await pending).status, 200);
    const s = w.stats();
    assert.equal(s.received, 1);
    assert.equal(s.completed, 1);
    assert.equal(s.promptTokens, countTokens('a b c'));
    assert.equal(s.generationTokens, 0);
    assert.equal(s.running, 0);
  });

  it('takes its turn of the injected failures', async () => {
    const w = await worker({ failMode: { kind: 'status', status: 503, times: 1 } });
    assert.equal((await post(`${w.url}/embeddings`, { input: 'a' })).status, 503);
    assert.equal((await post(`${w.url}/embeddings`, { input: 'a' })).status, 200);
    w.setFailMode({ kind: 'reset', times: 1 });
    await assert.rejects(post(`${w.url}/rerank`, { query: 'a', documents: ['b'] }));
    w.setFailMode({ kind: 'die-after-tokens', tokens: 1, times: 1 });
    await assert.rejects(post(`${w.url}/score`, { text_1: 'a', text_2: 'b' }));
    assert.equal((await post(`${w.url}/score`, { text_1: 'a', text_2: 'b' })).status, 200);
    assert.equal(w.stats().injectedFailures, 3);
  });
});
