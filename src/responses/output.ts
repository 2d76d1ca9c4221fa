/**
 * Chat completions turned into Responses API objects: the Response for a whole
 * completion (`fromCompletion`), and the event sequence of a streamed one
 * (`ResponseStream`), in OpenAI's order:
 *
 *   response.created, response.in_progress,
 *   per output item: response.output_item.added,
 *     message, per content part (text and a refusal are two parts of one message,
 *              content_index 0 and 1): response.content_part.added,
 *              response.output_text.delta…, response.output_text.done,
 *              response.content_part.done
 *              (a refusal: response.refusal.delta…, response.refusal.done)
 *     function call: response.function_call_arguments.delta…,
 *              response.function_call_arguments.done
 *   response.output_item.done,
 *   then response.completed, response.incomplete (the token limit) or response.failed.
 *
 * Every event carries `type` and a `sequence_number` from 0.
 */
import { randomBytes } from 'node:crypto';
import type { ResponsesRequest } from './request.js';

export type Json = Record<string, unknown>;

export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(16).toString('hex')}`;
}

interface ChatUsage {
  prompt_tokens?: number;
  completion_tokens?: number;
  prompt_tokens_details?: { cached_tokens?: number } | null;
  completion_tokens_details?: { reasoning_tokens?: number | null } | null;
}

export function usageOf(u: ChatUsage | null | undefined): Json | null {
  if (!u) return null;
  const input = u.prompt_tokens ?? 0;
  const output = u.completion_tokens ?? 0;
  return {
    input_tokens: input,
    input_tokens_details: { cached_tokens: u.prompt_tokens_details?.cached_tokens ?? 0 },
    output_tokens: output,
    output_tokens_details: { reasoning_tokens: u.completion_tokens_details?.reasoning_tokens ?? 0 },
    total_tokens: input + output,
  };
}

/** The Response's fields that echo the request. */
export interface Shell {
  id: string;
  createdAt: number;
  model: string;
  serviceTier: string;
  request: ResponsesRequest;
}

export function responseObject(
  s: Shell,
  status: 'in_progress' | 'completed' | 'incomplete' | 'failed',
  output: Json[],
  extra: { usage?: Json | null; error?: Json | null; incompleteReason?: string | null } = {},
): Json {
  const d = s.request.body;
  return {
    id: s.id,
    object: 'response',
    created_at: s.createdAt,
    status,
    error: extra.error ?? null,
    incomplete_details: extra.incompleteReason ? { reason: extra.incompleteReason } : null,
    instructions: d.instructions ?? null,
    max_output_tokens: d.max_output_tokens ?? null,
    model: s.model,
    output,
    parallel_tool_calls: d.parallel_tool_calls ?? true,
    previous_response_id: s.request.previousResponseId,
    reasoning: { effort: d.reasoning?.effort ?? null, summary: null },
    service_tier: s.serviceTier,
    store: s.request.store,
    temperature: d.temperature ?? null,
    text: { format: d.text?.format ?? { type: 'text' } },
    tool_choice: d.tool_choice ?? 'auto',
    tools: s.request.tools.map((t) => ({
      type: 'function',
      name: t.name,
      description: t.description ?? null,
      parameters: t.parameters ?? null,
      strict: t.strict,
    })),
    top_p: d.top_p ?? null,
    truncation: 'disabled',
    usage: extra.usage ?? null,
    user: d.user ?? null,
    metadata: d.metadata ?? {},
    conversation: s.request.conversationId === null ? null : { id: s.request.conversationId },
  };
}

/** `finish_reason` as the Response's status and `incomplete_details.reason`. */
function statusOf(finish: unknown): { status: 'completed' | 'incomplete'; reason: string | null } {
  if (finish === 'length') return { status: 'incomplete', reason: 'max_output_tokens' };
  if (finish === 'content_filter') return { status: 'incomplete', reason: 'content_filter' };
  return { status: 'completed', reason: null };
}

function messageItem(id: string, content: Json[], status: string): Json {
  return { type: 'message', id, status, role: 'assistant', content };
}

function textPart(text: string): Json {
  return { type: 'output_text', text, annotations: [], logprobs: [] };
}

function partOf(p: { kind: 'text' | 'refusal'; text: string }): Json {
  return p.kind === 'text' ? textPart(p.text) : { type: 'refusal', refusal: p.text };
}

function callItem(id: string, callId: string, name: string, args: string, status: string): Json {
  return { type: 'function_call', id, call_id: callId, name, arguments: args, status };
}

/** The Response for a non-streamed chat completion (its first choice). */
export function fromCompletion(s: Shell, completion: Json): Json {
  const choice = ((completion.choices as Json[] | undefined) ?? [])[0] ?? {};
  const msg = (choice.message as Json | undefined) ?? {};
  const { status, reason } = statusOf(choice.finish_reason);
  const itemStatus = status === 'incomplete' ? 'incomplete' : 'completed';
  const output: Json[] = [];
  const content: Json[] = [];
  if (typeof msg.content === 'string' && msg.content !== '') content.push(textPart(msg.content));
  if (typeof msg.refusal === 'string' && msg.refusal !== '') {
    content.push({ type: 'refusal', refusal: msg.refusal });
  }
  if (content.length > 0) output.push(messageItem(newId('msg'), content, itemStatus));
  for (const call of (msg.tool_calls as Json[] | null | undefined) ?? []) {
    const f = (call.function as Json | undefined) ?? {};
    output.push(
      callItem(
        newId('fc'),
        String(call.id),
        String(f.name ?? ''),
        String(f.arguments ?? ''),
        itemStatus,
      ),
    );
  }
  return responseObject(s, status, output, {
    usage: usageOf(completion.usage as ChatUsage),
    incompleteReason: reason,
  });
}

/**
 * The assistant's turn as chat messages (for `previous_response_id`): its text and
 * refusals joined, as a conversation's history has them (request.ts `toChatMessages`).
 */
export function outputMessages(output: readonly Json[]): Json[] {
  const msgs: Json[] = [];
  let text = '';
  const calls: Json[] = [];
  for (const it of output) {
    if (it.type === 'message') {
      for (const p of it.content as Json[]) {
        if (p.type === 'output_text') text += String(p.text);
        else if (p.type === 'refusal') text += String(p.refusal);
      }
    } else if (it.type === 'function_call') {
      calls.push({
        id: it.call_id,
        type: 'function',
        function: { name: it.name, arguments: it.arguments },
      });
    }
  }
  if (text !== '' || calls.length > 0) {
    msgs.push({
      role: 'assistant',
      content: text === '' ? null : text,
      ...(calls.length > 0 ? { tool_calls: calls } : {}),
    });
  }
  return msgs;
}

interface OpenCall {
  outputIndex: number;
  id: string;
  callId: string;
  name: string;
  args: string;
}

/** Translates a chat-completion chunk stream into Responses events (see the module comment). */
export class ResponseStream {
  private seq = 0;
  private readonly output: Json[] = [];
  /**
   * The open message: its closed content parts and the one streaming. Text and a
   * refusal are two parts of one message, as OpenAI streams them (content_index 0, 1).
   */
  private msg: {
    outputIndex: number;
    id: string;
    parts: Json[];
    part: { kind: 'text' | 'refusal'; text: string } | null;
  } | null = null;
  private readonly calls = new Map<number, OpenCall>();
  private finish: unknown = null;
  private usage: Json | null = null;

  constructor(private readonly shell: Shell) {}

  private ev(type: string, fields: Json): Json {
    return { type, sequence_number: this.seq++, ...fields };
  }

  start(): Json[] {
    const r = responseObject(this.shell, 'in_progress', []);
    return [
      this.ev('response.created', { response: r }),
      this.ev('response.in_progress', { response: r }),
    ];
  }

  /** Events for one chat chunk (parsed `data`). */
  chunk(c: Json): Json[] {
    const out: Json[] = [];
    if (c.usage) this.usage = usageOf(c.usage as ChatUsage);
    const choice = ((c.choices as Json[] | undefined) ?? [])[0];
    if (!choice) return out;
    const delta = (choice.delta as Json | undefined) ?? {};
    if (typeof delta.content === 'string' && delta.content !== '') {
      out.push(...this.text('text', delta.content));
    }
    if (typeof delta.refusal === 'string' && delta.refusal !== '') {
      out.push(...this.text('refusal', delta.refusal));
    }
    for (const tc of (delta.tool_calls as Json[] | undefined) ?? []) out.push(...this.toolCall(tc));
    if (choice.finish_reason != null) this.finish = choice.finish_reason;
    return out;
  }

  private text(kind: 'text' | 'refusal', delta: string): Json[] {
    const out: Json[] = [];
    if (!this.msg) {
      this.msg = { outputIndex: this.output.length, id: newId('msg'), parts: [], part: null };
      this.output.push(messageItem(this.msg.id, [], 'in_progress'));
      out.push(
        this.ev('response.output_item.added', {
          output_index: this.msg.outputIndex,
          item: messageItem(this.msg.id, [], 'in_progress'),
        }),
      );
    }
    const m = this.msg;
    if (m.part && m.part.kind !== kind) out.push(...this.closePart());
    const where = { item_id: m.id, output_index: m.outputIndex, content_index: m.parts.length };
    if (!m.part) {
      m.part = { kind, text: '' };
      out.push(this.ev('response.content_part.added', { ...where, part: partOf(m.part) }));
    }
    m.part.text += delta;
    out.push(
      kind === 'text'
        ? this.ev('response.output_text.delta', { ...where, delta, logprobs: [] })
        : this.ev('response.refusal.delta', { ...where, delta }),
    );
    return out;
  }

  /** Closes the open message's streaming part. */
  private closePart(): Json[] {
    const m = this.msg;
    if (!m?.part) return [];
    const where = { item_id: m.id, output_index: m.outputIndex, content_index: m.parts.length };
    const { kind, text } = m.part;
    const part = partOf(m.part);
    m.parts.push(part);
    m.part = null;
    return [
      kind === 'text'
        ? this.ev('response.output_text.done', { ...where, text, logprobs: [] })
        : this.ev('response.refusal.done', { ...where, refusal: text }),
      this.ev('response.content_part.done', { ...where, part }),
    ];
  }

  /** Closes the open message; `status` is the item's (`incomplete` when cut short). */
  private closeMessage(status = 'completed'): Json[] {
    const m = this.msg;
    if (!m) return [];
    const out = this.closePart();
    this.msg = null;
    const item = messageItem(m.id, m.parts, status);
    this.output[m.outputIndex] = item;
    out.push(this.ev('response.output_item.done', { output_index: m.outputIndex, item }));
    return out;
  }

  private toolCall(tc: Json): Json[] {
    const out: Json[] = [];
    const index = typeof tc.index === 'number' ? tc.index : 0;
    const f = (tc.function as Json | undefined) ?? {};
    let call = this.calls.get(index);
    if (!call) {
      out.push(...this.closeMessage());
      call = {
        outputIndex: this.output.length,
        id: newId('fc'),
        callId: typeof tc.id === 'string' ? tc.id : newId('call'),
        name: typeof f.name === 'string' ? f.name : '',
        args: '',
      };
      this.calls.set(index, call);
      this.output.push(callItem(call.id, call.callId, call.name, '', 'in_progress'));
      out.push(
        this.ev('response.output_item.added', {
          output_index: call.outputIndex,
          item: callItem(call.id, call.callId, call.name, '', 'in_progress'),
        }),
      );
    }
    if (typeof f.arguments === 'string' && f.arguments !== '') {
      call.args += f.arguments;
      out.push(
        this.ev('response.function_call_arguments.delta', {
          item_id: call.id,
          output_index: call.outputIndex,
          delta: f.arguments,
        }),
      );
    }
    return out;
  }

  /** The stream ended normally: close every open item, then the final response. */
  end(): { events: Json[]; response: Json } {
    const { status, reason } = statusOf(this.finish);
    // Items cut short by the token limit are `incomplete`, as the response is.
    const itemStatus = status === 'incomplete' ? 'incomplete' : 'completed';
    const out = this.closeMessage(itemStatus);
    for (const call of this.calls.values()) {
      const item = callItem(call.id, call.callId, call.name, call.args, itemStatus);
      this.output[call.outputIndex] = item;
      out.push(
        this.ev('response.function_call_arguments.done', {
          item_id: call.id,
          output_index: call.outputIndex,
          name: call.name,
          arguments: call.args,
        }),
        this.ev('response.output_item.done', { output_index: call.outputIndex, item }),
      );
    }
    this.calls.clear();
    const response = responseObject(this.shell, status, this.output, {
      usage: this.usage,
      incompleteReason: reason,
    });
    out.push(
      this.ev(status === 'completed' ? 'response.completed' : 'response.incomplete', { response }),
    );
    return { events: out, response };
  }

  /** The stream failed (an SSE error event from the chat path): `error`, then `response.failed`. */
  fail(error: { code?: unknown; message?: unknown; param?: unknown }): {
    events: Json[];
    response: Json;
  } {
    const code = typeof error.code === 'string' ? error.code : 'server_error';
    const message = typeof error.message === 'string' ? error.message : 'The response failed.';
    // What had streamed stays in the failed response, its items `incomplete`.
    const m = this.msg;
    if (m) {
      const parts = m.part ? [...m.parts, partOf(m.part)] : m.parts;
      this.output[m.outputIndex] = messageItem(m.id, parts, 'incomplete');
    }
    for (const c of this.calls.values()) {
      this.output[c.outputIndex] = callItem(c.id, c.callId, c.name, c.args, 'incomplete');
    }
    const response = responseObject(this.shell, 'failed', this.output, {
      usage: this.usage,
      error: { code, message },
    });
    return {
      events: [
        this.ev('error', {
          code,
          message,
          param: typeof error.param === 'string' ? error.param : null,
        }),
        this.ev('response.failed', { response }),
      ],
      response,
    };
  }
}
