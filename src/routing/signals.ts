/**
 * Live load signals from a worker's Prometheus `/metrics`: requests running,
 * requests waiting and KV-cache usage, read from whichever family the worker
 * exports. prom-client only writes the text format, so the few lines of
 * parsing live here, pure and table-tested (signals.test.ts).
 *
 * Families, first match wins:
 * - Switchyard (`switchyard worker`): `switchyard_worker_requests_running`,
 *   `switchyard_worker_requests_waiting`, `switchyard_worker_kv_cache_usage_ratio`;
 * - vLLM: `vllm:num_requests_running`, `vllm:num_requests_waiting`,
 *   `vllm:kv_cache_usage_perc` (v1) or `vllm:gpu_cache_usage_perc` (v0), both a 0–1 ratio;
 * - llama.cpp server: `llamacpp:requests_processing`, `llamacpp:requests_deferred`,
 *   `llamacpp:kv_cache_usage_ratio`;
 * - SGLang: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`.
 *
 * Several series of one name (one per served model or engine) are summed for
 * counts and the largest is taken for KV-cache usage.
 */

export interface WorkerSignals {
  /** Requests the worker is executing (in its batch). */
  running: number | null;
  /** Requests queued in the worker, not yet running. */
  waiting: number | null;
  /** KV-cache usage, 0–1. */
  kvCacheUsage: number | null;
  /** When the router scraped them (ms since the epoch, by the router's clock). */
  scrapedAt: number;
  /** Which exporter's names were read. */
  source: SignalSource;
}

export type SignalSource = 'switchyard' | 'vllm' | 'llamacpp' | 'sglang';

/** Sample values by metric name (label sets folded into a list). */
export type Samples = Map<string, number[]>;

/**
 * Parses the Prometheus text exposition format (0.0.4) into samples by name.
 * Comments, blank lines and malformed lines are skipped; labels are not kept.
 */
export function parsePrometheusText(text: string): Samples {
  const out: Samples = new Map();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(line);
    if (!m) continue;
    const name = m[1]!;
    let rest = line.slice(name.length);
    if (rest.startsWith('{')) {
      const end = labelsEnd(rest);
      if (end < 0) continue;
      rest = rest.slice(end + 1);
    }
    const value = parseValue(rest.trim().split(/\s+/)[0]);
    if (value === null) continue;
    const list = out.get(name);
    if (list) list.push(value);
    else out.set(name, [value]);
  }
  return out;
}

/** Index of the `}` closing a label set, honouring quoted values with escapes. */
function labelsEnd(s: string): number {
  let quoted = false;
  for (let i = 1; i < s.length; i++) {
    const c = s[i];
    if (quoted) {
      if (c === '\\') i++;
      else if (c === '"') quoted = false;
    } else if (c === '"') quoted = true;
    else if (c === '}') return i;
  }
  return -1;
}

function parseValue(v: string | undefined): number | null {
  if (v === undefined || v === '') return null;
  if (v === '+Inf') return Infinity;
  if (v === '-Inf') return -Infinity;
  if (v === 'NaN') return null;
  const n = Number(v);
  return Number.isNaN(n) ? null : n;
}

interface Family {
  source: SignalSource;
  running: string;
  waiting: string;
  kv: readonly string[];
}

const FAMILIES: readonly Family[] = [
  {
    source: 'switchyard',
    running: 'switchyard_worker_requests_running',
    waiting: 'switchyard_worker_requests_waiting',
    kv: ['switchyard_worker_kv_cache_usage_ratio'],
  },
  {
    source: 'vllm',
    running: 'vllm:num_requests_running',
    waiting: 'vllm:num_requests_waiting',
    kv: ['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc'],
  },
  {
    source: 'llamacpp',
    running: 'llamacpp:requests_processing',
    waiting: 'llamacpp:requests_deferred',
    kv: ['llamacpp:kv_cache_usage_ratio'],
  },
  {
    source: 'sglang',
    running: 'sglang:num_running_reqs',
    waiting: 'sglang:num_queue_reqs',
    kv: ['sglang:token_usage'],
  },
];

function sum(v: number[] | undefined): number | null {
  if (!v || v.length === 0) return null;
  const s = v.reduce((a, b) => a + b, 0);
  return Number.isFinite(s) && s >= 0 ? s : null;
}

function ratio(v: number[] | undefined): number | null {
  if (!v || v.length === 0) return null;
  // Not `Math.max(...v)`: a page of some 150,000 samples overflows the call stack, and
  // the throw would fail the monitor's whole pass (every worker's health with it).
  const m = v.reduce((a, b) => Math.max(a, b), -Infinity);
  return Number.isFinite(m) && m >= 0 ? Math.min(1, m) : null;
}

/** The load signals in a scrape, or null when it holds none of the known families. */
export function extractSignals(samples: Samples, scrapedAt: number): WorkerSignals | null {
  for (const f of FAMILIES) {
    const running = sum(samples.get(f.running));
    const waiting = sum(samples.get(f.waiting));
    let kvCacheUsage: number | null = null;
    for (const name of f.kv) {
      kvCacheUsage = ratio(samples.get(name));
      if (kvCacheUsage !== null) break;
    }
    if (running === null && waiting === null && kvCacheUsage === null) continue;
    return { running, waiting, kvCacheUsage, scrapedAt, source: f.source };
  }
  return null;
}

/** Where a worker registered as `http://host:port[/prefix]/v1` serves `/metrics`. */
export function metricsUrl(baseUrl: string): string {
  const u = new URL(baseUrl);
  u.pathname = u.pathname.replace(/\/v1\/?$/, '') + '/metrics';
  u.search = '';
  return u.toString();
}
