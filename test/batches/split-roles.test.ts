/**
 * Batches with the roles on different processes (issue 8, "Roles and scale-out"):
 * `switchyard serve --roles api` takes the batch and `switchyard serve --roles
 * dispatcher` runs it. The runner sends each line through the API's routes in its
 * own process, which a dispatcher without the api role used to lack: every line
 * failed 404 and the batch still ended `completed`.
 *
 * Needs PostgreSQL (TEST_DATABASE_URL); runs the built binary (`npm run build` first).
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import OpenAI, { toFile } from 'openai';
import { startSimWorker, type SimWorker } from '../../src/workers/sim/index.js';
import { cluster, type RouterProcess } from '../support/cluster.js';
import { seedProject, sharedServices } from '../support/harness.js';
import { chatLine } from './support.js';

const { skip } = sharedServices();

describe(
  'a batch taken by an api instance, run by a dispatcher instance',
  { skip, timeout: 90_000 },
  () => {
    const routers = cluster({ store: false });
    let worker: SimWorker;
    let api: RouterProcess;

    before(async () => {
      worker = await startSimWorker({ model: 'sim-model', contextWindow: 4096 });
      api = await routers.serve({ args: ['--roles', 'api'] });
      await routers.serve({ args: ['--roles', 'dispatcher'] });
    });
    after(() => worker?.close());

    it('every line runs and succeeds', async () => {
      const seeded = await seedProject(api, {
        slug: 'split',
        model: 'sim-model',
        worker: { url: worker.url },
        endpointSlug: 'chat',
      });
      const client = new OpenAI({ baseURL: seeded.baseURL, apiKey: seeded.key, maxRetries: 0 });
      const file = await client.files.create({
        file: await toFile(Buffer.from(`${chatLine('a')}\n${chatLine('b')}\n`), 'in.jsonl'),
        purpose: 'batch',
      });
      const batch = await client.batches.create({
        input_file_id: file.id,
        endpoint: '/v1/chat/completions',
        completion_window: '24h',
      });
      let done = batch;
      for (let i = 0; i < 50 && done.status !== 'completed' && done.status !== 'failed'; i++) {
        await sleep(500);
        done = await client.batches.retrieve(batch.id);
      }
      assert.equal(done.status, 'completed');
      assert.deepEqual(done.request_counts, { total: 2, completed: 2, failed: 0 });
    });
  },
);
