/**
 * Shapes of the project read routes: the model list and a model record
 * (validated against OpenAI's own schemas), and the endpoint listing with every
 * status but never deleted endpoints.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';
import { validateErrorResponse, validateModelList } from '../support/openai-schemas.js';

const ENDPOINT_FIELDS = [
  'id',
  'object',
  'slug',
  'name',
  'model_id',
  'model_name',
  'tier_id',
  'status',
  'custom_domain',
  'max_requests_per_minute',
  'max_tokens_per_minute',
  'provisioning_state',
  'provisioned_worker_id',
  'created',
].sort();

describe('project read routes', () => {
  let s: TestServer;
  let p: Awaited<ReturnType<typeof seedProject>>;
  before(async () => {
    s = await startTestServer();
    p = await seedProject(s, { slug: 'shapes', model: 'org/shape-model' });
    await s.admin('POST', '/models', { name: 'second', context_window: 2048, owned_by: 'acme' });
  });
  after(() => s.close());

  it('GET /<project_id>/v1/models is a list of Model entries', async () => {
    const r = await s.call('GET', `/${p.projectId}/v1/models`, { key: p.key });
    assert.equal(r.status, 200);
    assert.deepEqual(validateModelList(r.body), []);
    assert.equal(r.body.object, 'list');
    const data = r.body.data as Array<Record<string, unknown>>;
    assert.deepEqual(
      data.map((m) => m.id),
      ['org/shape-model', 'second'],
    );
    for (const m of data) {
      assert.deepEqual(Object.keys(m).sort(), ['created', 'id', 'object', 'owned_by']);
      assert.equal(m.object, 'model');
      assert.ok(Number.isInteger(m.created));
    }
    assert.equal(data[1]!.owned_by, 'acme');
  });

  it('GET /<project_id>/v1/models/{model} returns one record, names with / included', async () => {
    const r = await s.call('GET', `/${p.projectId}/v1/models/org/shape-model`, { key: p.key });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.id, 'org/shape-model');
    assert.equal(r.body.object, 'model');
    const missing = await s.call('GET', `/${p.projectId}/v1/models/nope`, { key: p.key });
    assert.equal(missing.status, 404);
    assert.deepEqual(validateErrorResponse(missing.body), []);
    assert.equal((missing.body.error as Record<string, unknown>).code, 'model_not_found');
  });

  it('GET /<project_id>/v1/models/{model}: a percent-encoded or malformed name is a 404', async () => {
    // `%25` is `%`: decoded once by the router, never a second time.
    for (const name of ['%25', '%25zz', 'a%25b%2541', 'org%2Fnope', '%E0%A4%A', '%']) {
      const r = await s.call('GET', `/${p.projectId}/v1/models/${name}`, { key: p.key });
      assert.equal(r.status, 404, `${name}: ${r.text}`);
      assert.deepEqual(validateErrorResponse(r.body), [], name);
      assert.equal((r.body.error as Record<string, unknown>).code, 'model_not_found', name);
      assert.match(String(r.headers['x-request-id']), /^req_[0-9a-f]{32}$/, name);
    }
    const encoded = await s.call('GET', `/${p.projectId}/v1/models/org%2Fshape-model`, {
      key: p.key,
    });
    assert.equal(encoded.status, 200, encoded.text);
    assert.equal(encoded.body.id, 'org/shape-model');
  });

  it('the model routes need the inference scope', async () => {
    const k = await s.admin('POST', '/projects/shapes/keys', { scopes: ['management'] });
    const r = await s.call('GET', `/${p.projectId}/v1/models`, { key: String(k.body.key) });
    assert.equal(r.status, 403);
    assert.equal((r.body.error as Record<string, unknown>).code, 'scope_insufficient');
  });

  it('GET /<project_id>/v1/endpoints lists every status and never deleted endpoints', async () => {
    // The pool gives `provisioning` (no worker) and `error` (its only worker draining);
    // `suspended` is the operator's.
    const w = await s.admin('POST', '/workers', {
      model: 'second',
      tier: 'gpu',
      url: 'http://127.0.0.1:9/v1',
    });
    assert.equal(w.status, 201, w.text);
    assert.equal((await s.admin('POST', `/workers/${String(w.body.id)}/drain`)).status, 200);
    for (const [status, tier] of [
      ['provisioning', 'free'],
      ['suspended', 'free'],
      ['error', 'gpu'],
    ] as const) {
      const e = await s.admin('POST', '/projects/shapes/endpoints', {
        slug: status,
        name: status,
        model: 'second',
        tier,
      });
      assert.equal(e.status, 201, e.text);
      if (status === 'suspended') {
        const u = await s.admin('PATCH', `/projects/shapes/endpoints/${status}`, { status });
        assert.equal(u.status, 200, u.text);
      }
      const got = await s.admin('GET', '/projects/shapes/endpoints');
      const row = (got.body.data as Array<Record<string, unknown>>).find((x) => x.slug === status);
      assert.equal(row?.status, status);
    }
    const gone = await s.admin('POST', '/projects/shapes/endpoints', {
      slug: 'gone',
      name: 'Gone',
      model: 'second',
      tier: 'free',
    });
    assert.equal((await s.admin('DELETE', `/projects/shapes/endpoints/gone`)).status, 200);

    const r = await s.call('GET', `/${p.projectId}/v1/endpoints`, { key: p.key });
    assert.equal(r.status, 200);
    assert.equal(r.body.object, 'list');
    const data = r.body.data as Array<Record<string, unknown>>;
    assert.deepEqual(
      data.map((e) => [e.slug, e.status]),
      [
        // Same creation second (fake clock): ordered by slug.
        ['error', 'error'],
        ['main', 'provisioning'],
        ['provisioning', 'provisioning'],
        ['suspended', 'suspended'],
      ],
    );
    assert.ok(!data.some((e) => e.id === gone.body.id));
    for (const e of data) {
      assert.deepEqual(Object.keys(e).sort(), ENDPOINT_FIELDS);
      assert.equal(e.object, 'endpoint');
      assert.match(String(e.id), /^[0-9a-f-]{36}$/);
      assert.match(String(e.model_id), /^[0-9a-f-]{36}$/);
      assert.ok(Number.isInteger(e.created));
      assert.ok(Number.isInteger(e.max_requests_per_minute));
      assert.ok(Number.isInteger(e.max_tokens_per_minute));
    }
    const main = data.find((e) => e.slug === 'main')!;
    assert.equal(main.model_name, 'org/shape-model');
    assert.equal(main.tier_id, 'cpu');
    assert.equal(main.custom_domain, null);
    assert.equal(main.max_requests_per_minute, 128 + 64);
    assert.equal(main.provisioning_state, 'waiting_for_worker');
  });

  it("a key bound to an endpoint gets 403 endpoint_restricted on another endpoint's models", async () => {
    const k = await s.admin('POST', '/projects/shapes/keys', {
      scopes: ['inference'],
      endpointId: p.endpointId,
    });
    assert.equal(k.status, 201, k.text);
    const bound = String(k.body.key);
    // `suspended` is another endpoint of the project (made above).
    const r = await s.call('GET', `/${p.projectId}/suspended/v1/models`, { key: bound });
    assert.equal(r.status, 403, r.text);
    assert.deepEqual(validateErrorResponse(r.body), []);
    assert.equal((r.body.error as Record<string, unknown>).code, 'endpoint_restricted');
    const own = await s.call('GET', `/${p.projectId}/main/v1/models`, { key: bound });
    assert.equal(own.status, 200, own.text);
    const unbound = await s.call('GET', `/${p.projectId}/suspended/v1/models`, { key: p.key });
    assert.equal(unbound.status, 200, unbound.text);
  });

  it('a key bound to an endpoint lists that endpoint only', async () => {
    const k = await s.admin('POST', '/projects/shapes/keys', {
      scopes: ['inference'],
      endpointId: p.endpointId,
    });
    assert.equal(k.status, 201, k.text);
    const r = await s.call('GET', `/${p.projectId}/v1/endpoints`, { key: String(k.body.key) });
    assert.equal(r.status, 200, r.text);
    const slugs = (r.body.data as Array<Record<string, unknown>>).map((e) => e.slug);
    assert.deepEqual(slugs, ['main']);
    const all = await s.call('GET', `/${p.projectId}/v1/endpoints`, { key: p.key });
    assert.ok((all.body.data as unknown[]).length > 1, 'the project has other endpoints');
  });

  it('an endpoint-scoped base URL can list its model (SDK models.list())', async () => {
    const r = await s.call('GET', `/${p.projectId}/main/v1/models`, { key: p.key });
    assert.equal(r.status, 200);
    assert.deepEqual(validateModelList(r.body), []);
    assert.deepEqual(
      (r.body.data as Array<Record<string, unknown>>).map((m) => m.id),
      ['org/shape-model'],
    );
  });

  it('an endpoint-scoped base URL filters its model list by ?capability, as the project list', async () => {
    const sdk = new OpenAI({
      baseURL: `${s.url}/${p.projectId}/main/v1`,
      apiKey: p.key,
      maxRetries: 0,
    });
    // The endpoint's model declares no capability: no model there can take `x_exec`.
    const tools = await sdk.models.list({ query: { capability: 'tool_calling' } });
    assert.deepEqual(tools.data, []);
    const project = await s.call('GET', `/${p.projectId}/v1/models?capability=tool_calling`, {
      key: p.key,
    });
    assert.deepEqual(project.body.data, []);
    const bad = await s.call('GET', `/${p.projectId}/main/v1/models?capability=telepathy`, {
      key: p.key,
    });
    assert.equal(bad.status, 400, bad.text);
    const e = bad.body.error as Record<string, unknown>;
    assert.equal(e.code, 'invalid_value');
    assert.equal(e.param, 'capability');
  });

  it('an endpoint-scoped base URL retrieves its model (SDK models.retrieve())', async () => {
    const sdk = new OpenAI({
      baseURL: `${s.url}/${p.projectId}/main/v1`,
      apiKey: p.key,
      maxRetries: 0,
    });
    const m = await sdk.models.retrieve('org/shape-model');
    assert.equal(m.id, 'org/shape-model');
    assert.equal(m.object, 'model');
    const list = await s.call('GET', `/${p.projectId}/main/v1/models`, { key: p.key });
    assert.deepEqual(m, (list.body.data as unknown[])[0]);
    // Another model, even a visible one, is not what this endpoint serves.
    const other = await s.call('GET', `/${p.projectId}/main/v1/models/no-such-model`, {
      key: p.key,
    });
    assert.equal(other.status, 404);
    assert.equal((other.body.error as Record<string, unknown>).code, 'model_not_found');
  });
});
