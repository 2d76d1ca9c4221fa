/**
 * A router SIGKILLed while a part of an upload streams in: the bytes it stored of the
 * part have no part to drop them with unless the part was recorded before its bytes.
 * Completing the upload through another router neither counts nor assembles the
 * dead part, and leaves nothing of it.
 *
 * Needs PostgreSQL (TEST_DATABASE_URL); runs the built binary (`npm run build` first).
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, it } from 'node:test';
import { like } from 'drizzle-orm';
import OpenAI from 'openai';
import { tables } from '../../src/store/index.js';
import { cluster } from '../support/cluster.js';
import { ADMIN_TOKEN, http, sharedServices } from '../support/harness.js';

const { skip } = sharedServices();

describe('a router killed while a part streams in', { skip, timeout: 90_000 }, () => {
  const routers = cluster();

  const serve = async () => {
    const r = await routers.serve();
    return { p: r.proc, base: r.url };
  };
  const partChunks = async () =>
    (
      await routers.db.store.db
        .select({ owner: tables.blobChunks.owner })
        .from(tables.blobChunks)
        .where(like(tables.blobChunks.owner, 'part_%'))
    ).length;

  it('the upload completes without the dead part, and its bytes are dropped', async () => {
    const first = await serve();
    const admin = async (path: string, body: unknown) => {
      const r = await http('POST', `${first.base}/admin/v1${path}`, {
        auth: `Bearer ${ADMIN_TOKEN}`,
        body,
      });
      assert.ok(r.status === 200 || r.status === 201, r.text);
      return r.body;
    };
    await admin('/models', { name: 'sim-model', context_window: 4096 });
    const project = await admin('/projects', { slug: 'up', name: 'Up' });
    await admin('/projects/up/endpoints', {
      slug: 'chat',
      name: 'Chat',
      model: 'sim-model',
      tier: 'cpu',
    });
    const key = String((await admin('/projects/up/keys', { scopes: ['inference'] })).key);
    const path = `/${String(project.id)}/chat/v1`;
    const client = (base: string) =>
      new OpenAI({ baseURL: `${base}${path}`, apiKey: key, maxRetries: 0 });
    const upload = await client(first.base).uploads.create({
      filename: 'k.bin',
      purpose: 'assistants',
      bytes: 3,
      mime_type: 'application/octet-stream',
    });
    // The part's first MiB reaches the database, then the router dies.
    const head =
      '--zz\r\nContent-Disposition: form-data; name="data"; filename="part"\r\n' +
      'Content-Type: application/octet-stream\r\n\r\n';
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(Buffer.from(head));
        c.enqueue(Buffer.alloc(1024 * 1024 + 10, 0x61));
      },
    });
    const res = fetch(`${first.base}${path}/uploads/${upload.id}/parts`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${key}`,
        'content-type': 'multipart/form-data; boundary=zz',
      },
      body,
      duplex: 'half',
    } as RequestInit).catch(() => null);
    for (let i = 0; i < 1000 && (await partChunks()) === 0; i++) await sleep(10);
    assert.ok((await partChunks()) > 0, 'the part’s first chunk was stored');
    assert.equal(await first.p.stop('SIGKILL'), null);
    await res;

    const second = await serve();
    const c = client(second.base);
    // The dead part holds no bytes the upload could count or assemble.
    const good = await c.uploads.parts.create(upload.id, {
      data: new File([Buffer.from('abc')], 'part'),
    });
    const done = await c.uploads.complete(upload.id, { part_ids: [good.id] });
    assert.equal(done.file?.bytes, 3);
    assert.equal(await partChunks(), 0, 'the dead part’s chunks were dropped');
    assert.equal((await routers.db.store.db.select().from(tables.uploadParts)).length, 0);
  });
});
