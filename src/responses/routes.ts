/**
 * OpenAI's Responses API under `/<project_id>/<endpoint_slug>/v1` (scope `inference`):
 * `POST /responses` (JSON, or SSE with `stream: true`), `GET /responses/{id}`,
 * `DELETE /responses/{id}`, `GET /responses/{id}/input_items` (`GET` with `stream=true`
 * is 400: OpenAI streams only background responses on retrieve, and there are none).
 *
 * A response is a chat completion underneath. The request becomes a chat body
 * (request.ts), which runs through the chat route in-process (`app.inject`, acting
 * as the caller's key through http/internal-key.ts), so the key's scopes, the
 * endpoint, limits, the clamp, routing, failover, timeouts, usage records and
 * billing are exactly chat's. The inference limits are counted once, when the
 * response is asked for (inference/target.ts, as chat does), not by the chat call.
 * The injected request streams (`payloadAsStream`): SSE chunks become Responses
 * events as they arrive (output.ts), a slow client holds the
 * chat stream back (its route then stops reading the worker's), and a client that goes
 * away destroys the injected response, which aborts the worker's request as a
 * disconnect from chat would.
 *
 * Errors from the chat path come back with their status, code and headers
 * (`Retry-After`, rate-limit headers), `param` renamed to the Responses field
 * (`max_output_tokens`, `text.format`, `input`). Once a stream has started, a failure
 * is an `error` event and `response.failed`.
 *
 * Stored responses (`store`, default true; a failed one too, `status: "failed"` with its
 * `error`) keep the Response, its input items and the conversation as chat messages; `previous_response_id` continues from them, only
 * through the endpoint that made them (an unknown one, or another endpoint's, is 404
 * `response_not_found`). A key bound to one endpoint sees only the responses made
 * through it. `response.completed` (also for `incomplete`) and
 * `response.failed` events are emitted for webhooks, stored or not.
 */
import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import type { Readable } from 'node:stream';
import { and, eq } from 'drizzle-orm';
import { ConversationService, type Item } from '../conversations/service.js';
import type { Endpoint } from '../endpoints/repository.js';
import { ServiceError } from '../errors/index.js';
import { emitEvent } from '../events/outbox.js';
import { authenticateKey, keyEndpoint } from '../http/auth.js';
import {
  INTERNAL_CALL_HEADER,
  INTERNAL_KEY_HEADER,
  internalCall,
  internalKeyCredential,
} from '../http/internal-key.js';
import { clientJson, deferJsonErrors, unstorableRefusal } from '../http/json-body.js';
import { managementHeaders } from '../http/limits.js';
import { listPage, listQuery } from '../http/validate.js';
import { drained, isDone, SseParser } from '../inference/sse.js';
import { resolveTarget } from '../inference/target.js';
import type { KeyRecord } from '../keys/index.js';
import type { Services } from '../runtime/services.js';
import { tables } from '../store/index.js';
import { storableValue } from '../store/storable.js';
import {
  fromCompletion,
  newId,
  outputMessages,
  responseObject,
  ResponseStream,
  type Json,
  type Shell,
} from './output.js';
import {
  chatBody,
  parseResponsesRequest,
  responsesParam,
  storedItem,
  toChatMessages,
  type InputItem,
  type ResponsesRequest,
} from './request.js';

const { responses } = tables;

/** Headers of the chat answer that the Responses answer carries too. */
const PASSED_HEADERS = [
  'retry-after',
  'ratelimit-limit',
  'ratelimit-remaining',
  'ratelimit-reset',
  'x-ratelimit-limit',
  'x-ratelimit-remaining',
  'x-ratelimit-reset',
  'x-ratelimit-warning',
  'x-service-worker-id',
  'x-service-max-tokens-clamped',
];

/** Request headers the chat route reads (routing hints). */
const FORWARDED_HEADERS = ['x-slo-ttft-ms', 'x-slo-tpot-ms'];

interface Params {
  projectId: string;
  endpointSlug: string;
  responseId?: string;
}

function readAll(stream: Readable): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    stream.on('data', (c: Buffer) => chunks.push(c));
    stream.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    stream.on('error', reject);
  });
}

/** A chat error answer as the Responses API's error (param renamed). */
function chatError(status: number, text: string, headers: Record<string, unknown>): ServiceError {
  let e: { code?: unknown; message?: unknown; param?: unknown } = {};
  try {
    e = ((JSON.parse(text) as { error?: typeof e }).error ?? {}) as typeof e;
  } catch {
    // not the service's envelope
  }
  const code = typeof e.code === 'string' ? e.code : 'internal_error';
  const passed: Record<string, string> = {};
  for (const h of PASSED_HEADERS) if (headers[h] !== undefined) passed[h] = String(headers[h]);
  const extra: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(e)) {
    if (!['code', 'message', 'param', 'type'].includes(k)) extra[k] = v;
  }
  const chatParam = typeof e.param === 'string' ? e.param : null;
  const param = responsesParam(chatParam);
  let message = typeof e.message === 'string' ? e.message : `The request failed (HTTP ${status}).`;
  // The message names the field as the chat route saw it: in this API's terms instead.
  if (chatParam !== null && param !== null) message = message.replaceAll(chatParam, param);
  return new ServiceError(code as never, {
    message,
    param,
    headers: passed,
    extra,
  });
}

class ResponsesApi {
  constructor(
    private readonly s: Services,
    private readonly app: FastifyInstance,
    private readonly conversations: ConversationService,
  ) {}

  /**
   * The key and the path's endpoint for a read or a delete of a stored response, whose
   * key quota is counted, after the endpoint binding as on chat (a response's creation
   * counts the inference limits, the quota among them, in `create`).
   */
  private async access(
    request: FastifyRequest<{ Params: Params }>,
    reply: FastifyReply,
  ): Promise<{ key: KeyRecord; endpoint: Endpoint }> {
    const { projectId, endpointSlug } = request.params;
    const key = await authenticateKey(this.s.verifier, request, projectId, 'inference');
    const endpoint = await keyEndpoint(this.s.resolveEndpoint, key, endpointSlug);
    const d = await this.s.limits.keyQuota(key);
    if (d) reply.headers(managementHeaders(d));
    return { key, endpoint };
  }

  private async stored(key: KeyRecord, id: string) {
    const rows = await this.s.store.db
      .select()
      .from(responses)
      .where(and(eq(responses.id, id), eq(responses.projectId, key.projectId)))
      .limit(1);
    const row = rows[0];
    // A bound key sees only what its endpoint made.
    if (!row || (key.endpointId && key.endpointId !== row.endpointId)) return null;
    return row;
  }

  private notFound(id: string, param: string | null = null): ServiceError {
    return new ServiceError('response_not_found', {
      message: `No response with id '${id}'.`,
      param,
    });
  }

  create = async (request: FastifyRequest<{ Params: Params }>, reply: FastifyReply) => {
    const s = this.s;
    // The inference limits (the key's quota among them) as chat counts them, when the
    // response is asked for: before its body is checked or what it names is read. Its
    // chat call does not count them again (`internalCall({ admitted })`).
    const {
      key,
      endpoint,
      body: raw,
    } = await resolveTarget(
      { verifier: s.verifier, endpoints: s.resolveEndpoint, tiers: s.tiers, limits: s.limits },
      request,
      reply,
    );
    // Stored after the worker's answer (maybe already streamed): refuse what
    // cannot be stored before anything runs.
    const refused = unstorableRefusal(raw);
    if (refused !== null) throw refused;
    const r = parseResponsesRequest(raw);
    let history: Json[] = [];
    if (r.previousResponseId) {
      const prev = await this.stored(key, r.previousResponseId);
      // Only a response made through this endpoint continues here, whatever the key:
      // another endpoint's is not found, as an unknown one (its content stays there).
      if (!prev || prev.endpointId !== endpoint.id) {
        throw this.notFound(r.previousResponseId, 'previous_response_id');
      }
      history = prev.messages;
    }
    if (r.conversationId !== null) {
      const items = await this.conversations.allItems(
        { projectId: key.projectId, boundTo: key.endpointId, through: endpoint.id },
        r.conversationId,
      );
      if (!items) {
        throw new ServiceError('invalid_value', {
          message: `Conversation with id '${r.conversationId}' not found.`,
          param: 'conversation',
        });
      }
      history = toChatMessages(items as unknown as InputItem[]);
    }
    const body = chatBody(r, history);
    if (r.stream) body.stream_options = { include_usage: true };

    const headers: Record<string, string> = {
      'content-type': 'application/json',
      [INTERNAL_KEY_HEADER]: internalKeyCredential(key.projectId, key.id),
    };
    for (const h of FORWARDED_HEADERS) {
      const v = request.headers[h];
      if (typeof v === 'string') headers[h] = v;
    }
    // The client leaving ends the chat request as a disconnect would, at any stage.
    const call = internalCall({ admitted: true });
    headers[INTERNAL_CALL_HEADER] = call.id;
    const onClose = () => {
      if (!reply.raw.writableFinished) call.abort();
    };
    reply.raw.on('close', onClose);
    try {
      await this.run(key, endpoint, r, history, body, headers, request, reply);
    } catch (err) {
      if (reply.raw.destroyed) {
        // Nobody to answer.
        reply.hijack();
        return;
      }
      throw err;
    } finally {
      reply.raw.off('close', onClose);
      call.done();
    }
  };

  private async run(
    key: KeyRecord,
    endpoint: Endpoint,
    r: ResponsesRequest,
    history: Json[],
    body: Json,
    headers: Record<string, string>,
    request: FastifyRequest<{ Params: Params }>,
    reply: FastifyReply,
  ): Promise<void> {
    const s = this.s;
    const res = await this.app.inject({
      method: 'POST',
      url: `/${request.params.projectId}/${request.params.endpointSlug}/v1/chat/completions`,
      headers,
      payload: clientJson(body as Record<string, unknown>),
      payloadAsStream: true,
    });
    const stream = res.stream();
    const shell: Shell = {
      id: newId('resp'),
      createdAt: Math.floor(s.clock.now() / 1000),
      model: endpoint.modelName,
      serviceTier: endpoint.tierId,
      request: r,
    };
    const isSse = String(res.headers['content-type'] ?? '').startsWith('text/event-stream');
    if (res.statusCode !== 200 || !isSse) {
      const text = await readAll(stream);
      if (res.statusCode !== 200) {
        const err = chatError(res.statusCode, text, res.headers);
        // A request a worker took and could not answer (a timeout, a worker's
        // failure) is a failed response, as a broken stream is: its event is sent.
        if (res.statusCode >= 500 || res.statusCode === 408) {
          const failed = responseObject(shell, 'failed', [], {
            error: { code: err.code, message: err.message },
          });
          await this.finish(key, endpoint, r, history, failed);
        }
        throw err;
      }
      const response = fromCompletion(shell, JSON.parse(text) as Json);
      await this.finish(key, endpoint, r, history, response);
      for (const h of PASSED_HEADERS) {
        const v = res.headers[h];
        if (v !== undefined) reply.header(h, v);
      }
      await reply.type('application/json').send(JSON.stringify(response));
      return;
    }
    await this.stream(key, endpoint, r, history, shell, stream, res.headers, reply);
  }

  private async stream(
    key: KeyRecord,
    endpoint: Endpoint,
    r: ResponsesRequest,
    history: Json[],
    shell: Shell,
    chat: Readable,
    chatHeaders: Record<string, unknown>,
    reply: FastifyReply,
  ): Promise<void> {
    const raw = reply.raw;
    reply.hijack();
    const head: Record<string, string> = {
      ...(reply.getHeaders() as Record<string, string>),
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      'x-accel-buffering': 'no',
      'x-request-id': reply.request.id,
    };
    for (const h of PASSED_HEADERS) {
      const v = chatHeaders[h];
      if (v !== undefined) head[h] = String(v);
    }
    raw.writeHead(200, head);
    const t = new ResponseStream(shell);
    // Only the client's leaving ends a wait for it (drained resolves on close).
    const staying = new AbortController().signal;
    const send = async (events: Json[]) => {
      let text = '';
      for (const e of events) text += `event: ${String(e.type)}\ndata: ${JSON.stringify(e)}\n\n`;
      // A slow client holds the stream back, as on chat: nothing more is read from the
      // chat stream (whose route then stops reading the worker's) until it took this.
      if (text && !raw.destroyed && !raw.write(text)) await drained(raw, staying);
    };
    await send(t.start());
    const parser = new SseParser();
    // The last events (`response.completed`, or `error` and `response.failed`) wait
    // until the response is stored: a client that reads them and at once continues
    // (`previous_response_id`, the conversation's next turn, `retrieve`) finds it.
    let last: { events: Json[]; response: Json } | null = null;
    try {
      outer: for await (const chunk of chat) {
        for (const ev of parser.feed(chunk as Buffer)) {
          if (ev.event === 'error') {
            last = t.fail((JSON.parse(ev.data) as { error?: Json }).error ?? {});
            break outer;
          }
          if (isDone(ev)) break outer;
          await send(t.chunk(JSON.parse(ev.data) as Json));
        }
      }
    } catch (err) {
      // The chat stream broke (the client left, or the injected request failed).
      if (raw.destroyed) return;
      this.s.logger.warn({ err }, 'responses: chat stream failed');
      last = t.fail({ code: 'server_error', message: 'The response stream failed.' });
    }
    if (raw.destroyed) return;
    last ??= t.end();
    await this.finish(key, endpoint, r, history, last.response).catch((err: unknown) => {
      this.s.logger.error({ err }, 'responses: storing a streamed response failed');
    });
    await send(last.events);
    raw.end();
  }

  /** Stores the response (when asked) and emits its event, in one transaction. */
  private async finish(
    key: KeyRecord,
    endpoint: Endpoint,
    r: ResponsesRequest,
    history: Json[],
    response: Json,
  ): Promise<void> {
    const now = new Date(this.s.clock.now());
    // The worker's text may hold what PostgreSQL cannot (U+0000, a lone surrogate):
    // kept as U+FFFD, as stored chat completions are; the client got it as it was.
    response = storableValue(response);
    const status = String(response.status);
    const output = response.output as Json[];
    const stored = r.items.map(storedItem) as Item[];
    await this.s.store.db.transaction(async (tx) => {
      if (r.conversationId !== null && status !== 'failed') {
        // The turn joins the conversation: what was said, then what the model answered.
        // A conversation deleted while the worker answered takes no turn; the answer,
        // made and billed, is still answered, stored and its event written.
        await this.conversations
          .append(
            { projectId: key.projectId, boundTo: key.endpointId, through: endpoint.id },
            r.conversationId,
            [...stored, ...(output as Item[])],
            tx,
          )
          .catch((err: unknown) => {
            if (!(err instanceof ServiceError && err.code === 'conversation_not_found')) throw err;
          });
      }
      // A failed response is kept too (OpenAI's retrieve shows it `failed`, with its
      // `error`): the id in its `response.failed` event and stream finds it.
      if (r.store) {
        await tx.insert(responses).values({
          id: String(response.id),
          projectId: key.projectId,
          endpointId: endpoint.id,
          body: response,
          inputItems: stored,
          messages: [...history, ...toChatMessages(r.items), ...outputMessages(output)],
          createdAt: now,
        });
      }
      await emitEvent(tx, {
        projectId: key.projectId,
        type: status === 'failed' ? 'response.failed' : 'response.completed',
        data: {
          id: response.id,
          object: 'response',
          status,
          model: response.model,
          endpoint_id: endpoint.id,
          usage: response.usage,
          error: response.error,
        },
        now,
      });
    });
  }

  retrieve = async (
    request: FastifyRequest<{ Params: Params; Querystring: { stream?: string } }>,
    reply: FastifyReply,
  ) => {
    const { key } = await this.access(request, reply);
    const id = request.params.responseId!;
    const row = await this.stored(key, id);
    if (!row) throw this.notFound(id);
    // OpenAI streams a response on retrieve (`stream`, resumed after `starting_after`)
    // only while a background one runs; there are none here (`background` is refused),
    // and the deltas a stream sent are not kept, so no replay could number its events
    // as they went out: a clear refusal rather than JSON where the SDK expects events.
    if (request.query.stream === 'true') {
      throw new ServiceError('unsupported_value', {
        message:
          'Only background responses can be streamed on retrieve, and background responses are not supported; retrieve it without stream.',
        param: 'stream',
      });
    }
    return row.body;
  };

  remove = async (request: FastifyRequest<{ Params: Params }>, reply: FastifyReply) => {
    const { key } = await this.access(request, reply);
    const id = request.params.responseId!;
    const row = await this.stored(key, id);
    if (!row) throw this.notFound(id);
    await this.s.store.db.delete(responses).where(eq(responses.id, row.id));
    return { id: row.id, object: 'response', deleted: true };
  };

  inputItems = async (
    request: FastifyRequest<{
      Params: Params;
      Querystring: { limit?: string; order?: string; after?: string };
    }>,
    reply: FastifyReply,
  ) => {
    const { key } = await this.access(request, reply);
    const id = request.params.responseId!;
    const row = await this.stored(key, id);
    if (!row) throw this.notFound(id);
    const { limit, order, after } = listQuery(request.query);
    let items = order === 'asc' ? [...row.inputItems] : [...row.inputItems].reverse();
    if (after !== undefined) {
      const i = items.findIndex((it) => it.id === after);
      if (i < 0) {
        throw new ServiceError('invalid_value', {
          message: `No input item '${after}' in this response.`,
          param: 'after',
        });
      }
      items = items.slice(i + 1);
    }
    return listPage(items, limit);
  };
}

export function responsesRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    // The root instance: `inject` must reach the chat route registered beside this plugin.
    const api = new ResponsesApi(
      s,
      app,
      new ConversationService(s.store.db, s.clock, () => s.dispatcher.poke()),
    );
    deferJsonErrors(app, s.verifier);
    const base = '/:projectId/:endpointSlug/v1/responses';
    app.post(base, api.create);
    app.get(`${base}/:responseId`, api.retrieve);
    app.delete(`${base}/:responseId`, api.remove);
    app.get(`${base}/:responseId/input_items`, api.inputItems);
  };
}
