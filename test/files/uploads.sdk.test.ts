/**
 * The Uploads API with the official OpenAI SDK: create, add parts, complete in a
 * chosen order (the file's bytes are the parts' in that order, md5 checked),
 * cancel, expiry after an hour; refusals (size mismatch, unknown part, part too
 * large, bad batch content, a finished upload) with their codes and `param`.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, beforeEach, describe, it } from 'node:test';
import { tables } from '../../src/store/index.js';
import { apiError, inferenceFixture, type InferenceFixture } from '../support/inference.js';

describe('uploads with the OpenAI SDK', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({
      env: {
        SWITCHYARD_MAX_FILE_BYTES: String(4 * 1024 * 1024),
        SWITCHYARD_MAX_UPLOAD_PART_BYTES: String(2 * 1024 * 1024),
      },
    });
  });
  after(() => f.close());
  beforeEach(() => f.server.clock.advance(61_000));

  const part = (upload: string, data: Buffer) =>
    f.client.uploads.parts.create(upload, { data: new File([data], 'part') });

  it('assembles a file from parts in the order of part_ids', async () => {
    const a = Buffer.alloc(1536 * 1024, 0x61);
    const b = Buffer.from('middle part');
    const c = Buffer.alloc(1024 * 1024 + 7, 0x63);
    const whole = Buffer.concat([a, b, c]);
    const upload = await f.client.uploads.create({
      filename: 'big.bin',
      purpose: 'user_data',
      bytes: whole.length,
      mime_type: 'application/octet-stream',
    });
    assert.match(upload.id, /^upload_[0-9a-f]{24}$/);
    assert.equal(upload.object, 'upload');
    assert.equal(upload.status, 'pending');
    assert.equal(upload.expires_at, upload.created_at + 3600);
    assert.equal(upload.file, null);
    // Sent out of order; part_ids decides.
    const pc = await part(upload.id, c);
    const pa = await part(upload.id, a);
    const pb = await part(upload.id, b);
    const stray = await part(upload.id, Buffer.from('not used'));
    assert.match(pa.id, /^part_[0-9a-f]{24}$/);
    assert.equal(pa.object, 'upload.part');
    assert.equal(pa.upload_id, upload.id);

    const done = await f.client.uploads.complete(upload.id, {
      part_ids: [pa.id, pb.id, pc.id],
      md5: createHash('md5').update(whole).digest('hex'),
    });
    assert.equal(done.status, 'completed');
    assert.equal(done.file?.bytes, whole.length);
    assert.equal(done.file?.filename, 'big.bin');
    assert.equal(done.file?.purpose, 'user_data');
    const back = Buffer.from(await (await f.client.files.content(done.file!.id)).arrayBuffer());
    assert.ok(back.equals(whole));
    // The unused part and the parts' rows are gone; the chunks are the file's.
    const db = f.server.services.store.db;
    assert.equal((await db.select().from(tables.uploadParts)).length, 0);
    const owners = new Set((await db.select().from(tables.blobChunks)).map((c) => c.owner));
    assert.ok(!owners.has(stray.id));
    const again = await apiError(f.client.uploads.complete(upload.id, { part_ids: [pa.id] }));
    assert.equal(again.status, 409);
    assert.equal(again.code, 'invalid_state');
    await f.client.files.delete(done.file!.id);
  });

  it('refuses a size mismatch, unknown parts, a bad md5 and a part over the limit', async () => {
    const upload = await f.client.uploads.create({
      filename: 'x.txt',
      purpose: 'assistants',
      bytes: 10,
      mime_type: 'text/plain',
    });
    const p = await part(upload.id, Buffer.from('12345'));
    const short = await apiError(f.client.uploads.complete(upload.id, { part_ids: [p.id] }));
    assert.equal(short.status, 400);
    assert.equal(short.param, 'part_ids');
    const unknown = await apiError(
      f.client.uploads.complete(upload.id, { part_ids: [p.id, 'part_nope'] }),
    );
    assert.equal(unknown.param, 'part_ids');
    const p2 = await part(upload.id, Buffer.from('67890'));
    const md5 = await apiError(
      f.client.uploads.complete(upload.id, { part_ids: [p.id, p2.id], md5: '0'.repeat(32) }),
    );
    assert.equal(md5.status, 400);
    assert.equal(md5.param, 'md5');
    const big = await apiError(part(upload.id, Buffer.alloc(2 * 1024 * 1024 + 1)));
    assert.equal(big.status, 413);
    assert.equal(big.code, 'payload_too_large');
    assert.equal(big.param, 'data');
    const ok = await f.client.uploads.complete(upload.id, { part_ids: [p.id, p2.id] });
    assert.equal(await (await f.client.files.content(ok.file!.id)).text(), '1234567890');

    const tooBig = await apiError(
      f.client.uploads.create({
        filename: 'x',
        purpose: 'assistants',
        bytes: 4 * 1024 * 1024 + 1,
        mime_type: 'text/plain',
      }),
    );
    assert.equal(tooBig.status, 400);
    assert.equal(tooBig.param, 'bytes');
    const badPurpose = await apiError(
      f.client.uploads.create({
        filename: 'x',
        purpose: 'nope' as never,
        bytes: 1,
        mime_type: 'text/plain',
      }),
    );
    assert.equal(badPurpose.param, 'purpose');
    assert.equal((await apiError(part('upload_nope', Buffer.from('x')))).code, 'upload_not_found');
  });

  it('a malformed multipart body is 400 invalid_body, on parts and files alike', async () => {
    const upload = await f.client.uploads.create({
      filename: 'm.txt',
      purpose: 'assistants',
      bytes: 3,
      mime_type: 'text/plain',
    });
    const post = (path: string, type: string, body: string) =>
      fetch(`${f.baseURL}${path}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${f.key}`, 'content-type': type },
        body,
      });
    const unterminated =
      '--zzz\r\nContent-Disposition: form-data; name="FIELD"; filename="x"\r\n\r\nabc';
    for (const path of [`/uploads/${upload.id}/parts`, '/files']) {
      const field = path === '/files' ? 'file' : 'data';
      for (const [type, body] of [
        ['multipart/form-data', 'abc'],
        ['multipart/form-data; boundary=zzz', unterminated.replace('FIELD', field)],
        ['multipart/form-data; boundary=zzz', '--zzz\r\n\x00\x01 headers that never end'],
      ] as const) {
        const r = await post(path, type, body);
        const e = ((await r.json()) as { error: { code: string; type: string } }).error;
        assert.equal(r.status, 400, `${path} ${JSON.stringify(body)}: ${JSON.stringify(e)}`);
        assert.equal(e.code, 'invalid_body');
        assert.equal(e.type, 'invalid_request_error');
      }
    }
    // Nothing was stored, and the upload still takes a good part.
    const p = await part(upload.id, Buffer.from('abc'));
    const done = await f.client.uploads.complete(upload.id, { part_ids: [p.id] });
    assert.equal(done.status, 'completed');
  });

  it("refuses a part that would take the upload's parts past the largest file", async () => {
    const upload = await f.client.uploads.create({
      filename: 's.bin',
      purpose: 'assistants',
      bytes: 10,
      mime_type: 'application/octet-stream',
    });
    // Parts not named at completion are allowed (OpenAI's rule), but not without end.
    const twoMiB = Buffer.alloc(2 * 1024 * 1024);
    await part(upload.id, twoMiB);
    await part(upload.id, twoMiB);
    const over = await apiError(part(upload.id, Buffer.from('x')));
    assert.equal(over.status, 413);
    assert.equal(over.code, 'payload_too_large');
    assert.equal(over.param, 'data');
    const rows = await f.server.services.store.db.select().from(tables.uploadParts);
    assert.equal(rows.filter((r) => r.uploadId === upload.id).length, 2);
  });

  it('checks a batch upload as batch input at completion', async () => {
    const text =
      '{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}\nnot json\n';
    const upload = await f.client.uploads.create({
      filename: 'b.jsonl',
      purpose: 'batch',
      bytes: Buffer.byteLength(text),
      mime_type: 'application/jsonl',
    });
    const p = await part(upload.id, Buffer.from(text));
    const err = await apiError(f.client.uploads.complete(upload.id, { part_ids: [p.id] }));
    assert.equal(err.status, 400);
    assert.equal(err.param, 'part_ids');
    assert.match(err.message, /Line 2/);
  });

  it('cancels, and expires an hour after creation', async () => {
    const upload = await f.client.uploads.create({
      filename: 'c.txt',
      purpose: 'assistants',
      bytes: 3,
      mime_type: 'text/plain',
    });
    const p = await part(upload.id, Buffer.from('abc'));
    const cancelled = await f.client.uploads.cancel(upload.id);
    assert.equal(cancelled.status, 'cancelled');
    assert.equal((await apiError(part(upload.id, Buffer.from('x')))).status, 409);
    assert.equal(
      (await apiError(f.client.uploads.complete(upload.id, { part_ids: [p.id] }))).code,
      'invalid_state',
    );
    const db = f.server.services.store.db;
    const parts = await db.select().from(tables.uploadParts);
    assert.deepEqual(
      parts.filter((x) => x.uploadId === upload.id),
      [],
    );
    assert.ok(!(await db.select().from(tables.blobChunks)).some((c) => c.owner === p.id));

    const later = await f.client.uploads.create({
      filename: 'd.txt',
      purpose: 'assistants',
      bytes: 3,
      mime_type: 'text/plain',
    });
    const q = await part(later.id, Buffer.from('abc'));
    f.server.clock.advance(3600 * 1000);
    const expired = await apiError(f.client.uploads.complete(later.id, { part_ids: [q.id] }));
    assert.equal(expired.status, 409);
    assert.match(expired.message, /expired/);
  });
});

/** A part upload whose multipart body the test streams by hand, to stop it midway. */
describe('a part that does not arrive whole', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture();
  });
  after(() => f.close());

  const HEAD =
    '--zz\r\nContent-Disposition: form-data; name="data"; filename="part"\r\n' +
    'Content-Type: application/octet-stream\r\n\r\n';
  const chunkOwners = async () =>
    (
      await f.server.services.store.db
        .select({ owner: tables.blobChunks.owner })
        .from(tables.blobChunks)
    )
      .map((c) => c.owner)
      .filter((o) => o.startsWith('part_'));
  const partsOf = async (uploadId: string) =>
    (await f.server.services.store.db.select().from(tables.uploadParts)).filter(
      (x) => x.uploadId === uploadId,
    );
  /** Real time, reading the database: until `done()` holds (5 s at most). */
  const until = async (done: () => Promise<boolean>) => {
    for (let i = 0; i < 500 && !(await done()); i++) await new Promise((r) => setTimeout(r, 10));
  };
  /** POSTs a part: the head and its first MiB, then whatever `rest` does with the stream. */
  const postPart = (
    uploadId: string,
    rest: (c: ReadableStreamDefaultController<Uint8Array>) => Promise<void> | void,
    signal?: AbortSignal,
  ) =>
    fetch(`${f.baseURL}/uploads/${uploadId}/parts`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${f.key}`,
        'content-type': 'multipart/form-data; boundary=zz',
      },
      body: new ReadableStream<Uint8Array>({
        async start(c) {
          c.enqueue(Buffer.from(HEAD));
          c.enqueue(Buffer.alloc(1024 * 1024 + 10, 0x61));
          await rest(c);
        },
      }),
      duplex: 'half',
      signal,
    } as RequestInit);
  const upload = (filename: string) =>
    f.client.uploads.create({
      filename,
      purpose: 'assistants',
      bytes: 3,
      mime_type: 'application/octet-stream',
    });

  it('still streaming when its upload is cancelled: 409 invalid_state, nothing stored', async () => {
    const u = await upload('r.bin');
    const before = await chunkOwners();
    // The part's first MiB reaches the database; the rest waits for `go`.
    let go!: () => void;
    const gate = new Promise<void>((r) => (go = r));
    const res = postPart(u.id, async (c) => {
      await gate;
      c.enqueue(Buffer.from('tail\r\n--zz--\r\n'));
      c.close();
    });
    await until(async () => (await chunkOwners()).length !== before.length);
    assert.equal((await f.client.uploads.cancel(u.id)).status, 'cancelled');
    go();
    const r = await res;
    const e = ((await r.json()) as { error?: { code: string } }).error;
    assert.equal(r.status, 409);
    assert.equal(e?.code, 'invalid_state');
    assert.deepEqual(await partsOf(u.id), []);
    assert.deepEqual(await chunkOwners(), before);
  });

  it('its client gone mid-body: no part, no bytes, and the upload completes from other parts', async () => {
    const u = await upload('gone.bin');
    const before = await chunkOwners();
    // The part's first MiB reaches the database; then the client aborts.
    const ac = new AbortController();
    const res = postPart(u.id, () => {}, ac.signal);
    await until(async () => (await chunkOwners()).length !== before.length);
    assert.notDeepEqual(await chunkOwners(), before);
    ac.abort();
    await res.catch(() => null);
    // The router drops what it stored of the part.
    await until(async () => (await chunkOwners()).length === before.length);
    assert.deepEqual(await chunkOwners(), before);
    assert.deepEqual(await partsOf(u.id), []);
    const p = await f.client.uploads.parts.create(u.id, {
      data: new File([Buffer.from('abc')], 'part'),
    });
    const done = await f.client.uploads.complete(u.id, { part_ids: [p.id] });
    assert.equal(done.file?.bytes, 3);
  });
});
