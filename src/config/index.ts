/**
 * One typed configuration, read once from the environment at start. Every
 * setting the service reads is listed here (and in the README's table); nothing
 * else reads `process.env`.
 */
import { resolve } from 'node:path';
import proxyAddr from '@fastify/proxy-addr';
import { createAddressPolicy } from '../webhooks/ssrf.js';

export type Environment = 'development' | 'production';

export interface Config {
  port: number;
  host: string;
  /** Public base URL printed in snippets; defaults to http://<host>:<port>. */
  baseUrl: string;
  /** SWITCHYARD_BASE_URL as set (no default): identity providers' callbacks are built on it. */
  publicBaseUrl: string | undefined;
  env: Environment;
  dataDir: string;
  /**
   * A PGlite data-directory dump (tar, PGlite's dumpDataDir) a new embedded database
   * starts from instead of an empty cluster; ignored once the database exists.
   */
  pgliteTemplate: string | undefined;
  /** The embedded database's PostgreSQL `shared_buffers` (e.g. `16MB`); unset: 128MB. */
  pgliteSharedBuffers: string | undefined;
  databaseUrl: string | undefined;
  redisUrl: string | undefined;
  adminToken: string | undefined;
  /**
   * The dashboard's key (32 bytes): TOTP seeds are sealed, and the internal proxy
   * token signed, with keys derived from it; else a key file in the data directory.
   */
  secretKey: string | undefined;
  /** Identity providers for dashboard sign-in (JSON, dashboard/oidc.ts `parseIdps`). */
  idps: string | undefined;
  /** Where the dashboard reaches the API role; this instance itself by default. */
  routerUrl: string | undefined;
  demo: boolean;
  /** Engine of the embedded demo worker: `llama` (default) or `sim`. */
  demoEngine: 'llama' | 'sim';
  trustedProxies: string[];
  webhookAllowCidrs: string[];
  webhookCaFile: string | undefined;
  logLevel: string;
  /** Verified API keys kept in memory (entries). */
  keyCacheSize: number;
  /** How long a cached key verification is trusted without a database read (ms). */
  keyCacheTtlMs: number;
  /** Longest a usage record waits in memory before its batch is written. */
  usageFlushMs: number;
  dbPoolSize: number;
  /** How long endpoint and worker lookups are cached on the hot path (ms). */
  routeCacheTtlMs: number;
  /** Requests in flight from one router to one worker before it counts as saturated. */
  workerMaxInFlight: number;
  /** Worker choice: `score` (load, KV, prefix affinity, SLO hints) or `least-loaded`. */
  routingPolicy: 'score' | 'least-loaded';
  /** Requests that may wait in the router for a worker per (model, tier); 0 = none. */
  routerQueueDepth: number;
  /** Longest wait in that queue before 429 `capacity_exceeded` (ms; the tier deadline caps it). */
  routerQueueTimeoutMs: number;
  /** Token `switchyard worker --register` presents; unset = self-registration off. */
  workerToken: string | undefined;
  /** Worker monitor period: /metrics scrape, health check, heartbeat sweep (ms; 0 = off). */
  workerScrapeMs: number;
  /** Heartbeat period self-registered workers are told to keep (ms). */
  workerHeartbeatMs: number;
  /** Heartbeat periods missed before a self-registered worker is unhealthy. */
  workerMissedHeartbeats: number;
  /** Time without a heartbeat before a self-registered worker is removed (ms). */
  workerExpireMs: number;
  /** Consecutive failed health checks before a worker is unhealthy. */
  workerFailedChecks: number;
  /** Largest accepted request body (413 `payload_too_large` above it). */
  maxBodyBytes: number;
  /** Time a client has to send a whole request, headers and body (408 after it). */
  requestTimeoutMs: number;
  /** Largest file (Files API upload, or the sum of an upload's parts). */
  maxFileBytes: number;
  /** Largest part of a multipart upload (Uploads API). */
  maxUploadPartBytes: number;
  /** Requests of one batch the batch runner runs at once. */
  batchConcurrency: number;
  /** TLS served by the router itself (both set), reloaded when the files change. */
  tlsCertFile: string | undefined;
  tlsKeyFile: string | undefined;
  /** How long SIGTERM waits for in-flight requests and streams before ending them. */
  drainMs: number;
  /** Period of the check that returns freed native memory after load (ms; 0 = off). */
  memoryTrimMs: number;
  /** OTLP/HTTP endpoint for OpenTelemetry traces; unset = tracing off. */
  otlpEndpoint: string | undefined;
  otelServiceName: string;
  /** When the limiter backend (Redis) fails: admit (`open`, default) or 503 (`closed`). */
  limitsFailClosed: boolean;
  /** Webhook schedule overrides, for tests and drills only (the spec's values by default). */
  webhookRetryDelaysMs: number[] | undefined;
  webhookAttemptTimeoutMs: number | undefined;
  webhookLeaseMs: number | undefined;
  /** Interface the exec broker's ZeroMQ sockets bind (role `broker`). */
  execBind: string;
  /** Port of the agent enrollment socket (0: any free port; the default when PORT=0). */
  execEnrollPort: number;
  /** Port of the agent session socket (0: any free port; the default when PORT=0). */
  execAgentPort: number;
  /** Host agents are told to dial; defaults to the bind address (127.0.0.1 for a wildcard). */
  execPublicHost: string | undefined;
  /** The broker's CURVE secret key (Z85); else `exec-broker.key` in the data directory. */
  execSecretKey: string | undefined;
  /** Exec: how long an agent's enrollment or renewal keeps it online (ms). */
  execLeaseMs: number;
  /** Exec: non-terminal invocations per project before 503 `unavailable`. */
  execMaxPending: number;
  /** Exec: wait past an invocation's timeout_ms for the agent's answer before `exec.timeout` (ms). */
  execTimeoutGraceMs: number;
  /** Exec: scheduler period (leases, approval deadlines, timeouts) (ms). */
  execTickMs: number;
  /** Exec: bytes of stdout and of stderr kept per invocation. */
  execOutputMaxBytes: number;
}

export class ConfigError extends Error {}

function int(env: NodeJS.ProcessEnv, name: string, def: number, min = 0): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return def;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) {
    throw new ConfigError(`${name} must be an integer >= ${min}, got ${JSON.stringify(raw)}`);
  }
  return n;
}

function routingPolicy(raw: string | undefined): 'score' | 'least-loaded' {
  if (raw === undefined || raw === '' || raw === 'score') return 'score';
  if (raw === 'least-loaded') return raw;
  throw new ConfigError(`SWITCHYARD_ROUTING_POLICY must be score or least-loaded, got ${raw}`);
}

function list(raw: string | undefined): string[] {
  if (!raw) return [];
  return raw
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
}

function nonEmpty(raw: string | undefined): string | undefined {
  return raw === undefined || raw === '' ? undefined : raw;
}

/** One of `allowed` (the first when unset): a typo stops start-up, never picks a default. */
function oneOf<T extends string>(name: string, raw: string | undefined, allowed: readonly T[]): T {
  if (raw === undefined || raw === '') return allowed[0]!;
  if ((allowed as readonly string[]).includes(raw)) return raw as T;
  throw new ConfigError(`${name} must be ${allowed.join(' or ')}, got ${JSON.stringify(raw)}`);
}

/** A URL with one of `protocols` (e.g. `postgres:`), else a ConfigError naming the setting. */
function url(name: string, raw: string | undefined, protocols: readonly string[]) {
  const v = nonEmpty(raw);
  if (v === undefined) return undefined;
  let u: URL;
  try {
    u = new URL(v);
  } catch {
    throw new ConfigError(`${name} is not a URL`);
  }
  if (!protocols.includes(u.protocol)) {
    throw new ConfigError(`${name} must be a ${protocols.join(' or ')} URL, got ${u.protocol}`);
  }
  return v;
}

/** `check` throws on a bad value: its message, prefixed with the setting's name. */
function checked<T>(name: string, value: T, check: (v: T) => unknown): T {
  try {
    check(value);
  } catch (err) {
    throw new ConfigError(`${name}: ${err instanceof Error ? err.message : String(err)}`);
  }
  return value;
}

/**
 * A PostgreSQL memory size as postgresql.conf writes one (`16MB`), of at least 128 kB
 * (PostgreSQL's minimum for shared_buffers).
 */
function memorySize(name: string, raw: string | undefined): string | undefined {
  const v = nonEmpty(raw);
  if (v === undefined) return undefined;
  const m = /^[1-9]\d*(kB|MB|GB)$/.exec(v);
  const kb = m ? Number.parseInt(v, 10) * { kB: 1, MB: 1024, GB: 1024 * 1024 }[m[1] as 'kB'] : 0;
  if (!(kb >= 128)) {
    throw new ConfigError(
      `${name} must be a size of at least 128kB such as 16MB, got ${JSON.stringify(v)}`,
    );
  }
  return v;
}

const LOG_LEVELS = ['info', 'fatal', 'error', 'warn', 'debug', 'trace', 'silent'] as const;

export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const port = int(env, 'PORT', 8080);
  const host = env.HOST || '127.0.0.1';
  const rawEnv = env.SWITCHYARD_ENV || 'development';
  if (rawEnv !== 'development' && rawEnv !== 'production') {
    throw new ConfigError(`SWITCHYARD_ENV must be development or production, got ${rawEnv}`);
  }
  const shownHost = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host;
  const tls = Boolean(env.SWITCHYARD_TLS_CERT_FILE && env.SWITCHYARD_TLS_KEY_FILE);
  if (Boolean(env.SWITCHYARD_TLS_CERT_FILE) !== Boolean(env.SWITCHYARD_TLS_KEY_FILE)) {
    throw new ConfigError('SWITCHYARD_TLS_CERT_FILE and SWITCHYARD_TLS_KEY_FILE go together');
  }
  return {
    port,
    host,
    baseUrl: (
      env.SWITCHYARD_BASE_URL || `${tls ? 'https' : 'http'}://${shownHost}:${port}`
    ).replace(/\/+$/, ''),
    publicBaseUrl: nonEmpty(env.SWITCHYARD_BASE_URL)?.replace(/\/+$/, ''),
    env: rawEnv,
    dataDir: resolve(env.SWITCHYARD_DATA_DIR || './data'),
    pgliteTemplate: nonEmpty(env.SWITCHYARD_PGLITE_TEMPLATE),
    pgliteSharedBuffers: memorySize(
      'SWITCHYARD_PGLITE_SHARED_BUFFERS',
      env.SWITCHYARD_PGLITE_SHARED_BUFFERS,
    ),
    // node-postgres also takes `socket:/path?db=…`; ioredis a Unix socket's path.
    databaseUrl: url('DATABASE_URL', env.DATABASE_URL, ['postgres:', 'postgresql:', 'socket:']),
    redisUrl: env.REDIS_URL?.startsWith('/')
      ? env.REDIS_URL
      : url('REDIS_URL', env.REDIS_URL, ['redis:', 'rediss:']),
    adminToken: nonEmpty(env.SWITCHYARD_ADMIN_TOKEN),
    secretKey: nonEmpty(env.SWITCHYARD_SECRET_KEY),
    idps: nonEmpty(env.SWITCHYARD_IDPS),
    routerUrl: nonEmpty(env.SWITCHYARD_ROUTER_URL)?.replace(/\/+$/, ''),
    demo: env.SWITCHYARD_DEMO !== '0',
    demoEngine: oneOf('SWITCHYARD_DEMO_ENGINE', env.SWITCHYARD_DEMO_ENGINE, ['llama', 'sim']),
    trustedProxies: checked(
      'SWITCHYARD_TRUSTED_PROXIES',
      list(env.SWITCHYARD_TRUSTED_PROXIES),
      (v) => proxyAddr.compile(v),
    ),
    webhookAllowCidrs: checked(
      'SWITCHYARD_WEBHOOK_ALLOW_CIDRS',
      list(env.SWITCHYARD_WEBHOOK_ALLOW_CIDRS),
      (v) => createAddressPolicy({ allowCidrs: v }),
    ),
    webhookCaFile: nonEmpty(env.SWITCHYARD_WEBHOOK_CA_FILE),
    logLevel: oneOf('LOG_LEVEL', env.LOG_LEVEL, LOG_LEVELS),
    keyCacheSize: int(env, 'SWITCHYARD_KEY_CACHE_SIZE', 10_000, 1),
    keyCacheTtlMs: int(env, 'SWITCHYARD_KEY_CACHE_TTL_MS', 1_000, 0),
    usageFlushMs: int(env, 'SWITCHYARD_USAGE_FLUSH_MS', 100, 1),
    dbPoolSize: int(env, 'SWITCHYARD_DB_POOL_SIZE', 10, 1),
    routeCacheTtlMs: int(env, 'SWITCHYARD_ROUTE_CACHE_TTL_MS', 1_000, 0),
    workerMaxInFlight: int(env, 'SWITCHYARD_WORKER_MAX_INFLIGHT', 256, 1),
    routingPolicy: routingPolicy(env.SWITCHYARD_ROUTING_POLICY),
    routerQueueDepth: int(env, 'SWITCHYARD_ROUTER_QUEUE_DEPTH', 64, 0),
    routerQueueTimeoutMs: int(env, 'SWITCHYARD_ROUTER_QUEUE_TIMEOUT_MS', 5_000, 0),
    workerToken: nonEmpty(env.SWITCHYARD_WORKER_TOKEN),
    workerScrapeMs: int(env, 'SWITCHYARD_WORKER_SCRAPE_MS', 1_000, 0),
    workerHeartbeatMs: int(env, 'SWITCHYARD_WORKER_HEARTBEAT_MS', 5_000, 100),
    workerMissedHeartbeats: int(env, 'SWITCHYARD_WORKER_MISSED_HEARTBEATS', 3, 1),
    workerExpireMs: int(env, 'SWITCHYARD_WORKER_EXPIRE_MS', 60_000, 1_000),
    workerFailedChecks: int(env, 'SWITCHYARD_WORKER_FAILED_CHECKS', 3, 1),
    maxBodyBytes: int(env, 'SWITCHYARD_MAX_BODY_BYTES', 4 * 1024 * 1024, 1024),
    requestTimeoutMs: int(env, 'SWITCHYARD_REQUEST_TIMEOUT_MS', 300_000, 1_000),
    maxFileBytes: int(env, 'SWITCHYARD_MAX_FILE_BYTES', 100 * 1024 * 1024, 1),
    maxUploadPartBytes: int(env, 'SWITCHYARD_MAX_UPLOAD_PART_BYTES', 64 * 1024 * 1024, 1),
    batchConcurrency: int(env, 'SWITCHYARD_BATCH_CONCURRENCY', 4, 1),
    tlsCertFile: nonEmpty(env.SWITCHYARD_TLS_CERT_FILE),
    tlsKeyFile: nonEmpty(env.SWITCHYARD_TLS_KEY_FILE),
    drainMs: int(env, 'SWITCHYARD_DRAIN_MS', 30_000, 0),
    memoryTrimMs: int(env, 'SWITCHYARD_MEMORY_TRIM_MS', 5_000, 0),
    otlpEndpoint: url(
      'The OTLP endpoint (SWITCHYARD_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_*)',
      otlpEndpointFromEnv(env),
      ['http:', 'https:'],
    ),
    otelServiceName: env.OTEL_SERVICE_NAME || 'switchyard',
    limitsFailClosed:
      oneOf('SWITCHYARD_LIMITS_FAIL', env.SWITCHYARD_LIMITS_FAIL, ['open', 'closed']) === 'closed',
    webhookRetryDelaysMs: env.SWITCHYARD_WEBHOOK_RETRY_DELAYS_MS
      ? list(env.SWITCHYARD_WEBHOOK_RETRY_DELAYS_MS).map((v) => {
          const n = Number(v);
          if (!Number.isInteger(n) || n < 1) {
            throw new ConfigError('SWITCHYARD_WEBHOOK_RETRY_DELAYS_MS must list positive integers');
          }
          return n;
        })
      : undefined,
    webhookAttemptTimeoutMs: env.SWITCHYARD_WEBHOOK_ATTEMPT_TIMEOUT_MS
      ? int(env, 'SWITCHYARD_WEBHOOK_ATTEMPT_TIMEOUT_MS', 30_000, 1)
      : undefined,
    webhookLeaseMs: env.SWITCHYARD_WEBHOOK_LEASE_MS
      ? int(env, 'SWITCHYARD_WEBHOOK_LEASE_MS', 45_000, 1)
      : undefined,
    execBind: env.SWITCHYARD_EXEC_BIND || '127.0.0.1',
    // PORT=0 (any free port, as tests and side-by-side instances use) extends to the broker.
    execEnrollPort: int(env, 'SWITCHYARD_EXEC_ENROLL_PORT', port === 0 ? 0 : 7601, 0),
    execAgentPort: int(env, 'SWITCHYARD_EXEC_AGENT_PORT', port === 0 ? 0 : 7602, 0),
    execPublicHost: nonEmpty(env.SWITCHYARD_EXEC_PUBLIC_HOST),
    execSecretKey: nonEmpty(env.SWITCHYARD_EXEC_SECRET_KEY),
    execLeaseMs: int(env, 'SWITCHYARD_EXEC_LEASE_MS', 30_000, 1000),
    execMaxPending: int(env, 'SWITCHYARD_EXEC_MAX_PENDING', 1000, 1),
    execTimeoutGraceMs: int(env, 'SWITCHYARD_EXEC_TIMEOUT_GRACE_MS', 10_000, 0),
    execTickMs: int(env, 'SWITCHYARD_EXEC_TICK_MS', 1000, 10),
    execOutputMaxBytes: int(env, 'SWITCHYARD_EXEC_OUTPUT_MAX_BYTES', 65_536, 1024),
  };
}

/** The OTLP endpoint: Switchyard's setting, else the standard OpenTelemetry variables. */
export function otlpEndpointFromEnv(env: NodeJS.ProcessEnv): string | undefined {
  return (
    nonEmpty(env.SWITCHYARD_OTLP_ENDPOINT) ??
    nonEmpty(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) ??
    nonEmpty(env.OTEL_EXPORTER_OTLP_ENDPOINT)
  );
}
