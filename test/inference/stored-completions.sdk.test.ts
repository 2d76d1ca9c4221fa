/**
 * Stored chat completions (`store: true`) with the official OpenAI SDK, through the
 * router to a `sim` worker: a stored completion reads back as the client got it
 * (plain, streamed, streamed tool calls), list with its filters, pages and order,
 * metadata updates, deletion, the request messages, nothing stored without `store`,
 * other projects' and other endpoints' completions invisible, a U+0000 stored as
 * U+FFFD, and the errors naming the field.
 */
import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, it } from 'node:test';
import OpenAI from 'openai';
import { tables } from '../../src/store/index.js';
import {
  apiError,
  inferenceFixture,
  weatherTool,
  type InferenceFixture,
} from '../support/inference.js';

const weather = weatherTool;

describe('stored chat completions', () => {
  let f: InferenceFixture;
  /** The stored rows written so far (pending writes finished first). */
  const stored = async () => {
    await f.server.services.completions.flush();
    return f.server.services.store.db.select().from(tables.chatCompletions);
  };
  const create = (content: string, extra: Record<string, unknown> = {}) =>
    f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content }],
      max_tokens: 8,
      store: true,
      ...extra,
    });

  before(async () => {
    f = await inferenceFixture();
  });
  after(() => f.close());
  // The key's quota and the project's management limit (60 a minute each) start afresh.
  beforeEach(() => f.server.clock.advance(61_000));

  it('stores a completion as the client got it, with its metadata', async () => {
    const { data: c, response } = await f.client.chat.completions
      .create({
        model: 'anything',
        messages: [
          { role: 'system', content: 'Be brief.' },
          { role: 'user', content: 'Hello there' },
        ],
        max_tokens: 12,
        store: true,
        metadata: { run: 'plain', team: 'a' },
      })
      .withResponse();
    assert.equal(c.id, response.headers.get('x-request-id'));
    await f.server.services.completions.flush();
    const again = await f.client.chat.completions.retrieve(c.id);
    assert.deepEqual(again, { ...c, metadata: { run: 'plain', team: 'a' } });
    // Without metadata: an empty object.
    const bare = await create('No metadata');
    await f.server.services.completions.flush();
    assert.deepEqual(await f.client.chat.completions.retrieve(bare.id), { ...bare, metadata: {} });
  });

  it('stores a streamed completion as the client assembled it', async () => {
    const stream = f.client.chat.completions.stream({
      model: 'x',
      messages: [{ role: 'user', content: 'Tell a story [sim:len=20]' }],
      max_tokens: 30,
      store: true,
      metadata: { run: 'stream' },
      stream_options: { include_usage: true },
    });
    let text = '';
    let usage: OpenAI.CompletionUsage | null | undefined;
    let fingerprint: string | null | undefined;
    let created = 0;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
      fingerprint = chunk.system_fingerprint;
      created = chunk.created;
    }
    const final = await stream.finalChatCompletion();
    assert.ok(text.length > 0);
    assert.equal(final.choices[0]!.message.content, text);
    await f.server.services.completions.flush();
    const got = await f.client.chat.completions.retrieve(final.id);
    assert.equal(got.id, final.id);
    assert.equal(got.object, 'chat.completion');
    assert.equal(got.created, created);
    assert.equal(got.model, 'sim-model');
    assert.equal(got.service_tier, 'cpu' as never);
    assert.equal(got.system_fingerprint, fingerprint);
    assert.deepEqual(got.usage, usage);
    assert.equal(got.choices.length, 1);
    const choice = got.choices[0]!;
    assert.equal(choice.index, 0);
    assert.equal(choice.finish_reason, final.choices[0]!.finish_reason);
    assert.deepEqual(choice.message, {
      role: 'assistant',
      content: text,
      refusal: null,
      tool_calls: null,
      annotations: [],
    });
    assert.equal(choice.logprobs, null);
    assert.deepEqual((got as unknown as { metadata: unknown }).metadata, { run: 'stream' });
  });

  it('stores streamed tool calls as the SDK’s accumulator built them; usage without include_usage', async () => {
    const stream = f.client.chat.completions.stream({
      model: 'x',
      messages: [
        { role: 'user', content: 'Weather in Paris and Rome? [sim:tool_call] [sim:parallel]' },
      ],
      tools: [weather],
      store: true,
    });
    const final = await stream.finalChatCompletion();
    const calls = final.choices[0]!.message.tool_calls!;
    assert.ok(calls.length >= 1);
    await f.server.services.completions.flush();
    const got = await f.client.chat.completions.retrieve(final.id);
    const message = got.choices[0]!.message;
    assert.equal(got.choices[0]!.finish_reason, 'tool_calls');
    assert.equal(message.content, null);
    assert.deepEqual(
      message.tool_calls,
      calls.map((t) => {
        assert.equal(t.type, 'function');
        return {
          id: t.id,
          type: 'function',
          function: { name: t.function.name, arguments: t.function.arguments },
        };
      }),
    );
    // The client did not ask for usage; the stored completion has the stream's count.
    assert.ok(got.usage!.completion_tokens > 0);
    assert.equal(got.usage!.total_tokens, got.usage!.prompt_tokens + got.usage!.completion_tokens);
  });

  it('stores nothing when store is absent or false, or when the request failed', async () => {
    const before = (await stored()).length;
    const a = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 4,
    });
    const b = await create('hi', { store: false });
    const s = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 4,
      stream: true,
    });
    let sid = '';
    for await (const chunk of s) sid = chunk.id;
    // Refused before any worker saw it.
    const refused = await apiError(create('hi', { temperature: 5 }));
    assert.equal(refused.status, 400);
    assert.equal((await stored()).length, before);
    for (const id of [a.id, b.id, sid]) {
      const err = await apiError(f.client.chat.completions.retrieve(id));
      assert.ok(err instanceof OpenAI.NotFoundError);
      assert.equal(err.code, 'chat_completion_not_found');
    }
  });

  it('lists with model and metadata filters, pages and order', async () => {
    await f.server.services.store.db.delete(tables.chatCompletions);
    const made: string[] = [];
    for (let i = 0; i < 5; i++) {
      const c = await create(`list ${i}`, {
        metadata: { batch: 'L', parity: i % 2 === 0 ? 'even' : 'odd', n: String(i) },
      });
      made.push(c.id);
      // Stored one after the other: the list's order is the order they were stored in.
      await f.server.services.completions.flush();
    }
    const other = await create('not in the batch', { metadata: { batch: 'M' } });
    await f.server.services.completions.flush();

    const all = await f.client.chat.completions.list({ metadata: { batch: 'L' } });
    assert.deepEqual(
      all.data.map((c) => c.id),
      made,
    );
    assert.equal(all.has_more, false);
    const res = await fetch(`${f.baseURL}/chat/completions?metadata%5Bbatch%5D=L&limit=3`, {
      headers: { authorization: `Bearer ${f.key}` },
    });
    const raw = (await res.json()) as Record<string, unknown>;
    assert.deepEqual(Object.keys(raw), ['object', 'data', 'first_id', 'last_id', 'has_more']);
    assert.equal(raw.object, 'list');
    assert.equal(raw.first_id, made[0]);
    assert.equal(raw.last_id, made[2]);
    assert.equal(raw.has_more, true);

    const even = await f.client.chat.completions.list({ metadata: { batch: 'L', parity: 'even' } });
    assert.deepEqual(
      even.data.map((c) => c.id),
      [made[0], made[2], made[4]],
    );
    assert.deepEqual((even.data[1] as unknown as { metadata: unknown }).metadata, {
      batch: 'L',
      parity: 'even',
      n: '2',
    });

    const everything = await f.client.chat.completions.list();
    assert.deepEqual(
      everything.data.map((c) => c.id),
      [...made, other.id],
    );
    // A key holding brackets is matched as the SDK sent it (`metadata[a]b[c]]=v`).
    const bracketed = await create('brackets', { metadata: { 'a]b[c]': 'v' } });
    await f.server.services.completions.flush();
    const byBrackets = await f.client.chat.completions.list({ metadata: { 'a]b[c]': 'v' } });
    assert.deepEqual(
      byBrackets.data.map((c) => c.id),
      [bracketed.id],
    );
    await f.client.chat.completions.delete(bracketed.id);
    assert.equal((await f.client.chat.completions.list({ model: 'sim-model' })).data.length, 6);
    assert.equal((await f.client.chat.completions.list({ model: 'other-model' })).data.length, 0);

    const first = await f.client.chat.completions.list({ metadata: { batch: 'L' }, limit: 2 });
    assert.deepEqual(
      first.data.map((c) => c.id),
      made.slice(0, 2),
    );
    assert.equal(first.has_more, true);
    // The SDK follows `after` = the last id through every page.
    const paged: string[] = [];
    for await (const c of f.client.chat.completions.list({ metadata: { batch: 'L' }, limit: 2 })) {
      paged.push(c.id);
    }
    assert.deepEqual(paged, made);

    const desc = await f.client.chat.completions.list({
      metadata: { batch: 'L' },
      order: 'desc',
      limit: 3,
    });
    assert.deepEqual(
      desc.data.map((c) => c.id),
      [made[4], made[3], made[2]],
    );
    const next = await f.client.chat.completions.list({
      metadata: { batch: 'L' },
      order: 'desc',
      after: made[2],
    });
    assert.deepEqual(
      next.data.map((c) => c.id),
      [made[1], made[0]],
    );
  });

  it('updates metadata only; validates it as OpenAI does', async () => {
    const c = await create('update me', { metadata: { a: '1' } });
    await f.server.services.completions.flush();
    const updated = await f.client.chat.completions.update(c.id, { metadata: { b: '2' } });
    assert.deepEqual(updated, { ...c, metadata: { b: '2' } });
    assert.deepEqual(await f.client.chat.completions.retrieve(c.id), {
      ...c,
      metadata: { b: '2' },
    });
    const cleared = await f.client.chat.completions.update(c.id, { metadata: null });
    assert.deepEqual((cleared as unknown as { metadata: unknown }).metadata, {});

    const post = (body: unknown) =>
      f.client.post(`/chat/completions/${c.id}`, { body }) as Promise<unknown>;
    const cases: Array<[unknown, string, string]> = [
      [{}, 'missing_required_parameter', 'metadata'],
      [{ metadata: 'x' }, 'invalid_type', 'metadata'],
      [{ metadata: { k: 5 } }, 'invalid_type', 'metadata.k'],
      [{ metadata: { k: 'v'.repeat(513) } }, 'invalid_value', 'metadata.k'],
      [
        { metadata: Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, 'v'])) },
        'invalid_value',
        'metadata',
      ],
      [{ metadata: {}, model: 'other' }, 'invalid_value', 'model'],
    ];
    for (const [body, code, param] of cases) {
      const err = await apiError(post(body));
      assert.equal(err.status, 400, JSON.stringify(body));
      assert.equal(err.code, code, JSON.stringify(body));
      assert.equal(err.param, param, JSON.stringify(body));
    }
    const long = await apiError(
      f.client.chat.completions.update(c.id, { metadata: { ['k'.repeat(65)]: 'v' } }),
    );
    assert.equal(long.code, 'invalid_value');
    assert.match(String(long.param), /^metadata/);
    // 16 pairs, a 64-character key and a 512-character value are allowed.
    const most = Object.fromEntries(Array.from({ length: 15 }, (_, i) => [`k${i}`, 'v']));
    most['k'.repeat(64)] = 'v'.repeat(512);
    const ok = await f.client.chat.completions.update(c.id, { metadata: most });
    assert.deepEqual((ok as unknown as { metadata: unknown }).metadata, most);
    const missing = await apiError(
      f.client.chat.completions.update('chatcmpl-nope', { metadata: {} }),
    );
    assert.equal(missing.status, 404);
    assert.equal(missing.code, 'chat_completion_not_found');
  });

  it('deletes a stored completion', async () => {
    const c = await create('delete me');
    await f.server.services.completions.flush();
    const deleted = await f.client.chat.completions.delete(c.id);
    assert.deepEqual(deleted, { object: 'chat.completion.deleted', id: c.id, deleted: true });
    for (const call of [
      () => f.client.chat.completions.retrieve(c.id),
      () => f.client.chat.completions.delete(c.id),
      () => f.client.chat.completions.messages.list(c.id),
    ]) {
      const err = await apiError(call());
      assert.ok(err instanceof OpenAI.NotFoundError);
      assert.equal(err.code, 'chat_completion_not_found');
    }
    const list = await f.client.chat.completions.list({ limit: 100 });
    assert.ok(!list.data.some((x) => x.id === c.id));
  });

  it('lists the request messages with their ids, paged and ordered', async () => {
    const c = await f.client.chat.completions.create({
      model: 'x',
      messages: [
        { role: 'system', content: 'Be brief.' },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'Hello ' },
            { type: 'text', text: 'you' },
          ],
        },
        { role: 'assistant', content: 'Hi.' },
        { role: 'user', content: 'How are you?', name: 'ann' },
      ],
      max_tokens: 4,
      store: true,
    });
    await f.server.services.completions.flush();
    const page = await f.client.chat.completions.messages.list(c.id);
    assert.deepEqual(page.data, [
      { id: `${c.id}-0`, role: 'system', content: 'Be brief.', content_parts: null },
      {
        id: `${c.id}-1`,
        role: 'user',
        content: 'Hello you',
        content_parts: [
          { type: 'text', text: 'Hello ' },
          { type: 'text', text: 'you' },
        ],
      },
      { id: `${c.id}-2`, role: 'assistant', content: 'Hi.', content_parts: null },
      {
        id: `${c.id}-3`,
        role: 'user',
        content: 'How are you?',
        name: 'ann',
        content_parts: null,
      },
    ]);
    assert.equal(page.has_more, false);
    const ids: string[] = [];
    for await (const m of f.client.chat.completions.messages.list(c.id, { limit: 1 })) {
      ids.push(m.id);
    }
    assert.deepEqual(
      ids,
      [0, 1, 2, 3].map((i) => `${c.id}-${i}`),
    );
    const desc = await f.client.chat.completions.messages.list(c.id, { order: 'desc', limit: 2 });
    assert.deepEqual(
      desc.data.map((m) => m.id),
      [`${c.id}-3`, `${c.id}-2`],
    );
    assert.equal(desc.has_more, true);
    const rest = await f.client.chat.completions.messages.list(c.id, {
      order: 'desc',
      after: `${c.id}-2`,
    });
    assert.deepEqual(
      rest.data.map((m) => m.id),
      [`${c.id}-1`, `${c.id}-0`],
    );
  });

  it('refuses bad list queries naming the parameter', async () => {
    const c = await create('query');
    await f.server.services.completions.flush();
    const list = f.client.chat.completions;
    const cases: Array<[() => Promise<unknown>, string, string]> = [
      [() => list.list({ limit: 0 }), 'invalid_value', 'limit'],
      [() => list.list({ limit: 101 }), 'invalid_value', 'limit'],
      [() => list.list({ order: 'up' as never }), 'invalid_value', 'order'],
      [() => list.list({ after: 'chatcmpl-nope' }), 'invalid_value', 'after'],
      [() => list.messages.list(c.id, { limit: 500 }), 'invalid_value', 'limit'],
      [() => list.messages.list(c.id, { after: 'x-9' }), 'invalid_value', 'after'],
    ];
    for (const [call, code, param] of cases) {
      const err = await apiError(call());
      assert.equal(err.status, 400, `${code} ${param}`);
      assert.equal(err.code, code, param);
      assert.equal(err.param, param);
    }
    // `limit` is decimal digits; `metadata` without `[key]` is not a filter.
    for (const [query, param] of [
      ['limit=0x10', 'limit'],
      ['limit=1e1', 'limit'],
      ['limit=%201', 'limit'],
      ['limit=', 'limit'],
      ['metadata=x', 'metadata'],
      ['metadata%5Bk=x', 'metadata[k'],
    ]) {
      const res = await fetch(`${f.baseURL}/chat/completions?${query}`, {
        headers: { authorization: `Bearer ${f.key}` },
      });
      assert.equal(res.status, 400, query);
      const { error } = (await res.json()) as { error: { code: string; param: string } };
      assert.deepEqual([error.code, error.param], ['invalid_value', param], query);
    }
    // A repeated query parameter is not one value (the SDK never sends one).
    for (const [query, param] of [
      ['model=a&model=b', 'model'],
      ['metadata%5Bk%5D=a&metadata%5Bk%5D=b', 'metadata[k]'],
    ]) {
      const res = await fetch(`${f.baseURL}/chat/completions?${query}`, {
        headers: { authorization: `Bearer ${f.key}` },
      });
      assert.equal(res.status, 400);
      const { error } = (await res.json()) as { error: { code: string; param: string } };
      assert.equal(error.code, 'invalid_type');
      assert.equal(error.param, param);
    }
  });

  it('a metadata filter on the key __proto__ is a filter like any other', async () => {
    await create('proto', { metadata: { kind: 'proto' } });
    await f.server.services.completions.flush();
    const res = await fetch(`${f.baseURL}/chat/completions?metadata%5B__proto__%5D=x`, {
      headers: { authorization: `Bearer ${f.key}` },
    });
    assert.equal(res.status, 200);
    // No completion has that pair: none is listed (not every one, as without a filter).
    const page = (await res.json()) as { data: unknown[]; has_more: boolean };
    assert.deepEqual([page.data.length, page.has_more], [0, false]);
  });

  it('stores a completion with U+0000 in it, as U+FFFD', async () => {
    const c = await create('a\u0000b', { metadata: { k: 'x\u0000y' } });
    await f.server.services.completions.flush();
    const got = await f.client.chat.completions.retrieve(c.id);
    assert.deepEqual((got as unknown as { metadata: unknown }).metadata, { k: 'x\uFFFDy' });
    assert.deepEqual(got.choices, c.choices);
    const messages = await f.client.chat.completions.messages.list(c.id);
    assert.equal(messages.data[0]!.content, 'a\uFFFDb');
    // A literal backslash before `u0000` is text, not a NUL: kept as it is.
    const literal = await create('a\\u0000b');
    await f.server.services.completions.flush();
    const m2 = await f.client.chat.completions.messages.list(literal.id);
    assert.equal(m2.data[0]!.content, 'a\\u0000b');
  });

  it('stores a completion with a lone surrogate in it, as U+FFFD, and bills it', async () => {
    const c = await create('a\ud800b \u{1F600}', { metadata: { k: 'x\udc00' } });
    await f.server.services.completions.flush();
    const got = await f.client.chat.completions.retrieve(c.id);
    assert.deepEqual((got as unknown as { metadata: unknown }).metadata, { k: 'x\uFFFD' });
    const messages = await f.client.chat.completions.messages.list(c.id);
    assert.equal(messages.data[0]!.content, 'a\uFFFDb \u{1F600}');
    // Without `store`, the usage row (which keeps `metadata`) is still written.
    const plain = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 4,
      metadata: { k: 'y\ud800' },
    });
    await f.server.services.usage.flush();
    const rows = await f.server.services.store.db.select().from(tables.usageRecords);
    const row = rows.find((r) => r.requestId === plain.id);
    assert.deepEqual(row?.metadata, { k: 'y\uFFFD' });
  });

  it('counts against the management limit; another project or endpoint sees nothing', async () => {
    const c = await create('mine');
    await f.server.services.completions.flush();
    const res = await fetch(`${f.baseURL}/chat/completions/${c.id}`, {
      headers: { authorization: `Bearer ${f.key}` },
    });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('x-ratelimit-limit'), '60');

    // Another project, its own endpoint and key.
    const s = f.server;
    const p = await s.admin('POST', '/projects', { slug: 'other', name: 'Other' });
    await s.admin('POST', '/projects/other/endpoints', {
      slug: 'chat',
      name: 'Chat',
      model: 'sim-model',
      tier: 'cpu',
    });
    const k = await s.admin('POST', '/projects/other/keys', { scopes: ['inference'] });
    const foreign = new OpenAI({
      baseURL: `${s.url}/${String(p.body.id)}/chat/v1`,
      apiKey: String(k.body.key),
      maxRetries: 0,
    });
    for (const call of [
      () => foreign.chat.completions.retrieve(c.id),
      () => foreign.chat.completions.update(c.id, { metadata: { x: 'y' } }),
      () => foreign.chat.completions.delete(c.id),
      () => foreign.chat.completions.messages.list(c.id),
    ]) {
      const err = await apiError(call());
      assert.equal(err.status, 404);
      assert.equal(err.code, 'chat_completion_not_found');
    }
    assert.deepEqual((await foreign.chat.completions.list()).data, []);

    // A key of this project bound to another endpoint sees only that endpoint's.
    const e2 = await s.admin('POST', '/projects/inf/endpoints', {
      slug: 'chat2',
      name: 'Chat 2',
      model: 'sim-model',
      tier: 'cpu',
    });
    const bound = await s.admin('POST', '/projects/inf/keys', {
      scopes: ['inference'],
      endpointId: String(e2.body.id),
    });
    assert.equal(bound.status, 201, bound.text);
    const boundClient = new OpenAI({
      baseURL: `${s.url}/${f.projectId}/chat2/v1`,
      apiKey: String(bound.body.key),
      maxRetries: 0,
    });
    const hidden = await apiError(boundClient.chat.completions.retrieve(c.id));
    assert.equal(hidden.code, 'chat_completion_not_found');
    assert.deepEqual((await boundClient.chat.completions.list()).data, []);
    const own = await boundClient.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'via chat2' }],
      max_tokens: 4,
      store: true,
    });
    await f.server.services.completions.flush();
    assert.deepEqual(
      (await boundClient.chat.completions.list()).data.map((x) => x.id),
      [own.id],
    );
    // The bound key cannot use the other endpoint's path; the unbound key sees both.
    const restricted = await apiError(
      new OpenAI({
        baseURL: f.baseURL,
        apiKey: String(bound.body.key),
        maxRetries: 0,
      }).chat.completions.list(),
    );
    assert.equal(restricted.code, 'endpoint_restricted');
    assert.equal((await f.client.chat.completions.retrieve(own.id)).id, own.id);
  });
});
