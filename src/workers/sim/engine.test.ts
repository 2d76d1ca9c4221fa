import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { FakeClock } from '../../runtime/clock.js';
import { SimEngine, clockSleep, type SimEngineOptions } from './engine.js';
import { ManualSleep } from './manual-sleep.js';
import { renderPrompt, tokenize, tokenizePrompt } from './tokenizer.js';
import type { ChatCompletion, ChatRequest, ToolDefinition } from './wire.js';

const user = (content: string): ChatRequest['messages'][number] => ({ role: 'user', content });

async function complete(engine: SimEngine, request: ChatRequest): Promise<ChatCompletion> {
  const r = await engine.complete(request);
  assert.ok(r.ok, 'request should be accepted');
  assert.ok(r.response, 'request should complete');
  return r.response;
}

function choice(c: ChatCompletion, i = 0): ChatCompletion['choices'][number] {
  const ch = c.choices[i];
  assert.ok(ch);
  return ch;
}

const weatherTool: ToolDefinition = {
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string' },
        days: { type: 'integer', minimum: 3 },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
        detailed: { type: 'boolean' },
        tags: { type: 'array', items: { type: 'string' } },
        optional: { type: 'string' },
      },
      required: ['city', 'days', 'unit', 'detailed', 'tags'],
    },
  },
};
const timeTool: ToolDefinition = {
  type: 'function',
  function: { name: 'get_time', parameters: { type: 'object', properties: {} } },
};

/** A user message whose rendered prompt is exactly `tokens` tokens long. */
function messageOfTokens(tokens: number): ChatRequest['messages'] {
  for (let k = tokens * 4 - 40; ; k++) {
    const messages = [user('x'.repeat(k))];
    const n = tokenizePrompt(renderPrompt(messages), 16).tokens;
    if (n === tokens) return messages;
    assert.ok(n < tokens, 'token count must grow one at a time');
  }
}

describe('tokenizer', () => {
  it('splits into pieces of at most 4 code points that join back to the text', () => {
    const text = 'Hello   wonderful world!\n\n  héllo 🚀🚀🚀🚀🚀 世界 ';
    const tokens = tokenize(text);
    assert.equal(tokens.join(''), text);
    for (const t of tokens) assert.ok([...t].length <= 4, `token ${JSON.stringify(t)} too long`);
    assert.deepEqual(tokenize('Hello world'), ['Hell', 'o', ' wor', 'ld']);
    // Surrogate pairs are never split.
    assert.ok(tokens.every((t) => !/[\uD800-\uDBFF]$/.test(t)));
  });

  it('renders the documented chat template', () => {
    const text = renderPrompt([{ role: 'system', content: 'S' }, user('U')]);
    assert.equal(text, '<|system|>\nS<|end|>\n<|user|>\nU<|end|>\n<|assistant|>\n');
  });
});

describe('generation', () => {
  it('is deterministic for equal requests and seeded by `seed`', async () => {
    const engine = new SimEngine();
    const req: ChatRequest = { messages: [user('Tell me a story')], temperature: 0 };
    const a = await complete(engine, req);
    const b = await complete(engine, req);
    assert.equal(choice(a).message.content, choice(b).message.content);
    assert.ok((choice(a).message.content ?? '').length > 0);
    const other = await complete(engine, { messages: [user('Something else entirely')] });
    assert.notEqual(choice(other).message.content, choice(a).message.content);
    const s1 = await complete(engine, { ...req, seed: 1 });
    const s1b = await complete(engine, { messages: [user('A different prompt')], seed: 1 });
    const s2 = await complete(engine, { ...req, seed: 2 });
    assert.equal(choice(s1).message.content, choice(s1b).message.content);
    assert.notEqual(choice(s1).message.content, choice(s2).message.content);
  });

  it('returns n distinct choices and sums their usage', async () => {
    const engine = new SimEngine();
    const r = await complete(engine, { messages: [user('hi')], n: 3 });
    assert.equal(r.choices.length, 3);
    assert.deepEqual(
      r.choices.map((c) => c.index),
      [0, 1, 2],
    );
    assert.equal(new Set(r.choices.map((c) => c.message.content)).size, 3);
    const tokens = r.choices.reduce((s, c) => s + tokenize(c.message.content ?? '').length, 0);
    assert.equal(r.usage.completion_tokens, tokens);
  });

  it('honours max_tokens and max_completion_tokens with finish_reason length', async () => {
    const engine = new SimEngine();
    const r = await complete(engine, { messages: [user('hi [sim:len=50]')], max_tokens: 5 });
    assert.equal(choice(r).finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 5);
    assert.equal(tokenize(choice(r).message.content ?? '').length, 5);
    const r2 = await complete(engine, {
      messages: [user('hi [sim:len=50]')],
      max_tokens: 40,
      max_completion_tokens: 7,
    });
    assert.equal(r2.usage.completion_tokens, 7);
    assert.equal(choice(r2).finish_reason, 'length');
    const natural = await complete(engine, { messages: [user('hi [sim:len=12]')] });
    assert.equal(choice(natural).finish_reason, 'stop');
    assert.equal(natural.usage.completion_tokens, 12);
    assert.equal(natural.usage.total_tokens, natural.usage.prompt_tokens + 12);
    const eos = await complete(engine, {
      messages: [user('hi')],
      max_tokens: 77,
      ignore_eos: true,
    });
    assert.equal(eos.usage.completion_tokens, 77);
    assert.equal(choice(eos).finish_reason, 'length');
  });

  it('cuts at the earliest stop sequence', async () => {
    const engine = new SimEngine();
    const req: ChatRequest = { messages: [user('stop test [sim:len=60]')] };
    const full = choice(await complete(engine, req)).message.content ?? '';
    const words = full.split(' ');
    const stopWord = ` ${words[5]!}`;
    const cut = full.indexOf(stopWord);
    const r = await complete(engine, { ...req, stop: ['zzz-never', stopWord] });
    assert.equal(choice(r).finish_reason, 'stop');
    assert.equal(choice(r).message.content, full.slice(0, cut));
    assert.ok(r.usage.completion_tokens < 60);
    assert.ok(r.usage.completion_tokens >= tokenize(full.slice(0, cut)).length);
    const single = await complete(engine, { ...req, stop: stopWord });
    assert.equal(choice(single).message.content, full.slice(0, cut));
  });

  it('emits a tool call with schema-satisfying arguments', async () => {
    const engine = new SimEngine();
    const r = await complete(engine, {
      messages: [user('What is the weather? [sim:tool_call]')],
      tools: [weatherTool, timeTool],
    });
    const c = choice(r);
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.content, null);
    assert.equal(c.message.tool_calls?.length, 1);
    const call = c.message.tool_calls![0]!;
    assert.equal(call.type, 'function');
    assert.match(call.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
    assert.equal(call.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.function.arguments), {
      city: 'sim',
      days: 3,
      unit: 'celsius',
      detailed: true,
      tags: ['sim'],
    });
    assert.ok(r.usage.completion_tokens > 1);
  });

  it('follows tool_choice required, named and none', async () => {
    const engine = new SimEngine();
    const tools = [weatherTool, timeTool];
    const required = await complete(engine, {
      messages: [user('hi')],
      tools,
      tool_choice: 'required',
    });
    assert.equal(choice(required).message.tool_calls?.[0]?.function.name, 'get_weather');
    const named = await complete(engine, {
      messages: [user('hi')],
      tools,
      tool_choice: { type: 'function', function: { name: 'get_time' } },
    });
    assert.equal(choice(named).message.tool_calls?.[0]?.function.name, 'get_time');
    assert.equal(choice(named).message.tool_calls?.[0]?.function.arguments, '{}');
    const none = await complete(engine, {
      messages: [user('hi [sim:tool_call]')],
      tools,
      tool_choice: 'none',
    });
    assert.equal(choice(none).finish_reason, 'stop');
    assert.equal(choice(none).message.tool_calls, undefined);
    const noMarker = await complete(engine, { messages: [user('hi')], tools });
    assert.equal(choice(noMarker).finish_reason, 'stop');
  });

  it('emits two calls with [sim:parallel] unless parallel_tool_calls is false', async () => {
    const engine = new SimEngine();
    const req: ChatRequest = {
      messages: [user('[sim:tool_call] [sim:parallel]')],
      tools: [weatherTool, timeTool],
      parallel_tool_calls: true,
    };
    const r = await complete(engine, req);
    const calls = choice(r).message.tool_calls ?? [];
    assert.deepEqual(
      calls.map((c) => c.function.name),
      ['get_weather', 'get_time'],
    );
    assert.notEqual(calls[0]!.id, calls[1]!.id);
    const off = await complete(engine, { ...req, parallel_tool_calls: false });
    assert.equal(choice(off).message.tool_calls?.length, 1);
  });

  it('answers a tool result with text that includes it', async () => {
    const engine = new SimEngine();
    const first = await complete(engine, {
      messages: [user('weather? [sim:tool_call]')],
      tools: [weatherTool],
    });
    const call = choice(first).message.tool_calls![0]!;
    const second = await complete(engine, {
      messages: [
        user('weather? [sim:tool_call]'),
        { role: 'assistant', content: null, tool_calls: [call] },
        { role: 'tool', tool_call_id: call.id, content: '{"temp":21}' },
      ],
      tools: [weatherTool],
    });
    assert.equal(choice(second).finish_reason, 'stop');
    assert.ok(choice(second).message.content?.includes('{"temp":21}'));
  });

  it('refuses with [sim:refusal]', async () => {
    const engine = new SimEngine();
    const r = await complete(engine, {
      messages: [user('bad idea [sim:refusal]')],
      logprobs: true,
    });
    const c = choice(r);
    assert.equal(c.message.content, null);
    assert.equal(c.message.refusal, "I'm sorry, but I can't help with that request.");
    assert.equal(c.finish_reason, 'stop');
    assert.equal(c.logprobs?.content, null);
    assert.equal(c.logprobs?.refusal?.map((e) => e.token).join(''), c.message.refusal);
  });

  it('produces reasoning_content and counts reasoning tokens', async () => {
    const engine = new SimEngine();
    const marker = await complete(engine, {
      messages: [user('think [sim:reasoning] [sim:len=10]')],
    });
    assert.ok(choice(marker).message.reasoning_content?.startsWith('Let me think'));
    assert.equal(marker.usage.completion_tokens_details.reasoning_tokens, 32);
    assert.equal(marker.usage.completion_tokens, 42);
    const high = await complete(engine, { messages: [user('think')], reasoning_effort: 'high' });
    assert.equal(high.usage.completion_tokens_details.reasoning_tokens, 64);
    assert.ok((choice(high).message.content ?? '').length > 0);
    const plain = await complete(engine, { messages: [user('no think')] });
    assert.equal(choice(plain).message.reasoning_content, undefined);
    assert.equal(plain.usage.completion_tokens_details.reasoning_tokens, 0);
  });

  it('includes multi-byte characters with [sim:emoji]', async () => {
    const engine = new SimEngine();
    const r = await complete(engine, { messages: [user('[sim:emoji]')], logprobs: true });
    const content = choice(r).message.content ?? '';
    assert.ok(content.startsWith('héllo 🚀 世界'));
    for (const e of choice(r).logprobs?.content ?? []) {
      assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
    }
  });

  it('returns logprobs with top_logprobs of the requested length', async () => {
    const engine = new SimEngine();
    const req: ChatRequest = {
      messages: [user('hi [sim:len=9]')],
      logprobs: true,
      top_logprobs: 3,
    };
    const r = await complete(engine, req);
    const entries = choice(r).logprobs?.content ?? [];
    assert.equal(entries.length, 9);
    assert.equal(entries.map((e) => e.token).join(''), choice(r).message.content);
    for (const e of entries) {
      assert.equal(typeof e.token, 'string');
      assert.ok(e.logprob <= 0);
      assert.equal(e.top_logprobs.length, 3);
      assert.equal(e.top_logprobs[0]!.token, e.token);
      for (let i = 0; i < e.top_logprobs.length; i++) {
        const t = e.top_logprobs[i]!;
        assert.ok(t.logprob <= 0);
        assert.deepEqual(t.bytes, [...Buffer.from(t.token, 'utf8')]);
        if (i > 0) assert.ok(t.logprob < e.top_logprobs[i - 1]!.logprob);
      }
    }
    const again = await complete(engine, req);
    assert.deepEqual(choice(again).logprobs, choice(r).logprobs);
    const none = await complete(engine, { messages: [user('hi')], logprobs: true });
    assert.ok((choice(none).logprobs?.content ?? []).every((e) => e.top_logprobs.length === 0));
    assert.equal(choice(await complete(engine, { messages: [user('hi')] })).logprobs, null);
  });

  it('outputs JSON for json_object and json_schema', async () => {
    const engine = new SimEngine();
    const obj = await complete(engine, {
      messages: [user('json please')],
      response_format: { type: 'json_object' },
    });
    const parsed: unknown = JSON.parse(choice(obj).message.content ?? '');
    assert.equal(typeof parsed, 'object');
    const schema = await complete(engine, {
      messages: [user('json please')],
      response_format: {
        type: 'json_schema',
        json_schema: {
          name: 'person',
          strict: true,
          schema: {
            type: 'object',
            properties: {
              name: { type: 'string' },
              age: { type: 'integer' },
              score: { type: 'number' },
              member: { type: 'boolean' },
              address: {
                type: 'object',
                properties: { street: { type: 'string' } },
                required: ['street'],
              },
              nickname: { type: ['string', 'null'] },
            },
            required: ['name', 'age', 'score', 'member', 'address', 'nickname'],
          },
        },
      },
    });
    assert.deepEqual(JSON.parse(choice(schema).message.content ?? ''), {
      name: 'sim',
      age: 1,
      score: 1,
      member: true,
      address: { street: 'sim' },
      nickname: 'sim',
    });
  });

  it('huge minLength, minItems and [sim:len=N] are cut at max_tokens, not built whole first', async () => {
    const engine = new SimEngine();
    for (const schema of [
      { type: 'string', minLength: 1_000_000_000 },
      { type: 'array', items: { type: 'string' }, minItems: 100_000_000 },
    ] as const) {
      const r = await complete(engine, {
        messages: [user('json please')],
        max_tokens: 5,
        response_format: { type: 'json_schema', json_schema: { name: 'n', schema } },
      });
      assert.equal(choice(r).finish_reason, 'length');
    }
    const r = await complete(engine, {
      messages: [user('hi [sim:len=99999999999]')],
      max_tokens: 5,
    });
    assert.equal(choice(r).finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 5);
    const exact = await complete(engine, { messages: [user('hi [sim:len=3]')], max_tokens: 5 });
    assert.equal(exact.usage.completion_tokens, 3);
    assert.equal(choice(exact).finish_reason, 'stop');
  });

  it('counts accepted and rejected prediction tokens', async () => {
    const engine = new SimEngine();
    const predicted = 'The quick brown fox jumps over the lazy dog and keeps running far away';
    const r = await complete(engine, {
      messages: [user('rewrite')],
      prediction: { type: 'content', content: [{ type: 'text', text: predicted }] },
    });
    const total = tokenize(predicted).length;
    const half = Math.ceil(total / 2);
    const d = r.usage.completion_tokens_details;
    assert.equal(d.accepted_prediction_tokens, half);
    assert.equal(d.rejected_prediction_tokens, total - half);
    assert.ok(choice(r).message.content?.startsWith(tokenize(predicted).slice(0, half).join('')));
    const none = await complete(engine, { messages: [user('rewrite')] });
    assert.equal(none.usage.completion_tokens_details.accepted_prediction_tokens, null);
  });
});

describe('context window', () => {
  const big = (opts: SimEngineOptions = {}) => new SimEngine({ contextWindow: 4096, ...opts });

  it("rejects prompt + max_tokens over the window in vLLM's wording", () => {
    const r = big().prepare({ messages: messageOfTokens(1000), max_tokens: 4000 });
    assert.ok(!r.ok);
    assert.equal(r.error.status, 400);
    assert.deepEqual(r.error.body, {
      object: 'error',
      message:
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (1000 in the messages, 4000 in the completion). Please reduce the length of the messages or completion.",
      type: 'BadRequestError',
      param: null,
      code: 400,
    });
    // Exactly at the window is accepted.
    assert.ok(big().prepare({ messages: messageOfTokens(1000), max_tokens: 3096 }).ok);
  });

  it('rejects a prompt that alone fills the window', () => {
    const r = big().prepare({ messages: messageOfTokens(4096) });
    assert.ok(!r.ok);
    assert.equal(
      r.error.body.message,
      "This model's maximum context length is 4096 tokens. However, you requested 4096 tokens in the messages, Please reduce the length of the messages.",
    );
    const ok = big().prepare({ messages: messageOfTokens(4000) });
    assert.ok(ok.ok);
    assert.equal(ok.prepared.maxTokens, 96);
  });

  it("uses llama.cpp's body with errorStyle llamacpp", () => {
    const r = big({ errorStyle: 'llamacpp' }).prepare({
      messages: messageOfTokens(1000),
      max_tokens: 4000,
    });
    assert.ok(!r.ok);
    assert.deepEqual(r.error.body, {
      error: {
        code: 400,
        message:
          'request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it',
        type: 'exceed_context_size_error',
        n_prompt_tokens: 1000,
        n_ctx: 4096,
      },
    });
  });

  it("uses recent vLLM's nested body with errorStyle vllm-current", () => {
    const r = big({ errorStyle: 'vllm-current' }).prepare({
      messages: messageOfTokens(1000),
      max_tokens: 4000,
    });
    assert.ok(!r.ok);
    assert.deepEqual(r.error.body, {
      error: {
        message:
          "You passed 1000 input tokens and requested 4000 output tokens. However, the model's context length is only 4096 tokens, resulting in a maximum input length of 96 tokens. Please reduce the length of the input prompt.",
        type: 'BadRequestError',
        param: 'input_tokens',
        code: 400,
      },
    });
  });
});

describe('prefix cache', () => {
  const system = 'You are a meticulous assistant. '.repeat(40);
  const req = (question: string): ChatRequest => ({
    messages: [{ role: 'system', content: system }, user(question)],
    max_tokens: 4,
  });

  it('serves a shared long prefix from cache and lowers TTFT', async () => {
    const sleep = new ManualSleep();
    const engine = new SimEngine({ ttftMs: 20, prefillMsPerToken: 0.5, sleep: sleep.sleep });
    const runA = engine.complete(req('First question?'));
    await sleep.advance(10_000);
    const a = await runA;
    assert.ok(a.ok && a.response);
    assert.equal(a.response.usage.prompt_tokens_details.cached_tokens, 0);
    const prefillA = sleep.requested[0]!;
    assert.equal(prefillA, 20 + a.prepared.promptTokens * 0.5);

    const runB = engine.complete(req('Second, different question?'));
    await sleep.advance(10_000);
    const b = await runB;
    assert.ok(b.ok && b.response);
    // The common prefix is the system message and the user marker; count its full blocks.
    const tA = tokenize(a.prepared.promptText);
    const tB = tokenize(b.prepared.promptText);
    let common = 0;
    while (tA[common] === tB[common]) common++;
    const expected = Math.floor(common / 16) * 16;
    assert.ok(expected >= 256, 'the shared prefix spans many blocks');
    assert.equal(b.response.usage.prompt_tokens_details.cached_tokens, expected);
    const prefillB = sleep.requested.at(-1)!;
    assert.equal(prefillB, 20 + (b.prepared.promptTokens - expected) * 0.5);
    assert.ok(prefillB < prefillA);
    const s = engine.stats();
    assert.equal(s.prefixCacheHits, expected);
    assert.equal(s.prefixCacheQueries, a.prepared.promptTokens + b.prepared.promptTokens);
  });

  it('never reports the whole prompt as cached (the last token is recomputed)', async () => {
    const engine = new SimEngine();
    const r1 = await engine.complete(req('Same question'));
    const r2 = await engine.complete(req('Same question'));
    assert.ok(r1.ok && r2.ok && r2.response);
    const cached = r2.response.usage.prompt_tokens_details.cached_tokens;
    assert.equal(cached, Math.floor((r2.prepared.promptTokens - 1) / 16) * 16);
    assert.ok(cached > 0 && cached < r2.prepared.promptTokens);
  });

  it('evicts least recently used blocks when capacity is exceeded', async () => {
    // 20 blocks of capacity; each prompt below is 129 tokens: 8 full blocks + 1 token.
    const engine = new SimEngine({ kvCacheTokens: 20 * 16 });
    const prompt = (tag: string): ChatRequest => ({
      messages: [user(`${tag} `.repeat(60))],
      max_tokens: 1,
    });
    const cached = async (r: ChatRequest): Promise<number> => {
      const c = await engine.complete(r);
      assert.ok(c.ok && c.response);
      return c.response.usage.prompt_tokens_details.cached_tokens;
    };
    const A = prompt('alpha');
    const B = prompt('bravo');
    const C = prompt('charlie');
    const keysOf = (r: ChatRequest): number[] => {
      const p = engine.prepare(r);
      assert.ok(p.ok);
      return p.prepared.blockKeys;
    };
    assert.equal(await cached(A), 0);
    assert.equal(await cached(B), 0);
    assert.ok((await cached(A)) > 0, 'A is still cached; touching it makes it most recent');
    assert.equal(engine.stats().cachedBlocks, 16);
    assert.equal(await cached(C), 0);
    // C needed room: B (least recently used) lost blocks, A kept all of its own.
    assert.ok(engine.stats().evictedBlocks > 0);
    assert.ok(keysOf(A).every((k) => engine.isCached(k)));
    assert.ok(!keysOf(B).every((k) => engine.isCached(k)));
    // Tail blocks go first, so B keeps its leading blocks as long as possible.
    assert.ok(engine.isCached(keysOf(B)[0]!));
    assert.ok(!engine.isCached(keysOf(B).at(-1)!));
    assert.ok(keysOf(C).every((k) => engine.isCached(k)));
    assert.ok(engine.stats().cachedBlocks <= 20);
    // B's surviving leading blocks still give a (shorter) hit.
    const hitB = await cached(B);
    assert.ok(hitB > 0 && hitB < 128, `partial hit ${hitB}`);
  });
});

describe('scheduling', () => {
  it('queues requests beyond maxRunning in FIFO order', async () => {
    const sleep = new ManualSleep();
    const engine = new SimEngine({
      maxRunning: 2,
      ttftMs: 10,
      tpotMs: 5,
      prefillMsPerToken: 0,
      sleep: sleep.sleep,
      clock: sleep.clock,
    });
    const order: string[] = [];
    const run = (tag: string, len: number) =>
      engine.complete({ messages: [user(`${tag} [sim:len=${len}]`)] }).then((r) => {
        order.push(tag);
        return r;
      });
    const a = run('a', 4); // done at 10 + 3*5 = 25
    const b = run('b', 8); // done at 45
    const c = run('c', 2);
    const d = run('d', 2);
    await sleep.settle();
    assert.equal(engine.stats().running, 2);
    assert.equal(engine.stats().waiting, 2);
    await sleep.advance(24);
    assert.deepEqual(order, []);
    await sleep.advance(1);
    assert.deepEqual(order, ['a']);
    // c was first in line; d still waits.
    assert.equal(engine.stats().running, 2);
    assert.equal(engine.stats().waiting, 1);
    await sleep.advance(100);
    assert.deepEqual(order, ['a', 'c', 'b', 'd']);
    const rc = await c;
    assert.ok(rc.ok);
    assert.equal(rc.result.queuedMs, 25);
    await Promise.all([a, b, d]);
    assert.equal(engine.stats().running, 0);
    assert.equal(engine.stats().completed, 4);
  });

  it('orders the waiting queue by priority, then arrival, under schedulingPolicy priority', async () => {
    const sleep = new ManualSleep();
    const engine = new SimEngine({
      maxRunning: 1,
      ttftMs: 10,
      tpotMs: 0,
      prefillMsPerToken: 0,
      schedulingPolicy: 'priority',
      sleep: sleep.sleep,
      clock: sleep.clock,
    });
    const order: string[] = [];
    const run = (tag: string, priority?: number) =>
      engine
        .complete({
          messages: [user(`${tag} [sim:len=1]`)],
          ...(priority === undefined ? {} : { priority }),
        })
        .then((r) => {
          assert.ok(r.ok);
          order.push(tag);
        });
    const all = [
      run('first', 5),
      run('late', 9),
      run('cold', 7),
      run('warm', 1),
      run('warm2', 1),
      run('none'),
    ];
    await sleep.settle();
    assert.equal(engine.stats().waiting, 5);
    await sleep.advance(100);
    await Promise.all(all);
    // `first` was admitted on arrival; then lower priority first, ties (and an absent
    // priority, 0) by arrival.
    assert.deepEqual(order, ['first', 'none', 'warm', 'warm2', 'cold', 'late']);
  });

  it('prefillConcurrency 1: admitted requests prefill one at a time, in priority order', async () => {
    const sleep = new ManualSleep();
    const engine = new SimEngine({
      ttftMs: 10,
      tpotMs: 0,
      prefillMsPerToken: 0,
      prefillConcurrency: 1,
      schedulingPolicy: 'priority',
      sleep: sleep.sleep,
      clock: sleep.clock,
    });
    const firstToken: Record<string, number> = {};
    const run = (tag: string, priority: number) =>
      engine.complete(
        { messages: [user(`${tag} [sim:len=1]`)], priority },
        { onStep: () => void (firstToken[tag] = sleep.clock.now()) },
      );
    const t0 = sleep.clock.now();
    const all = [run('a', 5), run('b', 9), run('c', 1)];
    await sleep.settle();
    // All three are admitted (slots are plenty); one prefill runs, two wait for it.
    assert.equal(engine.stats().running, 3);
    await sleep.advance(100);
    await Promise.all(all);
    assert.deepEqual(
      Object.entries(firstToken)
        .sort((x, y) => x[1] - y[1])
        .map(([tag, at]) => [tag, at - t0]),
      [
        ['a', 10],
        ['c', 20],
        ['b', 30],
      ],
    );
  });

  it("refuses a priority other than 0 under fcfs, in vLLM's words", () => {
    const engine = new SimEngine();
    const r = engine.prepare({ messages: [user('hi')], priority: 3 });
    assert.ok(!r.ok);
    assert.equal(r.error.status, 400);
    assert.match(
      JSON.stringify(r.error.body),
      /Got priority 3 but Priority scheduling is not enabled/,
    );
    assert.ok(engine.prepare({ messages: [user('hi')], priority: 0 }).ok);
  });

  it('can be driven by the shared FakeClock through clockSleep', async () => {
    const clock = new FakeClock();
    const engine = new SimEngine({
      ttftMs: 50,
      prefillMsPerToken: 0,
      sleep: clockSleep(clock),
      clock,
    });
    let done = false;
    const p = engine.complete({ messages: [user('[sim:len=3]')] }).then((r) => {
      done = true;
      return r;
    });
    await new Promise((r) => setImmediate(r));
    clock.advance(49);
    await new Promise((r) => setImmediate(r));
    assert.equal(done, false);
    clock.advance(1);
    const r = await p;
    assert.ok(r.ok && r.response);
    assert.equal(r.response.usage.completion_tokens, 3);
  });

  it('applies slowdown to every delay', async () => {
    const sleep = new ManualSleep();
    const engine = new SimEngine({
      ttftMs: 10,
      tpotMs: 4,
      prefillMsPerToken: 0,
      slowdown: 2.5,
      sleep: sleep.sleep,
    });
    const p = engine.complete({ messages: [user('[sim:len=3]')] });
    await sleep.advance(1000);
    await p;
    assert.deepEqual(sleep.requested, [25, 10, 10]);
  });

  it('frees the slot at once when a running or queued request is aborted', async () => {
    const sleep = new ManualSleep();
    const engine = new SimEngine({
      maxRunning: 1,
      ttftMs: 10,
      tpotMs: 10,
      prefillMsPerToken: 0,
      sleep: sleep.sleep,
    });
    const running = new AbortController();
    const queued = new AbortController();
    const steps: number[] = [];
    const r1 = engine.complete(
      { messages: [user('[sim:len=100]')] },
      { signal: running.signal, onStep: (k) => void steps.push(k) },
    );
    const r2 = engine.complete(
      { messages: [user('[sim:len=100] second')] },
      { signal: queued.signal },
    );
    const r3 = engine.complete({ messages: [user('[sim:len=2] third')] });
    await sleep.advance(30);
    assert.deepEqual(steps, [0, 1, 2]);
    assert.equal(engine.stats().waiting, 2);
    queued.abort();
    running.abort();
    const [a1, a2] = await Promise.all([r1, r2]);
    assert.ok(a1.ok && a2.ok);
    assert.equal(a1.result.status, 'aborted');
    assert.equal(a2.result.status, 'aborted');
    assert.equal(a1.response, null);
    assert.deepEqual(steps, [0, 1, 2]);
    assert.equal(engine.stats().aborted, 2);
    // The third request took the freed slot.
    assert.equal(engine.stats().running, 1);
    assert.equal(engine.stats().waiting, 0);
    await sleep.advance(100);
    const a3 = await r3;
    assert.ok(a3.ok && a3.response);
    assert.equal(engine.stats().running, 0);
    assert.equal(engine.stats().kvCacheUsage, 0);
  });

  it('reports KV usage of running sequences between 0 and 1', async () => {
    const sleep = new ManualSleep();
    const engine = new SimEngine({ kvCacheTokens: 64 * 16, tpotMs: 1, sleep: sleep.sleep });
    const p = engine.complete({ messages: [user('word '.repeat(200))], max_tokens: 3 });
    await sleep.settle();
    const during = engine.stats().kvCacheUsage;
    assert.ok(during > 0 && during <= 1, `usage ${during}`);
    await sleep.advance(10);
    await p;
    assert.equal(engine.stats().kvCacheUsage, 0);
    assert.ok(engine.stats().cachedBlocks > 0);
    const withCache = new SimEngine({ kvCacheTokens: 64 * 16, kvUsageIncludesCache: true });
    await withCache.complete({ messages: [user('word '.repeat(200))], max_tokens: 3 });
    assert.ok(withCache.stats().kvCacheUsage > 0);
  });
});
