/**
 * Project routes under `/<project_id>/v1`: the Models API and the endpoint listing.
 *
 * Models (scope `inference`, as the spec's scope table says, not `management`): the
 * list and a model record show the platform's models and the project's own;
 * `POST /models` creates one of the project's own (`{id, context_window,
 * capabilities?}`, `owned_by` = the project id), `PATCH /models/{model}` changes its
 * context window or capabilities, `DELETE /models/{model}` deletes it (OpenAI's
 * `{id, object: "model", deleted: true}`). Only the project that created a model
 * changes it: a platform model is 403 `model_not_owned`, another project's is 404
 * `model_not_found` (it is not visible). A model a live endpoint or a worker uses is
 * not deleted (409 `model_in_use`). A key bound to one endpoint may read models but
 * not write them (403 `endpoint_restricted`), as with the key API.
 *
 * The endpoint listing needs any valid key of the project. The endpoint-level
 * `/<project_id>/<endpoint_slug>/v1/models` lets SDK clients configured with an
 * endpoint base URL call `models.list()` and `models.retrieve()` (the endpoint's
 * model only); a key bound to another endpoint gets 403 `endpoint_restricted` there.
 */
import type { FastifyInstance, FastifyPluginAsync, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { toEndpointRecord } from '../endpoints/repository.js';
import { ServiceError } from '../errors/index.js';
import { requireKey } from '../http/auth.js';
import { parseBody } from '../http/validate.js';
import type { KeyRecord } from '../keys/index.js';
import { CAPABILITIES, modelEntry, type ModelRecord } from '../models/repository.js';
import type { Services } from '../runtime/services.js';
import { isUniqueViolation } from '../store/db.js';

const modelName = z
  .string()
  .min(1)
  .max(200)
  .regex(/^[A-Za-z0-9._:/-]+$/, 'must be letters, digits and . _ : / -')
  // A segment `.` or `..` (or an empty one) would be a path the SDKs refuse to build,
  // and clients normalise away: the model could never be retrieved or deleted.
  .refine(
    (id) => id.split('/').every((seg) => seg !== '' && seg !== '.' && seg !== '..'),
    "must not have an empty, '.' or '..' segment between slashes",
  );
const contextWindow = z.number().int().min(16).max(10_000_000);
const capabilities = z
  .array(z.enum(CAPABILITIES))
  .max(CAPABILITIES.length)
  .transform((c) => [...new Set(c)]);

const createModelBody = z
  .object({ id: modelName, context_window: contextWindow, capabilities: capabilities.optional() })
  .strict();
const patchModelBody = z
  .object({ context_window: contextWindow.optional(), capabilities: capabilities.optional() })
  .strict();

/** The Models API's record: the list entry plus what the project configured. */
function projectModel(m: ModelRecord) {
  return { ...modelEntry(m), context_window: m.contextWindow, capabilities: m.capabilities };
}

function isCapability(v: string): boolean {
  return (CAPABILITIES as readonly string[]).includes(v);
}

/** `?capability=tool_calling`: the one capability a list keeps (undefined: all). */
function wantedCapability(want: string | string[] | undefined): string | undefined {
  if (want !== undefined && (typeof want !== 'string' || !isCapability(want))) {
    throw new ServiceError('invalid_value', {
      message: `capability must be one of: ${CAPABILITIES.join(', ')}.`,
      param: 'capability',
    });
  }
  return want;
}

interface CapabilityQuery {
  Querystring: { capability?: string | string[] };
}

interface ProjectParams {
  projectId: string;
}

export function projectRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    const inference = requireKey(s.verifier, 'inference', { quota: s.limits });
    const anyScope = requireKey(s.verifier, null, { quota: s.limits });

    function notFound(name: string): ServiceError {
      return new ServiceError('model_not_found', {
        message: `The model '${name}' does not exist.`,
        param: 'model',
      });
    }

    /** A platform model or one of the key's project's own; another project's is not found. */
    async function visibleModel(key: KeyRecord, name: string): Promise<ModelRecord> {
      const m = await s.models.findByName(name, key.projectId);
      if (!m) throw notFound(name);
      return m;
    }

    async function ownModel(key: KeyRecord, name: string): Promise<ModelRecord> {
      const m = await visibleModel(key, name);
      if (m.projectId !== key.projectId) {
        throw new ServiceError('model_not_owned', {
          message: `The model '${name}' is the platform's; only its operator changes it.`,
          param: 'model',
        });
      }
      return m;
    }

    /** Model writes are project-wide: not for a key bound to one endpoint. */
    function writer(request: FastifyRequest): KeyRecord {
      const key = request.apiKey!;
      if (key.endpointId !== null) throw new ServiceError('endpoint_restricted');
      return key;
    }

    // `?capability=tool_calling` keeps the models with that capability (the
    // models an `x_exec` chat request can use).
    app.get<{ Params: ProjectParams } & CapabilityQuery>(
      '/:projectId/v1/models',
      { preParsing: inference },
      async (request) => {
        const want = wantedCapability(request.query.capability);
        const models = await s.models.list(request.apiKey!.projectId);
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
        return modelEntry(await visibleModel(request.apiKey!, request.params['*']));
      },
    );

    app.post<{ Params: ProjectParams }>(
      '/:projectId/v1/models',
      { preParsing: inference },
      async (request, reply) => {
        const key = writer(request);
        const body = parseBody(createModelBody, request.body);
        // Names are unique within the project (its index) and may not take a platform
        // model's (public anyway); other projects' names are not this one's business.
        const taken = () =>
          new ServiceError('conflict', {
            message: `A model named '${body.id}' already exists.`,
            param: 'id',
          });
        if (await s.models.findByName(body.id, null)) throw taken();
        const m = await s.models
          .create(
            {
              name: body.id,
              contextWindow: body.context_window,
              capabilities: body.capabilities ?? [],
              ownedBy: request.params.projectId,
              projectId: key.projectId,
            },
            new Date(s.clock.now()),
          )
          .catch((err: unknown) => {
            throw isUniqueViolation(err) ? taken() : err;
          });
        return reply.code(201).send(projectModel(m));
      },
    );

    app.patch<{ Params: ProjectParams & { '*': string } }>(
      '/:projectId/v1/models/*',
      { preParsing: inference },
      async (request) => {
        const key = writer(request);
        const m = await ownModel(key, request.params['*']);
        const body = parseBody(patchModelBody, request.body);
        const updated = await s.models.update(m.id, {
          contextWindow: body.context_window,
          capabilities: body.capabilities,
        });
        if (!updated) throw notFound(m.name);
        // Endpoints carry their model's context window and capabilities (cached).
        await s.bus.publish('endpoint', m.id);
        return projectModel(updated);
      },
    );

    app.delete<{ Params: ProjectParams & { '*': string } }>(
      '/:projectId/v1/models/*',
      { preParsing: inference },
      async (request) => {
        const key = writer(request);
        const m = await ownModel(key, request.params['*']);
        const using = (await s.endpoints.list(key.projectId)).filter((e) => e.modelId === m.id);
        if (using.length > 0) {
          throw new ServiceError('model_in_use', {
            message: `The model '${m.name}' serves the endpoint '${using[0]!.slug}'; delete the endpoint first.`,
          });
        }
        const workers = await s.workers.list({ modelId: m.id });
        if (workers.length > 0) {
          throw new ServiceError('model_in_use', {
            message: `The worker '${workers[0]!.id}' serves the model '${m.name}'; remove the worker first.`,
          });
        }
        if (!(await s.models.softDelete(m.id, new Date(s.clock.now())))) throw notFound(m.name);
        await s.bus.publish('endpoint', m.id);
        return { id: m.name, object: 'model', deleted: true };
      },
    );

    app.get<{ Params: ProjectParams }>(
      '/:projectId/v1/endpoints',
      { preParsing: anyScope },
      async (request) => {
        const key = request.apiKey!;
        const rows = await s.endpoints.list(key.projectId);
        // A key bound to one endpoint (spec: 403 on any other) sees only that one.
        const seen = key.endpointId === null ? rows : rows.filter((e) => e.id === key.endpointId);
        return { object: 'list', data: seen.map(toEndpointRecord) };
      },
    );

    /** The model an endpoint path serves (a key bound elsewhere: 403), or null. */
    async function endpointModel(key: KeyRecord, slug: string): Promise<ModelRecord | null> {
      const e = await s.endpoints.get(key.projectId, slug);
      if (!e) throw new ServiceError('endpoint_not_found');
      if (key.endpointId !== null && key.endpointId !== e.id) {
        throw new ServiceError('endpoint_restricted');
      }
      return s.models.findById(e.modelId);
    }

    // `?capability=` filters here as on the project's list: an SDK configured with
    // the endpoint's base URL asks this path which model can take `x_exec`.
    app.get<{ Params: ProjectParams & { endpointSlug: string } } & CapabilityQuery>(
      '/:projectId/:endpointSlug/v1/models',
      { preParsing: inference },
      async (request) => {
        const want = wantedCapability(request.query.capability);
        const m = await endpointModel(request.apiKey!, request.params.endpointSlug);
        const keep = m !== null && (!want || m.capabilities.includes(want));
        return { object: 'list', data: keep ? [modelEntry(m)] : [] };
      },
    );

    // `models.retrieve()` of an SDK configured with the endpoint's base URL: the
    // endpoint's model, the only one that path lists.
    app.get<{ Params: ProjectParams & { endpointSlug: string; '*': string } }>(
      '/:projectId/:endpointSlug/v1/models/*',
      { preParsing: inference },
      async (request) => {
        const m = await endpointModel(request.apiKey!, request.params.endpointSlug);
        const name = request.params['*'];
        if (!m || m.name !== name) {
          throw new ServiceError('model_not_found', {
            message: `The model '${name}' is not served at this endpoint.`,
            param: 'model',
          });
        }
        return modelEntry(m);
      },
    );
  };
}
