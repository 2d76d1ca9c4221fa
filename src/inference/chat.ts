/**
 * POST /<project_id>/<endpoint_slug>/v1/chat/completions: the product's main job.
 *
 * Path: API key (scope `inference`) → endpoint (cached) and its status → key's
 * endpoint binding → body validation → capabilities → max_tokens clamp →
 * worker pick → proxy with the tier's deadline (and, streaming, the idle
 * timeout) → the spec's response shapes → usage record (batched).
 *
 * Timeouts come from the endpoint's tier (the `tiers` table) and run on the
 * injected clock. The deadline counts from the request's start, so a wait in the
 * router's queue spends it and the worker gets only what is left; a deadline that
 * passes in the queue is a timeout like any other, not a 429. Non-streaming past
 * the deadline: 408 `request_timeout` (type `timeout_error`). Streaming: the
 * deadline bounds the wait for the first generated token (reasoning included),
 * the idle timeout every gap after it (each tier's idle timeout is longer than
 * its deadline, so a deadline on the whole stream would make the idle timeout
 * unreachable); either one ends the stream with an SSE `error` event with
 * `type: timeout_error`. With `reasoning_effort` the idle timeout equals the
 * deadline. Every timeout, and a client that goes away, aborts the upstream
 * request at once.
 *
 * An engine that still rejects the clamped value with its exact token-count
 * error gets one retry with the value it says fits.
 *
 * A worker that answers 429 is saturated, not broken: the request goes to another
 * worker of the pool as on a failure before the first byte (its breaker untouched);
 * with none free, the client gets 429 `capacity_exceeded` with the worker's
 * `Retry-After`. Every 429 carries `retry_after` and `retry_strategy` (http/limits.ts).
 *
 * `x_exec: true` (scope `execution` too) hands the rounds to the tool bridge
 * (bridge.ts), which reuses this module's upstream path and usage record.
 *
 * `store: true`: a completed request's answer (the JSON text sent, or the streamed
 * chunks assembled) is handed to src/completions, which writes it after the answer
 * has left. Without it nothing is allocated or awaited for storing.
 */
import type { Span, Tracing } from '../runtime/tracing.js';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { ServerResponse } from 'node:http';
import { costMicrocents, type BillingGate } from '../billing/gate.js';
import type { UsageRecorder } from '../billing/usage-recorder.js';
import { CompletionAssembler } from '../completions/assemble.js';
import type { StoredCompletions } from '../completions/service.js';
import type { Endpoint } from '../endpoints/repository.js';
import { ServiceError } from '../errors/index.js';
import type { ExecService } from '../exec/service.js';
import { clientJson } from '../http/json-body.js';
import { tooManyRequests, type Limits } from '../http/limits.js';
import type { KeyRecord, KeyVerifier } from '../keys/index.js';
import { renderForIndex } from '../routing/prefix-index.js';
import type { Lease, RouteHints, WorkerPool } from '../routing/pool.js';
import type { WorkerRecord } from '../routing/registry.js';
import { parseServiceTier, parseSloHeaders, type SloTargets } from '../routing/slo.js';
import type { Metrics } from '../runtime/metrics.js';
import type { Clock } from '../runtime/clock.js';
import type { Logger } from '../runtime/logger.js';
import type { Tier, TierId } from '../tiers/index.js';
import {
  CLAMP_HEADER,
  clampHeader,
  clampMaxTokens,
  estimatePromptTokens,
  estimateTextTokens,
  parseTokenCountError,
  promptTooLong,
} from './clamp.js';
import {
  admitWorker,
  deadlineMessage,
  failedRequest,
  mapTransport,
  retryAfter,
  SATURATED,
  shuttingDown,
  upstreamFailure,
  workerJson,
} from './admission.js';
import {
  errorEventMessage,
  estimatedUsage,
  normalizeCompletion,
  StreamAccumulator,
  upstreamErrorMessage,
  type ReframeContext,
  type ServiceTierName,
  type Usage,
} from './reframe.js';
import { checkBridgeRequest, ToolBridge, WORKSPACE_FIELD } from './bridge.js';
import { Deadline } from './deadline.js';
import { parseChatRequest, type ChatRequest } from './request.js';
import { resolveTarget } from './target.js';
import { drained, isDone, SSE_DONE, sseData, sseError, SseParser, type SseEvent } from './sse.js';
import { AFTER_DONE_MS, type UpstreamClient, type UpstreamResponse } from './upstream.js';
import { Cancellation, type AbortLike } from '../runtime/cancel.js';

export interface ChatDeps {
  clock: Clock;
  logger: Logger;
  verifier: KeyVerifier;
  endpoints: (projectId: string, slug: string) => Promise<Endpoint | null> | Endpoint | null;
  tiers: Map<TierId, Tier>;
  pool: WorkerPool;
  upstream: UpstreamClient;
  usage: UsageRecorder;
  /** Where `store: true` completions are kept (src/completions); absent: not stored. */
  completions?: StoredCompletions;
  billing: BillingGate;
  limits: Limits;
  /** Cancellers of the open streams, called when a shutdown's drain period ends. */
  streams: Set<() => void>;
  /** The execution control plane, for `x_exec` requests (the tool bridge); absent: 400. */
  exec?: ExecService;
  /** OpenTelemetry (runtime/tracing); null or absent: no spans, no trace headers. */
  tracing?: Tracing | null;
  metrics?: Metrics;
  /**
   * The endpoint's SLO targets (its SLO records), used as routing hints when the
   * request sends no `X-SLO-*` header of its own.
   */
  sloTargets?: (endpointId: string) => SloTargets | Promise<SloTargets>;
}

/** With tracing on: each request's SERVER span and its current upstream CLIENT span. */
const serverSpans = new WeakMap<FastifyRequest, Span>();
const clientSpans = new WeakMap<FastifyRequest, Span>();
/** The worker of each request's latest upstream attempt, for its SERVER span. */
const attemptWorker = new WeakMap<FastifyRequest, string>();

/**
 * Request fields that stay with the router and are not forwarded to workers, with
 * those the router sets itself (`stream_options` for a stream, below).
 */
const ROUTER_ONLY_FIELDS = new Set([
  'x_exec',
  WORKSPACE_FIELD,
  'service_tier',
  'metadata',
  'store',
  'user',
  'max_completion_tokens',
  // The router sets it for workers that order their queue by it (routing/prefill-order.ts);
  // a client's own would let one tenant jump the others' queue.
  'priority',
  'stream_options',
]);

const PRIORITY_MULTIPLIER = 1.25;

type Outcome = 'completed' | 'error' | 'timeout' | 'cancelled';

function upstreamBody(req: ChatRequest, model: string, maxTokens: number): Record<string, unknown> {
  // A copy that leaves fields out rather than a spread and `delete`s: deleting puts an
  // object in V8's slow dictionary mode, and the copy, its `JSON.stringify` included,
  // cost about a third (1.2 µs against 3.9 on the 2-core VM, a bench-sized body).
  const body: Record<string, unknown> = {};
  for (const k in req.body) if (!ROUTER_ONLY_FIELDS.has(k)) body[k] = req.body[k];
  body.model = model;
  body.max_tokens = maxTokens;
  // The spec's defaults (0.7, 0.9) for an omitted or null value, sent explicitly:
  // vLLM, SGLang or llama.cpp would otherwise sample with their own.
  body.temperature = req.temperature;
  body.top_p = req.topP;
  // Usage is always tracked for billing, whatever the client asked for.
  if (req.stream) body.stream_options = { include_usage: true };
  return body;
}

function requireCapabilities(req: ChatRequest, e: Endpoint): void {
  const caps = e.capabilities;
  const need = (cap: string, param: string) => {
    if (!caps.includes(cap)) {
      throw new ServiceError('model_capability_missing', {
        message: `The model '${e.modelName}' lacks the '${cap}' capability this request needs.`,
        param,
      });
    }
  };
  if (req.tools && req.tools.length > 0 && req.toolChoice !== 'none') need('tool_calling', 'tools');
  if (req.responseFormat?.type === 'json_schema') need('json_schema', 'response_format');
  if (req.logprobs) need('logprobs', 'logprobs');
}

export class ChatCompletions {
  constructor(private readonly d: ChatDeps) {}

  handle = (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const t = this.d.tracing;
    if (!t) return this.serve(request, reply);
    const span = t.serverSpan('POST /chat/completions', request.headers, {
      'http.request.method': 'POST',
      'http.route': '/:projectId/:endpointSlug/v1/chat/completions',
      'switchyard.request_id': request.id,
    });
    serverSpans.set(request, span);
    reply.raw.once('close', () => {
      clientSpans.get(request)?.end();
      // The worker of the last attempt (a stream writes its headers past Fastify's reply).
      const worker = attemptWorker.get(request);
      t.end(span, reply.statusCode, worker ? { 'switchyard.worker.id': worker } : {});
    });
    return this.serve(request, reply);
  };

  /** Trace context for an upstream attempt: a new CLIENT span under the request's span. */
  private traceHeaders(run: Run): Record<string, string> | undefined {
    const t = this.d.tracing;
    const parent = t ? serverSpans.get(run.request) : undefined;
    if (!t || !parent) return undefined;
    clientSpans.get(run.request)?.end();
    attemptWorker.set(run.request, run.worker.id);
    const span = t.clientSpan('upstream POST /chat/completions', parent, {
      'switchyard.worker.id': run.worker.id,
      'server.address': run.worker.url,
    });
    clientSpans.set(run.request, span);
    return t.inject(span, {});
  }

  private serve = async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const d = this.d;
    // The tier deadline runs from here: time in the router's queue is the client's time too.
    const startedAt = d.clock.now();
    const { key, endpoint, tier, body } = await resolveTarget(d, request, reply);

    const req = parseChatRequest(body);
    if (req.xExec) {
      if (!key.scopes.includes('execution')) {
        throw new ServiceError('scope_insufficient', {
          message: "x_exec requests require the 'execution' scope.",
        });
      }
      if (!d.exec) {
        throw new ServiceError('unsupported_value', {
          message: 'The execution tool bridge is not enabled on this service.',
          param: 'x_exec',
        });
      }
      checkBridgeRequest(req, endpoint.capabilities, endpoint.modelName);
    }
    requireCapabilities(req, endpoint);
    const promptTokens = estimatePromptTokens(req.messages, req.tools);
    const clamp = clampMaxTokens({
      requested: req.maxTokens,
      promptTokens,
      contextWindow: endpoint.contextWindow,
    });
    // What the request may cost at most holds the project's credit until it ends
    // (billing/gate.ts): requests admitted meanwhile, queued ones included, see it spent.
    // Rejected prediction tokens are billed on top of the output (record), up to the
    // whole prediction per choice.
    const priced = endpoint.promptPriceCentsPerMtok > 0 || endpoint.completionPriceCentsPerMtok > 0;
    const predictionTokens =
      req.predictionText === undefined ? 0 : estimateTextTokens(req.predictionText);
    const release = await d.billing.check(
      key.projectId,
      priced,
      priced
        ? costMicrocents(
            { promptTokens, completionTokens: (clamp.value + predictionTokens) * (req.n ?? 1) },
            endpoint,
            tier.priceMultiplier * (req.serviceTier === 'priority' ? PRIORITY_MULTIPLIER : 1),
          )
        : 0,
    );
    try {
      await this.admitted(request, reply, {
        key,
        endpoint,
        tier,
        req,
        startedAt,
        promptTokens,
        clamp,
      });
    } finally {
      release();
    }
  };

  /** The request once the billing gate let it in: routing, the worker, the answer. */
  private async admitted(
    request: FastifyRequest,
    reply: FastifyReply,
    a: {
      key: KeyRecord;
      endpoint: Endpoint;
      tier: Tier;
      req: ChatRequest;
      startedAt: number;
      promptTokens: number;
      clamp: ReturnType<typeof clampMaxTokens>;
    },
  ): Promise<void> {
    const d = this.d;
    const { key, endpoint, tier, req, startedAt, promptTokens, clamp } = a;
    const deadlineAt = startedAt + tier.requestDeadlineMs;
    const candidates = await d.pool.candidates(endpoint.modelId, endpoint.tierId);
    const slo = parseSloHeaders(request.headers);
    if (d.sloTargets && slo.ttftMs === undefined && slo.tpotMs === undefined) {
      const defaults = await d.sloTargets(endpoint.id);
      if (defaults.ttftMs !== undefined) slo.ttftMs = defaults.ttftMs;
      if (defaults.tpotMs !== undefined) slo.tpotMs = defaults.tpotMs;
    }
    const hints: RouteHints = {
      blocks: d.pool.scorer.index.blocks(renderForIndex(req.messages)),
      promptTokens,
      slo,
      tier: parseServiceTier(req.serviceTier),
    };
    const lease = await admitWorker(d, reply, candidates, hints, deadlineAt);
    if (lease === 'timeout') {
      // The deadline passed in the router's queue; no worker saw the request.
      if (!req.stream)
        throw new ServiceError('request_timeout', { message: deadlineMessage(tier) });
      openSse(reply, request.id, {});
      reply.raw.end(sseError('request_timeout', deadlineMessage(tier)));
      return;
    }
    const worker = lease.worker;
    const ctx: ReframeContext = {
      id: request.id,
      created: Math.floor(startedAt / 1000),
      model: endpoint.modelName,
      serviceTier: endpoint.tierId as ServiceTierName,
      topLogprobs: req.topLogprobs,
      logprobs: req.logprobs,
      choices: req.n,
      predictionUsed: req.predictionText !== undefined,
      promptTokensEstimate: promptTokens,
      includeUsage: req.stream && req.includeUsage,
    };
    const run: Run = {
      request,
      reply,
      req,
      key,
      endpoint,
      worker,
      tier,
      ctx,
      startedAt,
      deadlineAt,
      body: upstreamBody(req, endpoint.modelName, clamp.value),
      clampHeader:
        clamp.clamped && clamp.original !== undefined
          ? clampHeader(clamp.original, clamp.value)
          : null,
      original: clamp.original,
      candidates,
      hints,
      lease,
      waitedMs: d.clock.now() - startedAt,
      tried: new Set([worker.id]),
      sent: false,
    };
    try {
      if (req.xExec && d.exec) await this.bridge(run, d.exec);
      else if (req.stream) await this.stream(run);
      else await this.complete(run);
    } finally {
      // Normally released by `record`; this covers a throw before it.
      d.pool.abandon(run.lease);
    }
  }

  /** `x_exec: true`: the tool bridge runs the rounds (src/inference/bridge.ts). */
  private bridge(run: Run, exec: ExecService): Promise<void> {
    return new ToolBridge({
      clock: this.d.clock,
      logger: this.d.logger,
      exec,
      projectId: run.key.projectId,
      req: run.req,
      body: run.body,
      ctx: run.ctx,
      tier: run.tier,
      startedAt: run.startedAt,
      deadlineMs: remainingMs(run, this.d.clock),
      reply: run.reply,
      streams: this.d.streams,
      send: async (body, signal) => {
        run.body = { ...body, max_tokens: run.body.max_tokens };
        const res = await this.send(run, signal);
        this.d.pool.success(run.worker.id);
        return res;
      },
      responseHeaders: () => ({
        'X-Service-Worker-ID': run.worker.id,
        ...(run.clampHeader ? { [CLAMP_HEADER]: run.clampHeader } : {}),
      }),
      fixUsage: (u) => reasoningNull(u, run.endpoint),
      record: (outcome, usage, ttftMs) => this.record(run, outcome, usage, ttftMs, run.req.stream),
      keep: (body) => this.keep(run, body),
    }).run();
  }

  /**
   * Failover before the first byte: another worker of the same (model, tier)
   * that this request has not tried, or false. Never after a response started.
   * `failed` counts against the worker's breaker; a worker that only said it is
   * saturated (429) is healthy, so its breaker is left alone.
   */
  private failover(run: Run, failed = true): boolean {
    const d = this.d;
    if (failed) d.pool.failure(run.worker.id);
    if (run.tried.size >= MAX_WORKER_TRIES) return false;
    const next = d.pool.route(run.candidates, run.hints, run.tried);
    if (!next) return false;
    d.pool.abandon(run.lease);
    run.lease = next;
    run.tried.add(next.worker.id);
    run.worker = next.worker;
    // What the next worker is judged on starts now: the time the failed one took is not its.
    run.waitedMs = d.clock.now() - run.startedAt;
    return true;
  }

  /**
   * Sends the request upstream. Nothing has reached the client yet, so a worker that
   * is unreachable, fails (5xx) or is saturated (429) is replaced by another of the
   * pool; the engine's exact token-count error gets one retry with the value it says
   * fits.
   */
  private async send(run: Run, signal: AbortLike): Promise<UpstreamResponse> {
    const d = this.d;
    let resized = false;
    for (;;) {
      let res: UpstreamResponse;
      try {
        const priority = run.lease.priority;
        run.sent = true;
        res = await d.upstream.post(
          run.worker.url,
          '/chat/completions',
          clientJson(priority === undefined ? run.body : { ...run.body, priority }),
          signal,
          this.traceHeaders(run),
        );
      } catch (err) {
        // Connection refused or reset before headers: nothing reached the client yet.
        // A ServiceError is the body's own (clientJson), no worker's fault.
        if (err instanceof ServiceError || signal.aborted || !this.failover(run)) throw err;
        d.logger.warn({ err, next: run.worker.id }, 'worker unreachable; failing over');
        continue;
      }
      if (res.statusCode === 200) return res;
      let text: string;
      try {
        text = await res.body.text();
      } catch (err) {
        // The worker broke off its own error answer: nothing reached the client yet.
        if (signal.aborted || !this.failover(run)) throw err;
        d.logger.warn({ err, next: run.worker.id }, 'worker failed mid-answer; failing over');
        continue;
      }
      if (res.statusCode === 429) {
        if (this.failover(run, false)) {
          d.logger.warn({ status: 429, next: run.worker.id }, 'worker saturated; failing over');
          continue;
        }
        const now = d.clock.now();
        throw tooManyRequests('capacity_exceeded', retryAfter(res.headers, now), SATURATED);
      }
      if (res.statusCode >= 500) {
        if (this.failover(run)) {
          d.logger.warn(
            { status: res.statusCode, next: run.worker.id },
            'worker failed; failing over',
          );
          continue;
        }
        throw upstreamFailure(res.statusCode, text);
      }
      const fits = resized ? null : parseTokenCountError(res.statusCode, text);
      if (fits === null) {
        throw promptTooLong(res.statusCode, text) ?? upstreamFailure(res.statusCode, text);
      }
      resized = true;
      run.body = { ...run.body, max_tokens: fits };
      // The header reports a reduction of the client's value; the router's own
      // choice for an omitted max_tokens is no clamp (spec: absent otherwise).
      if (run.original !== undefined) run.clampHeader = clampHeader(run.original, fits);
    }
  }

  private async complete(run: Run): Promise<void> {
    const { reply, tier } = run;
    const abort = new Cancellation();
    const deadline = new Deadline(this.d.clock, abort, remainingMs(run, this.d.clock), null);
    const onClose = () => {
      if (!reply.raw.writableFinished) abort.abort();
    };
    reply.raw.on('close', onClose);
    // A shutdown past its drain period ends the request with a 503 the client can
    // retry elsewhere, not a reset connection (serve.ts waits for it to leave).
    let serverEnded = false;
    const cancel = () => {
      serverEnded = true;
      abort.abort();
    };
    this.d.streams.add(cancel);
    let outcome: Outcome = 'error';
    let usage: Usage | null = null;
    try {
      let text: string;
      for (;;) {
        const res = await this.send(run, abort.signal);
        try {
          text = await res.body.text();
          break;
        } catch (err) {
          // The worker died after its headers: the client has nothing yet, so another
          // worker may answer.
          if (abort.signal.aborted || !this.failover(run)) throw err;
          run.request.log.warn(
            { err, next: run.worker.id },
            'worker failed mid-body; failing over',
          );
        }
      }
      this.d.pool.success(run.worker.id);
      const parsed = workerJson(text);
      const completion = normalizeCompletion(parsed, run.ctx);
      reasoningNull(completion.usage, run.endpoint);
      usage = completion.usage;
      outcome = 'completed';
      reply.header('X-Service-Worker-ID', run.worker.id);
      if (run.clampHeader) reply.header(CLAMP_HEADER, run.clampHeader);
      const json = JSON.stringify(completion);
      reply.type('application/json').send(json);
      // The very text the client got; stored after it left.
      if (run.req.store) this.keep(run, json);
    } catch (err) {
      if (serverEnded) {
        outcome = 'cancelled';
        throw shuttingDown();
      }
      const end = failedRequest(err, { deadline, aborted: abort.signal.aborted, reply, tier });
      outcome = end.outcome;
      if (end.error) throw end.error;
    } finally {
      deadline.clear();
      reply.raw.off('close', onClose);
      if (serverEnded && !reply.raw.writableFinished) {
        // Open until its 503 has left: the shutdown waits for the set to empty.
        const done = () => this.d.streams.delete(cancel);
        reply.raw.once('finish', done).once('close', done);
      } else {
        this.d.streams.delete(cancel);
      }
      // Ended by the client or the deadline after a worker had the request: the
      // tokens it generated are unknown (it never answered), its prompt was read, so
      // that is billed, as a stream's prompt is (a non-streaming request was free).
      if (usage === null && (outcome === 'cancelled' || outcome === 'timeout') && run.sent) {
        usage = estimatedUsage(run.ctx.promptTokensEstimate ?? 0, 0);
      }
      this.record(run, outcome, usage, null, false);
    }
  }

  private async stream(run: Run): Promise<void> {
    const { reply, tier, req } = run;
    const clock = this.d.clock;
    const abort = new Cancellation();
    const idleMs = req.reasoningEffort ? tier.requestDeadlineMs : tier.idleTimeoutMs;
    const deadline = new Deadline(clock, abort, remainingMs(run, clock), idleMs);
    const raw = reply.raw;
    let clientGone = false;
    const onClose = () => {
      if (!raw.writableFinished) {
        clientGone = true;
        abort.abort();
      }
    };
    raw.on('close', onClose);
    let serverEnded = false;
    const cancel = () => {
      serverEnded = true;
      abort.abort();
    };
    this.d.streams.add(cancel);
    let acc = new StreamAccumulator(run.ctx, run.startedAt);
    // `store: true`: the chunks sent, assembled into the completion to keep (null otherwise).
    let kept = req.store ? new CompletionAssembler(run.ctx) : null;
    let outcome: Outcome = 'error';
    // Nothing reaches the client before the first generated token (or the end of a
    // stream without one): until then a worker that dies is replaced by another one.
    let committed = false;
    const commit = () => {
      if (committed) return;
      committed = true;
      const headers: Record<string, string> = { 'x-service-worker-id': run.worker.id };
      if (run.clampHeader) headers[CLAMP_HEADER.toLowerCase()] = run.clampHeader;
      openSse(reply, run.request.id, headers);
    };
    try {
      attempts: for (;;) {
        let res: UpstreamResponse | null = null;
        try {
          res = await this.send(run, abort.signal);
        } catch (err) {
          if (serverEnded) {
            outcome = 'cancelled';
            throw shuttingDown();
          }
          if (deadline.timedOut) {
            // Nothing streamed yet; the timeout is still reported as the SSE error event.
            outcome = 'timeout';
          } else if (clientGone) {
            outcome = 'cancelled';
            return;
          } else {
            throw err instanceof ServiceError ? err : mapTransport(err);
          }
        }
        if (res === null) {
          commit();
          raw.end(sseError('request_timeout', timeoutMessage(deadline, tier)));
          return;
        }

        const parser = new SseParser();
        /** Chunks held back until the first token (the role-only opening chunk). */
        const held: string[] = [];
        let generating = false;
        let done = false;
        let upstreamError: string | null = null;
        let broken: unknown = null;
        // The events of one read leave in one write: each `raw.write` costs a
        // chunked-encoding frame and a pass through the socket's buffering, and a
        // worker often sends several events per read.
        let batch = '';
        /** One worker event; false once the worker sent an error (stop reading). */
        const onEvent = (ev: SseEvent, now: number): boolean => {
          if (isDone(ev)) {
            // The end of the answer, whatever follows it or however long the worker
            // takes to close its response.
            done = true;
            return false;
          }
          if (ev.event === 'error') {
            upstreamError = errorEventMessage(ev.data);
            return false;
          }
          let payload: unknown;
          try {
            payload = JSON.parse(ev.data);
          } catch (err) {
            // A worker bug, not the client's problem: skip the event, but say so.
            run.request.log.warn(
              { err, worker: run.worker.id },
              'worker sent a non-JSON SSE event',
            );
            return true;
          }
          const errMsg = upstreamErrorMessage(payload);
          if (errMsg !== null) {
            upstreamError = errMsg;
            return false;
          }
          const out = acc.accept(payload, now);
          if (kept !== null && out !== null) kept.add(out);
          if (!generating && acc.firstTokenSeen) {
            generating = true;
            deadline.started();
            this.d.pool.firstToken(run.lease);
            commit();
            let first = held.splice(0).join('');
            if (out !== null) first += sseData(out);
            raw.write(first);
            // Node corks the socket until the end of the tick: uncorked here, the
            // first token leaves now instead of after the rest of the read.
            raw.uncork();
            return true;
          }
          if (out === null) return true;
          if (!committed) held.push(sseData(out));
          else batch += sseData(out);
          return true;
        };
        try {
          for await (const chunk of res.body) {
            deadline.touch();
            const now = clock.now();
            batch = '';
            for (const ev of parser.feed(chunk as Uint8Array)) if (!onEvent(ev, now)) break;
            if (batch !== '' && !write(raw, batch)) {
              await drained(raw, abort.signal);
              // Waiting for a slow client is not the worker being idle (the router stops
              // reading from the worker meanwhile): the idle gap restarts once it drained.
              deadline.touch();
            }
            if (upstreamError !== null) break;
            if (done) {
              res.body.discard(clock, AFTER_DONE_MS);
              break;
            }
          }
          if (upstreamError === null && !done) {
            // The worker closed: an event it sent without its closing blank line (some
            // end on a bare `data: [DONE]`) is an event still.
            batch = '';
            for (const ev of parser.end()) if (!onEvent(ev, clock.now())) break;
            if (batch !== '') write(raw, batch);
            // Every choice has its finish_reason (and the usage chunk follows it): the
            // answer is whole, a worker that closes without `[DONE]` has ended it.
            if (upstreamError === null && acc.finished) done = true;
          }
        } catch (err) {
          if (serverEnded) {
            outcome = 'cancelled';
            commit();
            raw.end(sseError('cancelled', 'The server is shutting down; the stream was ended.'));
            return;
          }
          if (deadline.timedOut) {
            outcome = 'timeout';
            commit();
            raw.end(sseError('request_timeout', timeoutMessage(deadline, tier)));
            return;
          }
          if (clientGone) {
            outcome = 'cancelled';
            return;
          }
          broken = err;
        }
        // A `[DONE]` without a single choice before it is no answer either.
        const answered = done && acc.choicesSeen;
        if (!committed && upstreamError === null && (broken !== null || !answered)) {
          // The worker died before the first token: nothing was sent, so fail over.
          if (this.failover(run)) {
            run.request.log.warn(
              { err: broken, next: run.worker.id },
              'worker stream failed before its first token; failing over',
            );
            acc = new StreamAccumulator(run.ctx, run.startedAt);
            if (kept !== null) kept = new CompletionAssembler(run.ctx);
            continue attempts;
          }
        }
        if (!committed && (broken !== null || upstreamError !== null || !answered)) {
          // No worker left to fail over to, and nothing sent yet (headers wait for the
          // first token): an HTTP error the client can retry, not a 200 stream that
          // ends in an error event.
          if (broken !== null) {
            run.request.log.warn({ err: broken, worker: run.worker.id }, 'worker stream failed');
          }
          abort.abort();
          throw new ServiceError('upstream_error', {
            message:
              upstreamError ??
              (done
                ? 'The inference worker answered without a single choice.'
                : 'The inference worker ended the stream before its first token.'),
          });
        }
        commit();
        for (const h of held.splice(0)) raw.write(h);
        if (broken !== null) {
          run.request.log.warn({ err: broken, worker: run.worker.id }, 'worker stream failed');
          upstreamError = 'The inference worker ended the stream.';
        }
        if (upstreamError !== null || !done) {
          outcome = 'cancelled';
          abort.abort();
          raw.end(
            sseError('cancelled', upstreamError ?? 'The inference worker ended the stream early.'),
          );
          return;
        }
        this.d.pool.success(run.worker.id);
        outcome = 'completed';
        const closing = acc.closingChunk();
        if (closing !== null) {
          raw.write(sseData(closing));
          if (kept !== null) kept.add(closing);
        }
        if (req.includeUsage) {
          const chunk = acc.usageChunk();
          if (chunk.usage) reasoningNull(chunk.usage, run.endpoint);
          raw.write(sseData(chunk));
        }
        raw.end(SSE_DONE);
        if (kept !== null) {
          const usage = acc.usage;
          reasoningNull(usage, run.endpoint);
          this.keep(run, kept.completion(usage));
        }
        return;
      }
    } finally {
      this.d.streams.delete(cancel);
      deadline.clear();
      raw.off('close', onClose);
      if (!committed && outcome === 'cancelled' && !serverEnded) {
        // The client is gone: release the socket instead of leaving it to the keep-alive timer.
        reply.hijack();
        raw.destroy();
      }
      const s = acc.summary();
      // Billed as a non-streaming request is: a completion, the worker's own count or
      // what streamed; with nothing generated, the prompt only when the client or the
      // deadline ended a request a worker had (it read the prompt). A request that
      // failed before that (a worker's 5xx or 4xx, a refused connection) is free.
      const billable =
        outcome === 'completed' ||
        s.usageReported ||
        s.ttftMs !== null ||
        ((outcome === 'cancelled' || outcome === 'timeout') && run.sent);
      this.record(run, outcome, billable ? s.usage : null, s.ttftMs, true);
    }
  }

  /** A completed `store: true` request: kept, off this path (src/completions/service.ts). */
  private keep(run: Run, body: string | object): void {
    this.d.completions?.save({
      id: run.request.id,
      projectId: run.key.projectId,
      endpointId: run.endpoint.id,
      model: run.endpoint.modelName,
      body,
      messages: run.req.messages,
      metadata: run.req.metadata,
      createdAt: run.startedAt,
    });
  }

  private observe(
    run: Run,
    outcome: Outcome,
    usage: Usage | null,
    ttftMs: number | null,
    durationMs: number,
  ): void {
    const d = this.d;
    const o = observation(run, usage, ttftMs, durationMs);
    if (outcome === 'completed') d.pool.finish(run.lease, o);
    else d.pool.abandon(run.lease);
    const m = d.metrics;
    if (!m) return;
    const endpoint = run.endpoint.id;
    m.endpointRequests.inc({ endpoint, outcome });
    if (outcome !== 'completed') return;
    if (ttftMs !== null) m.endpointTtft.observe({ endpoint }, ttftMs / 1000);
    if (o.promptTokens) m.endpointPromptTokens.inc({ endpoint }, o.promptTokens);
    if (o.cachedTokens) m.endpointCachedTokens.inc({ endpoint }, o.cachedTokens);
  }

  private record(
    run: Run,
    outcome: Outcome,
    usage: Usage | null,
    ttftMs: number | null,
    stream: boolean,
  ): void {
    const u = usage;
    const promptTokens = u?.prompt_tokens ?? 0;
    const completionTokens = u?.completion_tokens ?? 0;
    // Rejected prediction tokens were generated, then discarded: billed and counted
    // per minute (spec, Usage), while the usage the client saw keeps the worker's numbers.
    const billedCompletion =
      completionTokens + (u?.completion_tokens_details.rejected_prediction_tokens ?? 0);
    const durationMs = this.d.clock.now() - run.startedAt;
    this.observe(run, outcome, u, ttftMs, durationMs);
    const multiplier =
      run.tier.priceMultiplier * (run.req.serviceTier === 'priority' ? PRIORITY_MULTIPLIER : 1);
    void this.d.limits.addTokens(run.endpoint.id, promptTokens + billedCompletion);
    this.d.usage.record({
      requestId: run.request.id,
      projectId: run.key.projectId,
      endpointId: run.endpoint.id,
      keyId: run.key.id,
      workerId: run.worker.id,
      model: run.endpoint.modelName,
      tierId: run.endpoint.tierId,
      serviceTierHint: run.req.serviceTier ?? null,
      priceMultiplier: run.req.serviceTier === 'priority' ? PRIORITY_MULTIPLIER : 1,
      status: outcome,
      stream: stream ? 1 : 0,
      promptTokens,
      completionTokens,
      costMicrocents: costMicrocents(
        { promptTokens, completionTokens: billedCompletion },
        run.endpoint,
        multiplier,
      ),
      cachedTokens: u?.prompt_tokens_details.cached_tokens ?? 0,
      reasoningTokens: u?.completion_tokens_details.reasoning_tokens ?? null,
      acceptedPredictionTokens: u?.completion_tokens_details.accepted_prediction_tokens ?? null,
      rejectedPredictionTokens: u?.completion_tokens_details.rejected_prediction_tokens ?? null,
      ttftMs,
      durationMs,
      user: run.req.user ?? null,
      metadata: run.req.metadata ? { ...run.req.metadata } : null,
      createdAt: new Date(run.startedAt),
    });
  }
}

/**
 * Closes the request's lease: a completed one tells the scorer what the worker did
 * (time to first token and per output token as the worker delivered them, the
 * router's queue wait taken out; `cached_tokens` for the prefix index), anything
 * else only frees the slot. Per-endpoint metrics too.
 */
function observation(
  run: Run,
  usage: Usage | null,
  ttftMs: number | null,
  durationMs: number,
): { ttftMs?: number; tpotMs?: number; promptTokens?: number; cachedTokens?: number } {
  const o: { ttftMs?: number; tpotMs?: number; promptTokens?: number; cachedTokens?: number } = {};
  if (usage) {
    o.promptTokens = usage.prompt_tokens;
    o.cachedTokens = usage.prompt_tokens_details.cached_tokens;
  }
  if (ttftMs !== null) {
    o.ttftMs = Math.max(0, ttftMs - run.waitedMs);
    const n = usage?.completion_tokens ?? 0;
    if (n >= 2) o.tpotMs = Math.max(0, durationMs - ttftMs) / (n - 1);
  }
  return o;
}

interface Run {
  request: FastifyRequest;
  reply: FastifyReply;
  req: ChatRequest;
  key: KeyRecord;
  endpoint: Endpoint;
  worker: WorkerRecord;
  tier: Tier;
  ctx: ReframeContext;
  startedAt: number;
  /** When the tier deadline passes (clock ms): `startedAt` plus the tier's deadline. */
  deadlineAt: number;
  body: Record<string, unknown>;
  clampHeader: string | null;
  original: number | undefined;
  /** Workers of the endpoint's (model, tier), and those this request already tried. */
  candidates: readonly WorkerRecord[];
  tried: Set<string>;
  /** What the scorer knows of the request, and its current worker's lease. */
  hints: RouteHints;
  lease: Lease;
  /**
   * Time from the start of the request to its dispatch to the current worker (the
   * router's queue, mostly, and any worker that failed before it).
   */
  waitedMs: number;
  /** The request went to a worker (at least once). */
  sent: boolean;
}

/** How many workers one request may try before giving up (failover before the first byte). */
const MAX_WORKER_TRIES = 3;

/**
 * The spec's `reasoning_tokens` is null for non-reasoning models; workers often
 * report 0 regardless. A model is a reasoning model when it declares the
 * `reasoning` capability or when a worker counted reasoning tokens.
 */
function reasoningNull(usage: Usage, endpoint: Endpoint): void {
  const d = usage.completion_tokens_details;
  if (!endpoint.capabilities.includes('reasoning') && !d.reasoning_tokens)
    d.reasoning_tokens = null;
}

function timeoutMessage(deadline: Deadline, tier: Tier): string {
  return deadline.timedOut === 'idle'
    ? 'The stream was idle longer than the idle timeout.'
    : deadlineMessage(tier);
}

/** What is left of the request's deadline for the worker (its queue wait already spent). */
function remainingMs(run: Run, clock: Clock): number {
  return Math.max(0, run.deadlineAt - clock.now());
}

/**
 * Takes the response over from Fastify and opens the SSE stream (status 200). No
 * `Connection` header of ours: Node's server answers the client's (keep-alive, or
 * close for `Connection: close` and HTTP/1.0, closing the socket after the stream).
 */
function openSse(reply: FastifyReply, requestId: string, headers: Record<string, string>): void {
  reply.hijack();
  reply.raw.writeHead(200, {
    ...(reply.getHeaders() as Record<string, string>),
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache',
    'x-accel-buffering': 'no',
    'x-request-id': requestId,
    ...headers,
  });
}

function write(raw: ServerResponse, s: string): boolean {
  return raw.write(s);
}
