/**
 * The SLO API over HTTP (docs/SLOS.md): CRUD on the project and endpoint
 * paths, validation (400 `invalid_body` naming the field), 404s, scopes and
 * endpoint-bound keys, the 20-per-endpoint cap, the shared management limit,
 * attainment figures computed from usage records inside and outside the
 * window as the fake clock moves, and the router's `targets()` read (the
 * tightest targets, refreshed on change). On PGlite, and on PostgreSQL when
 * TEST_DATABASE_URL is set.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import { MAX_SLOS_PER_ENDPOINT } from '../../src/slos/service.js';
import { tables } from '../../src/store/index.js';
import {
  drivers,
  seedProject,
  startTestServer,
  type Res,
  type TestServer,
} from '../support/harness.js';

function err(r: Res): Record<string, unknown> {
  return (r.body.error ?? {}) as Record<string, unknown>;
}

function expectError(r: Res, status: number, code: string, param?: string | null): void {
  assert.equal(r.status, status, r.text);
  assert.equal(err(r).code, code, r.text);
  if (param !== undefined) assert.equal(err(r).param, param, r.text);
}

const MINUTE = 60_000;

for (const driver of drivers()) {
  describe(`SLO API (${driver})`, () => {
    let s: TestServer;
    let p: Awaited<ReturnType<typeof seedProject>>;
    let other: Awaited<ReturnType<typeof seedProject>>;
    let projectUuid: string;
    let inferenceKey: string;
    const endpoints: Record<string, string> = {};

    const call = (method: string, path: string, body?: unknown, key = p.key) =>
      s.call(method, path, { key, body });
    const slos = (endpoint?: string) =>
      endpoint ? `/${p.projectId}/${endpoint}/v1/slos` : `/${p.projectId}/v1/slos`;

    async function addEndpoint(slug: string): Promise<string> {
      const r = await s.admin('POST', `/projects/${p.projectSlug}/endpoints`, {
        slug,
        name: slug,
        model: 'test-model',
        tier: 'cpu',
      });
      assert.equal(r.status, 201, r.text);
      endpoints[slug] = String(r.body.id);
      return String(r.body.id);
    }

    /** A usage record of the project, `agoMs` before now (negative: in the future). */
    async function usage(
      endpoint: string,
      agoMs: number,
      r: { ttft: number | null; duration: number; tokens: number; status?: string },
    ): Promise<void> {
      await s.services.store.db.insert(tables.usageRecords).values({
        requestId: `chatcmpl-${randomUUID()}`,
        projectId: projectUuid,
        endpointId: endpoints[endpoint]!,
        model: 'test-model',
        tierId: 'cpu',
        status: r.status ?? 'completed',
        stream: r.ttft === null ? 0 : 1,
        promptTokens: 10,
        completionTokens: r.tokens,
        ttftMs: r.ttft,
        durationMs: r.duration,
        createdAt: new Date(s.clock.now() - agoMs),
      });
    }

    before(async () => {
      s = await startTestServer({ driver });
      p = await seedProject(s, {
        slug: 'slo',
        scopes: ['management', 'inference'],
        quotaRequests: 100_000,
      });
      other = await seedProject(s, { slug: 'slo-other', scopes: ['management'] });
      endpoints.main = p.endpointId;
      await addEndpoint('second');
      const [row] = await s.services.store.db
        .select({ id: tables.projects.id })
        .from(tables.projects)
        .where(eq(tables.projects.externalId, p.projectId));
      projectUuid = row!.id;
      const k = await s.admin('POST', `/projects/${p.projectSlug}/keys`, { scopes: ['inference'] });
      assert.equal(k.status, 201, k.text);
      inferenceKey = String(k.body.key);
    });
    after(() => s.close());

    it('creates, reads on both paths, lists, updates and deletes', async () => {
      s.clock.advance(2 * MINUTE);
      const c = await call('POST', slos('main'), { name: 'chat p99', ttft_ms: 200 });
      assert.equal(c.status, 201, c.text);
      assert.deepEqual(Object.keys(c.body).sort(), [
        'attainment',
        'created_at',
        'endpoint',
        'endpoint_id',
        'id',
        'name',
        'object',
        'objective',
        'tpot_ms',
        'ttft_ms',
        'updated_at',
        'window_seconds',
      ]);
      assert.match(String(c.body.id), /^slo_[0-9a-f]{24}$/);
      assert.equal(c.body.object, 'slo');
      assert.equal(c.body.endpoint, 'main');
      assert.equal(c.body.endpoint_id, p.endpointId);
      assert.equal(c.body.ttft_ms, 200);
      assert.equal(c.body.tpot_ms, null);
      assert.equal(c.body.objective, 0.99);
      assert.equal(c.body.window_seconds, 3600);
      const now = Math.floor(s.clock.now() / 1000);
      assert.equal(c.body.created_at, now);
      assert.deepEqual(c.body.attainment, {
        window_start: now - 3600,
        window_end: now,
        requests: 0,
        ttft: { met: 0, total: 0, attainment: null, p50_ms: null, p99_ms: null },
        tpot: null,
        met_objective: null,
      });
      const id = String(c.body.id);

      const got = await call('GET', `${slos('main')}/${id}`);
      assert.equal(got.status, 200, got.text);
      assert.deepEqual(got.body, c.body);
      assert.deepEqual((await call('GET', `${slos()}/${id}`)).body, c.body);
      // Another endpoint's path does not show it.
      expectError(await call('GET', `${slos('second')}/${id}`), 404, 'slo_not_found', 'slo_id');

      s.clock.advance(1000);
      const c2 = await call('POST', slos(), {
        endpoint: 'second',
        tpot_ms: 40,
        objective: 0.9,
        window_seconds: 600,
      });
      assert.equal(c2.status, 201, c2.text);
      assert.equal(c2.body.endpoint, 'second');
      assert.equal(c2.body.name, '');
      s.clock.advance(1); // distinct created_at: the list order is by it
      // The endpoint may also be named by its id.
      const c3 = await call('POST', slos(), { endpoint: endpoints.second, ttft_ms: 900 });
      assert.equal(c3.status, 201, c3.text);
      assert.equal(c3.body.endpoint, 'second');

      const all = await call('GET', slos());
      assert.equal(all.status, 200);
      assert.equal(all.body.object, 'list');
      assert.equal(all.body.has_more, false);
      const ids = (all.body.data as Array<Record<string, unknown>>).map((x) => x.id);
      assert.deepEqual(ids, [c3.body.id, c2.body.id, id]);
      const onMain = await call('GET', slos('main'));
      assert.deepEqual(
        (onMain.body.data as Array<Record<string, unknown>>).map((x) => x.id),
        [id],
      );

      s.clock.advance(5000);
      const u = await call('PATCH', `${slos('main')}/${id}`, {
        tpot_ms: 25.5,
        objective: 0.95,
        name: 'renamed',
      });
      assert.equal(u.status, 200, u.text);
      assert.equal(u.body.ttft_ms, 200);
      assert.equal(u.body.tpot_ms, 25.5);
      assert.equal(u.body.objective, 0.95);
      assert.equal(u.body.name, 'renamed');
      assert.equal(Number(u.body.updated_at) - Number(u.body.created_at), 6);
      assert.deepEqual((u.body.attainment as Record<string, unknown>).tpot, {
        met: 0,
        total: 0,
        attainment: null,
        p50_ms: null,
        p99_ms: null,
      });
      const dropTtft = await call('PATCH', `${slos()}/${id}`, { ttft_ms: null });
      assert.equal(dropTtft.status, 200, dropTtft.text);
      assert.equal(dropTtft.body.ttft_ms, null);
      assert.equal((dropTtft.body.attainment as Record<string, unknown>).ttft, null);
      // Removing the last target is refused and changes nothing.
      expectError(
        await call('PATCH', `${slos()}/${id}`, { tpot_ms: null }),
        400,
        'invalid_body',
        'ttft_ms',
      );
      assert.equal((await call('GET', `${slos()}/${id}`)).body.tpot_ms, 25.5);

      const d = await call('DELETE', `${slos('main')}/${id}`);
      assert.equal(d.status, 200, d.text);
      assert.deepEqual(d.body, { id, object: 'slo', deleted: true });
      expectError(await call('GET', `${slos()}/${id}`), 404, 'slo_not_found', 'slo_id');
      expectError(await call('DELETE', `${slos()}/${id}`), 404, 'slo_not_found');
      expectError(await call('PATCH', `${slos()}/${id}`, { ttft_ms: 1 }), 404, 'slo_not_found');
      for (const bad of ['nope', 'slo_XYZ', randomUUID(), 'slo_' + '0'.repeat(24)]) {
        expectError(await call('GET', `${slos()}/${bad}`), 404, 'slo_not_found');
      }
      for (const x of [c2, c3]) {
        assert.equal((await call('DELETE', `${slos()}/${String(x.body.id)}`)).status, 200);
      }
    });

    it('refuses each bad field with 400 invalid_body naming it', async () => {
      s.clock.advance(2 * MINUTE);
      const cases: Array<[unknown, string]> = [
        [{}, 'ttft_ms'],
        [{ name: 'no target' }, 'ttft_ms'],
        [{ ttft_ms: null, tpot_ms: null }, 'ttft_ms'],
        [{ ttft_ms: 0 }, 'ttft_ms'],
        [{ ttft_ms: -5 }, 'ttft_ms'],
        [{ ttft_ms: 'fast' }, 'ttft_ms'],
        [{ ttft_ms: 3_600_001 }, 'ttft_ms'],
        [{ tpot_ms: 0 }, 'tpot_ms'],
        [{ tpot_ms: '20' }, 'tpot_ms'],
        [{ tpot_ms: 60_001 }, 'tpot_ms'],
        [{ ttft_ms: 100, objective: 0 }, 'objective'],
        [{ ttft_ms: 100, objective: 1 }, 'objective'],
        [{ ttft_ms: 100, objective: 1.5 }, 'objective'],
        [{ ttft_ms: 100, objective: '0.9' }, 'objective'],
        [{ ttft_ms: 100, window_seconds: 59 }, 'window_seconds'],
        [{ ttft_ms: 100, window_seconds: 30 * 86_400 + 1 }, 'window_seconds'],
        [{ ttft_ms: 100, window_seconds: 60.5 }, 'window_seconds'],
        [{ ttft_ms: 100, name: 'n'.repeat(201) }, 'name'],
        [{ ttft_ms: 100, name: 5 }, 'name'],
        [{ ttft_ms: 100, colour: 'blue' }, 'colour'],
        // On an endpoint's path the body may not name another endpoint.
        [{ ttft_ms: 100, endpoint: 'second' }, 'endpoint'],
        [[1, 2], 'body'],
      ];
      for (const [body, param] of cases) {
        const r = await call('POST', slos('main'), body);
        assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
        assert.equal(err(r).code, 'invalid_body', r.text);
        assert.equal(err(r).param ?? 'body', param, `${JSON.stringify(body)}: ${r.text}`);
      }
      // The project path needs the endpoint, and an existing one.
      expectError(await call('POST', slos(), { ttft_ms: 100 }), 400, 'invalid_body', 'endpoint');
      expectError(
        await call('POST', slos(), { ttft_ms: 100, endpoint: 'nope' }),
        404,
        'endpoint_not_found',
        'endpoint',
      );
      // The endpoint name on the same endpoint's path is accepted.
      const ok = await call('POST', slos('main'), { ttft_ms: 100, endpoint: 'main' });
      assert.equal(ok.status, 201, ok.text);
      const id = String(ok.body.id);
      const patches: Array<[unknown, string]> = [
        [{ endpoint: 'second' }, 'endpoint'],
        [{ objective: 2 }, 'objective'],
        [{ ttft_ms: -1 }, 'ttft_ms'],
        [{ window_seconds: 0 }, 'window_seconds'],
        [{ ttft_ms: null }, 'ttft_ms'],
      ];
      for (const [body, param] of patches) {
        expectError(await call('PATCH', `${slos()}/${id}`, body), 400, 'invalid_body', param);
      }
      expectError(await call('GET', `${slos()}?limit=0`), 400, 'invalid_body', 'limit');
      expectError(await call('GET', `${slos()}?limit=101`), 400, 'invalid_body', 'limit');
      expectError(await call('GET', `${slos()}?after=slo_nope`), 400, 'invalid_body', 'after');
      const bad = await s.call('POST', slos('main'), { key: p.key });
      assert.equal(bad.status, 400, bad.text);
      assert.equal((await call('DELETE', `${slos()}/${id}`)).status, 200);
    });

    it('needs the management scope, the project, an existing endpoint; bound keys see one endpoint', async () => {
      s.clock.advance(2 * MINUTE);
      expectError(await call('GET', slos(), undefined, inferenceKey), 403, 'scope_insufficient');
      expectError(
        await call('POST', slos('main'), { ttft_ms: 1 }, inferenceKey),
        403,
        'scope_insufficient',
      );
      expectError(await s.call('GET', slos()), 401, 'missing_api_key');
      expectError(await call('GET', slos(), undefined, other.key), 403, 'cross_project_access');
      expectError(await call('GET', slos('nope')), 404, 'endpoint_not_found');
      // Segments of an id's length and alphabet that are no UUID name no endpoint either.
      for (const ref of ['a'.repeat(36), '-'.repeat(36)]) {
        expectError(await call('GET', slos(ref)), 404, 'endpoint_not_found');
        expectError(
          await call('POST', slos(), { endpoint: ref, ttft_ms: 1 }),
          404,
          'endpoint_not_found',
          'endpoint',
        );
      }

      const onMain = await call('POST', slos('main'), { ttft_ms: 100 });
      const onSecond = await call('POST', slos('second'), { ttft_ms: 100 });
      assert.equal(onMain.status, 201);
      assert.equal(onSecond.status, 201);
      // Another project's key cannot read it through its own project either.
      expectError(
        await s.call('GET', `/${other.projectId}/v1/slos/${String(onMain.body.id)}`, {
          key: other.key,
        }),
        404,
        'slo_not_found',
      );

      const k = await s.admin('POST', `/projects/${p.projectSlug}/keys`, {
        scopes: ['management'],
        endpointId: endpoints.second,
      });
      assert.equal(k.status, 201, k.text);
      const bound = String(k.body.key);
      expectError(await call('GET', slos('main'), undefined, bound), 403, 'endpoint_restricted');
      const list = await call('GET', slos(), undefined, bound);
      assert.equal(list.status, 200, list.text);
      assert.deepEqual(
        (list.body.data as Array<Record<string, unknown>>).map((x) => x.id),
        [onSecond.body.id],
      );
      expectError(
        await call('GET', `${slos()}/${String(onMain.body.id)}`, undefined, bound),
        404,
        'slo_not_found',
      );
      expectError(
        await call('POST', slos(), { endpoint: 'main', ttft_ms: 5 }, bound),
        400,
        'invalid_body',
        'endpoint',
      );
      const made = await call('POST', slos(), { ttft_ms: 5 }, bound);
      assert.equal(made.status, 201, made.text);
      assert.equal(made.body.endpoint, 'second');
      for (const x of [onMain, onSecond, made]) {
        assert.equal((await call('DELETE', `${slos()}/${String(x.body.id)}`)).status, 200);
      }
    });

    it(`at most ${MAX_SLOS_PER_ENDPOINT} SLOs per endpoint; pages newest first`, async () => {
      s.clock.advance(2 * MINUTE);
      await addEndpoint('capped');
      const made: string[] = [];
      for (let i = 0; i < MAX_SLOS_PER_ENDPOINT; i++) {
        s.clock.advance(10);
        const r = await call('POST', slos('capped'), { ttft_ms: 100 + i });
        assert.equal(r.status, 201, r.text);
        made.push(String(r.body.id));
      }
      expectError(await call('POST', slos('capped'), { ttft_ms: 1 }), 400, 'slo_limit');
      // Another endpoint is not affected.
      const elsewhere = await call('POST', slos('second'), { ttft_ms: 1 });
      assert.equal(elsewhere.status, 201, elsewhere.text);
      const page1 = await call('GET', `${slos('capped')}?limit=7`);
      assert.equal(page1.status, 200);
      const d1 = page1.body.data as Array<Record<string, unknown>>;
      assert.equal(page1.body.has_more, true);
      assert.deepEqual(
        d1.map((x) => x.id),
        made.slice(-7).reverse(),
      );
      const page3 = await call('GET', `${slos('capped')}?limit=7&after=${made[6]!}`);
      assert.deepEqual(
        (page3.body.data as Array<Record<string, unknown>>).map((x) => x.id),
        made.slice(0, 6).reverse(),
      );
      assert.equal(page3.body.has_more, false);
      // Deleting one makes room again.
      assert.equal((await call('DELETE', `${slos()}/${made[0]!}`)).status, 200);
      assert.equal((await call('POST', slos('capped'), { ttft_ms: 1 })).status, 201);
      assert.equal((await call('DELETE', `${slos()}/${String(elsewhere.body.id)}`)).status, 200);
    });

    it('shares the management limit (60/min per project) with webhooks; inference and budget alerts do not count', async () => {
      s.clock.advance(2 * MINUTE);
      let last: Res | undefined;
      for (let i = 0; i < 60; i++) {
        last =
          i % 2 === 0
            ? await call('GET', `${slos()}?limit=1`)
            : await call('GET', `/${p.projectId}/v1/webhooks?limit=1`);
        assert.equal(last.status, 200, last.text);
        await call('GET', `/${p.projectId}/v1/models`);
        // The spec's shared limit names batch, conversations, files, uploads,
        // webhooks and SLOs; budget alerts are not among them.
        if (i % 10 === 0) {
          assert.equal((await call('GET', `/${p.projectId}/v1/budget_alerts`)).status, 200);
        }
      }
      assert.equal(last!.headers['x-ratelimit-limit'], '60');
      assert.equal(last!.headers['x-ratelimit-remaining'], '0');
      const limited = await call('GET', slos('main'));
      expectError(limited, 429, 'rate_limit_exceeded');
      assert.equal(limited.headers['retry-after'], '60');
      assert.equal(err(limited).retry_after, 60);
      assert.equal(limited.headers['x-ratelimit-limit'], '60');
      expectError(await call('POST', slos('main'), { ttft_ms: 1 }), 429, 'rate_limit_exceeded');
      expectError(await call('GET', `/${p.projectId}/v1/webhooks`), 429, 'rate_limit_exceeded');
      assert.equal((await call('GET', `/${p.projectId}/v1/budget_alerts`)).status, 200);
      // Another project has its own budget.
      assert.equal(
        (await call('GET', `/${other.projectId}/v1/slos`, undefined, other.key)).status,
        200,
      );
      s.clock.advance(MINUTE);
      const again = await call('GET', slos());
      assert.equal(again.status, 200, again.text);
      assert.equal(again.headers['x-ratelimit-remaining'], '59');
    });

    it('computes attainment exactly from the records in the window as the clock moves', async () => {
      s.clock.advance(2 * MINUTE);
      await addEndpoint('lat');
      await addEndpoint('noise');
      const T = s.clock.now();
      const sec = 1000;
      // tpot = (duration - ttft) / (tokens - 1)
      await usage('lat', 500 * sec, { ttft: 50, duration: 50 + 9 * 10, tokens: 10 }); // tpot 10
      await usage('lat', 500 * sec, { ttft: 100, duration: 100 + 4 * 20, tokens: 5 }); // tpot 20
      await usage('lat', 100 * sec, { ttft: 150, duration: 150 + 2 * 30, tokens: 3 }); // tpot 30
      await usage('lat', 100 * sec, { ttft: 80, duration: 300, tokens: 1 }); // no tpot
      await usage('lat', 100 * sec, { ttft: null, duration: 900, tokens: 50 }); // not streamed
      await usage('lat', 600 * sec - 1, { ttft: 120, duration: 120 + 25, tokens: 2 }); // tpot 25
      // Outside: not completed, on the window's open start, in the future, another endpoint.
      await usage('lat', 10 * sec, { ttft: 10, duration: 20, tokens: 2, status: 'error' });
      await usage('lat', 10 * sec, { ttft: 10, duration: 20, tokens: 2, status: 'cancelled' });
      await usage('lat', 600 * sec, { ttft: 10, duration: 20, tokens: 2 });
      await usage('lat', 700 * sec, { ttft: 10, duration: 20, tokens: 2 });
      await usage('lat', -1, { ttft: 60, duration: 60 + 10 * 5, tokens: 11 }); // tpot 5
      await usage('noise', 10 * sec, { ttft: 1, duration: 2, tokens: 2 });

      const c = await call('POST', slos('lat'), {
        ttft_ms: 100,
        tpot_ms: 20,
        objective: 0.75,
        window_seconds: 600,
      });
      assert.equal(c.status, 201, c.text);
      const ttftOnly = await call('POST', slos('lat'), { ttft_ms: 120, window_seconds: 600 });
      const tpotOnly = await call('POST', slos('lat'), { tpot_ms: 25, window_seconds: 600 });
      const id = String(c.body.id);
      const end = Math.floor(T / 1000);
      const expected = {
        window_start: end - 600,
        window_end: end,
        requests: 6,
        // ttft 50, 80, 100, 120, 150
        ttft: { met: 3, total: 5, attainment: 0.6, p50_ms: 100, p99_ms: 148.8 },
        // tpot 10, 20, 25, 30
        tpot: { met: 2, total: 4, attainment: 0.5, p50_ms: 22.5, p99_ms: 29.85 },
        met_objective: false,
      };
      assert.deepEqual(c.body.attainment, expected);
      assert.deepEqual((await call('GET', `${slos()}/${id}`)).body.attainment, expected);

      // A list computes each SLO's own figures.
      const list = await call('GET', slos('lat'));
      const byId = new Map(
        (list.body.data as Array<Record<string, unknown>>).map((x) => [x.id, x.attainment]),
      );
      assert.deepEqual(byId.get(id), expected);
      assert.deepEqual(byId.get(ttftOnly.body.id), {
        ...expected,
        ttft: { ...expected.ttft, met: 4, attainment: 0.8 },
        tpot: null,
        met_objective: false, // 0.8 < 0.99
      });
      assert.deepEqual(byId.get(tpotOnly.body.id), {
        ...expected,
        ttft: null,
        tpot: { ...expected.tpot, met: 3, attainment: 0.75 },
        met_objective: false,
      });

      // Five minutes on: the window is (T - 300 s, T + 300 s].
      s.clock.advance(300 * sec);
      const later = {
        window_start: end + 300 - 600,
        window_end: end + 300,
        requests: 4,
        // ttft 60, 80, 150
        ttft: { met: 2, total: 3, attainment: 2 / 3, p50_ms: 80, p99_ms: 148.6 },
        // tpot 5, 30
        tpot: { met: 1, total: 2, attainment: 0.5, p50_ms: 17.5, p99_ms: 29.75 },
        met_objective: false,
      };
      assert.deepEqual((await call('GET', `${slos()}/${id}`)).body.attainment, later);
      // At objective 0.5 both targets meet it (0.5 >= 0.5 counts).
      const relaxed = await call('PATCH', `${slos()}/${id}`, { objective: 0.5 });
      assert.equal(relaxed.status, 200, relaxed.text);
      assert.deepEqual(relaxed.body.attainment, { ...later, met_objective: true });
      // A longer window takes the older records back in.
      const wide = await call('PATCH', `${slos()}/${id}`, { window_seconds: 3600 });
      const wa = wide.body.attainment as Record<string, unknown>;
      assert.equal(wa.requests, 9); // + the records 600 s and 700 s before T, and the two at 500 s
      assert.equal(wa.window_start, end + 300 - 3600);

      // When every record has left the window: no data, no verdict.
      s.clock.advance(3600 * sec);
      const empty = (await call('GET', `${slos()}/${id}`)).body.attainment as Record<
        string,
        unknown
      >;
      assert.equal(empty.requests, 0);
      assert.deepEqual(empty.ttft, {
        met: 0,
        total: 0,
        attainment: null,
        p50_ms: null,
        p99_ms: null,
      });
      assert.equal(empty.met_objective, null);
    });

    it('PATCHes at once each change only their own fields, and never leave the SLO without a target', async () => {
      for (let i = 0; i < 10; i++) {
        s.clock.advance(2 * MINUTE); // the management limit starts afresh
        const c = await call('POST', slos('main'), { ttft_ms: 100, tpot_ms: 10 });
        assert.equal(c.status, 201, c.text);
        const path = `${slos()}/${String(c.body.id)}`;
        const both = await Promise.all([
          call('PATCH', path, { ttft_ms: 50 }),
          call('PATCH', path, { name: 'renamed' }),
        ]);
        for (const r of both) assert.equal(r.status, 200, r.text);
        const got = await call('GET', path);
        assert.equal(got.body.ttft_ms, 50, `round ${i}: the rename undid the new target`);
        assert.equal(got.body.name, 'renamed');
        // Each clears one target: the second to apply is refused, one target remains.
        const cleared = await Promise.all([
          call('PATCH', path, { ttft_ms: null }),
          call('PATCH', path, { tpot_ms: null }),
        ]);
        assert.deepEqual(cleared.map((r) => r.status).sort(), [200, 400], cleared[1]!.text);
        const left = await call('GET', path);
        assert.equal(
          [left.body.ttft_ms, left.body.tpot_ms].filter((t) => t !== null).length,
          1,
          left.text,
        );
        assert.equal((await call('DELETE', path)).status, 200);
      }
    });

    it('targets(): the tightest targets of the endpoint, cached, refreshed on change', async () => {
      s.clock.advance(2 * MINUTE);
      const ep = await addEndpoint('routed');
      const svc = s.services.slos;
      assert.deepEqual(await svc.targets(ep), {});
      const a = await call('POST', slos('routed'), { ttft_ms: 300, tpot_ms: 50 });
      const b = await call('POST', slos('routed'), { ttft_ms: 200 });
      const c = await call('POST', slos('routed'), { tpot_ms: 40 });
      for (const r of [a, b, c]) assert.equal(r.status, 201, r.text);
      assert.deepEqual(await svc.targets(ep), { ttftMs: 200, tpotMs: 40 });
      // Served from the cache: a plain value, no promise.
      const cached = svc.targets(ep);
      assert.ok(!(cached instanceof Promise));
      assert.deepEqual(cached, { ttftMs: 200, tpotMs: 40 });
      // Other endpoints are separate.
      assert.deepEqual(await svc.targets(await addEndpoint('quiet')), {});

      const u = await call('PATCH', `${slos()}/${String(b.body.id)}`, { ttft_ms: 500 });
      assert.equal(u.status, 200, u.text);
      assert.deepEqual(await svc.targets(ep), { ttftMs: 300, tpotMs: 40 });
      await call('DELETE', `${slos()}/${String(c.body.id)}`);
      assert.deepEqual(await svc.targets(ep), { ttftMs: 300, tpotMs: 50 });
      await call('PATCH', `${slos()}/${String(a.body.id)}`, { ttft_ms: null });
      assert.deepEqual(await svc.targets(ep), { ttftMs: 500, tpotMs: 50 });

      // A change that bypasses the service shows once the TTL (1 s) has passed.
      await s.services.store.db
        .update(tables.slos)
        .set({ ttftMs: 5 })
        .where(eq(tables.slos.externalId, String(b.body.id)));
      assert.deepEqual(await svc.targets(ep), { ttftMs: 500, tpotMs: 50 });
      s.clock.advance(2001);
      assert.deepEqual(await svc.targets(ep), { ttftMs: 5, tpotMs: 50 });

      // Deleting the endpoint takes its SLOs and targets with it.
      const d = await s.admin('DELETE', `/projects/${p.projectSlug}/endpoints/routed`);
      assert.equal(d.status, 200, d.text);
      expectError(await call('GET', `${slos()}/${String(a.body.id)}`), 404, 'slo_not_found');
      expectError(await call('GET', slos('routed')), 404, 'endpoint_not_found');
    });
  });
}
