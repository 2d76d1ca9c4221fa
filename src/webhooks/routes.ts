/**
 * The webhook API (scope `management`, under the per-project management limit):
 * the spec's routes relative to `/<project_id>/<endpoint_slug>`, and the same
 * routes under `/<project_id>` (webhooks are project-wide: events are project
 * events; the endpoint-relative form checks that the endpoint exists).
 * A key bound to an endpoint (`endpointId`) gets 403 `endpoint_restricted` on
 * another endpoint's path and on the project-level alias, which names no
 * endpoint: it reaches webhooks only through its own endpoint's path.
 * Beyond the spec: delivery attempts and manual redelivery.
 */
import type { FastifyInstance, FastifyPluginAsync, FastifyRequest } from 'fastify';
import { ServiceError } from '../errors/index.js';
import { keyEndpoint, requireKey } from '../http/auth.js';
import type { Services } from '../runtime/services.js';

interface Params {
  projectId: string;
  endpointSlug?: string;
  webhookId: string;
  deliveryId: string;
}

export function webhookRoutes(s: Services): FastifyPluginAsync {
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
      if (endpointSlug !== undefined) {
        await keyEndpoint(s.resolveEndpoint, key, endpointSlug);
      } else if (key.endpointId !== null) {
        throw new ServiceError('endpoint_restricted', {
          message:
            "A key bound to an endpoint manages webhooks only under that endpoint's path, " +
            '/<project_id>/<endpoint_slug>/v1/webhooks.',
        });
      }
      await s.limits.management(key.projectId, reply);
    });

    const pid = (r: FastifyRequest) => r.apiKey!.projectId;
    const w = s.webhooks;
    for (const base of ['/:projectId/:endpointSlug/v1/webhooks', '/:projectId/v1/webhooks']) {
      app.post(base, async (r, reply) => reply.code(201).send(await w.create(pid(r), r.body)));
      app.get(base, async (r) => w.list(pid(r), r.query));
      app.get<{ Params: Params }>(`${base}/:webhookId`, async (r) =>
        w.get(pid(r), r.params.webhookId),
      );
      app.put<{ Params: Params }>(`${base}/:webhookId`, async (r) =>
        w.update(pid(r), r.params.webhookId, r.body),
      );
      app.delete<{ Params: Params }>(`${base}/:webhookId`, async (r) =>
        w.remove(pid(r), r.params.webhookId),
      );
      app.post<{ Params: Params }>(`${base}/:webhookId/test`, async (r) =>
        w.test(pid(r), r.params.webhookId),
      );
      app.get<{ Params: Params }>(`${base}/:webhookId/deliveries`, async (r) =>
        w.deliveries(pid(r), r.params.webhookId, r.query),
      );
      app.get<{ Params: Params }>(`${base}/:webhookId/deliveries/:deliveryId/attempts`, async (r) =>
        w.attempts(pid(r), r.params.webhookId, r.params.deliveryId),
      );
      app.post<{ Params: Params }>(
        `${base}/:webhookId/deliveries/:deliveryId/redeliver`,
        async (r, reply) =>
          reply.code(201).send(await w.redeliver(pid(r), r.params.webhookId, r.params.deliveryId)),
      );
    }
  };
}
