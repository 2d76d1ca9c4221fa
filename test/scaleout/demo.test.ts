/**
 * The embedded demo worker when several instances share PostgreSQL: each instance
 * registers its own worker row (the last one to start used to take over a single
 * `embedded-demo` row, so every instance's demo endpoint pointed at its worker, and
 * at nothing once that instance stopped). One instance killed leaves the others
 * serving the demo; one stopped cleanly removes its row.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ensureDemo } from '../../src/operator/bootstrap.js';
import { cluster, operator } from '../support/cluster.js';
import { freshDatabase, http, sharedServices, startTestServer } from '../support/harness.js';
import type { Spawned } from '../support/process.js';

const { skip } = sharedServices();

describe('the embedded demo worker on a shared database', { skip }, () => {
  const routers = cluster({ store: false });

  async function instance(): Promise<{ p: Spawned; url: string }> {
    const r = await routers.serve({
      // The demo on (the cluster's default is off), with its sim engine.
      env: { SWITCHYARD_DEMO: '1', SWITCHYARD_DEMO_ENGINE: 'sim', LOG_LEVEL: 'error' },
    });
    return { p: r.proc, url: r.url };
  }

  const embedded = async (url: string): Promise<string[]> => {
    const r = await operator(url)('GET', '/workers');
    assert.equal(r.status, 200, r.text);
    return (r.body.data as Array<{ id: string }>)
      .map((w) => w.id)
      .filter((id) => id.startsWith('embedded-demo'))
      .sort();
  };

  it('each instance has its own row; a killed one leaves the demo served, a stopped one leaves no row', async () => {
    const a = await instance();
    const out = a.p.stdout();
    const projectId = out.match(/Demo project: (proj_[0-9a-f]+)/)![1]!;
    const key = out.match(/Demo API key \(shown once, store it now\):\n\s+(swy_demo_\S+)/)![1]!;
    const b = await instance();
    const both = await embedded(a.url);
    assert.equal(both.length, 2, JSON.stringify(both));
    assert.notEqual(both[0], both[1]);

    await b.p.stop('SIGKILL');
    // A's demo endpoint still answers: B's dead worker is skipped (failover before the
    // first byte, then the monitor marks it unhealthy).
    for (let i = 0; i < 5; i++) {
      const r = await http('POST', `${a.url}/${projectId}/demo/v1/chat/completions`, {
        auth: `Bearer ${key}`,
        body: { model: 'x', messages: [{ role: 'user', content: `hi ${i}` }], max_tokens: 2 },
      });
      assert.equal(r.status, 200, r.text);
    }

    const bId = await embedded(a.url);
    assert.equal(await a.p.stop('SIGTERM'), 0);
    const c = await instance();
    const left = await embedded(c.url);
    // A's row went with it; B's (killed) stays until an operator removes it; C has its own.
    assert.equal(left.length, 2, JSON.stringify(left));
    const aId = both.find((id) => !left.includes(id));
    assert.ok(aId, `A's row is gone: ${JSON.stringify({ both, left })}`);
    assert.ok(bId.includes(both.find((id) => id !== aId)!));
  });
});

describe('the demo made by instances starting together on an empty database', { skip }, () => {
  it('each finds or makes the same records, no error; one demo key in all', async () => {
    for (let round = 0; round < 2; round++) {
      const db = await freshDatabase('postgres');
      await db.store.close();
      const servers = await Promise.all(
        [0, 1, 2].map(() => startTestServer({ shared: { url: db.url! } })),
      );
      try {
        const demos = await Promise.all(servers.map((s) => ensureDemo(s.services)));
        assert.equal(new Set(demos.map((d) => d.project.id)).size, 1);
        assert.equal(new Set(demos.map((d) => d.endpoint.id)).size, 1);
        assert.equal(demos.filter((d) => d.key !== null).length, 1);
        const keys = await servers[0]!.services.keys.list(demos[0]!.project.id);
        assert.equal(keys.length, 1);
        // A later start finds them and mints nothing.
        const again = await ensureDemo(servers[1]!.services);
        assert.equal(again.key, null);
        assert.equal(again.endpoint.id, demos[0]!.endpoint.id);
      } finally {
        for (const s of servers) await s.close();
        await db.drop();
      }
    }
  });
});
