/**
 * Who may use the files, uploads and batch routes, decided before the body is
 * read (a missing key is 401 whatever the body, and an upload is not accepted
 * from a caller that would be refused): an API key of the path's project with
 * scope `inference`; on `/<project_id>/<endpoint_slug>/v1/…` the endpoint must
 * exist in the project (404 `endpoint_not_found`) and the key's endpoint binding
 * must allow it (403 `endpoint_restricted`); a bound key cannot use the
 * project-level alias `/<project_id>/v1/…`, which names no endpoint. Then the
 * project's shared management limit (60 a minute; spec, Limits) and the key's
 * quota, counted together in one all-or-nothing acquire: a request refused by
 * either, or by the checks before them, spends neither, and the `X-RateLimit-*`
 * headers describe whichever binds (a key with a quota of 3 sees limit 3).
 */
import type { FastifyRequest, preParsingAsyncHookHandler } from 'fastify';
import type { Endpoint } from '../endpoints/repository.js';
import { ServiceError } from '../errors/index.js';
import { keyEndpoint, requireKey } from '../http/auth.js';
import type { Services } from '../runtime/services.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** The path's endpoint on the files, uploads and batch routes (none on the project alias). */
    surfaceEndpoint?: Endpoint;
  }
}

export function surfaceAccess(s: Services): preParsingAsyncHookHandler[] {
  return [
    requireKey(s.verifier, 'inference', { quota: s.limits, quotaWithManagement: true }),
    async (request, reply) => {
      const { endpointSlug } = request.params as { endpointSlug?: string };
      const key = request.apiKey!;
      if (endpointSlug !== undefined) {
        request.surfaceEndpoint = await keyEndpoint(s.resolveEndpoint, key, endpointSlug);
      } else if (key.endpointId !== null) {
        throw new ServiceError('endpoint_restricted', {
          message: "A key bound to an endpoint uses this API only under that endpoint's path.",
        });
      }
      // Last, on every path that admits the request: it counts the key's quota too.
      await s.limits.management(key.projectId, reply);
    },
  ];
}

/** The project (uuid) of an authenticated request. */
export function projectOf(r: FastifyRequest): string {
  return r.apiKey!.projectId;
}
