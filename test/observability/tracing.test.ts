/**
 * OpenTelemetry traces across router → worker: with an OTLP endpoint set, a
 * chat completion yields one trace: the router's SERVER span (continuing the
 * caller's `traceparent`), its CLIENT span for the upstream call, and the
 * worker's SERVER span under that CLIENT span, exported as OTLP/HTTP JSON to
 * the configured collector. Without an endpoint no trace header leaves the router.
 */
import assert from 'node:assert/strict';
import {
  createServer,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from 'node:http';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { Tracing } from '../../src/runtime/tracing.js';
import { inferenceFixture, type InferenceFixture } from '../support/inference.js';

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  kind: number;
  attributes: { key: string; value: Record<string, unknown> }[];
}

/** A minimal OTLP/HTTP collector: stores the spans of every JSON export. */
async function collector(): Promise<{ url: string; spans: OtlpSpan[]; server: Server }> {
  const spans: OtlpSpan[] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      assert.equal(req.url, '/v1/traces');
      const doc = JSON.parse(body) as {
        resourceSpans: {
          resource: { attributes: OtlpSpan['attributes'] };
          scopeSpans: { spans: OtlpSpan[] }[];
        }[];
      };
      for (const rs of doc.resourceSpans) {
        const service = rs.resource.attributes.find((a) => a.key === 'service.name');
        for (const ss of rs.scopeSpans) {
          for (const s of ss.spans) {
            s.attributes.push({ key: 'test.service', value: service?.value ?? {} });
            spans.push(s);
          }
        }
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as { port: number };
  return { url: `http://127.0.0.1:${port}`, spans, server };
}

const attr = (s: OtlpSpan, key: string) => {
  const v = s.attributes.find((a) => a.key === key)?.value;
  return v ? Object.values(v)[0] : undefined;
};

describe('OpenTelemetry traces', () => {
  let col: Awaited<ReturnType<typeof collector>>;
  let workerTracing: Tracing;
  let f: InferenceFixture;

  before(async () => {
    col = await collector();
    workerTracing = Tracing.start({ endpoint: col.url, serviceName: 'test-worker' })!;
    f = await inferenceFixture({
      env: { SWITCHYARD_OTLP_ENDPOINT: col.url, OTEL_SERVICE_NAME: 'test-router' },
      sim: { tracing: workerTracing },
    });
  });
  after(async () => {
    await f?.close();
    await workerTracing?.shutdown();
    await new Promise((r) => col.server.close(r));
  });

  it('one trace from the caller through the router to the worker', async () => {
    const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
    const callerSpan = '00f067aa0ba902b7';
    const client = new OpenAI({ apiKey: f.key, baseURL: f.baseURL, maxRetries: 0 });
    const res = await client.chat.completions
      .create(
        { model: 'x', messages: [{ role: 'user', content: 'hello' }], max_tokens: 4 },
        { headers: { traceparent: `00-${traceId}-${callerSpan}-01` } },
      )
      .withResponse();
    assert.equal(res.response.status, 200);
    await f.server.services.tracing!.flush();
    await workerTracing.flush();

    const inTrace = col.spans.filter((s) => s.traceId === traceId);
    const server = inTrace.find((s) => attr(s, 'test.service') === 'test-router' && s.kind === 2);
    const upstream = inTrace.find((s) => attr(s, 'test.service') === 'test-router' && s.kind === 3);
    const worker = inTrace.find((s) => attr(s, 'test.service') === 'test-worker');
    assert.ok(
      server && upstream && worker,
      `spans: ${JSON.stringify(col.spans.map((s) => s.name))}`,
    );
    assert.equal(server.parentSpanId, callerSpan);
    assert.equal(upstream.parentSpanId, server.spanId);
    assert.equal(worker.parentSpanId, upstream.spanId);
    assert.equal(attr(server, 'http.response.status_code'), 200);
    assert.equal(attr(server, 'switchyard.request_id'), res.response.headers.get('x-request-id'));
    assert.equal(
      attr(server, 'switchyard.worker.id'),
      res.response.headers.get('x-service-worker-id'),
    );
    assert.equal(attr(worker, 'http.response.status_code'), 200);
  });

  it('a streamed request: its SERVER span names the worker too', async () => {
    const traceId = '5bf92f3577b34da6a3ce929d0e0e4736';
    const client = new OpenAI({ apiKey: f.key, baseURL: f.baseURL, maxRetries: 0 });
    const { data, response } = await client.chat.completions
      .create(
        { model: 'x', messages: [{ role: 'user', content: 'hello' }], max_tokens: 4, stream: true },
        { headers: { traceparent: `00-${traceId}-00f067aa0ba902b7-01` } },
      )
      .withResponse();
    for await (const _ of data) void _;
    await f.server.services.tracing!.flush();
    const server = col.spans.find(
      (s) => s.traceId === traceId && attr(s, 'test.service') === 'test-router' && s.kind === 2,
    );
    assert.ok(server);
    assert.equal(attr(server, 'switchyard.worker.id'), response.headers.get('x-service-worker-id'));
  });

  it('a refused request is traced with its status', async () => {
    const r = await fetch(`${f.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${f.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'x', messages: [], temperature: 9 }),
    });
    assert.equal(r.status, 400);
    await f.server.services.tracing!.flush();
    const id = r.headers.get('x-request-id');
    const span = col.spans.find((s) => attr(s, 'switchyard.request_id') === id);
    assert.ok(span);
    assert.equal(attr(span, 'http.response.status_code'), 400);
  });
});

describe('without an OTLP endpoint', () => {
  it('sends no trace context upstream', async () => {
    const seen: IncomingHttpHeaders[] = [];
    // A stand-in for the worker's tracing that only records what arrives.
    const recorder = {
      wrapListener:
        (l: (req: IncomingMessage, res: ServerResponse) => void) =>
        (req: IncomingMessage, res: ServerResponse) => {
          seen.push(req.headers);
          l(req, res);
        },
    } as unknown as Tracing;
    const f = await inferenceFixture({ sim: { tracing: recorder } });
    try {
      assert.equal(f.server.services.tracing, null);
      const client = new OpenAI({ apiKey: f.key, baseURL: f.baseURL, maxRetries: 0 });
      await client.chat.completions.create(
        { model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
        { headers: { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' } },
      );
      assert.equal(seen.length, 1);
      assert.equal(seen[0]!.traceparent, undefined);
    } finally {
      await f.close();
    }
  });
});
