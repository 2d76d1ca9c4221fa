/** Budget alerts under `/<project_id>/v1/budget_alerts` (scope `management`). */
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import { requireKey } from '../http/auth.js';
import type { Services } from '../runtime/services.js';

export function billingRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    app.addHook(
      'preParsing',
      requireKey(s.verifier, 'management', { quota: s.limits, projectWide: 'budget alerts' }),
    );
    const base = '/:projectId/v1/budget_alerts';
    app.post(base, async (r, reply) =>
      reply.code(201).send(await s.budgetAlerts.create(r.apiKey!.projectId, r.body)),
    );
    app.get(base, async (r) => s.budgetAlerts.list(r.apiKey!.projectId));
    app.delete<{ Params: { id: string } }>(`${base}/:id`, async (r) =>
      s.budgetAlerts.remove(r.apiKey!.projectId, r.params.id),
    );
  };
}
