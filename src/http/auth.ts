/**
 * Authentication for the project surfaces (`/<project_id>/...`): the API key
 * decides 401 (missing, malformed, unknown, revoked, expired); then the client
 * address must pass the key's IP lists (403 `ip_not_allowed`), the key's project
 * must be the path's project (403 `cross_project_access`), and the route's
 * scope must be granted (403 `scope_insufficient`). The client address is the
 * socket's, or X-Forwarded-For from SWITCHYARD_TRUSTED_PROXIES only.
 */
import type { FastifyReply, FastifyRequest, preParsingAsyncHookHandler } from 'fastify';
import type { Endpoint } from '../endpoints/repository.js';
import { managementHeaders, type Limits } from './limits.js';
import { ServiceError } from '../errors/index.js';
import { internalKeyOf } from './internal-key.js';
import { refuseBoundKey } from './project-wide.js';
import {
  ipAllowed,
  type KeyRecord,
  type KeyVerifier,
  type Scope,
  type Verification,
} from '../keys/index.js';

declare module 'fastify' {
  interface FastifyRequest {
    apiKey?: KeyRecord;
    /** The key's verification, when a `verifyKeyFirst` hook made it before the body. */
    keyVerification?: Verification;
  }
}

const MESSAGES: Record<Exclude<Verification['status'], 'ok'>, string> = {
  missing: 'No API key was provided. Send Authorization: Bearer <API_KEY>.',
  malformed: 'The API key is malformed.',
  unknown: 'Incorrect API key provided.',
  revoked: 'The API key has been revoked.',
  expired: 'The API key has expired.',
};

/**
 * `exec`: the execution surface (`/v1/exec/…`, MCP), whose error table names a request
 * without any credential 401 `authentication_required`; elsewhere it is `missing_api_key`.
 */
export type KeySurface = 'api' | 'exec';

export interface KeyCheck {
  surface?: KeySurface;
  /**
   * The key's own quota (`quotaRequests` per rolling `quotaWindow` s), part of the auth
   * layer in the spec: past it, 429 `rate_limit_exceeded` with `Retry-After`. Every
   * key-authenticated route passes it except the inference routes, whose limits
   * (http/limits.ts `inference`) count the quota together with the tier's (a response's
   * creation among them), and the Responses API's reads and deletes, which count it
   * after the endpoint binding (responses/routes.ts). When admitted, the `X-RateLimit-*`
   * headers describe the quota (given the reply); a management limit counted next
   * reports whichever of the two binds.
   */
  quota?: Limits;
  /**
   * With `quota`, for a route that then applies the management limit
   * (`Limits.management`, which must follow on every path that admits the request):
   * the quota is not counted here but there, in the same all-or-nothing acquire as
   * the management limit and after the route's own checks (endpoint binding), so a
   * request those refuse spends no quota unit, as on the chat route.
   */
  quotaWithManagement?: boolean;
  /**
   * The route acts on the whole project (what it holds, e.g. 'budget alerts'): a key
   * bound to an endpoint is refused, 403 `endpoint_restricted` (http/project-wide.ts),
   * before its quota is counted.
   */
  projectWide?: string;
}

/** The default: no allocation on the chat path, which passes none. */
const API_KEY_CHECK: KeyCheck = Object.freeze({});

/**
 * The key of a request on a project surface, or a 401/403/429 (see the module
 * comment and `KeyCheck`). `reply`, when given, receives the quota's headers.
 */
export async function authenticateKey(
  verifier: KeyVerifier,
  request: FastifyRequest,
  projectExternalId: string,
  scope: Scope | null,
  check: KeyCheck = API_KEY_CHECK,
  reply?: FastifyReply,
): Promise<KeyRecord> {
  // The batch runner's in-process requests (internal-key.ts): inference only.
  const internal = scope === 'inference' ? internalKeyOf(request) : null;
  const v = internal
    ? await storeCall(verifier.verifyById(internal.projectId, internal.keyId))
    : (request.keyVerification ??
      (await storeCall(verifier.verify(request.headers.authorization))));
  if (v.status !== 'ok') throw keyRefusal(v.status, check.surface);
  if (!internal && !ipAllowed(v.key, request.ip)) {
    throw new ServiceError('ip_not_allowed', {
      message: `Requests from ${request.ip} are not allowed for this API key.`,
    });
  }
  if (v.key.projectExternalId !== projectExternalId) {
    throw new ServiceError('cross_project_access', {
      message: 'The API key does not belong to this project.',
    });
  }
  if (scope && !v.key.scopes.includes(scope)) {
    throw new ServiceError('scope_insufficient', {
      message: `This route requires the '${scope}' scope.`,
    });
  }
  if (check.projectWide !== undefined) refuseBoundKey(v.key, check.projectWide);
  if (check.quota && !internal) {
    if (check.quotaWithManagement) request.keyQuotaDue = true;
    else {
      const d = await check.quota.keyQuota(v.key);
      if (d) {
        request.keyQuota = d;
        reply?.headers(managementHeaders(d));
      }
    }
  }
  request.apiKey = v.key;
  return v.key;
}

/** A verification, or 503 `unavailable` when the key store cannot be reached. */
async function storeCall(p: Promise<Verification>): Promise<Verification> {
  try {
    return await p;
  } catch (err) {
    throw new ServiceError('unavailable', {
      message: 'The key store is temporarily unreachable.',
      cause: err,
      headers: { 'Retry-After': '1' },
    });
  }
}

function keyRefusal(
  status: Exclude<Verification['status'], 'ok'>,
  surface: KeySurface | undefined,
): ServiceError {
  const missing = surface === 'exec' ? 'authentication_required' : 'missing_api_key';
  return new ServiceError(status === 'missing' ? missing : 'invalid_api_key', {
    message: MESSAGES[status],
  });
}

/**
 * A `preParsing` hook for routes that check the key in their handler (inference,
 * whose handler looks the key up with the endpoint it needs anyway; MCP): the key is
 * verified before the body is read, so a client without a valid key gets its 401
 * at once and cannot make the router receive and hold a body of up to the body
 * limit. The handler's `authenticateKey` uses this verification; its other checks
 * (address, project, scope, quota) stay where they were.
 */
export function verifyKeyFirst(
  verifier: KeyVerifier,
  surface?: KeySurface,
): preParsingAsyncHookHandler {
  return async (request) => {
    if (internalKeyOf(request)) return;
    const v = await storeCall(verifier.verify(request.headers.authorization));
    if (v.status !== 'ok') throw keyRefusal(v.status, surface);
    request.keyVerification = v;
  };
}

/**
 * A `preParsing` hook for routes with a `:projectId` parameter: the key is checked
 * before the body is read, so a request without a valid key is 401 whatever its
 * body holds (spec: missing or malformed keys get 401), never a JSON error.
 */
export function requireKey(
  verifier: KeyVerifier,
  scope: Scope | null,
  check: KeyCheck = API_KEY_CHECK,
): preParsingAsyncHookHandler {
  return async (request, reply) => {
    const { projectId } = request.params as { projectId: string };
    await authenticateKey(verifier, request, projectId, scope, check, reply);
  };
}

/**
 * The path's endpoint for a key: 404 `endpoint_not_found` when the project has none
 * by that slug, 403 `endpoint_restricted` when the key is bound to another one.
 */
export async function keyEndpoint(
  resolve: (projectId: string, slug: string) => Promise<Endpoint | null> | Endpoint | null,
  key: KeyRecord,
  slug: string,
): Promise<Endpoint> {
  const e = await resolve(key.projectId, slug);
  if (!e) {
    throw new ServiceError('endpoint_not_found', {
      message: `No endpoint '${slug}' in this project.`,
    });
  }
  if (key.endpointId !== null && key.endpointId !== e.id) {
    throw new ServiceError('endpoint_restricted');
  }
  return e;
}
