/**
 * The key management API under `/<project_id>/v1/keys` (scope `management`):
 * create, list, get, rotate, revoke. Responses never carry the secret or its
 * hash, except the new value once in the create and rotate responses. Keys are
 * project-wide, so a key bound to one endpoint cannot manage them (403
 * `endpoint_restricted`, as on the project-level webhook path), and a key grants
 * no scope it lacks (service.ts).
 */
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import { requireKey } from '../http/auth.js';
import type { Services } from '../runtime/services.js';

interface P {
  projectId: string;
}

export function keyRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    app.addHook(
      'preParsing',
      requireKey(s.verifier, 'management', {
        quota: s.limits,
        projectWide: 'the project’s keys',
      }),
    );
    const project = (req: { apiKey?: { projectId: string; projectSlug: string } }) => ({
      id: req.apiKey!.projectId,
      slug: req.apiKey!.projectSlug,
    });

    app.post<{ Params: P }>('/:projectId/v1/keys', async (request, reply) =>
      reply
        .code(201)
        .send(await s.keyService.create(project(request), request.body, request.apiKey)),
    );
    app.get<{ Params: P }>('/:projectId/v1/keys', async (request) => ({
      object: 'list',
      data: await s.keyService.list(request.apiKey!.projectId),
    }));
    app.get<{ Params: P & { id: string } }>('/:projectId/v1/keys/:id', async (request) =>
      s.keyService.get(request.apiKey!.projectId, request.params.id),
    );
    app.post<{ Params: P & { id: string } }>('/:projectId/v1/keys/:id/rotate', async (request) =>
      s.keyService.rotate(project(request), request.params.id, request.body, request.apiKey),
    );
    app.delete<{ Params: P & { id: string } }>('/:projectId/v1/keys/:id', async (request) =>
      s.keyService.revoke(request.apiKey!.projectId, request.params.id),
    );
  };
}
