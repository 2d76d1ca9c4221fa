/**
 * A streamed chat completion put back together, for `store: true`: the chunks the
 * client was sent (already re-framed, reframe.ts), assembled into the
 * `chat.completion` a client's own accumulator would build from them, in the shape
 * of a non-streaming answer (reframe.ts `normalizeCompletion`): per choice the
 * message (`role`, `content`, `refusal`, `tool_calls`, `annotations: []`), the
 * finish reason and the logprobs that streamed.
 *
 * Only a stream with `store: true` makes one (chat.ts): the others pay nothing.
 * Content is kept as the list of its fragments and joined once at the end.
 */
import type {
  ChatCompletion,
  ChatCompletionChunk,
  CompletionChoice,
  FinishReason,
  ReframeContext,
  TokenLogprob,
  ToolCall,
  Usage,
} from '../inference/reframe.js';

interface ToolCallParts {
  id: string;
  name: string;
  args: string[];
}

interface ChoiceParts {
  content: string[];
  refusal: string[];
  tools: Map<number, ToolCallParts> | null;
  logprobs: { content: TokenLogprob[] | null; refusal: TokenLogprob[] | null } | null;
  finish: FinishReason | null;
}

export class CompletionAssembler {
  private readonly choices = new Map<number, ChoiceParts>();
  private fingerprint: string | null = null;

  constructor(private readonly ctx: ReframeContext) {}

  /** One chunk as it was sent to the client. */
  add(chunk: ChatCompletionChunk): void {
    if (chunk.system_fingerprint !== null) this.fingerprint = chunk.system_fingerprint;
    for (const c of chunk.choices) {
      let p = this.choices.get(c.index);
      if (p === undefined) {
        p = { content: [], refusal: [], tools: null, logprobs: null, finish: null };
        this.choices.set(c.index, p);
      }
      const d = c.delta;
      if (d.content) p.content.push(d.content);
      if (d.refusal) p.refusal.push(d.refusal);
      if (d.tool_calls !== undefined) {
        p.tools ??= new Map();
        for (const t of d.tool_calls) {
          let call = p.tools.get(t.index);
          if (call === undefined) {
            call = { id: '', name: '', args: [] };
            p.tools.set(t.index, call);
          }
          if (t.id) call.id = t.id;
          if (t.function?.name) call.name = t.function.name;
          if (t.function?.arguments) call.args.push(t.function.arguments);
        }
      }
      if (c.logprobs !== null) {
        p.logprobs ??= { content: null, refusal: null };
        if (c.logprobs.content) (p.logprobs.content ??= []).push(...c.logprobs.content);
        if (c.logprobs.refusal) (p.logprobs.refusal ??= []).push(...c.logprobs.refusal);
      }
      if (c.finish_reason !== null) p.finish = c.finish_reason;
    }
  }

  /** The completion as a non-streaming request would have returned it, with `usage`. */
  completion(usage: Usage): ChatCompletion {
    const choices: CompletionChoice[] = [];
    const indexes = [...this.choices.keys()].sort((a, b) => a - b);
    for (const index of indexes) {
      const p = this.choices.get(index)!;
      let toolCalls: ToolCall[] | null = null;
      if (p.tools !== null) {
        toolCalls = [...p.tools.entries()]
          .sort((a, b) => a[0] - b[0])
          .map(([, t]) => ({
            id: t.id,
            type: 'function' as const,
            function: { name: t.name, arguments: t.args.join('') },
          }));
      }
      const refusal = p.refusal.length > 0 ? p.refusal.join('') : null;
      let content: string | null = p.content.join('');
      // As a non-streaming answer: content is null only beside tool calls or a refusal.
      if (content === '' && (toolCalls !== null || refusal !== null)) content = null;
      choices.push({
        index,
        message: { role: 'assistant', content, refusal, tool_calls: toolCalls, annotations: [] },
        finish_reason: p.finish ?? (toolCalls !== null ? 'tool_calls' : 'stop'),
        logprobs: p.logprobs,
      });
    }
    return {
      id: this.ctx.id,
      object: 'chat.completion',
      created: this.ctx.created,
      model: this.ctx.model,
      choices,
      usage,
      service_tier: this.ctx.serviceTier,
      system_fingerprint: this.fingerprint,
    };
  }
}
