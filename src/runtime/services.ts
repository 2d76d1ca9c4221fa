/**
 * Wires the service's parts together once at start: storage, repositories,
 * the key verifier and the operator token. Handlers receive this object; they
 * never construct dependencies themselves.
 */
import { BudgetAlerts } from '../billing/budget-alerts.js';
import { SloService } from '../slos/service.js';
import type { AgentTransport } from '../exec/contracts.js';
import { ExecService } from '../exec/service.js';
import { BillingGate } from '../billing/gate.js';
import { Limits } from '../http/limits.js';
import { readFileSync } from 'node:fs';
import { Dispatcher } from '../webhooks/dispatcher.js';
import { HttpSender, type Sender } from '../webhooks/sender.js';
import { WebhookService } from '../webhooks/service.js';
import {
  createAddressPolicy,
  createGuardedAgent,
  type AddressPolicy,
  type Resolver,
} from '../webhooks/ssrf.js';
import { MemoryLimiter, RedisLimiter, type LimiterBackend } from '../limits/index.js';
import { UsageRecorder } from '../billing/usage-recorder.js';
import { StoredCompletions } from '../completions/service.js';
import { ConfigError, type Config } from '../config/index.js';
import { EndpointRepository, type Endpoint } from '../endpoints/repository.js';
import { UpstreamClient } from '../inference/upstream.js';
import { AdminAuth } from '../http/admin-auth.js';
import { KeyRepository, KeyVerifier } from '../keys/index.js';
import { KeyService } from '../keys/service.js';
import { ModelRepository } from '../models/repository.js';
import { ProjectRepository } from '../projects/repository.js';
import { WorkerMonitor } from '../routing/monitor.js';
import { WorkerPool } from '../routing/pool.js';
import { WorkerRegistry } from '../routing/registry.js';
import { openStore, type Store } from '../store/index.js';
import { loadTiers, type Tier, type TierId } from '../tiers/index.js';
import type { Clock } from './clock.js';
import { TtlCache } from './ttl-cache.js';
import { Metrics } from './metrics.js';
import type { Tracing } from './tracing.js';
import { createDashboard, type Dashboard } from '../dashboard/index.js';
import { InvalidationBus } from './invalidation.js';
import type { Redis } from '../store/redis.js';
import type { Logger } from './logger.js';

/** How often keys' `last_used_at` is written (docs/API.md): at most a minute late. */
const KEY_USE_WRITE_MS = 60_000;

export interface Services {
  config: Config;
  clock: Clock;
  logger: Logger;
  store: Store;
  projects: ProjectRepository;
  models: ModelRepository;
  endpoints: EndpointRepository;
  workers: WorkerRegistry;
  keys: KeyRepository;
  keyService: KeyService;
  verifier: KeyVerifier;
  adminAuth: AdminAuth;
  tiers: Map<TierId, Tier>;
  /** Endpoints by `<project uuid>:<slug>`, read through on the hot path. */
  endpointCache: TtlCache<Endpoint | null>;
  resolveEndpoint(projectId: string, slug: string): Promise<Endpoint | null> | Endpoint | null;
  pool: WorkerPool;
  /** Scrapes workers' /metrics, keeps their health and endpoints' provisioning (started by serve). */
  monitor: WorkerMonitor;
  upstream: UpstreamClient;
  usage: UsageRecorder;
  /** Chat completions kept for `store: true` (src/completions), written off the hot path. */
  completions: StoredCompletions;
  billing: BillingGate;
  limiter: LimiterBackend;
  limits: Limits;
  webhookPolicy: AddressPolicy;
  dispatcher: Dispatcher;
  webhooks: WebhookService;
  budgetAlerts: BudgetAlerts;
  /** SLO records; `slos.targets(endpointId)` is the router's read of an endpoint's tightest targets. */
  slos: SloService;
  /**
   * The execution surface's control plane; also the broker's `AgentDirectory`.
   * The broker plugs its transport in with `exec.setTransport(t)`.
   */
  exec: ExecService;
  /** Dashboard sign-in, sessions and the internal proxy token (src/dashboard). */
  dashboard: Dashboard;
  metrics: Metrics;
  /** OpenTelemetry traces; null unless an OTLP endpoint is configured. */
  tracing: Tracing | null;
  /** Cancellers of open inference streams (graceful drain ends them with `cancelled`). */
  openStreams: Set<() => void>;
  /** Redis when REDIS_URL is set (limits, invalidation); null in the embedded default. */
  redis: Redis | null;
  bus: InvalidationBus;
  /** The operator token when it was generated at this start (to print once). */
  generatedAdminToken: string | null;
  close(): Promise<void>;
}

export async function createServices(
  config: Config,
  deps: {
    clock: Clock;
    logger: Logger;
    store?: Store;
    /** Test seams for webhook delivery: DNS answers and the HTTP sender. */
    webhookResolver?: Resolver;
    webhookSender?: Sender;
    /** Process metrics (CPU, memory, event loop); on for `switchyard serve`. */
    defaultMetrics?: boolean;
    /** The exec broker's transport, when already running (else `exec.setTransport` later). */
    execTransport?: AgentTransport;
  },
): Promise<Services> {
  const store =
    deps.store ??
    (await openStore({
      databaseUrl: config.databaseUrl,
      dataDir: config.dataDir,
      poolSize: config.dbPoolSize,
      pgliteFrom:
        config.pgliteTemplate && !config.databaseUrl
          ? readFileSync(config.pgliteTemplate)
          : undefined,
      pgliteSharedBuffers: config.pgliteSharedBuffers,
    }));
  const keys = new KeyRepository(store.db);
  const endpoints = new EndpointRepository(store.db);
  const workers = new WorkerRegistry(store.db);
  const endpointCache = new TtlCache<Endpoint | null>(deps.clock, config.routeCacheTtlMs, 10_000);
  // One upstream connection per request a worker may have in flight (HTTP/1.1: one stream each).
  const upstream = new UpstreamClient({ connections: config.workerMaxInFlight });
  const usage = new UsageRecorder(store.db, deps.logger, { flushIntervalMs: config.usageFlushMs });
  const completions = new StoredCompletions(store.db, deps.logger);
  // ioredis is loaded only when REDIS_URL is set (about 9 MiB of RSS otherwise).
  const redisLib = config.redisUrl ? await import('../store/redis.js') : null;
  const redis =
    config.redisUrl && redisLib
      ? redisLib.connectRedis(config.redisUrl, {
          logger: deps.logger,
          name: 'commands',
          offlineQueue: false,
          commandTimeoutMs: redisLib.REDIS_COMMAND_TIMEOUT_MS,
        })
      : null;
  if (redis && redisLib && !(await redisLib.redisReady(redis, 3000))) {
    deps.logger.warn(
      'redis is not reachable yet; limits fail per SWITCHYARD_LIMITS_FAIL until it is',
    );
  }
  const limiter: LimiterBackend = redis ? new RedisLimiter(redis) : new MemoryLimiter();
  const metrics = new Metrics({ defaults: deps.defaultMetrics ?? false });
  // OpenTelemetry only when an OTLP endpoint is configured (the SDK is not even loaded otherwise).
  const tracing = config.otlpEndpoint
    ? (await import('./tracing.js')).Tracing.start({
        endpoint: config.otlpEndpoint,
        serviceName: config.otelServiceName,
      })
    : null;
  const limits = new Limits(limiter, deps.clock, deps.logger, config.limitsFailClosed, metrics);
  const webhookPolicy = createAddressPolicy({ allowCidrs: config.webhookAllowCidrs });
  if (config.webhookAllowCidrs.length > 0) {
    deps.logger.warn(
      { cidrs: config.webhookAllowCidrs },
      'SWITCHYARD_WEBHOOK_ALLOW_CIDRS is set: webhooks may deliver to these private ranges',
    );
  }
  const sender =
    deps.webhookSender ??
    new HttpSender(
      createGuardedAgent({
        policy: webhookPolicy,
        ...(config.webhookCaFile ? { ca: readWebhookCa(config.webhookCaFile) } : {}),
        ...(deps.webhookResolver ? { resolver: deps.webhookResolver } : {}),
      }),
    );
  const dispatcher = new Dispatcher(store.db, deps.clock, sender, deps.logger, {
    metrics,
    ...(config.webhookRetryDelaysMs ? { retryDelaysMs: config.webhookRetryDelaysMs } : {}),
    ...(config.webhookAttemptTimeoutMs ? { attemptTimeoutMs: config.webhookAttemptTimeoutMs } : {}),
    ...(config.webhookLeaseMs ? { leaseMs: config.webhookLeaseMs } : {}),
  });
  const webhooks = new WebhookService(
    store.db,
    deps.clock,
    webhookPolicy,
    dispatcher,
    limits,
    deps.webhookResolver,
  );
  const budgetAlerts = new BudgetAlerts(store.db, deps.clock, deps.logger);
  usage.onSpend = async (projectIds) => {
    if ((await budgetAlerts.evaluate(projectIds)) > 0) dispatcher.poke();
  };
  budgetAlerts.onFired = () => dispatcher.poke();
  const bus = redis
    ? await InvalidationBus.redis(
        redis,
        // The subscriber queues its SUBSCRIBE until connected and re-subscribes on reconnect.
        redisLib!.connectRedis(config.redisUrl!, {
          offlineQueue: true,
          logger: deps.logger,
          name: 'pubsub',
        }),
        deps.logger,
      )
    : InvalidationBus.local(deps.logger);
  const verifier = new KeyVerifier(keys, deps.clock, {
    cacheSize: config.keyCacheSize,
    ttlMs: config.keyCacheTtlMs,
  });
  verifier.recordUse(KEY_USE_WRITE_MS);
  const pool = new WorkerPool(
    workers,
    deps.clock,
    config.routeCacheTtlMs,
    config.workerMaxInFlight,
    metrics,
  );
  pool.setQueue({ depth: config.routerQueueDepth, timeoutMs: config.routerQueueTimeoutMs });
  pool.setPolicy(config.routingPolicy);
  const monitor = new WorkerMonitor({
    registry: workers,
    endpoints,
    pool,
    clock: deps.clock,
    metrics,
    logger: deps.logger,
    bus,
    upstream,
    settings: {
      intervalMs: config.workerScrapeMs,
      heartbeatMs: config.workerHeartbeatMs,
      missedHeartbeats: config.workerMissedHeartbeats,
      expireMs: config.workerExpireMs,
      failedChecks: config.workerFailedChecks,
    },
  });
  const projects = new ProjectRepository(store.db);
  const billing = new BillingGate(projects, deps.clock, config.routeCacheTtlMs);
  bus.on((m) => {
    if (m.kind === 'key') verifier.invalidate(m.id);
    else if (m.kind === 'endpoint') endpointCache.clear();
    else if (m.kind === 'project') billing.invalidate(m.id);
    else {
      pool.invalidate();
      pool.pumpAll();
    }
  });
  const slos = new SloService(store.db, deps.clock, endpoints, bus, config.routeCacheTtlMs);
  const exec = new ExecService({
    db: store.db,
    clock: deps.clock,
    logger: deps.logger,
    settings: {
      leaseMs: config.execLeaseMs,
      maxPendingPerProject: config.execMaxPending,
      timeoutGraceMs: config.execTimeoutGraceMs,
      outputMaxBytes: config.execOutputMaxBytes,
      tickMs: config.execTickMs,
    },
    poke: () => dispatcher.poke(),
    transport: deps.execTransport ?? null,
  });
  const { auth, generated } = await AdminAuth.init(store.db, {
    token: config.adminToken,
    dataDir: config.dataDir,
  });
  return {
    config,
    clock: deps.clock,
    logger: deps.logger,
    store,
    projects,
    models: new ModelRepository(store.db),
    endpoints,
    workers,
    keys,
    keyService: new KeyService(
      keys,
      async (projectId, endpointId) => (await endpoints.get(projectId, endpointId)) !== null,
      bus,
      deps.clock,
    ),
    verifier,
    adminAuth: auth,
    tiers: await loadTiers(store.db),
    endpointCache,
    resolveEndpoint: (projectId, slug) =>
      endpointCache.get(`${projectId}:${slug}`, () => endpoints.get(projectId, slug)),
    pool,
    monitor,
    upstream,
    usage,
    completions,
    billing,
    limiter,
    limits,
    webhookPolicy,
    dispatcher,
    webhooks,
    budgetAlerts,
    slos,
    exec,
    dashboard: createDashboard({ config, db: store.db, clock: deps.clock, limits }),
    metrics,
    tracing,
    openStreams: new Set(),
    redis,
    bus,
    generatedAdminToken: generated,
    close: async () => {
      await monitor.stop();
      await exec.stop();
      await dispatcher.stop();
      await usage.close();
      await completions.close();
      await verifier.stopRecordingUse();
      await budgetAlerts.close();
      await upstream.close();
      await limiter.close();
      await bus.close();
      await store.close();
      await tracing?.shutdown();
    },
  };
}

function readWebhookCa(file: string): Buffer {
  try {
    return readFileSync(file);
  } catch (err) {
    throw new ConfigError(`SWITCHYARD_WEBHOOK_CA_FILE: ${(err as Error).message}`);
  }
}
