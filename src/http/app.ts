/**
 * Assembles the HTTP application: request ids, the error envelope, and the
 * route groups (operator API, project surface, health). Every response carries
 * `X-Request-ID`; for chat completions it equals the completion `id`.
 */
import { randomUUID } from 'node:crypto';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import { inferenceRoutes } from '../inference/routes.js';
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
import { errorHandler, notFoundHandler } from './errors.js';
import { LazyRequestLogger, type Logger } from '../runtime/logger.js';

export interface AppOptions {
  /** Serve HTTPS with this certificate and key (PEM). */
  tls?: { cert: Buffer; key: Buffer };
  /** Register the API routes (the `api` role); health and metrics are always served. */
  routes?: boolean;
}

/** Probes and scrapes stay reachable over plain HTTP inside the cluster. */
const PLAIN_HTTP_PATHS = new Set(['/healthz', '/readyz', '/metrics']);
const HSTS = 'max-age=31536000; includeSubDomains';

export function requestId(url: string | undefined): string {
  const hex = randomUUID().replaceAll('-', '');
  const path = url ? url.split('?', 1)[0]! : '';
  return path.endsWith('/chat/completions') ? `chatcmpl-${hex}` : `req_${hex}`;
}

export async function buildApp(
  services: Services,
  opts: AppOptions = {},
): Promise<FastifyInstance> {
  const app = Fastify({
    ...(opts.tls ? { https: { cert: opts.tls.cert, key: opts.tls.key } } : {}),
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
    trustProxy: services.config.trustedProxies.length ? services.config.trustedProxies : false,
    return503OnClosing: true,
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: 200 },
  });

  const production = services.config.env === 'production';
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('X-Request-ID', request.id);
    if (production) {
      reply.header('Strict-Transport-Security', HSTS);
      // request.protocol honours X-Forwarded-Proto only from trusted proxies.
      const path = request.url.split('?', 1)[0]!;
      if (request.protocol !== 'https' && !PLAIN_HTTP_PATHS.has(path)) {
        done(
          new ServiceError('https_required', {
            message: 'Plain HTTP is refused in production; use https:// (or a trusted TLS proxy).',
          }),
        );
        return;
      }
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
          url: request.url.split('?', 1)[0],
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

  if (opts.routes === false) return app;
  await app.register(operatorRoutes(services), { prefix: '/admin/v1' });
  await app.register(registrationRoutes(services), { prefix: '/admin/v1' });
  await app.register(projectRoutes(services));
  await app.register(keyRoutes(services));
  await app.register(webhookRoutes(services));
  await app.register(billingRoutes(services));
  await app.register(sloRoutes(services));
  await app.register(execRoutes(services));
  await app.register(inferenceRoutes(services));
  return app;
}
