/**
 * The Models API's writes (scope `inference`): a project's own models, visible to it
 * alone, changed and deleted only by it; the official SDK's list, retrieve and delete.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import {
  inferenceEndpoint,
  inferenceFixture,
  type InferenceFixture,
} from '../support/inference.js';
import { seedProject } from '../support/harness.js';
import { validateModelList } from '../support/openai-schemas.js';

/** The error object of an answer. */
function err(r: { body: Record<string, unknown> }): {
  code: string;
  param: string;
  message: string;
} {
  return r.body.error as { code: string; param: string; message: string };
}

describe('Models API writes', () => {
  let f: InferenceFixture;
  let sdk: OpenAI;
  let other: Awaited<ReturnType<typeof seedProject>>;
  const models = () => `/${f.projectId}/v1/models`;
  const call = (method: string, path: string, body?: unknown, key = f.key) =>
    f.server.call(method, path, { key, ...(body === undefined ? {} : { body }) });

  before(async () => {
    f = await inferenceFixture({ capabilities: ['embeddings'] });
    sdk = new OpenAI({
      baseURL: `${f.server.url}/${f.projectId}/v1`,
      apiKey: f.key,
      maxRetries: 0,
    });
    other = await seedProject(f.server, { slug: 'other' });
  });
  after(() => f.close());

  it('creates a project model, listed for the project alone', async () => {
    const r = await call('POST', models(), {
      id: 'team/embedder',
      context_window: 2048,
      capabilities: ['rerank', 'rerank'],
    });
    assert.equal(r.status, 201, r.text);
    assert.deepEqual(r.body, {
      id: 'team/embedder',
      object: 'model',
      created: r.body.created,
      owned_by: f.projectId,
      context_window: 2048,
      capabilities: ['rerank'],
    });
    const list = await sdk.models.list();
    assert.deepEqual(validateModelList({ object: 'list', data: list.data }), []);
    assert.deepEqual(list.data.map((m) => m.id).sort(), [
      'sim-model',
      'team/embedder',
      'test-model',
    ]);
    assert.equal((await sdk.models.retrieve('team/embedder')).owned_by, f.projectId);

    // Another project sees the platform's models, not this one's.
    const theirs = await call('GET', `/${other.projectId}/v1/models`, undefined, other.key);
    const names = (theirs.body.data as Array<{ id: string }>).map((m) => m.id);
    assert.ok(!names.includes('team/embedder'));
    assert.ok(names.includes('sim-model'));
    const hidden = await call(
      'GET',
      `/${other.projectId}/v1/models/team/embedder`,
      undefined,
      other.key,
    );
    assert.equal(hidden.status, 404);
    assert.equal(err(hidden).code, 'model_not_found');
  });

  it('rejects bad bodies with the field named, and a taken name with 409', async () => {
    const cases: Array<[unknown, string, string]> = [
      [{ context_window: 2048 }, 'invalid_body', 'id'],
      [{ id: 'has space', context_window: 2048 }, 'invalid_body', 'id'],
      // Segments no client can put in a path (the SDKs refuse them).
      [{ id: '..', context_window: 2048 }, 'invalid_body', 'id'],
      [{ id: 'team/./x', context_window: 2048 }, 'invalid_body', 'id'],
      [{ id: 'a//b', context_window: 2048 }, 'invalid_body', 'id'],
      [{ id: 'trailing/', context_window: 2048 }, 'invalid_body', 'id'],
      [{ id: 'm1', context_window: 0 }, 'invalid_body', 'context_window'],
      [
        { id: 'm1', context_window: 2048, capabilities: ['telepathy'] },
        'invalid_body',
        'capabilities[0]',
      ],
      [{ id: 'm1', context_window: 2048, owned_by: 'me' }, 'invalid_body', 'owned_by'],
    ];
    for (const [body, code, param] of cases) {
      const r = await call('POST', models(), body);
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.equal(err(r).code, code, JSON.stringify(body));
      assert.equal(err(r).param, param, JSON.stringify(body));
    }
    const taken = await call('POST', models(), { id: 'sim-model', context_window: 2048 });
    assert.equal(taken.status, 409);
    assert.equal(err(taken).code, 'conflict');
    assert.equal(err(taken).param, 'id');
  });

  it('needs scope inference; a key bound to an endpoint reads but does not write', async () => {
    const mgmt = await f.server.admin('POST', '/projects/inf/keys', { scopes: ['management'] });
    const denied = await call(
      'POST',
      models(),
      { id: 'm2', context_window: 64 },
      String(mgmt.body.key),
    );
    assert.equal(denied.status, 403);
    assert.equal(err(denied).code, 'scope_insufficient');

    const endpoints = await call('GET', `/${f.projectId}/v1/endpoints`);
    const endpointId = (endpoints.body.data as Array<{ id: string }>)[0]!.id;
    const bound = await f.server.admin('POST', '/projects/inf/keys', {
      scopes: ['inference'],
      endpointId,
    });
    assert.equal(bound.status, 201, bound.text);
    const key = String(bound.body.key);
    assert.equal((await call('GET', models(), undefined, key)).status, 200);
    const w = await call('POST', models(), { id: 'm2', context_window: 64 }, key);
    assert.equal(w.status, 403);
    assert.equal(err(w).code, 'endpoint_restricted');
    const d = await call('DELETE', `${models()}/team/embedder`, undefined, key);
    assert.equal(err(d).code, 'endpoint_restricted');
  });

  it('changes only its own models; a change reaches the endpoints that serve it', async () => {
    const platform = await call('PATCH', `${models()}/sim-model`, { context_window: 64 });
    assert.equal(platform.status, 403);
    assert.equal(err(platform).code, 'model_not_owned');
    const theirs = await call(
      'PATCH',
      `/${other.projectId}/v1/models/team/embedder`,
      { context_window: 64 },
      other.key,
    );
    assert.equal(theirs.status, 404);
    const bad = await call('PATCH', `${models()}/team/embedder`, { capabilities: 'all' });
    assert.equal(bad.status, 400);
    assert.equal(err(bad).param, 'capabilities');

    // An endpoint on the project's model, served by the sim worker.
    assert.equal(
      (
        await f.server.admin('POST', '/workers', {
          model: 'team/embedder',
          tier: 'cpu',
          url: f.worker.url,
          id: 'sim-emb',
        })
      ).status,
      201,
    );
    await inferenceEndpoint(f, 'emb', 'team/embedder');
    const emb = new OpenAI({
      baseURL: `${f.server.url}/${f.projectId}/emb/v1`,
      apiKey: f.key,
      maxRetries: 0,
    });
    const before = await emb.embeddings.create({ model: 'x', input: 'hi' }).then(
      () => null,
      (err: unknown) => err,
    );
    assert.ok(before instanceof OpenAI.BadRequestError);
    assert.equal(before.code, 'model_capability_missing');

    const p = await call('PATCH', `${models()}/team/embedder`, {
      capabilities: ['embeddings', 'rerank'],
    });
    assert.equal(p.status, 200, p.text);
    assert.deepEqual(p.body.capabilities, ['embeddings', 'rerank']);
    const ok = await emb.embeddings.create({ model: 'x', input: 'hi' });
    assert.equal(ok.model, 'team/embedder');
    assert.equal(ok.data.length, 1);
  });

  it('another project cannot put an endpoint on the model', async () => {
    const e = await f.server.admin('POST', '/projects/other/endpoints', {
      slug: 'borrowed',
      name: 'Borrowed',
      model: 'team/embedder',
      tier: 'cpu',
    });
    assert.equal(e.status, 404);
    assert.equal(err(e).code, 'model_not_found');
  });

  it('deletes a model no endpoint uses; its name is free again', async () => {
    const inUse = await call('DELETE', `${models()}/team/embedder`);
    assert.equal(inUse.status, 409);
    assert.equal(err(inUse).code, 'model_in_use');
    assert.match(err(inUse).message, /emb/);
    assert.equal((await f.server.admin('DELETE', '/projects/inf/endpoints/emb')).status, 200);
    // A worker still serves it.
    const served = await call('DELETE', `${models()}/team/embedder`);
    assert.equal(served.status, 409);
    assert.equal(err(served).code, 'model_in_use');
    assert.match(err(served).message, /sim-emb/);
    assert.equal((await f.server.admin('DELETE', '/workers/sim-emb')).status, 200);

    const platform = await sdk.models.delete('sim-model').then(
      () => null,
      (err: unknown) => err,
    );
    assert.ok(platform instanceof OpenAI.PermissionDeniedError);

    const gone = await sdk.models.delete('team/embedder');
    assert.deepEqual(gone, { id: 'team/embedder', object: 'model', deleted: true });
    const missing = await sdk.models.retrieve('team/embedder').then(
      () => null,
      (err: unknown) => err,
    );
    assert.ok(missing instanceof OpenAI.NotFoundError);
    assert.ok(!(await sdk.models.list()).data.some((m) => m.id === 'team/embedder'));
    const again = await call('POST', models(), { id: 'team/embedder', context_window: 512 });
    assert.equal(again.status, 201, again.text);
    assert.deepEqual(again.body.capabilities, []);
  });

  it('two projects may name their own models alike: each sees and is served its own', async () => {
    const mine = await call('POST', models(), { id: 'team/shared', context_window: 1024 });
    assert.equal(mine.status, 201, mine.text);
    // Another project's name is not this one's business: no 409 telling it apart.
    const theirs = await call(
      'POST',
      `/${other.projectId}/v1/models`,
      { id: 'team/shared', context_window: 2048 },
      other.key,
    );
    assert.equal(theirs.status, 201, theirs.text);
    const again = await call('POST', models(), { id: 'team/shared', context_window: 64 });
    assert.equal(again.status, 409);
    assert.equal(err(again).param, 'id');
    assert.equal((await sdk.models.retrieve('team/shared')).owned_by, f.projectId);

    // The operator's worker names the model with its project when the name repeats.
    const worker = (body: Record<string, unknown>) => f.server.admin('POST', '/workers', body);
    const base = { model: 'team/shared', tier: 'cpu', url: f.worker.url };
    const ambiguous = await worker({ ...base, id: 'w-which' });
    assert.equal(ambiguous.status, 400, ambiguous.text);
    assert.equal(err(ambiguous).code, 'missing_required_parameter');
    assert.equal(err(ambiguous).param, 'project');
    const unknown = await worker({ ...base, project: 'nope', id: 'w-nope' });
    assert.equal(err(unknown).code, 'project_not_found');
    assert.equal(err(unknown).param, 'project');
    assert.equal((await worker({ ...base, project: 'inf', id: 'w-inf' })).status, 201);
    assert.equal((await worker({ ...base, project: 'other', id: 'w-other' })).status, 201);
    const workers = await f.server.admin('GET', '/workers');
    const modelOf = (id: string) =>
      (workers.body.data as Array<{ id: string; model_id: string }>).find((w) => w.id === id)!
        .model_id;
    assert.notEqual(modelOf('w-inf'), modelOf('w-other'));

    // Each project's endpoint on `team/shared` is served by its own model's worker.
    await inferenceEndpoint(f, 'shared', 'team/shared');
    const e = await f.server.admin('POST', '/projects/other/endpoints', {
      slug: 'shared',
      name: 'shared',
      model: 'team/shared',
      tier: 'cpu',
    });
    assert.equal(e.status, 201, e.text);
    const served = async (projectId: string, key: string) => {
      const r = await f.server.call('POST', `/${projectId}/shared/v1/chat/completions`, {
        key,
        body: { model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
      });
      assert.equal(r.status, 200, r.text);
      return r.headers['x-service-worker-id'];
    };
    assert.equal(await served(f.projectId, f.key), 'w-inf');
    assert.equal(await served(other.projectId, other.key), 'w-other');

    // A platform model created later under the name stays hidden from the projects
    // that have their own; the others see it.
    const platform = await f.server.admin('POST', '/models', {
      name: 'team/shared',
      context_window: 4096,
    });
    assert.equal(platform.status, 201, platform.text);
    const listed = (await sdk.models.list()).data.filter((m) => m.id === 'team/shared');
    assert.deepEqual(
      listed.map((m) => m.owned_by),
      [f.projectId],
    );
    const third = await seedProject(f.server, { slug: 'third' });
    const seen = await call(
      'GET',
      `/${third.projectId}/v1/models/team/shared`,
      undefined,
      third.key,
    );
    assert.equal(seen.status, 200, seen.text);
    assert.equal(seen.body.owned_by, 'switchyard');
    // Without `project` the name now means the platform's model.
    const plain = await worker({ ...base, url: `${f.worker.url}/`, id: 'w-platform' });
    assert.equal(plain.status, 201, plain.text);
    assert.equal(plain.body.model_id, platform.body.uuid);
  });
});
