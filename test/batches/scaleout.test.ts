/**
 * Two router instances on one PostgreSQL: a file uploaded (whole, or in parts)
 * through one is served by the other, and the batch runners of both run every
 * request of three batches exactly once (counted at the worker).
 * Skipped without TEST_DATABASE_URL.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import OpenAI, { toFile } from 'openai';
import { BatchRunner } from '../../src/batches/runner.js';
import { startSimWorker, type SimWorker } from '../../src/workers/sim/index.js';
import { cluster } from '../support/cluster.js';
import { seedProject, sharedServices, type TestServer } from '../support/harness.js';
import { chatLine } from './support.js';

const { skip } = sharedServices();

describe('files and batches across instances', { skip }, () => {
  const routers = cluster();
  let a: TestServer;
  let b: TestServer;
  let worker: SimWorker;
  let ca: OpenAI;
  let cb: OpenAI;
  before(async () => {
    a = await routers.inProcess();
    b = await routers.inProcess();
    worker = await startSimWorker({ model: 'sim-model', contextWindow: 4096 });
    const seeded = await seedProject(a, {
      slug: 'multi',
      model: 'sim-model',
      worker: { url: worker.url },
      endpointSlug: 'chat',
    });
    const path = `/${seeded.projectId}/chat/v1`;
    const apiKey = seeded.key;
    ca = new OpenAI({ baseURL: a.url + path, apiKey, maxRetries: 0 });
    cb = new OpenAI({ baseURL: b.url + path, apiKey, maxRetries: 0 });
  });
  after(() => worker.close());

  it('serves a file from the other instance, whole or assembled from parts', async () => {
    const data = Buffer.alloc(2 * 1024 * 1024 + 5, 0x5a);
    const file = await ca.files.create({ file: await toFile(data, 'z.bin'), purpose: 'user_data' });
    const back = Buffer.from(await (await cb.files.content(file.id)).arrayBuffer());
    assert.ok(back.equals(data));

    const upload = await ca.uploads.create({
      filename: 'parts.txt',
      purpose: 'assistants',
      bytes: 6,
      mime_type: 'text/plain',
    });
    const p2 = await cb.uploads.parts.create(upload.id, { data: new File(['def'], 'p') });
    const p1 = await ca.uploads.parts.create(upload.id, { data: new File(['abc'], 'p') });
    const done = await cb.uploads.complete(upload.id, { part_ids: [p1.id, p2.id] });
    assert.equal(await (await ca.files.content(done.file!.id)).text(), 'abcdef');
  });

  it("both instances' runners run every request exactly once", async () => {
    const before = worker.stats().received;
    const ids: string[] = [];
    for (const prefix of ['x', 'y', 'z']) {
      const lines = Array.from({ length: 5 }, (_, i) => chatLine(`${prefix}${i}`)).join('\n');
      const input = await ca.files.create({
        file: await toFile(Buffer.from(lines), 'in.jsonl'),
        purpose: 'batch',
      });
      const batch = await ca.batches.create({
        input_file_id: input.id,
        endpoint: '/v1/chat/completions',
        completion_window: '24h',
      });
      ids.push(batch.id);
    }
    const ra = new BatchRunner(a.services, a.app, { pollMs: 5, concurrency: 2 });
    const rb = new BatchRunner(b.services, b.app, { pollMs: 5, concurrency: 2 });
    ra.start();
    rb.start();
    try {
      const end = Date.now() + 20_000;
      for (const id of ids) {
        for (;;) {
          const batch = await cb.batches.retrieve(id);
          if (batch.status === 'completed') break;
          assert.ok(Date.now() < end, `batch ${id} is still ${batch.status}`);
          await new Promise((r) => setTimeout(r, 50));
        }
      }
    } finally {
      await Promise.all([ra.stop(), rb.stop()]);
    }
    assert.equal(worker.stats().received - before, 15);
    assert.equal(ra.stats.requests + rb.stats.requests, 15);
    for (const id of ids) {
      const batch = await ca.batches.retrieve(id);
      assert.deepEqual(batch.request_counts, { total: 5, completed: 5, failed: 0 });
      const text = await (await cb.files.content(batch.output_file_id!)).text();
      assert.equal(text.trim().split('\n').length, 5);
    }
  });
});
