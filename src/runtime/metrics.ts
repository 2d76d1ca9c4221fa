/**
 * Prometheus metrics (`GET /metrics`). One registry per service instance (so
 * in-process test servers do not share counters). Labels use route patterns,
 * never raw URLs, so cardinality stays bounded.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export class Metrics {
  readonly registry = new Registry();
  readonly httpRequests = new Counter({
    name: 'switchyard_http_requests_total',
    help: 'HTTP requests by route pattern, method and status.',
    labelNames: ['route', 'method', 'status'] as const,
    registers: [this.registry],
  });
  readonly httpDuration = new Histogram({
    name: 'switchyard_http_request_duration_seconds',
    help: 'Time to the response being sent (streams: to the end of the stream).',
    labelNames: ['route', 'status'] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    registers: [this.registry],
  });
  readonly limiterDecisions = new Counter({
    name: 'switchyard_limiter_decisions_total',
    help: 'Limiter decisions: admitted, refused, or error (backend unavailable).',
    labelNames: ['scope', 'outcome'] as const,
    registers: [this.registry],
  });
  readonly webhookAttempts = new Counter({
    name: 'switchyard_webhook_attempts_total',
    help: 'Webhook delivery attempts by outcome.',
    labelNames: ['outcome'] as const,
    registers: [this.registry],
  });
  readonly usageBuffered = new Gauge({
    name: 'switchyard_usage_records_buffered',
    help: 'Usage records waiting to be written.',
    registers: [this.registry],
  });

  // Per worker (label `worker` = worker id; bounded by the registry's size).
  readonly workerRequests = new Counter({
    name: 'switchyard_worker_requests_total',
    help: 'Requests sent to a worker (each failover attempt counts).',
    labelNames: ['worker'] as const,
    registers: [this.registry],
  });
  readonly workerErrors = new Counter({
    name: 'switchyard_worker_errors_total',
    help: 'Worker failures before the first byte (connection refused or reset, 5xx).',
    labelNames: ['worker'] as const,
    registers: [this.registry],
  });
  readonly workerChosen = new Counter({
    name: 'switchyard_worker_chosen_total',
    help: 'Times the router picked a worker for a request or a failover.',
    labelNames: ['worker'] as const,
    registers: [this.registry],
  });
  readonly workerScrapeFailures = new Counter({
    name: 'switchyard_worker_scrape_failures_total',
    help: "Failed scrapes of a worker's /metrics by reason (unreachable, status, no_signals).",
    labelNames: ['worker', 'reason'] as const,
    registers: [this.registry],
  });
  private workerRows: () => WorkerGaugeRow[] = () => [];
  private readonly workerGauges = (() => {
    const gauge = (name: string, help: string, pick: (r: WorkerGaugeRow) => number | null) => {
      const rows = () => this.workerRows();
      return new Gauge({
        name,
        help,
        labelNames: ['worker', 'model', 'tier'] as const,
        registers: [this.registry],
        collect() {
          // Rebuilt on every scrape so removed workers leave no stale series.
          this.reset();
          for (const r of rows()) {
            const v = pick(r);
            if (v !== null) this.set({ worker: r.worker, model: r.model, tier: r.tier }, v);
          }
        },
      });
    };
    return [
      gauge(
        'switchyard_worker_in_flight',
        'Requests in flight from this router.',
        (r) => r.inFlight,
      ),
      gauge(
        'switchyard_worker_healthy',
        'Worker health: 1 healthy (a routing candidate), 0 unhealthy or draining.',
        (r) => (r.healthy ? 1 : 0),
      ),
      gauge(
        'switchyard_worker_breaker_open',
        "1 while the worker's circuit breaker is open.",
        (r) => (r.breakerOpen ? 1 : 0),
      ),
      gauge(
        'switchyard_worker_queue_depth',
        'Requests waiting in the worker (its last scraped /metrics).',
        (r) => r.waiting,
      ),
      gauge(
        'switchyard_worker_running',
        'Requests running in the worker (its last scraped /metrics).',
        (r) => r.running,
      ),
      gauge(
        'switchyard_worker_kv_cache_usage',
        'KV-cache usage of the worker, 0-1 (its last scraped /metrics).',
        (r) => r.kvCacheUsage,
      ),
    ];
  })();

  /** The source of the per-worker gauges (the worker monitor sets it). */
  setWorkerRows(rows: () => WorkerGaugeRow[]): void {
    this.workerRows = rows;
  }

  /** Drops a removed worker's counters. */
  forgetWorker(id: string): void {
    for (const c of [this.workerRequests, this.workerErrors, this.workerChosen]) {
      c.remove({ worker: id });
    }
    for (const reason of SCRAPE_FAILURE_REASONS) {
      this.workerScrapeFailures.remove({ worker: id, reason });
    }
  }

  constructor(opts: { defaults?: boolean } = {}) {
    if (opts.defaults) collectDefaultMetrics({ register: this.registry, prefix: 'switchyard_' });
    void this.workerGauges;
  }
}

export const SCRAPE_FAILURE_REASONS = ['unreachable', 'status', 'no_signals'] as const;

export interface WorkerGaugeRow {
  worker: string;
  model: string;
  tier: string;
  inFlight: number;
  healthy: boolean;
  breakerOpen: boolean;
  running: number | null;
  waiting: number | null;
  kvCacheUsage: number | null;
}
