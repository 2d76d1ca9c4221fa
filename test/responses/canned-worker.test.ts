/**
 * The Responses API with the official OpenAI SDK, through the router to a worker of the
 * test's own that answers canned chat completions and records the bodies it gets: what
 * a Responses request becomes on the chat path (function tools' `strict`), and how
 * answers no `sim` worker gives (text and a refusal in one message) become Responses
 * output and events.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { listenWorker } from '../support/fake-worker.js';
import { startTestServer, type TestServer } from '../support/harness.js';

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
  'refusal then text': [
    delta({ role: 'assistant', refusal: 'Sorry.' }),
    delta({ content: ' Try again.' }, 'stop'),
    { ...head, choices: [], usage },
  ],
};

async function cannedWorker(bodies: Payload[]) {
  const server = http.createServer((req, res) => {
    let raw = '';
    req.setEncoding('utf8');
    req.on('data', (d: string) => (raw += d));
    req.on('end', () => {
      if (req.method !== 'POST') {
        res.end('');
        return;
      }
      const body = JSON.parse(raw) as Payload;
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
      res.end(chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join('') + 'data: [DONE]\n\n');
    });
  });
  return listenWorker(server);
}

describe('Responses API: canned worker answers', () => {
  let s: TestServer;
  let w: Awaited<ReturnType<typeof cannedWorker>>;
  let client: OpenAI;
  const bodies: Payload[] = [];
  before(async () => {
    s = await startTestServer();
    w = await cannedWorker(bodies);
    await s.admin('POST', '/models', {
      name: 'cm',
      context_window: 4096,
      capabilities: ['tool_calling', 'json_schema'],
    });
    await s.admin('POST', '/workers', { model: 'cm', tier: 'gpu', url: w.url, id: 'canned' });
    const p = await s.admin('POST', '/projects', { slug: 'can', name: 'Canned' });
    await s.admin('POST', '/projects/can/endpoints', {
      slug: 'chat',
      name: 'C',
      model: 'cm',
      tier: 'gpu',
    });
    const k = await s.admin('POST', '/projects/can/keys', { quotaRequests: 10_000 });
    client = new OpenAI({
      baseURL: `${s.url}/${String(p.body.id)}/chat/v1`,
      apiKey: String(k.body.key),
      maxRetries: 0,
    });
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
