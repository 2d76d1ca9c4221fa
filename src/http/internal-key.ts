/**
 * In-process requests on behalf of an API key whose secret the service does not
 * have (it stores only hashes): the batch runner replays each line of a batch as
 * a real request through `app.inject`, authenticated as the key that created the
 * batch, and the Responses API runs each response as an injected chat completion
 * as the caller's key, so keys, limits, routing, usage and billing apply unchanged.
 *
 * The credential is the header `X-Switchyard-Internal-Key: <token>.<project uuid>.<key id>`,
 * where `<token>` is 32 random bytes made when this module loads: it never leaves
 * the process (not stored, not logged, not sent anywhere), so only code running
 * in this process can mint it. It is accepted only
 * - on a request injected in-process (no network socket): a request from the
 *   network carrying the header is treated as if it had none;
 * - for the `inference` scope (authenticateKey with scope `inference`);
 * - when the token matches (constant-time comparison).
 * The key is then read from the database by id (no cache): revoked or expired,
 * the request is 401 like any other; its scopes, project and endpoint binding
 * are the key's current ones. The key's IP lists are not applied: the request
 * comes from the router itself, and the client's address was checked when the
 * batch was created.
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { Socket } from 'node:net';
import type { FastifyRequest } from 'fastify';
import type { ServerResponse } from 'node:http';

export const INTERNAL_KEY_HEADER = 'x-switchyard-internal-key';

const TOKEN = randomBytes(32).toString('hex');
const TOKEN_BYTES = Buffer.from(TOKEN);
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The header value that makes an injected request act as key `keyId` of project `projectId` (uuid). */
export function internalKeyCredential(projectId: string, keyId: string): string {
  return `${TOKEN}.${projectId}.${keyId}`;
}

/** The key an injected request acts as, or null (no header, from the network, or a bad token). */
export function internalKeyOf(
  request: FastifyRequest,
): { projectId: string; keyId: string } | null {
  const value = request.headers[INTERNAL_KEY_HEADER];
  if (typeof value !== 'string') return null;
  if (request.raw.socket instanceof Socket) return null;
  const [token, projectId, keyId, ...rest] = value.split('.');
  if (rest.length > 0 || !token || !projectId || !keyId) return null;
  const given = Buffer.from(token);
  if (given.length !== TOKEN_BYTES.length || !timingSafeEqual(given, TOKEN_BYTES)) return null;
  if (!UUID.test(projectId) || !UUID.test(keyId)) return null;
  return { projectId, keyId };
}

/**
 * In-process calls that a client's connection stands behind (the Responses API runs
 * each response as an injected chat completion): when that client goes away, the
 * injected request must end as a disconnect would, even before the chat route has
 * answered anything (waiting in the router's queue, or for the first token). The
 * caller names the call in `X-Switchyard-Internal-Call`; the inference path attaches
 * its response to the name (`attachInternalCall`), and `abort` destroys it, which the
 * route sees as its client closing. Only injected requests are attached.
 */
export const INTERNAL_CALL_HEADER = 'x-switchyard-internal-call';

interface Call {
  res: ServerResponse | null;
  aborted: boolean;
  /** The caller counted the inference limits for it (`attachInternalCall` says so). */
  admitted: boolean;
}
const calls = new Map<string, Call>();

export interface InternalCall {
  id: string;
  /** The caller's client left: end the injected request now or as soon as it attaches. */
  abort(): void;
  /** The call is over; forget it. */
  done(): void;
}

/**
 * `admitted`: the caller already counted the inference limits for this request (the
 * Responses API counts them when the response is asked for, before it reads anything),
 * so the inference path does not count them again.
 */
export function internalCall(opts: { admitted?: boolean } = {}): InternalCall {
  const id = randomBytes(16).toString('hex');
  const call: Call = { res: null, aborted: false, admitted: opts.admitted ?? false };
  calls.set(id, call);
  return {
    id,
    abort() {
      call.aborted = true;
      if (call.res && !call.res.writableFinished) call.res.destroy();
    },
    done() {
      calls.delete(id);
    },
  };
}

/**
 * Called by the inference path with its response; a no-op for requests from the
 * network. True when the caller counted the request's limits already
 * (`internalCall({admitted})`).
 */
export function attachInternalCall(request: FastifyRequest, res: ServerResponse): boolean {
  const id = request.headers[INTERNAL_CALL_HEADER];
  if (typeof id !== 'string' || request.raw.socket instanceof Socket) return false;
  const call = calls.get(id);
  if (!call) return false;
  call.res = res;
  if (call.aborted) res.destroy();
  return call.admitted;
}
