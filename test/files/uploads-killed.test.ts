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
import { seedProject, sharedServices } from '../support/harness.js';

const { skip } = sharedServices();

describe('a router killed while a part streams in', { skip, timeout: 90_000 }, () => {
  const routers = cluster();

  const partChunks = async () =>
    (
      await routers.db.store.db
        .select({ owner: tables.blobChunks.owner })
        .from(tables.blobChunks)
        .where(like(tables.blobChunks.owner, 'part_%'))
    ).length;

  it('the upload completes without the dead part, and its bytes are dropped', async () => {
    const first = await routers.serve();
    const seeded = await seedProject(first, {
      slug: 'up',
      model: 'sim-model',
      endpointSlug: 'chat',
    });
    const key = seeded.key;
    const path = `/${seeded.projectId}/chat/v1`;
    const client = (base: string) =>
      new OpenAI({ baseURL: `${base}${path}`, apiKey: key, maxRetries: 0 });
    const upload = await client(first.url).uploads.create({
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
    const res = fetch(`${first.url}${path}/uploads/${upload.id}/parts`, {
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
    assert.equal(await first.proc.stop('SIGKILL'), null);
    await res;

    const second = await routers.serve();
    const c = client(second.url);
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
