/**
 * Paths the router refuses before any route runs (not valid percent-encoding,
 * a segment over the parameter length limit) are answered like every other
 * failure: the spec's error envelope and X-Request-ID.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

describe('router refusals', () => {
  let s: TestServer;
  let p: Awaited<ReturnType<typeof seedProject>>;
  before(async () => {
    s = await startTestServer();
    p = await seedProject(s, { slug: 'badurl', scopes: ['management'] });
  });
  after(() => s.close());

  for (const [name, path] of [
    ['undecodable path', () => `/${p.projectId}/main/v1/webhooks/%E0%A4%A`],
    ['over-long segment', () => `/${p.projectId}/main/v1/webhooks/${'w'.repeat(300)}`],
  ] as const) {
    it(`${name}: 404 route_not_found in the envelope, with X-Request-ID`, async () => {
      const r = await s.call('GET', path(), { key: p.key });
      assert.equal(r.status, 404, r.text);
      assert.match(String(r.headers['x-request-id']), /^req_[0-9a-f]{32}$/);
      assert.deepEqual(r.body, {
        error: {
          message: (r.body.error as Record<string, unknown>).message,
          type: 'invalid_request_error',
          code: 'route_not_found',
          param: null,
        },
      });
    });
  }
});
