/**
 * `switchyard worker`: an inference worker speaking the OpenAI wire format.
 * Engines: `sim` (simulator for tests and benchmarks) and `llama` (llama.cpp).
 *
 * `--register <router-url>` with `--token` (or SWITCHYARD_WORKER_TOKEN)
 * registers it with a router and heartbeats (workers/registration.ts); `--tier`,
 * `--advertise-url` (default: the listen URL), `--capacity` and
 * `--scheduling-policy` go with the registration.
 *
 * SIGTERM drains (workers/drain.ts): the router is told to send nothing new, the
 * requests already open finish (at most `--drain-ms`, default
 * SWITCHYARD_WORKER_DRAIN_MS or 30 s), then the worker deregisters and exits 0. A
 * second SIGTERM or SIGINT cuts the wait short. A SIGTERM before the first
 * registration succeeded (the router unreachable yet) stops the retries and exits 0
 * within a second; a registration sent just before it is deregistered if the router
 * answers it within 0.5 s, else abandoned (the router expires it).
 *
 * `--prefill-concurrency N` (sim engine): at most N prefills at once, the others
 * wait in queue order (1 models an engine whose prefills share one compute budget).
 *
 * `--scheduling-policy priority` (sim engine): the waiting queue is ordered by the
 * request's `priority`, lower first, as vLLM's flag of the same name; registered
 * with it, the worker gets a `priority` from the router (routing/prefill-order.ts).
 */
import { existsSync } from 'node:fs';
import type { Server } from 'node:http';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import pino from 'pino';
import { systemClock } from '../runtime/clock.js';
import { createLogger } from '../runtime/logger.js';
import { InFlight, waitForDrain } from '../workers/drain.js';
import {
  RegistrationError,
  RegistrationStopped,
  WorkerRegistration,
} from '../workers/registration.js';
import { startSimWorker } from '../workers/sim/server.js';
import { otlpEndpointFromEnv } from '../config/index.js';
import { TIER_IDS } from '../tiers/index.js';

/** How long SIGTERM waits for the router to acknowledge the drain, and the deregistration. */
const DEREGISTER_WAIT_MS = 3000;
/**
 * The same, for a SIGTERM before the first registration succeeded: the answer to a
 * registration already sent (START_GRACE_MS of it) and its deregistration, so the
 * worker exits within a second.
 */
const UNREGISTERED_STOP_WAIT_MS = 800;
const DEFAULT_DRAIN_MS = 30_000;

/** `p`, or nothing after `ms`: a router that does not answer must not hold the exit. */
function atMost(p: Promise<unknown>, ms: number): Promise<unknown> {
  return Promise.race([p, new Promise<void>((r) => setTimeout(r, ms).unref())]);
}

function num(name: string, raw: string | undefined, def: number): number {
  if (raw === undefined) return def;
  const n = Number(raw);
  if (!Number.isFinite(n) || n < 0) throw new Error(`--${name} must be a non-negative number`);
  return n;
}

const USAGE = `usage: switchyard worker [--engine sim|llama] [--port N] [--host ADDR] [options]

Runs an inference worker speaking the OpenAI wire format on <host>:<port>/v1.

  --engine sim|llama        sim (default): the simulator; llama: llama.cpp in process
  --port N, --host ADDR     where to listen (8000, 127.0.0.1)
  --model NAME|PATH.gguf    llama: the GGUF file (default: the demo model, built on
                            first use); sim: the model name it reports (switchyard-sim);
                            with --register, a model the router knows
  --context-window N        context size in tokens (4096)
  --drain-ms MS             on SIGTERM, how long open requests may finish (30000)
  self-registration:
  --register ROUTER_URL     register with the router and send heartbeats
  --token T                 worker token (SWITCHYARD_WORKER_TOKEN)
  --tier TIER               free|cpu|gpu|self_hosted (cpu)
  --project ID              the project whose own model --model names (needed
                            only when several projects have a model of that name)
  --advertise-url URL/v1    the URL the router should use (default: the listen URL)
  --capacity N              requests at once the router may send
  sim only:
  --ttft-ms MS, --tpot-ms MS            time to first token, per output token (0, 0)
  --max-running N, --kv-cache-tokens N  sequence slots, KV-cache size (256, 131072)
  --scheduling-policy fcfs|priority     queue order (priority: the router's priority)
  --prefill-concurrency N               prefills at once (default: unbounded)
  -h, --help                this text
`;

export async function worker(argv: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseWorkerArgs(argv);
  } catch (err) {
    process.stderr.write(`switchyard worker: ${(err as Error).message}\n\n${USAGE}`);
    return 2;
  }
  const { values } = parsed;
  if (values.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  let drainMs: number;
  try {
    drainMs = num(
      'drain-ms',
      values['drain-ms'] ?? (process.env.SWITCHYARD_WORKER_DRAIN_MS || undefined),
      DEFAULT_DRAIN_MS,
    );
  } catch (err) {
    process.stderr.write(`switchyard worker: ${(err as Error).message}\n`);
    return 2;
  }
  // As the router's registration route: a whole number of requests, at least 1.
  const capacity = values.capacity !== undefined ? Number(values.capacity) : undefined;
  if (capacity !== undefined && !(Number.isSafeInteger(capacity) && capacity >= 1)) {
    process.stderr.write(`switchyard worker: --capacity must be a positive integer\n\n${USAGE}`);
    return 2;
  }
  const token = values.token ?? process.env.SWITCHYARD_WORKER_TOKEN;
  const schedulingPolicy = values['scheduling-policy'];
  if (schedulingPolicy !== 'fcfs' && schedulingPolicy !== 'priority') {
    process.stderr.write('switchyard worker: --scheduling-policy must be fcfs or priority\n');
    return 2;
  }
  if (schedulingPolicy === 'priority' && values.engine === 'llama') {
    process.stderr.write(
      'switchyard worker: the llama engine serves requests in arrival order; --scheduling-policy priority is for sim\n',
    );
    return 2;
  }
  if (values.register) {
    if (!token) {
      process.stderr.write(
        'switchyard worker: --register needs --token or SWITCHYARD_WORKER_TOKEN\n',
      );
      return 2;
    }
    if (!(TIER_IDS as readonly string[]).includes(values.tier)) {
      process.stderr.write(`switchyard worker: --tier must be one of ${TIER_IDS.join(', ')}\n`);
      return 2;
    }
    const adv = values['advertise-url'];
    if (adv === undefined && (values.host === '0.0.0.0' || values.host === '::')) {
      process.stderr.write(
        'switchyard worker: listening on a wildcard address; set --advertise-url\n',
      );
      return 2;
    }
    if (adv !== undefined && !/^https?:\/\/[^/]+(\/.*)?\/v1\/?$/.test(adv)) {
      process.stderr.write('switchyard worker: --advertise-url must be http(s)://…/v1\n');
      return 2;
    }
  }
  // One JSON line per event, as the router logs (pino); written at once, since a
  // worker logs a few lines a lifetime and its failures, not one per request.
  const logger = createLogger(
    process.env.LOG_LEVEL || 'info',
    pino.destination({ dest: 1, sync: true }),
    'switchyard-worker',
  );
  /** Registers when asked, then serves until SIGTERM/SIGINT (draining first). */
  const serve = async (
    w: { url: string; server: Server; close(): Promise<void> },
    model: string,
  ): Promise<number> => {
    const log = (line: string) => logger.info(line);
    const inFlight = new InFlight();
    inFlight.track(w.server);
    let registration: WorkerRegistration | null = null;
    if (values.register) {
      registration = new WorkerRegistration({
        routerUrl: values.register,
        token: token!,
        model,
        ...(values.project ? { project: values.project } : {}),
        tier: values.tier,
        url: (values['advertise-url'] ?? w.url).replace(/\/$/, ''),
        ...(capacity ? { capacity } : {}),
        ...(schedulingPolicy === 'priority' ? { schedulingPolicy } : {}),
        clock: systemClock,
        log,
      });
    }
    let stopping = false;
    let interrupt: () => void = () => undefined;
    const interrupted = new Promise<void>((r) => (interrupt = r));
    const stop = () => {
      if (stopping) {
        interrupt();
        return;
      }
      stopping = true;
      const registered = registration !== null && registration.workerId !== null;
      void (async () => {
        // The router first, so it sends nothing new; then no new connections here.
        if (registration) await atMost(registration.drain(), DEREGISTER_WAIT_MS);
        w.server.close();
        log(`draining: ${inFlight.count} request(s) open, waiting at most ${drainMs} ms`);
        const outcome = await waitForDrain({
          inFlight,
          clock: systemClock,
          deadlineMs: drainMs,
          interrupt: interrupted,
        });
        log(
          outcome === 'idle'
            ? 'drained'
            : `drain ${outcome === 'deadline' ? 'deadline passed' : 'interrupted'}: closing ${inFlight.count} open request(s)`,
        );
        if (registration) {
          const ms = registered ? DEREGISTER_WAIT_MS : UNREGISTERED_STOP_WAIT_MS;
          await atMost(registration.stop(), ms);
        }
        await w.close();
        await stopTracing();
        process.exit(0);
      })();
    };
    // Before the first registration: a SIGTERM while the router is still unreachable
    // stops the retries and exits 0 at once (below, through the same drain).
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
    if (registration) {
      try {
        await registration.start();
      } catch (err) {
        // Stopped while registering: the handler above exits.
        if (stopping && err instanceof RegistrationStopped)
          return new Promise<number>(() => undefined);
        const why = err instanceof RegistrationError ? err.message : String(err);
        process.stderr.write(`switchyard worker: ${why}\n`);
        await w.close();
        await stopTracing();
        return 2;
      }
    }
    return new Promise<number>(() => undefined);
  };
  // OpenTelemetry when an OTLP endpoint is configured (runtime/tracing).
  const otlp = otlpEndpointFromEnv(process.env);
  const tracing = otlp
    ? (await import('../runtime/tracing.js')).Tracing.start({
        endpoint: otlp,
        serviceName: process.env.OTEL_SERVICE_NAME || 'switchyard-worker',
      })
    : null;
  const stopTracing = () =>
    tracing ? tracing.shutdown().catch(() => undefined) : Promise.resolve();
  if (values.engine === 'llama') {
    const { buildDemoModel, DEMO_MODEL_FILE, DEMO_MODEL_NAME, startLlamaWorker } =
      await import('../workers/llama/index.js');
    let modelPath = values.model;
    if (modelPath !== undefined && !existsSync(modelPath)) {
      process.stderr.write(`switchyard worker: --model: no GGUF file at ${resolve(modelPath)}\n`);
      return 2;
    }
    let modelName: string | undefined;
    if (!modelPath) {
      // No GGUF given: serve the demo model the project builds from its own corpus.
      const dir = resolve(process.env.SWITCHYARD_DATA_DIR || './data', 'models');
      modelPath = (await buildDemoModel(join(dir, DEMO_MODEL_FILE))).path;
      modelName = DEMO_MODEL_NAME;
    }
    const w = await startLlamaWorker({
      host: values.host,
      port: num('port', values.port, 8000),
      modelPath,
      tracing,
      onFailure: (err, requestId) => logger.error({ err, request_id: requestId }, 'request failed'),
      ...(modelName ? { modelName } : {}),
      ...(values['context-window']
        ? { contextSize: num('context-window', values['context-window'], 4096) }
        : {}),
    });
    process.stdout.write(`switchyard worker (llama) serving ${w.url}\n`);
    return serve(w, w.engine.info().modelName);
  }
  if (values.engine !== 'sim') {
    process.stderr.write(`switchyard worker: unknown engine '${values.engine}' (sim|llama)\n`);
    return 2;
  }
  const w = await startSimWorker({
    host: values.host,
    port: num('port', values.port, 8000),
    model: values.model ?? 'switchyard-sim',
    ttftMs: num('ttft-ms', values['ttft-ms'], 0),
    tpotMs: num('tpot-ms', values['tpot-ms'], 0),
    contextWindow: num('context-window', values['context-window'], 4096),
    ...(values['max-running']
      ? { maxRunning: num('max-running', values['max-running'], 256) }
      : {}),
    ...(values['kv-cache-tokens']
      ? { kvCacheTokens: num('kv-cache-tokens', values['kv-cache-tokens'], 131_072) }
      : {}),
    schedulingPolicy,
    ...(values['prefill-concurrency']
      ? {
          prefillConcurrency: Math.max(
            1,
            Math.floor(num('prefill-concurrency', values['prefill-concurrency'], 1)),
          ),
        }
      : {}),
    tracing,
  });
  process.stdout.write(`switchyard worker (sim) serving ${w.url}\n`);
  return serve(w, values.model ?? 'switchyard-sim');
}

function parseWorkerArgs(argv: string[]) {
  return parseArgs({
    args: argv,
    options: {
      engine: { type: 'string', default: 'sim' },
      port: { type: 'string', default: '8000' },
      host: { type: 'string', default: '127.0.0.1' },
      model: { type: 'string' },
      'ttft-ms': { type: 'string' },
      'tpot-ms': { type: 'string' },
      'context-window': { type: 'string' },
      'max-running': { type: 'string' },
      'kv-cache-tokens': { type: 'string' },
      register: { type: 'string' },
      token: { type: 'string' },
      tier: { type: 'string', default: 'cpu' },
      project: { type: 'string' },
      'advertise-url': { type: 'string' },
      capacity: { type: 'string' },
      'scheduling-policy': { type: 'string', default: 'fcfs' },
      'prefill-concurrency': { type: 'string' },
      'drain-ms': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
}
