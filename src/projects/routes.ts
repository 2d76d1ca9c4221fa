/**
 * Project read routes under `/<project_id>/v1`: the model list and a model
 * record (scope `inference`), and the endpoint listing (any valid key of the
 * project). The endpoint-level `/<project_id>/<endpoint_slug>/v1/models` lets
 * SDK clients configured with an endpoint base URL call `models.list()`; a key
 * bound to another endpoint gets 403 `endpoint_restricted` there.
 */
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import { toEndpointRecord } from '../endpoints/repository.js';
import { ServiceError } from '../errors/index.js';
import { requireKey } from '../http/auth.js';
import { CAPABILITIES, modelEntry } from '../models/repository.js';
import type { Services } from '../runtime/services.js';

function isCapability(v: string): boolean {
  return (CAPABILITIES as readonly string[]).includes(v);
}

interface ProjectParams {
  projectId: string;
}

export function projectRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    const inference = requireKey(s.verifier, 'inference');
    const anyScope = requireKey(s.verifier, null);

    // `?capability=tool_calling` keeps the models with that capability (the
    // models an `x_exec` chat request can use).
    app.get<{ Params: ProjectParams; Querystring: { capability?: string | string[] } }>(
      '/:projectId/v1/models',
      { preParsing: inference },
      async (request) => {
        const want = request.query.capability;
        if (want !== undefined && (typeof want !== 'string' || !isCapability(want))) {
          throw new ServiceError('invalid_value', {
            message: `capability must be one of: ${CAPABILITIES.join(', ')}.`,
            param: 'capability',
          });
        }
        const models = await s.models.list();
        return {
          object: 'list',
          data: models.filter((m) => !want || m.capabilities.includes(want)).map(modelEntry),
        };
      },
    );

    // Model names may contain `/` (e.g. `org/model`), hence the wildcard. The
    // router has already percent-decoded it: decoding again would turn `%25`
    // into a malformed sequence (and a 500) and misread names containing `%`.
    app.get<{ Params: ProjectParams & { '*': string } }>(
      '/:projectId/v1/models/*',
      { preParsing: inference },
      async (request) => {
        const name = request.params['*'];
        const m = await s.models.findByName(name);
        if (!m) {
          throw new ServiceError('model_not_found', {
            message: `The model '${name}' does not exist.`,
            param: 'model',
          });
        }
        return modelEntry(m);
      },
    );

    app.get<{ Params: ProjectParams }>(
      '/:projectId/v1/endpoints',
      { preParsing: anyScope },
      async (request) => {
        const key = request.apiKey!;
        const rows = await s.endpoints.list(key.projectId);
        return { object: 'list', data: rows.map(toEndpointRecord) };
      },
    );

    app.get<{ Params: ProjectParams & { endpointSlug: string } }>(
      '/:projectId/:endpointSlug/v1/models',
      { preParsing: inference },
      async (request) => {
        const key = request.apiKey!;
        const e = await s.endpoints.get(key.projectId, request.params.endpointSlug);
        if (!e) throw new ServiceError('endpoint_not_found');
        if (key.endpointId !== null && key.endpointId !== e.id) {
          throw new ServiceError('endpoint_restricted');
        }
        const m = await s.models.findById(e.modelId);
        return { object: 'list', data: m ? [modelEntry(m)] : [] };
      },
    );
  };
}
