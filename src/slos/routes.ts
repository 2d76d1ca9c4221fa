/**
 * The SLO API (scope `management`, under the per-project management limit):
 * `/<project_id>/v1/slos` (every endpoint's SLOs; creation names the endpoint
 * in the body) and `/<project_id>/<endpoint_slug>/v1/slos` (that endpoint's
 * SLOs only). A key bound to an endpoint (`endpointId`) sees only that
 * endpoint's SLOs, and gets 403 `endpoint_restricted` on another's path.
 */
import type { FastifyInstance, FastifyPluginAsync, FastifyRequest } from 'fastify';
import { keyEndpoint, requireKey } from '../http/auth.js';
import type { Services } from '../runtime/services.js';
import type { SloScope } from './service.js';

interface Params {
  projectId: string;
  endpointSlug?: string;
  sloId: string;
}

declare module 'fastify' {
  interface FastifyRequest {
    sloScope?: SloScope;
  }
}

export function sloRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    // Both before the body is read: the key, the endpoint binding and the
    // management limit decide before a malformed body can (spec: 401 first).
    app.addHook(
      'preParsing',
      requireKey(s.verifier, 'management', { quota: s.limits, quotaWithManagement: true }),
    );
    app.addHook('preParsing', async (request, reply) => {
      const { endpointSlug } = request.params as Params;
      const key = request.apiKey!;
      let endpointId = key.endpointId;
      if (endpointSlug !== undefined) {
        endpointId = (await keyEndpoint(s.resolveEndpoint, key, endpointSlug)).id;
      }
      request.sloScope = { projectId: key.projectId, endpointId };
      await s.limits.management(key.projectId, reply);
    });

    const scope = (r: FastifyRequest) => r.sloScope!;
    const svc = s.slos;
    for (const base of ['/:projectId/:endpointSlug/v1/slos', '/:projectId/v1/slos']) {
      app.post(base, async (r, reply) => reply.code(201).send(await svc.create(scope(r), r.body)));
      app.get(base, async (r) => svc.list(scope(r), r.query));
      app.get<{ Params: Params }>(`${base}/:sloId`, async (r) => svc.get(scope(r), r.params.sloId));
      app.patch<{ Params: Params }>(`${base}/:sloId`, async (r) =>
        svc.update(scope(r), r.params.sloId, r.body),
      );
      app.delete<{ Params: Params }>(`${base}/:sloId`, async (r) =>
        svc.remove(scope(r), r.params.sloId),
      );
    }
  };
}
