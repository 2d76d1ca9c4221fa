/**
 * JSON bodies whose decoding error waits for the route to ask for the body.
 *
 * Fastify decodes a body before the route's handler runs. The chat route checks
 * the API key in its handler (with the route lookups it needs anyway), so a
 * malformed body would be refused (400 `invalid_json`) before a missing or bad key
 * (401): the spec says missing or malformed keys get 401, whatever the body. With
 * this parser a body that does not decode is kept as an `UndecodableBody`, and
 * `decoded()` throws its error once the handler has checked the key. Fastify's own
 * JSON parser still does the decoding (prototype-poisoning checks included).
 */
import type { FastifyInstance } from 'fastify';
import { ServiceError } from '../errors/index.js';
import { toServiceError } from './errors.js';

export class UndecodableBody {
  constructor(readonly error: ServiceError) {}
}

/**
 * The application's JSON parser: Fastify's, except that an empty body sent as
 * `application/json` is `{}`. Many clients send the header on a bodiless POST or
 * DELETE (a webhook test, a key rotation without new scopes); a route that needs
 * fields still says which one is missing.
 */
export function emptyJsonIsObject(app: FastifyInstance): void {
  const json = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser<string>(
    'application/json',
    { parseAs: 'string' },
    (request, body, done) => {
      if (body.length === 0) done(null, {});
      else json(request, body, done);
    },
  );
}

/** Installs the deferring parser for `application/json` in this plugin's scope. */
export function deferJsonErrors(app: FastifyInstance): void {
  const json = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser<string>(
    'application/json',
    { parseAs: 'string' },
    (request, body, done) => {
      if (body.length === 0) {
        const empty = new ServiceError('invalid_json', { message: 'The request body is empty.' });
        done(null, new UndecodableBody(empty));
        return;
      }
      json(request, body, (err, value) => {
        done(null, err ? new UndecodableBody(toServiceError(err)) : value);
      });
    },
  );
}

/** The decoded body; throws the decoding error of one that did not decode. */
export function decoded(body: unknown): unknown {
  if (body instanceof UndecodableBody) throw body.error;
  return body;
}
