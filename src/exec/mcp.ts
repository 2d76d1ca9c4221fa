/**
 * The project's MCP server (reference: docs/EXEC.md, "MCP server"): Streamable
 * HTTP at `POST /<project_id>/v1/mcp`, built on the official
 * `@modelcontextprotocol/sdk`, stateless (no `Mcp-Session-Id`; a fresh SDK
 * `Server` and transport per HTTP request, JSON responses).
 *
 * Authorization is the API key as `Bearer`, scope `execution`; without it the
 * request never reaches the SDK and gets the spec's envelope, 403
 * `scope_insufficient` with `type: authentication_error`.
 *
 * Tools: the `exec.*` tools (control-plane operations) and every catalog tool
 * marked `mcp_visible: true`, under its own name (a catalog name starting with
 * `exec.` is reserved and only reachable through `exec.invoke`). Failures are
 * tool results, not protocol errors: `isError: true`, a text line
 * `<code>: <message>`, and `structuredContent: {error: {code, message, param}}`
 * with the code of the HTTP surface (`tool_not_mcp_visible`,
 * `exec_tool_not_found`, `invocation_not_found`, …).
 */
import type { Limits } from '../http/limits.js';
import type { Server } from '@modelcontextprotocol/sdk/server/index.js';
import type { CallToolResult, Tool } from '@modelcontextprotocol/sdk/types.js';
import { and, eq, sql } from 'drizzle-orm';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { authenticateKey, verifyKeyFirst } from '../http/auth.js';
import { parseBody } from '../http/validate.js';
import type { KeyVerifier } from '../keys/index.js';
import { tables } from '../store/index.js';
import { awaitInvocation } from './await.js';
import { publicTool, type CatalogEntry } from './catalog.js';
import type { PublicInvocation } from './invocations.js';
import type { ExecService } from './service.js';

const { workspaces: W } = tables;

export const MCP_SERVER_NAME = 'switchyard-exec';

/** The invocation states `exec.invoke` (and a catalog tool call) stops waiting at. */
const WAIT_UNTIL = ['pending_approval'] as const;

const invokeArgs = z
  .object({
    tool: z.string().min(1).max(64),
    arguments: z.record(z.string(), z.unknown()).optional(),
    workspace_id: z.string().optional(),
    timeout_ms: z.number().int().min(1).max(3_600_000).optional(),
    wait: z.boolean().optional(),
  })
  .strict();
const idArgs = z.object({ invocation_id: z.string().min(1) }).strict();
const listInvocationArgs = z
  .object({
    limit: z.number().int().min(1).max(100).optional(),
    after: z.string().optional(),
    status: z.string().optional(),
    workspace_id: z.string().optional(),
    tool: z.string().optional(),
  })
  .strict();
const listApprovalArgs = z
  .object({
    limit: z.number().int().min(1).max(100).optional(),
    after: z.string().optional(),
    status: z.string().optional(),
  })
  .strict();
const workspaceArgs = z
  .object({
    name: z.string().max(200).optional(),
    metadata: z.record(z.string(), z.string()).optional(),
  })
  .strict();

const obj = (properties: Record<string, object>, required: string[] = []) => ({
  type: 'object' as const,
  properties,
  required,
  additionalProperties: false,
});
const str = (description: string) => ({ type: 'string', description });

/** The `exec.*` tools, always listed. */
const EXEC_TOOLS: Tool[] = [
  {
    name: 'exec.list_tools',
    description: "The project's tools catalog: tools of online agents, with their MCP visibility.",
    inputSchema: obj({}),
  },
  {
    name: 'exec.invoke',
    description:
      'Runs an MCP-visible catalog tool as an invocation and (by default) waits until it finishes or waits for approval.',
    inputSchema: obj(
      {
        tool: str('Catalog tool name.'),
        arguments: { type: 'object', description: "Arguments for the tool's input_schema." },
        workspace_id: str(
          'ws_<hex>; default: the X-Exec-Workspace-Id header, else the project MCP workspace.',
        ),
        timeout_ms: { type: 'integer', minimum: 1, maximum: 3_600_000 },
        wait: { type: 'boolean', description: 'Wait for the outcome (default true).' },
      },
      ['tool'],
    ),
  },
  {
    name: 'exec.get_invocation',
    description: 'Reads an invocation (status, exit code, output).',
    inputSchema: obj({ invocation_id: str('inv_<hex>') }, ['invocation_id']),
  },
  {
    name: 'exec.cancel_invocation',
    description: 'Cancels a non-terminal invocation.',
    inputSchema: obj({ invocation_id: str('inv_<hex>') }, ['invocation_id']),
  },
  {
    name: 'exec.list_invocations',
    description: "The project's invocations, newest first.",
    inputSchema: obj({
      limit: { type: 'integer', minimum: 1, maximum: 100 },
      after: str('Last id seen.'),
      status: str('Filter by status.'),
      workspace_id: str('Filter by workspace.'),
      tool: str('Filter by tool.'),
    }),
  },
  {
    name: 'exec.list_approvals',
    description: "The project's approvals, newest first.",
    inputSchema: obj({
      limit: { type: 'integer', minimum: 1, maximum: 100 },
      after: str('Last id seen.'),
      status: str('pending | accepted | rejected | expired'),
    }),
  },
  {
    name: 'exec.create_workspace',
    description: 'Creates a workspace for invocations.',
    inputSchema: obj({
      name: str('At most 200 characters.'),
      metadata: { type: 'object', additionalProperties: { type: 'string' } },
    }),
  },
];

const RESERVED = /^exec\./;

function ok(data: Record<string, unknown>, text?: string): CallToolResult {
  return {
    content: [{ type: 'text', text: text ?? JSON.stringify(data) }],
    structuredContent: data,
  };
}

function toolError(code: string, message: string, param: string | null = null): CallToolResult {
  return {
    isError: true,
    content: [{ type: 'text', text: `${code}: ${message}` }],
    structuredContent: { error: { code, message, param } },
  };
}

/** A settled (or waiting-for-approval) invocation as a tool result. */
function invocationResult(inv: PublicInvocation): CallToolResult {
  const r = ok(inv as unknown as Record<string, unknown>, inv.stdout ?? '');
  if (inv.status === 'failed' || inv.status === 'cancelled') r.isError = true;
  if (inv.status === 'pending_approval') {
    r.content = [
      {
        type: 'text',
        text: `Invocation ${inv.id} is waiting for approval ${inv.approval_id ?? ''}; read it later with exec.get_invocation.`,
      },
    ];
  }
  return r;
}

interface McpCall {
  exec: ExecService;
  projectId: string;
  /** From the `X-Exec-Workspace-Id` header. */
  workspaceHeader: string | undefined;
  signal: AbortSignal;
}

/** The project's MCP workspace (`name: "mcp"`, `metadata.surface: "mcp"`), created on first use. */
async function mcpWorkspace(c: McpCall): Promise<string> {
  if (c.workspaceHeader) {
    return (await c.exec.workspaces.resolve(c.projectId, c.workspaceHeader, 'X-Exec-Workspace-Id'))
      .externalId;
  }
  const [w] = await c.exec.ctx.db
    .select({ id: W.externalId })
    .from(W)
    .where(
      and(eq(W.projectId, c.projectId), eq(W.name, 'mcp'), sql`${W.metadata}->>'surface' = 'mcp'`),
    )
    .orderBy(W.createdAt)
    .limit(1);
  if (w) return w.id;
  return (
    await c.exec.workspaces.create(c.projectId, { name: 'mcp', metadata: { surface: 'mcp' } })
  ).id;
}

/** Runs a catalog tool (MCP-visible only) and waits for its outcome. */
async function invoke(
  c: McpCall,
  entry: CatalogEntry | null,
  tool: string,
  args: Record<string, unknown>,
  opts: { workspaceId?: string; timeoutMs?: number; wait?: boolean },
): Promise<CallToolResult> {
  if (!entry)
    return toolError('exec_tool_not_found', `No online agent offers the tool '${tool}'.`, 'tool');
  if (!entry.spec.mcp_visible) {
    return toolError(
      'tool_not_mcp_visible',
      `The tool '${tool}' is not exposed over MCP (mcp_visible is false).`,
      'tool',
    );
  }
  const workspaceId = opts.workspaceId ?? (await mcpWorkspace(c));
  const { invocation } = await c.exec.invocations.create(
    c.projectId,
    {
      tool,
      arguments: args,
      workspace_id: workspaceId,
      ...(opts.timeoutMs !== undefined ? { timeout_ms: opts.timeoutMs } : {}),
    },
    undefined,
    { mcp: true },
  );
  if (opts.wait === false) return invocationResult(invocation);
  const settled = await awaitInvocation(c.exec, c.projectId, invocation.id, {
    signal: c.signal,
    until: WAIT_UNTIL,
  });
  return invocationResult(settled);
}

async function callExecTool(
  c: McpCall,
  name: string,
  raw: Record<string, unknown>,
): Promise<CallToolResult> {
  const x = c.exec;
  switch (name) {
    case 'exec.list_tools':
      parseBody(z.object({}).strict(), raw);
      return ok({ object: 'list', data: (await x.catalog.list(c.projectId)).map(publicTool) });
    case 'exec.invoke': {
      const a = parseBody(invokeArgs, raw);
      return invoke(c, await x.catalog.get(c.projectId, a.tool), a.tool, a.arguments ?? {}, {
        ...(a.workspace_id !== undefined ? { workspaceId: a.workspace_id } : {}),
        ...(a.timeout_ms !== undefined ? { timeoutMs: a.timeout_ms } : {}),
        ...(a.wait !== undefined ? { wait: a.wait } : {}),
      });
    }
    case 'exec.get_invocation': {
      const a = parseBody(idArgs, raw);
      return ok(await x.invocations.get(c.projectId, a.invocation_id));
    }
    case 'exec.cancel_invocation': {
      const a = parseBody(idArgs, raw);
      return ok(await x.invocations.cancel(c.projectId, a.invocation_id));
    }
    case 'exec.list_invocations':
      return ok(await x.invocations.list(c.projectId, parseBody(listInvocationArgs, raw)));
    case 'exec.list_approvals':
      return ok(await x.approvals.list(c.projectId, parseBody(listApprovalArgs, raw)));
    case 'exec.create_workspace':
      return ok(await x.workspaces.create(c.projectId, parseBody(workspaceArgs, raw)));
    default:
      return toolError('exec_tool_not_found', `No MCP tool named '${name}'.`, 'name');
  }
}

/**
 * The MCP SDK, loaded on the first MCP request: it and its schema libraries are
 * about 15 MiB of a router's resident memory that deployments without MCP
 * clients never need.
 */
let sdk: Promise<{
  Server: typeof import('@modelcontextprotocol/sdk/server/index.js').Server;
  StreamableHTTPServerTransport: typeof import('@modelcontextprotocol/sdk/server/streamableHttp.js').StreamableHTTPServerTransport;
  types: typeof import('@modelcontextprotocol/sdk/types.js');
}> | null = null;

function loadSdk(): NonNullable<typeof sdk> {
  sdk ??= Promise.all([
    import('@modelcontextprotocol/sdk/server/index.js'),
    import('@modelcontextprotocol/sdk/server/streamableHttp.js'),
    import('@modelcontextprotocol/sdk/types.js'),
  ]).then(([server, http, types]) => ({
    Server: server.Server,
    StreamableHTTPServerTransport: http.StreamableHTTPServerTransport,
    types,
  }));
  return sdk;
}

/** One SDK server for one HTTP request, bound to the key's project. */
function buildServer(
  { Server, types }: Awaited<ReturnType<typeof loadSdk>>,
  c: Omit<McpCall, 'signal'>,
): Server {
  const { CallToolRequestSchema, ListToolsRequestSchema } = types;
  const server = new Server(
    { name: MCP_SERVER_NAME, version: '1.0.0' },
    { capabilities: { tools: {} } },
  );
  server.setRequestHandler(ListToolsRequestSchema, async () => {
    const visible = (await c.exec.catalog.list(c.projectId))
      .filter((e) => e.spec.mcp_visible && !RESERVED.test(e.spec.name))
      .map((e): Tool => ({
        name: e.spec.name,
        description: e.spec.description,
        inputSchema: e.spec.input_schema as Tool['inputSchema'],
        annotations: {
          readOnlyHint: e.spec.risk === 'read_only',
          destructiveHint: e.spec.risk === 'destructive',
        },
      }));
    return { tools: [...EXEC_TOOLS, ...visible] };
  });
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const call: McpCall = { ...c, signal: extra.signal };
    const name = request.params.name;
    const args = request.params.arguments ?? {};
    try {
      if (RESERVED.test(name)) return await callExecTool(call, name, args);
      return await invoke(call, await c.exec.catalog.get(c.projectId, name), name, args, {});
    } catch (err) {
      if (err instanceof ServiceError) return toolError(err.code, err.message, err.param);
      throw err;
    }
  });
  return server;
}

/** Mounts `{base_url}/<project_id>/v1/mcp`. */
export function mountMcp(
  app: FastifyInstance,
  verifier: KeyVerifier,
  exec: ExecService,
  limits: Limits,
): void {
  const path = '/:projectId/v1/mcp';
  /** The caller's key: scope `execution`, not bound to an endpoint, within its quota. */
  const keyOf = (request: FastifyRequest, reply: FastifyReply) =>
    authenticateKey(
      verifier,
      request,
      (request.params as { projectId: string }).projectId,
      'execution',
      { surface: 'exec', quota: limits, projectWide: 'the execution surface' },
      reply,
    );
  // The key is verified before the body is read (no body from a client without one).
  app.post(path, { preParsing: verifyKeyFirst(verifier, 'exec') }, async (request, reply) => {
    const key = await keyOf(request, reply);
    const header = request.headers['x-exec-workspace-id'];
    const mcp = await loadSdk();
    const server = buildServer(mcp, {
      exec,
      projectId: key.projectId,
      workspaceHeader: typeof header === 'string' && header !== '' ? header : undefined,
    });
    const transport = new mcp.StreamableHTTPServerTransport({
      sessionIdGenerator: undefined,
      enableJsonResponse: true,
    });
    reply.hijack();
    const raw = reply.raw;
    // Hijacked: the headers set by the app's hooks (X-Request-ID, and HSTS in
    // production) are not written by Fastify any more, so they are copied here.
    for (const [name, value] of Object.entries(reply.getHeaders())) {
      if (value !== undefined) raw.setHeader(name, value);
    }
    raw.setHeader('x-request-id', request.id);
    raw.on('close', () => {
      void transport.close();
      void server.close();
    });
    try {
      await server.connect(transport);
      await transport.handleRequest(request.raw, raw, request.body);
    } catch (err) {
      request.log.error({ err }, 'MCP request failed');
      if (!raw.headersSent) {
        raw.writeHead(500, { 'content-type': 'application/json' });
        raw.end(
          JSON.stringify({
            jsonrpc: '2.0',
            error: { code: -32603, message: 'Internal server error' },
            id: null,
          }),
        );
      }
    }
  });
  // Stateless: no server-initiated stream (GET) and no session to end (DELETE).
  const notAllowed = async (request: FastifyRequest, reply: FastifyReply) => {
    await keyOf(request, reply);
    return reply
      .code(405)
      .header('Allow', 'POST')
      .send({
        jsonrpc: '2.0',
        error: {
          code: -32000,
          message: 'Method not allowed: this MCP server is stateless; use POST.',
        },
        id: null,
      });
  };
  app.get(path, notAllowed);
  app.delete(path, notAllowed);
}
