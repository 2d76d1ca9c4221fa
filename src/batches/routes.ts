/**
 * The Batch API under `/<project_id>/<endpoint_slug>/v1/batches` (scope
 * `inference`, the shared management limit; files/access.ts): `POST /batches`
 * `{input_file_id, endpoint, completion_window: "24h", metadata?}` → Batch (the
 * batch runs on the path's endpoint as the creating key); `GET /batches`
 * (`limit`, `after`) → list, newest first; `GET /batches/{id}` → Batch;
 * `POST /batches/{id}/cancel` → Batch. Shapes and rules: service.ts; execution:
 * runner.ts.
 */
import type { FastifyInstance, FastifyPluginAsync, FastifyRequest } from 'fastify';
import { FileService, surfaceAccess } from '../files/index.js';
import type { Services } from '../runtime/services.js';
import { BatchService } from './service.js';

interface P {
  projectId: string;
  endpointSlug: string;
  batchId: string;
}

export function batchRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    const batches = new BatchService(
      s.store.db,
      s.clock,
      new FileService(s.store.db, s.clock),
      s.config.maxBodyBytes,
    );
    for (const hook of surfaceAccess(s)) app.addHook('preParsing', hook);
    const key = (r: FastifyRequest) => r.apiKey!;
    const base = '/:projectId/:endpointSlug/v1/batches';
    app.post(base, async (r) => batches.create(key(r), r.surfaceEndpoint!, r.body));
    app.get(base, async (r) => batches.list(key(r), r.query));
    app.get<{ Params: P }>(`${base}/:batchId`, async (r) =>
      batches.retrieve(key(r), r.params.batchId),
    );
    app.post<{ Params: P }>(`${base}/:batchId/cancel`, async (r) =>
      batches.cancel(key(r), r.params.batchId),
    );
  };
}
