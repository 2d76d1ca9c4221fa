/**
 * Live signals from workers' Prometheus text: vLLM (v1 and v0 names),
 * llama.cpp server, SGLang and Switchyard's own worker (`switchyard worker
 * --engine sim`, scraped for real), and the parser's edge cases.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { extractSignals, metricsUrl, parsePrometheusText } from '../../src/routing/signals.js';
import { startSimWorker } from '../../src/workers/sim/index.js';

const fixture = (name: string) => readFileSync(join(import.meta.dirname, 'fixtures', name), 'utf8');
const AT = 1_790_000_000_000;

describe('worker signals from /metrics', () => {
  it('vLLM v1: running, waiting, kv_cache_usage_perc', () => {
    const s = extractSignals(parsePrometheusText(fixture('vllm-metrics.txt')), AT);
    assert.deepEqual(s, {
      running: 3,
      waiting: 7,
      kvCacheUsage: 0.4213,
      scrapedAt: AT,
      source: 'vllm',
    });
  });

  it('vLLM v0: gpu_cache_usage_perc; several models are summed, KV usage is the largest', () => {
    const s = extractSignals(parsePrometheusText(fixture('vllm-v0-metrics.txt')), AT);
    assert.deepEqual(s, {
      running: 3,
      waiting: 4,
      kvCacheUsage: 0.5,
      scrapedAt: AT,
      source: 'vllm',
    });
  });

  it('llama.cpp server: requests_processing, requests_deferred, kv_cache_usage_ratio', () => {
    const s = extractSignals(parsePrometheusText(fixture('llamacpp-metrics.txt')), AT);
    assert.deepEqual(s, {
      running: 2,
      waiting: 1,
      kvCacheUsage: 0.118896,
      scrapedAt: AT,
      source: 'llamacpp',
    });
  });

  it('SGLang names are read too', () => {
    const text =
      'sglang:num_running_reqs{model_name="m"} 5\nsglang:num_queue_reqs{model_name="m"} 2\nsglang:token_usage{model_name="m"} 0.75\n';
    assert.deepEqual(extractSignals(parsePrometheusText(text), AT), {
      running: 5,
      waiting: 2,
      kvCacheUsage: 0.75,
      scrapedAt: AT,
      source: 'sglang',
    });
  });

  it("the sim worker's real /metrics: Switchyard's own names win over the vLLM ones", async () => {
    const w = await startSimWorker({ model: 'sig' });
    try {
      const res = await fetch(metricsUrl(w.url));
      const text = await res.text();
      assert.match(text, /^switchyard_worker_requests_running\{[^}]*\} 0(\.0)?$/m);
      assert.match(text, /^switchyard_worker_requests_waiting\{[^}]*\} 0(\.0)?$/m);
      assert.match(text, /^switchyard_worker_kv_cache_usage_ratio\{[^}]*\} /m);
      const s = extractSignals(parsePrometheusText(text), AT);
      assert.deepEqual(s, {
        running: 0,
        waiting: 0,
        kvCacheUsage: 0,
        scrapedAt: AT,
        source: 'switchyard',
      });
    } finally {
      await w.close();
    }
  });

  it('no known family: null; malformed lines, NaN and escaped label values are handled', () => {
    assert.equal(extractSignals(parsePrometheusText('foo 1\n'), AT), null);
    const samples = parsePrometheusText(
      [
        '# TYPE x gauge',
        'x{a="has } brace and \\" quote"} 2 1712345678000',
        'x 3',
        'broken{a="1" 4',
        'y NaN',
        'z +Inf',
        '',
      ].join('\n'),
    );
    assert.deepEqual(samples.get('x'), [2, 3]);
    assert.equal(samples.has('broken'), false);
    assert.equal(samples.has('y'), false);
    assert.deepEqual(samples.get('z'), [Infinity]);
    // A KV usage above 1 is capped; negative counts are not signals.
    const s = extractSignals(
      parsePrometheusText('vllm:num_requests_running -1\nvllm:kv_cache_usage_perc 1.3\n'),
      AT,
    );
    assert.deepEqual(s, {
      running: null,
      waiting: null,
      kvCacheUsage: 1,
      scrapedAt: AT,
      source: 'vllm',
    });
  });

  it('a page as large as the monitor reads (4 MiB) of one KV series: read, no throw', () => {
    // One series per line: the most samples a page the monitor keeps can hold.
    const line = 'sglang:token_usage 0.25\n';
    const text = line.repeat(Math.floor((4 << 20) / line.length));
    const s = extractSignals(parsePrometheusText(text), AT);
    assert.deepEqual(s, {
      running: null,
      waiting: null,
      kvCacheUsage: 0.25,
      scrapedAt: AT,
      source: 'sglang',
    });
  });

  it('metrics URL: the origin (and path prefix) of the /v1 base URL', () => {
    assert.equal(metricsUrl('http://10.0.0.5:8000/v1'), 'http://10.0.0.5:8000/metrics');
    assert.equal(metricsUrl('https://gw.example/pool-a/v1/'), 'https://gw.example/pool-a/metrics');
  });
});
