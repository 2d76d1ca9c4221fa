/**
 * The execution surface with its roles on different processes (issue 8, "Roles and
 * scale-out"): `switchyard serve --roles api,dispatcher` and `switchyard serve
 * --roles broker` share one PostgreSQL database; a real `switchyard agent` enrolls
 * with and connects to the broker process only. An invocation created through the
 * API process (which has no broker) is stored queued for the online agent and the
 * broker process's scheduler dispatches it; the result is read back through the API
 * process. The tool bridge's availability check follows the same rule.
 *
 * Needs PostgreSQL (TEST_DATABASE_URL), like the other scale-out suites; runs the
 * built binary (`npm run build` first).
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { before, describe, it } from 'node:test';
import { cluster, listening } from '../support/cluster.js';
import { ADMIN_TOKEN, http, sharedServices } from '../support/harness.js';
import { manifestFile } from '../exec-transport/support.js';
import { until } from './agents.js';

const { skip } = sharedServices();

describe(
  'exec with the API and the broker on different processes',
  { skip, timeout: 90_000 },
  () => {
    const routers = cluster();
    /** The agent's manifest, key file and the stubborn tool's mark. */
    let dir = '';
    let apiBase = '';
    let projectId = '';
    let execKey = '';
    let ws = '';

    const serve = (roles: string) =>
      routers.spawnServe({
        args: ['--roles', roles],
        env: { SWITCHYARD_EXEC_LEASE_MS: '3000', SWITCHYARD_EXEC_TICK_MS: '100' },
      });
    const api = (method: string, path: string, key: string, body?: unknown) =>
      http(method, `${apiBase}/${projectId}/v1${path}`, { auth: `Bearer ${key}`, body });

    before(async () => {
      dir = routers.dataDir();
      apiBase = await listening(serve('api,dispatcher'));
      const brokerProc = serve('broker');
      const [, enroll, agents] = await brokerProc.waitFor(
        /Exec broker: enroll (tcp:\/\/127\.0\.0\.1:\d+)\s+agents (tcp:\/\/127\.0\.0\.1:\d+)/,
      );
      const [, serverKey] = await brokerProc.waitFor(/Exec broker server key: (\S{40})/);

      const admin = (method: string, path: string, body?: unknown) =>
        http(method, `${apiBase}/admin/v1${path}`, { auth: `Bearer ${ADMIN_TOKEN}`, body });
      const p = await admin('POST', '/projects', { slug: 'split', name: 'Split roles' });
      assert.equal(p.status, 201, p.text);
      projectId = String(p.body.id);
      const keys: Record<string, string> = {};
      for (const scope of ['execution', 'management']) {
        // The test polls every 20 ms: the spec's default quota (60 a minute) would run
        // out on a slow machine before the invocation ends, and the polls see only 429s.
        const k = await admin('POST', '/projects/split/keys', {
          scopes: [scope],
          quotaRequests: 1_000_000,
        });
        assert.equal(k.status, 201, k.text);
        keys[scope] = String(k.body.key);
      }
      execKey = keys.execution!;
      // The API process has no broker of its own.
      const b = await api('GET', '/exec/broker', keys.management!);
      assert.equal(b.status, 503, b.text);
      const wsr = await api('POST', '/exec/workspaces', execKey, { name: 'split' });
      assert.equal(wsr.status, 201, wsr.text);
      ws = String(wsr.body.id);
      const jk = await api('POST', '/join_keys', keys.management!, { name: 'fleet' });
      assert.equal(jk.status, 201, jk.text);

      routers.spawn(['agent'], {
        SWITCHYARD_AGENT_ENROLL_ENDPOINT: enroll!,
        SWITCHYARD_AGENT_ENDPOINT: agents!,
        SWITCHYARD_AGENT_SERVER_KEY: serverKey!,
        SWITCHYARD_AGENT_NAME: 'solo',
        SWITCHYARD_AGENT_MANIFEST: manifestFile(dir),
        SWITCHYARD_AGENT_KEY_FILE: join(dir, 'solo.key'),
        SWITCHYARD_AGENT_JOIN_KEY: String(jk.body.key),
        LOG_LEVEL: 'info',
      });
      // Online as the API process sees it (the shared database): the catalog lists its tools.
      await until(
        async () => {
          const r = await api('GET', '/exec/tools', execKey);
          const names = ((r.body.data ?? []) as Array<{ name: string }>).map((t) => t.name);
          return names.includes('echo');
        },
        15_000,
        'the agent online through the API process',
      );
    });

    it('an invocation created on the API process is dispatched by the broker process and completes', async () => {
      const r = await api('POST', '/exec/invocations', execKey, {
        tool: 'echo',
        arguments: { msg: 'across processes' },
        workspace_id: ws,
      });
      assert.equal(r.status, 201, r.text);
      // The answer re-reads the row: the broker process may already have taken it.
      assert.ok(['queued', 'dispatched', 'running'].includes(String(r.body.status)), r.text);
      const id = String(r.body.id);
      const done = await until(
        async () => {
          const g = await api('GET', `/exec/invocations/${id}`, execKey);
          return ['completed', 'failed'].includes(String(g.body.status)) ? g.body : undefined;
        },
        15_000,
        `${id} terminal`,
      );
      // The echo tool prints its stdin (the arguments) and exits 3.
      assert.equal(done.status, 'failed', JSON.stringify(done));
      const out = JSON.stringify(done);
      assert.match(out, /across processes/);
      assert.match(out, /"exit_code":3/);
    });

    it('a cancel made on the API process reaches the agent through the broker process', async () => {
      const r = await api('POST', '/exec/invocations', execKey, {
        tool: 'stubborn',
        arguments: {},
        workspace_id: ws,
        timeout_ms: 60_000,
      });
      assert.equal(r.status, 201, r.text);
      const id = String(r.body.id);
      await until(
        async () =>
          (await api('GET', `/exec/invocations/${id}`, execKey)).body.status === 'running',
        15_000,
        `${id} running`,
      );
      const c = await api('POST', `/exec/invocations/${id}/cancel`, execKey);
      assert.equal(c.body.status, 'cancelled', c.text);
      // The tool traps SIGTERM and writes this file: the agent was told to kill it
      // (long before its own timeout would).
      await until(() => existsSync(join(dir, 'term-mark')), 5_000, 'the tool got SIGTERM');
    });
  },
);
