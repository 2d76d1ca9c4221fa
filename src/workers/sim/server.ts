/**
 * The sim worker's HTTP server: the OpenAI wire format as vLLM serves it, on
 * `node:http` directly because it is the benchmark baseline (no framework cost).
 *
 * Routes: `POST /v1/chat/completions` (JSON or SSE), `GET /v1/models`,
 * `GET /health`, `GET /metrics` (Prometheus, vLLM names), and
 * `POST /reset_prefix_cache` (vLLM's, for cold-cache benchmarks). The pooling
 * tasks where vLLM serves them: `POST /v1/embeddings`, `POST /rerank` (also
 * `/v1/rerank`, `/v2/rerank`) and `POST /score` (also `/v1/score`); see pooling.ts.
 *
 * Disconnects: when the response closes before it has finished, the request's
 * abort signal fires; the engine stops at once, frees the slot and counts it in
 * `stats().aborted` (also exported as `switchyard_sim_requests_aborted_total`).
 *
 * Failure injection (`failMode` / `setFailMode`, optionally for the next `times`
 * requests only): `status` answers an error status before any header is sent,
 * `reset` resets the TCP connection without answering, `die-after-tokens` closes the
 * connection after N tokens (mid-stream for SSE, before the body otherwise; on the
 * pooling routes, which produce no tokens, always before the body). The pooling routes
 * take their turn of the fail mode like chat completions.
 */
import { readBody as readBodyWith } from '../http-body.js';
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Tracing } from '../../runtime/tracing.js';
import type { AddressInfo } from 'node:net';
import {
  SimEngine,
  type PreparedRequest,
  type SimEngineOptions,
  type SimEngineStats,
} from './engine.js';
import { simError, type SimHttpError } from './errors.js';
import { renderMetrics } from './metrics.js';
import {
  checkEmbeddings,
  checkRerank,
  checkScore,
  DEFAULT_EMBEDDING_DIM,
  embeddingsResponse,
  rerankResponse,
  scoreResponse,
  type Checked,
  type PoolingMeta,
} from './pooling.js';
import { buildCompletion, StreamFramer, type FinishStyle, type ResponseMeta } from './response.js';
import { hash53 } from './tokenizer.js';
import { parseChatRequest } from './wire.js';

export type FailMode =
  | { kind: 'status'; status?: number; times?: number }
  | { kind: 'reset'; times?: number }
  | { kind: 'die-after-tokens'; tokens: number; times?: number };

export interface SimWorkerOptions extends SimEngineOptions {
  /** OpenTelemetry: a SERVER span per chat completion (see runtime/tracing). */
  tracing?: Tracing | null;
  /** Port to listen on; 0 (default) picks a free one. */
  port?: number;
  /** Default 127.0.0.1. */
  host?: string;
  /** `system_fingerprint` of every response; default `sim-<hash of the config>`. */
  systemFingerprint?: string | null;
  /** Where streams put finish_reason; default `separate` (its own chunk). */
  finishStyle?: FinishStyle;
  failMode?: FailMode | null;
  /** Largest accepted request body. Default 32 MiB. */
  maxBodyBytes?: number;
  /** Size of the embeddings `/v1/embeddings` returns. Default 64. */
  embeddingDim?: number;
}

export interface SimWorkerStats extends SimEngineStats {
  httpRequests: number;
  injectedFailures: number;
}

export interface SimWorker {
  /** Base URL including `/v1`, e.g. `http://127.0.0.1:41234/v1`. */
  url: string;
  port: number;
  /** The HTTP server, for the drain on SIGTERM (workers/drain.ts). */
  server: Server;
  engine: SimEngine;
  stats(): SimWorkerStats;
  setFailMode(mode: FailMode | null): void;
  close(): Promise<void>;
}

export type RequestListener = (req: IncomingMessage, res: ServerResponse) => void;

type PoolingTask = 'embeddings' | 'rerank' | 'score';

/** Where vLLM serves its pooling tasks (the router calls `<worker /v1 URL>/rerank`). */
const POOLING_ROUTES: ReadonlyMap<string, PoolingTask> = new Map([
  ['/v1/embeddings', 'embeddings'],
  ['/rerank', 'rerank'],
  ['/v1/rerank', 'rerank'],
  ['/v2/rerank', 'rerank'],
  ['/score', 'score'],
  ['/v1/score', 'score'],
]);

/** A checked pooling request: its prompt tokens and how to answer it once run. */
interface PoolingJob {
  promptTokens: number;
  /** vLLM's request `priority` (engine.checkPriority). */
  priority: number;
  respond(meta: PoolingMeta): unknown;
}

interface Handler {
  listener: RequestListener;
  stats(): SimWorkerStats;
  setFailMode(mode: FailMode | null): void;
}

function sendJson(res: ServerResponse, status: number, body: unknown, requestId?: string): void {
  const text = JSON.stringify(body);
  const headers: Record<string, string | number> = {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
  };
  if (requestId) headers['x-request-id'] = requestId;
  res.writeHead(status, headers);
  res.end(text);
}

function sendError(res: ServerResponse, e: SimHttpError): void {
  sendJson(res, e.status, e.body);
}

function requestIdOf(req: IncomingMessage): string {
  const h = req.headers['x-request-id'];
  const given = Array.isArray(h) ? h[0] : h;
  if (given) return given.startsWith('chatcmpl-') ? given : `chatcmpl-${given}`;
  return `chatcmpl-${randomUUID().replace(/-/g, '')}`;
}

export function defaultFingerprint(engine: SimEngine): string {
  const o = engine.options;
  const config = `${o.model}|${o.contextWindow}|${o.blockSize}|${o.kvCacheTokens}`;
  return `sim-${hash53(config).toString(16).padStart(14, '0').slice(0, 10)}`;
}

/** Builds the request listener; `startSimWorker` mounts it on a server. */
export function createSimHandler(engine: SimEngine, opts: SimWorkerOptions = {}): Handler {
  const o = engine.options;
  const style = o.errorStyle;
  const fingerprint =
    opts.systemFingerprint === undefined ? defaultFingerprint(engine) : opts.systemFingerprint;
  const finishStyle = opts.finishStyle ?? 'separate';
  const maxBody = opts.maxBodyBytes ?? 32 * 1024 * 1024;
  const createdAt = Math.floor(o.clock.now() / 1000);
  let failMode: FailMode | null = opts.failMode ?? null;
  let failuresLeft = failMode?.times ?? Infinity;
  let httpRequests = 0;
  let injectedFailures = 0;

  const takeFailMode = (): FailMode | null => {
    if (!failMode) return null;
    const mode = failMode;
    if (--failuresLeft <= 0) failMode = null;
    injectedFailures++;
    return mode;
  };

  /**
   * Answers an injected `status` or `reset` failure before the request runs; true if
   * it did (the request is over). `die-after-tokens` is left to the caller.
   */
  const failedBeforeRun = (
    fail: FailMode | null,
    req: IncomingMessage,
    res: ServerResponse,
  ): boolean => {
    if (fail?.kind === 'status') {
      const status = fail.status ?? 500;
      sendError(res, simError(style, status, `sim: injected failure (status ${status})`));
      return true;
    }
    if (fail?.kind === 'reset') {
      req.socket.resetAndDestroy();
      return true;
    }
    return false;
  };

  const modelsBody = () => ({
    object: 'list',
    data: [
      {
        id: o.model,
        object: 'model',
        created: createdAt,
        owned_by: 'switchyard-sim',
        root: o.model,
        parent: null,
        max_model_len: o.contextWindow,
      },
    ],
  });

  async function runUnary(
    res: ServerResponse,
    p: PreparedRequest,
    meta: ResponseMeta,
    signal: AbortSignal,
    dieAfter: number | undefined,
  ): Promise<void> {
    const result = await engine.run(p, {
      signal,
      onStep: dieAfter === undefined ? undefined : (k) => k + 1 < dieAfter,
    });
    if (result.status === 'completed') {
      sendJson(res, 200, buildCompletion(p, result.cachedTokens, meta), meta.id);
    } else if (result.status === 'stopped') {
      res.socket?.end();
    }
  }

  async function runStream(
    res: ServerResponse,
    p: PreparedRequest,
    meta: ResponseMeta,
    signal: AbortSignal,
    dieAfter: number | undefined,
  ): Promise<void> {
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      'x-request-id': meta.id,
    });
    // Headers go out before queueing and prefill, as vLLM's streaming response does.
    res.flushHeaders();
    const includeUsage = p.request.stream_options?.include_usage === true;
    const framer = new StreamFramer(p, meta, finishStyle);
    const result = await engine.run(p, {
      signal,
      onStep: (k) => {
        if (res.destroyed) return false;
        res.write(framer.step(k));
        return dieAfter === undefined || k + 1 < dieAfter;
      },
    });
    if (result.status === 'completed') res.end(framer.end(result.cachedTokens, includeUsage));
    // end(), not destroy(): the tokens already written must reach the client before
    // the connection closes without the stream's terminating chunk.
    else if (result.status === 'stopped') res.socket?.end();
  }

  const embeddingDim = opts.embeddingDim ?? DEFAULT_EMBEDDING_DIM;

  /** A checked request as the job `handlePooling` runs: its prompt size and its answer. */
  function pooled<J extends { promptTokens: number }>(
    c: Checked<J>,
    priority: number,
    respond: (job: J, meta: PoolingMeta) => unknown,
  ): { ok: true; job: PoolingJob } | { ok: false; error: SimHttpError } {
    if (!c.ok) return c;
    const job = c.value;
    return {
      ok: true,
      job: { promptTokens: job.promptTokens, priority, respond: (meta) => respond(job, meta) },
    };
  }

  function checkPooling(task: PoolingTask, body: unknown) {
    const p = engine.checkPriority(
      typeof body === 'object' && body !== null
        ? (body as { priority?: unknown }).priority
        : undefined,
    );
    if (!p.ok) return p;
    if (task === 'embeddings') {
      const c = checkEmbeddings(body, { style, dim: embeddingDim, contextWindow: o.contextWindow });
      return pooled(c, p.priority, (job, meta) => embeddingsResponse(job, embeddingDim, meta));
    }
    if (task === 'rerank') return pooled(checkRerank(body, style), p.priority, rerankResponse);
    return pooled(checkScore(body, style), p.priority, scoreResponse);
  }

  /** The request body as JSON, or null after answering 400 when it is not JSON. */
  function jsonBody(res: ServerResponse, raw: string): { body: unknown } | null {
    try {
      return { body: JSON.parse(raw) as unknown };
    } catch (err) {
      sendError(res, simError(style, 400, `Invalid JSON body: ${(err as Error).message}`));
      return null;
    }
  }

  async function handlePooling(
    task: PoolingTask,
    req: IncomingMessage,
    res: ServerResponse,
    raw: string,
  ): Promise<void> {
    const json = jsonBody(res, raw);
    if (!json) return;
    const { body } = json;
    const model = (body as { model?: unknown } | null)?.model;
    if (o.strictModel && typeof model === 'string' && model !== o.model) {
      sendError(res, simError(style, 404, `The model \`${model}\` does not exist.`, 'model'));
      return;
    }
    const checked = checkPooling(task, body);
    if (!checked.ok) {
      sendError(res, checked.error);
      return;
    }
    const fail = takeFailMode();
    if (failedBeforeRun(fail, req, res)) return;
    if (fail?.kind === 'die-after-tokens') {
      res.socket?.end();
      return;
    }
    const ac = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) ac.abort();
    });
    const result = await engine.runPooling(
      checked.job.promptTokens,
      { signal: ac.signal },
      checked.job.priority,
    );
    if (result.status !== 'completed') return;
    const h = req.headers['x-request-id'];
    const given = Array.isArray(h) ? h[0] : h;
    const id = given ?? randomUUID().replace(/-/g, '');
    const meta: PoolingMeta = { id, created: Math.floor(o.clock.now() / 1000), model: o.model };
    sendJson(res, 200, checked.job.respond(meta), id);
  }

  async function handleChat(req: IncomingMessage, res: ServerResponse, raw: string): Promise<void> {
    const json = jsonBody(res, raw);
    if (!json) return;
    const { body } = json;
    const parsed = parseChatRequest(body);
    if (!parsed.ok) {
      sendError(res, simError(style, 400, parsed.message, parsed.param));
      return;
    }
    const fail = takeFailMode();
    if (failedBeforeRun(fail, req, res)) return;
    const prep = engine.prepare(parsed.request);
    if (!prep.ok) {
      sendError(res, prep.error);
      return;
    }
    const p = prep.prepared;
    const meta: ResponseMeta = {
      id: requestIdOf(req),
      created: Math.floor(o.clock.now() / 1000),
      model: o.model,
      systemFingerprint: fingerprint,
    };
    const dieAfter = fail?.kind === 'die-after-tokens' ? Math.max(0, fail.tokens) : undefined;
    const stream = p.request.stream === true;
    if (dieAfter === 0) {
      if (stream) res.writeHead(200, { 'content-type': 'text/event-stream' }).flushHeaders();
      res.socket?.end();
      return;
    }
    const ac = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) ac.abort();
    });
    if (stream) await runStream(res, p, meta, ac.signal, dieAfter);
    else await runUnary(res, p, meta, ac.signal, dieAfter);
  }

  function readBody(
    req: IncomingMessage,
    res: ServerResponse,
    then: (raw: string) => Promise<void>,
  ): void {
    readBodyWith(
      req,
      res,
      {
        maxBody,
        tooLarge: (r) =>
          sendError(r, simError(style, 413, `Request body exceeds ${maxBody} bytes`)),
        // A bug in the sim must surface as a 500, not an unhandled rejection.
        failed: (r, err) => sendError(r, simError(style, 500, `sim: ${String(err)}`)),
      },
      then,
    );
  }

  const listener: RequestListener = (req, res) => {
    httpRequests++;
    const url = req.url ?? '/';
    const q = url.indexOf('?');
    const path = q < 0 ? url : url.slice(0, q);
    if (req.method === 'POST' && path === '/v1/chat/completions') {
      readBody(req, res, (raw) => handleChat(req, res, raw));
      return;
    }
    const task = req.method === 'POST' ? POOLING_ROUTES.get(path) : undefined;
    if (task) {
      readBody(req, res, (raw) => handlePooling(task, req, res, raw));
      return;
    }
    if (req.method === 'GET' && path === '/health') {
      res.writeHead(200, { 'content-length': 0 }).end();
      return;
    }
    if (req.method === 'GET' && path === '/v1/models') {
      sendJson(res, 200, modelsBody());
      return;
    }
    if (req.method === 'GET' && path === '/metrics') {
      const text = renderMetrics(o.model, engine.stats());
      res.writeHead(200, {
        'content-type': 'text/plain; version=0.0.4; charset=utf-8',
        'content-length': Buffer.byteLength(text),
      });
      res.end(text);
      return;
    }
    if (req.method === 'POST' && path === '/reset_prefix_cache') {
      req.resume();
      engine.resetPrefixCache();
      res.writeHead(200, { 'content-length': 0 }).end();
      return;
    }
    req.resume();
    // FastAPI's body for an unknown route, which is what vLLM answers.
    sendJson(res, 404, { detail: 'Not Found' });
  };

  return {
    listener,
    stats: () => ({ ...engine.stats(), httpRequests, injectedFailures }),
    setFailMode: (mode) => {
      failMode = mode;
      failuresLeft = mode?.times ?? Infinity;
    },
  };
}

/** Starts a sim worker on its own HTTP server. */
export async function startSimWorker(opts: SimWorkerOptions = {}): Promise<SimWorker> {
  const engine = new SimEngine(opts);
  const handler = createSimHandler(engine, opts);
  const server = createServer(
    { keepAlive: true },
    opts.tracing
      ? opts.tracing.wrapListener(handler.listener, { 'switchyard.engine': 'sim' })
      : handler.listener,
  );
  // Benchmarks drive it over pooled keep-alive connections; don't drop idle ones early.
  server.keepAliveTimeout = 60_000;
  const host = opts.host ?? '127.0.0.1';
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 0, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const hostPart = host.includes(':') ? `[${host}]` : host;
  return {
    url: `http://${hostPart}:${port}/v1`,
    port,
    server,
    engine,
    stats: handler.stats,
    setFailMode: handler.setFailMode,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        // Open streams and idle keep-alive sockets would hold close() forever;
        // destroying them also aborts their in-flight generations.
        server.closeAllConnections();
      }),
  };
}
