/**
 * Registers what the benchmark routes through, via the operator API only:
 * a model, the sim worker (tier `self_hosted`), a project, an endpoint and an
 * inference key. The endpoint's and the key's limits are set far above the
 * benchmark's rates so the figures measure the router's per-request cost (any
 * limiter still runs on every request), never a limiter saying no.
 */
import { fetch } from 'undici';

export const MODEL = 'bench-sim';

/** The chat completion every overhead bench sends (16 tokens from the sim). */
export const CHAT_BODY = JSON.stringify({
  model: MODEL,
  messages: [{ role: 'user', content: 'Say hello in one short sentence.' }],
  max_tokens: 16,
});
const TIER = 'self_hosted';

/** One operator API call; throws on a non-2xx answer. */
export async function admin(routerUrl, token, method, path, body) {
  const res = await fetch(`${routerUrl}/admin/v1${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} /admin/v1${path}: HTTP ${res.status} ${text}`);
  return JSON.parse(text);
}

/** @returns {Promise<{projectId: string, endpointSlug: string, key: string, workerId: string}>} */
export async function register({ routerUrl, token, workerUrl }) {
  await admin(routerUrl, token, 'POST', '/models', { name: MODEL, context_window: 4096 });
  const worker = await admin(routerUrl, token, 'POST', '/workers', {
    model: MODEL,
    tier: TIER,
    url: workerUrl,
    id: 'bench-sim-1',
  });
  const project = await admin(routerUrl, token, 'POST', '/projects', {
    slug: 'bench',
    name: 'Benchmark',
    credit_cents: 1_000_000_000,
  });
  const endpoint = await admin(routerUrl, token, 'POST', `/projects/${project.id}/endpoints`, {
    slug: 'chat',
    name: 'Benchmark chat',
    model: MODEL,
    tier: TIER,
    max_requests_per_minute: 100_000_000,
    // At most 2^31-1 (the column is int4; larger values get a 400).
    max_tokens_per_minute: 1_000_000_000,
  });
  if (endpoint.status !== 'active') {
    throw new Error(
      `endpoint not active after registering the worker: ${JSON.stringify(endpoint)}`,
    );
  }
  const key = await admin(routerUrl, token, 'POST', `/projects/${project.id}/keys`, {
    name: 'bench',
    scopes: ['inference'],
    quotaRequests: 1_000_000_000,
    quotaWindow: 60,
  });
  return { projectId: project.id, endpointSlug: endpoint.slug, key: key.key, workerId: worker.id };
}
