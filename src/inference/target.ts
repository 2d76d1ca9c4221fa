/**
 * The first steps every inference route shares (chat completions, embeddings,
 * rerank, score): the API key (scope `inference`), then the body's decoding error
 * if it had one (the key answers first: http/json-body.ts), the endpoint by slug
 * in the key's project, the key's endpoint binding, the endpoint's status, its
 * tier, and the inference rate limits, whose headers go on the reply whatever
 * happens next (not for the chat call of a response, whose route counted them:
 * `attachInternalCall`).
 *
 * Errors: 401/403 from the key (http/auth.ts); 404 `endpoint_not_found`; 403
 * `endpoint_restricted` (key bound to another endpoint); 403 `endpoint_suspended`;
 * 503 `unavailable` with `Retry-After: 5` while the endpoint is provisioning or in
 * error; 429 `rate_limit_exceeded` from the limits.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Endpoint } from '../endpoints/repository.js';
import { ServiceError } from '../errors/index.js';
import { authenticateKey, keyEndpoint } from '../http/auth.js';
import { attachInternalCall } from '../http/internal-key.js';
import { decoded } from '../http/json-body.js';
import type { Limits } from '../http/limits.js';
import type { KeyRecord, KeyVerifier } from '../keys/index.js';
import type { Tier, TierId } from '../tiers/index.js';

export interface TargetDeps {
  verifier: KeyVerifier;
  endpoints: (projectId: string, slug: string) => Promise<Endpoint | null> | Endpoint | null;
  tiers: Map<TierId, Tier>;
  limits: Limits;
}

/** Who asked, for which endpoint and tier, and the decoded (not yet validated) body. */
export interface Target {
  key: KeyRecord;
  endpoint: Endpoint;
  tier: Tier;
  body: unknown;
}

export async function resolveTarget(
  d: TargetDeps,
  request: FastifyRequest,
  reply: FastifyReply,
): Promise<Target> {
  const { projectId, endpointSlug } = request.params as {
    projectId: string;
    endpointSlug: string;
  };
  const key = await authenticateKey(d.verifier, request, projectId, 'inference');
  // An in-process call (the Responses API) ends when its caller's client leaves.
  const admitted = attachInternalCall(request, reply.raw);
  // A body that did not decode answers right after the key (http/json-body.ts).
  const body = decoded(request.body);
  const endpoint = await keyEndpoint(d.endpoints, key, endpointSlug);
  if (endpoint.status === 'suspended') throw new ServiceError('endpoint_suspended');
  if (endpoint.status !== 'active') {
    throw new ServiceError('unavailable', {
      message:
        endpoint.status === 'error'
          ? 'The endpoint is in error: no healthy worker serves it.'
          : `The endpoint is ${endpoint.status}; no worker serves it yet.`,
      headers: { 'Retry-After': '5' },
    });
  }

  const tier = d.tiers.get(endpoint.tierId as TierId);
  if (!tier) throw new ServiceError('internal_error', { message: 'Unknown tier.' });
  // The Responses API counted them when the response was asked for: not twice.
  if (admitted) return { key, endpoint, tier, body };
  reply.headers(
    await d.limits.inference({
      projectId: key.projectId,
      keyId: key.id,
      quotaRequests: key.quotaRequests,
      quotaWindow: key.quotaWindow,
      endpointId: endpoint.id,
      maxRequestsPerMinute: endpoint.maxRequestsPerMinute,
      maxTokensPerMinute: endpoint.maxTokensPerMinute,
      tier,
    }),
  );
  return { key, endpoint, tier, body };
}
