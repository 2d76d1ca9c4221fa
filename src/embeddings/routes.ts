/**
 * The pooling routes under `/<project_id>/<endpoint_slug>/v1` (scope `inference`):
 *
 * - `POST /embeddings`: OpenAI's request and response, so `client.embeddings.create`
 *   works unchanged (the SDK asks for `base64` and decodes it). Needs the endpoint's
 *   model to declare `embeddings`.
 * - `POST /rerank` (also `<endpoint>/v2/rerank` and `<endpoint>/rerank`, vLLM's
 *   paths): vLLM's (Cohere-style) request; the answer is `{id, model, usage:
 *   {total_tokens}, results: [{index, relevance_score, document?: {text}}]}`, best
 *   first, cut to `top_n`. Needs `rerank`.
 * - `POST /score` (also `<endpoint>/score`): vLLM's `{text_1, text_2}`; the answer is `{id, object: "list",
 *   created, model, data: [{index, object: "score", score}], usage}` in request order.
 *   Needs `rerank` (the spec: scoring uses the endpoint's reranker model).
 *
 * The path is chat completions' (inference/target.ts, inference/admission.ts): key,
 * endpoint, binding, status, limits, credit, a worker from the pool (no prefix
 * affinity: a pooling request leaves nothing in the KV cache worth coming back to),
 * the tier's deadline (408 `request_timeout` past it, the upstream request aborted),
 * failover to another worker before the first byte on a connection error, a 5xx or a
 * 429 (then 429 `capacity_exceeded`), a client that leaves aborts the worker's request.
 *
 * What workers return is normalised: `id` is the request's `X-Request-ID`, `model`
 * the endpoint's model, vectors in the encoding the client asked for whatever the
 * worker sent (llama.cpp's server answers floats to a `base64` request), results
 * ordered and cut here too. Usage (prompt tokens; no completion) is recorded like a
 * chat completion's, and counts against the endpoint's tokens per minute.
 */
import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import { costMicrocents } from '../billing/gate.js';
import type { Endpoint } from '../endpoints/repository.js';
import { ServiceError } from '../errors/index.js';
import { clientJson, deferJsonErrors } from '../http/json-body.js';
import { tooManyRequests } from '../http/limits.js';
import {
  admitWorker,
  deadlineMessage,
  failedRequest,
  retryAfter,
  SATURATED,
  upstreamFailure,
  workerJson,
} from '../inference/admission.js';
import { CHARS_PER_TOKEN } from '../inference/clamp.js';
import { Deadline } from '../inference/deadline.js';
import { resolveTarget, type Target } from '../inference/target.js';
import type { Lease, RouteHints } from '../routing/pool.js';
import type { WorkerRecord } from '../routing/registry.js';
import { Cancellation } from '../runtime/cancel.js';
import type { Services } from '../runtime/services.js';
import {
  parseEmbeddingsRequest,
  parseRerankRequest,
  parseScoreRequest,
  ROUTER_ONLY_FIELDS,
  type EmbeddingsRequest,
  type RerankRequest,
  type ScoreRequest,
} from './request.js';
import { normalizeEmbeddings, normalizeRerank, normalizeScore } from './response.js';

type Task = 'embeddings' | 'rerank' | 'score';

const CAPABILITY: Record<Task, string> = {
  embeddings: 'embeddings',
  rerank: 'rerank',
  score: 'rerank',
};

/** How many workers one request may try (failover before the first byte). */
const MAX_WORKER_TRIES = 3;

type Outcome = 'completed' | 'error' | 'timeout' | 'cancelled';

/** What one task needs: the parsed request and how to turn the worker's answer into ours. */
interface Job {
  body: Record<string, unknown>;
  user: string | null;
  /** The router's estimate of the prompt tokens (for the scorer). */
  estimate: number;
  /** More tokens than any tokenizer makes of these inputs (response.ts, `promptTokensOf`). */
  ceiling: number;
  respond(worker: unknown, meta: Meta): { response: unknown; promptTokens: number };
}

export interface Meta {
  id: string;
  created: number;
  model: string;
  estimate: number;
  ceiling: number;
}

function estimateTokens(texts: Iterable<string>): number {
  let chars = 0;
  for (const t of texts) chars += t.length;
  return Math.ceil(chars / CHARS_PER_TOKEN);
}

/** Tokens a sequence may add around its text (BOS, EOS, separators). */
const SPECIAL_TOKENS = 8;

/**
 * An upper bound on the tokens of `sequences` texts totalling `chars` UTF-16 units:
 * at most 3 UTF-8 bytes per unit, and no tokenizer (byte-level BPE, SentencePiece
 * with byte fallback) makes more than one token of a byte.
 */
function tokenCeiling(chars: number, sequences: number): number {
  return 3 * chars + SPECIAL_TOKENS * sequences;
}

function charsOf(texts: Iterable<string>): number {
  let chars = 0;
  for (const t of texts) chars += t.length;
  return chars;
}

function embeddingsJob(r: EmbeddingsRequest): Job {
  let estimate = 0;
  let ceiling = 0;
  for (const i of r.inputs) {
    estimate += 'text' in i ? estimateTokens([i.text]) : i.ids.length;
    ceiling += 'text' in i ? tokenCeiling(i.text.length, 1) : i.ids.length + SPECIAL_TOKENS;
  }
  return {
    body: r.body,
    user: r.user,
    estimate,
    ceiling,
    respond: (w, meta) => normalizeEmbeddings(w, r, meta),
  };
}

function rerankJob(r: RerankRequest): Job {
  return {
    body: r.body,
    user: r.user,
    estimate: estimateTokens(r.documents) + estimateTokens([r.query]) * r.documents.length,
    ceiling: tokenCeiling(
      charsOf(r.documents) + r.query.length * r.documents.length,
      r.documents.length,
    ),
    respond: (w, meta) => normalizeRerank(w, r, meta),
  };
}

function scoreJob(r: ScoreRequest): Job {
  return {
    body: r.body,
    user: r.user,
    estimate: estimateTokens(r.pairs.flat()),
    ceiling: tokenCeiling(charsOf(r.pairs.flat()), r.pairs.length),
    respond: (w, meta) => normalizeScore(w, r, meta),
  };
}

const PARSE: Record<Task, (body: unknown) => Job> = {
  embeddings: (b) => embeddingsJob(parseEmbeddingsRequest(b)),
  rerank: (b) => rerankJob(parseRerankRequest(b)),
  score: (b) => scoreJob(parseScoreRequest(b)),
};

function requireCapability(task: Task, e: Endpoint): void {
  const cap = CAPABILITY[task];
  if (!e.capabilities.includes(cap)) {
    throw new ServiceError('model_capability_missing', {
      message: `The model '${e.modelName}' lacks the '${cap}' capability /v1/${task} needs.`,
    });
  }
}

function upstreamBody(job: Job, model: string): string {
  const body: Record<string, unknown> = { ...job.body };
  for (const f of ROUTER_ONLY_FIELDS) delete body[f];
  body.model = model;
  return clientJson(body);
}

class Pooling {
  constructor(private readonly s: Services) {}

  handler(task: Task) {
    return (request: FastifyRequest, reply: FastifyReply) => this.serve(task, request, reply);
  }

  private async serve(task: Task, request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const s = this.s;
    const startedAt = s.clock.now();
    const target = await resolveTarget(
      { verifier: s.verifier, endpoints: s.resolveEndpoint, tiers: s.tiers, limits: s.limits },
      request,
      reply,
    );
    const { key, endpoint, tier } = target;
    const job = PARSE[task](target.body);
    requireCapability(task, endpoint);
    await s.billing.check(key.projectId, endpoint.promptPriceCentsPerMtok > 0);

    const deadlineAt = startedAt + tier.requestDeadlineMs;
    const candidates = await s.pool.candidates(endpoint.modelId, endpoint.tierId);
    const hints: RouteHints = {
      blocks: { hashes: [], chars: 0 },
      promptTokens: job.estimate,
      slo: {},
      tier: 'default',
    };
    const first = await admitWorker(s, reply, candidates, hints, deadlineAt);
    if (first === 'timeout') {
      throw new ServiceError('request_timeout', { message: deadlineMessage(tier) });
    }
    let lease: Lease = first;
    const tried = new Set([lease.worker.id]);
    /** Another worker not yet tried, before anything reached the client; or false. */
    const failover = (failed: boolean): boolean => {
      if (failed) s.pool.failure(lease.worker.id);
      if (tried.size >= MAX_WORKER_TRIES) return false;
      const next = s.pool.route(candidates, hints, tried);
      if (!next) return false;
      s.pool.abandon(lease);
      lease = next;
      tried.add(next.worker.id);
      return true;
    };

    const abort = new Cancellation();
    const deadline = new Deadline(s.clock, abort, Math.max(0, deadlineAt - s.clock.now()), null);
    const onClose = () => {
      if (!reply.raw.writableFinished) abort.abort();
    };
    reply.raw.on('close', onClose);
    const body = upstreamBody(job, endpoint.modelName);
    let outcome: Outcome = 'error';
    let promptTokens = 0;
    let sent = false;
    try {
      let text: string;
      for (;;) {
        let res;
        try {
          sent = true;
          res = await s.upstream.post(lease.worker.url, `/${task}`, body, abort.signal);
        } catch (err) {
          if (abort.signal.aborted || !failover(true)) throw err;
          s.logger.warn({ err, next: lease.worker.id }, 'worker unreachable; failing over');
          continue;
        }
        if (res.statusCode !== 200) {
          const errText = await res.body.text();
          if (res.statusCode === 429) {
            if (failover(false)) continue;
            throw tooManyRequests(
              'capacity_exceeded',
              retryAfter(res.headers, s.clock.now()),
              SATURATED,
            );
          }
          if (res.statusCode >= 500 && failover(true)) continue;
          throw upstreamFailure(res.statusCode, errText);
        }
        try {
          text = await res.body.text();
          break;
        } catch (err) {
          if (abort.signal.aborted || !failover(true)) throw err;
        }
      }
      s.pool.success(lease.worker.id);
      const parsed = workerJson(text);
      const out = job.respond(parsed, {
        id: request.id,
        created: Math.floor(startedAt / 1000),
        model: endpoint.modelName,
        estimate: job.estimate,
        ceiling: job.ceiling,
      });
      promptTokens = out.promptTokens;
      outcome = 'completed';
      reply.header('X-Service-Worker-ID', lease.worker.id);
      reply.type('application/json').send(JSON.stringify(out.response));
    } catch (err) {
      const end = failedRequest(err, { deadline, aborted: abort.signal.aborted, reply, tier });
      outcome = end.outcome;
      // Ended by the client or the deadline after a worker had the inputs: it read
      // them, so they are billed at the router's estimate, as a chat request's prompt.
      if ((outcome === 'cancelled' || outcome === 'timeout') && sent) promptTokens = job.estimate;
      if (end.error) throw end.error;
    } finally {
      deadline.clear();
      reply.raw.off('close', onClose);
      this.record(request, target, job, lease.worker, outcome, promptTokens, startedAt);
      if (outcome === 'completed') s.pool.finish(lease, {});
      else s.pool.abandon(lease);
    }
  }

  private record(
    request: FastifyRequest,
    { key, endpoint, tier }: Target,
    job: Job,
    worker: WorkerRecord,
    outcome: Outcome,
    promptTokens: number,
    startedAt: number,
  ): void {
    const s = this.s;
    if (promptTokens > 0) void s.limits.addTokens(endpoint.id, promptTokens);
    s.metrics.endpointRequests.inc({ endpoint: endpoint.id, outcome });
    s.usage.record({
      requestId: request.id,
      projectId: key.projectId,
      endpointId: endpoint.id,
      keyId: key.id,
      workerId: worker.id,
      model: endpoint.modelName,
      tierId: endpoint.tierId,
      serviceTierHint: null,
      priceMultiplier: 1,
      status: outcome,
      stream: 0,
      promptTokens,
      completionTokens: 0,
      costMicrocents: costMicrocents(
        { promptTokens, completionTokens: 0 },
        endpoint,
        tier.priceMultiplier,
      ),
      cachedTokens: 0,
      reasoningTokens: null,
      acceptedPredictionTokens: null,
      rejectedPredictionTokens: null,
      ttftMs: null,
      durationMs: s.clock.now() - startedAt,
      user: job.user,
      metadata: null,
      createdAt: new Date(startedAt),
    });
  }
}

export function embeddingRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    const pooling = new Pooling(s);
    // The key answers before a malformed body (http/json-body.ts).
    deferJsonErrors(app, s.verifier);
    app.post('/:projectId/:endpointSlug/v1/embeddings', pooling.handler('embeddings'));
    // vLLM's paths: Cohere's v2 clients post to `<base>/v2/rerank`, Jina's and older
    // Cohere ones to `/v1/rerank`, some to `/rerank` and `/score` at the root.
    for (const path of ['v1/rerank', 'v2/rerank', 'rerank']) {
      app.post(`/:projectId/:endpointSlug/${path}`, pooling.handler('rerank'));
    }
    for (const path of ['v1/score', 'score']) {
      app.post(`/:projectId/:endpointSlug/${path}`, pooling.handler('score'));
    }
  };
}
