import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ServiceError } from '../errors/index.js';
import { parseEmbeddingsRequest, parseRerankRequest, parseScoreRequest } from './request.js';
import {
  fromBase64,
  normalizeEmbeddings,
  normalizeRerank,
  normalizeScore,
  toBase64,
} from './response.js';

const meta = { id: 'req-1', created: 1700000000, model: 'm', estimate: 9, ceiling: 100 };

function upstreamError(fn: () => unknown, pattern: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ServiceError);
    assert.equal(e.code, 'upstream_error');
    assert.equal(e.status, 502);
    assert.match(e.message, pattern);
    return true;
  });
}

describe('embeddings answers', () => {
  const v1 = [0.5, -0.25, 0.125];
  const v2 = [1, 0, -1];

  it('round-trips float32 base64', () => {
    assert.deepEqual(fromBase64(toBase64(v1)), v1);
    assert.equal(toBase64([1]), Buffer.from([0, 0, 0x80, 0x3f]).toString('base64'));
  });

  it('encodes floats as base64 when the client asked for it (llama.cpp answers floats)', () => {
    const r = parseEmbeddingsRequest({ input: ['a', 'b'], encoding_format: 'base64' });
    const { response, promptTokens } = normalizeEmbeddings(
      {
        data: [
          { embedding: v1, index: 0 },
          { embedding: v2, index: 1 },
        ],
        usage: { prompt_tokens: 4 },
      },
      r,
      meta,
    );
    assert.equal(promptTokens, 4);
    assert.deepEqual(response, {
      object: 'list',
      data: [
        { object: 'embedding', index: 0, embedding: toBase64(v1) },
        { object: 'embedding', index: 1, embedding: toBase64(v2) },
      ],
      model: 'm',
      usage: { prompt_tokens: 4, total_tokens: 4 },
    });
  });

  it('decodes base64 for a float request, restores input order, estimates missing usage', () => {
    const r = parseEmbeddingsRequest({ input: ['a', 'b'] });
    const { response, promptTokens } = normalizeEmbeddings(
      {
        data: [
          { embedding: toBase64(v2), index: 1 },
          { embedding: v1, index: 0 },
        ],
      },
      r,
      meta,
    );
    assert.equal(promptTokens, 9);
    const data = (response as { data: Array<{ embedding: number[] }> }).data;
    assert.deepEqual(data[0]!.embedding, v1);
    assert.deepEqual(data[1]!.embedding, v2);
  });

  it('refuses answers that do not fit the request', () => {
    const r = parseEmbeddingsRequest({ input: ['a', 'b'] });
    upstreamError(
      () => normalizeEmbeddings({ data: [{ embedding: v1 }] }, r, meta),
      /1 embeddings for 2/,
    );
    upstreamError(
      () =>
        normalizeEmbeddings(
          {
            data: [
              { embedding: v1, index: 0 },
              { embedding: v2, index: 0 },
            ],
          },
          r,
          meta,
        ),
      /two embeddings/,
    );
    upstreamError(
      () => normalizeEmbeddings({ data: [{ embedding: v1 }, { embedding: ['x'] }] }, r, meta),
      /not a vector/,
    );
    upstreamError(
      () => normalizeEmbeddings({ data: [{ embedding: 'abc' }, { embedding: v1 }] }, r, meta),
      /float32/,
    );
    upstreamError(() => normalizeEmbeddings([], r, meta), /not an object/);
    // A vector of another size than `dimensions` asked for, in either encoding.
    for (const encoding_format of ['float', 'base64']) {
      const short = parseEmbeddingsRequest({ input: ['a', 'b'], dimensions: 2, encoding_format });
      upstreamError(
        () => normalizeEmbeddings({ data: [{ embedding: v1 }, { embedding: v2 }] }, short, meta),
        /data\[0\]\.embedding has 3 values for dimensions 2/,
      );
      upstreamError(
        () =>
          normalizeEmbeddings(
            { data: [{ embedding: toBase64([1, 2]) }, { embedding: toBase64(v2) }] },
            short,
            meta,
          ),
        /data\[1\]\.embedding has 3 values for dimensions 2/,
      );
      const fit = normalizeEmbeddings(
        { data: [{ embedding: [1, 0] }, { embedding: toBase64([0, 1]) }] },
        short,
        meta,
      );
      assert.equal((fit.response as { data: unknown[] }).data.length, 2);
    }
    // Empty or malformed base64, whichever encoding the client asked for.
    const b64 = parseEmbeddingsRequest({ input: ['a', 'b'], encoding_format: 'base64' });
    for (const req of [r, b64]) {
      for (const bad of ['', '!!!!', 'AAAA AAA=', 'AAAAAAA=']) {
        upstreamError(
          () => normalizeEmbeddings({ data: [{ embedding: bad }, { embedding: v1 }] }, req, meta),
          /data\[0\]\.embedding is not a base64 float32 vector/,
        );
      }
    }
  });

  it('uses its estimate when the worker counts more tokens than the inputs can make', () => {
    const r = parseEmbeddingsRequest({ input: ['a', 'b'] });
    const answer = (n: number) => ({
      data: [{ embedding: v1 }, { embedding: v2 }],
      usage: { prompt_tokens: n },
    });
    assert.equal(normalizeEmbeddings(answer(100), r, meta).promptTokens, 100);
    assert.equal(normalizeEmbeddings(answer(101), r, meta).promptTokens, 9);
    assert.equal(normalizeEmbeddings(answer(1e20), r, meta).promptTokens, 9);
  });
});

describe('pooling request validation', () => {
  function refused(body: unknown, parse: (b: unknown) => unknown, code: string, param: string) {
    assert.throws(
      () => parse(body),
      (e: unknown) => {
        assert.ok(e instanceof ServiceError, String(e));
        assert.deepEqual([e.code, e.param], [code, param], JSON.stringify(body));
        assert.equal(e.status, 400);
        return true;
      },
    );
  }
  const emb = parseEmbeddingsRequest;

  it('counts inputs, not the tokens of one token-id input, against the 2,048 cap', () => {
    const ids = Array.from({ length: 3000 }, (_, i) => i % 500);
    assert.deepEqual(emb({ input: ids }).inputs, [{ ids }]);
    assert.equal(emb({ input: [ids, ids] }).inputs.length, 2);
    refused({ input: Array.from({ length: 2049 }, () => [1]) }, emb, 'invalid_value', 'input');
    refused({ input: Array.from({ length: 2049 }, () => 'a') }, emb, 'invalid_value', 'input');
    assert.equal(emb({ input: Array.from({ length: 2048 }, () => 'a') }).inputs.length, 2048);
  });

  it('names the element and tells a wrong type from a wrong value', () => {
    refused({}, emb, 'missing_required_parameter', 'input');
    for (const input of [5, null, true, { a: 1 }]) refused({ input }, emb, 'invalid_type', 'input');
    refused({ input: '' }, emb, 'invalid_value', 'input');
    refused({ input: [] }, emb, 'invalid_value', 'input');
    refused({ input: [{}] }, emb, 'invalid_type', 'input[0]');
    refused({ input: [1, 'a'] }, emb, 'invalid_type', 'input[1]');
    refused({ input: [1, -1] }, emb, 'invalid_value', 'input[1]');
    refused({ input: [1, 1.5] }, emb, 'invalid_value', 'input[1]');
    refused({ input: ['a', 1] }, emb, 'invalid_type', 'input[1]');
    refused({ input: ['a', ''] }, emb, 'invalid_value', 'input[1]');
    refused({ input: [[1], ['a']] }, emb, 'invalid_type', 'input[1][0]');
    refused({ input: [[1], []] }, emb, 'invalid_value', 'input[1]');
    refused({ input: [[1], 2] }, emb, 'invalid_type', 'input[1]');
    const score = parseScoreRequest;
    refused({ text_2: 'b' }, score, 'missing_required_parameter', 'text_1');
    refused({ text_1: 1, text_2: 'b' }, score, 'invalid_type', 'text_1');
    refused({ text_1: null, text_2: 'b' }, score, 'invalid_type', 'text_1');
    refused({ text_1: 'a', text_2: ['a', 1] }, score, 'invalid_type', 'text_2[1]');
    refused({ text_1: 'a', text_2: ['a', null] }, score, 'invalid_type', 'text_2[1]');
    refused({ text_1: 'a', text_2: [['a']] }, score, 'invalid_type', 'text_2[0]');
    refused({ text_1: 'a', text_2: ['a', ''] }, score, 'invalid_value', 'text_2[1]');
    refused({ text_1: 'a', text_2: [] }, score, 'invalid_value', 'text_2');
  });
});

describe('rerank answers', () => {
  const r = parseRerankRequest({ query: 'q', documents: ['a', 'b', 'c'], top_n: 2 });

  it('orders best first and applies top_n when the worker did not', () => {
    const { response } = normalizeRerank(
      {
        results: [
          { index: 0, relevance_score: 0.1 },
          { index: 1, relevance_score: 0.9 },
          { index: 2, relevance_score: 0.5 },
        ],
        usage: { total_tokens: 12 },
      },
      r,
      meta,
    );
    assert.deepEqual(response, {
      id: 'req-1',
      model: 'm',
      usage: { total_tokens: 12 },
      results: [
        { index: 1, relevance_score: 0.9, document: { text: 'b' } },
        { index: 2, relevance_score: 0.5, document: { text: 'c' } },
      ],
    });
  });

  it('refuses fewer results than asked, bad indexes and scores', () => {
    upstreamError(
      () => normalizeRerank({ results: [{ index: 0, relevance_score: 1 }] }, r, meta),
      /1 results for 2/,
    );
    upstreamError(
      () =>
        normalizeRerank(
          {
            results: [
              { index: 3, relevance_score: 1 },
              { index: 0, relevance_score: 1 },
            ],
          },
          r,
          meta,
        ),
      /out of range/,
    );
    upstreamError(
      () =>
        normalizeRerank(
          {
            results: [
              { index: 0, relevance_score: 'high' },
              { index: 1, relevance_score: 1 },
            ],
          },
          r,
          meta,
        ),
      /not a number/,
    );
  });
});

describe('score answers', () => {
  it('keeps request order and checks the count', () => {
    const r = parseScoreRequest({ text_1: 'q', text_2: ['a', 'b'] });
    const { response } = normalizeScore(
      {
        data: [
          { index: 1, score: 0.2 },
          { index: 0, score: 0.7 },
        ],
        usage: { prompt_tokens: 6 },
      },
      r,
      meta,
    );
    assert.deepEqual((response as { data: unknown }).data, [
      { index: 0, object: 'score', score: 0.7 },
      { index: 1, object: 'score', score: 0.2 },
    ]);
    upstreamError(() => normalizeScore({ data: [{ score: 1 }] }, r, meta), /1 scores for 2/);
  });
});
