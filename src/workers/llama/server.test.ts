import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import OpenAI from 'openai';
import { buildDemoModel, loadDemoTable, type DemoModelTable } from './demo-model.js';
import { predictionCounts } from './engine.js';
import { startLlamaWorker, type LlamaWorker } from './server.js';

const MODEL = 'switchyard-demo';
const CONTEXT = 4096;

let dir: string;
let table: DemoModelTable;
let worker: LlamaWorker;
let client: OpenAI;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'swy-llama-'));
  const { path } = await buildDemoModel(join(dir, 'demo.gguf'));
  table = await loadDemoTable();
  worker = await startLlamaWorker({
    modelPath: path,
    modelName: MODEL,
    contextSize: CONTEXT,
    sequences: 2,
  });
  client = new OpenAI({ baseURL: worker.url, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  await worker?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const SPACE = (): number => table.tokenize(' ')[0] as number;

/** The demo model's greedy reply: every prompt ends with "assistant: ", so with `▁`. */
function greedyReply(tokens: number): string {
  const out: number[] = [];
  let cur = SPACE();
  for (let i = 0; i < tokens; i++) {
    const row = table.row(cur);
    let best = 0;
    for (let t = 1; t < row.length; t++) if ((row[t] ?? 0) > (row[best] ?? 0)) best = t;
    out.push(best);
    cur = best;
  }
  return table.detokenize(out);
}

async function metrics(): Promise<Map<string, number>> {
  const text = await (await fetch(worker.url.replace(/\/v1$/, '/metrics'))).text();
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const [name, value] = line.split(' ');
    out.set(name as string, Number(value));
  }
  return out;
}

async function rawStream(body: unknown): Promise<string> {
  const res = await fetch(`${worker.url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type') ?? '', /^text\/event-stream/);
  return res.text();
}

async function expectError(
  body: Parameters<OpenAI['chat']['completions']['create']>[0],
  status: number,
  code: string,
  param: string | null,
): Promise<void> {
  await assert.rejects(client.chat.completions.create(body), (err: unknown) => {
    assert.ok(err instanceof OpenAI.APIError, String(err));
    assert.equal(err.status, status);
    assert.equal(err.code, code);
    assert.equal(err.param, param);
    return true;
  });
}

const user = (content: string) => [{ role: 'user' as const, content }];

describe('llama worker: completions', () => {
  it('answers with the spec response shape and the model’s greedy text', async () => {
    const { data, response } = await client.chat.completions
      .create({
        model: 'anything',
        messages: user('Tell me about the yard.'),
        max_tokens: 24,
        temperature: 0,
      })
      .withResponse();
    assert.equal(response.headers.get('x-request-id'), data.id);
    assert.match(data.id, /^chatcmpl-/);
    assert.equal(data.object, 'chat.completion');
    assert.equal(data.model, MODEL);
    assert.equal(typeof data.system_fingerprint, 'string');
    const choice = data.choices[0];
    assert.ok(choice);
    assert.equal(choice.message.role, 'assistant');
    assert.equal(choice.message.refusal, null);
    assert.deepEqual(choice.message.annotations, []);
    assert.equal(choice.logprobs, null);
    assert.equal(choice.finish_reason, 'length');
    assert.equal(choice.message.content, greedyReply(24));
    const u = data.usage;
    assert.ok(u);
    assert.equal(u.completion_tokens, 24);
    assert.equal(u.total_tokens, u.prompt_tokens + 24);
    assert.equal(u.prompt_tokens_details?.audio_tokens, null);
    assert.equal(u.completion_tokens_details?.reasoning_tokens, null);
    assert.equal(u.completion_tokens_details?.accepted_prediction_tokens, null);
  });

  it('streams token by token, with a final usage chunk when asked', async () => {
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: user('Tell me about the yard.'),
      max_tokens: 24,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    const last = chunks[chunks.length - 1];
    assert.ok(last?.usage);
    assert.deepEqual(last.choices, []);
    assert.equal(last.usage.completion_tokens, 24);
    const cached = last.usage.prompt_tokens_details?.cached_tokens ?? 0;
    assert.ok(cached > 0, 'same prompt as the previous test');
    const body = chunks.slice(0, -1);
    assert.ok(body.every((c) => c.usage === null && c.object === 'chat.completion.chunk'));
    assert.equal(body[0]?.choices[0]?.delta.role, 'assistant');
    const text = body.map((c) => c.choices[0]?.delta.content ?? '').join('');
    assert.equal(text, greedyReply(24));
    assert.ok(body.length >= 24, 'one chunk per token');
    assert.equal(body[body.length - 1]?.choices[0]?.finish_reason, 'length');
  });

  it('sends no usage at all without include_usage, and ends with [DONE]', async () => {
    const raw = await rawStream({
      model: MODEL,
      messages: user('hi'),
      max_tokens: 5,
      stream: true,
    });
    const events = raw.split('\n\n').filter((e) => e !== '');
    assert.equal(events[events.length - 1], 'data: [DONE]');
    for (const e of events.slice(0, -1)) {
      const chunk = JSON.parse(e.slice('data: '.length)) as Record<string, unknown>;
      assert.equal('usage' in chunk, false);
    }
  });

  it('reports logprobs with top_logprobs that are the model’s bigram probabilities', async () => {
    const req = {
      model: MODEL,
      messages: user('What does the demo model know?'),
      max_tokens: 12,
      temperature: 1,
      top_p: 1,
      seed: 11,
      logprobs: true,
      top_logprobs: 3,
    };
    const r = await client.chat.completions.create(req);
    const entries = r.choices[0]?.logprobs?.content;
    assert.ok(entries);
    assert.equal(entries.length, r.usage?.completion_tokens);
    let prev = SPACE();
    for (const e of entries) {
      const [token] = table.tokenize(e.token);
      assert.ok(token !== undefined);
      const p = table.row(prev)[token] ?? 0;
      assert.ok(
        Math.abs(Math.exp(e.logprob) - p) <= 1e-5 * p,
        `p(${e.token}) = ${Math.exp(e.logprob)}, table ${p}`,
      );
      assert.deepEqual(e.bytes, [...new TextEncoder().encode(e.token)]);
      assert.equal(e.top_logprobs.length, 3);
      const tops = e.top_logprobs.map((t) => t.logprob);
      assert.deepEqual(
        tops,
        [...tops].sort((a, b) => b - a),
      );
      assert.ok((tops[0] ?? 0) >= e.logprob);
      prev = token;
    }
    assert.equal(entries.map((e) => e.token).join(''), r.choices[0]?.message.content);
    const again = await client.chat.completions.create(req);
    assert.equal(
      again.choices[0]?.message.content,
      r.choices[0]?.message.content,
      'same seed, same text',
    );
  });

  it('gives n choices and ends a choice at a stop sequence', async () => {
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: user('hello'),
      n: 2,
      seed: 5,
      temperature: 1,
      max_tokens: 8,
    });
    assert.deepEqual(
      r.choices.map((c) => c.index),
      [0, 1],
    );
    assert.equal(r.usage?.completion_tokens, 16);
    const s = await client.chat.completions.create({
      model: MODEL,
      messages: user('hello'),
      stop: ['e'],
      temperature: 0,
      max_tokens: 20,
    });
    assert.equal(s.choices[0]?.message.content, greedyReply(20).split('e')[0]);
    assert.equal(s.choices[0]?.finish_reason, 'stop');
  });

  it('reuses a shared prompt prefix across requests (cached_tokens)', async () => {
    const system = `You are the night clerk of the yard. ${'Count every car twice. '.repeat(12)}`;
    const first = await client.chat.completions.create({
      model: MODEL,
      messages: [
        { role: 'system', content: system },
        { role: 'user', content: 'How many cars came in?' },
      ],
      max_tokens: 4,
    });
    const second = await client.chat.completions.create({
      model: MODEL,
      messages: [
        { role: 'system', content: system },
        { role: 'user', content: 'Which track is free?' },
      ],
      max_tokens: 4,
    });
    // Only <s> can be shared with what the slots held before.
    assert.ok((first.usage?.prompt_tokens_details?.cached_tokens ?? 0) <= 1);
    const cached = second.usage?.prompt_tokens_details?.cached_tokens ?? 0;
    assert.ok(cached >= table.tokenize(system).length, `cached ${cached}`);
    assert.ok(cached < (second.usage?.prompt_tokens ?? 0));
  });

  it('uses the prediction for speculative decoding and counts the accepted tokens', async () => {
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: user('Tell me about the river.'),
      max_tokens: 40,
      temperature: 0,
      prediction: { type: 'content', content: greedyReply(40) },
    });
    assert.equal(
      r.choices[0]?.message.content,
      greedyReply(40),
      'speculation never changes the output',
    );
    // OpenAI's counts: every predicted token appeared in the output.
    const d = r.usage?.completion_tokens_details;
    assert.equal(d?.accepted_prediction_tokens, r.usage?.completion_tokens, JSON.stringify(d));
    assert.equal(d?.rejected_prediction_tokens, 0);
    // A prediction with junk after the output: the junk is rejected, token for token.
    const junk = ' zq'.repeat(30);
    const j = await client.chat.completions.create({
      model: MODEL,
      messages: user('Tell me about the river.'),
      max_tokens: 40,
      temperature: 0,
      prediction: { type: 'content', content: greedyReply(40) + junk },
    });
    const jd = j.usage?.completion_tokens_details;
    assert.equal(jd?.accepted_prediction_tokens, j.usage?.completion_tokens);
    assert.ok((jd?.rejected_prediction_tokens ?? 0) >= 60, JSON.stringify(jd));
  });
});

describe('predictionCounts', () => {
  it('counts predicted tokens found in order in the output, and the rest', () => {
    assert.deepEqual(predictionCounts([1, 2, 3], [1, 2, 3]), { accepted: 3, rejected: 0 });
    assert.deepEqual(predictionCounts([1, 9, 2, 3], [1, 2, 3]), { accepted: 3, rejected: 1 });
    assert.deepEqual(predictionCounts([1, 2, 3], [1, 7, 7, 2, 3]), { accepted: 3, rejected: 0 });
    assert.deepEqual(predictionCounts([3, 2, 1], [1, 2, 3]), { accepted: 1, rejected: 2 });
    assert.deepEqual(predictionCounts([], [1]), { accepted: 0, rejected: 0 });
    // Beyond the 64-token lookahead a match is not looked for.
    const far = [...Array.from({ length: 100 }, () => 0), 5];
    assert.deepEqual(predictionCounts([5], far), { accepted: 0, rejected: 1 });
  });
});

describe('llama worker: structured output and tools', () => {
  it('json_object output parses', async () => {
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: user('Answer in JSON.'),
      response_format: { type: 'json_object' },
      temperature: 1,
      seed: 1,
      max_tokens: 1500,
    });
    assert.equal(r.choices[0]?.finish_reason, 'stop');
    const value: unknown = JSON.parse(r.choices[0]?.message.content ?? '');
    assert.equal(typeof value, 'object');
  });

  it('json_schema output parses and follows the schema', async () => {
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: user('Is the yard quiet?'),
      response_format: {
        type: 'json_schema',
        json_schema: {
          name: 'status',
          strict: true,
          schema: {
            type: 'object',
            properties: { quiet: { type: 'boolean' }, color: { enum: ['red', 'green'] } },
            required: ['quiet', 'color'],
            additionalProperties: false,
          },
        },
      },
      temperature: 0,
    });
    const value = JSON.parse(r.choices[0]?.message.content ?? '') as {
      quiet: unknown;
      color: unknown;
    };
    assert.equal(typeof value.quiet, 'boolean');
    assert.ok(['red', 'green'].includes(value.color as string));
  });

  it('never streams half of a character split across byte tokens', async () => {
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: user('Where do the workers eat?'),
      response_format: {
        type: 'json_schema',
        json_schema: {
          name: 'place',
          schema: {
            type: 'object',
            properties: { place: { enum: ['café', 'naïve café'] } },
            required: ['place'],
          },
        },
      },
      temperature: 0,
      logprobs: true,
      stream: true,
    });
    let text = '';
    const tokens: string[] = [];
    for await (const c of stream) {
      const content = c.choices[0]?.delta.content ?? '';
      assert.ok(!content.includes('\uFFFD'), `broken character in ${JSON.stringify(content)}`);
      text += content;
      for (const e of c.choices[0]?.logprobs?.content ?? []) tokens.push(e.token);
    }
    assert.ok(['café', 'naïve café'].includes((JSON.parse(text) as { place: string }).place));
    assert.ok(tokens.includes('bytes:\\xc3'), 'é arrived as two byte tokens');
  });

  it('calls a tool when required and continues after its result', async () => {
    const tools = [
      {
        type: 'function' as const,
        function: {
          name: 'get_weather',
          description: 'Weather of a city',
          parameters: {
            type: 'object',
            properties: {
              city: { enum: ['Lisbon', 'Porto'] },
              unit: { enum: ['celsius', 'fahrenheit'] },
            },
            required: ['city', 'unit'],
          },
        },
      },
    ];
    const messages: OpenAI.ChatCompletionMessageParam[] = user('What is the weather?');
    const r = await client.chat.completions.create({
      model: MODEL,
      messages,
      tools,
      tool_choice: 'required',
      temperature: 0,
    });
    const choice = r.choices[0];
    assert.equal(choice?.finish_reason, 'tool_calls');
    const call = choice?.message.tool_calls?.[0];
    assert.ok(call && call.type === 'function');
    assert.match(call.id, /^call_/);
    assert.equal(call.function.name, 'get_weather');
    const args = JSON.parse(call.function.arguments) as { city: string; unit: string };
    assert.ok(['Lisbon', 'Porto'].includes(args.city));
    assert.ok(choice?.message);
    const next = await client.chat.completions.create({
      model: MODEL,
      messages: [
        ...messages,
        choice.message,
        { role: 'tool', tool_call_id: call.id, content: '{"celsius": 21}' },
      ],
      tools,
      temperature: 0,
      max_tokens: 10,
    });
    assert.equal(typeof next.choices[0]?.message.content, 'string');
    assert.notEqual(next.choices[0]?.finish_reason, 'tool_calls');
  });
});

describe('llama worker: streamed tool calls', () => {
  it('streams a named tool call as id/name first, then argument pieces', async () => {
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: user('Which track?'),
      tools: [
        {
          type: 'function',
          function: {
            name: 'pick_track',
            parameters: {
              type: 'object',
              properties: { track: { enum: [1, 2, 3] }, urgent: { type: 'boolean' } },
              required: ['track', 'urgent'],
            },
          },
        },
        {
          type: 'function',
          function: { name: 'noop', parameters: { type: 'object', properties: {} } },
        },
      ],
      tool_choice: { type: 'function', function: { name: 'pick_track' } },
      temperature: 0,
      stream: true,
    });
    const deltas = [];
    let finish: string | null | undefined;
    for await (const c of stream) {
      for (const d of c.choices[0]?.delta.tool_calls ?? []) deltas.push(d);
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, 'tool_calls');
    const [first, ...rest] = deltas;
    assert.equal(first?.function?.name, 'pick_track');
    assert.match(first?.id ?? '', /^call_/);
    assert.equal(first?.type, 'function');
    const args = JSON.parse(rest.map((d) => d.function?.arguments ?? '').join('')) as {
      track: number;
    };
    assert.ok([1, 2, 3].includes(args.track));
  });
});

describe('llama worker: a tool call cut off by max_tokens', () => {
  it('is finish_reason length, with the same partial call streamed and not', async () => {
    const body = {
      model: MODEL,
      messages: user('Switch it.'),
      tools: [
        {
          type: 'function' as const,
          function: {
            name: 'toggle',
            parameters: {
              type: 'object',
              properties: { on: { type: 'boolean' }, label: { type: 'string' } },
              required: ['on', 'label'],
            },
          },
        },
      ],
      tool_choice: 'required' as const,
      parallel_tool_calls: false,
      temperature: 0,
      max_tokens: 8,
    };
    const whole = await client.chat.completions.create(body);
    const choice = whole.choices[0]!;
    assert.equal(choice.finish_reason, 'length');
    const call = choice.message.tool_calls?.[0];
    assert.ok(call && call.type === 'function', JSON.stringify(choice.message));
    assert.equal(call.function.name, 'toggle');
    assert.throws(() => JSON.parse(call.function.arguments), 'the arguments are cut off');

    const stream = await client.chat.completions.create({ ...body, stream: true });
    let args = '';
    let name: string | undefined;
    let finish: string | null | undefined;
    for await (const c of stream) {
      for (const d of c.choices[0]?.delta.tool_calls ?? []) {
        name ??= d.function?.name;
        args += d.function?.arguments ?? '';
      }
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, 'length');
    assert.equal(name, 'toggle');
    assert.equal(args, call.function.arguments, 'the same partial call');
  });
});

describe('llama worker: a forced call cut off before its arguments', () => {
  it('is that call with empty arguments and finish_reason length, streamed and not', async () => {
    const tools = [
      {
        type: 'function' as const,
        function: {
          name: 'toggle',
          parameters: { type: 'object', properties: { on: { type: 'boolean' } } },
        },
      },
      {
        type: 'function' as const,
        function: { name: 'noop', parameters: { type: 'object', properties: {} } },
      },
    ];
    for (const [tool_choice, offered] of [
      ['required', tools.slice(0, 1)],
      [{ type: 'function', function: { name: 'toggle' } }, tools],
    ] as const) {
      const body = {
        model: MODEL,
        messages: user('Switch it.'),
        tools: [...offered],
        tool_choice,
        temperature: 0,
        max_tokens: 1,
      };
      const whole = await client.chat.completions.create(body);
      const choice = whole.choices[0]!;
      assert.equal(choice.finish_reason, 'length');
      assert.equal(choice.message.content, null);
      const call = choice.message.tool_calls?.[0];
      assert.ok(call && call.type === 'function', JSON.stringify(choice.message));
      assert.equal(call.function.name, 'toggle');
      assert.match(call.id, /^call_/);
      assert.equal(call.function.arguments, '');

      const stream = await client.chat.completions.create({ ...body, stream: true });
      const names: string[] = [];
      let finish: string | null | undefined;
      for await (const c of stream) {
        for (const d of c.choices[0]?.delta.tool_calls ?? []) {
          if (d.function?.name) names.push(d.function.name);
        }
        finish = c.choices[0]?.finish_reason ?? finish;
      }
      assert.equal(finish, 'length');
      assert.deepEqual(names, ['toggle']);
    }
  });
});

describe('llama worker: a reply that fills the context', () => {
  it('parallel calls until the context is full: finish_reason length, not a 500', async () => {
    // No max_tokens: the rest of the window. The calls' own syntax, which LlamaChat
    // adds, is outside that budget; the context filled and could not shift.
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: user('hi'),
      tools: [
        {
          type: 'function',
          function: {
            name: 'f',
            parameters: { type: 'object', properties: { a: { type: 'string' } } },
          },
        },
      ],
      tool_choice: 'required',
      seed: 1,
    });
    const choice = r.choices[0]!;
    assert.equal(choice.finish_reason, 'length');
    assert.ok((choice.message.tool_calls?.length ?? 0) > 1, 'parallel calls, cut by the context');
    assert.ok(r.usage!.prompt_tokens + r.usage!.completion_tokens <= CONTEXT);
  });
});

describe('llama worker: errors, abort and endpoints', () => {
  it('answers a missing capability with a 400 naming the field', async () => {
    await expectError(
      {
        model: MODEL,
        messages: [
          {
            role: 'user',
            content: [
              { type: 'text', text: 'What is in this picture?' },
              { type: 'image_url', image_url: { url: 'https://example.com/yard.png' } },
            ],
          },
        ],
      },
      400,
      'model_capability_missing',
      'messages[0].content[1]',
    );
  });

  it('rejects invalid fields and oversize requests with exact token counts', async () => {
    await expectError(
      { model: MODEL, messages: user('hi'), temperature: 3 },
      400,
      'invalid_value',
      'temperature',
    );
    await assert.rejects(
      client.chat.completions.create({ model: MODEL, messages: user('hi'), max_tokens: 100_000 }),
      (err: unknown) => {
        assert.ok(err instanceof OpenAI.BadRequestError);
        assert.equal(err.code, 'context_length_exceeded');
        assert.match(err.message, new RegExp(`maximum context length is ${CONTEXT} tokens`));
        assert.match(err.message, /\(\d+ in the messages, 100000 in the completion\)/);
        assert.equal(err.param, 'max_tokens');
        return true;
      },
    );
    // The field the client used is the one named.
    await expectError(
      { model: MODEL, messages: user('hi'), max_completion_tokens: 100_000 },
      400,
      'context_length_exceeded',
      'max_completion_tokens',
    );
  });

  it('stops generating when the client disconnects', async () => {
    const before = await metrics();
    const ac = new AbortController();
    const stream = await client.chat.completions.create(
      {
        model: MODEL,
        messages: user('Talk for a long time.'),
        max_tokens: 4000,
        temperature: 0,
        stream: true,
      },
      { signal: ac.signal },
    );
    let seen = 0;
    for await (const _ of stream) {
      if (++seen === 3) {
        ac.abort();
        break;
      }
    }
    let m = await metrics();
    for (
      let i = 0;
      i < 200 &&
      (m.get('switchyard_llama_requests_aborted_total') ?? 0) <=
        (before.get('switchyard_llama_requests_aborted_total') ?? 0);
      i++
    ) {
      await delay(10);
      m = await metrics();
    }
    assert.equal(
      m.get('switchyard_llama_requests_aborted_total'),
      (before.get('switchyard_llama_requests_aborted_total') ?? 0) + 1,
    );
    assert.equal(m.get('llamacpp:requests_processing'), 0);
    const generated =
      (m.get('llamacpp:tokens_predicted_total') ?? 0) -
      (before.get('llamacpp:tokens_predicted_total') ?? 0);
    assert.ok(generated < 4000, `generation went on after the disconnect (${generated} tokens)`);
    // The slot is free again.
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: user('hi'),
      max_tokens: 2,
    });
    assert.equal(r.choices[0]?.finish_reason, 'length');
  });

  it('queues requests beyond its slots and serves them as slots free up', async () => {
    const start = () => {
      const ac = new AbortController();
      const res = fetch(`${worker.url}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: MODEL,
          messages: user('Count the cars.'),
          max_tokens: 3000,
          temperature: 0,
          stream: true,
        }),
        signal: ac.signal,
      });
      res.catch(() => undefined);
      return { ac, res };
    };
    const waitFor = async (cond: (m: Map<string, number>) => boolean, what: string) => {
      for (let i = 0; i < 500; i++) {
        if (cond(await metrics())) return;
        await delay(5);
      }
      assert.fail(`timed out waiting for ${what}`);
    };
    const running = [start(), start(), start()];
    await waitFor(
      (m) =>
        m.get('llamacpp:requests_processing') === 2 && m.get('llamacpp:requests_deferred') === 1,
      'two running and one deferred',
    );
    running[0]?.ac.abort();
    await waitFor(
      (m) =>
        m.get('llamacpp:requests_processing') === 2 && m.get('llamacpp:requests_deferred') === 0,
      'the deferred request to take the freed slot',
    );
    for (const r of running) r.ac.abort();
    await waitFor((m) => m.get('llamacpp:requests_processing') === 0, 'all slots to be free');
  });

  it('serves /v1/models, /health and llama.cpp-style /metrics', async () => {
    const models = await client.models.list();
    assert.equal(models.data[0]?.id, MODEL);
    const base = worker.url.replace(/\/v1$/, '');
    assert.equal((await fetch(`${base}/health`)).status, 200);
    const m = await metrics();
    for (const name of [
      'llamacpp:requests_processing',
      'llamacpp:requests_deferred',
      'llamacpp:kv_cache_usage_ratio',
    ]) {
      assert.ok(m.has(name), name);
    }
    const ratio = m.get('llamacpp:kv_cache_usage_ratio') ?? -1;
    assert.ok(ratio > 0 && ratio <= 1);
    const missing = await fetch(`${base}/v1/nothing`);
    assert.equal(missing.status, 404);
    assert.equal(
      ((await missing.json()) as { error: { code: string } }).error.code,
      'route_not_found',
    );
  });
});
