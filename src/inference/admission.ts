/**
 * Getting a worker for one inference request, and what a worker's failure means
 * for the client. Shared by chat completions and the pooling routes (embeddings,
 * rerank, score).
 *
 * `admitWorker`: a lease now, or after a wait in the router's queue (routing/pool.ts).
 * The wait spends the request's deadline: 'timeout' when it ran out before a worker
 * was free (the queue's own, shorter limit is still 429 `capacity_exceeded`); no
 * healthy worker at all is 503 `unavailable`; a client that leaves while waiting, or
 * left before, is `cancelled`.
 *
 * `upstreamFailure`: a worker's non-200 answer as the client's error: its 4xx (other
 * than 408 and 429) is the request's fault, 400 `upstream_rejected` with the worker's
 * message; anything else is 502 `upstream_error`. `mapTransport`: a transport error
 * (connection refused or reset, the request aborted) as the client's error.
 */
import type { FastifyReply } from 'fastify';
import type { IncomingHttpHeaders } from 'node:http';
import { ServiceError, type ErrorCode } from '../errors/index.js';
import { tooManyRequests } from '../http/limits.js';
import type { AdmitFailure, Lease, RouteHints, WorkerPool } from '../routing/pool.js';
import type { WorkerRecord } from '../routing/registry.js';
import type { Clock } from '../runtime/clock.js';
import type { Tier } from '../tiers/index.js';
import { upstreamErrorMessage } from './reframe.js';

export const SATURATED = 'Every worker of this endpoint is saturated; retry shortly.';

export async function admitWorker(
  d: { pool: WorkerPool; clock: Clock },
  reply: FastifyReply,
  candidates: readonly WorkerRecord[],
  hints: RouteHints,
  deadlineAt: number,
): Promise<Lease | 'timeout'> {
  // A client that left while the request was being prepared (its lookups before this
  // point may wait for the database or Redis) closed before anyone listened for it:
  // its request must not take a worker, nor be billed for what nobody will read.
  if (reply.raw.destroyed) throw new ServiceError('cancelled');
  let result: Lease | AdmitFailure | null = d.pool.route(candidates, hints);
  if (result === null && candidates.length === 0) result = 'unavailable';
  if (result === null) {
    // Saturated: wait, unless the client leaves first.
    const gone = new AbortController();
    const onClose = () => gone.abort();
    reply.raw.once('close', onClose);
    try {
      result = await d.pool.admit(candidates, hints, {
        maxWaitMs: deadlineAt - d.clock.now(),
        signal: gone.signal,
      });
    } finally {
      reply.raw.off('close', onClose);
    }
    if (gone.signal.aborted) {
      // Nobody to answer; a lease obtained at the last moment goes back at once.
      if (typeof result === 'object') d.pool.abandon(result);
      throw new ServiceError('cancelled');
    }
  }
  if (result !== 'unavailable' && d.clock.now() >= deadlineAt) {
    if (typeof result === 'object') d.pool.abandon(result);
    return 'timeout';
  }
  if (result === 'capacity_exceeded') {
    throw tooManyRequests('capacity_exceeded', 1, SATURATED);
  }
  if (result === 'unavailable') {
    throw new ServiceError('unavailable', {
      message: 'No healthy worker serves this endpoint right now.',
      headers: { 'Retry-After': '5' },
    });
  }
  return result;
}

/** A worker's 2xx body as JSON; 502 `upstream_error` when it is not JSON. */
export function workerJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new ServiceError('upstream_error', {
      message: 'The inference worker returned invalid JSON.',
    });
  }
}

/**
 * A worker's 400 codes that mean the same for the client as they do in the router's
 * own table (the `llama` engine answers a request its model cannot serve with
 * `model_capability_missing`, bad values with `invalid_value`, naming the field):
 * passed on with the worker's `param`. Anything else is `upstream_rejected`.
 */
const WORKER_CODES = new Set<string>([
  'model_capability_missing',
  'invalid_value',
  'invalid_type',
  'unsupported_value',
]);

export function upstreamFailure(status: number, text: string): ServiceError {
  let message: string | null = null;
  let code: string | null = null;
  let param: string | null = null;
  try {
    const body: unknown = JSON.parse(text);
    // OpenAI's `{error: {message, code, param}}`, or vLLM's top-level `{object: "error",
    // message, param, code: <HTTP status>}` (its numeric code is not one of ours).
    type Fields = { object?: unknown; message?: unknown; code?: unknown; param?: unknown };
    const top = body as (Fields & { error?: Fields }) | null;
    const flat = top?.object === 'error';
    const e = flat ? top : top?.error;
    if (e && typeof e === 'object') {
      if (typeof e.code === 'string') code = e.code;
      if (typeof e.param === 'string' && e.param.length <= 200) param = e.param;
    }
    message = upstreamErrorMessage(body);
    if (message === null && flat && typeof top.message === 'string') message = top.message;
  } catch {
    message = null;
  }
  if (status >= 400 && status < 500 && status !== 408 && status !== 429) {
    const text = message ?? `The inference worker rejected the request (HTTP ${status}).`;
    if (status === 400 && code !== null && WORKER_CODES.has(code)) {
      return new ServiceError(code as ErrorCode, { message: text, param });
    }
    return new ServiceError('upstream_rejected', { message: text, param });
  }
  return new ServiceError('upstream_error', {
    message: `The inference worker failed (HTTP ${status}).`,
  });
}

function isAbort(err: unknown): boolean {
  const name = (err as { name?: string } | null)?.name;
  const code = (err as { code?: string } | null)?.code;
  return name === 'AbortError' || code === 'UND_ERR_ABORTED';
}

export function mapTransport(err: unknown): ServiceError {
  if (err instanceof ServiceError) return err;
  if (isAbort(err)) return new ServiceError('cancelled');
  return new ServiceError('upstream_error', {
    message: 'The inference worker could not be reached.',
    cause: err,
  });
}

/** 503 for a request a shutdown ended before anything was sent: retry elsewhere. */
export function shuttingDown(): ServiceError {
  return new ServiceError('unavailable', {
    message: 'The server is shutting down; retry on another instance.',
    headers: { 'Retry-After': '1' },
  });
}

export function deadlineMessage(tier: Tier): string {
  return `The request exceeded the ${tier.id} tier deadline of ${tier.requestDeadlineMs / 1000} s.`;
}

/**
 * The most a saturated worker's `Retry-After` is passed on as: saturation is not a
 * quota window, and a longer wait (or a value past any number, 1e+24 or Infinity
 * once parsed) would make the header and `retry_after` no delay-seconds at all.
 */
export const MAX_WORKER_RETRY_AFTER_S = 3600;

/**
 * A saturated worker's `Retry-After` (delay-seconds or an HTTP date) in seconds,
 * passed on to the client, at most `MAX_WORKER_RETRY_AFTER_S`; 1 when it sent none
 * or nothing readable.
 */
export function retryAfter(headers: IncomingHttpHeaders, now: number): number {
  const v = headers['retry-after']?.trim();
  if (!v) return 1;
  let seconds: number;
  if (/^\d+$/.test(v)) {
    seconds = Number(v);
  } else {
    const at = Date.parse(v);
    if (Number.isNaN(at)) return 1;
    seconds = Math.ceil((at - now) / 1000);
  }
  return Math.min(MAX_WORKER_RETRY_AFTER_S, Math.max(1, seconds));
}

/**
 * How a non-streamed request that threw ends: past the deadline, 408
 * `request_timeout`; a client that went away gets nothing (the reply is dropped);
 * anything else is the transport's error. `error` is what to throw, null for none.
 */
export function failedRequest(
  err: unknown,
  d: { deadline: { timedOut: unknown }; aborted: boolean; reply: FastifyReply; tier: Tier },
): { outcome: 'timeout' | 'cancelled' | 'error'; error: ServiceError | null } {
  if (d.deadline.timedOut) {
    return {
      outcome: 'timeout',
      error: new ServiceError('request_timeout', { message: deadlineMessage(d.tier) }),
    };
  }
  if (d.aborted) {
    // The client went away: nobody to answer.
    d.reply.hijack();
    d.reply.raw.destroy();
    return { outcome: 'cancelled', error: null };
  }
  return { outcome: 'error', error: mapTransport(err) };
}
