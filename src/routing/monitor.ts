/**
 * The worker monitor: one loop per router, on the injected clock, every
 * `intervalMs`:
 *
 * 1. Scrape: GET each worker's Prometheus `/metrics` (the origin of its `/v1`
 *    base URL) and store the load signals in the pool (signals.ts). The scrape
 *    is also the health check; a worker without `/metrics` (404) is checked
 *    with `GET <url>/models` instead. A scrape that fails is counted in
 *    `switchyard_worker_scrape_failures_total{reason}`.
 * 2. Health: `failedChecks` consecutive failed checks mark a worker
 *    `unhealthy` (no longer a candidate); one good check re-admits it.
 *    Self-registered workers are also `unhealthy` after `missedHeartbeats`
 *    heartbeat intervals without one, and removed after `expireMs`; after the
 *    database was unreachable (heartbeats could not be recorded) they count from
 *    its return.
 * 3. Provisioning: every endpoint's status, `provisioning_state` and
 *    `provisioned_worker_id` follow its (model, tier) pool
 *    (endpoints/repository.ts `provisioningFor`).
 *
 * Status lives in the database, shared by every router; transitions are
 * written only when they change and announced on the invalidation bus. The
 * circuit breaker (pool.ts) stays per router and reacts to request failures
 * within one request; this loop reacts within a few intervals.
 */
import { request } from '../runtime/http-client.js';
import type { EndpointRepository } from '../endpoints/repository.js';
import type { Clock, Timer } from '../runtime/clock.js';
import type { InvalidationBus } from '../runtime/invalidation.js';
import type { Logger } from '../runtime/logger.js';
import type { Metrics, SCRAPE_FAILURE_REASONS } from '../runtime/metrics.js';
import type { WorkerPool } from './pool.js';
import type { WorkerRecord, WorkerRegistry, WorkerStatus } from './registry.js';
import { extractSignals, metricsUrl, parsePrometheusText } from './signals.js';

export interface MonitorSettings {
  /** Scrape, health-check and sweep period (ms); 0 turns the loop off. */
  intervalMs: number;
  /** Heartbeat period self-registered workers are told to keep (ms). */
  heartbeatMs: number;
  /** Heartbeat periods without one before a self-registered worker is unhealthy. */
  missedHeartbeats: number;
  /** Time without a heartbeat after which a self-registered worker is removed (ms). */
  expireMs: number;
  /** Consecutive failed health checks before a worker is unhealthy. */
  failedChecks: number;
}

/** One HTTP GET: status and body, or a thrown error when the worker is unreachable. */
export type Probe = (url: string, timeoutMs: number) => Promise<{ status: number; body: string }>;

/** The most of a worker's /metrics page the monitor reads. */
const MAX_METRICS_BYTES = 4 << 20;

const httpProbe: Probe = async (url, timeoutMs) => {
  const res = await request(url, {
    method: 'GET',
    headersTimeout: timeoutMs,
    bodyTimeout: timeoutMs,
    // The whole check, too: a page trickling in is never idle for `bodyTimeout`.
    signal: AbortSignal.timeout(timeoutMs),
  });
  if (res.statusCode !== 200) {
    await res.body.dump();
    return { status: res.statusCode, body: '' };
  }
  // A metrics page is small; anything larger is not one and would cost memory. Read
  // no more than the cap: a page that never ends would otherwise hold the pass (every
  // worker's health) for good.
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of res.body) {
    const b = chunk as Buffer;
    chunks.push(b);
    size += b.length;
    if (size >= MAX_METRICS_BYTES) break;
  }
  const body = Buffer.concat(chunks).toString('utf8').slice(0, MAX_METRICS_BYTES);
  return { status: res.statusCode, body };
};

type CheckOutcome = 'ok' | 'unreachable' | 'status';

export class WorkerMonitor {
  private timer: Timer | null = null;
  private running: Promise<void> = Promise.resolve();
  private stopped = true;
  private readonly checkFailures = new Map<string, number>();
  private known: WorkerRecord[] = [];
  /**
   * When the registry could be read again after it could not (or since the first
   * pass); null while it cannot. Heartbeat ages count from no earlier than this.
   */
  private databaseBackAt: number | null = null;

  constructor(
    private readonly d: {
      registry: WorkerRegistry;
      endpoints: EndpointRepository;
      pool: WorkerPool;
      clock: Clock;
      metrics: Metrics;
      logger: Logger;
      bus: InvalidationBus;
      settings: MonitorSettings;
      probe?: Probe;
      /** The upstream connection pools: those of workers no longer listed are closed. */
      upstream?: { retain(workerUrls: Iterable<string>): void };
    },
  ) {
    d.pool.setSignalsMaxAge(Math.max(3 * d.settings.intervalMs, 1));
    d.metrics.setWorkerRows(() =>
      this.known.map((w) => {
        const s = d.pool.signals(w.id);
        return {
          worker: w.id,
          model: w.modelName,
          tier: w.tierId,
          inFlight: d.pool.load(w.id),
          healthy: w.status === 'healthy',
          breakerOpen: d.pool.isOpen(w.id),
          running: s?.running ?? null,
          waiting: s?.waiting ?? null,
          kvCacheUsage: s?.kvCacheUsage ?? null,
        };
      }),
    );
  }

  get settings(): MonitorSettings {
    return this.d.settings;
  }

  /** Runs a first pass now, then one every interval (no-op when the interval is 0). */
  start(): void {
    if (!this.stopped || this.d.settings.intervalMs <= 0) return;
    this.stopped = false;
    this.loop();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.timer?.cancel();
    this.timer = null;
    await this.running;
  }

  /** Resolves when the pass in progress (if any) has finished. */
  settled(): Promise<void> {
    return this.running;
  }

  private loop(): void {
    this.running = this.tick()
      .catch((err: unknown) => this.d.logger.error({ err }, 'worker monitor pass failed'))
      .finally(() => {
        if (this.stopped) return;
        this.timer = this.d.clock.setTimer(this.d.settings.intervalMs, () => this.loop());
      });
  }

  /** One pass: scrape and check every worker, apply health, reconcile endpoints. */
  async tick(): Promise<void> {
    const { registry, logger } = this.d;
    let list: WorkerRecord[];
    try {
      list = await registry.list();
    } catch (err) {
      logger.warn({ err }, 'worker monitor: cannot list workers');
      this.databaseBackAt = null;
      return;
    }
    // Back after an outage: heartbeats could not be written meanwhile, so the return
    // counts as every worker's last heartbeat (they get a full window to send one).
    this.databaseBackAt ??= this.d.clock.now();
    // Workers gone from the registry since the last pass (removed or deregistered, on
    // this instance or another): their live state, breaker and series go too.
    const listed = new Set(list.map((w) => w.id));
    for (const w of this.known) if (!listed.has(w.id)) this.forget(w.id);
    const outcomes = await Promise.all(list.map((w) => this.check(w)));
    let changed = false;
    const now = this.d.clock.now();
    const kept: WorkerRecord[] = [];
    for (let i = 0; i < list.length; i++) {
      const w = list[i]!;
      try {
        const r = await this.apply(w, outcomes[i]!, now);
        changed ||= r !== 'unchanged';
        if (r !== 'removed') kept.push(w);
      } catch (err) {
        logger.warn({ err, worker: w.id }, 'worker monitor: cannot update worker');
        kept.push(w);
      }
    }
    this.known = kept;
    this.d.upstream?.retain(kept.map((w) => w.url));
    if (changed) await this.d.bus.publish('workers', '*');
    await this.reconcile(kept);
  }

  /** Health check and scrape of one worker. */
  private async check(w: WorkerRecord): Promise<CheckOutcome> {
    const { pool, metrics, clock } = this.d;
    const probe = this.d.probe ?? httpProbe;
    const timeoutMs = Math.max(100, Math.min(this.d.settings.intervalMs || 2000, 2000));
    const fail = (reason: (typeof SCRAPE_FAILURE_REASONS)[number]) =>
      metrics.workerScrapeFailures.inc({ worker: w.id, reason });
    let res: { status: number; body: string };
    try {
      res = await probe(metricsUrl(w.url), timeoutMs);
    } catch {
      fail('unreachable');
      return 'unreachable';
    }
    if (res.status === 200) {
      const signals = extractSignals(parsePrometheusText(res.body), clock.now());
      if (signals) pool.setSignals(w.id, signals);
      else fail('no_signals');
      return 'ok';
    }
    fail('status');
    if (res.status >= 500) return 'status';
    // No /metrics (an OpenAI-compatible server without Prometheus): is it up at all?
    try {
      const models = await probe(`${w.url}/models`, timeoutMs);
      return models.status === 200 ? 'ok' : 'status';
    } catch {
      return 'unreachable';
    }
  }

  private async apply(
    w: WorkerRecord,
    outcome: CheckOutcome,
    now: number,
  ): Promise<'unchanged' | 'status' | 'removed'> {
    const { registry, logger, settings } = this.d;
    const fails = outcome === 'ok' ? 0 : (this.checkFailures.get(w.id) ?? 0) + 1;
    if (fails === 0) this.checkFailures.delete(w.id);
    else this.checkFailures.set(w.id, fails);

    let heartbeatOk = true;
    if (w.source === 'registered') {
      const last = Math.max(
        w.lastHeartbeatAt?.getTime() ?? w.createdAt.getTime(),
        this.databaseBackAt ?? 0,
      );
      const age = now - last;
      if (age > settings.expireMs) {
        // Only if still silent: a heartbeat or re-registration since the list keeps it.
        if (await registry.expire(w.id, w.lastHeartbeatAt)) {
          this.forget(w.id);
          logger.warn({ worker: w.id, url: w.url }, 'worker removed: no heartbeat');
          return 'removed';
        }
        return 'unchanged';
      }
      heartbeatOk = age <= settings.heartbeatMs * settings.missedHeartbeats;
    }
    if (w.status === 'draining') return 'unchanged';
    const healthy = heartbeatOk && fails < settings.failedChecks;
    const next = healthy ? 'healthy' : 'unhealthy';
    // Only from the status this pass read: a drain recorded meanwhile stays.
    const from = w.status as WorkerStatus;
    if (next === from || !(await registry.setStatus(w.id, next, from))) return 'unchanged';
    w.status = next;
    if (healthy) logger.info({ worker: w.id }, 'worker healthy again');
    else {
      logger.warn(
        { worker: w.id, url: w.url, failedChecks: fails, heartbeatOk },
        'worker unhealthy',
      );
    }
    return 'status';
  }

  /** Forgets a worker that left the registry (live state, counters, check count). */
  forget(id: string): void {
    this.checkFailures.delete(id);
    this.d.pool.forget(id);
    this.d.metrics.forgetWorker(id);
    this.known = this.known.filter((w) => w.id !== id);
  }

  /** True unless this router's recent health checks of the worker failed. */
  checksOk(id: string): boolean {
    return (this.checkFailures.get(id) ?? 0) < this.d.settings.failedChecks;
  }

  /** Endpoint records follow the pools (after registration, removal or a health change). */
  async reconcile(list?: WorkerRecord[]): Promise<void> {
    const { registry, endpoints, logger, bus } = this.d;
    try {
      const workers = list ?? (await registry.list());
      const pools = new Map<string, { healthy: string[]; registered: number }>();
      for (const w of workers) {
        const key = `${w.modelId}:${w.tierId}`;
        const p = pools.get(key) ?? { healthy: [], registered: 0 };
        p.registered++;
        if (w.status === 'healthy') p.healthy.push(w.id);
        pools.set(key, p);
      }
      if ((await endpoints.reconcileProvisioning(pools)) > 0) await bus.publish('endpoint', '*');
    } catch (err) {
      logger.warn({ err }, 'worker monitor: cannot reconcile endpoint provisioning');
    }
  }
}
