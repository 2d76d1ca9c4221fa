import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import OpenAI from 'openai';
import { ManualSleep } from './manual-sleep.js';
import { simWorkers } from '../../../test/support/sim.js';
import type { SimWorker } from './server.js';
import type { ChatCompletion, ChatCompletionChunk, ToolDefinition } from './wire.js';

const worker = simWorkers();

function post(w: SimWorker, body: unknown, init: RequestInit = {}): Promise<Response> {
  return fetch(`${w.url}/chat/completions`, {
    method: 'POST',
    ...init,
    headers: { 'content-type': 'application/json', ...(init.headers ?? {}) },
    body: JSON.stringify(body),
  });
}

interface ParsedStream {
  chunks: ChatCompletionChunk[];
  done: boolean;
  events: string[];
}

function parseSse(raw: string): ParsedStream {
  const events = raw.split('\n\n').filter((e) => e !== '');
  const chunks: ChatCompletionChunk[] = [];
  let done = false;
  for (const e of events) {
    assert.ok(e.startsWith('data: '), `event ${JSON.stringify(e)} is not a data line`);
    const data = e.slice('data: '.length);
    if (data === '[DONE]') {
      done = true;
      continue;
    }
    assert.equal(done, false, 'nothing may follow [DONE]');
    chunks.push(JSON.parse(data) as ChatCompletionChunk);
  }
  return { chunks, done, events };
}

function contentOf(chunks: ChatCompletionChunk[], index = 0): string {
  let s = '';
  for (const c of chunks)
    for (const ch of c.choices) if (ch.index === index) s += ch.delta.content ?? '';
  return s;
}

async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 2000; i++) {
    if (cond()) return;
    await delay(1);
  }
  assert.fail(`timed out waiting for ${what}`);
}

const weatherTool: ToolDefinition = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather for a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, days: { type: 'integer' } },
      required: ['city', 'days'],
    },
  },
};

describe('sim worker HTTP', () => {
  let w: SimWorker;
  before(async () => {
    w = await worker();
  });

  it('answers a body that is not JSON with 400, on the chat and the pooling routes', async () => {
    for (const path of ['/chat/completions', '/embeddings']) {
      const res = await fetch(`${w.url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{"model": ',
      });
      assert.equal(res.status, 400, path);
      // vLLM's error shape, the sim's default.
      const body = (await res.json()) as { object?: string; message?: string };
      assert.equal(body.object, 'error', path);
      assert.match(body.message ?? '', /^Invalid JSON body: /, path);
    }
  });

  it('serves a non-streaming completion with ids, fingerprint and usage', async () => {
    assert.match(w.url, /^http:\/\/127\.0\.0\.1:\d+\/v1$/);
    const res = await post(w, {
      model: 'anything',
      messages: [{ role: 'user', content: 'Hello' }],
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^application\/json/);
    const body = (await res.json()) as ChatCompletion;
    assert.equal(body.object, 'chat.completion');
    assert.match(body.id, /^chatcmpl-[0-9a-f]{32}$/);
    assert.equal(res.headers.get('x-request-id'), body.id);
    assert.equal(body.model, 'switchyard-sim');
    assert.match(body.system_fingerprint ?? '', /^sim-[0-9a-f]{10}$/);
    assert.equal(body.choices[0]?.message.role, 'assistant');
    assert.equal(body.usage.total_tokens, body.usage.prompt_tokens + body.usage.completion_tokens);
    assert.equal(body.usage.prompt_tokens_details.cached_tokens, 0);

    const named = await post(
      w,
      { messages: [{ role: 'user', content: 'Hi' }] },
      { headers: { 'x-request-id': 'abc123' } },
    );
    assert.equal(((await named.json()) as ChatCompletion).id, 'chatcmpl-abc123');
  });

  it('uses a configured system_fingerprint (or null)', async () => {
    const fp = await worker({ systemFingerprint: 'fp_test' });
    const none = await worker({ systemFingerprint: null });
    const req = { messages: [{ role: 'user', content: 'x' }] };
    assert.equal(
      ((await (await post(fp, req)).json()) as ChatCompletion).system_fingerprint,
      'fp_test',
    );
    assert.equal(
      ((await (await post(none, req)).json()) as ChatCompletion).system_fingerprint,
      null,
    );
  });

  it('streams SSE chunks that add up to the non-streaming answer, without usage by default', async () => {
    const req = { messages: [{ role: 'user', content: 'Stream me [sim:len=20] [sim:emoji]' }] };
    const unary = (await (await post(w, req)).json()) as ChatCompletion;
    const res = await post(w, { ...req, stream: true });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^text\/event-stream/);
    const s = parseSse(await res.text());
    assert.ok(s.done, 'stream ends with [DONE]');
    assert.equal(s.events.at(-1), 'data: [DONE]');
    for (const c of s.chunks) {
      assert.equal(c.object, 'chat.completion.chunk');
      assert.equal(c.id, s.chunks[0]!.id);
      assert.equal('usage' in c, false, 'no usage field without include_usage');
      assert.equal(c.system_fingerprint, unary.system_fingerprint);
    }
    assert.deepEqual(s.chunks[0]!.choices[0]!.delta, { role: 'assistant', content: '' });
    assert.equal(contentOf(s.chunks), unary.choices[0]!.message.content);
    const finishes = s.chunks.flatMap((c) => c.choices.filter((ch) => ch.finish_reason !== null));
    assert.equal(finishes.length, 1);
    assert.equal(finishes[0]!.finish_reason, 'stop');
    assert.deepEqual(finishes[0]!.delta, {});
    assert.equal(s.chunks.at(-1)!.choices[0]!.finish_reason, 'stop');
  });

  it('adds a final usage chunk with empty choices when include_usage is true', async () => {
    const req = {
      messages: [{ role: 'user', content: 'Usage please [sim:len=7]' }],
      max_tokens: 5,
      stream: true,
      stream_options: { include_usage: true },
    };
    const s = parseSse(await (await post(w, req)).text());
    assert.ok(s.done);
    const last = s.chunks.at(-1)!;
    assert.deepEqual(last.choices, []);
    assert.equal(last.usage?.completion_tokens, 5);
    assert.equal(last.usage?.total_tokens, last.usage!.prompt_tokens + 5);
    assert.equal(s.chunks.slice(0, -1).filter((c) => 'usage' in c).length, 0);
    const finish = s.chunks.flatMap((c) => c.choices).find((ch) => ch.finish_reason !== null);
    assert.equal(finish?.finish_reason, 'length');
  });

  it('streams tool calls, reasoning, refusals and logprobs as deltas', async () => {
    const tool = parseSse(
      await (
        await post(w, {
          messages: [{ role: 'user', content: '[sim:tool_call] [sim:reasoning]' }],
          tools: [weatherTool],
          stream: true,
        })
      ).text(),
    );
    const deltas = tool.chunks.flatMap((c) => c.choices.map((ch) => ch.delta));
    assert.ok(deltas.some((d) => typeof d.reasoning_content === 'string'));
    const calls = deltas.flatMap((d) => d.tool_calls ?? []);
    assert.equal(calls[0]?.function.name, 'get_weather');
    assert.match(calls[0]?.id ?? '', /^chatcmpl-tool-/);
    assert.equal(calls[0]?.function.arguments, '');
    const args = calls.map((c) => c.function.arguments).join('');
    assert.deepEqual(JSON.parse(args), { city: 'sim', days: 1 });
    assert.equal(tool.chunks.at(-1)!.choices[0]!.finish_reason, 'tool_calls');

    const refusal = parseSse(
      await (
        await post(w, {
          messages: [{ role: 'user', content: '[sim:refusal]' }],
          stream: true,
          logprobs: true,
        })
      ).text(),
    );
    const refusalText = refusal.chunks.map((c) => c.choices[0]?.delta.refusal ?? '').join('');
    assert.equal(refusalText, "I'm sorry, but I can't help with that request.");
    assert.equal(contentOf(refusal.chunks), '');
    assert.ok(refusal.chunks.some((c) => (c.choices[0]?.logprobs?.refusal?.length ?? 0) === 1));

    const lp = parseSse(
      await (
        await post(w, {
          messages: [{ role: 'user', content: '[sim:len=4]' }],
          stream: true,
          logprobs: true,
          top_logprobs: 2,
        })
      ).text(),
    );
    const entries = lp.chunks.flatMap((c) => c.choices[0]?.logprobs?.content ?? []);
    assert.equal(entries.length, 4);
    assert.ok(entries.every((e) => e.top_logprobs.length === 2 && e.logprob <= 0));
  });

  it('puts finish_reason on the last token chunk with finishStyle inline', async () => {
    const inline = await worker({ finishStyle: 'inline' });
    const s = parseSse(
      await (
        await post(inline, { messages: [{ role: 'user', content: '[sim:len=3]' }], stream: true })
      ).text(),
    );
    const last = s.chunks.at(-1)!.choices[0]!;
    assert.equal(last.finish_reason, 'stop');
    assert.ok((last.delta.content ?? '').length > 0);
    assert.equal(s.chunks.length, 4); // role + 3 tokens
  });

  it('streams n choices with their own indexes', async () => {
    const s = parseSse(
      await (
        await post(w, { messages: [{ role: 'user', content: 'two' }], n: 2, stream: true })
      ).text(),
    );
    const finished = s.chunks.flatMap((c) => c.choices).filter((ch) => ch.finish_reason !== null);
    assert.deepEqual(finished.map((ch) => ch.index).sort(), [0, 1]);
    assert.notEqual(contentOf(s.chunks, 0), contentOf(s.chunks, 1));
  });

  it('serves /v1/models, /health, /metrics and 404', async () => {
    const base = w.url.slice(0, -'/v1'.length);
    const models = (await (await fetch(`${w.url}/models`)).json()) as {
      object: string;
      data: Array<{ id: string; object: string; owned_by: string; max_model_len: number }>;
    };
    assert.equal(models.object, 'list');
    assert.equal(models.data[0]?.id, 'switchyard-sim');
    assert.equal(models.data[0]?.object, 'model');
    assert.equal(models.data[0]?.max_model_len, 4096);
    assert.equal((await fetch(`${base}/health`)).status, 200);
    const metrics = await (await fetch(`${base}/metrics`)).text();
    for (const name of [
      'vllm:num_requests_running',
      'vllm:num_requests_waiting',
      'vllm:kv_cache_usage_perc',
      'vllm:prefix_cache_queries_total',
      'vllm:prefix_cache_hits_total',
    ]) {
      assert.match(
        metrics,
        new RegExp(`^${name}\\{model_name="switchyard-sim"\\} \\d+(\\.\\d+)?(e-?\\d+)?$`, 'm'),
      );
    }
    // prometheus_client names a counter with its _total suffix on HELP and TYPE too.
    assert.match(metrics, /^# TYPE vllm:prefix_cache_hits_total counter$/m);
    assert.match(metrics, /^# HELP vllm:prefix_cache_hits_total /m);
    assert.match(metrics, /^# TYPE vllm:kv_cache_usage_perc gauge$/m);
    const missing = await fetch(`${base}/nope`);
    assert.equal(missing.status, 404);
    assert.deepEqual(await missing.json(), { detail: 'Not Found' });
  });

  it('reports prefix cache hits in usage and metrics across requests', async () => {
    const fresh = await worker();
    const system = 'Shared instructions for every request. '.repeat(30);
    const ask = async (q: string) =>
      (await (
        await post(fresh, {
          messages: [
            { role: 'system', content: system },
            { role: 'user', content: q },
          ],
          max_tokens: 2,
        })
      ).json()) as ChatCompletion;
    assert.equal((await ask('one')).usage.prompt_tokens_details.cached_tokens, 0);
    const second = await ask('two');
    assert.ok(second.usage.prompt_tokens_details.cached_tokens >= 256);
    const metrics = await (await fetch(`${fresh.url.slice(0, -3)}/metrics`)).text();
    const hits = /^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$/m.exec(metrics);
    assert.equal(Number(hits?.[1]), second.usage.prompt_tokens_details.cached_tokens);
  });

  it('returns 400s in the configured dialect', async () => {
    const bad = await fetch(`${w.url}/chat/completions`, { method: 'POST', body: '{not json' });
    assert.equal(bad.status, 400);
    const badBody = (await bad.json()) as { object: string; type: string; code: number };
    assert.equal(badBody.object, 'error');
    assert.equal(badBody.code, 400);
    const invalid = await post(w, { messages: [] });
    assert.equal(invalid.status, 400);
    assert.equal(((await invalid.json()) as { type: string }).type, 'BadRequestError');
    // A json_schema format without a schema object: the client's 400, not a TypeError's 500.
    for (const [rf, param] of [
      [{ type: 'json_schema' }, 'response_format.json_schema'],
      [
        { type: 'json_schema', json_schema: { name: 'a', schema: 'x' } },
        'response_format.json_schema.schema',
      ],
    ] as const) {
      const r = await post(w, { messages: [{ role: 'user', content: 'hi' }], response_format: rf });
      assert.equal(r.status, 400);
      assert.equal(((await r.json()) as { param: string }).param, param);
    }

    const llama = await worker({ errorStyle: 'llamacpp', contextWindow: 64 });
    const res = await post(llama, {
      messages: [{ role: 'user', content: 'hello' }],
      max_tokens: 100,
    });
    assert.equal(res.status, 400);
    const body = (await res.json()) as {
      error: { type: string; n_ctx: number; n_prompt_tokens: number };
    };
    assert.equal(body.error.type, 'exceed_context_size_error');
    assert.equal(body.error.n_ctx, 64);
    assert.ok(body.error.n_prompt_tokens > 0);
  });
});

describe('sim worker disconnects', () => {
  it('stops a stream at once when the client disconnects and frees the slot', async () => {
    const sleep = new ManualSleep();
    const w = await worker({ ttftMs: 10, tpotMs: 10, prefillMsPerToken: 0, sleep: sleep.sleep });
    const ac = new AbortController();
    const res = await post(
      w,
      { messages: [{ role: 'user', content: '[sim:len=1000]' }], stream: true },
      { signal: ac.signal },
    );
    assert.equal(res.status, 200, 'headers arrive before the first token');
    await until(() => w.stats().running === 1, 'admission');
    await sleep.advance(10);
    const reader = res.body!.getReader();
    const first = await reader.read();
    assert.match(new TextDecoder().decode(first.value), /^data: /);
    ac.abort();
    await until(() => w.stats().aborted === 1, 'the abort to reach the engine');
    assert.equal(w.stats().running, 0);
    assert.equal(w.stats().completed, 0);
    assert.equal(sleep.pending, 0, 'no decode step is still scheduled');
    assert.ok(w.stats().generationTokens < 5);
    const metrics = await (await fetch(`${w.url.slice(0, -3)}/metrics`)).text();
    assert.match(metrics, /^switchyard_sim_requests_aborted_total\{[^}]*\} 1\.0$/m);
  });

  it('drops a queued non-streaming request when its client goes away', async () => {
    const sleep = new ManualSleep();
    const w = await worker({ maxRunning: 1, ttftMs: 10, sleep: sleep.sleep });
    const first = post(w, { messages: [{ role: 'user', content: 'first' }] });
    await until(() => w.stats().running === 1, 'first admitted');
    const ac = new AbortController();
    const second = post(
      w,
      { messages: [{ role: 'user', content: 'second' }] },
      { signal: ac.signal },
    );
    await until(() => w.stats().waiting === 1, 'second queued');
    ac.abort();
    await assert.rejects(second);
    await until(() => w.stats().aborted === 1, 'queued abort');
    assert.equal(w.stats().waiting, 0);
    await sleep.advance(1000);
    assert.equal((await first).status, 200);
  });
});

describe('sim worker failure injection', () => {
  it('fails with a status before headers, for the next N requests only', async () => {
    const w = await worker({ failMode: { kind: 'status', status: 503, times: 1 } });
    const req = { messages: [{ role: 'user', content: 'x' }] };
    const failed = await post(w, req);
    assert.equal(failed.status, 503);
    assert.equal(((await failed.json()) as { object: string }).object, 'error');
    assert.equal((await post(w, req)).status, 200);
    w.setFailMode({ kind: 'status' });
    assert.equal((await post(w, req)).status, 500);
    assert.equal((await post(w, req)).status, 500);
    w.setFailMode(null);
    assert.equal((await post(w, req)).status, 200);
    assert.equal(w.stats().injectedFailures, 3);
  });

  it('resets the connection', async () => {
    const w = await worker({ failMode: { kind: 'reset', times: 1 } });
    await assert.rejects(post(w, { messages: [{ role: 'user', content: 'x' }] }));
    assert.equal((await post(w, { messages: [{ role: 'user', content: 'x' }] })).status, 200);
  });

  it('dies after N tokens mid-stream', async () => {
    const w = await worker({ failMode: { kind: 'die-after-tokens', tokens: 3 } });
    const res = await post(w, {
      messages: [{ role: 'user', content: '[sim:len=50]' }],
      stream: true,
    });
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    let raw = '';
    await assert.rejects(async () => {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        raw += new TextDecoder().decode(value);
      }
    });
    assert.ok(!raw.includes('[DONE]'));
    const tokens = raw
      .split('\n\n')
      .filter((e) => e.includes('"content":"') && !e.includes('"role"'));
    assert.equal(tokens.length, 3);
    await assert.rejects(post(w, { messages: [{ role: 'user', content: '[sim:len=50]' }] }));
    assert.equal(w.stats().stopped, 2);
    assert.equal(w.stats().aborted, 0);
  });
});

describe('OpenAI SDK compatibility', () => {
  let client: OpenAI;
  before(async () => {
    const w = await worker();
    client = new OpenAI({ baseURL: w.url, apiKey: 'sk-sim', maxRetries: 0 });
  });

  it('creates a plain completion', async () => {
    const c = await client.chat.completions.create({
      model: 'switchyard-sim',
      messages: [{ role: 'user', content: 'Hello SDK [sim:len=8]' }],
      max_completion_tokens: 20,
    });
    assert.equal(c.choices[0]?.finish_reason, 'stop');
    assert.equal(c.usage?.completion_tokens, 8);
    assert.ok((c.choices[0]?.message.content ?? '').length > 0);
    const models = await client.models.list();
    assert.equal(models.data[0]?.id, 'switchyard-sim');
  });

  it('streams with include_usage', async () => {
    const stream = await client.chat.completions.create({
      model: 'switchyard-sim',
      messages: [{ role: 'user', content: 'Stream SDK [sim:len=6]' }],
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let usage: OpenAI.CompletionUsage | null | undefined;
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      if (chunk.usage) usage = chunk.usage;
    }
    assert.ok(text.length > 0);
    assert.equal(finish, 'stop');
    assert.equal(usage?.completion_tokens, 6);
  });

  it('round-trips a tool call, streamed through the SDK accumulator', async () => {
    const tools: OpenAI.ChatCompletionTool[] = [
      {
        type: 'function',
        function: {
          name: 'get_weather',
          parameters: {
            type: 'object',
            properties: { city: { type: 'string' } },
            required: ['city'],
          },
        },
      },
    ];
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'user', content: 'Weather in Paris? [sim:tool_call]' },
    ];
    const runner = client.chat.completions.stream({ model: 'switchyard-sim', messages, tools });
    const final = await runner.finalChatCompletion();
    const msg = final.choices[0]!.message;
    assert.equal(final.choices[0]!.finish_reason, 'tool_calls');
    const call = msg.tool_calls?.[0];
    assert.ok(call && call.type === 'function');
    assert.equal(call.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.function.arguments), { city: 'sim' });

    const answer = await client.chat.completions.create({
      model: 'switchyard-sim',
      tools,
      messages: [
        ...messages,
        { role: 'assistant', content: null, tool_calls: [call] },
        { role: 'tool', tool_call_id: call.id, content: 'sunny, 24C' },
      ],
    });
    assert.equal(answer.choices[0]?.finish_reason, 'stop');
    assert.ok(answer.choices[0]?.message.content?.includes('sunny, 24C'));
  });
});
