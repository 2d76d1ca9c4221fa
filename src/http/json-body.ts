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
 *
 * A body Fastify refuses before any parser sees it (413 past the body limit, 415
 * not JSON, a bad Content-Length) goes to the error handler instead; in these
 * scopes that handler checks the key first, so a request without a valid key gets
 * its 401 whatever it sent. Only refused requests pay for it.
 */
import type { FastifyError, FastifyInstance } from 'fastify';
import { ServiceError } from '../errors/index.js';
import { UNSTORABLE_ESCAPE } from '../store/storable.js';
import type { KeyVerifier } from '../keys/index.js';
import { authenticateKey, verifyKeyFirst } from './auth.js';
import { errorHandler, toServiceError } from './errors.js';

/**
 * JSON is UTF-8 (RFC 8259). A body is read as bytes and decoded strictly: Node's
 * string reader would turn a stray byte into U+FFFD and store the client's text
 * changed, with no error. The decoder is native; a body costs well under a
 * microsecond more than the lenient read.
 */
const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

function notUtf8(): ServiceError {
  return new ServiceError('invalid_json', {
    message: 'The request body is not valid UTF-8, which JSON requires.',
  });
}

/** The body's text, or null when its bytes are not UTF-8. */
function text(body: Buffer): string | null {
  try {
    return UTF8.decode(body);
  } catch {
    return null;
  }
}

/**
 * A body is read as sent: a compressed one would be refused as invalid JSON, or taken
 * as JSON when the header lies. RFC 9110 §8.4: 415 for a content coding not supported.
 */
function encodingRefusal(coding: string | undefined): ServiceError | null {
  if (coding === undefined || coding.toLowerCase() === 'identity') return null;
  return new ServiceError('unsupported_media_type', {
    message: `Content-Encoding '${coding}' is not supported; send the body uncompressed.`,
  });
}

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
  // Fastify's default text/plain parser would hand a handler a string, refused as
  // "expected an object, received a string" although it may hold one: the API takes
  // JSON (files: multipart), so text/plain is 415 like any other type.
  app.removeContentTypeParser('text/plain');
  const json = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser<Buffer>(
    'application/json',
    { parseAs: 'buffer' },
    (request, raw, done) => {
      const encoded = encodingRefusal(request.headers['content-encoding']);
      if (encoded) {
        done(encoded, undefined);
        return;
      }
      if (raw.length === 0) {
        done(null, {});
        return;
      }
      const body = text(raw);
      if (body === null) done(notUtf8(), undefined);
      else
        json(request, body, (err, value) => {
          if (err) done(protoRefusal(body) ?? err, undefined);
          // These routes store what they are sent, and PostgreSQL holds no U+0000 (nor
          // jsonb a lone surrogate): name the field now rather than fail at the insert
          // with no `param`.
          else done(UNSTORABLE_ESCAPE.test(body) ? unstorableRefusal(value) : null, value);
        });
    },
  );
}

/**
 * The error for a body Fastify's JSON parser refused. It refuses valid JSON too: a
 * key `__proto__` or `constructor` with a `prototype` (prototype poisoning), with
 * the same "not valid JSON" error; such a body gets a message that says why. Only
 * refused bodies are parsed a second time.
 */
function protoRefusal(body: string): ServiceError | null {
  if (!/"(?:__proto__|constructor)"/.test(body)) return null;
  try {
    JSON.parse(body);
  } catch {
    return null; // not valid JSON after all
  }
  return new ServiceError('invalid_body', {
    message:
      'The request body is valid JSON but uses the key "__proto__" (or "constructor" with "prototype"), which is refused.',
  });
}

/** Fastify's refusals of a body before decoding (errors.ts maps them to 413, 415, 400). */
const BODY_REFUSALS = new Set([
  'FST_ERR_CTP_BODY_TOO_LARGE',
  'FST_ERR_CTP_INVALID_MEDIA_TYPE',
  'FST_ERR_CTP_INVALID_CONTENT_LENGTH',
]);

/**
 * Installs the deferring parser for `application/json` in this plugin's scope, and
 * an error handler that answers a refused body only after the `inference` key check
 * of the route's `:projectId` has passed.
 */
export function deferJsonErrors(app: FastifyInstance, verifier: KeyVerifier): void {
  // A body is read only from a client with a valid key.
  app.addHook('preParsing', verifyKeyFirst(verifier));
  app.setErrorHandler(async (err, request, reply) => {
    if (BODY_REFUSALS.has((err as Partial<FastifyError>).code ?? '')) {
      const { projectId } = request.params as { projectId: string };
      try {
        await authenticateKey(verifier, request, projectId, 'inference');
      } catch (keyError) {
        errorHandler(keyError, request, reply);
        return reply;
      }
    }
    errorHandler(err, request, reply);
    return reply;
  });
  const json = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser<Buffer>(
    'application/json',
    { parseAs: 'buffer' },
    (request, raw, done) => {
      const encoded = encodingRefusal(request.headers['content-encoding']);
      if (encoded) {
        done(null, new UndecodableBody(encoded));
        return;
      }
      if (raw.length === 0) {
        const empty = new ServiceError('invalid_json', { message: 'The request body is empty.' });
        done(null, new UndecodableBody(empty));
        return;
      }
      const body = text(raw);
      if (body === null) {
        done(null, new UndecodableBody(notUtf8()));
        return;
      }
      json(request, body, (err, value) => {
        done(null, err ? new UndecodableBody(protoRefusal(body) ?? toServiceError(err)) : value);
      });
    },
  );
}

/** The decoded body; throws the decoding error of one that did not decode. */
export function decoded(body: unknown): unknown {
  if (body instanceof UndecodableBody) throw body.error;
  return body;
}

/**
 * A client's body (or a body built around it) as JSON, to forward. `JSON.stringify`
 * recurses: a field nested some thousands of levels deep, valid JSON that
 * `JSON.parse` reads, overflows the stack. That is the client's fault, not a
 * worker's or the router's: 400 `invalid_body` naming the top-level field.
 */
export function clientJson(body: Record<string, unknown>): string {
  try {
    return JSON.stringify(body);
  } catch (err) {
    if (!(err instanceof RangeError)) throw err;
    let param: string | null = null;
    for (const [k, v] of Object.entries(body)) {
      try {
        JSON.stringify(v);
      } catch {
        param = k;
        break;
      }
    }
    throw new ServiceError('invalid_body', {
      message: 'The request body is nested too deeply.',
      param,
    });
  }
}

/** A string PostgreSQL's text and jsonb cannot hold: U+0000 or a lone surrogate. */
function unstorable(s: string): boolean {
  return s.includes('\u0000') || !s.isWellFormed();
}

/**
 * 400 `invalid_body` naming the first string or key (`input[2].content`,
 * `metadata.k`) of a decoded JSON body that holds U+0000 or a lone UTF-16
 * surrogate (`\ud800` without its pair: not Unicode text), or null. PostgreSQL's
 * text and jsonb cannot store either; routes that store a body after side effects
 * (a worker's answer already streamed) check first, so the client hears 400 before
 * anything happens.
 */
export function unstorableRefusal(body: unknown): ServiceError | null {
  const path = unstorablePath(body);
  if (path === null && !(typeof body === 'string' && unstorable(body))) return null;
  return new ServiceError('invalid_body', {
    message: `Invalid '${path ?? 'body'}': a NUL character (U+0000) or a lone UTF-16 surrogate is not accepted.`,
    param: path,
  });
}

function unstorablePath(body: unknown): string | null {
  // An explicit stack, not recursion: a body may be nested thousands of levels deep.
  const stack: Array<[unknown, string]> = [[body, '']];
  while (stack.length > 0) {
    const [value, path] = stack.pop()!;
    if (typeof value === 'string') {
      if (unstorable(value)) return path || null;
    } else if (Array.isArray(value)) {
      for (let i = value.length - 1; i >= 0; i--) stack.push([value[i], `${path}[${i}]`]);
    } else if (value !== null && typeof value === 'object') {
      const entries = Object.entries(value);
      for (let i = entries.length - 1; i >= 0; i--) {
        const [k, v] = entries[i]!;
        const here = path ? `${path}.${k}` : k;
        if (unstorable(k)) return here;
        stack.push([v, here]);
      }
    }
  }
  return null;
}
