/**
 * HTTP routes of the execution surface (reference: docs/EXEC.md).
 * - scope `management`, under `/<project_id>/v1`: join keys, agents;
 * - scope `execution`, under `/<project_id>/v1/exec`: tools catalog,
 *   workspaces, invocations, approvals (read), and the broker's public key and
 *   endpoints (also open to `management` keys: see `brokerScope`);
 * - scope `execution`, `/<project_id>/v1/mcp`: the project's MCP server (mcp.ts);
 * - approval decisions (`…/approvals/{id}/approve|reject`) are authorised by a
 *   user token (`Authorization: Bearer swyu_…`) and the user's project role,
 *   not by an API key.
 */
import { managementHeaders, type Limits } from '../http/limits.js';
import type {
  FastifyInstance,
  FastifyPluginAsync,
  FastifyRequest,
  preHandlerAsyncHookHandler,
} from 'fastify';
import { ServiceError } from '../errors/index.js';
import { authenticateKey, requireKey } from '../http/auth.js';
import { execErrorHandler } from '../http/errors.js';
import type { KeyVerifier } from '../keys/index.js';
import type { Services } from '../runtime/services.js';
import { publicTool } from './catalog.js';
import { mountMcp } from './mcp.js';

interface P {
  projectId: string;
  id: string;
}

export function execRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    const quota = s.limits;
    const management = {
      preParsing: requireKey(s.verifier, 'management', {
        quota,
        projectWide: 'join keys and agents',
      }),
    };
    const execution = {
      preParsing: requireKey(s.verifier, 'execution', {
        surface: 'exec',
        quota,
        projectWide: 'the execution surface',
      }),
    };
    const x = s.exec;
    const m = x.management;
    const pid = (r: FastifyRequest) => r.apiKey!.projectId;
    const base = '/:projectId/v1';
    const ex = `${base}/exec`;

    // Management: join keys.
    app.post(`${base}/join_keys`, management, async (r, reply) =>
      reply.code(201).send(await m.createJoinKey(pid(r), r.body)),
    );
    app.get(`${base}/join_keys`, management, async (r) => m.listJoinKeys(pid(r)));
    app.get<{ Params: P }>(`${base}/join_keys/:id`, management, async (r) =>
      m.getJoinKey(pid(r), r.params.id),
    );
    app.delete<{ Params: P }>(`${base}/join_keys/:id`, management, async (r) =>
      m.revokeJoinKey(pid(r), r.params.id),
    );

    // Management: agents.
    app.get(`${base}/agents`, management, async (r) => m.listAgents(pid(r), r.query));
    app.get<{ Params: P }>(`${base}/agents/:id`, management, async (r) =>
      m.getAgent(pid(r), r.params.id),
    );
    app.patch<{ Params: P }>(`${base}/agents/:id`, management, async (r) =>
      m.updateAgent(pid(r), r.params.id, r.body),
    );
    app.delete<{ Params: P }>(`${base}/agents/:id`, management, async (r) =>
      m.deleteAgent(pid(r), r.params.id),
    );
    app.post<{ Params: P }>(`${base}/agents/:id/rotate_key`, management, async (r) =>
      m.rotateKey(pid(r), r.params.id, r.body),
    );
    // `/<project_id>/v1/exec/…` and the MCP server, in a scope of their own for the
    // execution surface's body rules.
    await app.register(async (app) => {
      execBodies(app);
      // The project's MCP server (Streamable HTTP, stateless): a body that is not JSON
      // is `invalid_body` here too, as on the rest of the execution surface.
      mountMcp(app, s.verifier, x, s.limits);

      app.get(`${ex}/broker`, { preHandler: brokerScope(s.verifier, s.limits) }, async () => {
        const t = x.transport;
        if (!t) {
          throw new ServiceError('unavailable', {
            message: 'The exec broker is not running on this router.',
            headers: { 'Retry-After': '5' },
          });
        }
        return {
          object: 'exec.broker' as const,
          server_public_key: t.serverPublicKey,
          endpoints: { enroll: t.endpoints.enroll, agents: t.endpoints.agents },
          lease_ms: x.ctx.settings.leaseMs,
        };
      });

      // Execution: tools catalog.
      app.get(`${ex}/tools`, execution, async (r) => ({
        object: 'list' as const,
        data: (await x.catalog.list(pid(r))).map(publicTool),
      }));
      app.get<{ Params: P & { name: string } }>(`${ex}/tools/:name`, execution, async (r) => {
        const e = await x.catalog.get(pid(r), r.params.name);
        if (!e) {
          throw new ServiceError('exec_tool_not_found', {
            message: `No online agent offers the tool '${r.params.name}'.`,
            param: 'name',
          });
        }
        return publicTool(e);
      });

      // Execution: workspaces.
      app.post(`${ex}/workspaces`, execution, async (r, reply) =>
        reply.code(201).send(await x.workspaces.create(pid(r), r.body)),
      );
      app.get(`${ex}/workspaces`, execution, async (r) => x.workspaces.list(pid(r), r.query));
      app.get<{ Params: P }>(`${ex}/workspaces/:id`, execution, async (r) =>
        x.workspaces.get(pid(r), r.params.id),
      );

      // Execution: invocations.
      app.post(`${ex}/invocations`, execution, async (r, reply) => {
        const raw = r.headers['idempotency-key'];
        if (Array.isArray(raw)) {
          throw new ServiceError('invalid_body', {
            message: 'Send one Idempotency-Key header.',
            param: 'Idempotency-Key',
          });
        }
        const out = await x.invocations.create(pid(r), r.body, raw);
        if (out.replayed) reply.header('Idempotent-Replayed', 'true');
        return reply.code(out.replayed ? 200 : 201).send(out.invocation);
      });
      app.get(`${ex}/invocations`, execution, async (r) => x.invocations.list(pid(r), r.query));
      app.get<{ Params: P }>(`${ex}/invocations/:id`, execution, async (r) =>
        x.invocations.get(pid(r), r.params.id),
      );
      app.get<{ Params: P }>(`${ex}/invocations/:id/result`, execution, async (r) =>
        x.invocations.result(pid(r), r.params.id),
      );
      app.post<{ Params: P }>(`${ex}/invocations/:id/cancel`, execution, async (r) =>
        x.invocations.cancel(pid(r), r.params.id),
      );

      // Execution: approvals.
      app.get(`${ex}/approvals`, execution, async (r) => x.approvals.list(pid(r), r.query));
      app.get<{ Params: P }>(`${ex}/approvals/:id`, execution, async (r) =>
        x.approvals.get(pid(r), r.params.id),
      );
      const decider = async (r: FastifyRequest<{ Params: P }>) => {
        const project = await s.projects.findByExternalId(r.params.projectId);
        const user = await x.users.authenticate(r.headers.authorization, project?.id ?? null);
        if (!project) {
          throw new ServiceError('insufficient_role', {
            message: 'The user is not a member of this project.',
          });
        }
        return { projectId: project.id, user };
      };
      app.post<{ Params: P }>(`${ex}/approvals/:id/approve`, async (r) => {
        const d = await decider(r);
        return x.approvals.approve(d.projectId, r.params.id, d.user);
      });
      app.post<{ Params: P }>(`${ex}/approvals/:id/reject`, async (r) => {
        const d = await decider(r);
        return x.approvals.reject(d.projectId, r.params.id, d.user, r.body);
      });
    });
  };
}

/**
 * The execution surface's body rules (spec, execution-surface codes): a body
 * that fails JSON decoding is `invalid_body`, not the inference API's
 * `invalid_json`. (An empty body sent as `application/json` is `{}` everywhere,
 * http/json-body.ts, so cancel and approve accept a bodiless POST.)
 */
function execBodies(app: FastifyInstance): void {
  app.setErrorHandler(execErrorHandler);
}

/**
 * The broker's public key and endpoints are on the `/v1/exec` surface, so the
 * `execution` scope reads them (spec: scopes). `management` keys keep access:
 * enrolling agents is a management task (join keys, agents), and whoever sets
 * up an agent needs the broker's key next to the join key minted with that key.
 */
function brokerScope(verifier: KeyVerifier, limits: Limits): preHandlerAsyncHookHandler {
  return async (request, reply) => {
    const { projectId } = request.params as { projectId: string };
    const key = await authenticateKey(verifier, request, projectId, null, {
      surface: 'exec',
      projectWide: 'the execution surface',
    });
    if (!key.scopes.includes('execution') && !key.scopes.includes('management')) {
      throw new ServiceError('scope_insufficient', {
        message: "This route requires the 'execution' scope.",
      });
    }
    // After the scope, as authenticateKey counts it: a refused key spends no unit.
    const d = await limits.keyQuota(key);
    if (d) {
      request.keyQuota = d;
      reply.headers(managementHeaders(d));
    }
  };
}
