/**
 * The Responses API with the official OpenAI SDK, through the router to a worker of the
 * test's own that answers canned chat completions and records the bodies it gets: what
 * a Responses request becomes on the chat path (function tools' `strict`), and how
 * answers no `sim` worker gives (text and a refusal in one message, a connection lost
 * mid-answer) become Responses output, events and stored responses.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { listenWorker, onPost } from '../support/fake-worker.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

type Payload = Record<string, unknown>;

const head = { id: 'chatcmpl-canned', object: 'chat.completion.chunk', created: 1, model: 'cm' };
const delta = (d: Payload, finish: string | null = null): Payload => ({
  ...head,
  choices: [{ index: 0, delta: d, finish_reason: finish }],
});
const usage = { prompt_tokens: 5, completion_tokens: 4, total_tokens: 9 };

/** The canned streams, picked by the input's text. */
const streams: Record<string, Payload[]> = {
  'text then refusal': [
    delta({ role: 'assistant', content: 'Well, ' }),
    delta({ content: 'no.' }),
    delta({ refusal: "I can't " }),
    delta({ refusal: 'help.' }, 'stop'),
    { ...head, choices: [], usage },
  ],
  'cut short': [delta({ role: 'assistant', content: 'Once upon' }), delta({ content: ' a time' })],
  'refusal then text': [
    delta({ role: 'assistant', refusal: 'Sorry.' }),
    delta({ content: ' Try again.' }, 'stop'),
    { ...head, choices: [], usage },
  ],
};

async function cannedWorker(bodies: Payload[]) {
  const server = http.createServer(
    onPost((received, res) => {
      const body = received as Payload;
      bodies.push(body);
      const messages = body.messages as Array<{ content: string }>;
      const chunks = streams[messages.at(-1)!.content];
      if (body.stream !== true || !chunks) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(
          JSON.stringify({
            ...head,
            object: 'chat.completion',
            choices: [
              { index: 0, finish_reason: 'stop', message: { role: 'assistant', content: 'ok' } },
            ],
            usage,
          }),
        );
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      if (messages.at(-1)!.content === 'cut short') {
        // Lost mid-answer: some text, then the connection drops.
        res.write(chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join(''));
        setTimeout(() => res.destroy(), 50);
        return;
      }
      res.end(chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join('') + 'data: [DONE]\n\n');
    }),
  );
  return listenWorker(server);
}

describe('Responses API: canned worker answers', () => {
  let s: TestServer;
  let w: Awaited<ReturnType<typeof cannedWorker>>;
  let client: OpenAI;
  let baseURL: string;
  let key: string;
  const bodies: Payload[] = [];
  before(async () => {
    s = await startTestServer();
    w = await cannedWorker(bodies);
    ({ baseURL, key } = await seedProject(s, {
      slug: 'can',
      model: 'cm',
      tier: 'gpu',
      capabilities: ['tool_calling', 'json_schema'],
      worker: { url: w.url, id: 'canned' },
      quotaRequests: 10_000,
    }));
    client = new OpenAI({ baseURL, apiKey: key, maxRetries: 0 });
  });
  after(async () => {
    await s.close();
    await w.close();
  });

  it('a function tool without strict is strict when its schema can be (OpenAI’s default), else not', async () => {
    const closed = {
      type: 'object',
      properties: { city: { type: 'string' }, days: { type: ['integer', 'null'] } },
      required: ['city', 'days'],
      additionalProperties: false,
    };
    const cases: Array<[string, Payload, boolean | undefined, boolean]> = [
      ['closed, strict omitted', closed, undefined, true],
      ['closed, strict null', closed, null as never, true],
      ['closed, strict false', closed, false, false],
      ['closed, strict true', closed, true, true],
      // Not every property required, or an object left open: not strict, as OpenAI falls back.
      ['optional property', { ...closed, required: ['city'] }, undefined, false],
      ['open object', { ...closed, additionalProperties: undefined }, undefined, false],
      [
        'open nested object',
        {
          ...closed,
          properties: { ...closed.properties, where: { type: 'object', properties: {} } },
          required: [...closed.required, 'where'],
        },
        undefined,
        false,
      ],
      // A constraint a worker's grammar may not enforce: not made strict unasked.
      [
        'pattern',
        {
          ...closed,
          properties: { ...closed.properties, city: { type: 'string', pattern: '^A' } },
        },
        undefined,
        false,
      ],
      [
        'format email',
        {
          ...closed,
          properties: { ...closed.properties, city: { type: 'string', format: 'email' } },
        },
        undefined,
        false,
      ],
      [
        'format date, and a property named pattern',
        {
          ...closed,
          properties: { city: { type: 'string', format: 'date' }, pattern: { type: 'string' } },
          required: ['city', 'pattern'],
        },
        undefined,
        true,
      ],
      [
        'required but not declared',
        { ...closed, required: [...closed.required, 'x'] },
        undefined,
        false,
      ],
    ];
    for (const [what, parameters, strict, expected] of cases) {
      bodies.length = 0;
      const tool = {
        type: 'function' as const,
        name: 'get_weather',
        parameters,
        ...(strict !== undefined ? { strict } : {}),
      };
      const r = await client.responses.create({ model: 'x', input: 'hi', tools: [tool as never] });
      assert.equal((r.tools[0] as { strict: unknown }).strict, expected, what);
      const sent = (bodies[0]!.tools as Array<{ function: { strict?: unknown } }>)[0]!;
      assert.equal(sent.function.strict, expected, what);
      // Stored as answered.
      const again = await client.responses.retrieve(r.id);
      assert.equal((again.tools[0] as { strict: unknown }).strict, expected, what);
    }
  });

  for (const [input, parts] of [
    [
      'text then refusal',
      [
        { type: 'output_text', text: 'Well, no.' },
        { type: 'refusal', refusal: "I can't help." },
      ],
    ],
    [
      'refusal then text',
      [
        { type: 'refusal', refusal: 'Sorry.' },
        { type: 'output_text', text: ' Try again.' },
      ],
    ],
  ] as const) {
    it(`a stream of ${input} is one message item with both parts, as OpenAI's`, async () => {
      const stream = client.responses.stream({ model: 'x', input });
      const events: Array<Payload & { type: string }> = [];
      for await (const ev of stream) events.push(ev as unknown as Payload & { type: string });
      const final = await stream.finalResponse();
      const types = events.map((e) => e.type);
      assert.deepEqual(
        events.map((e) => e.sequence_number),
        events.map((_, i) => i),
      );
      assert.equal(types.filter((t) => t === 'response.output_item.added').length, 1);
      assert.equal(types.filter((t) => t === 'response.output_item.done').length, 1);
      // Each part opens, streams and closes at its own content_index of output 0.
      const partEvents = events.filter((e) => 'content_index' in e);
      assert.ok(partEvents.every((e) => e.output_index === 0));
      const kind = (i: number) => (parts[i]!.type === 'output_text' ? 'output_text' : 'refusal');
      const at = (i: number) => partEvents.filter((e) => e.content_index === i).map((e) => e.type);
      for (const i of [0, 1]) {
        const seen = at(i);
        assert.equal(seen[0], 'response.content_part.added');
        assert.ok(seen.slice(1, -2).every((t) => t === `response.${kind(i)}.delta`));
        assert.deepEqual(seen.slice(-2), [
          `response.${kind(i)}.done`,
          'response.content_part.done',
        ]);
      }
      assert.equal(types.at(-1), 'response.completed');
      const output = (events.at(-1)!.response as { output: Array<{ content: Payload[] }> }).output;
      assert.equal(output.length, 1);
      const done = events.find((e) => e.type === 'response.output_item.done')!;
      assert.deepEqual(done.item, output[0]);
      const bare = (p: Payload) =>
        p.type === 'output_text'
          ? { type: p.type, text: p.text }
          : { type: p.type, refusal: p.refusal };
      assert.deepEqual(output[0]!.content.map(bare), parts);
      // The SDK's accumulator agrees, and it is stored as streamed.
      assert.equal(final.output.length, 1);
      const msg = final.output[0]!;
      assert.ok(msg.type === 'message');
      assert.deepEqual((msg.content as unknown as Payload[]).map(bare), parts);
      const stored = await client.responses.retrieve(final.id);
      assert.deepEqual(stored.output, output);
    });
  }

  it('a stream lost mid-answer is stored failed, with its error and what had streamed', async () => {
    const res = await fetch(`${baseURL}/responses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'x', input: 'cut short', stream: true }),
    });
    const events = (await res.text())
      .split('\n\n')
      .filter(Boolean)
      .map((block) => JSON.parse(block.split('\ndata: ')[1]!) as Payload & { type: string });
    assert.deepEqual(
      events.slice(-2).map((e) => e.type),
      ['error', 'response.failed'],
    );
    const failed = events.at(-1)!.response as { id: string; error: { code: string } };
    const stored = await client.responses.retrieve(failed.id);
    assert.equal(stored.status, 'failed');
    assert.deepEqual(stored.error, failed.error);
    assert.equal(typeof stored.error?.message, 'string');
    const item = stored.output[0]!;
    assert.ok(item.type === 'message');
    assert.equal(item.status, 'incomplete');
    assert.deepEqual(
      item.content.map((p) => (p.type === 'output_text' ? p.text : null)),
      ['Once upon a time'],
    );
  });

  it('strict: true on a schema that cannot be strict is 400 naming it, and runs nothing', async () => {
    bodies.length = 0;
    const err = await client.responses
      .create({
        model: 'x',
        input: 'hi',
        tools: [
          {
            type: 'function',
            name: 'get_weather',
            parameters: { type: 'object', properties: { city: { type: 'string' } } },
            strict: true,
          },
        ],
      })
      .then(
        () => null,
        (e: unknown) => e,
      );
    assert.ok(err instanceof OpenAI.BadRequestError, String(err));
    assert.equal(err.code, 'invalid_value');
    assert.equal(err.param, 'tools[0].parameters');
    assert.equal(bodies.length, 0);
  });
});
