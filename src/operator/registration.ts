/**
 * Worker self-registration (`switchyard worker --register <router-url>`),
 * under `/admin/v1/workers`, guarded by the worker registration token
 * (SWITCHYARD_WORKER_TOKEN; the operator token is accepted too). Without a
 * configured worker token only the operator token is accepted.
 *
 * - `POST /workers/register` `{model, tier, url, capacity?, scheduling_policy?, id?}`: creates the
 *   worker (source `registered`, healthy), or re-registers it in place when a
 *   registered worker of the same id, or of the same (model, tier, url), exists.
 *   409 `conflict` (param `id`) when a static or embedded worker has the id, also
 *   when the operator adds it at the same moment: the row written first stays.
 *   Answers the worker record plus `heartbeat_interval_ms`.
 * - `POST /workers/{id}/heartbeat`: records a heartbeat; 404 `worker_not_found`
 *   once the worker was removed (it then registers again).
 * - `POST /workers/{id}/deregister`: removes the worker (on SIGTERM).
 * - `POST /workers/{id}/drain`: status `draining`: no router picks the worker for a
 *   new request, requests already on it finish (`switchyard worker` asks for it on
 *   SIGTERM, before it waits for them; workers/drain.ts). Heartbeats and the
 *   monitor leave the status alone; a re-registration makes the worker healthy.
 * - `POST /workers/{id}/resume`: back from `draining` to the monitor's verdict.
 *
 * With the worker token these act only on self-registered workers; the operator
 * token drains and resumes static ones too.
 *
 * Health after registration is the monitor's (routing/monitor.ts).
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyInstance, FastifyPluginAsync, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { parseBody } from '../http/validate.js';
import { bearerToken } from '../keys/index.js';
import {
  newWorkerId,
  publicWorker,
  SCHEDULING_POLICIES,
  type WorkerRecord,
  WORKER_URL_KEY,
  type WorkerStatus,
} from '../routing/registry.js';
import type { Services } from '../runtime/services.js';
import { isUniqueViolation } from '../store/index.js';
import { workerModel, workerProject, workerUrl } from './worker-fields.js';
import { TIER_IDS } from '../tiers/index.js';

const registerBody = z
  .object({
    model: z.string().min(1).max(200),
    project: workerProject,
    tier: z.enum(TIER_IDS),
    url: workerUrl,
    capacity: z.number().int().min(1).max(1_000_000).optional(),
    scheduling_policy: z.enum(SCHEDULING_POLICIES).optional(),
    id: z
      .string()
      .regex(/^[A-Za-z0-9_-]{1,64}$/)
      .optional(),
  })
  .strict();

function sha256(s: string): Buffer {
  return createHash('sha256').update(s, 'utf8').digest();
}

/** 409 for a self-registration under the id of a worker the operator (or a router) added. */
function notRegistered(id: string): ServiceError {
  return new ServiceError('conflict', {
    message: `Worker '${id}' exists and was not self-registered.`,
    param: 'id',
  });
}

export function registrationRoutes(s: Services): FastifyPluginAsync {
  const workerDigest = s.config.workerToken ? sha256(s.config.workerToken) : null;
  return async (app: FastifyInstance) => {
    /** Requests authenticated by the worker token (not the operator's). */
    const byWorker = new WeakSet<FastifyRequest>();
    app.addHook('onRequest', async (request) => {
      const token = bearerToken(request.headers.authorization);
      if (token !== null && workerDigest && timingSafeEqual(sha256(token), workerDigest)) {
        byWorker.add(request);
        return;
      }
      try {
        s.adminAuth.check(request.headers.authorization);
      } catch {
        throw new ServiceError('invalid_admin_token', {
          message: 'The worker registration token (or operator token) is missing or invalid.',
        });
      }
    });

    const now = () => new Date(s.clock.now());
    const interval = () => s.monitor.settings.heartbeatMs;
    const answer = (w: WorkerRecord) => ({ ...publicWorker(w), heartbeat_interval_ms: interval() });

    app.post('/workers/register', async (request, reply) => {
      const body = parseBody(registerBody, request.body);
      const model = await workerModel(s, body.model, body.project);
      const url = body.url.replace(/\/$/, '');
      let existing: WorkerRecord | null = null;
      if (body.id) {
        existing = await s.workers.get(body.id);
        if (existing && existing.source !== 'registered') throw notRegistered(body.id);
      } else {
        existing = await s.workers.findAt('registered', model.id, body.tier, url);
      }
      const record = async (id: string) => {
        const w = await s.workers.upsert(
          {
            id,
            modelId: model.id,
            tierId: body.tier,
            url,
            source: 'registered',
            capacity: body.capacity ?? null,
            schedulingPolicy: body.scheduling_policy ?? 'fcfs',
          },
          now(),
        );
        // A static worker of this id was added since the check above (at the same time).
        if (!w) throw notRegistered(id);
        return w;
      };
      const w = await record(existing?.id ?? body.id ?? newWorkerId()).catch(async (err) => {
        // Another row holds this URL (one per worker process: the unique index).
        if (!isUniqueViolation(err, WORKER_URL_KEY)) throw err;
        const other = await s.workers.findAt('registered', model.id, body.tier, url);
        if (!other) throw err;
        if (!body.id) {
          // The same worker registered twice at once (a retry racing its first
          // try): this registration renews the row the other made.
          existing = other;
          return record(other.id);
        }
        // The process at this URL now names itself `body.id`: the row under its old
        // name is stale.
        await s.workers.remove(other.id);
        s.monitor.forget(other.id);
        await s.bus.publish('workers', other.id);
        return record(body.id);
      });
      request.log.info({ worker: w.id, url: w.url, model: body.model }, 'worker registered');
      await s.bus.publish('workers', w.id);
      await s.monitor.reconcile();
      return reply.code(existing ? 200 : 201).send(answer(w));
    });

    app.post<{ Params: { id: string } }>('/workers/:id/heartbeat', async (request) => {
      const w = await s.workers.heartbeat(request.params.id, now());
      if (!w) throw new ServiceError('worker_not_found', { param: 'id' });
      // Back from missed heartbeats: re-admitted at once, unless this router's checks fail.
      if (w.status === 'unhealthy' && s.monitor.checksOk(w.id)) {
        if (await s.workers.setStatus(w.id, 'healthy', 'unhealthy')) {
          w.status = 'healthy';
          await s.bus.publish('workers', w.id);
          await s.monitor.reconcile();
        }
      }
      return {
        id: w.id,
        object: 'worker',
        status: w.status,
        heartbeat_interval_ms: interval(),
      };
    });

    app.post<{ Params: { id: string } }>('/workers/:id/deregister', async (request) => {
      const w = await s.workers.get(request.params.id);
      if (!w || w.source !== 'registered' || !(await s.workers.remove(w.id))) {
        throw new ServiceError('worker_not_found', { param: 'id' });
      }
      s.monitor.forget(w.id);
      request.log.info({ worker: w.id }, 'worker deregistered');
      await s.bus.publish('workers', w.id);
      await s.monitor.reconcile();
      return { id: w.id, object: 'worker', deleted: true };
    });

    /** The worker named by the path, if this caller may change its status. */
    const target = async (request: FastifyRequest<{ Params: { id: string } }>) => {
      const w = await s.workers.get(request.params.id);
      if (!w || (byWorker.has(request) && w.source !== 'registered')) {
        throw new ServiceError('worker_not_found', { param: 'id' });
      }
      return w;
    };
    const setStatus = async (w: WorkerRecord, status: WorkerStatus) => {
      if (await s.workers.setStatus(w.id, status)) {
        await s.bus.publish('workers', w.id);
        await s.monitor.reconcile();
      }
      return { ...publicWorker(w), status };
    };

    app.post<{ Params: { id: string } }>('/workers/:id/drain', async (request) => {
      const w = await target(request);
      request.log.info({ worker: w.id }, 'worker draining');
      return setStatus(w, 'draining');
    });

    app.post<{ Params: { id: string } }>('/workers/:id/resume', async (request) => {
      const w = await target(request);
      // Back to what the monitor would say now; its next pass confirms or corrects it.
      const status = w.status !== 'draining' ? (w.status as WorkerStatus) : 'healthy';
      const next = status === 'healthy' && !s.monitor.checksOk(w.id) ? 'unhealthy' : status;
      request.log.info({ worker: w.id, status: next }, 'worker resumed');
      return setStatus(w, next);
    });
  };
}
