/**
 * Prometheus text exposition of the sim engine's state under vLLM's metric names,
 * so the router's load scraping is tested against the names real workers expose.
 * Counters follow vLLM v1 (prefix-cache queries and hits count tokens). Besides
 * them: the load gauges every `switchyard worker` exports under its own names
 * (`switchyard_worker_requests_running`, `_requests_waiting`,
 * `_kv_cache_usage_ratio`), and `switchyard_sim_requests_aborted_total`, which
 * lets tests see that an upstream abort really reached the worker.
 */
import type { SimEngineStats } from './engine.js';

interface Series {
  name: string;
  type: 'gauge' | 'counter';
  help: string;
  value: number;
}

function escapeLabel(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');
}

function num(v: number): string {
  return Number.isInteger(v) ? `${v}.0` : String(v);
}

export function renderMetrics(model: string, s: SimEngineStats): string {
  const label = `{model_name="${escapeLabel(model)}"}`;
  const series: Series[] = [
    {
      name: 'vllm:num_requests_running',
      type: 'gauge',
      help: 'Number of requests in model execution batches.',
      value: s.running,
    },
    {
      name: 'vllm:num_requests_waiting',
      type: 'gauge',
      help: 'Number of requests waiting to be processed.',
      value: s.waiting,
    },
    {
      name: 'vllm:kv_cache_usage_perc',
      type: 'gauge',
      help: 'KV-cache usage. 1 means 100 percent usage.',
      value: s.kvCacheUsage,
    },
    {
      name: 'vllm:prefix_cache_queries_total',
      type: 'counter',
      help: 'Prefix cache queries, in terms of number of queried tokens.',
      value: s.prefixCacheQueries,
    },
    {
      name: 'vllm:prefix_cache_hits_total',
      type: 'counter',
      help: 'Prefix cache hits, in terms of number of cached tokens.',
      value: s.prefixCacheHits,
    },
    {
      name: 'vllm:prompt_tokens_total',
      type: 'counter',
      help: 'Number of prefill tokens processed.',
      value: s.promptTokens,
    },
    {
      name: 'vllm:generation_tokens_total',
      type: 'counter',
      help: 'Number of generation tokens processed.',
      value: s.generationTokens,
    },
    {
      name: 'switchyard_worker_requests_running',
      type: 'gauge',
      help: 'Requests the worker is executing.',
      value: s.running,
    },
    {
      name: 'switchyard_worker_requests_waiting',
      type: 'gauge',
      help: 'Requests queued in the worker, not yet running.',
      value: s.waiting,
    },
    {
      name: 'switchyard_worker_kv_cache_usage_ratio',
      type: 'gauge',
      help: 'KV-cache usage, 0-1.',
      value: s.kvCacheUsage,
    },
    {
      name: 'switchyard_sim_requests_aborted_total',
      type: 'counter',
      help: 'Requests the sim worker stopped because the client went away.',
      value: s.aborted,
    },
  ];
  let out = '';
  for (const m of series) {
    // As prometheus_client's text format (what vLLM serves): HELP and TYPE name the
    // counter with its _total suffix, as its sample does.
    out += `# HELP ${m.name} ${m.help}\n# TYPE ${m.name} ${m.type}\n${m.name}${label} ${num(m.value)}\n`;
  }
  return out;
}
