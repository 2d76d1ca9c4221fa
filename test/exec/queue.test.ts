/**
 * The scheduler's queue step over more queued invocations than one page (100): those
 * no connected agent can take now stay queued and do not hold up the ones behind them.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { drivers, startTestServer, type TestServer } from '../support/harness.js';
import {
  enrollAgent,
  FakeTransport,
  seedExecProject,
  tool,
  workspace,
  type ExecProject,
} from './support.js';

for (const driver of drivers()) {
  describe(`exec scheduler queue (${driver})`, () => {
    let s: TestServer;
    let p: ExecProject;
    let t: FakeTransport;
    let near: string;
    let ws: string;
    before(async () => {
      s = await startTestServer({ driver });
      p = await seedExecProject(s, 'queue');
      t = new FakeTransport();
      // Online (its lease is current) but connected to no broker here.
      await enrollAgent(s, p, { name: 'away', tools: [tool('far')] });
      near = (await enrollAgent(s, p, { name: 'here', tools: [tool('near')], transport: t }))
        .agentId;
      ws = await workspace(s, p);
    });
    after(() => s.close());

    const create = (name: string) =>
      s.call('POST', `/${p.projectId}/v1/exec/invocations`, {
        key: p.exec,
        body: { tool: name, arguments: { path: '/' }, workspace_id: ws },
      });

    it('an invocation queued behind a full page of undispatchable ones is dispatched', async () => {
      // An API-only instance (no broker) stores them queued for the online agents.
      s.services.exec.setTransport(null);
      for (let i = 0; i < 100; i++) {
        const r = await create('far');
        assert.equal(r.status, 201, r.text);
        assert.equal(r.body.status, 'queued');
      }
      s.clock.advance(1);
      const last = await create('near');
      assert.equal(last.body.status, 'queued', last.text);

      s.services.exec.setTransport(t);
      await s.services.exec.tick();
      const got = await s.call(
        'GET',
        `/${p.projectId}/v1/exec/invocations/${String(last.body.id)}`,
        {
          key: p.exec,
        },
      );
      assert.equal(got.body.status, 'dispatched', got.text);
      assert.deepEqual(
        t.dispatched.map((d) => [d.agentId, d.req.invocationId]),
        [[near, last.body.id]],
      );
      const far = await s.call(
        'GET',
        `/${p.projectId}/v1/exec/invocations?status=queued&limit=100`,
        {
          key: p.exec,
        },
      );
      assert.equal((far.body.data as unknown[]).length, 100, 'the others wait for their agent');
    });
  });
}
