/**
 * The Files API with the official OpenAI SDK: upload, retrieve, list (purpose
 * filter, cursor, order), content, delete; the refusals (bad purpose, bad batch
 * input, no file, too large, unknown id, another project's file) in the error
 * envelope with a stable code and `param`.
 */
import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, it } from 'node:test';
import OpenAI, { toFile } from 'openai';
import { tables } from '../../src/store/index.js';
import { apiError, inferenceFixture, type InferenceFixture } from '../support/inference.js';

const line = (id: string, url = '/v1/chat/completions') =>
  JSON.stringify({
    custom_id: id,
    method: 'POST',
    url,
    body: { model: 'm', messages: [{ role: 'user', content: `hi ${id}` }] },
  });

describe('files with the OpenAI SDK', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({
      env: {
        SWITCHYARD_MAX_FILE_BYTES: String(3 * 1024 * 1024),
        SWITCHYARD_MAX_BODY_BYTES: String(1024 * 1024),
      },
    });
  });
  after(() => f.close());
  // The shared management limit is 60 a minute per project; each test starts a new minute.
  beforeEach(() => f.server.clock.advance(61_000));

  it('uploads, retrieves, lists, reads and deletes a file', async () => {
    const text = `${line('a')}\n${line('b')}\n`;
    const file = await f.client.files.create({
      file: await toFile(Buffer.from(text), 'input.jsonl'),
      purpose: 'batch',
    });
    assert.match(file.id, /^file-[0-9a-f]{24}$/);
    assert.deepEqual(
      { ...file, created_at: 0 },
      {
        id: file.id,
        object: 'file',
        bytes: Buffer.byteLength(text),
        created_at: 0,
        filename: 'input.jsonl',
        purpose: 'batch',
        status: 'processed',
        expires_at: null,
        status_details: null,
      },
    );
    assert.equal(file.created_at, Math.floor(f.server.clock.now() / 1000));
    assert.deepEqual(await f.client.files.retrieve(file.id), file);

    const content = await f.client.files.content(file.id);
    assert.equal(await content.text(), text);

    const other = await f.client.files.create({
      file: await toFile(Buffer.from('plain notes'), 'notes.txt'),
      purpose: 'user_data',
    });
    const all = await f.client.files.list();
    assert.deepEqual(
      all.data.map((x) => x.id),
      [other.id, file.id],
    );
    const batchOnly = await f.client.files.list({ purpose: 'batch' });
    assert.deepEqual(
      batchOnly.data.map((x) => x.id),
      [file.id],
    );

    const deleted = await f.client.files.delete(file.id);
    assert.deepEqual(deleted, { id: file.id, object: 'file', deleted: true });
    const gone = await apiError(f.client.files.retrieve(file.id));
    assert.equal(gone.status, 404);
    assert.equal(gone.code, 'file_not_found');
    assert.equal((await apiError(f.client.files.content(file.id))).status, 404);
    assert.equal((await apiError(f.client.files.delete(file.id))).status, 404);
    await f.client.files.delete(other.id);
  });

  it('names the download in Content-Disposition as uploaded, spaces and non-ASCII too', async () => {
    const name = 'my results (1) é.jsonl';
    const file = await f.client.files.create({
      file: await toFile(Buffer.from('notes'), name),
      purpose: 'user_data',
    });
    assert.equal(file.filename, name);
    const res = await fetch(`${f.baseURL}/files/${file.id}/content`, {
      headers: { authorization: `Bearer ${f.key}` },
    });
    assert.equal(await res.text(), 'notes');
    const cd = res.headers.get('content-disposition') ?? '';
    assert.match(cd, /^attachment; /);
    // RFC 6266: `filename*` carries the name (RFC 8187 encoding), `filename` a plain
    // quoted fallback, taken as written (no percent-decoding).
    const star = /filename\*=UTF-8''([^;\s]+)/.exec(cd)?.[1];
    assert.equal(star && decodeURIComponent(star), name, cd);
    assert.match(star!, /^[A-Za-z0-9!#$&+\-.^_`|~%]+$/);
    assert.equal(/filename="([^"]*)"/.exec(cd)?.[1], 'my results (1) _.jsonl', cd);
    await f.client.files.delete(file.id);
  });

  it('pages with limit and after, newest first or in order=asc; the SDK follows the cursor', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      const x = await f.client.files.create({
        file: await toFile(Buffer.from(`n${i}`), `n${i}.txt`),
        purpose: 'assistants',
      });
      ids.push(x.id);
    }
    const first = await f.client.files.list({ purpose: 'assistants', limit: 2 });
    assert.deepEqual(
      first.data.map((x) => x.id),
      [ids[4], ids[3]],
    );
    assert.equal(first.has_more, true);
    const body = (
      await f.server.call(
        'GET',
        `/${f.projectId}/chat/v1/files?purpose=assistants&limit=2&after=${ids[3]}`,
        { key: f.key },
      )
    ).body;
    assert.deepEqual(body, {
      object: 'list',
      data: (body.data as { id: string }[]).map((d) => d),
      first_id: ids[2],
      last_id: ids[1],
      has_more: true,
    });
    const seen: string[] = [];
    for await (const x of f.client.files.list({ purpose: 'assistants', limit: 2, order: 'asc' })) {
      seen.push(x.id);
    }
    assert.deepEqual(seen, ids);
    for (const id of ids) await f.client.files.delete(id);
  });

  it('refuses a bad purpose, a missing file and bad batch input with 400 and the param', async () => {
    const bad = await apiError(
      f.client.files.create({
        file: await toFile(Buffer.from('x'), 'x.txt'),
        purpose: 'training' as never,
      }),
    );
    assert.equal(bad.status, 400);
    assert.equal(bad.code, 'invalid_value');
    assert.equal(bad.param, 'purpose');

    const cases: [string | Buffer, RegExp][] = [
      ['not json\n', /Line 1.*not valid JSON/],
      // Invalid UTF-8 inside a string: refused, not decoded to U+FFFD and sent on.
      [
        Buffer.concat([
          Buffer.from(
            `${line('a')}\n{"custom_id":"b","method":"POST","url":"/v1/embeddings","body":{"input":"`,
          ),
          Buffer.from([0xff, 0xc3]),
          Buffer.from('"}}\n'),
        ]),
        /Line 2.*not valid UTF-8/,
      ],
      [`${line('a')}\n${line('a')}\n`, /Line 2.*not unique/],
      [`${line('a')}\n${line('b', '/v1/images')}\n`, /Line 2.*'url'/],
      [
        JSON.stringify({ custom_id: 'a', method: 'GET', url: '/v1/embeddings', body: {} }),
        /method/,
      ],
      [JSON.stringify({ custom_id: 'a', method: 'POST', url: '/v1/embeddings' }), /'body'/],
      [JSON.stringify({ method: 'POST', url: '/v1/embeddings', body: {} }), /custom_id/],
      // A custom_id the database cannot hold as sent (a lone surrogate would come back
      // in the output as U+FFFD; U+0000 failed the batch's creation).
      [`${line('a')}\n${line('x\ud800y')}\n`, /Line 2.*'custom_id'/],
      [line('a\u0000b'), /Line 1.*'custom_id'/],
      ['\n\n', /no requests/],
    ];
    for (const [text, message] of cases) {
      const err = await apiError(
        f.client.files.create({
          file: await toFile(Buffer.from(text), 'b.jsonl'),
          purpose: 'batch',
        }),
      );
      assert.equal(err.status, 400, text.toString());
      assert.equal(err.code, 'invalid_value');
      assert.equal(err.param, 'file');
      assert.match(err.message, message);
    }
    // Nothing of the refused uploads stays behind.
    const db = f.server.services.store.db;
    assert.equal((await db.select().from(tables.files)).length, 0);
    assert.equal((await db.select().from(tables.blobChunks)).length, 0);

    const form = new FormData();
    form.append('purpose', 'batch');
    const res = await fetch(`${f.baseURL}/files`, {
      method: 'POST',
      headers: { authorization: `Bearer ${f.key}` },
      body: form,
    });
    assert.equal(res.status, 400);
    const missing = (await res.json()) as { error: { code: string; param: string } };
    assert.equal(missing.error.code, 'missing_required_parameter');
    assert.equal(missing.error.param, 'file');

    const json = await f.server.call('POST', `/${f.projectId}/chat/v1/files`, {
      key: f.key,
      body: { purpose: 'batch' },
    });
    assert.equal(json.status, 415);
  });

  it('refuses a batch line longer than a request may be, naming the line', async () => {
    // The body limit here is 1 MiB: such a line could never run (413), and checking it
    // must not hold it whole (any file is checked while it streams, purpose unknown).
    const big = (id: string, n: number) =>
      JSON.stringify({
        custom_id: id,
        method: 'POST',
        url: '/v1/chat/completions',
        body: { model: 'm', messages: [{ role: 'user', content: 'a'.repeat(n) }] },
      });
    const err = await apiError(
      f.client.files.create({
        file: await toFile(Buffer.from(`${line('a')}\n${big('b', 1024 * 1024)}\n`), 'b.jsonl'),
        purpose: 'batch',
      }),
    );
    assert.equal(err.status, 400);
    assert.equal(err.code, 'invalid_value');
    assert.equal(err.param, 'file');
    assert.match(err.message, /Line 2.*larger than/);
    // Far past the limit, and with no newline at all: the same answer.
    const none = await apiError(
      f.client.files.create({
        file: await toFile(Buffer.alloc(2 * 1024 * 1024 + 5, 0x61), 'b.jsonl'),
        purpose: 'batch',
      }),
    );
    assert.match(none.message, /Line 1.*larger than/);
    // Just under it is a good line; the same bytes as another purpose are any file.
    const fits = await f.client.files.create({
      file: await toFile(Buffer.from(big('c', 1024 * 1024 - 200)), 'c.jsonl'),
      purpose: 'batch',
    });
    await f.client.files.delete(fits.id);
    const other = await f.client.files.create({
      file: await toFile(Buffer.alloc(2 * 1024 * 1024 + 5, 0x61), 'x.bin'),
      purpose: 'user_data',
    });
    await f.client.files.delete(other.id);
  });

  it('takes a batch file that starts with a UTF-8 byte order mark (as Windows editors save it)', async () => {
    const file = await f.client.files.create({
      file: await toFile(Buffer.from(`\uFEFF${line('bom-1')}\r\n${line('bom-2')}\r\n`), 'w.jsonl'),
      purpose: 'batch',
    });
    const batch = await f.client.batches.create({
      input_file_id: file.id,
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
    });
    assert.equal(batch.request_counts?.total, 2);
    await f.client.batches.cancel(batch.id);
    await f.client.files.delete(file.id);
  });

  it('refuses a file over SWITCHYARD_MAX_FILE_BYTES with 413 and keeps none of it', async () => {
    const big = Buffer.alloc(3 * 1024 * 1024 + 1, 0x61);
    const err = await apiError(
      f.client.files.create({ file: await toFile(big, 'big.bin'), purpose: 'user_data' }),
    );
    assert.equal(err.status, 413);
    assert.equal(err.code, 'payload_too_large');
    assert.equal(err.param, 'file');
    const db = f.server.services.store.db;
    assert.equal((await db.select().from(tables.files)).length, 0);
    assert.equal((await db.select().from(tables.blobChunks)).length, 0);

    // Just under the limit: several chunks, read back intact.
    const ok = Buffer.alloc(3 * 1024 * 1024, 0);
    for (let i = 0; i < ok.length; i += 4099) ok[i] = i % 251;
    const file = await f.client.files.create({
      file: await toFile(ok, 'ok.bin'),
      purpose: 'user_data',
    });
    assert.equal(file.bytes, ok.length);
    const back = Buffer.from(await (await f.client.files.content(file.id)).arrayBuffer());
    assert.ok(back.equals(ok));
    await f.client.files.delete(file.id);
  });

  it('keeps projects apart and needs the inference scope', async () => {
    const mine = await f.client.files.create({
      file: await toFile(Buffer.from('secret'), 's.txt'),
      purpose: 'user_data',
    });
    const op = await f.server.admin('POST', '/projects', { slug: 'other', name: 'Other' });
    const otherId = String(op.body.id);
    await f.server.admin('POST', '/projects/other/endpoints', {
      slug: 'chat',
      name: 'Chat',
      model: 'sim-model',
      tier: 'cpu',
    });
    const other = await f.server.admin('POST', '/projects/other/keys', { scopes: ['inference'] });
    const theirs = new OpenAI({
      baseURL: f.baseURL,
      apiKey: String(other.body.key),
      maxRetries: 0,
    });
    // Their key on our path: 403; our file id on their own path: 404.
    const cross = await apiError(theirs.files.retrieve(mine.id));
    assert.equal(cross.status, 403);
    assert.equal(cross.code, 'cross_project_access');
    const theirsOwn = new OpenAI({
      baseURL: `${f.server.url}/${otherId}/chat/v1`,
      apiKey: String(other.body.key),
      maxRetries: 0,
    });
    assert.equal((await apiError(theirsOwn.files.retrieve(mine.id))).status, 404);
    assert.equal((await apiError(theirsOwn.files.content(mine.id))).status, 404);
    assert.equal((await apiError(theirsOwn.files.delete(mine.id))).status, 404);
    assert.deepEqual((await theirsOwn.files.list()).data, []);

    const mgmt = await f.server.admin('POST', '/projects/inf/keys', { scopes: ['management'] });
    const noScope = new OpenAI({
      baseURL: f.baseURL,
      apiKey: String(mgmt.body.key),
      maxRetries: 0,
    });
    const denied = await apiError(noScope.files.list());
    assert.equal(denied.status, 403);
    assert.equal(denied.code, 'scope_insufficient');
    const unauth = await fetch(`${f.baseURL}/files`, { method: 'POST', body: new FormData() });
    assert.equal(unauth.status, 401);
    await f.client.files.delete(mine.id);
  });
});
