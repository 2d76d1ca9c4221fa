/**
 * Assembles the HTTP application: request ids, the error envelope, and the
 * route groups (operator API, project surface, health). Every response carries
 * `X-Request-ID`; for chat completions it equals the completion `id`. While
 * the app closes, new requests get 503 `unavailable` in the error envelope.
 */
import { randomUUID } from 'node:crypto';
import {
  STATUS_CODES,
  type IncomingMessage,
  type Server as HttpServer,
  type ServerResponse,
} from 'node:http';
import { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import proxyAddr from '@fastify/proxy-addr';
import Fastify, {
  LogController,
  type FastifyBaseLogger,
  type FastifyError,
  type FastifyInstance,
  type FastifyRequest,
} from 'fastify';
import { internalRoutes } from '../dashboard/index.js';
import { dashboardRoutes } from '../dashboard/routes.js';
import { batchRoutes } from '../batches/routes.js';
import { embeddingRoutes } from '../embeddings/routes.js';
import { responsesRoutes } from '../responses/routes.js';
import { conversationRoutes } from '../conversations/routes.js';
import { fileRoutes } from '../files/routes.js';
import { inferenceRoutes } from '../inference/routes.js';
import { storedCompletionRoutes } from '../completions/routes.js';
import { emptyJsonIsObject } from './json-body.js';
import { lazySchemaCompilers } from './schema-compilers.js';
import { keyRoutes } from '../keys/routes.js';
import { webhookRoutes } from '../webhooks/routes.js';
import { execRoutes } from '../exec/routes.js';
import { billingRoutes } from '../billing/routes.js';
import { sloRoutes } from '../slos/routes.js';
import { registrationRoutes } from '../operator/registration.js';
import { operatorRoutes } from '../operator/routes.js';
import { projectRoutes } from '../projects/routes.js';
import type { Services } from '../runtime/services.js';
import { ServiceError } from '../errors/index.js';
import { errorHandler, notFoundHandler, sendError, toServiceError } from './errors.js';
import { LazyRequestLogger, logUrl, type Logger } from '../runtime/logger.js';

export interface AppOptions {
  /** Serve HTTPS with this certificate and key (PEM). */
  tls?: { cert: Buffer; key: Buffer };
  /** Register the API routes (the `api` role); health and metrics are always served. */
  routes?: boolean;
  /** Register the dashboard's pages (the `dashboard` role). */
  dashboard?: boolean;
}

/**
 * Node's HTTP server settings (for HTTPS as well).
 * - `joinDuplicateHeaders`: Node keeps the first of two `Authorization` headers and
 *   drops the second without a word, so a request carrying two credentials was served
 *   as whichever came first. Joined (`Bearer a, Bearer b`) they are no one key and
 *   are refused 401 as a malformed key; RFC 9110 §5.3 forbids repeating a field that
 *   is not a list. Other repeated fields are joined as lists are.
 * - `requireHostHeader: false`: Node answers an HTTP/1.1 request without `Host` with
 *   a bare 400 of its own; the onRequest hook below answers it in the envelope.
 */
const NODE_HTTP = { joinDuplicateHeaders: true, requireHostHeader: false } as const;

/** Probes and scrapes stay reachable over plain HTTP inside the cluster. */
const PLAIN_HTTP_PATHS = new Set(['/healthz', '/readyz', '/metrics']);
const HSTS = 'max-age=31536000; includeSubDomains';

/**
 * Production refuses it: plain HTTP, probes excepted. `protocol` honours
 * X-Forwarded-Proto only from a trusted proxy (Fastify's request.protocol does).
 */
function plainHttp(
  request: FastifyRequest,
  protocol: string | undefined = request.protocol,
): boolean {
  // A request injected in-process (the dashboard forwarding to the internal path)
  // has no network connection to protect.
  if (!(request.raw.socket instanceof Socket)) return false;
  // A scheme is case-insensitive (RFC 3986): a proxy may send `HTTPS`.
  return (
    protocol?.toLowerCase() !== 'https' && !PLAIN_HTTP_PATHS.has(request.url.split('?', 1)[0]!)
  );
}

/**
 * The protocol as Fastify's trust-proxy requests compute it (the last
 * X-Forwarded-Proto when the peer is a trusted proxy, else the socket's). Needed
 * where Fastify hands over a request built without that logic: its bad-URL path.
 */
function forwardedProtocol(
  request: FastifyRequest,
  trusted: ((address: string, hop: number) => boolean) | null,
): string {
  const socket = request.raw.socket;
  const proto = request.headers['x-forwarded-proto'];
  if (proto && trusted && socket.remoteAddress && trusted(socket.remoteAddress, 0)) {
    const value = Array.isArray(proto) ? proto[proto.length - 1]! : proto;
    return value.slice(value.lastIndexOf(',') + 1).trim();
  }
  return (socket as { encrypted?: boolean }).encrypted ? 'https' : 'http';
}

/**
 * A request Node's HTTP parser refused (a malformed header line, headers over the
 * limit, a body longer than its Content-Length, too slow to arrive): no route ever
 * sees it, so Fastify's default would answer in its own shape. Ours, as everywhere:
 * the spec's envelope and an X-Request-ID. The connection is closed after it.
 */
function clientError(production: boolean, err: Error & { code?: string }, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const error =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? new ServiceError('headers_too_large', {
          message: 'The request headers are larger than the server accepts.',
        })
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? new ServiceError('request_timeout', {
            message: 'The request did not arrive in time.',
          })
        : new ServiceError('malformed_request', {
            message: `The HTTP request is malformed (${err.code ?? 'parse error'}).`,
          });
  closeWithError(socket, error, production);
  socket.destroy(err);
}

/** Writes `error` as a whole HTTP/1.1 response on a raw socket and closes it. */
function closeWithError(socket: Duplex, error: ServiceError, production: boolean): void {
  const body = JSON.stringify(error.toEnvelope());
  if (socket.writable) {
    socket.end(
      `HTTP/1.1 ${error.status} ${STATUS_CODES[error.status]}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
        // Every production response carries HSTS, these included.
        (production ? `Strict-Transport-Security: ${HSTS}\r\n` : '') +
        `X-Request-ID: ${requestId(undefined)}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
}

/**
 * A TLS handshake that failed. When OpenSSL saw a plain HTTP request instead
 * (`http://` to the TLS port), that client gets a readable answer, as nginx gives,
 * rather than a connection closed with no word: 403 `https_required` in the
 * envelope, written in plain HTTP on the socket beneath the failed TLS layer.
 * Any other failure is dropped, as Node does without this listener.
 */
function tlsClientError(production: boolean, err: Error & { code?: string }, tls: TLSSocket): void {
  const raw = (tls as TLSSocket & { _parent?: Duplex | null })._parent;
  if (err.code === 'ERR_SSL_HTTP_REQUEST' && raw) {
    closeWithError(
      raw,
      new ServiceError('https_required', {
        message: 'This port serves HTTPS; a plain HTTP request was sent to it. Use https://.',
      }),
      production,
    );
  }
  tls.destroy();
}

/**
 * `Expect` on a request (RFC 9110 §10.1.1), which Node answers itself unless told
 * otherwise: `100-continue` with an interim `100 Continue` at once, anything else with
 * a bare 417.
 * - A client sends `Expect: 100-continue` to learn whether its body is wanted before
 *   sending it. On the project surfaces the key decides that, before the body is read
 *   (the key-before-body hooks): a request whose key does not verify gets no
 *   `100 Continue`, only its 401 (or 403/503), so a refused client need not send a
 *   body nobody will read. Elsewhere, and with a key that verifies, 100 at once.
 * - Any other expectation: 417 `expectation_failed` in the envelope, then closed.
 */
function expectations(server: HttpServer, services: Services, production: boolean): void {
  const handOn = (req: IncomingMessage, res: ServerResponse) => server.emit('request', req, res);
  server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) => {
    if (!PROJECT_PATH.test(req.url ?? '')) {
      res.writeContinue();
      handOn(req, res);
      return;
    }
    services.verifier.verify(req.headers.authorization).then(
      (v) => {
        if (v.status === 'ok') res.writeContinue();
        handOn(req, res);
      },
      // The key store is unreachable: the route's own check answers (503).
      () => handOn(req, res),
    );
  });
  server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
    const error = new ServiceError('expectation_failed', {
      message: `The Expect header '${String(req.headers.expect).slice(0, 64)}' cannot be met; only 100-continue is supported.`,
    });
    const body = JSON.stringify(error.toEnvelope());
    res.writeHead(error.status, {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(body),
      'x-request-id': requestId(req.url),
      connection: 'close',
      ...(production ? { 'strict-transport-security': HSTS } : {}),
    });
    res.end(body);
  });
}

/** A path on a project's surface (`/<project_id>/…`), where an API key is the credential. */
const PROJECT_PATH = /^\/proj_[^/?]+\//;

function httpsRequired(): ServiceError {
  return new ServiceError('https_required', {
    message: 'Plain HTTP is refused in production; use https:// (or a trusted TLS proxy).',
  });
}

export function requestId(url: string | undefined): string {
  const hex = randomUUID().replaceAll('-', '');
  const path = url ? url.split('?', 1)[0]! : '';
  // The router ignores a trailing slash, so `…/chat/completions/` is the chat route too.
  return path.endsWith('/chat/completions') || path.endsWith('/chat/completions/')
    ? `chatcmpl-${hex}`
    : `req_${hex}`;
}

/** The model record route; its wildcard is a model name (see src/projects/routes.ts). */
const MODEL_RECORD_PATH = /^\/[^/?]+\/v1\/models\/[^?]/;

/**
 * What the router refuses before any route or hook runs (a path that does not
 * percent-decode, a parameter over `maxParamLength`), in the error envelope
 * with X-Request-ID like every other answer. Such a path names nothing: on the
 * model record route it is an unknown model.
 */
function frameworkError(err: FastifyError, request: FastifyRequest): ServiceError {
  if (MODEL_RECORD_PATH.test(request.url)) {
    return new ServiceError('model_not_found', {
      message: 'The model does not exist.',
      param: 'model',
    });
  }
  if (err.code === 'FST_ERR_BAD_URL') {
    return new ServiceError('route_not_found', {
      message: 'The request path is not valid percent-encoding.',
    });
  }
  if (err.code === 'FST_ERR_MAX_PARAM_LENGTH') {
    return new ServiceError('route_not_found', {
      message: 'A path segment is longer than the router accepts.',
    });
  }
  return toServiceError(err);
}

export async function buildApp(
  services: Services,
  opts: AppOptions = {},
): Promise<FastifyInstance> {
  const production = services.config.env === 'production';
  // One trust decision for Fastify's requests and for the bad-URL path below.
  const trusted = services.config.trustedProxies.length
    ? proxyAddr.compile(services.config.trustedProxies)
    : null;
  const app = Fastify({
    ...(opts.tls
      ? { https: { cert: opts.tls.cert, key: opts.tls.key, ...NODE_HTTP } }
      : { http: NODE_HTTP }),
    loggerInstance: services.logger as FastifyBaseLogger,
    // One log line per request (onResponse below) instead of Fastify's two.
    logController: new LogController({
      disableRequestLogging: true,
      requestIdLogLabel: 'request_id',
    }),
    genReqId: (req) => requestId(req.url),
    childLoggerFactory: (logger, bindings, opts) =>
      new LazyRequestLogger(logger as Logger, bindings, opts) as unknown as FastifyBaseLogger,
    // Checked against Content-Length before reading and while streaming a chunked
    // body, so an oversized body is refused (413) without being buffered whole.
    bodyLimit: services.config.maxBodyBytes,
    // Fastify's default is none: a client that sent its headers could then hold the
    // connection, and what it sent of its body, for ever. (Node's own default.)
    requestTimeout: services.config.requestTimeoutMs,
    trustProxy: trusted ?? false,
    // The 503 during shutdown is ours (onRequest below): Fastify's own has
    // neither the error envelope nor X-Request-ID.
    return503OnClosing: false,
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: 200 },
    // Ajv and fast-json-stringify load only if a route ever declares a schema.
    schemaController: lazySchemaCompilers,
    clientErrorHandler: (err, socket) => clientError(production, err, socket),
    // Paths Fastify refuses before routing (bad percent-encoding, an over-long
    // segment) run no hooks: production's rules are applied here as well.
    frameworkErrors: (err, request, reply) => {
      reply.header('X-Request-ID', request.id);
      if (production) {
        reply.header('Strict-Transport-Security', HSTS);
        const protocol = forwardedProtocol(request, trusted);
        if (plainHttp(request, protocol)) return void sendError(reply, httpsRequired());
      }
      void sendError(reply, frameworkError(err, request));
    },
  });
  if (opts.tls) {
    app.server.on('tlsClientError', (err: Error, tls: TLSSocket) =>
      tlsClientError(production, err, tls),
    );
  }
  expectations(app.server, services, production);
  // Node looks for requests past their timeout every 30 s: a shorter timeout is
  // looked at every half of it (read by the server when it starts listening). And
  // Node enforces neither timeout when the headers' (60 s) exceeds the request's.
  const server = app.server as typeof app.server & { connectionsCheckingInterval: number };
  const requestTimeoutMs = services.config.requestTimeoutMs;
  server.connectionsCheckingInterval = Math.min(30_000, Math.max(250, requestTimeoutMs / 2));
  server.headersTimeout = Math.min(server.headersTimeout, requestTimeoutMs);

  // Set when close() starts (preClose runs before the listener stops): requests
  // that still arrive on kept-alive connections while in-flight ones drain are
  // refused, so the client retries elsewhere. Fastify adds `Connection: close`.
  let closing = false;
  app.addHook('preClose', (done) => {
    closing = true;
    done();
  });
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('X-Request-ID', request.id);
    // Every production response, the drain's 503 included.
    if (production) reply.header('Strict-Transport-Security', HSTS);
    if (closing) {
      // Sent here rather than thrown: a refusal while draining is expected, not a
      // failure for the error log. Replying ends the request; done() is not called.
      void sendError(
        reply,
        new ServiceError('unavailable', {
          message: 'The server is shutting down; retry the request.',
        }),
      );
      return;
    }
    if (production && plainHttp(request)) {
      done(httpsRequired());
      return;
    }
    if (request.headers.host === undefined && request.raw.httpVersion === '1.1') {
      done(
        new ServiceError('malformed_request', {
          message: 'An HTTP/1.1 request must carry a Host header.',
        }),
      );
      return;
    }
    done();
  });
  const m = services.metrics;
  app.addHook('onResponse', (request, reply, done) => {
    const route = request.routeOptions.url ?? 'unmatched';
    const status = String(reply.statusCode);
    m.httpRequests.inc({ route, method: request.method, status });
    m.httpDuration.observe({ route, status }, reply.elapsedTime / 1000);
    // The root logger with the id in the line: the same fields as a request child's
    // line, without making a child per request just for this line (nor its fields
    // when the level is above info).
    if (services.logger.isLevelEnabled('info')) {
      services.logger.info(
        {
          request_id: request.id,
          method: request.method,
          url: logUrl(request.url),
          status: reply.statusCode,
          ms: Math.round(reply.elapsedTime * 100) / 100,
        },
        'request',
      );
    }
    done();
  });
  app.setErrorHandler(errorHandler);
  app.setNotFoundHandler(notFoundHandler);
  emptyJsonIsObject(app);

  app.get('/healthz', async () => ({ status: 'ok' }));
  app.get('/metrics', async (_request, reply) => {
    m.usageBuffered.set(services.usage.pending);
    m.usageDropped.reset();
    m.usageDropped.inc(services.usage.dropped);
    return reply.type(m.registry.contentType).send(await m.registry.metrics());
  });
  app.get('/readyz', async (_request, reply) => {
    const ok = await services.store.ping();
    return reply.code(ok ? 200 : 503).send({ status: ok ? 'ready' : 'unavailable' });
  });

  if (opts.dashboard !== false) await app.register(dashboardRoutes(services, services.dashboard));
  if (opts.routes === false) return app;
  await app.register(internalRoutes(services, services.dashboard.tokens));
  await app.register(operatorRoutes(services), { prefix: '/admin/v1' });
  await app.register(registrationRoutes(services), { prefix: '/admin/v1' });
  await app.register(projectRoutes(services));
  await app.register(keyRoutes(services));
  await app.register(webhookRoutes(services));
  await app.register(billingRoutes(services));
  await app.register(sloRoutes(services));
  await app.register(execRoutes(services));
  await app.register(inferenceRoutes(services));
  await app.register(storedCompletionRoutes(services));
  await app.register(embeddingRoutes(services));
  await app.register(responsesRoutes(services));
  await app.register(conversationRoutes(services));
  await app.register(fileRoutes(services));
  await app.register(batchRoutes(services));
  return app;
}
