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
  readonly memoryTrims = new Counter({
    name: 'switchyard_memory_trims_total',
    help: 'Times freed native memory was returned to the system after load (malloc_trim).',
    registers: [this.registry],
  });
  readonly memoryTrimReleased = new Counter({
    name: 'switchyard_memory_trim_released_bytes_total',
    help: 'Resident memory given back by those trims (RSS before minus after).',
    registers: [this.registry],
  });
  readonly usageDropped = new Counter({
    name: 'switchyard_usage_records_dropped_total',
    help: 'Usage records dropped unwritten because the buffer was full (a long database outage).',
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
  readonly workerPriorityClass = new Counter({
    name: 'switchyard_worker_priority_class_total',
    help: 'Requests sent a priority-scheduling worker, by queue class: warm, cold, or follow (a warm request queued after the prefill its hit waits for).',
    labelNames: ['worker', 'class'] as const,
    registers: [this.registry],
  });
  readonly workerScrapeFailures = new Counter({
    name: 'switchyard_worker_scrape_failures_total',
    help: "Failed scrapes of a worker's /metrics by reason (unreachable, status, no_signals).",
    labelNames: ['worker', 'reason'] as const,
    registers: [this.registry],
  });
  readonly workerTtft = new Histogram({
    name: 'switchyard_worker_ttft_seconds',
    help: 'Time to first token of streamed requests, by worker.',
    labelNames: ['worker'] as const,
    buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [this.registry],
  });
  readonly workerTpot = new Histogram({
    name: 'switchyard_worker_tpot_seconds',
    help: 'Mean time per output token after the first, of streamed requests, by worker.',
    labelNames: ['worker'] as const,
    buckets: [0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1],
    registers: [this.registry],
  });
  readonly workerPromptTokens = new Counter({
    name: 'switchyard_worker_prompt_tokens_total',
    help: 'Prompt tokens of completed requests, by worker (cache-hit ratio: cached ÷ prompt).',
    labelNames: ['worker'] as const,
    registers: [this.registry],
  });
  readonly workerCachedTokens = new Counter({
    name: 'switchyard_worker_cached_tokens_total',
    help: 'Prompt tokens the worker reported served from its prefix cache (`cached_tokens`).',
    labelNames: ['worker'] as const,
    registers: [this.registry],
  });
  readonly endpointRequests = new Counter({
    name: 'switchyard_endpoint_requests_total',
    help: 'Chat completions by endpoint id and outcome (completed, error, timeout, cancelled).',
    labelNames: ['endpoint', 'outcome'] as const,
    registers: [this.registry],
  });
  readonly endpointTtft = new Histogram({
    name: 'switchyard_endpoint_ttft_seconds',
    help: 'Time to first token of streamed requests, by endpoint id.',
    labelNames: ['endpoint'] as const,
    buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [this.registry],
  });
  readonly endpointPromptTokens = new Counter({
    name: 'switchyard_endpoint_prompt_tokens_total',
    help: 'Prompt tokens of completed requests, by endpoint id.',
    labelNames: ['endpoint'] as const,
    registers: [this.registry],
  });
  readonly endpointCachedTokens = new Counter({
    name: 'switchyard_endpoint_cached_tokens_total',
    help: 'Cached prompt tokens of completed requests, by endpoint id.',
    labelNames: ['endpoint'] as const,
    registers: [this.registry],
  });
  private queueRows: () => Array<{ model: string; tier: string; depth: number }> = () => [];
  readonly routerQueueDepth = (() => {
    const rows = () => this.queueRows();
    return new Gauge({
      name: 'switchyard_router_queue_depth',
      help: "Requests waiting in the router's queue for a worker, by model and tier.",
      labelNames: ['model', 'tier'] as const,
      registers: [this.registry],
      collect() {
        this.reset();
        for (const r of rows()) this.set({ model: r.model, tier: r.tier }, r.depth);
      },
    });
  })();

  setQueueDepth(rows: () => Array<{ model: string; tier: string; depth: number }>): void {
    this.queueRows = rows;
  }

  private indexStats: () => {
    observations: number;
    meanAbsErrorTokens: number;
    meanErrorTokens: number;
  } | null = () => null;
  readonly prefixIndexError = (() => {
    const stats = () => this.indexStats();
    return new Gauge({
      name: 'switchyard_prefix_index_error_tokens',
      help:
        "Prefix index vs the workers' reported cached_tokens, per request since start: " +
        'stat="mean_abs" (mean absolute error) or "mean" (> 0: the index is optimistic).',
      labelNames: ['stat'] as const,
      registers: [this.registry],
      collect() {
        this.reset();
        const s = stats();
        if (!s || s.observations === 0) return;
        this.set({ stat: 'mean_abs' }, s.meanAbsErrorTokens);
        this.set({ stat: 'mean' }, s.meanErrorTokens);
      },
    });
  })();

  /** The source of the prefix-index accuracy gauge (the worker pool sets it). */
  setIndexStats(
    f: () => { observations: number; meanAbsErrorTokens: number; meanErrorTokens: number } | null,
  ): void {
    this.indexStats = f;
  }

  /** A completed request's observations, per worker. */
  observeWorker(
    worker: string,
    o: { ttftMs?: number; tpotMs?: number; promptTokens?: number; cachedTokens?: number },
  ): void {
    if (o.ttftMs !== undefined) this.workerTtft.observe({ worker }, o.ttftMs / 1000);
    if (o.tpotMs !== undefined) this.workerTpot.observe({ worker }, o.tpotMs / 1000);
    if (o.promptTokens) this.workerPromptTokens.inc({ worker }, o.promptTokens);
    if (o.cachedTokens) this.workerCachedTokens.inc({ worker }, o.cachedTokens);
  }

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
    for (const c of [
      this.workerRequests,
      this.workerErrors,
      this.workerChosen,
      this.workerPromptTokens,
      this.workerCachedTokens,
    ]) {
      c.remove({ worker: id });
    }
    this.workerTtft.remove({ worker: id });
    this.workerTpot.remove({ worker: id });
    for (const cls of PRIORITY_CLASSES) this.workerPriorityClass.remove({ worker: id, class: cls });
    for (const reason of SCRAPE_FAILURE_REASONS) {
      this.workerScrapeFailures.remove({ worker: id, reason });
    }
  }

  constructor(opts: { defaults?: boolean } = {}) {
    if (opts.defaults) collectDefaultMetrics({ register: this.registry, prefix: 'switchyard_' });
    void this.workerGauges;
    void this.routerQueueDepth;
    void this.prefixIndexError;
  }
}

export const SCRAPE_FAILURE_REASONS = ['unreachable', 'status', 'no_signals'] as const;

/** The queue classes of routing/prefill-order.ts. */
export const PRIORITY_CLASSES = ['warm', 'cold', 'follow'] as const;

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
