/**
 * What a signed-in user does to a project through the dashboard, and the
 * internal proxy token it travels with (spec: the dashboard mints a short-lived
 * signed JWT and forwards it to the router, which resolves user, project and
 * scopes from it; accepted only on that internal path, never by API clients):
 * - keys (created, revealed once, working on the API; rotated; revoked),
 *   webhooks, and an approval decided, by role (owner, approver, viewer);
 * - the internal path refuses API keys, other projects' tokens, expired and
 *   tampered tokens; API routes refuse the token and the session cookie.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { SignJWT } from 'jose';
import { scopesOf } from '../../src/dashboard/internal-token.js';
import { http, type TestServer, startTestServer } from '../support/harness.js';
import { errorCode, Visitor } from '../support/dashboard.js';
import {
  enrollAgent,
  FakeTransport,
  seedExecProject,
  tool,
  workspace,
  type ExecProject,
} from '../exec/support.js';

const PASSWORD = 'correct horse battery staple';

describe('dashboard projects and the internal path', () => {
  let s: TestServer;
  let p: ExecProject;
  let other: ExecProject;
  const ids: Record<string, string> = {};
  before(async () => {
    s = await startTestServer({ env: { SWITCHYARD_WEBHOOK_ALLOW_CIDRS: '127.0.0.0/8' } });
    p = await seedExecProject(s, 'dash');
    other = await seedExecProject(s, 'elsewhere');
    for (const role of ['owner', 'approver', 'viewer']) {
      const u = await s.admin('POST', '/users', {
        name: role,
        email: `${role}@dash.example`,
        password: PASSWORD,
      });
      assert.equal(u.status, 201, u.text);
      ids[role] = String(u.body.id);
      const m = await s.admin('POST', `/projects/dash/members`, { user_id: u.body.id, role });
      assert.equal(m.status, 201, m.text);
    }
  });
  after(() => s.close());

  async function as(role: string): Promise<Visitor> {
    const v = new Visitor(s.url);
    assert.equal(await v.login(`${role}@dash.example`, PASSWORD), '/dashboard');
    return v;
  }
  const root = () => `/dashboard/projects/${p.projectId}`;

  it('lists the projects a user belongs to, and only those', async () => {
    const v = await as('viewer');
    const page = await v.page('/dashboard');
    assert.match(page.text, new RegExp(p.projectId));
    assert.doesNotMatch(page.text, new RegExp(other.projectId));
    const foreign = await v.send('GET', `/dashboard/projects/${other.projectId}`);
    assert.equal(foreign.status, 404);
    // A browser gets a page (escaped, with the way back), a script the envelope.
    const shown = await v.send('GET', `/dashboard/projects/${other.projectId}`, {
      headers: { accept: 'text/html,application/xhtml+xml' },
    });
    assert.equal(shown.status, 404);
    assert.match(String(shown.headers['content-type']), /^text\/html/);
    assert.match(shown.text, /<h1>Not found<\/h1>/);
    assert.match(shown.text, /href="\/dashboard"/);
    assert.equal((foreign.json.error as { code: string }).code, 'project_not_found');
  });

  it('an owner creates a key (shown once, working on the API), rotates and revokes it', async () => {
    const v = await as('owner');
    const page = await v.page(root());
    assert.equal(page.status, 200, page.text);
    assert.match(page.text, /id="new-key"/);
    const created = await v.send('POST', `${root()}/keys`, {
      body: { name: 'from-the-dashboard', scopes: ['inference'] },
    });
    assert.equal(created.status, 200, created.text);
    const key = /(swy_dash_[A-Za-z0-9_-]{43})/.exec((created.json.reveal as string[])[0]!)![1]!;
    const models = await http('GET', `${s.url}/${p.projectId}/v1/models`, {
      auth: `Bearer ${key}`,
    });
    assert.equal(models.status, 200, models.text);

    const listed = await v.page(root());
    assert.match(listed.text, /from-the-dashboard/);
    assert.ok(!listed.text.includes(key), 'the value is shown once only');
    // This key's row (the seeded keys share one creation time: their order is arbitrary).
    const row = listed.text.split('<tr>').find((r) => r.includes('from-the-dashboard'))!;
    const id = /keys\/([0-9a-f-]{36})\/rotate/.exec(row)![1]!;
    const rotated = await v.send('POST', `${root()}/keys/${id}/rotate`, { body: {} });
    assert.equal(rotated.status, 200, rotated.text);
    const revoked = await v.send('POST', `${root()}/keys/${id}/revoke`, { body: {} });
    assert.equal(revoked.status, 200, revoked.text);
    const after = await http('GET', `${s.url}/${p.projectId}/v1/models`, { auth: `Bearer ${key}` });
    assert.equal(after.status, 401);
  });

  it('an owner cannot grant scopes beyond their role; a viewer changes nothing', async () => {
    const owner = await as('owner');
    await owner.page(root());
    const research = await owner.send('POST', `${root()}/keys`, { body: { scopes: ['research'] } });
    assert.equal(research.status, 403);
    assert.equal(errorCode(research), 'scope_insufficient');

    const v = await as('viewer');
    const page = await v.page(root());
    assert.equal(page.status, 200);
    assert.doesNotMatch(page.text, /id="new-key"/);
    const tried = await v.send('POST', `${root()}/keys`, { body: {} });
    assert.equal(tried.status, 403);
    assert.equal(errorCode(tried), 'scope_insufficient');
    // The router's envelope, its type included (spec: scope_insufficient carries
    // authentication_error).
    assert.deepEqual(Object.keys(tried.json.error as object).sort(), [
      'code',
      'message',
      'param',
      'type',
    ]);
    assert.equal((tried.json.error as { type: string }).type, 'authentication_error');
    const hook = await v.send('POST', `${root()}/webhooks`, {
      body: { url: 'https://127.0.0.1:9/h', events: 'exec.completed' },
    });
    assert.equal(hook.status, 403);
  });

  it('an owner adds and deletes a webhook (its secret shown once)', async () => {
    const v = await as('owner');
    await v.page(root());
    const added = await v.send('POST', `${root()}/webhooks`, {
      body: { url: 'https://127.0.0.1:9/hook', events: 'exec.completed, exec.failed' },
    });
    assert.equal(added.status, 200, added.text);
    assert.match((added.json.reveal as string[])[0]!, /whsec_/);
    const page = await v.page(root());
    assert.match(page.text, /https:\/\/127\.0\.0\.1:9\/hook/);
    const id = /webhooks\/([0-9a-f-]{36})\/delete/.exec(page.text)![1]!;
    const bad = await v.send('POST', `${root()}/webhooks`, {
      body: { url: 'http://x', events: 'exec.completed' },
    });
    assert.equal(bad.status, 400);
    assert.equal(
      (await v.send('POST', `${root()}/webhooks/${id}/delete`, { body: {} })).status,
      200,
    );
  });

  it('an approver approves a pending destructive invocation; a viewer cannot', async () => {
    const t = new FakeTransport();
    s.services.exec.setTransport(t);
    await enrollAgent(s, p, {
      name: 'danger',
      tools: [tool('rm', { risk: 'destructive', default_timeout_ms: 60_000 })],
      transport: t,
    });
    const ws = await workspace(s, p);
    const inv = await s.call('POST', `/${p.projectId}/v1/exec/invocations`, {
      key: p.exec,
      body: { tool: 'rm', arguments: { path: '/tmp/x' }, workspace_id: ws },
    });
    assert.equal(inv.status, 201, inv.text);
    const approval = String(inv.body.approval_id);

    const viewer = await as('viewer');
    const vp = await viewer.page(root());
    // The viewer sees what waits (the tool, its risk, the invocation) but no buttons.
    const row = (text: string) => text.slice(text.indexOf('id="approvals"'));
    assert.match(row(vp.text), new RegExp(String(inv.body.id)));
    assert.match(row(vp.text), /<code>rm<\/code>/);
    assert.match(row(vp.text), /destructive/);
    assert.doesNotMatch(vp.text, new RegExp(`${approval}/approve`));
    const refused = await viewer.send('POST', `${root()}/approvals/${approval}/approve`, {
      body: {},
    });
    assert.equal(refused.status, 403, refused.text);

    const approver = await as('approver');
    const ap = await approver.page(root());
    assert.match(row(ap.text), /<code>rm<\/code>/);
    assert.match(ap.text, new RegExp(`${approval}/approve`));
    const ok = await approver.send('POST', `${root()}/approvals/${approval}/approve`, { body: {} });
    assert.equal(ok.status, 200, ok.text);
    const got = await s.call('GET', `/${p.projectId}/v1/exec/approvals/${approval}`, {
      key: p.exec,
    });
    assert.equal(got.body.status, 'accepted');
    assert.equal(got.body.decided_by, ids.approver);
  });

  it('the internal path takes only a valid token for its own project', async () => {
    const path = `/internal/v1/projects/${p.projectId}/keys`;
    const tokens = s.services.dashboard.tokens;
    const claims = {
      user: ids.owner!,
      project: p.projectId,
      role: 'owner' as const,
      scopes: scopesOf('owner'),
    };
    const good = await tokens.mint(claims);
    assert.equal((await http('GET', `${s.url}${path}`, { auth: `Bearer ${good}` })).status, 200);

    // An API key, even a management one, is not accepted here.
    const withKey = await http('GET', `${s.url}${path}`, { auth: `Bearer ${p.mgmt}` });
    assert.equal(withKey.status, 401);
    assert.equal((withKey.body.error as Record<string, unknown>).code, 'authentication_required');
    // Another project's token.
    const foreign = await tokens.mint({ ...claims, project: other.projectId });
    const cross = await http('GET', `${s.url}${path}`, { auth: `Bearer ${foreign}` });
    assert.equal(cross.status, 403);
    // Tampered, or signed with another key.
    const [h, b] = good.split('.');
    const tampered = `${h}.${b}.${'A'.repeat(43)}`;
    assert.equal(
      (await http('GET', `${s.url}${path}`, { auth: `Bearer ${tampered}` })).status,
      401,
    );
    const forged = await new SignJWT({ prj: p.projectId, role: 'owner', scp: ['management'] })
      .setProtectedHeader({ alg: 'HS256' })
      .setIssuer('switchyard-dashboard')
      .setAudience('switchyard-router')
      .setSubject(ids.owner!)
      .setIssuedAt(Math.floor(s.clock.now() / 1000))
      .setExpirationTime(Math.floor(s.clock.now() / 1000) + 60)
      .sign(new Uint8Array(32));
    assert.equal((await http('GET', `${s.url}${path}`, { auth: `Bearer ${forged}` })).status, 401);
    // Expired after 60 s on the router's clock.
    s.clock.advance(61_000);
    const late = await http('GET', `${s.url}${path}`, { auth: `Bearer ${good}` });
    assert.equal(late.status, 401);

    // Never API access: the token and the session cookie are refused on API routes.
    const fresh = await tokens.mint(claims);
    const api = await http('GET', `${s.url}/${p.projectId}/v1/keys`, { auth: `Bearer ${fresh}` });
    assert.equal(api.status, 401);
    const v = await as('owner');
    const cookie = [...v.cookies].map(([k, val]) => `${k}=${val}`).join('; ');
    const byCookie = await http('GET', `${s.url}/${p.projectId}/v1/models`, {
      headers: { cookie },
    });
    assert.equal(byCookie.status, 401);
  });

  it('escapes what it shows', async () => {
    const v = await as('owner');
    await v.page(root());
    await v.send('POST', `${root()}/keys`, { body: { name: '<script>alert(1)</script>' } });
    const page = await v.page(root());
    assert.ok(!page.text.includes('<script>alert(1)</script>'));
    assert.match(page.text, /&lt;script&gt;alert\(1\)&lt;\/script&gt;/);
  });
});

describe('a dashboard whose router does not answer', () => {
  let s: TestServer;
  let p: ExecProject;
  let router: Server;
  before(async () => {
    // The api instance refusing this one (as a plain-HTTP router in production does).
    router = createServer((_req, res) => {
      res.writeHead(403, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          error: {
            message: 'Plain HTTP is refused in production.',
            type: 'invalid_request_error',
            code: 'https_required',
            param: null,
          },
        }),
      );
    }).listen(0, '127.0.0.1');
    await once(router, 'listening');
    const port = (router.address() as AddressInfo).port;
    s = await startTestServer({ env: { SWITCHYARD_ROUTER_URL: `http://127.0.0.1:${port}` } });
    p = await seedExecProject(s, 'lost');
    const u = await s.admin('POST', '/users', {
      name: 'o',
      email: 'o@lost.example',
      password: PASSWORD,
    });
    await s.admin('POST', `/projects/lost/members`, { user_id: u.body.id, role: 'owner' });
  });
  after(async () => {
    await s.close();
    router.close();
  });

  it('says so on the project page instead of showing empty lists', async () => {
    const v = new Visitor(s.url);
    assert.equal(await v.login('o@lost.example', PASSWORD), '/dashboard');
    const page = await v.page(`/dashboard/projects/${p.projectId}`);
    assert.equal(page.status, 200);
    assert.match(
      page.text,
      /role="alert">\s*Part of this project could not be loaded: Plain HTTP is refused/,
    );
  });
});
