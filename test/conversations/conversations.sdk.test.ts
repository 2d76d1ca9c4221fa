/**
 * The Conversations API with the official OpenAI SDK, and responses made in a
 * conversation: the history goes to the worker, the turn joins the conversation.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, beforeEach, describe, it } from 'node:test';
import OpenAI from 'openai';
import { tables } from '../../src/store/index.js';
import {
  inferenceEndpoint,
  inferenceFixture,
  until,
  type InferenceFixture,
} from '../support/inference.js';
import { seedProject } from '../support/harness.js';

describe('Conversations API', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture();
  });
  after(() => f.close());
  // The shared management limit is 60 a minute: each test starts a new minute.
  beforeEach(() => f.server.clock.advance(61_000));

  it('creates, reads, updates and deletes a conversation with its items', async () => {
    const conv = await f.client.conversations.create({
      metadata: { topic: 'demo' },
      items: [
        { type: 'message', role: 'user', content: 'Hello!' },
        { role: 'assistant', content: 'Hi, how can I help?' },
      ],
    });
    assert.match(conv.id, /^conv_[0-9a-f]{48}$/);
    assert.equal(conv.object, 'conversation');
    assert.deepEqual(conv.metadata, { topic: 'demo' });
    assert.deepEqual(await f.client.conversations.retrieve(conv.id), conv);

    const listed = await f.client.conversations.items.list(conv.id, { order: 'asc' });
    assert.equal(listed.data.length, 2);
    const [first, second] = listed.data as Array<{
      id: string;
      type: string;
      role: string;
      content: Array<{ type: string; text: string }>;
    }>;
    assert.equal(first!.type, 'message');
    assert.equal(first!.role, 'user');
    assert.deepEqual(first!.content, [{ type: 'input_text', text: 'Hello!' }]);
    assert.deepEqual(second!.content, [{ type: 'output_text', text: 'Hi, how can I help?' }]);
    const desc = await f.client.conversations.items.list(conv.id);
    assert.deepEqual(
      desc.data.map((i) => (i as { id: string }).id),
      [second!.id, first!.id],
    );

    const added = await f.client.conversations.items.create(conv.id, {
      items: [{ type: 'message', role: 'user', content: 'One more.' }],
    });
    assert.equal(added.data.length, 1);
    const addedId = (added.data[0] as { id: string }).id;
    const got = await f.client.conversations.items.retrieve(addedId, {
      conversation_id: conv.id,
    });
    assert.equal((got as { id: string }).id, addedId);
    // Paging with `after`.
    const page = await f.client.conversations.items.list(conv.id, {
      order: 'asc',
      limit: 2,
      after: first!.id,
    });
    assert.deepEqual(
      page.data.map((i) => (i as { id: string }).id),
      [second!.id, addedId],
    );

    const updated = await f.client.conversations.update(conv.id, { metadata: { topic: 'x' } });
    assert.deepEqual(updated.metadata, { topic: 'x' });
    const afterDelete = await f.client.conversations.items.delete(addedId, {
      conversation_id: conv.id,
    });
    assert.equal(afterDelete.id, conv.id);
    assert.equal((await f.client.conversations.items.list(conv.id)).data.length, 2);

    const deleted = await f.client.conversations.delete(conv.id);
    assert.deepEqual(deleted, { id: conv.id, object: 'conversation.deleted', deleted: true });
    const gone = await f.client.conversations.retrieve(conv.id).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(gone instanceof OpenAI.NotFoundError);
    assert.equal((gone as { code: string }).code, 'conversation_not_found');

    const events = await f.server.services.store.db.select().from(tables.events);
    const types = events.map((e) => e.type);
    assert.ok(types.includes('conversation.created'));
    assert.ok(types.includes('conversation.deleted'));
  });

  it('rejects bad bodies naming the field', async () => {
    const bad: Array<[unknown, string, string]> = [
      [{ items: [{ role: 'robot', content: 'x' }] }, 'invalid_value', 'items[0].role'],
      [{ items: [{ type: 'web_search_call' }] }, 'unsupported_value', 'items[0].type'],
      [
        { items: Array.from({ length: 21 }, () => ({ role: 'user', content: 'x' })) },
        'invalid_value',
        'items',
      ],
      [{ metadata: { k: 'v'.repeat(513) } }, 'invalid_value', 'metadata.k'],
      // OpenAI's codes, as on every OpenAI-shaped route: a wrong type is invalid_type.
      [{ metadata: 'x' }, 'invalid_type', 'metadata'],
      [{ items: [{ role: 'user', content: 5 }] }, 'invalid_type', 'items[0].content'],
      [{ items: [{ content: 'x' }] }, 'missing_required_parameter', 'items[0].role'],
    ];
    for (const [body, code, param] of bad) {
      const err = await f.client.conversations.create(body as never).then(
        () => null,
        (e: unknown) => e,
      );
      assert.ok(err instanceof OpenAI.BadRequestError, JSON.stringify(body).slice(0, 80));
      assert.equal(err.code, code, JSON.stringify(body).slice(0, 80));
      assert.equal(err.param, param);
    }
    const conv = await f.client.conversations.create({});
    const none = await f.client.conversations.items.create(conv.id, {} as never).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(none instanceof OpenAI.BadRequestError);
    assert.deepEqual([none.code, none.param], ['missing_required_parameter', 'items']);
    const gone = await f.client.conversations.items
      .retrieve('msg_nope', { conversation_id: conv.id })
      .then(
        () => null,
        (e: unknown) => e,
      );
    assert.ok(gone instanceof OpenAI.NotFoundError);
    assert.equal(gone.code, 'item_not_found');
  });

  it('another project sees none of it', async () => {
    const conv = await f.client.conversations.create({});
    const other = await seedProject(f.server, { slug: 'elsewhere' });
    const theirs = new OpenAI({
      baseURL: `${f.server.url}/${other.projectId}/main/v1`,
      apiKey: other.key,
      maxRetries: 0,
    });
    const err = await theirs.conversations.retrieve(conv.id).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(err instanceof OpenAI.NotFoundError);
  });

  it("a key bound to an endpoint sees only its endpoint's conversations", async () => {
    const bound = async (slug: string) => {
      const endpointId = await inferenceEndpoint(f, slug);
      const k = await f.server.admin('POST', '/projects/inf/keys', {
        scopes: ['inference'],
        endpointId,
      });
      assert.equal(k.status, 201, k.text);
      return new OpenAI({
        baseURL: `${f.server.url}/${f.projectId}/${slug}/v1`,
        apiKey: String(k.body.key),
        maxRetries: 0,
      });
    };
    const one = await bound('conv-one');
    const two = await bound('conv-two');
    // A turn made through endpoint two, in a conversation made there.
    const conv = await two.conversations.create({});
    const turn = await two.responses.create({
      model: 'x',
      input: 'two-only words',
      conversation: conv.id,
      max_output_tokens: 16,
    });
    assert.notEqual(turn.status, 'failed');
    assert.equal((await two.conversations.items.list(conv.id)).data.length, 2);
    // Endpoint one's key finds nothing, whichever way it asks.
    const missing = async (p: Promise<unknown>) => {
      const e = await p.then(
        () => null,
        (x: unknown) => x,
      );
      assert.ok(e instanceof OpenAI.NotFoundError, String(e));
    };
    await missing(one.conversations.retrieve(conv.id));
    await missing(one.conversations.items.list(conv.id));
    await missing(one.conversations.update(conv.id, { metadata: { k: 'v' } }));
    await missing(
      one.conversations.items.create(conv.id, { items: [{ role: 'user', content: 'x' }] }),
    );
    await missing(one.conversations.delete(conv.id));
    const reuse = await one.responses
      .create({ model: 'x', input: 'hi', conversation: conv.id, max_output_tokens: 16 })
      .then(
        () => null,
        (e: unknown) => e,
      );
    assert.ok(reuse instanceof OpenAI.BadRequestError);
    assert.equal(reuse.param, 'conversation');
    // Its own conversations it uses; the unbound key sees both endpoints'.
    const mine = await one.conversations.create({ metadata: { by: 'one' } });
    assert.deepEqual((await one.conversations.retrieve(mine.id)).metadata, { by: 'one' });
    await missing(two.conversations.retrieve(mine.id));
    assert.equal((await f.client.conversations.items.list(conv.id)).data.length, 2);
    assert.equal((await f.client.conversations.retrieve(mine.id)).id, mine.id);
    // One made under the project alias (unbound keys only) is no bound key's.
    const alias = await new OpenAI({
      baseURL: `${f.server.url}/${f.projectId}/v1`,
      apiKey: f.key,
      maxRetries: 0,
    }).conversations.create({});
    await missing(one.conversations.retrieve(alias.id));
    assert.equal((await f.client.conversations.retrieve(alias.id)).id, alias.id);
    // An unbound key's response through another endpoint does not carry that endpoint's
    // turn into endpoint two's conversation (where two's key would read it)...
    const turnOf = (conversation: string) =>
      f.client.responses
        .create({ model: 'x', input: 'hi', conversation, max_output_tokens: 16 })
        .then(
          (r) => r,
          (e: unknown) => e,
        );
    const across = await turnOf(conv.id);
    assert.ok(across instanceof OpenAI.BadRequestError, String(across));
    assert.equal(across.param, 'conversation');
    assert.equal((await two.conversations.items.list(conv.id)).data.length, 2);
    // ...while the project alias's conversations take turns through any endpoint.
    const aliasTurn = await turnOf(alias.id);
    assert.ok(!(aliasTurn instanceof Error), String(aliasTurn));
  });

  it('responses in a conversation: the history reaches the worker, each turn is added', async () => {
    const conv = await f.client.conversations.create({
      items: [{ role: 'user', content: 'My name is Ada.' }],
    });
    const r1 = await f.client.responses.create({
      model: 'x',
      conversation: conv.id,
      input: 'What is my name?',
      max_output_tokens: 16,
    });
    assert.deepEqual((r1 as unknown as { conversation: unknown }).conversation, { id: conv.id });
    const items = await f.client.conversations.items.list(conv.id, { order: 'asc' });
    const kinds = items.data.map((i) => {
      const it = i as { type: string; role?: string };
      return `${it.type}:${it.role ?? ''}`;
    });
    assert.deepEqual(kinds, ['message:user', 'message:user', 'message:assistant']);
    const answer = items.data[2] as { id: string; content: Array<{ text: string }> };
    assert.equal(answer.id, r1.output[0]!.id);
    assert.equal(answer.content[0]!.text, r1.output_text);

    // The second turn's prompt holds the whole conversation: more input tokens.
    const r2 = await f.client.responses.create({
      model: 'x',
      conversation: { id: conv.id },
      input: 'And again?',
      max_output_tokens: 16,
    });
    assert.ok(r2.usage!.input_tokens > r1.usage!.input_tokens + r1.usage!.output_tokens - 1);
    assert.equal((await f.client.conversations.items.list(conv.id)).data.length, 5);

    const both = await f.client.responses
      .create({ model: 'x', conversation: conv.id, previous_response_id: r1.id, input: 'x' })
      .then(
        () => null,
        (e: unknown) => e,
      );
    assert.ok(both instanceof OpenAI.BadRequestError);
    assert.equal(both.param, 'conversation');
    const unknown = await f.client.responses
      .create({ model: 'x', conversation: 'conv_nope', input: 'x' })
      .then(
        () => null,
        (e: unknown) => e,
      );
    assert.ok(unknown instanceof OpenAI.BadRequestError);
    assert.equal(unknown.param, 'conversation');
  });
});

describe('Conversations API: a conversation deleted while a response in it runs', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({ simOnFakeClock: true, sim: { ttftMs: 5_000 } });
  });
  after(() => f.close());

  it('the response made meanwhile is still answered, stored and its event written', async () => {
    for (const stream of [false, true]) {
      const conv = await f.client.conversations.create({});
      const running = f.worker.stats().running;
      const pending = stream
        ? (async () => {
            const s = f.client.responses.stream({
              model: 'x',
              input: 'hi',
              conversation: conv.id,
              max_output_tokens: 16,
            });
            return s.finalResponse();
          })()
        : f.client.responses.create({
            model: 'x',
            input: 'hi',
            conversation: conv.id,
            max_output_tokens: 16,
          });
      const outcome = (pending as Promise<{ id: string }>).then(
        (r) => r,
        (e: unknown) => (e instanceof Error ? e : new Error(String(e))),
      );
      await until(() => f.worker.stats().running > running, 'the worker to start');
      await f.client.conversations.delete(conv.id);
      f.server.clock.advance(6_000);
      const r = await outcome;
      if (r instanceof Error) assert.fail(`stream ${stream}: ${String(r)}`);
      // The answer the worker made (and the project paid for) is not lost.
      assert.equal((await f.client.responses.retrieve(r.id)).id, r.id);
      const events = await f.server.services.store.db.select().from(tables.events);
      assert.ok(
        events.some((e) => e.type === 'response.completed' && e.body.includes(r.id)),
        `stream ${stream}: no response.completed event`,
      );
    }
  });
});

describe('Conversations API on PostgreSQL', { skip: !process.env.TEST_DATABASE_URL }, () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({ driver: 'postgres' });
  });
  after(() => f.close());

  it('concurrent appends to one conversation keep each request’s items together, in order', async () => {
    f.server.clock.advance(61_000);
    const conv = await f.client.conversations.create({});
    const requests = 10;
    const per = 20;
    // Big items (random, so incompressible) take each row a while to write: appends that
    // run at once then overlap for certain, and without the conversation's lock their
    // rows draw `seq` in turn from the one sequence and interleave.
    const filler = () => randomBytes(40_000).toString('base64');
    await Promise.all(
      Array.from({ length: requests }, (_, r) =>
        f.client.conversations.items.create(conv.id, {
          items: Array.from({ length: per }, (_, i) => ({
            type: 'message' as const,
            role: 'user' as const,
            content: `${r}:${i}:${filler()}`,
          })),
        }),
      ),
    );
    const texts: string[] = [];
    for await (const item of f.client.conversations.items.list(conv.id, {
      order: 'asc',
      limit: 100,
    })) {
      const text = (item as { content: Array<{ text: string }> }).content[0]!.text;
      texts.push(text.split(':').slice(0, 2).join(':'));
    }
    assert.equal(texts.length, requests * per);
    // Each request's items one run, 0..19, whatever order the requests landed in.
    for (let at = 0; at < texts.length; at += per) {
      const r = texts[at]!.split(':')[0];
      assert.deepEqual(
        texts.slice(at, at + per),
        Array.from({ length: per }, (_, i) => `${r}:${i}`),
        `run at ${at}`,
      );
    }
  });
});
