/**
 * The chat-completions tool bridge (`x_exec: true`; reference: docs/EXEC.md,
 * "Chat-completions tool bridge").
 *
 * The bridge owns the tool list: the project's tools catalog (tools of online
 * agents) is offered to the model as function tools. Each round sends the
 * conversation upstream; when the model answers with tool calls, every call
 * runs as an invocation through the control plane (so the usual `exec.*`
 * events fire), the bridge waits for it, appends the assistant turn and one
 * `tool` message per call, and asks again. The first round without tool calls
 * is the answer. Round `MAX_ROUNDS` is sent with `tool_choice: "none"`, so a
 * model that keeps calling tools is made to answer; a worker that ignores it and
 * calls tools anyway ends the request with `upstream_error`, its calls not run.
 *
 * Bounds: the whole exchange (rounds and tool runs) lives within the tier's
 * request deadline; once a streamed answer has started, the idle timeout
 * applies instead, as for any stream. When the request ends early (timeout,
 * client gone, error) the invocations it started that are still in progress
 * are cancelled, so no tool keeps running for nobody.
 *
 * Streaming: every round is streamed from the worker. Chunks of a round are
 * held until the round shows what it is: a tool-call delta makes it a tool
 * round (nothing of it reaches the client), visible content makes it the
 * answer, forwarded from then on. Errors before the first forwarded chunk are
 * ordinary HTTP errors; after it they are SSE `error` events. Usage is summed
 * over the rounds: the one usage record of the request and the final usage
 * chunk (`include_usage`) carry the sum.
 */
import type { FastifyReply } from 'fastify';
import { CompletionAssembler } from '../completions/assemble.js';
import { ServiceError, type ErrorCode } from '../errors/index.js';
import { awaitInvocation, isSettled } from '../exec/await.js';
import type { CatalogEntry } from '../exec/catalog.js';
import type { PublicInvocation } from '../exec/invocations.js';
import type { ExecService } from '../exec/service.js';
import type { Clock } from '../runtime/clock.js';
import { shuttingDown, workerJson } from './admission.js';
import { Deadline } from './deadline.js';
import type { Logger } from '../runtime/logger.js';
import type { Tier } from '../tiers/index.js';
import {
  errorEventMessage,
  estimatedUsage,
  normalizeCompletion,
  StreamAccumulator,
  upstreamErrorMessage,
  usageChunk,
  type ChatCompletion,
  type ChatCompletionChunk,
  type ReframeContext,
  type ToolCall,
  type Usage,
} from './reframe.js';
import type { ChatRequest } from './request.js';
import { drained, isDone, parseSseStream, SSE_DONE, sseData, sseError } from './sse.js';
import { AFTER_DONE_MS, type UpstreamResponse } from './upstream.js';
import type { AbortLike } from '../runtime/cancel.js';

/** Upstream rounds per request; the last one may not call tools. */
export const MAX_ROUNDS = 8;

/** The request field naming the workspace the bridge's invocations run in. */
export const WORKSPACE_FIELD = 'x_exec_workspace_id';

export type BridgeOutcome = 'completed' | 'error' | 'timeout' | 'cancelled';

/** What chat.ts hands the bridge: the request, and its own upstream and recording paths. */
export interface BridgeRun {
  clock: Clock;
  logger: Logger;
  exec: ExecService;
  /** The key's project (internal id). */
  projectId: string;
  req: ChatRequest;
  /** The first round's upstream body (model, max_tokens and stream options set). */
  body: Record<string, unknown>;
  ctx: ReframeContext;
  tier: Tier;
  startedAt: number;
  /** What is left of the tier's deadline (ms): the router's queue may have spent some. */
  deadlineMs: number;
  reply: FastifyReply;
  /** Open streams, cancelled at the end of a shutdown's drain period. */
  streams: Set<() => void>;
  /** Posts one round upstream (worker failover and the token-count retry included). */
  send(body: Record<string, unknown>, signal: AbortLike): Promise<UpstreamResponse>;
  /** Response headers that depend on the worker that answered (worker id, clamp). */
  responseHeaders(): Record<string, string>;
  /** Usage fixups chat.ts applies to every response (reasoning tokens null). */
  fixUsage(usage: Usage): void;
  /** Writes the request's one usage record. */
  record(outcome: BridgeOutcome, usage: Usage | null, ttftMs: number | null): void;
  /** `store: true`: keeps the answer as the client got it (src/completions). */
  keep(body: string | object): void;
}

/**
 * Checks that need nothing but the request and the endpoint, before a worker
 * is picked: the bridge owns the tool list (client `tools` are refused), one
 * choice only, the endpoint model must call tools, and the workspace field
 * must be a string when present.
 */
export function checkBridgeRequest(
  req: ChatRequest,
  capabilities: readonly string[],
  modelName: string,
): void {
  if (req.tools !== undefined && req.tools.length > 0) {
    throw new ServiceError('unsupported_value', {
      message:
        "'tools' cannot be combined with 'x_exec': the tool bridge offers the project's tools catalog.",
      param: 'tools',
    });
  }
  if (req.n > 1) {
    throw new ServiceError('unsupported_value', {
      message: "Only n=1 is supported with 'x_exec'.",
      param: 'n',
    });
  }
  if (!capabilities.includes('tool_calling')) {
    throw new ServiceError('model_capability_missing', {
      message: `The model '${modelName}' lacks the 'tool_calling' capability 'x_exec' needs.`,
      param: 'x_exec',
    });
  }
  const ws = req.body[WORKSPACE_FIELD];
  if (ws !== undefined && ws !== null && typeof ws !== 'string') {
    throw new ServiceError('invalid_workspace_id', {
      message: `${WORKSPACE_FIELD} must have the form ws_<hex>.`,
      param: WORKSPACE_FIELD,
    });
  }
}

/** OpenAI function names are `^[a-zA-Z0-9_-]{1,64}$`; catalog names may hold dots. */
export function functionNames(tools: readonly string[]): Map<string, string> {
  const byFunction = new Map<string, string>();
  for (const name of tools) {
    const base = name.replace(/[^a-zA-Z0-9_-]/g, '_').slice(0, 64);
    let fn = base;
    for (let i = 2; byFunction.has(fn); i++) fn = `${base.slice(0, 60)}_${i}`;
    byFunction.set(fn, name);
  }
  return byFunction;
}

export function addUsage(a: Usage | null, b: Usage): Usage {
  if (a === null) return structuredClone(b);
  const sum = (x: number | null, y: number | null) =>
    x === null && y === null ? null : (x ?? 0) + (y ?? 0);
  return {
    prompt_tokens: a.prompt_tokens + b.prompt_tokens,
    completion_tokens: a.completion_tokens + b.completion_tokens,
    total_tokens: a.total_tokens + b.total_tokens,
    prompt_tokens_details: {
      cached_tokens: a.prompt_tokens_details.cached_tokens + b.prompt_tokens_details.cached_tokens,
      audio_tokens: sum(a.prompt_tokens_details.audio_tokens, b.prompt_tokens_details.audio_tokens),
    },
    completion_tokens_details: {
      reasoning_tokens: sum(
        a.completion_tokens_details.reasoning_tokens,
        b.completion_tokens_details.reasoning_tokens,
      ),
      audio_tokens: sum(
        a.completion_tokens_details.audio_tokens,
        b.completion_tokens_details.audio_tokens,
      ),
      accepted_prediction_tokens: sum(
        a.completion_tokens_details.accepted_prediction_tokens,
        b.completion_tokens_details.accepted_prediction_tokens,
      ),
      rejected_prediction_tokens: sum(
        a.completion_tokens_details.rejected_prediction_tokens,
        b.completion_tokens_details.rejected_prediction_tokens,
      ),
    },
  };
}

/** The `tool` message content for a settled invocation (JSON text). */
export function toolResultContent(inv: PublicInvocation): string {
  return JSON.stringify({
    invocation_id: inv.id,
    status: inv.status,
    exit_code: inv.exit_code,
    stdout: inv.stdout ?? '',
    stderr: inv.stderr ?? '',
    output_truncated: inv.output_truncated,
    error: inv.error,
  });
}

/** The `tool` message content for a call the bridge did not run. */
export function toolErrorContent(
  code: string,
  message: string,
  param: string | null = null,
): string {
  return JSON.stringify({ status: 'rejected', error: { code, message, param } });
}

interface Round {
  content: string | null;
  toolCalls: ToolCall[];
  usage: Usage;
}

class Aborted extends Error {
  constructor() {
    super('aborted');
    this.name = 'AbortError';
  }
}

/** One bridged request. */
export class ToolBridge {
  private readonly abort = new AbortController();
  /** The tier deadline until an answer streams, then the idle timeout. */
  private readonly bound: Deadline;
  private readonly started = new Set<string>();
  private catalog: CatalogEntry[] = [];
  private byFunction = new Map<string, string>();
  private workspaceId: string | null = null;
  private usage: Usage | null = null;
  private headersSent = false;
  private roleSent = false;
  private clientGone = false;
  private serverEnded = false;
  private ttftMs: number | null = null;
  private fingerprint: string | null = null;
  /** A round was sent to the worker and its usage is not counted yet. */
  private roundOpen = false;
  /** `store: true` and streaming: the answer's chunks as sent, assembled. */
  private readonly kept: CompletionAssembler | null;

  constructor(private readonly r: BridgeRun) {
    const idleMs = r.req.reasoningEffort ? r.tier.requestDeadlineMs : r.tier.idleTimeoutMs;
    this.bound = new Deadline(r.clock, this.abort, r.deadlineMs, idleMs, false);
    this.kept = r.req.store && r.req.stream ? new CompletionAssembler(r.ctx) : null;
  }

  async run(): Promise<void> {
    const r = this.r;
    const raw = r.reply.raw;
    const onClose = () => {
      if (!raw.writableFinished) {
        this.clientGone = true;
        this.abort.abort();
      }
    };
    raw.on('close', onClose);
    const cancel = () => {
      this.serverEnded = true;
      this.abort.abort();
    };
    r.streams.add(cancel);
    let outcome: BridgeOutcome = 'error';
    try {
      await this.prepare();
      outcome = await this.loop();
    } catch (err) {
      outcome = this.bound.timedOut ? 'timeout' : this.abort.signal.aborted ? 'cancelled' : 'error';
      // A round the client or the deadline ended while the worker had it: the tokens it
      // generated are unknown, its prompt was read, so that is billed at the router's
      // estimate, as chat.ts bills such a request (docs/INFERENCE.md, "Usage records").
      if (this.roundOpen && outcome !== 'error') {
        this.addUsage(estimatedUsage(r.ctx.promptTokensEstimate ?? 0, 0));
      }
      await this.fail(err);
    } finally {
      this.bound.clear();
      r.streams.delete(cancel);
      raw.off('close', onClose);
      r.record(outcome, this.usage, this.ttftMs);
      if (outcome !== 'completed') await this.cancelLeftovers();
    }
  }

  /**
   * Workspace, then catalog, before the first upstream call: a malformed or unknown
   * workspace is the client's 4xx whether or not an agent is online (docs/EXEC.md).
   */
  private async prepare(): Promise<void> {
    const r = this.r;
    const ws = r.req.body[WORKSPACE_FIELD];
    if (typeof ws === 'string' && ws !== '') {
      this.workspaceId = (
        await r.exec.workspaces.resolve(r.projectId, ws, WORKSPACE_FIELD)
      ).externalId;
    }
    this.catalog = await r.exec.catalog.list(r.projectId);
    if (this.catalog.length === 0) {
      throw new ServiceError('tool_executor_unavailable', {
        message: 'No execution agent of this project is online; x_exec has no tools to offer.',
        headers: { 'Retry-After': '5' },
      });
    }
    this.byFunction = functionNames(this.catalog.map((e) => e.spec.name));
  }

  private tools(): Array<Record<string, unknown>> {
    const spec = new Map(this.catalog.map((e) => [e.spec.name, e.spec]));
    return [...this.byFunction].map(([fn, name]) => ({
      type: 'function',
      function: {
        name: fn,
        description: spec.get(name)!.description,
        parameters: spec.get(name)!.input_schema,
      },
    }));
  }

  private async loop(): Promise<BridgeOutcome> {
    const r = this.r;
    const messages: unknown[] = [...r.req.messages];
    const tools = this.tools();
    for (let round = 1; ; round++) {
      const body: Record<string, unknown> = { ...r.body, messages, tools };
      if (round >= MAX_ROUNDS) body.tool_choice = 'none';
      this.roundOpen = true;
      const res = await r.send(body, this.abort.signal);
      const out = r.req.stream ? await this.streamRound(res) : await this.completeRound(res);
      if (out === 'answered') return 'completed';
      if (round >= MAX_ROUNDS) {
        // Some workers ignore tool_choice (Ollama's OpenAI layer does): the last
        // round's calls are not run, and no further round is asked for.
        throw new ServiceError('upstream_error', {
          message: `The model kept calling tools after ${MAX_ROUNDS} rounds, the last with tool_choice "none"; the bridge stopped without an answer.`,
        });
      }
      messages.push({ role: 'assistant', content: out.content, tool_calls: out.toolCalls });
      const results = await Promise.all(out.toolCalls.map((c) => this.runCall(c)));
      out.toolCalls.forEach((c, i) =>
        messages.push({ role: 'tool', tool_call_id: c.id, content: results[i] }),
      );
    }
  }

  private addUsage(u: Usage): void {
    this.roundOpen = false;
    this.r.fixUsage(u);
    this.usage = addUsage(this.usage, u);
  }

  /**
   * A streamed round that ended early (client gone, timeout, the worker's error)
   * is billed as chat.ts bills such a stream: what it generated (the worker's count
   * or the estimate of what streamed), and its prompt when the request was ended
   * while the worker had it; a worker that failed before generating anything, free.
   */
  private addUnfinished(acc: StreamAccumulator, ended: boolean): void {
    const s = acc.summary();
    if (ended || s.usageReported || s.ttftMs !== null) this.addUsage(s.usage);
  }

  private async completeRound(res: UpstreamResponse): Promise<Round | 'answered'> {
    const r = this.r;
    const text = await res.body.text();
    const parsed = workerJson(text);
    const completion: ChatCompletion = normalizeCompletion(parsed, r.ctx);
    this.addUsage(completion.usage);
    const choice = completion.choices[0];
    const calls = choice?.message.tool_calls ?? [];
    if (calls.length > 0) {
      return { content: choice!.message.content, toolCalls: calls, usage: completion.usage };
    }
    completion.usage = this.usage!;
    r.reply.headers(r.responseHeaders());
    const json = JSON.stringify(completion);
    r.reply.type('application/json').send(json);
    if (r.req.store) r.keep(json);
    return 'answered';
  }

  private async streamRound(res: UpstreamResponse): Promise<Round | 'answered'> {
    const r = this.r;
    const acc = new StreamAccumulator(r.ctx, r.startedAt);
    const held: ChatCompletionChunk[] = [];
    const calls: Array<{ id: string; name: string; arguments: string }> = [];
    let mode: 'undecided' | 'answer' | 'tool' = 'undecided';
    let content = '';
    let done = false;
    let upstreamError: string | null = null;
    try {
      // parseSseStream ends with the parser's end(): a last event the worker closed
      // without its blank line (a bare `data: [DONE]`) still counts.
      for await (const ev of parseSseStream(res.body as AsyncIterable<Uint8Array>)) {
        this.bound.touch();
        if (isDone(ev)) {
          // The end of the round, whatever follows it (chat.ts reads it so too).
          done = true;
          res.body.discard(r.clock, AFTER_DONE_MS);
          break;
        }
        if (ev.event === 'error') {
          upstreamError = errorEventMessage(ev.data);
          break;
        }
        let payload: unknown;
        try {
          payload = JSON.parse(ev.data);
        } catch {
          continue;
        }
        const errMsg = upstreamErrorMessage(payload);
        if (errMsg !== null) {
          upstreamError = errMsg;
          break;
        }
        const chunk = acc.accept(payload, r.clock.now());
        if (chunk === null) continue;
        const delta = chunk.choices[0]?.delta;
        if (delta?.tool_calls && delta.tool_calls.length > 0) {
          mode = 'tool';
          for (const d of delta.tool_calls) {
            const c = (calls[d.index] ??= { id: '', name: '', arguments: '' });
            if (d.id) c.id = d.id;
            if (d.function?.name) c.name += d.function.name;
            if (d.function?.arguments) c.arguments += d.function.arguments;
          }
        }
        if (delta?.content) content += delta.content;
        if (mode === 'tool') continue;
        const visible = Boolean(delta?.content || delta?.refusal);
        if (mode === 'undecided' && !visible) {
          held.push(chunk);
          continue;
        }
        if (mode === 'undecided') {
          mode = 'answer';
          this.ttftMs = r.clock.now() - r.startedAt;
          this.bound.started();
          for (const h of held.splice(0)) await this.forward(h);
        }
        await this.forward(chunk);
      }
    } catch (err) {
      if (this.abort.signal.aborted) {
        this.addUnfinished(acc, true);
        throw new Aborted();
      }
      r.logger.warn({ err }, 'worker stream failed (tool bridge)');
      upstreamError = 'The inference worker ended the stream.';
    }
    // A worker that closed without `[DONE]` once every choice had its finish_reason ended
    // the answer (chat.ts reads it so too).
    if (upstreamError === null && acc.finished) done = true;
    if (upstreamError !== null || !done || !acc.choicesSeen) {
      this.addUnfinished(acc, false);
      throw new ServiceError(this.headersSent ? 'cancelled' : 'upstream_error', {
        message: upstreamError ?? 'The inference worker ended the stream early.',
      });
    }
    const s = acc.summary();
    this.addUsage(s.usage);
    this.fingerprint = s.systemFingerprint ?? this.fingerprint;
    const toolCalls: ToolCall[] = calls
      .filter((c) => c !== undefined)
      .map((c, i) => ({
        id: c.id || `call_${r.ctx.id}_${i}`,
        type: 'function',
        function: { name: c.name, arguments: c.arguments },
      }));
    if (toolCalls.length > 0) return { content: content || null, toolCalls, usage: s.usage };
    // The answer (possibly without visible text): send what was held, then the end.
    if (this.ttftMs === null) this.ttftMs = r.clock.now() - r.startedAt;
    for (const h of held) await this.forward(h);
    const closing = acc.closingChunk();
    if (closing !== null) await this.forward(closing);
    this.head();
    const raw = r.reply.raw;
    if (r.req.includeUsage) raw.write(sseData(usageChunk(this.usage!, r.ctx, this.fingerprint)));
    raw.end(SSE_DONE);
    if (this.kept !== null) r.keep(this.kept.completion(this.usage!));
    return 'answered';
  }

  private head(): void {
    if (this.headersSent) return;
    const r = this.r;
    r.reply.hijack();
    r.reply.raw.writeHead(200, {
      ...(r.reply.getHeaders() as Record<string, string>),
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      'x-accel-buffering': 'no',
      'x-request-id': r.ctx.id,
      ...lower(r.responseHeaders()),
    });
    this.headersSent = true;
  }

  private async forward(chunk: ChatCompletionChunk): Promise<void> {
    this.head();
    for (const c of chunk.choices) {
      if (this.roleSent) delete c.delta.role;
      else c.delta.role = 'assistant';
    }
    this.roleSent = true;
    this.kept?.add(chunk);
    const raw = this.r.reply.raw;
    if (!raw.write(sseData(chunk))) await drained(raw, this.abort.signal);
  }

  /** Runs one tool call; resolves with the `tool` message content. */
  private async runCall(call: ToolCall): Promise<string> {
    const r = this.r;
    const tool = this.byFunction.get(call.function.name);
    if (tool === undefined) {
      return toolErrorContent(
        'exec_tool_not_found',
        `No tool named '${call.function.name}' is offered.`,
        'name',
      );
    }
    let args: unknown;
    try {
      args = call.function.arguments.trim() === '' ? {} : JSON.parse(call.function.arguments);
    } catch {
      return toolErrorContent('invalid_body', 'The arguments are not valid JSON.', 'arguments');
    }
    if (args === null || typeof args !== 'object' || Array.isArray(args)) {
      return toolErrorContent('invalid_body', 'The arguments must be a JSON object.', 'arguments');
    }
    if (!(await r.exec.catalog.available(r.projectId, tool))) throw executorUnavailable(tool);
    const workspaceId = await this.workspace();
    let inv: PublicInvocation;
    try {
      inv = (
        await r.exec.invocations.create(
          r.projectId,
          { tool, arguments: args, workspace_id: workspaceId },
          undefined,
        )
      ).invocation;
    } catch (err) {
      if (!(err instanceof ServiceError)) throw err;
      if (err.code === 'exec_tool_not_found') throw executorUnavailable(tool);
      if (err.code === 'invalid_body') return toolErrorContent(err.code, err.message, err.param);
      throw err;
    }
    this.started.add(inv.id);
    const settled = await awaitInvocation(r.exec, r.projectId, inv.id, {
      signal: this.abort.signal,
    });
    if (!isSettled(settled)) throw new Aborted();
    return toolResultContent(settled);
  }

  /** The request's workspace: the one named, else one created on the first tool call. */
  private async workspace(): Promise<string> {
    if (this.workspaceId) return this.workspaceId;
    const r = this.r;
    const ws = await r.exec.workspaces.create(r.projectId, {
      name: `chat ${r.ctx.id}`,
      metadata: { request_id: r.ctx.id },
    });
    this.workspaceId = ws.id;
    return ws.id;
  }

  private async cancelLeftovers(): Promise<void> {
    const r = this.r;
    for (const id of this.started) {
      try {
        const inv = await r.exec.invocations.get(r.projectId, id);
        if (!isSettled(inv)) await r.exec.invocations.cancel(r.projectId, id);
      } catch (err) {
        if (!(err instanceof ServiceError && err.code === 'invocation_terminal')) {
          r.logger.warn({ err, invocation: id }, 'tool bridge could not cancel an invocation');
        }
      }
    }
  }

  /** Ends the request after a failure: an HTTP error before the stream started, else an SSE error. */
  private async fail(err: unknown): Promise<void> {
    const r = this.r;
    const raw = r.reply.raw;
    if (this.bound.timedOut) {
      const message =
        this.bound.timedOut === 'idle'
          ? 'The stream was idle longer than the idle timeout.'
          : `The request exceeded the ${r.tier.id} tier deadline of ${r.tier.requestDeadlineMs / 1000} s.`;
      if (!r.req.stream) throw new ServiceError('request_timeout', { message });
      this.head();
      raw.end(sseError('request_timeout', message));
      return;
    }
    if (this.serverEnded) {
      if (!this.headersSent) {
        throw shuttingDown();
      }
      raw.end(sseError('cancelled', 'The server is shutting down; the stream was ended.'));
      return;
    }
    if (this.clientGone) {
      if (!this.headersSent) r.reply.hijack();
      raw.destroy();
      return;
    }
    const e =
      err instanceof ServiceError
        ? err
        : new ServiceError('upstream_error', {
            message: 'The inference worker could not be reached.',
            cause: err,
          });
    if (!this.headersSent) throw e;
    raw.end(sseError(e.code as ErrorCode, e.message, e.param));
  }
}

function executorUnavailable(tool: string): ServiceError {
  return new ServiceError('tool_executor_unavailable', {
    message: `No agent is online for the tool '${tool}'.`,
    headers: { 'Retry-After': '5' },
  });
}

function lower(h: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(h).map(([k, v]) => [k.toLowerCase(), v]));
}
