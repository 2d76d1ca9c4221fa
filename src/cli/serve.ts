/**
 * `switchyard serve`: the router. Opens storage (running migrations), builds
 * the HTTP app, bootstraps the demo on first start, starts the embedded demo
 * worker, and shuts down cleanly on SIGTERM/SIGINT.
 */
import { parseArgs } from 'node:util';
import { loadConfig, type Config } from '../config/index.js';
import { ADMIN_TOKEN_FILE } from '../http/admin-auth.js';
import { buildApp } from '../http/app.js';
import {
  DEMO_CONTEXT_WINDOW,
  DEMO_TIER,
  ensureDemo,
  type DemoInfo,
} from '../operator/bootstrap.js';
import { systemClock } from '../runtime/clock.js';
import { createLogger } from '../runtime/logger.js';
import { MemoryTrimmer } from '../runtime/memory-trim.js';
import { createServices, type Services } from '../runtime/services.js';
import { createHash } from 'node:crypto';
import { readFileSync, unwatchFile, watchFile, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { createSecureContext } from 'node:tls';
import { join } from 'node:path';

const EMBEDDED_WORKER_ID = 'embedded-demo';

/** Where a production start without a terminal leaves the demo key (printBanner). */
const DEMO_KEY_FILE = 'demo-api-key';

/**
 * The embedded demo worker's id. With the embedded database one process owns it
 * (the data directory's lock), so the id is fixed. On a shared PostgreSQL every
 * instance runs its own embedded worker: each needs its own row, or the last one to
 * start would point every instance's demo endpoint at its worker, and at nothing once
 * it stopped. Host and port name the instance, so a restart reuses its row.
 */
function embeddedWorkerId(config: Config): string {
  if (!config.databaseUrl) return EMBEDDED_WORKER_ID;
  const who = `${hostname()}:${config.port}:${config.dataDir}`;
  return `${EMBEDDED_WORKER_ID}-${createHash('sha256').update(who).digest('hex').slice(0, 10)}`;
}

export const ROLES = ['api', 'dispatcher', 'broker', 'dashboard'] as const;
export type Role = (typeof ROLES)[number];

/**
 * Roles let operators scale each part on its own: `api` serves HTTP (inference,
 * management, operator APIs), `dispatcher` delivers webhooks, `broker` runs the
 * exec broker (ZeroMQ/CURVE sockets execution agents connect to), `dashboard`
 * serves the dashboard's pages (sign-in, projects, account; src/dashboard), which
 * act on projects through the `api` role's internal path (in-process, or at
 * SWITCHYARD_ROUTER_URL). Default: all.
 */
function parseRoles(raw: string | undefined): Set<Role> {
  if (!raw) return new Set(ROLES);
  const roles = new Set<Role>();
  for (const r of raw
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean)) {
    if (!(ROLES as readonly string[]).includes(r)) {
      throw new Error(`--roles: unknown role '${r}' (${ROLES.join(', ')})`);
    }
    roles.add(r as Role);
  }
  if (roles.size === 0) throw new Error('--roles: name at least one role');
  return roles;
}

const USAGE = `usage: switchyard serve [--port N] [--host ADDR] [--roles LIST]

Runs the router: the inference API, the management and operator APIs, the dashboard,
webhook delivery and the execution-agent broker. Every setting is an environment
variable (README, "Settings"); these flags override three of them:

  --port N        listen port (PORT, default 8080; 0 picks a free one)
  --host ADDR     listen address (HOST, default 127.0.0.1)
  --roles LIST    what this process does, any of api,dispatcher,broker,dashboard
                  (SWITCHYARD_ROLES, default all of them)
  -h, --help      this text
`;

export async function serve(argv: string[]): Promise<number> {
  let values: { port?: string; host?: string; roles?: string; help?: boolean };
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        port: { type: 'string' },
        host: { type: 'string' },
        roles: { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
    }));
  } catch (err) {
    process.stderr.write(`switchyard serve: ${(err as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  const env = { ...process.env };
  if (values.port) env.PORT = values.port;
  if (values.host) env.HOST = values.host;
  const roles = parseRoles(values.roles ?? env.SWITCHYARD_ROLES);
  const config = loadConfig(env);
  if (roles.has('dashboard') && !roles.has('api') && !config.routerUrl) {
    // The dashboard acts through the api role's internal routes: in-process only
    // when this process has the role, else over HTTP to SWITCHYARD_ROUTER_URL.
    process.stderr.write(
      'switchyard serve: the dashboard role without the api role needs SWITCHYARD_ROUTER_URL (an api instance, https:// in production)\n',
    );
    return 2;
  }
  const logger = createLogger(config.logLevel);
  // Read (and parsed) before anything starts: a missing or broken file is an exit,
  // not a process that runs on with no listener.
  let tls: { cert: Buffer; key: Buffer } | undefined;
  try {
    tls = config.tlsCertFile && config.tlsKeyFile ? readTls(config) : undefined;
    if (tls) createSecureContext(tls);
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    process.stderr.write(`switchyard: cannot use the TLS certificate and key: ${reason}\n`);
    return 1;
  }
  const services = await createServices(config, {
    clock: systemClock,
    logger,
    defaultMetrics: true,
  });

  const closers: Array<() => Promise<void>> = [];
  let demo: DemoInfo | null = null;
  if (config.demo && roles.has('api')) {
    demo = await ensureDemo(services);
    const worker = await startDemoWorker(config, demo.endpoint.modelName, logger);
    closers.push(() => worker.close());
    const embeddedId = embeddedWorkerId(config);
    const w = await services.workers.upsert(
      {
        id: embeddedId,
        modelId: demo.endpoint.modelId,
        tierId: DEMO_TIER,
        url: worker.url,
        source: 'embedded',
      },
      new Date(services.clock.now()),
    );
    if (!w) throw new Error(`worker id '${embeddedId}' is taken by a worker that is not embedded`);
    await services.endpoints.activateWaiting(demo.endpoint.modelId, DEMO_TIER, w.id);
    // On a shared database the row is this instance's alone: gone when it stops.
    if (config.databaseUrl) closers.push(async () => void (await services.workers.remove(w.id)));
  }

  // Without the api role the process still answers /healthz, /readyz and /metrics.
  const app = await buildApp(services, {
    ...(tls ? { tls } : {}),
    routes: roles.has('api'),
    dashboard: roles.has('dashboard'),
  });
  if (tls) closers.push(watchTls(config, app, logger));
  if (roles.has('dispatcher')) services.dispatcher.start();
  // Batches run where webhooks are delivered: background work off the API's path.
  if (roles.has('dispatcher')) {
    const { BatchRunner } = await import('../batches/runner.js');
    // The runner sends each line through the API's own routes, in process: without
    // the api role, this instance builds them for the runner alone (never listened on).
    const api = roles.has('api') ? app : await buildApp(services, { dashboard: false });
    const runner = new BatchRunner(services, api);
    runner.start();
    closers.push(async () => {
      await runner.stop();
      if (api !== app) await api.close();
    });
  }

  // ---- exec broker (role `broker`): the execution surface's ZeroMQ transport ----
  // The control plane (services.exec, the AgentDirectory) reaches agents through it.
  // A broker that cannot bind (another instance on this host holds the ports) leaves
  // the router serving without it, loudly: agents connect to the instance that has it.
  let execBanner: string | undefined;
  if (roles.has('broker')) {
    const { startBroker } = await import('../exec/broker/index.js');
    try {
      const broker = await startBroker({
        config,
        directory: services.exec,
        clock: services.clock,
        logger,
      });
      services.exec.setTransport(broker);
      closers.push(async () => {
        services.exec.setTransport(null);
        await broker.close();
      });
      execBanner =
        `Exec broker: enroll ${broker.endpoints.enroll}   agents ${broker.endpoints.agents}\n` +
        `Exec broker server key: ${broker.serverPublicKey}`;
    } catch (err) {
      logger.error({ err }, 'exec broker failed to start; execution agents cannot connect here');
      execBanner = 'Exec broker: not running (see the log)';
    }
  }
  // ---- end exec broker ----
  // The exec scheduler (approval escalation and expiry, agent lease expiry, the
  // invocation timeout backstop). Every transition is a conditional update in
  // one transaction, so several instances ticking at once emit each event once.
  if (roles.has('api') || roles.has('broker')) services.exec.start();
  // Worker health, live load signals and endpoint provisioning, where requests are routed.
  if (roles.has('api')) services.monitor.start();

  try {
    await app.listen({ port: config.port, host: config.host });
  } catch (err) {
    // The port is taken (or not ours to bind): nothing was served. Stop what started
    // (the demo worker, loops, connections) and exit with the error instead of
    // running on without a listener.
    logger.error({ err }, 'cannot listen');
    await app.close().catch(() => undefined);
    for (const c of closers) await c().catch(() => undefined);
    await services.close().catch(() => undefined);
    const reason = err instanceof Error ? err.message : String(err);
    process.stderr.write(`switchyard: cannot listen on ${config.host}:${config.port}: ${reason}\n`);
    process.exit(1);
  }
  let baseUrl = config.baseUrl;
  const addr = app.server.address();
  if (!env.SWITCHYARD_BASE_URL && addr && typeof addr === 'object') {
    // With PORT=0 the kernel picks the port; show the one actually bound.
    const host = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host;
    baseUrl = `${tls ? 'https' : 'http'}://${host.includes(':') ? `[${host}]` : host}:${addr.port}`;
  }
  // Freed native memory goes back to the system when the router goes quiet.
  const trimmer = new MemoryTrimmer({
    clock: services.clock,
    logger,
    intervalMs: config.memoryTrimMs,
    onTrim: (before, after) => {
      services.metrics.memoryTrims.inc();
      services.metrics.memoryTrimReleased.inc(Math.max(0, before - after));
    },
  });
  trimmer.start();
  closers.push(async () => trimmer.stop());
  printBanner(baseUrl, config, services, demo, roles);
  if (execBanner) process.stdout.write(execBanner + '\n');

  // A reader of our output that went away (`serve | tee` after tee died) must not
  // turn a write into an uncaught EPIPE in the middle of a shutdown.
  for (const out of [process.stdout, process.stderr]) out.on('error', () => undefined);

  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) {
      // A second signal while draining: stop now (what an operator pressing Ctrl-C
      // twice means), without the rest of the drain.
      process.exit(1);
    }
    stopping = true;
    try {
      await drain(signal);
    } catch (err) {
      logger.error({ err }, 'shutdown failed');
      process.exit(1);
    }
    process.exit(0);
  };
  const drain = async (signal: string) => {
    logger.info({ signal, drainMs: config.drainMs }, 'draining');
    // Stop taking work: the listener closes (new connections are refused, requests
    // on kept-alive connections get 503), webhook leases in flight finish and record.
    const closed = app.close();
    // close() ends the connections idle at that moment; one whose request finishes
    // during the drain stays open for the client's next request (keep-alive, 72 s),
    // and the listener would not close until the deadline: end those as they go idle.
    const idle = setInterval(() => app.server.closeIdleConnections(), 100);
    void closed.finally(() => clearInterval(idle));
    const dispatcherStopped = services.dispatcher.stop();
    // In-flight requests and streams get the drain period; streams still open
    // then end with the `cancelled` SSE error, and lingering sockets are closed.
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, config.drainMs);
    });
    await Promise.race([closed, deadline]);
    clearTimeout(timer);
    for (const cancel of [...services.openStreams]) cancel();
    // Let the cancelled streams write their final event before sockets are closed.
    for (let i = 0; i < 100 && services.openStreams.size > 0; i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    app.server.closeAllConnections();
    await closed;
    await dispatcherStopped;
    for (const c of closers) await c();
    await services.close(); // flushes buffered usage records
    logger.info('stopped');
  };
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGINT', () => void stop('SIGINT'));
  return new Promise<number>(() => undefined);
}

function readTls(config: Config): { cert: Buffer; key: Buffer } {
  return { cert: readFileSync(config.tlsCertFile!), key: readFileSync(config.tlsKeyFile!) };
}

/** Reloads the certificate when its files change (renewals need no restart). */
function watchTls(
  config: Config,
  app: Awaited<ReturnType<typeof buildApp>>,
  logger: ReturnType<typeof createLogger>,
): () => Promise<void> {
  const reload = () => {
    try {
      const { cert, key } = readTls(config);
      (app.server as unknown as { setSecureContext(o: object): void }).setSecureContext({
        cert,
        key,
      });
      logger.info('TLS certificate reloaded');
    } catch (err) {
      // A half-written renewal: keep serving the previous certificate.
      logger.warn({ err }, 'TLS certificate reload failed; keeping the previous one');
    }
  };
  for (const f of [config.tlsCertFile!, config.tlsKeyFile!])
    watchFile(f, { interval: 2000 }, reload);
  return async () => {
    unwatchFile(config.tlsCertFile!);
    unwatchFile(config.tlsKeyFile!);
  };
}

/**
 * The embedded demo worker: llama.cpp serving the model the project builds
 * from its own corpus (SWITCHYARD_DEMO_ENGINE=llama, the default), or the
 * simulator (`sim`). If llama.cpp cannot load here, the simulator stands in and
 * the start says so.
 */
async function startDemoWorker(
  config: Config,
  modelName: string,
  logger: ReturnType<typeof createLogger>,
): Promise<{ url: string; close(): Promise<void> }> {
  // Loaded only when a demo worker runs: node-llama-cpp alone adds about 40 MiB
  // of RSS to a router that proxies to registered workers.
  if (config.demoEngine === 'llama') {
    try {
      const { buildDemoModel, DEMO_MODEL_FILE, startLlamaWorker } =
        await import('../workers/llama/index.js');
      const { path } = await buildDemoModel(join(config.dataDir, 'models', DEMO_MODEL_FILE));
      return await startLlamaWorker({
        host: '127.0.0.1',
        port: 0,
        modelPath: path,
        modelName,
        contextSize: DEMO_CONTEXT_WINDOW,
        onFailure: (err, requestId) =>
          logger.error(
            { err, request_id: requestId, worker: 'embedded' },
            'demo worker failed a request',
          ),
      });
    } catch (err) {
      logger.warn({ err }, 'llama.cpp demo worker failed to start; using the simulator instead');
    }
  }
  const { startSimWorker } = await import('../workers/sim/server.js');
  return startSimWorker({
    host: '127.0.0.1',
    port: 0,
    model: modelName,
    contextWindow: DEMO_CONTEXT_WINDOW,
  });
}

function printBanner(
  base: string,
  config: Config,
  s: Services,
  demo: DemoInfo | null,
  roles: Set<Role>,
): void {
  const out: string[] = [];
  const everywhere = config.host === '0.0.0.0' || config.host === '::';
  out.push(
    `Switchyard listening on ${base}${everywhere ? ` (bound to ${config.host}: every interface)` : ''} (${config.env} mode, storage: ${s.store.driver}, roles: ${[...roles].join(',')})`,
  );
  if (config.env === 'development') {
    out.push(
      everywhere
        ? 'Development mode: plain HTTP is allowed, on every interface. Set SWITCHYARD_ENV=production to require HTTPS.'
        : 'Development mode: plain HTTP is allowed. Set SWITCHYARD_ENV=production to require HTTPS.',
    );
  }
  // In production stdout is what the log collector keeps: secrets go to files of the
  // data directory (mode 0600) instead, unless a person is reading the terminal.
  const toFile = config.env === 'production' && !process.stdout.isTTY;
  if (roles.has('dashboard')) {
    out.push(`Dashboard: ${base}/login (users and passwords: switchyard admin user create)`);
  }
  if (s.generatedAdminToken) {
    out.push('');
    if (toFile) {
      out.push(
        `Operator token generated; saved to ${join(config.dataDir, ADMIN_TOKEN_FILE)} (mode 0600), not printed.`,
      );
    } else {
      out.push('Operator token (shown once; also saved to the data directory with mode 0600):');
      out.push(`  ${s.generatedAdminToken}`);
    }
  }
  if (demo) {
    const pid = demo.project.externalId;
    const slug = demo.endpoint.slug;
    out.push('');
    out.push(`Demo project: ${pid}   endpoint: ${slug}   model: ${demo.endpoint.modelName}`);
    out.push(`Endpoint base URL: ${base}/${pid}/${slug}/v1`);
    const key = demo.key && !toFile ? demo.key : '<your API key>';
    if (demo.key && toFile) {
      const file = join(config.dataDir, DEMO_KEY_FILE);
      writeFileSync(file, `${demo.key}\n`, { mode: 0o600 });
      out.push('');
      out.push(`Demo API key created; saved to ${file} (mode 0600), not printed.`);
    } else if (demo.key) {
      out.push('');
      out.push('Demo API key (shown once, store it now):');
      out.push(`  ${demo.key}`);
    } else {
      out.push(
        'The demo API key was shown on the first start; create another with `switchyard admin key create`.',
      );
    }
    out.push('');
    out.push('Try it:');
    out.push(`  curl -s ${base}/${pid}/v1/endpoints -H "Authorization: Bearer ${key}"`);
    out.push(
      `  curl -s ${base}/${pid}/${slug}/v1/chat/completions -H "Authorization: Bearer ${key}" \\`,
    );
    out.push(
      `    -H "Content-Type: application/json" -d '{"model":"${demo.endpoint.modelName}","messages":[{"role":"user","content":"Hello"}]}'`,
    );
    out.push('');
    out.push('With the OpenAI SDK (Node):');
    out.push(`  import OpenAI from 'openai';`);
    out.push(
      `  const client = new OpenAI({ baseURL: '${base}/${pid}/${slug}/v1', apiKey: '${key}' });`,
    );
    out.push(
      `  const r = await client.chat.completions.create({ model: '${demo.endpoint.modelName}', messages: [{ role: 'user', content: 'Hello' }] });`,
    );
  }
  process.stdout.write(out.join('\n') + '\n');
}
