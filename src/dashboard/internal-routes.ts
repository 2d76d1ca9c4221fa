/**
 * The router's internal path, `/internal/v1/projects/<project_id>/…`: what the
 * dashboard forwards for a signed-in user, authorised by the internal proxy
 * token (internal-token.ts) and nothing else. API keys are refused here, and the
 * token is refused everywhere else (API-key routes never look at it).
 *
 * The token names the user, the project and the scopes the user's role gives
 * (`scopesOf`). The path's project must be the token's. Keys and webhooks go
 * through the same services as the key and webhook APIs, with the token's scopes
 * standing in for a key's (so a dashboard user grants no scope beyond their
 * role's); approval decisions go through the approvals service with the user as
 * the decider (its role rules apply as for a user token). Reads need membership;
 * changes need `management` (keys, webhooks).
 */
import type { FastifyInstance, FastifyPluginAsync, FastifyRequest } from 'fastify';
import { ServiceError } from '../errors/index.js';
import { bearerToken } from '../keys/index.js';
import type { Services } from '../runtime/services.js';
import type { InternalClaims, InternalTokens } from './internal-token.js';

declare module 'fastify' {
  interface FastifyRequest {
    internal?: { claims: InternalClaims; projectId: string; projectSlug: string };
  }
}

interface P {
  projectId: string;
  id: string;
}

export function internalRoutes(s: Services, tokens: InternalTokens): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    app.addHook('preParsing', async (request) => {
      const claims = await tokens.verify(bearerToken(request.headers.authorization) ?? undefined);
      const { projectId } = request.params as Partial<P>;
      if (!projectId || projectId !== claims.project) {
        throw new ServiceError('cross_project_access', {
          message: 'The dashboard token is for another project.',
        });
      }
      const project = await s.projects.findByExternalId(projectId);
      if (!project) throw new ServiceError('project_not_found');
      request.internal = { claims, projectId: project.id, projectSlug: project.slug };
    });

    const ctx = (r: FastifyRequest) => r.internal!;
    const manage = (r: FastifyRequest) => {
      if (!ctx(r).claims.scopes.includes('management')) {
        throw new ServiceError('scope_insufficient', {
          message: 'Your role in this project cannot change keys or webhooks.',
        });
      }
    };
    const project = (r: FastifyRequest) => ({ id: ctx(r).projectId, slug: ctx(r).projectSlug });
    const actor = (r: FastifyRequest) => ({ scopes: ctx(r).claims.scopes });
    const base = '/internal/v1/projects/:projectId';

    app.get(`${base}/keys`, async (r) => ({
      object: 'list',
      data: await s.keyService.list(ctx(r).projectId),
    }));
    app.post(`${base}/keys`, async (r, reply) => {
      manage(r);
      return reply.code(201).send(await s.keyService.create(project(r), r.body, actor(r)));
    });
    app.post<{ Params: P }>(`${base}/keys/:id/rotate`, async (r) => {
      manage(r);
      return s.keyService.rotate(project(r), r.params.id, r.body, actor(r));
    });
    app.delete<{ Params: P }>(`${base}/keys/:id`, async (r) => {
      manage(r);
      return s.keyService.revoke(ctx(r).projectId, r.params.id);
    });

    app.get(`${base}/webhooks`, async (r) => s.webhooks.list(ctx(r).projectId, r.query));
    app.post(`${base}/webhooks`, async (r, reply) => {
      manage(r);
      return reply.code(201).send(await s.webhooks.create(ctx(r).projectId, r.body));
    });
    app.delete<{ Params: P }>(`${base}/webhooks/:id`, async (r) => {
      manage(r);
      return s.webhooks.remove(ctx(r).projectId, r.params.id);
    });

    app.get(`${base}/approvals`, async (r) => s.exec.approvals.list(ctx(r).projectId, r.query));
    const decider = async (r: FastifyRequest) => {
      const u = await s.exec.users.ref(ctx(r).claims.user, ctx(r).projectId);
      if (!u) throw new ServiceError('authentication_required');
      return u;
    };
    app.post<{ Params: P }>(`${base}/approvals/:id/approve`, async (r) =>
      s.exec.approvals.approve(ctx(r).projectId, r.params.id, await decider(r)),
    );
    app.post<{ Params: P }>(`${base}/approvals/:id/reject`, async (r) =>
      s.exec.approvals.reject(ctx(r).projectId, r.params.id, await decider(r), r.body),
    );
  };
}
