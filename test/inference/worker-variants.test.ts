/**
 * What real engines put on the wire, replayed by a fake worker (a small node:http
 * server answering the canned bodies of the case the request names in its
 * forwarded `variant` field), and what the client gets from the router:
 * - llama.cpp's server answers `logprobs: true` without `top_logprobs` with 20
 *   alternatives per token (its own default); the client asked for none, so it
 *   gets `top_logprobs: []` (spec: the length matches the request's value; OpenAI's
 *   default is 0), streamed or not;
 * - Ollama streams the parallel tool calls of a model without its own parser one
 *   whole call per chunk, every one at index 0 (ollama/ollama#15457): the client
 *   gets one index per call, so the SDK assembles two calls, not one call with
 *   both argument strings glued together.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';
import { validateChunk, validateCompletion } from '../support/openai-schemas.js';
import { listenWorker, onPost } from '../support/fake-worker.js';

type Payload = Record<string, unknown>;

/** One llama.cpp logprob entry with `n` alternatives, as its server writes them. */
function llamaEntry(token: string, n: number): Payload {
  const bytes = [...Buffer.from(token, 'utf8')];
  const alternatives = Array.from({ length: n }, (_, i) => ({
    id: 100 + i,
    token: i === 0 ? token : `alt${i}`,
    bytes: i === 0 ? bytes : [...Buffer.from(`alt${i}`, 'utf8')],
    logprob: -0.01 - i,
  }));
  return { id: 100, token, bytes, logprob: -0.01, top_logprobs: alternatives };
}

const llamaHead = {
  id: 'chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1',
  created: 1754524122,
  model: 'gpt-oss-20b',
  system_fingerprint: 'b6097-9515c613',
};

/** The canned answers: non-streaming body, or the payloads of a stream. */
const variants: Record<string, { completion: Payload; chunks: Payload[] }> = {
  // llama.cpp `logprobs: true` and no `top_logprobs`: n_probs defaults to 20.
  'llama-logprobs': {
    completion: {
      ...llamaHead,
      object: 'chat.completion',
      choices: [
        {
          index: 0,
          finish_reason: 'stop',
          message: { role: 'assistant', content: 'Yes' },
          logprobs: { content: [llamaEntry('Yes', 20)] },
        },
      ],
      usage: { prompt_tokens: 9, completion_tokens: 1, total_tokens: 10 },
    },
    chunks: [
      { choices: [{ index: 0, finish_reason: null, delta: { role: 'assistant', content: null } }] },
      {
        choices: [
          {
            index: 0,
            finish_reason: null,
            delta: { content: 'Yes' },
            logprobs: { content: [llamaEntry('Yes', 20)] },
          },
        ],
      },
      { choices: [{ index: 0, finish_reason: 'stop', delta: {} }] },
      { choices: [], usage: { prompt_tokens: 9, completion_tokens: 1, total_tokens: 10 } },
    ].map((c) => ({ ...llamaHead, object: 'chat.completion.chunk', ...c })),
  },
  'ollama-parallel-tools': {
    completion: {},
    chunks: [
      {
        choices: [
          {
            index: 0,
            delta: {
              role: 'assistant',
              content: '',
              tool_calls: [
                {
                  id: 'call_a1',
                  index: 0,
                  type: 'function',
                  function: { name: 'file_write', arguments: '{"filePath":"hello.py"}' },
                },
              ],
            },
            finish_reason: null,
          },
        ],
      },
      {
        choices: [
          {
            index: 0,
            delta: {
              role: 'assistant',
              content: '',
              tool_calls: [
                {
                  id: 'call_b2',
                  index: 0,
                  type: 'function',
                  function: { name: 'file_write', arguments: '{"filePath":"world.py"}' },
                },
              ],
            },
            finish_reason: null,
          },
        ],
      },
      {
        choices: [
          { index: 0, delta: { role: 'assistant', content: '' }, finish_reason: 'tool_calls' },
        ],
      },
      { choices: [], usage: { prompt_tokens: 120, completion_tokens: 44, total_tokens: 164 } },
    ].map((c) => ({
      id: 'chatcmpl-86',
      object: 'chat.completion.chunk',
      created: 1743277352,
      model: 'qwen2.5-coder:7b',
      system_fingerprint: 'fp_ollama',
      ...c,
    })),
  },
};

const vllmHead = {
  id: 'chatcmpl-8f1',
  object: 'chat.completion.chunk',
  created: 1754524122,
  model: 'qwen',
  system_fingerprint: 'fp_vllm',
};
/** One vLLM chunk of choice 0. */
const vchunk = (delta: Payload, finish: string | null = null): Payload => ({
  ...vllmHead,
  choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
});

/** Streams written byte for byte: line endings, comments and endings of engines and proxies. */
const rawStreams: Record<string, string[]> = {
  // CRLF line ends, keep-alive comments, a tool call's arguments in many fragments
  // and one `data:` line cut across writes.
  'crlf-split-tools': [
    ': ping\r\n\r\n',
    `data: ${JSON.stringify(vchunk({ role: 'assistant', content: '' }))}\r\n\r\n`,
    `data: ${JSON.stringify(
      vchunk({
        tool_calls: [
          { index: 0, id: 'call_x', type: 'function', function: { name: 'f', arguments: '' } },
        ],
      }),
    )}\r\n\r\n`,
    ...['{"a"', ': 1', ', "b": ', '"two"}'].map(
      (a) =>
        `data: ${JSON.stringify(vchunk({ tool_calls: [{ index: 0, function: { arguments: a } }] }))}\r\n\r\n`,
    ),
    ': keep-alive\r\n\r\n',
    `data: ${JSON.stringify(vchunk({}, 'tool_calls')).slice(0, 20)}`,
    `${JSON.stringify(vchunk({}, 'tool_calls')).slice(20)}\r\n\r\n`,
    `data: ${JSON.stringify({ ...vllmHead, choices: [], usage: { prompt_tokens: 7, completion_tokens: 6, total_tokens: 13 } })}\r\n\r\n`,
    'data: [DONE]\r\n\r\n',
  ],
  refusal: [
    `data: ${JSON.stringify(vchunk({ role: 'assistant', content: '' }))}\n\n`,
    ...["I can't", ' help', ' with that.'].map(
      (r) => `data: ${JSON.stringify(vchunk({ refusal: r }))}\n\n`,
    ),
    `data: ${JSON.stringify(vchunk({}, 'stop'))}\n\n`,
    'data: [DONE]\n\n',
  ],
  // vLLM's mid-stream error: an error object as data, then the connection closes.
  'error-mid-stream': [
    `data: ${JSON.stringify(vchunk({ role: 'assistant', content: 'Hel' }))}\n\n`,
    `data: ${JSON.stringify({ error: { object: 'error', message: 'engine dead', type: 'InternalServerError', code: 500 } })}\n\n`,
  ],
  // An SSE event named `error` whose data is a bare error object (no `error`
  // member), and then the worker still ends with [DONE].
  'error-event': [
    `data: ${JSON.stringify(vchunk({ role: 'assistant', content: 'Hel' }))}\n\n`,
    `event: error\ndata: ${JSON.stringify({ message: 'engine dead', type: 'InternalServerError' })}\n\n`,
    'data: [DONE]\n\n',
  ],
  // Some content, then the worker closes without [DONE].
  'no-done': [
    `data: ${JSON.stringify(vchunk({ role: 'assistant', content: 'Hel' }))}\n\n`,
    `data: ${JSON.stringify(vchunk({ content: 'lo' }))}\n\n`,
  ],
};

async function variantWorker() {
  const server = http.createServer(
    onPost((received, res) => {
      const body = received as Payload;
      const writes = rawStreams[String(body.variant)];
      if (writes !== undefined) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        // Each piece in its own TCP write.
        const next = (i: number) => {
          if (i === writes.length) {
            res.end();
            return;
          }
          res.write(writes[i], () => setImmediate(next, i + 1));
        };
        next(0);
        return;
      }
      const v = variants[String(body.variant)];
      if (!v) {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: `no variant ${String(body.variant)}` } }));
        return;
      }
      if (body.stream !== true) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(v.completion));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(v.chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join('') + 'data: [DONE]\n\n');
    }),
  );
  return listenWorker(server);
}

describe('what engines send, as the client gets it', () => {
  let s: TestServer;
  let w: Awaited<ReturnType<typeof variantWorker>>;
  let client: OpenAI;
  before(async () => {
    s = await startTestServer();
    w = await variantWorker();
    const p = await seedProject(s, {
      slug: 'var',
      model: 'vm',
      tier: 'gpu',
      capabilities: ['tool_calling', 'logprobs'],
      worker: { url: w.url, id: 'variants' },
      quotaRequests: 10_000,
    });
    client = new OpenAI({ baseURL: p.baseURL, apiKey: p.key, maxRetries: 0 });
  });
  after(async () => {
    await s.close();
    await w.close();
  });

  /** The SDK forwards unknown body fields as they are: `variant` picks the canned answer. */
  const ask = (variant: string, extra: Record<string, unknown> = {}) =>
    ({
      model: 'x',
      messages: [{ role: 'user', content: 'hi' }],
      variant,
      ...extra,
    }) as unknown as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming;

  it('logprobs without top_logprobs: no alternatives, whatever the engine defaults to', async () => {
    const data = await client.chat.completions.create(ask('llama-logprobs', { logprobs: true }));
    assert.deepEqual(validateCompletion(data), []);
    const entry = data.choices[0]!.logprobs!.content![0]!;
    assert.equal(entry.token, 'Yes');
    assert.deepEqual(entry.top_logprobs, [], 'top_logprobs omitted means 0 alternatives');

    const cut = await client.chat.completions.create(
      ask('llama-logprobs', { logprobs: true, top_logprobs: 3 }),
    );
    assert.equal(cut.choices[0]!.logprobs!.content![0]!.top_logprobs.length, 3);

    const stream = await client.chat.completions.create({
      ...ask('llama-logprobs', { logprobs: true }),
      stream: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
    const entries = [];
    for await (const c of stream) {
      assert.deepEqual(validateChunk(c), [], JSON.stringify(c));
      entries.push(...(c.choices[0]?.logprobs?.content ?? []));
    }
    assert.deepEqual(
      entries.map((e) => [e.token, e.top_logprobs.length]),
      [['Yes', 0]],
    );
  });

  it('parallel tool calls all at index 0 reach the client as separate calls', async () => {
    const tools = [
      {
        type: 'function' as const,
        function: {
          name: 'file_write',
          parameters: { type: 'object', properties: { filePath: { type: 'string' } } },
        },
      },
    ];
    const stream = client.chat.completions.stream({
      ...ask('ollama-parallel-tools', { tools }),
      stream: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
    for await (const c of stream) assert.deepEqual(validateChunk(c), [], JSON.stringify(c));
    const message = (await stream.finalChatCompletion()).choices[0]!.message;
    assert.deepEqual(
      message.tool_calls?.map((t) => [t.id, t.function.name, t.function.arguments]),
      [
        ['call_a1', 'file_write', '{"filePath":"hello.py"}'],
        ['call_b2', 'file_write', '{"filePath":"world.py"}'],
      ],
    );
  });

  const streamed = (variant: string, extra: Record<string, unknown> = {}) =>
    ({ ...ask(variant, extra), stream: true }) as OpenAI.Chat.ChatCompletionCreateParamsStreaming;

  it('CRLF lines, comments and split data lines: the SDK assembles the tool call', async () => {
    const stream = client.chat.completions.stream(
      streamed('crlf-split-tools', {
        tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
        stream_options: { include_usage: true },
      }),
    );
    const ids = new Set<string>();
    const created = new Set<number>();
    for await (const c of stream) {
      assert.deepEqual(validateChunk(c), [], JSON.stringify(c));
      ids.add(c.id);
      created.add(c.created);
      assert.equal(c.system_fingerprint, 'fp_vllm');
    }
    assert.equal(ids.size, 1);
    assert.equal(created.size, 1);
    const done = await stream.finalChatCompletion();
    const choice = done.choices[0]!;
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.deepEqual(
      choice.message.tool_calls?.map((t) => [t.id, t.function.name, t.function.arguments]),
      [['call_x', 'f', '{"a": 1, "b": "two"}']],
    );
    assert.equal(done.usage?.total_tokens, 13);
  });

  it('refusal deltas assemble into message.refusal', async () => {
    const stream = client.chat.completions.stream(streamed('refusal'));
    for await (const c of stream) assert.deepEqual(validateChunk(c), [], JSON.stringify(c));
    const message = (await stream.finalChatCompletion()).choices[0]!.message;
    assert.equal(message.refusal, "I can't help with that.");
  });

  for (const variant of ['error-mid-stream', 'error-event', 'no-done']) {
    it(`${variant}: the stream ends in an SSE error event the SDK raises`, async () => {
      const stream = await client.chat.completions.create(streamed(variant));
      let text = '';
      await assert.rejects(async () => {
        for await (const c of stream) {
          assert.deepEqual(validateChunk(c), [], JSON.stringify(c));
          text += c.choices[0]?.delta.content ?? '';
        }
      }, OpenAI.APIError);
      assert.ok(text.startsWith('Hel'), text);
    });
  }
});
