/**
 * OpenTelemetry traces, on only when an OTLP endpoint is configured
 * (`SWITCHYARD_OTLP_ENDPOINT`, or the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
 * / `OTEL_EXPORTER_OTLP_ENDPOINT`). Spans go to `<endpoint>/v1/traces` as
 * OTLP/HTTP JSON in batches, off the request path.
 *
 * One trace per inference request across processes: the router's SERVER span
 * continues a caller's `traceparent` if it sent one; its CLIENT span covers the
 * upstream call and is propagated to the worker in `traceparent` (W3C Trace
 * Context); `switchyard worker` continues it with its own SERVER span. Any
 * OpenTelemetry-instrumented engine (vLLM, SGLang) does the same.
 *
 * No global registration and no async-context manager: spans are passed
 * explicitly, so with tracing off the request path pays one null check. This
 * module (and the OpenTelemetry SDK) is imported only when tracing is on.
 */
import {
  context as otelContext,
  SpanKind,
  SpanStatusCode,
  trace,
  type Attributes,
  type Context,
  type Span,
  type Tracer,
} from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { IncomingMessage, ServerResponse } from 'node:http';

export type { Span } from '@opentelemetry/api';

const propagator = new W3CTraceContextPropagator();

type Carrier = Record<string, string | string[] | undefined>;

const getter = {
  keys: (c: Carrier) => Object.keys(c),
  get: (c: Carrier, key: string) => {
    const v = c[key.toLowerCase()];
    return Array.isArray(v) ? v[0] : v;
  },
};

const setter = {
  set: (c: Record<string, string>, key: string, value: string) => {
    c[key] = value;
  },
};

export class Tracing {
  private readonly tracer: Tracer;

  private constructor(
    private readonly provider: BasicTracerProvider,
    serviceName: string,
  ) {
    this.tracer = provider.getTracer(serviceName);
  }

  /** Null when no endpoint is configured: callers skip all tracing work. */
  static start(opts: { endpoint: string | undefined; serviceName: string }): Tracing | null {
    if (!opts.endpoint) return null;
    const url =
      opts.endpoint.replace(/\/+$/, '') + (/\/v1\/traces$/.test(opts.endpoint) ? '' : '/v1/traces');
    const exporter = new OTLPTraceExporter({ url });
    const provider = new BasicTracerProvider({
      resource: resourceFromAttributes({ 'service.name': opts.serviceName }),
      spanProcessors: [
        new BatchSpanProcessor(exporter, {
          scheduledDelayMillis: 1000,
          maxQueueSize: 8192,
          maxExportBatchSize: 512,
        }),
      ],
    });
    return new Tracing(provider, opts.serviceName);
  }

  /** A SERVER span continuing the caller's `traceparent`, if any. */
  serverSpan(name: string, headers: Carrier, attributes: Attributes = {}): Span {
    const parent = propagator.extract(otelContext.active(), headers, getter);
    return this.tracer.startSpan(name, { kind: SpanKind.SERVER, attributes }, parent);
  }

  /** A CLIENT span under `parent`; `inject` adds its `traceparent` to outgoing headers. */
  clientSpan(name: string, parent: Span, attributes: Attributes = {}): Span {
    return this.tracer.startSpan(
      name,
      { kind: SpanKind.CLIENT, attributes },
      trace.setSpan(otelContext.active(), parent),
    );
  }

  /** The W3C headers that make `span` the parent of the receiver's spans. */
  inject(span: Span, headers: Record<string, string>): Record<string, string> {
    const ctx: Context = trace.setSpan(otelContext.active(), span);
    propagator.inject(ctx, headers, setter);
    return headers;
  }

  /** Ends a span with the HTTP status it answered (errors for 5xx, as the conventions say). */
  end(span: Span, status: number, attributes: Attributes = {}): void {
    span.setAttributes({ 'http.response.status_code': status, ...attributes });
    if (status >= 500) span.setStatus({ code: SpanStatusCode.ERROR });
    span.end();
  }

  /** A worker's HTTP listener with a SERVER span per chat completion, continuing the router's `traceparent`. */
  wrapListener(
    listener: (req: IncomingMessage, res: ServerResponse) => void,
    attributes: Attributes = {},
  ): (req: IncomingMessage, res: ServerResponse) => void {
    return (req, res) => {
      if (req.method === 'POST' && req.url?.endsWith('/chat/completions')) {
        const span = this.serverSpan('worker chat.completions', req.headers, {
          'http.request.method': 'POST',
          'url.path': req.url,
          ...attributes,
        });
        res.once('close', () => this.end(span, res.statusCode));
      }
      listener(req, res);
    };
  }

  /** Exports every ended span now (tests; shutdown does it too). */
  async flush(): Promise<void> {
    await this.provider.forceFlush();
  }

  async shutdown(): Promise<void> {
    await this.provider.shutdown();
  }
}
