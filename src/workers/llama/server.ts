/**
 * The llama worker's HTTP server: the OpenAI wire format as llama.cpp's server and
 * vLLM speak it, on `node:http` (one route set, no framework on the token path).
 *
 * Routes
 * - `POST /v1/chat/completions`: JSON, or SSE when `stream` is true: `data: {chunk}`
 *   events (a role delta per choice, content / tool-call deltas with their logprobs, a
 *   finish chunk per choice, a `choices: []` usage chunk when
 *   `stream_options.include_usage`), then `data: [DONE]`. Headers go out once the
 *   request is validated and holds a slot, so a bad request or a full queue still gets
 *   a proper status; a failure after that is sent as `data: {"error": …}`.
 * - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus, llama.cpp's names:
 *   `llamacpp:requests_processing`, `llamacpp:requests_deferred`,
 *   `llamacpp:kv_cache_usage_ratio`, token counters and throughputs).
 *
 * Errors use the spec's envelope `{error: {message, type, code, param}}` from
 * `ServiceError`. A client that disconnects aborts its generation at once (the
 * response's `close` fires before it finished) and frees the slot.
 */
import { readBody as readBodyWith } from '../http-body.js';
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Tracing } from '../../runtime/tracing.js';
import type { AddressInfo } from 'node:net';
import { ServiceError } from '../../errors/index.js';
import {
  LlamaEngine,
  type CompletionResult,
  type EngineEvent,
  type EngineStats,
  type LlamaEngineOptions,
} from './engine.js';
import {
  parseChatRequest,
  type ChatCompletion,
  type ChatCompletionChunk,
  type ChatRequest,
  type ChunkChoice,
  type Usage,
} from './wire.js';

export interface LlamaWorkerOptions extends LlamaEngineOptions {
  /** OpenTelemetry: a SERVER span per chat completion (see runtime/tracing). */
  tracing?: Tracing | null;
  /** Default 127.0.0.1. */
  host?: string;
  /** 0 (default) picks a free port. */
  port?: number;
  /** Largest accepted request body. Default 32 MiB. */
  maxBodyBytes?: number;
  /**
   * Told of every failure that is the worker's own (a 5xx answered, or a stream ended
   * by an error after its headers), with the request's id: the client sees only the
   * envelope, so this is where an operator finds the cause. Absent: not logged.
   */
  onFailure?: (err: unknown, requestId: string | undefined) => void;
}

export interface LlamaWorker {
  /** Base URL including `/v1`, e.g. `http://127.0.0.1:41234/v1`. */
  url: string;
  port: number;
  /** The HTTP server, for the drain on SIGTERM (workers/drain.ts). */
  server: Server;
  engine: LlamaEngine;
  close(): Promise<void>;
}

export type RequestListener = (req: IncomingMessage, res: ServerResponse) => void;

function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

function toServiceError(err: unknown): ServiceError {
  if (err instanceof ServiceError) return err;
  return new ServiceError('internal_error', {
    message: `llama worker: ${err instanceof Error ? err.message : String(err)}`,
    cause: err,
  });
}

function sendError(res: ServerResponse, err: unknown, requestId?: string): void {
  const e = toServiceError(err);
  const headers: Record<string, string> = { ...e.headers };
  if (requestId) headers['x-request-id'] = requestId;
  sendJson(res, e.status, e.toEnvelope(), headers);
}

function requestIdOf(req: IncomingMessage): string {
  const h = req.headers['x-request-id'];
  const given = Array.isArray(h) ? h[0] : h;
  if (given) return given.startsWith('chatcmpl-') ? given : `chatcmpl-${given}`;
  return `chatcmpl-${randomUUID().replace(/-/g, '')}`;
}

function num(v: number): string {
  return Number.isInteger(v) ? `${v}` : v.toPrecision(6);
}

/** Prometheus text exposition under llama.cpp server's metric names (plus our own). */
export function renderMetrics(s: EngineStats): string {
  const series: Array<[name: string, type: 'counter' | 'gauge', help: string, value: number]> = [
    [
      'llamacpp:prompt_tokens_total',
      'counter',
      'Number of prompt tokens processed.',
      s.promptTokensTotal,
    ],
    ['llamacpp:prompt_seconds_total', 'counter', 'Prompt process time.', s.promptSecondsTotal],
    [
      'llamacpp:tokens_predicted_total',
      'counter',
      'Number of generation tokens processed.',
      s.predictedTokensTotal,
    ],
    [
      'llamacpp:tokens_predicted_seconds_total',
      'counter',
      'Predict process time.',
      s.predictedSecondsTotal,
    ],
    [
      'llamacpp:prompt_tokens_seconds',
      'gauge',
      'Average prompt throughput in tokens/s.',
      s.promptSecondsTotal > 0 ? s.promptTokensTotal / s.promptSecondsTotal : 0,
    ],
    [
      'llamacpp:predicted_tokens_seconds',
      'gauge',
      'Average generation throughput in tokens/s.',
      s.predictedSecondsTotal > 0 ? s.predictedTokensTotal / s.predictedSecondsTotal : 0,
    ],
    [
      'llamacpp:kv_cache_usage_ratio',
      'gauge',
      'KV-cache usage. 1 means 100 percent usage.',
      s.kvCacheCapacity > 0 ? s.kvCacheTokens / s.kvCacheCapacity : 0,
    ],
    ['llamacpp:kv_cache_tokens', 'gauge', 'KV-cache tokens.', s.kvCacheTokens],
    ['llamacpp:requests_processing', 'gauge', 'Number of requests processing.', s.processing],
    ['llamacpp:requests_deferred', 'gauge', 'Number of requests deferred.', s.deferred],
    [
      'switchyard_worker_requests_running',
      'gauge',
      'Requests the worker is executing.',
      s.processing,
    ],
    [
      'switchyard_worker_requests_waiting',
      'gauge',
      'Requests queued in the worker, not yet running.',
      s.deferred,
    ],
    [
      'switchyard_worker_kv_cache_usage_ratio',
      'gauge',
      'KV-cache usage, 0-1.',
      s.kvCacheCapacity > 0 ? s.kvCacheTokens / s.kvCacheCapacity : 0,
    ],
    [
      'switchyard_llama_prompt_cached_tokens_total',
      'counter',
      'Prompt tokens served from the prefix cache.',
      s.cachedPromptTokensTotal,
    ],
    [
      'switchyard_llama_requests_total',
      'counter',
      'Chat completion requests accepted.',
      s.requestsTotal,
    ],
    [
      'switchyard_llama_requests_aborted_total',
      'counter',
      'Requests stopped because the client went away.',
      s.abortedTotal,
    ],
  ];
  let out = '';
  for (const [name, type, help, value] of series) {
    out += `# HELP ${name} ${help}\n# TYPE ${name} ${type}\n${name} ${num(value)}\n`;
  }
  return out;
}

interface ResponseMeta {
  id: string;
  created: number;
  model: string;
  systemFingerprint: string;
}

function completionBody(meta: ResponseMeta, result: CompletionResult): ChatCompletion {
  return {
    id: meta.id,
    object: 'chat.completion',
    created: meta.created,
    model: meta.model,
    choices: result.choices.map((c) => ({
      index: c.index,
      message: {
        role: 'assistant',
        content: c.content,
        refusal: null,
        ...(c.toolCalls ? { tool_calls: c.toolCalls } : {}),
        annotations: [],
      },
      logprobs: c.logprobs
        ? { content: c.logprobs.length > 0 ? c.logprobs : null, refusal: null }
        : null,
      finish_reason: c.finishReason,
    })),
    usage: result.usage,
    system_fingerprint: meta.systemFingerprint,
  };
}

/** Frames one streamed completion as SSE events. */
class StreamWriter {
  private readonly started = new Set<number>();
  private readonly finished = new Set<number>();

  constructor(
    private readonly res: ServerResponse,
    private readonly meta: ResponseMeta,
    private readonly includeUsage: boolean,
  ) {}

  private chunk(choices: ChunkChoice[], usage?: Usage): void {
    const body: ChatCompletionChunk = {
      id: this.meta.id,
      object: 'chat.completion.chunk',
      created: this.meta.created,
      model: this.meta.model,
      choices,
      system_fingerprint: this.meta.systemFingerprint,
    };
    // OpenAI marks every chunk with `usage: null` when the last one will carry usage.
    if (this.includeUsage) body.usage = usage ?? null;
    this.res.write(`data: ${JSON.stringify(body)}\n\n`);
  }

  private ensureRole(index: number): void {
    if (this.started.has(index)) return;
    this.started.add(index);
    this.chunk([
      { index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null },
    ]);
  }

  event(e: EngineEvent): void {
    if (this.res.destroyed) return;
    this.ensureRole(e.index);
    if (e.type === 'finish') {
      this.finished.add(e.index);
      this.chunk([{ index: e.index, delta: {}, logprobs: null, finish_reason: e.finishReason }]);
    } else if (e.type === 'content') {
      this.chunk([
        {
          index: e.index,
          delta: { content: e.text },
          logprobs: e.logprobs ? { content: e.logprobs, refusal: null } : null,
          finish_reason: null,
        },
      ]);
    } else {
      this.chunk([
        { index: e.index, delta: { tool_calls: [e.call] }, logprobs: null, finish_reason: null },
      ]);
    }
  }

  end(result: CompletionResult): void {
    for (const c of result.choices) {
      if (this.finished.has(c.index)) continue;
      this.ensureRole(c.index);
      this.chunk([{ index: c.index, delta: {}, logprobs: null, finish_reason: c.finishReason }]);
    }
    if (this.includeUsage) this.chunk([], result.usage);
    this.res.end('data: [DONE]\n\n');
  }

  fail(err: unknown): void {
    this.res.write(`data: ${JSON.stringify(toServiceError(err).toEnvelope())}\n\n`);
    this.res.end('data: [DONE]\n\n');
  }
}

/** Builds the request listener; `startLlamaWorker` mounts it on a server. */
export function createLlamaHandler(
  engine: LlamaEngine,
  opts: Pick<LlamaWorkerOptions, 'maxBodyBytes' | 'onFailure'> = {},
): RequestListener {
  const maxBody = opts.maxBodyBytes ?? 32 * 1024 * 1024;
  /** `sendError`, telling `onFailure` of the worker's own failures (5xx). */
  const fail = (res: ServerResponse, err: unknown, requestId?: string): void => {
    const e = toServiceError(err);
    if (e.status >= 500) opts.onFailure?.(err, requestId);
    sendError(res, e, requestId);
  };
  const info = engine.info();
  const createdAt = Math.floor(Date.now() / 1000);

  async function handleChat(req: IncomingMessage, res: ServerResponse, raw: string): Promise<void> {
    const id = requestIdOf(req);
    let request: ChatRequest;
    try {
      let body: unknown;
      try {
        body = JSON.parse(raw);
      } catch (err) {
        throw new ServiceError('invalid_json', {
          message: `The request body is not valid JSON: ${(err as Error).message}`,
        });
      }
      request = parseChatRequest(body);
    } catch (err) {
      fail(res, err, id);
      return;
    }
    const meta: ResponseMeta = {
      id,
      created: Math.floor(Date.now() / 1000),
      model: info.modelName,
      systemFingerprint: info.systemFingerprint,
    };
    const ac = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) ac.abort();
    });

    if (request.stream !== true) {
      try {
        const result = await engine.complete(request, { signal: ac.signal });
        if (!res.destroyed)
          sendJson(res, 200, completionBody(meta, result), { 'x-request-id': id });
      } catch (err) {
        if (!res.destroyed) fail(res, err, id);
      }
      return;
    }

    const writer = new StreamWriter(res, meta, request.stream_options?.include_usage === true);
    try {
      const result = await engine.complete(request, {
        signal: ac.signal,
        onStart: () => {
          res.writeHead(200, {
            'content-type': 'text/event-stream; charset=utf-8',
            'cache-control': 'no-cache',
            'x-request-id': id,
          });
          res.flushHeaders();
        },
        onEvent: (e) => writer.event(e),
      });
      if (!res.destroyed) writer.end(result);
    } catch (err) {
      if (res.destroyed) return;
      if (res.headersSent) {
        opts.onFailure?.(err, id);
        writer.fail(err);
      } else fail(res, err, id);
    }
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
          fail(
            r,
            new ServiceError('payload_too_large', {
              message: `The request body exceeds ${maxBody} bytes.`,
            }),
          ),
        failed: (r, err) => fail(r, err),
      },
      then,
    );
  }

  const routes: Record<
    string,
    Record<string, (req: IncomingMessage, res: ServerResponse) => void>
  > = {
    '/v1/chat/completions': {
      POST: (req, res) => readBody(req, res, (raw) => handleChat(req, res, raw)),
    },
    '/v1/models': {
      GET: (_req, res) =>
        sendJson(res, 200, {
          object: 'list',
          data: [
            {
              id: info.modelName,
              object: 'model',
              created: createdAt,
              owned_by: 'switchyard',
              max_model_len: info.contextSize,
              meta: {
                n_ctx: info.contextSize,
                n_ctx_train: info.trainContextSize,
                n_vocab: info.vocabularySize,
                n_parallel: info.sequences,
                n_threads: info.threads,
                chat_wrapper: info.chatWrapper,
                capabilities: engine.capabilities(),
              },
            },
          ],
        }),
    },
    '/health': { GET: (_req, res) => sendJson(res, 200, { status: 'ok' }) },
    '/metrics': {
      GET: (_req, res) => {
        const text = renderMetrics(engine.stats());
        res.writeHead(200, {
          'content-type': 'text/plain; version=0.0.4; charset=utf-8',
          'content-length': Buffer.byteLength(text),
        });
        res.end(text);
      },
    },
  };

  return (req, res) => {
    const url = req.url ?? '/';
    const q = url.indexOf('?');
    const path = q < 0 ? url : url.slice(0, q);
    const route = routes[path];
    const handler = route?.[req.method ?? 'GET'];
    if (handler) {
      handler(req, res);
      return;
    }
    req.resume();
    fail(res, new ServiceError(route ? 'method_not_allowed' : 'route_not_found'));
  };
}

/** Loads the model and serves it; resolves once the server is listening. */
export async function startLlamaWorker(opts: LlamaWorkerOptions): Promise<LlamaWorker> {
  const engine = await LlamaEngine.load(opts);
  const server = createServer(
    { keepAlive: true },
    opts.tracing
      ? opts.tracing.wrapListener(createLlamaHandler(engine, opts), {
          'switchyard.engine': 'llama',
        })
      : createLlamaHandler(engine, opts),
  );
  // The router keeps pooled keep-alive connections; don't drop idle ones early.
  server.keepAliveTimeout = 60_000;
  const host = opts.host ?? '127.0.0.1';
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(opts.port ?? 0, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
  } catch (err) {
    await engine.close();
    throw err;
  }
  const port = (server.address() as AddressInfo).port;
  const hostPart = host.includes(':') ? `[${host}]` : host;
  let closing: Promise<void> | undefined;
  return {
    url: `http://${hostPart}:${port}/v1`,
    port,
    server,
    engine,
    close() {
      closing ??= (async () => {
        await new Promise<void>((resolve) => {
          server.close(() => resolve());
          // Streams in flight are cut: their clients see the connection end, which aborts them.
          server.closeAllConnections();
        });
        await engine.close();
      })();
      return closing;
    },
  };
}
