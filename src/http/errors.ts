/**
 * Renders every failure as the spec's envelope `{error: {message, type, code, param}}`.
 * Fastify's own errors (bad JSON, body too large, wrong content type) are
 * mapped to catalogue codes here so clients never see another shape.
 */
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import { ServiceError } from '../errors/index.js';
import { isDatabaseUnavailable, isUnstorableText } from '../store/index.js';

/**
 * The code of a body that fails JSON decoding: `invalid_json` on the inference
 * API (deliberately, as its clients expect), `invalid_body` on the execution
 * surface, whose code table folds decoding into `invalid_body`.
 */
export type BadJsonCode = 'invalid_json' | 'invalid_body';

export function toServiceError(err: unknown, badJson: BadJsonCode = 'invalid_json'): ServiceError {
  if (err instanceof ServiceError) return err;
  const fe = err as Partial<FastifyError> & { statusCode?: number };
  switch (fe.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new ServiceError('payload_too_large');
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new ServiceError('unsupported_media_type');
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return new ServiceError(badJson, { message: 'The request body is empty.' });
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return new ServiceError('invalid_body', { message: 'Invalid Content-Length.' });
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return new ServiceError(badJson, { message: 'The request body is not valid JSON.' });
    default:
      break;
  }
  if (err instanceof SyntaxError || (fe.statusCode === 400 && /JSON/i.test(fe.message ?? ''))) {
    return new ServiceError(badJson, {
      message: 'The request body is not valid JSON.',
    });
  }
  if (fe.statusCode === 413) return new ServiceError('payload_too_large');
  if (fe.statusCode === 415) return new ServiceError('unsupported_media_type');
  if (fe.statusCode === 404) return new ServiceError('route_not_found');
  if (fe.statusCode === 405) return new ServiceError('method_not_allowed');
  if (typeof fe.statusCode === 'number' && fe.statusCode >= 400 && fe.statusCode < 500) {
    return new ServiceError('invalid_body', { message: fe.message ?? 'Bad request.' });
  }
  if (isUnstorableText(err)) {
    // A client's string with U+0000 reached a text or jsonb column.
    return new ServiceError('invalid_body', {
      message: 'The request contains a NUL character (U+0000), which is not accepted.',
    });
  }
  if (isDatabaseUnavailable(err)) {
    // The database is down or partitioned: retryable, not a bug (docs/RELIABILITY.md).
    return new ServiceError('unavailable', {
      message: 'The database is temporarily unreachable; retry shortly.',
      headers: { 'Retry-After': '1' },
      cause: err,
    });
  }
  return new ServiceError('internal_error', { cause: err });
}

export function sendError(reply: FastifyReply, err: ServiceError): FastifyReply {
  if (err.headers) reply.headers(err.headers);
  return reply.code(err.status).type('application/json').send(err.toEnvelope());
}

export function errorHandler(err: unknown, request: FastifyRequest, reply: FastifyReply): void {
  handle(err, request, reply, 'invalid_json');
}

/** The error handler of the execution surface's routes (`/<project_id>/v1/exec/…`). */
export function execErrorHandler(err: unknown, request: FastifyRequest, reply: FastifyReply): void {
  handle(err, request, reply, 'invalid_body');
}

function handle(
  err: unknown,
  request: FastifyRequest,
  reply: FastifyReply,
  badJson: BadJsonCode,
): void {
  let se = toServiceError(err, badJson);
  if (isUnstorableText(err)) se = unstorableInput(request) ?? se;
  if (se.status >= 500) {
    request.log.error({ err, code: se.code }, 'request failed');
  }
  void sendError(reply, se);
}

/**
 * The path or query parameter (`after`, `completion_id`) whose value PostgreSQL
 * refused (U+0000), named in a 400: the error is found where it happens, at the
 * query, so requests without one pay nothing for the check.
 */
function unstorableInput(request: FastifyRequest): ServiceError | null {
  for (const [where, values] of [
    ['path', request.params],
    ['query', request.query],
  ] as const) {
    if (values === null || typeof values !== 'object') continue;
    for (const [k, v] of Object.entries(values as Record<string, unknown>)) {
      if (![v].flat().some((x) => typeof x === 'string' && x.includes('\u0000'))) continue;
      const name = where === 'path' ? k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`) : k;
      return new ServiceError('invalid_value', {
        message: `Invalid ${where} parameter '${name}': a NUL character (U+0000) is not accepted.`,
        param: name,
      });
    }
  }
  return null;
}

export function notFoundHandler(request: FastifyRequest, reply: FastifyReply): void {
  void sendError(
    reply,
    new ServiceError('route_not_found', {
      message: `Unknown route: ${request.method} ${request.url.split('?')[0]}`,
    }),
  );
}
