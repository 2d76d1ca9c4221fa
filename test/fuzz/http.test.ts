/**
 * Fuzzing the HTTP boundary: malformed JSON, invalid UTF-8, deep nesting, huge
 * strings and wrong types in every field of the chat request, sent over HTTP.
 * Every answer must be a 4xx in the error envelope (or a 200 for the rare
 * valid request), never a 5xx, and the server must keep serving.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import fc from 'fast-check';
import { request } from 'undici';
import { inferenceFixture, type InferenceFixture } from '../support/inference.js';

const FIELDS = [
  'model',
  'messages',
  'max_tokens',
  'max_completion_tokens',
  'temperature',
  'top_p',
  'stream',
  'stream_options',
  'stop',
  'frequency_penalty',
  'presence_penalty',
  'n',
  'seed',
  'logprobs',
  'top_logprobs',
  'logit_bias',
  'tools',
  'tool_choice',
  'parallel_tool_calls',
  'response_format',
  'metadata',
  'user',
  'store',
  'reasoning_effort',
  'service_tier',
  'prediction',
  'modalities',
];

describe('fuzzing the chat route over HTTP', () => {
  let f: InferenceFixture;
  before(async () => {
    // self_hosted: no tier limit, so every request reaches validation.
    f = await inferenceFixture({
      tier: 'self_hosted',
      env: { SWITCHYARD_MAX_BODY_BYTES: String(256 * 1024) },
    });
    await f.server.admin('PATCH', '/projects/inf/endpoints/chat', { max_requests_per_minute: 1e7 });
  });
  after(() => f.close());

  async function send(body: Buffer | string): Promise<{ status: number; json: unknown }> {
    const res = await request(`${f.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${f.key}`, 'content-type': 'application/json' },
      body,
    });
    const text = await res.body.text();
    let json: unknown = null;
    try {
      json = JSON.parse(text);
    } catch {
      json = null;
    }
    return { status: res.statusCode, json };
  }

  function assertClientError(r: { status: number; json: unknown }, what: string) {
    if (r.status === 200) return;
    assert.ok(
      r.status >= 400 && r.status < 500,
      `${what}: status ${r.status} ${JSON.stringify(r.json)}`,
    );
    const err = (r.json as { error?: Record<string, unknown> } | null)?.error;
    assert.ok(err, `${what}: no error envelope`);
    assert.equal(typeof err.message, 'string');
    assert.equal(typeof err.code, 'string');
    assert.ok('param' in err && 'type' in err);
  }

  const base = { model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 };

  it('wrong types in every field', async () => {
    // Bigger quota for this key: hundreds of requests.
    const k = await f.server.admin('POST', '/projects/inf/keys', { quotaRequests: 100_000 });
    f.key = String(k.body.key);
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...FIELDS),
        fc.jsonValue({ maxDepth: 4 }),
        async (field, value) => {
          const r = await send(JSON.stringify({ ...base, stream: false, [field]: value }));
          assertClientError(r, `${field}=${JSON.stringify(value).slice(0, 80)}`);
        },
      ),
      { numRuns: 300, seed: 42 },
    );
  });

  it('malformed JSON, invalid UTF-8, deep nesting, huge strings', async () => {
    const cases: Array<[string, Buffer | string]> = [
      ['truncated', '{"model": "x", "messages": ['],
      ['not json', 'hello'],
      ['empty', ''],
      ['array', '[]'],
      ['null', 'null'],
      [
        'invalid utf-8',
        Buffer.concat([
          Buffer.from('{"model":"'),
          Buffer.from([0xff, 0xfe, 0xc3]),
          Buffer.from('","messages":[]}'),
        ]),
      ],
      ['deep nesting', '{"model":"x","messages":' + '['.repeat(5000) + ']'.repeat(5000) + '}'],
      [
        'deep metadata',
        JSON.stringify({
          ...base,
          metadata: JSON.parse('{"a":'.repeat(500) + '1' + '}'.repeat(500)),
        }),
      ],
      ['huge string under the limit', JSON.stringify({ ...base, user: 'u'.repeat(200_000) })],
      ['huge string over the limit', JSON.stringify({ ...base, user: 'u'.repeat(400_000) })],
      [
        '__proto__ pollution',
        '{"__proto__":{"admin":true},"model":"x","messages":[{"role":"user","content":"hi"}]}',
      ],
      ['constructor pollution', '{"constructor":{"prototype":{"x":1}},"model":"x","messages":[]}'],
      [
        'unpaired surrogate',
        '{"model":"\\ud800","messages":[{"role":"user","content":"\\udfff"}]}',
      ],
    ];
    for (const [what, body] of cases) assertClientError(await send(body), what);
    await fc.assert(
      fc.asyncProperty(fc.uint8Array({ maxLength: 2048 }), async (bytes) => {
        assertClientError(await send(Buffer.from(bytes)), 'random bytes');
      }),
      { numRuns: 150, seed: 7 },
    );
    await fc.assert(
      fc.asyncProperty(fc.string({ maxLength: 300 }), async (s) => {
        assertClientError(await send(s), 'random text');
      }),
      { numRuns: 150, seed: 11 },
    );
    // Still serving.
    const ok = await send(JSON.stringify(base));
    assert.equal(ok.status, 200);
  });

  it('a body that is not UTF-8 is refused, not stored or forwarded with U+FFFD in it', async () => {
    const bytes = (s: string, bad: number[]) => {
      const [a, b] = s.split('BAD') as [string, string];
      return Buffer.concat([Buffer.from(a), Buffer.from(bad), Buffer.from(b)]);
    };
    const chat = bytes(
      '{"model":"x","messages":[{"role":"user","content":"aBADb"}]}',
      [0xff, 0xfe],
    );
    for (const body of [chat, bytes(JSON.stringify(base).replace('hi', 'hBAD'), [0xc3])]) {
      const r = await send(body);
      assert.equal(r.status, 400);
      assert.equal((r.json as { error: { code: string } }).error.code, 'invalid_json');
    }
    // A management route (another parser scope) alike; valid U+FFFD is text like any other.
    const conv = (body: Buffer) =>
      request(`${f.baseURL}/conversations`, {
        method: 'POST',
        headers: { authorization: `Bearer ${f.key}`, 'content-type': 'application/json' },
        body,
      });
    const bad = await conv(bytes('{"metadata":{"k":"aBADb"}}', [0xff]));
    assert.equal(bad.statusCode, 400);
    assert.equal(
      ((await bad.body.json()) as { error: { code: string } }).error.code,
      'invalid_json',
    );
    const good = await conv(Buffer.from('\ufeff{"metadata":{"k":"a\ufffdb"}}'));
    assert.equal(good.statusCode, 200);
    assert.deepEqual(((await good.body.json()) as { metadata: unknown }).metadata, {
      k: 'a\ufffdb',
    });
    const ok = await send(
      JSON.stringify({ ...base, messages: [{ role: 'user', content: 'é ✓ \ufffd' }] }),
    );
    assert.equal(ok.status, 200);
  });
});
