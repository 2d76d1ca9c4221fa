/**
 * Approvals for destructive tools, decided by users (`swyu_…` tokens from the
 * operator API) with project roles: approve, reject, escalate and time out on
 * the fake clock; every decision code; the approval chain setting; and the
 * re-emitter's signature check on `exec.approval_requested`.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import type { Tx } from '../../src/events/outbox.js';
import type { ApprovalRow } from '../../src/exec/records.js';
import { verifyApprovalRequestedSignature } from '../../src/exec/signature.js';
import { tables } from '../../src/store/index.js';
import { signPayload } from '../../src/webhooks/signing.js';
import { http, drivers, startTestServer, type Res, type TestServer } from '../support/harness.js';
import {
  enrollAgent,
  events,
  expectError,
  FakeTransport,
  seedExecProject,
  tool,
  workspace,
  type ExecProject,
} from './support.js';

/** Approvals' conditional close (private), replaced in the race test. */
type Close = (tx: Tx, a: ApprovalRow, ...rest: unknown[]) => Promise<unknown>;

for (const driver of drivers()) {
  describe(`exec approvals ({driver})`, () => {
    let s: TestServer;
    let p: ExecProject;
    let t: FakeTransport;
    let agent: string;
    let ws: string;
    const users: Record<string, { id: string; token: string }> = {};

    before(async () => {
      s = await startTestServer({ driver });
      p = await seedExecProject(s, 'appr');
      t = new FakeTransport();
      s.services.exec.setTransport(t);
      agent = (
        await enrollAgent(s, p, {
          name: 'danger',
          tools: [tool('rm', { risk: 'destructive', default_timeout_ms: 60_000 })],
          transport: t,
        })
      ).agentId;
      ws = await workspace(s, p);
      for (const role of ['owner', 'admin', 'approver', 'viewer', 'outsider']) {
        const u = await s.admin('POST', '/users', { name: role, email: `${role}@example.com` });
        assert.equal(u.status, 201, u.text);
        assert.match(String(u.body.id), /^usr_[0-9a-f]+$/);
        assert.match(String(u.body.token), /^swyu_[A-Za-z0-9_-]{43}$/);
        users[role] = { id: String(u.body.id), token: String(u.body.token) };
        if (role !== 'outsider') {
          const m = await s.admin('POST', `/projects/${p.slug}/members`, {
            user_id: u.body.id,
            role,
          });
          assert.equal(m.status, 201, m.text);
        }
      }
    });
    after(() => s.close());

    const base = () => `/${p.projectId}/v1/exec`;
    const nowIso = () => new Date(s.clock.now()).toISOString();
    const call = (method: string, path: string, body?: unknown) =>
      s.call(method, base() + path, { key: p.exec, body });
    const decide = (
      id: string,
      action: 'approve' | 'reject',
      who: string | null,
      body?: unknown,
    ): Promise<Res> =>
      http('POST', `${s.url}${base()}/approvals/${id}/${action}`, {
        auth:
          who === null
            ? undefined
            : who.startsWith('swy')
              ? `Bearer ${who}`
              : `Bearer ${users[who]!.token}`,
        body: body ?? {},
      });

    async function request(): Promise<{ inv: string; app: string }> {
      // The fake clock jumps minutes between tests: the agent renews like a live one.
      await s.services.exec.renew(agent);
      const r = await call('POST', '/invocations', {
        tool: 'rm',
        arguments: { path: '/data' },
        workspace_id: ws,
      });
      assert.equal(r.status, 201, r.text);
      assert.equal(r.body.status, 'pending_approval');
      assert.match(String(r.body.approval_id), /^app_[0-9a-f]+$/);
      return { inv: String(r.body.id), app: String(r.body.approval_id) };
    }

    it('destructive invocation → pending approval with exec.approval_requested; not dispatched', async () => {
      t.dispatched = [];
      const { inv, app } = await request();
      assert.deepEqual(t.dispatched, []);
      const e = (await events(s, p.projectUuid, 'exec.approval_requested')).find(
        (x) => x.data.approval_id === app,
      );
      assert.deepEqual(e?.data, {
        invocation_id: inv,
        approval_id: app,
        tool_name: 'rm',
        risk: 'destructive',
        workspace_id: ws,
        requested_at: nowIso(),
      });
      const a = await call('GET', `/approvals/${app}`);
      assert.equal(a.status, 200);
      assert.equal(a.body.status, 'pending');
      assert.equal(a.body.stage, 1);
      assert.equal(a.body.target, 'project-approvers');
      assert.equal(a.body.invocation_id, inv);
      const list = await call('GET', '/approvals?status=pending');
      assert.ok((list.body.data as Array<Record<string, unknown>>).some((x) => x.id === app));
    });

    it('approve: accepted (exec.approved, decided_by) → queued → dispatched; then approval_not_pending', async () => {
      t.dispatched = [];
      const { inv, app } = await request();
      const r = await decide(app, 'approve', 'approver');
      assert.equal(r.status, 200, r.text);
      assert.equal(r.body.status, 'accepted');
      assert.equal(r.body.decided_by, users.approver!.id);
      const e = (await events(s, p.projectUuid, 'exec.approved')).find(
        (x) => x.data.approval_id === app,
      );
      assert.deepEqual(e?.data, {
        invocation_id: inv,
        approval_id: app,
        decided_by: users.approver!.id,
        approved_at: nowIso(),
      });
      const got = await call('GET', `/invocations/${inv}`);
      assert.equal(got.body.status, 'dispatched');
      assert.equal(t.dispatched[0]?.req.invocationId, inv);
      const d = (await events(s, p.projectUuid, 'exec.dispatched')).find(
        (x) => x.data.invocation_id === inv,
      );
      assert.equal(d?.data.risk, 'destructive');
      expectError(await decide(app, 'approve', 'owner'), 409, 'approval_not_pending');
      expectError(await decide(app, 'reject', 'owner'), 409, 'approval_not_pending');
      await s.services.exec.finished(inv, agent, {
        kind: 'exited',
        exitCode: 0,
        durationMs: 3,
        stdout: '',
        stderr: '',
        truncated: false,
      });
    });

    it('reject with a reason: rejected (exec.rejected), invocation cancelled', async () => {
      const { inv, app } = await request();
      const r = await decide(app, 'reject', 'admin', { reason: 'not on a Friday' });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.body.status, 'rejected');
      assert.equal(r.body.reason, 'not on a Friday');
      const e = (await events(s, p.projectUuid, 'exec.rejected')).find(
        (x) => x.data.approval_id === app,
      );
      assert.deepEqual(e?.data, {
        invocation_id: inv,
        approval_id: app,
        reason: 'not on a Friday',
        rejected_at: nowIso(),
      });
      const got = await call('GET', `/invocations/${inv}`);
      assert.equal(got.body.status, 'cancelled');
      assert.deepEqual((got.body.error as Record<string, unknown>).code, 'approval_rejected');
      expectError(await decide(app, 'approve', 'owner'), 409, 'approval_not_pending');
      expectError(await decide(app, 'approve', 'outsider'), 403, 'insufficient_role');
    });

    it('decision bodies: an empty application/json body is {}; JSON that fails decoding is invalid_body', async () => {
      const raw = (id: string, action: string, rawBody: string) =>
        http('POST', `${s.url}${base()}/approvals/${id}/${action}`, {
          auth: `Bearer ${users.owner!.token}`,
          rawBody,
          headers: { 'content-type': 'application/json' },
        });
      const first = await request();
      expectError(await raw(first.app, 'reject', '{"reason":'), 400, 'invalid_body');
      const ok = await raw(first.app, 'approve', '');
      assert.equal(ok.status, 200, ok.text);
      assert.equal(ok.body.status, 'accepted');
      await call('POST', `/invocations/${first.inv}/cancel`);
      const second = await request();
      const no = await raw(second.app, 'reject', '');
      assert.equal(no.status, 200, no.text);
      assert.equal(no.body.status, 'rejected');
    });

    it('decision auth: authentication_required, invalid_user_token, insufficient_role, approval_not_found', async () => {
      const { inv, app } = await request();
      expectError(await decide(app, 'approve', null), 401, 'authentication_required', {
        type: 'authentication_error',
      });
      // An API key is not a person.
      expectError(await decide(app, 'approve', p.exec), 401, 'authentication_required');
      expectError(
        await decide(app, 'approve', `swyu_${'A'.repeat(43)}`),
        401,
        'invalid_user_token',
      );
      expectError(await decide(app, 'approve', 'viewer'), 403, 'insufficient_role');
      expectError(await decide(app, 'approve', 'outsider'), 403, 'insufficient_role');
      // To a user of no role here the answer is the same whatever the id.
      expectError(await decide('app_0123456789', 'reject', 'outsider'), 403, 'insufficient_role');
      expectError(await decide('app_0123456789', 'approve', 'owner'), 404, 'approval_not_found');
      expectError(await call('GET', '/approvals/app_0123456789'), 404, 'approval_not_found');
      expectError(await call('GET', '/approvals/nonsense'), 404, 'approval_not_found');
      // Cancelling the invocation expires its approval.
      await call('POST', `/invocations/${inv}/cancel`);
      const a = await call('GET', `/approvals/${app}`);
      assert.equal(a.body.status, 'expired');
      expectError(await decide(app, 'approve', 'owner'), 409, 'approval_not_pending');
    });

    it('escalates at the stage deadline (exec.approval_escalated), then times out (exec.approval_timed_out)', async () => {
      const { inv, app } = await request();
      s.clock.advance(899_999);
      await s.services.exec.tick();
      assert.equal((await call('GET', `/approvals/${app}`)).body.stage, 1);
      s.clock.advance(1);
      await s.services.exec.tick();
      const a = await call('GET', `/approvals/${app}`);
      assert.equal(a.body.status, 'pending');
      assert.equal(a.body.stage, 2);
      assert.equal(a.body.target, 'project-admins');
      const esc = (await events(s, p.projectUuid, 'exec.approval_escalated')).filter(
        (x) => x.data.approval_id === app,
      );
      assert.equal(esc.length, 1);
      assert.deepEqual(esc[0]!.data, {
        invocation_id: inv,
        approval_id: app,
        stage: '2',
        target: 'project-admins',
        escalated_at: nowIso(),
      });
      // At the admins' stage an approver may no longer decide.
      expectError(await decide(app, 'approve', 'approver'), 403, 'insufficient_role');
      s.clock.advance(900_000);
      await s.services.exec.tick();
      await s.services.exec.tick();
      const expired = await call('GET', `/approvals/${app}`);
      assert.equal(expired.body.status, 'expired');
      const to = (await events(s, p.projectUuid, 'exec.approval_timed_out')).filter(
        (x) => x.data.approval_id === app,
      );
      assert.equal(to.length, 1);
      assert.deepEqual(to[0]!.data, {
        invocation_id: inv,
        approval_id: app,
        timed_out_at: nowIso(),
      });
      const got = await call('GET', `/invocations/${inv}`);
      assert.equal(got.body.status, 'cancelled');
      assert.deepEqual((got.body.error as Record<string, unknown>).code, 'approval_timed_out');
      expectError(await decide(app, 'approve', 'owner'), 409, 'approval_not_pending');
    });

    it('a decision past the stage deadline, before any tick, is judged at the next stage (escalation applied first)', async () => {
      const { inv, app } = await request();
      s.clock.advance(900_000); // stage 1's deadline; no tick
      expectError(await decide(app, 'approve', 'approver'), 403, 'insufficient_role');
      const esc = (await events(s, p.projectUuid, 'exec.approval_escalated')).filter(
        (x) => x.data.approval_id === app,
      );
      assert.deepEqual(
        esc.map((x) => x.data),
        [
          {
            invocation_id: inv,
            approval_id: app,
            stage: '2',
            target: 'project-admins',
            escalated_at: nowIso(),
          },
        ],
      );
      const a = await call('GET', `/approvals/${app}`);
      assert.equal(a.body.status, 'pending');
      assert.equal(a.body.stage, 2);
      // The next sweep finds nothing more to do for it.
      await s.services.exec.tick();
      assert.equal(
        (await events(s, p.projectUuid, 'exec.approval_escalated')).filter(
          (x) => x.data.approval_id === app,
        ).length,
        1,
      );
      const ok = await decide(app, 'reject', 'admin', { reason: 'late' });
      assert.equal(ok.status, 200, ok.text);
      assert.equal(ok.body.status, 'rejected');
    });

    it('a decision past the last deadline, before any tick: expired (exec.approval_timed_out), then approval_not_pending', async () => {
      t.dispatched = [];
      const { inv, app } = await request();
      s.clock.advance(1_800_000); // both stages; no tick
      const e = expectError(await decide(app, 'approve', 'owner'), 409, 'approval_not_pending');
      assert.match(String(e.message), /expired/);
      const mine = (await events(s, p.projectUuid)).filter((x) => x.data.approval_id === app);
      assert.deepEqual(
        mine.map((x) => x.type),
        ['exec.approval_requested', 'exec.approval_escalated', 'exec.approval_timed_out'],
      );
      assert.deepEqual(mine[2]!.data, {
        invocation_id: inv,
        approval_id: app,
        timed_out_at: nowIso(),
      });
      assert.equal((await call('GET', `/approvals/${app}`)).body.status, 'expired');
      const got = await call('GET', `/invocations/${inv}`);
      assert.equal(got.body.status, 'cancelled');
      assert.equal((got.body.error as Record<string, unknown>).code, 'approval_timed_out');
      assert.deepEqual(t.dispatched, [], 'never ran');
      expectError(await decide(app, 'reject', 'owner'), 409, 'approval_not_pending');
      await s.services.exec.tick();
      assert.equal(
        (await events(s, p.projectUuid, 'exec.approval_timed_out')).filter(
          (x) => x.data.approval_id === app,
        ).length,
        1,
        'reported once',
      );
    });

    it('a decision that loses a race with an escalation re-reads the approval and decides at the new stage', async () => {
      const { inv, app } = await request();
      // Another instance's sweep escalates between the decision's read and its
      // conditional close (simulated in the decision's own transaction).
      const ap = s.services.exec.approvals as unknown as { close: Close };
      const original = ap.close;
      let raced = false;
      ap.close = async function (this: unknown, tx, a, ...rest) {
        if (!raced) {
          raced = true;
          await tx
            .update(tables.approvals)
            .set({ stage: a.stage + 1, stageDeadline: new Date(s.clock.now() + 900_000) })
            .where(eq(tables.approvals.id, a.id));
        }
        return original.call(this, tx, a, ...rest);
      };
      try {
        const r = await decide(app, 'approve', 'owner');
        assert.equal(r.status, 200, r.text);
        assert.equal(r.body.status, 'accepted');
        assert.equal(r.body.stage, 2);
        assert.equal(raced, true);
      } finally {
        ap.close = original;
      }
      await call('POST', `/invocations/${inv}/cancel`);
      const again = await request();
      ap.close = async function (this: unknown, tx, a, ...rest) {
        ap.close = original;
        await tx
          .update(tables.approvals)
          .set({ stage: a.stage + 1, stageDeadline: new Date(s.clock.now() + 900_000) })
          .where(eq(tables.approvals.id, a.id));
        return original.call(this, tx, a, ...rest);
      };
      try {
        // Re-checked at the new stage: an approver may no longer decide.
        expectError(await decide(again.app, 'approve', 'approver'), 403, 'insufficient_role');
      } finally {
        ap.close = original;
      }
      await call('POST', `/invocations/${again.inv}/cancel`);
    });

    it('the chain is a project setting (operator API); a late sweep reports every stage', async () => {
      const def = await s.admin('GET', `/projects/${p.slug}/approval_chain`);
      assert.deepEqual(def.body.stages, [
        { target: 'project-approvers', timeout_ms: 900_000 },
        { target: 'project-admins', timeout_ms: 900_000 },
      ]);
      const bad = await s.admin('PUT', `/projects/${p.slug}/approval_chain`, { stages: [] });
      expectError(bad, 400, 'invalid_body', { param: 'stages' });
      const set = await s.admin('PUT', `/projects/${p.slug}/approval_chain`, {
        stages: [
          { target: 'project-approvers', timeout_ms: 60_000 },
          { target: 'oncall-sre', timeout_ms: 60_000 },
          { target: 'project-owners', timeout_ms: 60_000 },
        ],
      });
      assert.equal(set.status, 200, set.text);
      const { app } = await request();
      // No tick for 2.5 stages: one sweep reports both escalations in order.
      s.clock.advance(150_000);
      await s.services.exec.tick();
      const esc = (await events(s, p.projectUuid, 'exec.approval_escalated')).filter(
        (x) => x.data.approval_id === app,
      );
      assert.deepEqual(
        esc.map((x) => [x.data.stage, x.data.target]),
        [
          ['2', 'oncall-sre'],
          ['3', 'project-owners'],
        ],
      );
      expectError(await decide(app, 'approve', 'admin'), 403, 'insufficient_role');
      const ok = await decide(app, 'approve', 'owner');
      assert.equal(ok.status, 200, ok.text);
      await s.admin('PUT', `/projects/${p.slug}/approval_chain`, {
        stages: [
          { target: 'project-approvers', timeout_ms: 900_000 },
          { target: 'project-admins', timeout_ms: 900_000 },
        ],
      });
    });

    it('approved while no agent is connected: stays queued, then fails tool_executor_unavailable', async () => {
      const { inv, app } = await request();
      t.connected.delete(agent);
      assert.equal((await decide(app, 'approve', 'owner')).status, 200);
      assert.equal((await call('GET', `/invocations/${inv}`)).body.status, 'queued');
      s.clock.advance(10_000);
      await s.services.exec.renew(agent);
      t.connected.add(agent);
      await s.services.exec.tick();
      assert.equal((await call('GET', `/invocations/${inv}`)).body.status, 'dispatched');
      await call('POST', `/invocations/${inv}/cancel`);

      const second = await request();
      t.connected.delete(agent);
      await decide(second.app, 'approve', 'owner');
      s.clock.advance(60_000);
      await s.services.exec.renew(agent);
      await s.services.exec.tick();
      const got = await call('GET', `/invocations/${second.inv}`);
      assert.equal(got.body.status, 'failed');
      assert.deepEqual(
        (got.body.error as Record<string, unknown>).code,
        'tool_executor_unavailable',
      );
      const f = (await events(s, p.projectUuid, 'exec.failed')).find(
        (x) => x.data.invocation_id === second.inv,
      );
      assert.equal(f?.data.error_code, 'tool_executor_unavailable');
      t.connected.add(agent);
    });

    it('approve and cancel of one invocation at the same time: never a 500, one consistent outcome', async () => {
      for (let i = 0; i < 40; i++) {
        const { inv, app } = await request();
        const [ok, cancelled] = await Promise.all([
          decide(app, 'approve', 'owner'),
          call('POST', `/invocations/${inv}/cancel`),
        ]);
        assert.ok([200, 409].includes(ok.status), ok.text);
        assert.ok([200, 503].includes(cancelled.status), cancelled.text);
        if (cancelled.status === 503) {
          assert.equal((await call('POST', `/invocations/${inv}/cancel`)).status, 200);
        }
        const a = await call('GET', `/approvals/${app}`);
        const got = await call('GET', `/invocations/${inv}`);
        assert.equal(got.body.status, 'cancelled', got.text);
        const approved = (await events(s, p.projectUuid, 'exec.approved')).some(
          (x) => x.data.approval_id === app,
        );
        if (ok.status === 200) {
          assert.equal(a.body.status, 'accepted');
          assert.equal(approved, true);
        } else {
          assert.equal(a.body.status, 'expired');
          assert.equal(approved, false);
          expectError(ok, 409, 'approval_not_pending');
        }
      }
    });

    it('verifyApprovalRequestedSignature: accepts the original delivery, refuses tampering', async () => {
      const secret = 'whsec_' + 'k'.repeat(43);
      const [e] = await events(s, p.projectUuid, 'exec.approval_requested');
      const body = JSON.stringify({
        id: e!.id,
        object: 'event',
        type: e!.type,
        created_at: e!.created_at,
        data: e!.data,
      });
      const ts = Math.floor(s.clock.now() / 1000);
      const signature = signPayload(secret, ts, body);
      const ok = verifyApprovalRequestedSignature({
        secret,
        body,
        timestamp: String(ts),
        signature,
        nowSeconds: ts,
      });
      assert.equal(ok.ok, true);
      if (ok.ok) assert.deepEqual(ok.data, e!.data);
      const tampered = body.replace('"destructive"', '"low"');
      assert.deepEqual(
        verifyApprovalRequestedSignature({
          secret,
          body: tampered,
          timestamp: String(ts),
          signature,
          nowSeconds: ts,
        }),
        { ok: false, reason: 'bad_signature' },
      );
      assert.deepEqual(
        verifyApprovalRequestedSignature({
          secret,
          body,
          timestamp: String(ts),
          signature,
          nowSeconds: ts + 301,
        }),
        { ok: false, reason: 'timestamp_out_of_range' },
      );
      const other = JSON.stringify({
        id: 'evt_x',
        object: 'event',
        type: 'exec.approved',
        created_at: ts,
        data: {},
      });
      assert.deepEqual(
        verifyApprovalRequestedSignature({
          secret,
          body: other,
          timestamp: String(ts),
          signature: signPayload(secret, ts, other),
          nowSeconds: ts,
        }),
        { ok: false, reason: 'not_approval_requested' },
      );
    });
  });
}
