/**
 * Enrollment through the AgentDirectory (what the broker calls): the accepted
 * path and its events, the four refusal codes (the spec's three protocol codes
 * and join_key_invalid), re-enrollment, reserved-name takeover, ZAP lookups,
 * lease renewal and lease expiry → offline with `exec.agent_offline` per
 * in-flight invocation.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { canonicalHash, canonicalJson } from '../../src/exec/canonical.js';
import type { ToolSpec } from '../../src/exec/contracts.js';
import { validateManifest } from '../../src/exec/manifest.js';
import { drivers, startTestServer, type TestServer } from '../support/harness.js';
import {
  curveKey,
  enrollAgent,
  events,
  FakeTransport,
  joinKey,
  manifest,
  seedExecProject,
  tool,
  workspace,
  type ExecProject,
} from './support.js';

describe('canonical JSON and manifest_hash', () => {
  it('sorts keys recursively, drops whitespace, keeps array order', () => {
    assert.equal(
      canonicalJson({ b: 1, a: { d: [3, { z: 1, y: 'é' }], c: null }, u: undefined }),
      '{"a":{"c":null,"d":[3,{"y":"é","z":1}]},"b":1}',
    );
    assert.equal(canonicalHash({ x: 1, y: 2 }), canonicalHash({ y: 2, x: 1 }));
  });

  it('hashes the normalised manifest (defaults filled in)', () => {
    const raw = {
      version: 1,
      tools: [{ name: 't', description: '', input_schema: { type: 'object' }, risk: 'low' }],
    };
    const r = validateManifest(raw);
    assert.equal(r.ok, true);
    if (!r.ok) return;
    assert.deepEqual(r.manifest.tools[0], {
      name: 't',
      description: '',
      input_schema: { type: 'object' },
      risk: 'low',
      mcp_visible: false,
      default_timeout_ms: 60_000,
    });
    assert.equal(r.hash, canonicalHash(r.manifest));
    assert.match(r.hash, /^[0-9a-f]{64}$/);
  });

  it('refuses bad manifests naming the field', () => {
    const ok = tool('a');
    const cases: Array<[unknown, string]> = [
      [null, 'manifest'],
      [{ tools: [ok] }, 'version'],
      [{ version: 2, tools: [ok] }, 'version'],
      [{ version: 1, tools: [] }, 'tools'],
      [{ version: 1, tools: [ok], extra: 1 }, 'extra'],
      [{ version: 1, tools: [ok, { ...ok, name: 'bad name' }] }, 'tools[1].name'],
      [{ version: 1, tools: [ok, { ...ok }] }, 'tools[1].name'],
      [{ version: 1, tools: [{ ...ok, risk: 'spicy' }] }, 'tools[0].risk'],
      [{ version: 1, tools: [{ ...ok, default_timeout_ms: 0 }] }, 'tools[0].default_timeout_ms'],
      [
        { version: 1, tools: [{ ...ok, default_timeout_ms: 3_600_001 }] },
        'tools[0].default_timeout_ms',
      ],
      [
        { version: 1, tools: [{ ...ok, input_schema: { type: 'string' } }] },
        'tools[0].input_schema',
      ],
      [
        { version: 1, tools: [{ ...ok, input_schema: { type: 'object', properties: 3 } }] },
        'tools[0].input_schema',
      ],
      [
        { version: 1, tools: [{ ...ok, input_schema: { type: 'object', $ref: '#/nowhere' } }] },
        'tools[0].input_schema',
      ],
      [{ version: 1, tools: [{ ...ok, mcp_visible: 'yes' }] }, 'tools[0].mcp_visible'],
      [{ version: 1, tools: [{ ...ok, surprise: true }] }, 'tools[0].surprise'],
    ];
    for (const [m, param] of cases) {
      const r = validateManifest(m);
      assert.equal(r.ok, false, JSON.stringify(m));
      if (!r.ok) assert.equal(r.param, param, `${JSON.stringify(m)}: ${r.message}`);
    }
  });
});

for (const driver of drivers()) {
  describe(`agent enrollment ({driver})`, () => {
    let s: TestServer;
    let p: ExecProject;
    let t: FakeTransport;
    before(async () => {
      s = await startTestServer({ driver });
      p = await seedExecProject(s, 'enr');
      t = new FakeTransport();
      s.services.exec.setTransport(t);
    });
    after(() => s.close());

    const x = () => s.services.exec;

    it('accepts: agt_ id, lease, hash; agent.created, exec.agent_enrolled, agent.enrolled', async () => {
      const jk = await joinKey(s, p, { name: 'ci' });
      const key = curveKey();
      const m = manifest(tool('fs.read'), tool('fs.write', { risk: 'destructive' }));
      const r = await x().enroll({
        joinKey: jk,
        registrationName: 'builder-1',
        curvePublicKey: key,
        manifest: m,
      });
      assert.equal(r.ok, true, JSON.stringify(r));
      if (!r.ok) return;
      assert.match(r.agentId, /^agt_[0-9a-f]+$/);
      assert.equal(r.projectId, p.projectUuid);
      assert.equal(r.leaseMs, 30_000);
      assert.equal(r.manifestHash, canonicalHash(m));
      const enrolled = await events(s, p.projectUuid, 'exec.agent_enrolled');
      assert.equal(enrolled.length, 1);
      assert.deepEqual(enrolled[0]!.data, {
        agent_id: r.agentId,
        registration_name: 'builder-1',
        project_id: p.projectUuid,
        manifest_hash: r.manifestHash,
        enrolled_at: new Date(s.clock.now()).toISOString(),
      });
      assert.equal((await events(s, p.projectUuid, 'agent.created')).length, 1);
      assert.equal((await events(s, p.projectUuid, 'agent.enrolled')).length, 1);
      assert.deepEqual(await x().agentForKey(key), { agentId: r.agentId });
      assert.equal(await x().agentForKey(curveKey()), null);

      // The same identity enrolling again: same id, no agent.created, no join-key use.
      const again = await x().enroll({
        joinKey: jk,
        registrationName: 'builder-1',
        curvePublicKey: key,
        manifest: manifest(tool('fs.read')),
      });
      assert.equal(again.ok && again.agentId, r.agentId);
      assert.equal((await events(s, p.projectUuid, 'agent.created')).length, 1);
      assert.equal((await events(s, p.projectUuid, 'exec.agent_enrolled')).length, 2);
      const keys = await s.call('GET', `/${p.projectId}/v1/join_keys`, { key: p.mgmt });
      const listed = (keys.body.data as Array<Record<string, unknown>>).find(
        (k) => k.name === 'ci',
      );
      assert.equal(listed?.use_count, 1);
    });

    it('join_key_invalid: unknown, malformed, revoked, expired, used up, other reserved name', async () => {
      const m = manifest(tool('a'));
      const enroll = (joinKey: string, name = `n${Math.random().toString(36).slice(2, 8)}`) =>
        x().enroll({ joinKey, registrationName: name, curvePublicKey: curveKey(), manifest: m });
      const expectCode = async (p2: ReturnType<typeof enroll>, code: string) => {
        const r = await p2;
        assert.equal(r.ok, false);
        if (!r.ok) assert.equal(r.code, code, r.message);
      };
      await expectCode(enroll('swyjk_' + 'A'.repeat(43)), 'join_key_invalid');
      await expectCode(enroll('not-a-key'), 'join_key_invalid');

      const revoked = await s.call('POST', `/${p.projectId}/v1/join_keys`, {
        key: p.mgmt,
        body: {},
      });
      await s.call('DELETE', `/${p.projectId}/v1/join_keys/${String(revoked.body.id)}`, {
        key: p.mgmt,
      });
      await expectCode(enroll(String(revoked.body.key)), 'join_key_invalid');

      const soon = await joinKey(s, p, {
        expires_at: new Date(s.clock.now() + 60_000).toISOString(),
      });
      s.clock.advance(60_000);
      await expectCode(enroll(soon), 'join_key_invalid');

      const once = await joinKey(s, p, { max_uses: 1 });
      assert.equal((await enroll(once)).ok, true);
      await expectCode(enroll(once), 'join_key_invalid');

      const reserved = await joinKey(s, p, { registration_name: 'only-this' });
      await expectCode(enroll(reserved, 'something-else'), 'join_key_invalid');
    });

    it('exec_manifest_invalid names the field (manifest, registration_name, curve key)', async () => {
      const jk = await joinKey(s, p);
      const bad = await x().enroll({
        joinKey: jk,
        registrationName: 'm1',
        curvePublicKey: curveKey(),
        manifest: manifest(
          tool('ok'),
          tool('x', { input_schema: { type: 'object', required: 5 } }),
        ),
      });
      assert.deepEqual(bad.ok ? null : [bad.code, bad.param], [
        'exec_manifest_invalid',
        'tools[1].input_schema',
      ]);
      const name = await x().enroll({
        joinKey: jk,
        registrationName: 'has space',
        curvePublicKey: curveKey(),
        manifest: manifest(tool('ok')),
      });
      assert.deepEqual(name.ok ? null : [name.code, name.param], [
        'exec_manifest_invalid',
        'registration_name',
      ]);
      const key = await x().enroll({
        joinKey: jk,
        registrationName: 'm1',
        curvePublicKey: 'short',
        manifest: manifest(tool('ok')),
      });
      assert.deepEqual(key.ok ? null : [key.code, key.param], [
        'exec_manifest_invalid',
        'curve_public_key',
      ]);
      // Nothing was stored and no use was taken.
      assert.equal(await x().agentForKey('short'), null);
    });

    it('exec_manifest_invalid for text PostgreSQL cannot store (U+0000, a lone surrogate), not a failed enrollment', async () => {
      const jk = await joinKey(s, p);
      const cases: Array<[ToolSpec, string]> = [
        [tool('nul', { description: 'a\u0000b' }), 'tools[0].description'],
        [
          tool('schema', {
            input_schema: { type: 'object', properties: { p: { description: 'x\ud800' } } },
          }),
          'tools[0].input_schema',
        ],
      ];
      for (const [spec, param] of cases) {
        const key = curveKey();
        const r = await x().enroll({
          joinKey: jk,
          registrationName: 'unstorable',
          curvePublicKey: key,
          manifest: { version: 1, tools: [spec] },
        });
        assert.deepEqual(r.ok ? null : [r.code, r.param], ['exec_manifest_invalid', param]);
        assert.equal(await x().agentForKey(key), null);
      }
      // A backslash and `u0000` written out (a pattern's escape) are ordinary text.
      const ok = await x().enroll({
        joinKey: jk,
        registrationName: 'storable',
        curvePublicKey: curveKey(),
        manifest: manifest(
          tool('escapes', {
            description: 'matches \\u0000 and \\ud800 literally',
            input_schema: { type: 'object', properties: { p: { description: 'a \\ud800 b' } } },
          }),
        ),
      });
      assert.equal(ok.ok, true, JSON.stringify(ok));
    });

    it('agent_name_conflict: the same name with another CURVE key (live or offline, ordinary key)', async () => {
      const a = await enrollAgent(s, p, { name: 'dup', tools: [tool('a')] });
      const r = await x().enroll({
        joinKey: await joinKey(s, p),
        registrationName: 'dup',
        curvePublicKey: curveKey(),
        manifest: manifest(tool('a')),
      });
      assert.equal(r.ok ? null : r.code, 'agent_name_conflict');
      // Still a conflict once the holder is offline: an ordinary join key cannot take a name over.
      s.clock.advance(31_000);
      await x().tick();
      const r2 = await x().enroll({
        joinKey: await joinKey(s, p),
        registrationName: 'dup',
        curvePublicKey: curveKey(),
        manifest: manifest(tool('a')),
      });
      assert.equal(r2.ok ? null : r2.code, 'agent_name_conflict');
      // One CURVE key is one agent: reusing it under another name conflicts too.
      const k = curveKey();
      await enrollAgent(s, p, { name: 'keyed', tools: [tool('a')], key: k });
      const r3 = await x().enroll({
        joinKey: await joinKey(s, p),
        registrationName: 'other-name',
        curvePublicKey: k,
        manifest: manifest(tool('a')),
      });
      assert.equal(r3.ok ? null : r3.code, 'agent_name_conflict');
      assert.ok(a.agentId);
    });

    it('agent_name_in_use: a reserving join key against a live holder; takeover once it is offline', async () => {
      const holder = await enrollAgent(s, p, { name: 'reserved-1', tools: [tool('a')] });
      const jk = await joinKey(s, p, { registration_name: 'reserved-1' });
      const newKey = curveKey();
      const r = await x().enroll({
        joinKey: jk,
        registrationName: 'reserved-1',
        curvePublicKey: newKey,
        manifest: manifest(tool('a')),
      });
      assert.equal(r.ok ? null : r.code, 'agent_name_in_use');
      s.clock.advance(31_000);
      await x().tick();
      const taken = await x().enroll({
        joinKey: jk,
        registrationName: 'reserved-1',
        curvePublicKey: newKey,
        manifest: manifest(tool('a')),
      });
      assert.equal(taken.ok, true, JSON.stringify(taken));
      assert.notEqual(taken.ok && taken.agentId, holder.agentId);
      const old = await s.call('GET', `/${p.projectId}/v1/agents/${holder.agentId}`, {
        key: p.mgmt,
      });
      assert.equal(old.body.status, 'deleted');
      const deleted = await events(s, p.projectUuid, 'agent.deleted');
      assert.ok(
        deleted.some(
          (e) => e.data.agent_id === holder.agentId && e.data.reason === 'agent_replaced',
        ),
      );
      assert.equal(await x().agentForKey(String(old.body.curve_public_key)), null);
    });

    it('renew extends the lease; lease expiry → offline, exec.agent_offline per in-flight invocation', async () => {
      const a = await enrollAgent(s, p, {
        name: 'leaser',
        tools: [tool('lease.run')],
        transport: t,
      });
      const ws = await workspace(s, p);
      const invs: string[] = [];
      for (let i = 0; i < 2; i++) {
        const r = await s.call('POST', `/${p.projectId}/v1/exec/invocations`, {
          key: p.exec,
          body: {
            tool: 'lease.run',
            arguments: { path: `/${i}` },
            workspace_id: ws,
            timeout_ms: 600_000,
          },
        });
        assert.equal(r.status, 201, r.text);
        invs.push(String(r.body.id));
      }
      await x().started(invs[0]!, a.agentId);
      // Renewals keep it online past the first lease.
      s.clock.advance(20_000);
      assert.deepEqual(await x().renew(a.agentId), { leaseMs: 30_000 });
      s.clock.advance(20_000);
      await x().tick();
      let got = await s.call('GET', `/${p.projectId}/v1/agents/${a.agentId}`, { key: p.mgmt });
      assert.equal(got.body.status, 'enrolled');
      // A missed deadline: offline, one exec.agent_offline per in-flight invocation, which fail.
      s.clock.advance(30_000);
      await x().tick();
      await x().tick(); // a second pass emits nothing more
      got = await s.call('GET', `/${p.projectId}/v1/agents/${a.agentId}`, { key: p.mgmt });
      assert.equal(got.body.status, 'offline');
      const offline = (await events(s, p.projectUuid, 'exec.agent_offline')).filter(
        (e) => e.data.agent_id === a.agentId,
      );
      assert.deepEqual(offline.map((e) => e.data.invocation_id).sort(), [...invs].sort());
      for (const e of offline) {
        assert.equal(e.data.reason, 'lease_expired');
        assert.equal(e.data.detected_at, new Date(s.clock.now()).toISOString());
      }
      for (const id of invs) {
        const inv = await s.call('GET', `/${p.projectId}/v1/exec/invocations/${id}`, {
          key: p.exec,
        });
        assert.equal(inv.body.status, 'failed');
        assert.deepEqual((inv.body.error as Record<string, unknown>).code, 'agent_offline');
      }
      const failed = (await events(s, p.projectUuid, 'exec.failed')).filter((e) =>
        invs.includes(String(e.data.invocation_id)),
      );
      assert.equal(failed.length, 2);
      // The tool disappears from the catalog; a renewal brings the agent back.
      const tools = await s.call('GET', `/${p.projectId}/v1/exec/tools/lease.run`, { key: p.exec });
      assert.equal(tools.status, 404);
      assert.deepEqual(await x().renew(a.agentId), { leaseMs: 30_000 });
      got = await s.call('GET', `/${p.projectId}/v1/agents/${a.agentId}`, { key: p.mgmt });
      assert.equal(got.body.status, 'enrolled');
      assert.equal(await x().renew('agt_0000'), null);
    });

    it('an agent back after its lease expired is told to kill what it still runs; its late answer changes nothing', async () => {
      const a = await enrollAgent(s, p, { name: 'blip', tools: [tool('blip.run')], transport: t });
      const r = await s.call('POST', `/${p.projectId}/v1/exec/invocations`, {
        key: p.exec,
        body: {
          tool: 'blip.run',
          arguments: { path: '/' },
          workspace_id: await workspace(s, p),
          timeout_ms: 600_000,
        },
      });
      assert.equal(r.status, 201, r.text);
      const id = String(r.body.id);
      await x().started(id, a.agentId);
      // A network blip: the session is gone, the agent (and its tool) still runs.
      t.connected.delete(a.agentId);
      s.clock.advance(30_001);
      await x().tick();
      const failed = await s.call('GET', `/${p.projectId}/v1/exec/invocations/${id}`, {
        key: p.exec,
      });
      assert.equal((failed.body.error as Record<string, unknown>).code, 'agent_offline');
      for (let i = 0; i < 5; i++) {
        s.clock.advance(1_000);
        await x().tick();
      }
      assert.ok(!t.cancelled.some((c) => c.invocationId === id), 'nobody to tell yet');
      // Back a minute later: the next pass sends the CANCEL, once.
      s.clock.advance(60_000);
      await x().renew(a.agentId);
      t.connected.add(a.agentId);
      await x().tick();
      await x().tick();
      assert.deepEqual(
        t.cancelled.filter((c) => c.invocationId === id),
        [{ agentId: a.agentId, invocationId: id }],
      );
      // The tool's late answer does not rewrite the record.
      await x().finished(id, a.agentId, {
        kind: 'exited',
        exitCode: 0,
        durationMs: 90_000,
        stdout: 'late',
        stderr: '',
        truncated: false,
      });
      const after = await s.call('GET', `/${p.projectId}/v1/exec/invocations/${id}`, {
        key: p.exec,
      });
      assert.equal(after.body.status, 'failed');
      assert.equal((after.body.error as Record<string, unknown>).code, 'agent_offline');
      assert.equal(after.body.exit_code, null);
      assert.equal(after.body.stdout, null);
      assert.ok(
        !(await events(s, p.projectUuid, 'exec.completed')).some(
          (e) => e.data.invocation_id === id,
        ),
      );
    });

    it('an idle agent whose lease expires: one exec.agent_offline with an empty invocation_id', async () => {
      const a = await enrollAgent(s, p, { name: 'idler', tools: [tool('idle.run')], transport: t });
      s.clock.advance(30_001);
      await x().tick();
      await x().tick(); // a second pass emits nothing more
      const got = await s.call('GET', `/${p.projectId}/v1/agents/${a.agentId}`, { key: p.mgmt });
      assert.equal(got.body.status, 'offline');
      const offline = (await events(s, p.projectUuid, 'exec.agent_offline')).filter(
        (e) => e.data.agent_id === a.agentId,
      );
      assert.equal(offline.length, 1);
      assert.deepEqual(offline[0]!.data, {
        invocation_id: '',
        agent_id: a.agentId,
        reason: 'lease_expired',
        detected_at: new Date(s.clock.now()).toISOString(),
      });
    });
  });
}
