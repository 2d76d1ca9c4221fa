/** The inference routes under `/<project_id>/<endpoint_slug>/v1`. */
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import { deferJsonErrors } from '../http/json-body.js';
import type { Services } from '../runtime/services.js';
import { ChatCompletions } from './chat.js';

export function inferenceRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    const chat = new ChatCompletions({
      clock: s.clock,
      logger: s.logger,
      verifier: s.verifier,
      endpoints: s.resolveEndpoint,
      tiers: s.tiers,
      pool: s.pool,
      upstream: s.upstream,
      usage: s.usage,
      completions: s.completions,
      billing: s.billing,
      limits: s.limits,
      streams: s.openStreams,
      exec: s.exec,
      tracing: s.tracing,
      metrics: s.metrics,
      sloTargets: (endpointId) => s.slos.targets(endpointId),
    });
    // The key is checked in the handler; a malformed body must not answer first.
    deferJsonErrors(app, s.verifier);
    app.post('/:projectId/:endpointSlug/v1/chat/completions', chat.handle);
  };
}
