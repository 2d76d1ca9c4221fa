/**
 * The project's MCP server (`POST /<project_id>/v1/mcp`, Streamable HTTP,
 * stateless) through the official SDK's `Client` and
 * `StreamableHTTPClientTransport`: the tool list (exec.* plus MCP-visible
 * catalog tools), exec tools (catalog, workspace, invoke with wait, get,
 * cancel, approvals), a catalog tool called by name, `tool_not_mcp_visible`
 * both ways, tool errors carrying the HTTP surface's codes, and 403
 * `scope_insufficient` with `type: authentication_error` for a key without
 * the `execution` scope, and the app's headers (HSTS in production) on its
 * hijacked replies. One suite calls a tool on a real `switchyard agent`.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { FastifyInstance } from 'fastify';
import { buildApp } from '../../src/http/app.js';
import { startTestServer, http, type TestServer } from '../support/harness.js';
import { AutoTransport, startRealAgent, type RealAgent } from './agents.js';
import {
  enrollAgent,
  events,
  joinKey,
  seedExecProject,
  tool,
  type ExecProject,
} from './support.js';

interface Result {
  isError?: boolean;
  content: Array<{ type: string; text?: string }>;
  structuredContent?: Record<string, unknown>;
}

async function connect(s: TestServer, p: ExecProject, key = p.exec, headers = {}) {
  const client = new Client({ name: 'switchyard-test', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(`${s.url}/${p.projectId}/v1/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${key}`, ...headers } },
  });
  await client.connect(transport);
  return client;
}

const call = async (c: Client, name: string, args: Record<string, unknown> = {}) =>
  (await c.callTool({ name, arguments: args })) as Result;

function errorCode(r: Result): string {
  assert.equal(r.isError, true, JSON.stringify(r));
  const e = (r.structuredContent as { error: { code: string; message: string } }).error;
  assert.match(r.content[0]!.text!, new RegExp(`^${e.code}: `));
  return e.code;
}

describe('MCP server (fake transport)', () => {
  let s: TestServer;
  let p: ExecProject;
  let t: AutoTransport;
  let client: Client;
  before(async () => {
    s = await startTestServer();
    p = await seedExecProject(s, 'mcp');
    t = new AutoTransport(s.services.exec, (req) => ({
      exitCode: 0,
      stdout: `MCP-RAN ${req.tool} ${JSON.stringify(req.arguments)}`,
    }));
    t.hang.add('slow');
    s.services.exec.setTransport(t);
    await enrollAgent(s, p, {
      name: 'mcp-agent',
      tools: [
        tool('fs.read'),
        tool('slow'),
        tool('hidden', { mcp_visible: false }),
        tool('rm', { risk: 'destructive' }),
      ],
      transport: t,
    });
    client = await connect(s, p);
  });
  after(async () => {
    await client?.close();
    await s.close();
  });

  it('lists the exec.* tools and the MCP-visible catalog tools only', async () => {
    const { tools } = await client.listTools();
    const names = tools.map((x) => x.name);
    for (const n of [
      'exec.list_tools',
      'exec.invoke',
      'exec.get_invocation',
      'exec.cancel_invocation',
      'exec.list_invocations',
      'exec.list_approvals',
      'exec.create_workspace',
    ]) {
      assert.ok(names.includes(n), n);
    }
    assert.ok(names.includes('fs.read'));
    assert.ok(names.includes('rm'));
    assert.ok(!names.includes('hidden'), 'not MCP-visible');
    const fs = tools.find((x) => x.name === 'fs.read')!;
    assert.equal(fs.inputSchema.type, 'object');
    assert.deepEqual(fs.inputSchema.required, ['path']);
    assert.equal(tools.find((x) => x.name === 'rm')!.annotations?.destructiveHint, true);
  });

  it('exec.list_tools reads the whole catalog with each tool’s MCP visibility', async () => {
    const r = await call(client, 'exec.list_tools');
    assert.equal(r.isError, undefined);
    const data = (r.structuredContent as { data: Array<Record<string, unknown>> }).data;
    assert.deepEqual(
      data.map((x) => [x.name, x.mcp_visible]),
      [
        ['fs.read', true],
        ['hidden', false],
        ['rm', true],
        ['slow', true],
      ],
    );
  });

  it('exec.create_workspace then exec.invoke runs the tool and waits for its outcome; exec.* events fire', async () => {
    const ws = await call(client, 'exec.create_workspace', { name: 'from-mcp' });
    const wsId = String(ws.structuredContent!.id);
    assert.match(wsId, /^ws_[0-9a-f]+$/);
    const r = await call(client, 'exec.invoke', {
      tool: 'fs.read',
      arguments: { path: '/etc/hosts' },
      workspace_id: wsId,
    });
    assert.equal(r.isError, undefined, JSON.stringify(r));
    const inv = r.structuredContent!;
    assert.equal(inv.status, 'completed');
    assert.equal(inv.exit_code, 0);
    assert.equal(inv.workspace_id, wsId);
    assert.equal(r.content[0]!.text, 'MCP-RAN fs.read {"path":"/etc/hosts"}');
    const got = await call(client, 'exec.get_invocation', { invocation_id: String(inv.id) });
    assert.equal(got.structuredContent!.status, 'completed');
    const evs = await events(s, p.projectUuid);
    const mine = evs.filter((e) => e.data.invocation_id === inv.id).map((e) => e.type);
    assert.deepEqual(mine, ['exec.dispatched', 'exec.completed']);
  });

  it('a MCP-visible catalog tool called by name runs in the project MCP workspace', async () => {
    const r = await call(client, 'fs.read', { path: '/tmp/a' });
    assert.equal(r.isError, undefined, JSON.stringify(r));
    assert.equal(r.content[0]!.text, 'MCP-RAN fs.read {"path":"/tmp/a"}');
    const again = await call(client, 'fs.read', { path: '/tmp/b' });
    const ws1 = r.structuredContent!.workspace_id;
    assert.equal(again.structuredContent!.workspace_id, ws1, 'one MCP workspace, reused');
    const w = await s.call('GET', `/${p.projectId}/v1/exec/workspaces/${String(ws1)}`, {
      key: p.exec,
    });
    assert.equal(w.body.name, 'mcp');
    // Bad arguments: the tool's schema, as on the HTTP surface.
    assert.equal(errorCode(await call(client, 'fs.read', { nope: 1 })), 'invalid_body');
  });

  it('X-Exec-Workspace-Id picks the workspace for tools called by name', async () => {
    const ws = await s.call('POST', `/${p.projectId}/v1/exec/workspaces`, {
      key: p.exec,
      body: { name: 'header' },
    });
    const c = await connect(s, p, p.exec, { 'X-Exec-Workspace-Id': String(ws.body.id) });
    try {
      const r = await call(c, 'fs.read', { path: '/h' });
      assert.equal(r.structuredContent!.workspace_id, ws.body.id);
    } finally {
      await c.close();
    }
  });

  it('tool_not_mcp_visible for a catalog tool that is not MCP-visible, by name or through exec.invoke', async () => {
    const before = t.dispatched.length;
    assert.equal(errorCode(await call(client, 'hidden', { path: '/' })), 'tool_not_mcp_visible');
    const r = await call(client, 'exec.invoke', { tool: 'hidden', arguments: { path: '/' } });
    assert.equal(errorCode(r), 'tool_not_mcp_visible');
    assert.equal(
      (r.structuredContent as { error: { param: string } }).error.param,
      'tool',
      'the field named',
    );
    assert.equal(t.dispatched.length, before, 'nothing ran');
    // Unknown tools and invocations: the HTTP surface's codes.
    assert.equal(errorCode(await call(client, 'nope', {})), 'exec_tool_not_found');
    assert.equal(
      errorCode(await call(client, 'exec.get_invocation', { invocation_id: 'inv_0000' })),
      'invocation_not_found',
    );
    assert.equal(errorCode(await call(client, 'exec.invoke', {})), 'invalid_body');
  });

  it('exec.invoke wait:false, exec.cancel_invocation, invocation_terminal', async () => {
    const r = await call(client, 'exec.invoke', {
      tool: 'slow',
      arguments: { path: '/' },
      wait: false,
    });
    const id = String(r.structuredContent!.id);
    assert.equal(r.structuredContent!.status, 'dispatched');
    const c = await call(client, 'exec.cancel_invocation', { invocation_id: id });
    assert.equal(c.structuredContent!.status, 'cancelled');
    assert.ok(
      t.cancelled.some((x) => x.invocationId === id),
      'the agent was asked to kill it',
    );
    assert.equal(
      errorCode(await call(client, 'exec.cancel_invocation', { invocation_id: id })),
      'invocation_terminal',
    );
    const list = await call(client, 'exec.list_invocations', { status: 'cancelled' });
    const data = (list.structuredContent as { data: Array<{ id: string }> }).data;
    assert.ok(data.some((x) => x.id === id));
  });

  it('a destructive tool returns at pending_approval; exec.list_approvals shows the approval', async () => {
    const r = await call(client, 'rm', { path: '/' });
    assert.equal(r.isError, undefined, JSON.stringify(r));
    assert.equal(r.structuredContent!.status, 'pending_approval');
    const approvalId = String(r.structuredContent!.approval_id);
    assert.match(r.content[0]!.text!, new RegExp(approvalId));
    const list = await call(client, 'exec.list_approvals', { status: 'pending' });
    const data = (list.structuredContent as { data: Array<{ id: string }> }).data;
    assert.ok(data.some((x) => x.id === approvalId));
  });

  it('403 scope_insufficient with type authentication_error for a key without the execution scope', async () => {
    const body = {
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: {
        protocolVersion: '2025-06-18',
        capabilities: {},
        clientInfo: { name: 'x', version: '1' },
      },
    };
    const headers = { accept: 'application/json, text/event-stream' };
    const r = await http('POST', `${s.url}/${p.projectId}/v1/mcp`, {
      auth: `Bearer ${p.inference}`,
      body,
      headers,
    });
    assert.equal(r.status, 403, r.text);
    assert.deepEqual(r.body, {
      error: {
        message: (r.body.error as { message: string }).message,
        type: 'authentication_error',
        code: 'scope_insufficient',
        param: null,
      },
    });
    assert.ok(r.headers['x-request-id']);
    // Through the SDK client too: the connection is refused with HTTP 403.
    await assert.rejects(connect(s, p, p.inference), (err: Error & { code?: number }) => {
      assert.equal(err.code, 403);
      assert.match(err.message, /"code":"scope_insufficient"/);
      return true;
    });
    // No key at all: 401 authentication_required (the execution surface's code).
    const anon = await http('POST', `${s.url}/${p.projectId}/v1/mcp`, { body, headers });
    assert.equal(anon.status, 401);
    assert.equal((anon.body.error as { code: string }).code, 'authentication_required');
    // Another project's key: 403 cross_project_access.
    const other = await seedExecProject(s, 'mcp-other');
    const x = await http('POST', `${s.url}/${p.projectId}/v1/mcp`, {
      auth: `Bearer ${other.exec}`,
      body,
      headers,
    });
    assert.equal(x.status, 403);
    assert.equal((x.body.error as { code: string }).code, 'cross_project_access');
  });

  it('stateless: GET and DELETE are 405', async () => {
    for (const method of ['GET', 'DELETE']) {
      const r = await http(method, `${s.url}/${p.projectId}/v1/mcp`, {
        auth: `Bearer ${p.exec}`,
      });
      assert.equal(r.status, 405);
      assert.equal(r.headers.allow, 'POST');
    }
  });

  it('a body that is not JSON is invalid_body, as on the rest of the execution surface', async () => {
    const r = await http('POST', `${s.url}/${p.projectId}/v1/mcp`, {
      auth: `Bearer ${p.exec}`,
      rawBody: '{"jsonrpc":"2.0",',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
      },
    });
    assert.equal(r.status, 400, r.text);
    assert.equal((r.body.error as Record<string, unknown>).code, 'invalid_body');
  });

  it('a tool two agents declare differently runs over MCP only on one that makes it MCP-visible', async () => {
    const hidden = await enrollAgent(s, p, {
      name: 'dual-hidden',
      tools: [tool('dual', { mcp_visible: false })],
      transport: t,
    });
    s.clock.advance(1000);
    // Enrolled last, so the catalog (and tools/list) describes `dual` by this one.
    const visible = await enrollAgent(s, p, {
      name: 'dual-visible',
      tools: [tool('dual', { mcp_visible: true })],
      transport: t,
    });
    t.hang.add('dual');
    // One invocation in flight on the visible agent: the hidden one is the less loaded.
    const busy = await s.call('POST', `/${p.projectId}/v1/exec/invocations`, {
      key: p.exec,
      body: { tool: 'dual', arguments: { path: '/' }, workspace_id: await workspaceId() },
    });
    assert.equal(busy.status, 201, busy.text);
    assert.equal(busy.body.agent_id, visible.agentId);

    const r = await call(client, 'exec.invoke', {
      tool: 'dual',
      arguments: { path: '/mcp' },
      wait: false,
    });
    assert.equal(r.isError, undefined, JSON.stringify(r));
    assert.equal(r.structuredContent!.agent_id, visible.agentId);
    const sent = t.dispatched.find((d) => d.req.invocationId === r.structuredContent!.id);
    assert.equal(sent?.agentId, visible.agentId, 'never on the agent that hides it from MCP');
    assert.ok(!t.dispatched.some((d) => d.agentId === hidden.agentId));

    // With only the hiding agent online, the tool is not MCP-visible at all.
    await s.call('DELETE', `/${p.projectId}/v1/agents/${visible.agentId}`, { key: p.mgmt });
    assert.equal(
      errorCode(await call(client, 'exec.invoke', { tool: 'dual', arguments: { path: '/' } })),
      'tool_not_mcp_visible',
    );
    assert.ok(!t.dispatched.some((d) => d.agentId === hidden.agentId));
  });

  it('an MCP invocation dispatched later (after its approval) still runs only on an agent that makes the tool MCP-visible', async () => {
    const hidden = await enrollAgent(s, p, {
      name: 'later-hidden',
      tools: [tool('wipe', { risk: 'destructive', mcp_visible: false })],
      transport: t,
    });
    s.clock.advance(1000);
    const visible = await enrollAgent(s, p, {
      name: 'later-visible',
      tools: [tool('wipe', { risk: 'destructive', mcp_visible: true })],
      transport: t,
    });
    t.hang.add('wipe');
    const u = await s.admin('POST', '/users', {
      name: 'mcp-owner',
      email: 'mcp-owner@example.com',
    });
    assert.equal(u.status, 201, u.text);
    const m = await s.admin('POST', `/projects/${p.slug}/members`, {
      user_id: u.body.id,
      role: 'owner',
    });
    assert.equal(m.status, 201, m.text);
    const approve = (id: string) =>
      http('POST', `${s.url}/${p.projectId}/v1/exec/approvals/${id}/approve`, {
        auth: `Bearer ${String(u.body.token)}`,
        body: {},
      });

    const r = await call(client, 'wipe', { path: '/mcp' });
    assert.equal(r.structuredContent!.status, 'pending_approval', JSON.stringify(r));
    const id = String(r.structuredContent!.id);
    // Meanwhile the MCP-visible agent's session is gone; the hiding one is connected.
    t.connected.delete(visible.agentId);
    const ok = await approve(String(r.structuredContent!.approval_id));
    assert.equal(ok.status, 200, ok.text);
    await s.services.exec.tick();
    const got = await s.call('GET', `/${p.projectId}/v1/exec/invocations/${id}`, { key: p.exec });
    assert.equal(got.body.status, 'queued', 'waits for an agent that may run it over MCP');
    assert.ok(!t.dispatched.some((d) => d.req.invocationId === id), 'never on the hiding agent');
    assert.ok(!t.dispatched.some((d) => d.agentId === hidden.agentId));

    // Back: the next tick dispatches it there.
    t.connected.add(visible.agentId);
    await s.services.exec.tick();
    const sent = t.dispatched.find((d) => d.req.invocationId === id);
    assert.equal(sent?.agentId, visible.agentId);
    await s.call('POST', `/${p.projectId}/v1/exec/invocations/${id}/cancel`, { key: p.exec });

    // The same tool through the HTTP surface may still run on the hiding agent.
    t.connected.delete(visible.agentId);
    const h = await s.call('POST', `/${p.projectId}/v1/exec/invocations`, {
      key: p.exec,
      body: { tool: 'wipe', arguments: { path: '/http' }, workspace_id: await workspaceId() },
    });
    assert.equal(h.status, 201, h.text);
    assert.equal((await approve(String(h.body.approval_id))).status, 200);
    assert.equal(
      t.dispatched.find((d) => d.req.invocationId === h.body.id)?.agentId,
      hidden.agentId,
    );
    await s.call('POST', `/${p.projectId}/v1/exec/invocations/${String(h.body.id)}/cancel`, {
      key: p.exec,
    });
    t.connected.add(visible.agentId);
  });

  async function workspaceId(): Promise<string> {
    const w = await s.call('POST', `/${p.projectId}/v1/exec/workspaces`, {
      key: p.exec,
      body: { name: 'dual' },
    });
    return String(w.body.id);
  }
});

describe('MCP server in production', () => {
  let s: TestServer;
  let p: ExecProject;
  let prod: FastifyInstance;
  let prodUrl: string;
  before(async () => {
    s = await startTestServer();
    p = await seedExecProject(s, 'mcp-prod');
    // The same services served in production mode, behind a trusted TLS proxy
    // (so the test's plain HTTP with X-Forwarded-Proto: https is accepted).
    const config = { ...s.services.config, env: 'production' as const };
    prod = await buildApp({ ...s.services, config: { ...config, trustedProxies: ['127.0.0.1'] } });
    await prod.listen({ port: 0, host: '127.0.0.1' });
    const addr = prod.server.address();
    assert.ok(addr && typeof addr !== 'string');
    prodUrl = `http://127.0.0.1:${addr.port}`;
  });
  after(async () => {
    await prod?.close();
    await s.close();
  });

  it('answers carry the app’s headers (Strict-Transport-Security, X-Request-ID) though the reply is hijacked', async () => {
    const r = await http('POST', `${prodUrl}/${p.projectId}/v1/mcp`, {
      auth: `Bearer ${p.exec}`,
      body: {
        jsonrpc: '2.0',
        id: 1,
        method: 'initialize',
        params: {
          protocolVersion: '2025-06-18',
          capabilities: {},
          clientInfo: { name: 'x', version: '1' },
        },
      },
      headers: { accept: 'application/json, text/event-stream', 'x-forwarded-proto': 'https' },
    });
    assert.equal(r.status, 200, r.text);
    assert.ok((r.body.result as Record<string, unknown>).serverInfo, r.text);
    assert.equal(r.headers['strict-transport-security'], 'max-age=31536000; includeSubDomains');
    assert.match(String(r.headers['x-request-id']), /^req_[0-9a-f]{32}$/);
    assert.match(String(r.headers['content-type']), /^application\/json/);
  });
});

describe('MCP server with a real switchyard agent over CURVE', () => {
  let s: TestServer;
  let p: ExecProject;
  let agent: RealAgent;
  const dir = mkdtempSync(join(tmpdir(), 'swy-mcp-agent-'));
  before(async () => {
    s = await startTestServer();
    p = await seedExecProject(s, 'mcp-real');
    agent = await startRealAgent(s, {
      dir,
      name: 'real-mcp',
      joinKey: await joinKey(s, p),
      tools: [
        {
          name: 'host.echo',
          description: 'Echoes its arguments.',
          input_schema: { type: 'object', properties: { word: { type: 'string' } } },
          risk: 'low',
          mcp_visible: true,
          default_timeout_ms: 10_000,
          command: ['sh', '-c', 'echo "REAL $SWITCHYARD_TOOL_ARGS"; exit 0'],
        },
        {
          name: 'host.secret',
          description: 'Not for MCP.',
          input_schema: { type: 'object' },
          risk: 'low',
          mcp_visible: false,
          default_timeout_ms: 10_000,
          command: ['true'],
        },
      ],
    });
  });
  after(async () => {
    await agent?.close();
    await s?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('an MCP client runs a tool on the agent process (by name and through exec.invoke)', async () => {
    const client = await connect(s, p);
    try {
      const names = (await client.listTools()).tools.map((x) => x.name);
      assert.ok(names.includes('host.echo'));
      assert.ok(!names.includes('host.secret'));
      const r = await call(client, 'host.echo', { word: 'hi' });
      assert.equal(r.isError, undefined, JSON.stringify(r));
      assert.equal(r.content[0]!.text, 'REAL {"word":"hi"}\n');
      assert.equal(r.structuredContent!.exit_code, 0);
      const ws = await call(client, 'exec.create_workspace', {});
      const i = await call(client, 'exec.invoke', {
        tool: 'host.echo',
        arguments: { word: 'again' },
        workspace_id: String(ws.structuredContent!.id),
      });
      assert.equal(i.structuredContent!.status, 'completed');
      assert.equal(i.structuredContent!.stdout, 'REAL {"word":"again"}\n');
      assert.equal(
        errorCode(await call(client, 'exec.invoke', { tool: 'host.secret' })),
        'tool_not_mcp_visible',
      );
    } finally {
      await client.close();
    }
  });
});
