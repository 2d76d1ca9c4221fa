/**
 * The operator API (`/admin/v1`), guarded by the operator token: bootstrap and
 * platform administration of projects, models, workers, endpoints and keys.
 * `{project}` accepts the external id (`proj_…`) or the slug.
 */
import { passwordProblem } from '../dashboard/passwords.js';
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import { z } from 'zod';
import {
  CUSTOM_DOMAIN_KEY,
  ENDPOINT_ID_SHAPE,
  provisioningFor,
  toEndpointRecord,
} from '../endpoints/repository.js';
import { ServiceError } from '../errors/index.js';
import { parseBody } from '../http/validate.js';
import { SLUG_PATTERN } from '../keys/index.js';
import { CAPABILITIES, operatorModel } from '../models/repository.js';
import { MAX_CREDIT_CENTS, publicProject, type Project } from '../projects/repository.js';
import {
  newWorkerId,
  publicWorker,
  SCHEDULING_POLICIES,
  WORKER_URL_KEY,
} from '../routing/registry.js';
import type { Services } from '../runtime/services.js';
import { isUniqueViolation } from '../store/index.js';
import { TIER_IDS, type TierId } from '../tiers/index.js';
import { workerModel, workerProject, workerUrl } from './worker-fields.js';

const slug = z.string().regex(SLUG_PATTERN, 'must be lowercase letters, digits and dashes');
/** `v1` would shadow the project-level routes (`/<project_id>/v1/...`). */
// A path segment shaped like a UUID names an endpoint by its id (endpoints/repository.ts
// `get`), so such a slug could never be reached.
const endpointSlug = slug
  .refine((v) => v !== 'v1', 'v1 is reserved')
  .refine((v) => !ENDPOINT_ID_SHAPE.test(v), 'must not have the shape of an endpoint id (UUID)');
/** Credit in cents: an exact integer in JSON (see MAX_CREDIT_CENTS). */
const creditCents = z.number().int().min(0).max(MAX_CREDIT_CENTS);
/** A model name's limit (the Models API's too). */
const MODEL_NAME_MAX = 200;
/** A DNS hostname (letters, digits and dashes in dot-separated labels), kept in lower case. */
const customDomain = z
  .string()
  .max(253)
  .regex(
    /^(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))+$/,
    'must be a hostname such as api.example.com',
  )
  .transform((d) => d.toLowerCase());
/** Capabilities, each at most once (as key scopes). */
const capabilityList = z.array(z.enum(CAPABILITIES)).superRefine((a, ctx) => {
  a.forEach((c, i) => {
    if (a.indexOf(c) !== i)
      ctx.addIssue({ code: 'custom', message: 'repeats a capability', path: [i] });
  });
});

const createProjectBody = z
  .object({
    slug,
    name: z.string().min(1).max(200),
    credit_cents: creditCents.optional(),
  })
  .strict();

const createModelBody = z
  .object({
    name: z
      .string()
      .min(1)
      .max(200)
      .regex(/^[A-Za-z0-9._:/-]+$/, 'must be letters, digits and . _ : / -'),
    context_window: z.number().int().min(16).max(10_000_000),
    capabilities: capabilityList.default([]),
    owned_by: z.string().min(1).max(200).optional(),
    prompt_price_cents_per_mtok: z.number().int().min(0).max(100_000_000).optional(),
    completion_price_cents_per_mtok: z.number().int().min(0).max(100_000_000).optional(),
  })
  .strict();

const patchProjectBody = z
  .object({
    name: z.string().min(1).max(200).optional(),
    credit_cents: creditCents.optional(),
    add_credit_cents: creditCents.min(1).optional(),
    billing_status: z.enum(['active', 'delinquent']).optional(),
  })
  .strict();

const createWorkerBody = z
  .object({
    model: z.string().min(1).max(MODEL_NAME_MAX),
    project: workerProject,
    tier: z.enum(TIER_IDS),
    url: workerUrl,
    scheduling_policy: z.enum(SCHEDULING_POLICIES).optional(),
    id: z
      .string()
      .regex(/^[A-Za-z0-9_-]{1,64}$/)
      .optional(),
  })
  .strict();

const createEndpointBody = z
  .object({
    slug: endpointSlug,
    name: z.string().min(1).max(200),
    model: z.string().min(1),
    tier: z.enum(TIER_IDS),
    max_requests_per_minute: z.number().int().min(1).max(2_147_483_647).optional(),
    max_tokens_per_minute: z.number().int().min(1).max(2_147_483_647).optional(),
    custom_domain: customDomain.nullable().optional(),
  })
  .strict();

/**
 * The monitor owns every status but `suspended`: an operator suspends an endpoint,
 * and `active` lifts the suspension (the record then shows what its pool gives).
 */
const patchEndpointBody = z
  .object({
    name: z.string().min(1).max(200).optional(),
    status: z.enum(['active', 'suspended']).optional(),
    max_requests_per_minute: z.number().int().min(1).max(2_147_483_647).optional(),
    max_tokens_per_minute: z.number().int().min(1).max(2_147_483_647).optional(),
    custom_domain: customDomain.nullable().optional(),
  })
  .strict();

const failInvocationBody = z.object({ reason: z.string().max(2000).optional() }).strict();
/** The password is checked by `dashboardPassword`, with the dashboard's rules. */
const passwordBody = z.object({ password: z.unknown() }).strict();

/** Endpoints default to their tier's request limit plus burst, or a high ceiling. */
const UNLIMITED_RPM_DEFAULT = 100_000;
const DEFAULT_TPM = 1_000_000;

function list<T>(data: T[]) {
  return { object: 'list' as const, data };
}

export function operatorRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    app.addHook('onRequest', async (request) => {
      // An unknown path answers 404 as anywhere else, token or not.
      if (request.routeOptions.url === `${app.prefix}/*`) return;
      s.adminAuth.check(request.headers.authorization);
    });

    const now = () => new Date(s.clock.now());

    async function project(ref: string): Promise<Project> {
      const p = await s.projects.find(ref);
      if (!p) {
        throw new ServiceError('project_not_found', {
          message: `No project '${ref}'.`,
          param: 'project',
        });
      }
      return p;
    }

    function conflict(err: unknown, what: string, param: string): never {
      if (isUniqueViolation(err)) {
        throw new ServiceError('conflict', { message: `${what} already exists.`, param });
      }
      throw err;
    }

    /** What an endpoint of (model, tier) shows now (ROUTING.md, "Endpoint provisioning"). */
    async function provisioning(modelId: string, tierId: string, current: string | null) {
      const pool = await s.workers.list({ modelId, tierId });
      const healthy = pool.filter((w) => w.status === 'healthy').map((w) => w.id);
      return provisioningFor({ healthy, registered: pool.length }, current);
    }

    /**
     * 409 when another live endpoint has the custom domain: checked first for the
     * common case, and by the unique index for two requests at once (`domainTaken`).
     */
    async function domainFree(domain: string | null | undefined, self?: string): Promise<void> {
      if (!domain) return;
      const other = await s.endpoints.findByCustomDomain(domain);
      if (other && other.id !== self) domainTaken(domain);
    }
    function domainTaken(domain: string | null | undefined): never {
      throw new ServiceError('conflict', {
        message: `The custom domain '${domain}' is taken by another endpoint.`,
        param: 'custom_domain',
      });
    }

    // Projects.
    app.post('/projects', async (request, reply) => {
      const body = parseBody(createProjectBody, request.body);
      const p = await s.projects
        .create({ slug: body.slug, name: body.name, creditCents: body.credit_cents }, now())
        .catch((err: unknown) => conflict(err, `Project '${body.slug}'`, 'slug'));
      return reply.code(201).send(publicProject(p));
    });
    app.get('/projects', async () => list((await s.projects.list()).map(publicProject)));
    app.get<{ Params: { project: string } }>('/projects/:project', async (request) =>
      publicProject(await project(request.params.project)),
    );
    app.patch<{ Params: { project: string } }>('/projects/:project', async (request) => {
      const p = await project(request.params.project);
      // Every field is optional: no body changes nothing.
      const body = parseBody(patchProjectBody, request.body ?? {});
      if (body.credit_cents !== undefined && body.add_credit_cents !== undefined) {
        // One would silently win over the other (the top-up did, dropping the new credit).
        throw new ServiceError('invalid_body', {
          message:
            "Give either 'credit_cents' (sets the credit) or 'add_credit_cents' (adds to it), not both.",
          param: 'add_credit_cents',
        });
      }
      const updated = await s.projects.update(p.id, {
        name: body.name,
        creditCents: body.credit_cents,
        addCreditCents: body.add_credit_cents,
        billingStatus: body.billing_status,
      });
      if (updated === 'over_limit') {
        throw new ServiceError('invalid_body', {
          message: `Invalid 'add_credit_cents': the credit would exceed ${MAX_CREDIT_CENTS} cents.`,
          param: 'add_credit_cents',
        });
      }
      await s.bus.publish('project', p.id);
      return publicProject(updated!);
    });

    // Models.
    app.post('/models', async (request, reply) => {
      const body = parseBody(createModelBody, request.body);
      const m = await s.models
        .create(
          {
            name: body.name,
            contextWindow: body.context_window,
            capabilities: body.capabilities,
            ownedBy: body.owned_by ?? 'switchyard',
            promptPriceCentsPerMtok: body.prompt_price_cents_per_mtok,
            completionPriceCentsPerMtok: body.completion_price_cents_per_mtok,
          },
          now(),
        )
        .catch((err: unknown) => conflict(err, `Model '${body.name}'`, 'name'));
      return reply.code(201).send(operatorModel(m));
    });
    app.get('/models', async () => list((await s.models.list()).map(operatorModel)));

    // Workers.
    app.post('/workers', async (request, reply) => {
      const body = parseBody(createWorkerBody, request.body);
      const model = await workerModel(s, body.model, body.project);
      const id = body.id ?? newWorkerId();
      const taken = () =>
        new ServiceError('conflict', { message: `Worker '${id}' already exists.`, param: 'id' });
      if (body.id && (await s.workers.get(body.id))) throw taken();
      const url = body.url.replace(/\/$/, '');
      const duplicate = (same: string) =>
        new ServiceError('conflict', {
          message: `The static worker '${same}' already serves ${body.model} on ${body.tier} at ${url}.`,
          param: 'url',
        });
      const same = await s.workers.findAt('static', model.id, body.tier, url);
      if (same) throw duplicate(same.id);
      const w = await s.workers
        .create(
          {
            id,
            modelId: model.id,
            tierId: body.tier,
            url,
            source: 'static',
            schedulingPolicy: body.scheduling_policy ?? 'fcfs',
          },
          now(),
        )
        .catch(async (err: unknown) => {
          // Another request added it since the check above (the unique index says so).
          if (!isUniqueViolation(err, WORKER_URL_KEY)) throw err;
          const other = await s.workers.findAt('static', model.id, body.tier, url);
          throw duplicate(other?.id ?? 'another');
        });
      // Registered (by a worker itself, or the operator) since the check above: the
      // row written first stays, never overwritten.
      if (!w) throw taken();
      await s.endpoints.activateWaiting(model.id, body.tier, w.id);
      await s.bus.publish('workers', w.id);
      await s.bus.publish('endpoint', '*');
      return reply.code(201).send(publicWorker(w));
    });
    app.get('/workers', async () => list((await s.workers.list()).map(publicWorker)));
    app.delete<{ Params: { id: string } }>('/workers/:id', async (request) => {
      const ok = await s.workers.remove(request.params.id);
      if (!ok) throw new ServiceError('worker_not_found', { param: 'id' });
      s.monitor.forget(request.params.id);
      await s.bus.publish('workers', request.params.id);
      await s.monitor.reconcile();
      return { id: request.params.id, object: 'worker', deleted: true };
    });

    // Endpoints.
    app.post<{ Params: { project: string } }>(
      '/projects/:project/endpoints',
      async (request, reply) => {
        const p = await project(request.params.project);
        const body = parseBody(createEndpointBody, request.body);
        // A platform model, or one this project created through the Models API.
        const model = await s.models.findByName(body.model, p.id);
        if (!model) {
          throw new ServiceError('model_not_found', {
            message: `No model '${body.model}'.`,
            param: 'model',
          });
        }
        const tier = s.tiers.get(body.tier as TierId);
        const defaultRpm =
          tier?.requestsPerMinute != null
            ? tier.requestsPerMinute + (tier.burst ?? 0)
            : UNLIMITED_RPM_DEFAULT;
        await domainFree(body.custom_domain);
        const state = await provisioning(model.id, body.tier, null);
        const e = await s.endpoints
          .create(
            {
              projectId: p.id,
              slug: body.slug,
              name: body.name,
              modelId: model.id,
              tierId: body.tier,
              maxRequestsPerMinute: body.max_requests_per_minute ?? defaultRpm,
              maxTokensPerMinute: body.max_tokens_per_minute ?? DEFAULT_TPM,
              customDomain: body.custom_domain ?? null,
              ...state,
            },
            now(),
          )
          .catch((err: unknown) =>
            isUniqueViolation(err, CUSTOM_DOMAIN_KEY)
              ? domainTaken(body.custom_domain)
              : conflict(err, `Endpoint '${body.slug}'`, 'slug'),
          );
        // A request to this slug just before may have cached "no such endpoint".
        await s.bus.publish('endpoint', e.id);
        return reply.code(201).send(toEndpointRecord(e));
      },
    );
    app.get<{ Params: { project: string } }>('/projects/:project/endpoints', async (request) => {
      const p = await project(request.params.project);
      return list((await s.endpoints.list(p.id)).map(toEndpointRecord));
    });
    app.patch<{ Params: { project: string; endpoint: string } }>(
      '/projects/:project/endpoints/:endpoint',
      async (request) => {
        const p = await project(request.params.project);
        const body = parseBody(patchEndpointBody, request.body ?? {});
        const e = await s.endpoints.get(p.id, request.params.endpoint);
        if (!e) throw new ServiceError('endpoint_not_found', { param: 'endpoint' });
        await domainFree(body.custom_domain, e.id);
        const updated = await s.endpoints
          .update(p.id, e.id, {
            name: body.name,
            status: body.status,
            maxRequestsPerMinute: body.max_requests_per_minute,
            maxTokensPerMinute: body.max_tokens_per_minute,
            customDomain: body.custom_domain,
            // Out of a suspension: the status its pool gives, as at creation.
            ...(body.status === 'active'
              ? await provisioning(e.modelId, e.tierId, e.provisionedWorkerId)
              : {}),
          })
          .catch((err: unknown) => {
            if (isUniqueViolation(err, CUSTOM_DOMAIN_KEY)) domainTaken(body.custom_domain);
            throw err;
          });
        if (!updated) throw new ServiceError('endpoint_not_found', { param: 'endpoint' });
        await s.bus.publish('endpoint', updated.id);
        return toEndpointRecord(updated);
      },
    );
    app.delete<{ Params: { project: string; endpoint: string } }>(
      '/projects/:project/endpoints/:endpoint',
      async (request) => {
        const p = await project(request.params.project);
        const e = await s.endpoints.get(p.id, request.params.endpoint);
        if (!e || !(await s.endpoints.softDelete(p.id, e.id, now()))) {
          throw new ServiceError('endpoint_not_found', { param: 'endpoint' });
        }
        await s.bus.publish('endpoint', e.id);
        return { id: e.id, object: 'endpoint', deleted: true };
      },
    );

    // Execution surface: users, project members, the approval chain, maintenance.
    // `password` (optional) is the user's dashboard password; checked before the
    // user exists, so a refused one leaves nothing behind.
    app.post('/users', async (request, reply) => {
      const body = request.body;
      let password: string | undefined;
      let rest: unknown = body;
      if (body && typeof body === 'object' && !Array.isArray(body) && 'password' in body) {
        const { password: p, ...others } = body as Record<string, unknown>;
        password = dashboardPassword(p);
        rest = others;
      }
      const user = await s.exec.users.create(rest);
      if (password !== undefined) await s.dashboard.accounts.resetPassword(user.id, password);
      return reply.code(201).send({ ...user, password_set: password !== undefined });
    });
    // An operator's password reset: every session of the user ends.
    app.post<{ Params: { user: string } }>('/users/:user/password', async (request) => {
      const body = parseBody(passwordBody, request.body ?? {});
      await s.dashboard.accounts.resetPassword(
        request.params.user,
        dashboardPassword(body.password),
      );
      return { id: request.params.user, object: 'user', password_set: true };
    });
    app.get('/users', async () => s.exec.users.list());
    app.post<{ Params: { project: string } }>(
      '/projects/:project/members',
      async (request, reply) => {
        const p = await project(request.params.project);
        return reply.code(201).send(await s.exec.users.setMember(p.id, request.body));
      },
    );
    app.get<{ Params: { project: string } }>('/projects/:project/members', async (request) => {
      const p = await project(request.params.project);
      return s.exec.users.members(p.id);
    });
    app.get<{ Params: { project: string } }>(
      '/projects/:project/approval_chain',
      async (request) => {
        const p = await project(request.params.project);
        return { object: 'approval_chain', stages: await s.exec.approvals.chain(p.id) };
      },
    );
    app.put<{ Params: { project: string } }>(
      '/projects/:project/approval_chain',
      async (request) => {
        const p = await project(request.params.project);
        return {
          object: 'approval_chain',
          stages: await s.exec.approvals.setChain(p.id, request.body),
        };
      },
    );
    app.post<{ Params: { project: string; id: string } }>(
      '/projects/:project/invocations/:id/fail',
      async (request) => {
        const p = await project(request.params.project);
        const body = parseBody(failInvocationBody, request.body ?? {});
        return s.exec.invocations.forceFail(p.id, request.params.id, body.reason ?? '');
      },
    );

    // Keys.
    app.post<{ Params: { project: string } }>('/projects/:project/keys', async (request, reply) => {
      const p = await project(request.params.project);
      return reply.code(201).send(await s.keyService.create(p, request.body));
    });
    app.get<{ Params: { project: string } }>('/projects/:project/keys', async (request) => {
      const p = await project(request.params.project);
      return list(await s.keyService.list(p.id));
    });
    app.get<{ Params: { project: string; id: string } }>(
      '/projects/:project/keys/:id',
      async (request) => {
        const p = await project(request.params.project);
        return s.keyService.get(p.id, request.params.id);
      },
    );
    app.post<{ Params: { project: string; id: string } }>(
      '/projects/:project/keys/:id/rotate',
      async (request) => {
        const p = await project(request.params.project);
        return s.keyService.rotate(p, request.params.id, request.body);
      },
    );
    app.delete<{ Params: { project: string; id: string } }>(
      '/projects/:project/keys/:id',
      async (request) => {
        const p = await project(request.params.project);
        return s.keyService.revoke(p.id, request.params.id);
      },
    );

    // Anything else under /admin/v1 is unknown here, not a project route with the
    // project id `admin` (which would answer 401 for want of an API key).
    app.all('/*', async (request) => {
      throw new ServiceError('route_not_found', {
        message: `Unknown route: ${request.method} ${request.url.split('?')[0]}`,
      });
    });
  };
}

/** A dashboard password from a request body: a string the password rules accept. */
function dashboardPassword(value: unknown): string {
  if (typeof value !== 'string') {
    throw new ServiceError('invalid_body', {
      message:
        value === undefined
          ? "Missing required parameter: 'password'."
          : "Invalid 'password': expected a string.",
      param: 'password',
    });
  }
  const problem = passwordProblem(value);
  if (problem) throw new ServiceError('invalid_body', { message: problem, param: 'password' });
  return value;
}
