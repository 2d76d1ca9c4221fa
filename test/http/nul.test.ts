/**
 * U+0000 from clients, which PostgreSQL's text and jsonb cannot store:
 * - in chat `user` and `metadata` (usage records): the request is served, its usage
 *   stored without the NUL, and the requests after it are recorded and billed (one
 *   such request used to stop every usage write, retried forever);
 * - in ids, query strings and stored bodies: 400 `invalid_body`, never a 500;
 * - in a Responses request: 400 naming the field before any worker runs (it used
 *   to stream `response.completed` and then fail to store the response).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { tables } from '../../src/store/index.js';
import { inferenceFixture, type InferenceFixture } from '../support/inference.js';
import { http } from '../support/harness.js';

describe('NUL characters from clients', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({ prices: [100_000, 100_000], creditCents: 100_000 });
  });
  after(() => f.close());

  /**
   * POSTs as a key of the project with the inference and management scopes: an
   * object as JSON, a string as the body's very text.
   */
  const managementPost = async () => {
    const mgmt = await f.server.admin('POST', `/projects/inf/keys`, {
      scopes: ['inference', 'management'],
    });
    const auth = `Bearer ${String(mgmt.body.key)}`;
    return (path: string, body: unknown) =>
      http('POST', `${f.server.url}/${f.projectId}${path}`, {
        auth,
        ...(typeof body === 'string'
          ? { rawBody: body, headers: { 'content-type': 'application/json' } }
          : { body }),
      });
  };
  const refusedNaming = (r: Awaited<ReturnType<typeof http>>, param: string, path: string) => {
    assert.equal(r.status, 400, `${path}: ${r.text}`);
    const e = r.body.error as Record<string, unknown>;
    assert.deepEqual([e.code, e.param], ['invalid_body', param], path);
  };

  const call = (method: string, path: string, body?: unknown) =>
    http(method, `${f.server.url}/${f.projectId}${path}`, {
      auth: `Bearer ${f.key}`,
      ...(body !== undefined ? { body } : {}),
    });

  it('chat user and metadata: served, usage stored without the NUL, later usage still billed', async () => {
    const r = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 4,
      user: 'alice\u0000',
      metadata: { 'k\u0000': 'v\u0000' },
    });
    const after = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'again' }],
      max_tokens: 4,
    });
    await f.server.services.usage.flush();
    const rows = await f.server.services.store.db.select().from(tables.usageRecords);
    const first = rows.find((x) => x.requestId === r.id);
    assert.equal(first?.user, 'alice');
    assert.deepEqual(first?.metadata, { k: 'v' });
    assert.ok(
      rows.some((x) => x.requestId === after.id),
      'the next request is recorded',
    );
    assert.equal(f.server.services.usage.pending, 0);
    const [p] = await f.server.services.store.db
      .select()
      .from(tables.projects)
      .where(eq(tables.projects.externalId, f.projectId));
    const billed = rows.reduce((a, x) => a + Number(x.costMicrocents), 0);
    assert.ok(billed > 0);
    assert.equal(Number(p!.spentMicrocents), billed);
  });

  it('ids and query strings: 400 naming the parameter, not 500', async () => {
    for (const [method, path, param] of [
      ['GET', '/chat/v1/files/%00', 'file_id'],
      ['GET', '/chat/v1/batches/%00', 'batch_id'],
      ['GET', '/chat/v1/conversations/%00', 'conversation_id'],
      ['GET', '/chat/v1/chat/completions/a%00', 'completion_id'],
      ['GET', '/chat/v1/files?after=%00', 'after'],
      ['GET', '/chat/v1/chat/completions?model=m%00', 'model'],
      ['GET', '/chat/v1/chat/completions?metadata%5Bk%5D=%00', 'metadata[k]'],
    ] as Array<[string, string, string]>) {
      const r = await call(method, path);
      assert.equal(r.status, 400, `${method} ${path}: ${r.status} ${r.text}`);
      const e = r.body.error as Record<string, unknown>;
      assert.deepEqual([e.code, e.param], ['invalid_value', param], path);
    }
  });

  it('stored JSON bodies: 400 naming the field, and nothing stored changed', async () => {
    const as = await managementPost();
    const conv = await as('/chat/v1/conversations', {});
    assert.equal(conv.status, 200, conv.text);
    for (const [path, body, param] of [
      ['/chat/v1/conversations', { metadata: { k: 'a\u0000b' } }, 'metadata.k'],
      [
        `/chat/v1/conversations/${String(conv.body.id)}/items`,
        { items: [{ type: 'message', role: 'user', content: 'x\u0000' }] },
        'items[0].content',
      ],
      [
        '/v1/budget_alerts',
        { name: 'n\u0000', threshold_cents: 100, url: 'https://example.com/hook' },
        'name',
      ],
      [
        '/chat/v1/uploads',
        { filename: 'a\u0000b.txt', purpose: 'assistants', bytes: 1, mime_type: 'text/plain' },
        'filename',
      ],
      ['/v1/webhooks', { url: 'https://example.com/h', events: ['e\u0000'] }, 'events[0]'],
    ] as Array<[string, unknown, string]>) {
      refusedNaming(await as(path, body), param, path);
    }
    // The operator API alike.
    const op = await f.server.admin('POST', '/projects', { slug: 'nul', name: 'a\u0000b' });
    assert.equal(op.status, 400, op.text);
    assert.equal((op.body.error as Record<string, unknown>).param, 'name');
    const uploads = await f.server.services.store.db.select().from(tables.uploads);
    assert.equal(uploads.length, 0, 'no upload stored with its NUL stripped');
  });

  it('a lone UTF-16 surrogate in a stored body: 400 naming the field; a pair is kept', async () => {
    const as = await managementPost();
    for (const [path, body, param] of [
      ['/chat/v1/conversations', { metadata: { k: 'a\ud800' } }, 'metadata.k'],
      ['/chat/v1/conversations', { metadata: { ['\udc00']: 'v' } }, 'metadata.\udc00'],
      ['/chat/v1/responses', { model: 'x', input: 'hi \ud83d', max_output_tokens: 8 }, 'input'],
    ] as Array<[string, unknown, string]>) {
      refusedNaming(await as(path, body), param, path);
    }
    const op = await f.server.admin('POST', '/projects', { slug: 'lone', name: 'a\udbff' });
    assert.equal(op.status, 400, op.text);
    assert.equal((op.body.error as Record<string, unknown>).param, 'name');
    // A surrogate pair, sent escaped as JSON.stringify does not, is text like any other.
    const pair = await as('/chat/v1/conversations', '{"metadata":{"k":"\\ud83d\\ude00"}}');
    assert.equal(pair.status, 200, pair.text);
    assert.deepEqual(pair.body.metadata, { k: '\u{1F600}' });
  });

  it('a Responses request with a NUL: 400 naming the field, before any worker runs', async () => {
    const before = await f.server.services.store.db.select().from(tables.usageRecords);
    for (const stream of [false, true]) {
      const r = await call('POST', '/chat/v1/responses', {
        model: 'x',
        input: 'hello\u0000',
        max_output_tokens: 8,
        stream,
      });
      assert.equal(r.status, 400, r.text);
      const e = r.body.error as Record<string, unknown>;
      assert.equal(e.code, 'invalid_body');
      assert.equal(e.param, 'input');
    }
    // The check walks without recursion: a body nested 200,000 levels is a 400 too.
    const deep = await http('POST', `${f.server.url}/${f.projectId}/chat/v1/responses`, {
      auth: `Bearer ${f.key}`,
      rawBody: `{"model":"x","input":"hi","metadata":{"k":${'['.repeat(200_000)}${']'.repeat(200_000)}}}`,
      headers: { 'content-type': 'application/json' },
    });
    assert.equal(deep.status, 400, deep.text.slice(0, 200));
    await f.server.services.usage.flush();
    const rows = await f.server.services.store.db.select().from(tables.usageRecords);
    assert.equal(rows.length, before.length, 'no worker call, no usage');
  });
});
