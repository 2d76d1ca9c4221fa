/**
 * The operator's static registration (`POST /admin/v1/workers`) and a worker's
 * self-registration (`POST /admin/v1/workers/register`) of the same worker id, both
 * in flight at once, on the embedded store and on PostgreSQL: whichever row is
 * written first is the worker, the other request gets 409 `conflict` (param `id`),
 * as it would have one after the other; neither takes over the other's row (its
 * source, URL or heartbeat), and nothing answers 500.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { drivers, http, startTestServer, type Res, type TestServer } from '../support/harness.js';

const WORKER_TOKEN = 'register-race-token';
const ROUNDS = 20;

for (const driver of drivers()) {
  describe(`static and self-registration of one worker id at once (${driver})`, () => {
    let s: TestServer;
    before(async () => {
      s = await startTestServer({
        driver,
        env: { SWITCHYARD_WORKER_TOKEN: WORKER_TOKEN, SWITCHYARD_WORKER_SCRAPE_MS: '0' },
      });
      const m = await s.admin('POST', '/models', { name: 'rm', context_window: 4096 });
      assert.equal(m.status, 201, m.text);
    });
    after(() => s.close());

    const staticAdd = (id: string) =>
      s.admin('POST', '/workers', {
        model: 'rm',
        tier: 'gpu',
        url: `http://10.0.1.${Number(id.slice(5)) + 1}:8000/v1`,
        id,
      });
    const selfRegister = (id: string) =>
      http('POST', `${s.url}/admin/v1/workers/register`, {
        auth: `Bearer ${WORKER_TOKEN}`,
        body: {
          model: 'rm',
          tier: 'gpu',
          url: `http://10.0.2.${Number(id.slice(5)) + 1}:8000/v1`,
          id,
        },
      });

    function check(id: string, winner: Res, loser: Res, source: string): void {
      assert.equal(winner.body.source, source);
      assert.equal(loser.status, 409, `${id}: ${loser.status} ${loser.text}`);
      const err = loser.body.error as Record<string, unknown>;
      assert.equal(err.code, 'conflict');
      assert.equal(err.param, 'id');
    }

    it('one wins, the other gets 409; the row is the winner’s', async () => {
      const outcomes = { static: 0, registered: 0 };
      for (let i = 0; i < ROUNDS; i++) {
        const id = `race-${i}`;
        // Alternate which request is sent first.
        let st: Res;
        let reg: Res;
        if (i % 2) [st, reg] = await Promise.all([staticAdd(id), selfRegister(id)]);
        else [reg, st] = await Promise.all([selfRegister(id), staticAdd(id)]);
        const statuses = `${id}: static ${st.status} ${st.text} / register ${reg.status} ${reg.text}`;
        assert.ok(st.status < 500 && reg.status < 500, statuses);
        assert.equal([st.status, reg.status].filter((x) => x === 201).length, 1, statuses);
        const winner = st.status === 201 ? st : reg;
        if (winner === st) check(id, st, reg, 'static');
        else check(id, reg, st, 'registered');
        outcomes[winner.body.source as 'static' | 'registered']++;
        // The row is exactly what the winner was told.
        const listed = ((await s.admin('GET', '/workers')).body.data as Res['body'][]).filter(
          (w) => w.id === id,
        );
        assert.equal(listed.length, 1);
        assert.equal(listed[0]!.source, winner.body.source, statuses);
        assert.equal(listed[0]!.url, winner.body.url, statuses);
        assert.equal(listed[0]!.last_heartbeat_at, winner.body.last_heartbeat_at, statuses);
        // A worker that lost keeps being refused; one that won heartbeats.
        const hb = await http('POST', `${s.url}/admin/v1/workers/${id}/heartbeat`, {
          auth: `Bearer ${WORKER_TOKEN}`,
        });
        assert.equal(hb.status, winner === reg ? 200 : 404, hb.text);
        if (winner === st) assert.equal((await selfRegister(id)).status, 409);
        else assert.equal((await staticAdd(id)).status, 409);
      }
      assert.equal(outcomes.static + outcomes.registered, ROUNDS);
    });
  });
}
