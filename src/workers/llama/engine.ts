/**
 * The `llama` inference engine: llama.cpp in-process through node-llama-cpp, serving
 * OpenAI chat completions from any GGUF file (the demo model or a real one).
 *
 * Structure
 * - One llama.cpp context with `sequences` independent KV-cache sequences ("slots").
 *   A request holds one slot for all its `n` choices; requests beyond capacity wait in
 *   a FIFO queue (bounded; past the bound they get `capacity_exceeded`).
 * - Prompt-prefix reuse: a waiting request takes the free slot whose cached tokens share
 *   the longest prefix with its prompt (llama.cpp server's slot selection). Only the
 *   tokens after the shared prefix are erased and evaluated; the shared part is reported
 *   as `usage.prompt_tokens_details.cached_tokens`. Choices after the first reuse the
 *   whole prompt.
 * - Prompts are rendered by node-llama-cpp's chat wrapper for the model (its Jinja
 *   template or a specialized wrapper), which also supplies the end-of-turn triggers.
 *
 * Generation paths
 * - Text and JSON: a token loop over `evaluateWithMetadata`. llama.cpp does the
 *   sampling (temperature, top-p, seed, logit bias, frequency/presence penalties,
 *   grammar), except where JS must draw the token from llama.cpp's full distribution:
 *   logprobs with temperature > 0 and no grammar (llama.cpp reports post-truncation
 *   probabilities), and a logit bias on an end-of-generation token (node-llama-cpp's
 *   `TokenBias` drops those); see `sampling.ts`. `json_object` / `json_schema` compile
 *   to GBNF grammars (cached, bounded). Stop sequences, UTF-8 assembly and logprob
 *   release live in `token-text.ts`.
 * - Tools, and reasoning models: node-llama-cpp's `LlamaChat`, which knows each model
 *   family's call syntax, constrains function names and arguments by grammar, and keeps
 *   thought segments out of the answer (they count as `reasoning_tokens`).
 *   `tool_choice: "required"` or a named function forces a call by opening the call
 *   syntax right away; a named choice offers only that function. LlamaChat exposes no
 *   token probabilities and takes no grammar next to functions, so logprobs or a JSON
 *   response_format together with tools get a 400 saying so.
 * - `prediction`: each slot has a lookup token predictor fed with the predicted text:
 *   after each token it drafts the token that followed the longest match in the
 *   prediction, and llama.cpp validates the draft in the same batch as the next decode.
 *   The usage counts follow OpenAI's definition (`predictionCounts`: predicted tokens
 *   that appear in the output, and the rest), not the draft counters. Drafts are one token long because node-llama-cpp
 *   3.22's `_speculativeEvaluate` never records a validated draft past the first (its
 *   `validatedTokens` list stays empty), so longer drafts are always refuted after
 *   their first token. One-token drafts still halve the decode steps of a well
 *   predicted output (demo model: ~2,300 → ~4,100 tokens/s).
 *
 * Threads: llama.cpp's default (all hardware threads, busy-waiting) starves a small
 * machine; measured on a 2-core box with the demo model: ~2,300 tokens/s with 1 thread,
 * ~30 with 2, under 5 with node-llama-cpp's default of 4. `defaultThreads` picks 1 for
 * tiny models and leaves a core free otherwise.
 */
import { createHash, randomBytes, randomInt } from 'node:crypto';
import { availableParallelism } from 'node:os';
import { basename } from 'node:path';
import {
  ChatWrapper,
  getLlama,
  InputLookupTokenPredictor,
  JinjaTemplateChatWrapper,
  LlamaChat,
  LlamaGrammarEvaluationState,
  LlamaLogLevel,
  LlamaText,
  resolveChatWrapper,
  TokenBias,
  type ChatHistoryItem,
  type ChatModelFunctionCall,
  type ChatModelFunctions,
  type ChatWrapperGenerateContextStateOptions,
  type ChatWrapperGeneratedContextState,
  type ChatWrapperSettings,
  type GbnfJsonSchema,
  type Llama,
  type LlamaContext,
  type LlamaContextSequence,
  type LlamaGrammar,
  type LlamaModel,
  type SequenceEvaluateOptions,
  type Token,
} from 'node-llama-cpp';
import { ServiceError } from '../../errors/index.js';
import { applyLogitBias, safeLog, sampleToken, toUint32Seed, topTokens } from './sampling.js';
import { toGrammarSchema } from './json-schema.js';
import { mulberry32 } from '../../runtime/prng.js';
import { ChoiceText, TokenPieces, tokenDisplay } from './token-text.js';
import {
  contentText,
  type ChatMessage,
  type ChatRequest,
  type FinishReason,
  type LogprobEntry,
  type ToolCallDelta,
  type ToolDefinition,
  type Usage,
  type WireToolCall,
} from './wire.js';

/** The spec's request defaults (service-wide, not OpenAI's 1.0/1.0). */
export const DEFAULT_TEMPERATURE = 0.7;
export const DEFAULT_TOP_P = 0.9;
/** Context per slot when the caller gives none (capped by what the model was trained on). */
export const DEFAULT_CONTEXT_SIZE = 4096;
export const DEFAULT_SEQUENCES = 4;
export const DEFAULT_MAX_QUEUE = 256;
/** Models below this size are decode-bound by thread synchronization, not arithmetic. */
const TINY_MODEL_BYTES = 64 * 1024 * 1024;
/** Predicted tokens proposed per step; a miss costs one batch slot each. */
const PREDICTION_DRAFT_TOKENS = 1;
const GRAMMAR_CACHE_SIZE = 64;

export interface LlamaEngineOptions {
  /** Path of the GGUF file. */
  modelPath: string;
  /** Name reported as `model`; default the GGUF `general.name` or the file name. */
  modelName?: string;
  /** llama.cpp threads; default `defaultThreads(model size, available cores)`. */
  threads?: number;
  /** Tokens per slot; default min(trained context, 4096). */
  contextSize?: number;
  /** Parallel slots (KV-cache sequences); default 4. */
  sequences?: number;
  /** Requests allowed to wait for a slot; default 256. */
  maxQueue?: number;
  /** An existing node-llama-cpp binding to share (tests run several engines). */
  llama?: Llama;
}

/** What the loaded model can do; requests needing a missing capability get a 400. */
export interface EngineCapabilities {
  chat: boolean;
  tools: boolean;
  parallel_tool_calls: boolean;
  json_object: boolean;
  json_schema: boolean;
  logprobs: boolean;
  prediction: boolean;
  /** The chat template has thought segments; their text is kept out of `content`. */
  reasoning: boolean;
  vision: boolean;
  audio: boolean;
}

export interface EngineInfo {
  modelName: string;
  modelPath: string;
  /** Tokens per slot: the context window a request sees. */
  contextSize: number;
  trainContextSize: number;
  sequences: number;
  threads: number;
  vocabularySize: number;
  chatWrapper: string;
  llamaCppRelease: string;
  systemFingerprint: string;
}

export interface EngineStats {
  processing: number;
  deferred: number;
  kvCacheTokens: number;
  kvCacheCapacity: number;
  requestsTotal: number;
  abortedTotal: number;
  promptTokensTotal: number;
  cachedPromptTokensTotal: number;
  promptSecondsTotal: number;
  predictedTokensTotal: number;
  predictedSecondsTotal: number;
}

export type EngineEvent =
  | { type: 'content'; index: number; text: string; logprobs: LogprobEntry[] | null }
  | { type: 'tool_call'; index: number; call: ToolCallDelta }
  | { type: 'finish'; index: number; finishReason: FinishReason };

export interface ChoiceResult {
  index: number;
  content: string | null;
  toolCalls: WireToolCall[] | null;
  logprobs: LogprobEntry[] | null;
  finishReason: FinishReason;
  completionTokens: number;
}

export interface CompletionResult {
  choices: ChoiceResult[];
  usage: Usage;
  /** True when the caller's signal stopped the generation. */
  aborted: boolean;
}

export interface RunOptions {
  signal?: AbortSignal;
  /** Called once the request is validated and holds a slot, before any token. */
  onStart?: () => void;
  /** Streaming: content and tool-call deltas as they are produced, in order. */
  onEvent?: (event: EngineEvent) => void;
}

/**
 * llama.cpp threads for a model on this machine. Tiny models spend their time in thread
 * synchronization, so one thread is fastest; otherwise use the available cores but one
 * (left to the event loop and the HTTP server), at most 8 (memory bandwidth saturates).
 */
export function defaultThreads(modelBytes: number, cores = availableParallelism()): number {
  if (modelBytes < TINY_MODEL_BYTES) return 1;
  return Math.max(1, Math.min(8, cores - 1));
}

/** Wrapper families whose function-calling syntax the model was trained on. */
const NON_NATIVE_TOOL_WRAPPERS = new Set([
  'General',
  'ChatML',
  'Llama2Chat',
  'Llama 3',
  'AlpacaChat',
  'Falcon',
  'Gemma',
  'Empty',
  'Template',
]);

function wrapperSupportsTools(w: ChatWrapper): boolean {
  if (w instanceof JinjaTemplateChatWrapper) return w.usingJinjaFunctionCallTemplate;
  return !NON_NATIVE_TOOL_WRAPPERS.has(w.wrapperName);
}

/**
 * Delegates to the model's wrapper but opens the function-call syntax at the start of
 * the response, so LlamaChat must produce a call (`tool_choice: required` or named).
 */
class ForcedCallChatWrapper extends ChatWrapper {
  readonly wrapperName: string;
  override readonly settings: ChatWrapperSettings;

  constructor(private readonly inner: ChatWrapper) {
    super();
    this.wrapperName = inner.wrapperName;
    this.settings = inner.settings;
  }

  override generateContextState(
    options: ChatWrapperGenerateContextStateOptions,
  ): ChatWrapperGeneratedContextState {
    const state = this.inner.generateContextState(options);
    const fn = this.settings.functions;
    return {
      contextText: state.contextText,
      stopGenerationTriggers: state.stopGenerationTriggers,
      noPrefixTrigger: {
        type: 'functionCall',
        inject: LlamaText([fn.parallelism?.call.sectionPrefix ?? '', fn.call.prefix]),
      },
      detectFunctionCalls: true,
    };
  }
}

/** A lookup predictor fed only with the request's `prediction` text. */
class PredictionLookup extends InputLookupTokenPredictor {
  constructor() {
    super({ patternLength: { min: 1 }, predictionLength: { max: PREDICTION_DRAFT_TOKENS } });
  }

  /** LlamaChat pushes the prompt here (prompt lookup); predictions come from the request only. */
  override updateInputTokens(): void {}

  setPrediction(tokens: readonly Token[]): void {
    super.updateInputTokens(tokens.slice());
  }
}

interface Slot {
  id: number;
  sequence: LlamaContextSequence;
  predictor: PredictionLookup;
  busy: boolean;
  lastUsed: number;
}

interface Waiter {
  resolve: (slot: Slot) => void;
  reject: (err: unknown) => void;
  cleanup: () => void;
}

interface Stops {
  texts: string[];
  tokens: Set<number>;
}

/** One generated choice plus what it adds to the request's usage. */
interface ChoiceRun {
  choice: ChoiceResult;
  cached: number;
  reasoning: number;
  accepted: number;
  rejected: number;
}

/** Everything a request needs, resolved once before it waits for a slot. */
interface Plan {
  history: ChatHistoryItem[];
  promptTokens: Token[];
  n: number;
  maxTokens: number;
  temperature: number;
  topP: number;
  seed: number;
  tokenBias: TokenBias | undefined;
  /** Biases of end-of-generation tokens, applied in JS (TokenBias ignores them). */
  eogBias: Map<number, number>;
  frequencyPenalty: number;
  presencePenalty: number;
  logprobs: boolean;
  topLogprobs: number;
  grammar: LlamaGrammar | undefined;
  stops: Stops;
  requestStops: string[];
  ignoreEos: boolean;
  predictionTokens: Token[] | null;
  /** Set when the request goes through LlamaChat (tools, or a reasoning model). */
  chat: {
    functions: ChatModelFunctions | undefined;
    parallel: boolean;
    wrapper: ChatWrapper;
    /** The function a forced call must be to (a named choice, or `required` with one tool). */
    forced: string | null;
  } | null;
}

function capabilityMissing(param: string, message: string): ServiceError {
  return new ServiceError('model_capability_missing', { message, param });
}

function unsupportedCombination(param: string, message: string): ServiceError {
  return new ServiceError('unsupported_value', { message, param });
}

function parseArguments(args: string): unknown {
  try {
    return JSON.parse(args);
  } catch {
    // Models sometimes emit non-JSON arguments; keep them verbatim in the history.
    return args;
  }
}

function toolResult(content: string): unknown {
  try {
    return JSON.parse(content);
  } catch {
    return content;
  }
}

/** OpenAI messages → node-llama-cpp chat history (tool results fold into their calls). */
export function toChatHistory(messages: readonly ChatMessage[]): ChatHistoryItem[] {
  const items: ChatHistoryItem[] = [];
  const calls = new Map<string, ChatModelFunctionCall>();
  messages.forEach((m, i) => {
    const text = contentText(m.content);
    switch (m.role) {
      case 'system':
      case 'developer':
        items.push({ type: 'system', text });
        break;
      case 'user':
        items.push({ type: 'user', text });
        break;
      case 'assistant': {
        const response: Array<string | ChatModelFunctionCall> = text ? [text] : [];
        for (const tc of m.tool_calls ?? []) {
          const call: ChatModelFunctionCall = {
            type: 'functionCall',
            name: tc.function.name,
            params: parseArguments(tc.function.arguments),
            result: '',
          };
          calls.set(tc.id, call);
          response.push(call);
        }
        items.push({ type: 'model', response });
        break;
      }
      case 'tool': {
        const call = calls.get(m.tool_call_id ?? '');
        if (!call) {
          throw new ServiceError('invalid_value', {
            message: `messages[${i}].tool_call_id does not answer a tool call of an earlier assistant message`,
            param: `messages[${i}].tool_call_id`,
          });
        }
        call.result = toolResult(text);
        break;
      }
    }
  });
  // After tool results the model continues the same response (node-llama-cpp's model);
  // otherwise it starts a new one.
  const last = items[items.length - 1];
  const lastPart = last?.type === 'model' ? last.response[last.response.length - 1] : undefined;
  const continuesAfterTools =
    typeof lastPart === 'object' && lastPart !== null && lastPart.type === 'functionCall';
  if (!continuesAfterTools) items.push({ type: 'model', response: [] });
  return items;
}

/** How far ahead in the output a predicted token is looked for (see `predictionCounts`). */
const PREDICTION_LOOKAHEAD = 64;

/**
 * The usage counts of a `prediction`, as OpenAI defines them: accepted = the
 * predicted tokens that appear in the output, rejected = the others (still billed).
 * Matched in order, each predicted token looked for up to 64 tokens past the last
 * match (edits are local; this keeps it linear). The draft counters of the lookup
 * decoding measure something else, how many drafts were used, which undercounts a
 * prediction the output follows exactly (half of it, with one-token drafts).
 */
export function predictionCounts<T>(
  predicted: readonly T[],
  output: readonly T[],
): { accepted: number; rejected: number } {
  let at = 0;
  let accepted = 0;
  for (const t of predicted) {
    const end = Math.min(output.length, at + PREDICTION_LOOKAHEAD);
    for (let k = at; k < end; k++) {
      if (output[k] === t) {
        accepted++;
        at = k + 1;
        break;
      }
    }
  }
  return { accepted, rejected: predicted.length - accepted };
}

function callId(): string {
  return `call_${randomBytes(12).toString('hex')}`;
}

function contextError(
  prompt: number,
  maxTokens: number | null,
  ctx: number,
  field: 'max_tokens' | 'max_completion_tokens',
): ServiceError {
  // vLLM's wording with exact counts, so the router can compute the budget that fits and
  // retry once; llama.cpp's fields for clients that read those.
  const message =
    maxTokens === null
      ? `This model's maximum context length is ${ctx} tokens. However, you requested ${prompt} tokens in the messages, Please reduce the length of the messages.`
      : `This model's maximum context length is ${ctx} tokens. However, you requested ${prompt + maxTokens} tokens (${prompt} in the messages, ${maxTokens} in the completion). Please reduce the length of the messages or completion.`;
  return new ServiceError('context_length_exceeded', {
    message,
    param: maxTokens === null ? 'messages' : field,
    extra: { n_prompt_tokens: prompt, n_ctx: ctx },
  });
}

type Step = { token: Token; probabilities?: Map<Token, number> };

/** One typed generator whether or not full distributions are requested. */
function evaluate(
  sequence: LlamaContextSequence,
  tokens: Token[],
  withProbabilities: boolean,
  options: SequenceEvaluateOptions,
): AsyncGenerator<Step, void, Token | undefined> {
  return withProbabilities
    ? sequence.evaluateWithMetadata(tokens, { probabilities: true }, options)
    : sequence.evaluateWithMetadata(tokens, {}, options);
}

export class LlamaEngine {
  private readonly slots: Slot[];
  private readonly waiters: Waiter[] = [];
  private readonly pieces: TokenPieces;
  private readonly grammarCache = new Map<string, Promise<LlamaGrammar>>();
  private readonly caps: EngineCapabilities;
  private readonly totals = {
    requests: 0,
    aborted: 0,
    promptTokens: 0,
    cachedPromptTokens: 0,
    promptSeconds: 0,
    predictedTokens: 0,
    predictedSeconds: 0,
  };
  private closed = false;
  /** Requests in flight; `close` waits for them (their aborts end them quickly). */
  private readonly active = new Set<Promise<unknown>>();

  private constructor(
    private readonly llama: Llama,
    private readonly ownsLlama: boolean,
    private readonly model: LlamaModel,
    private readonly context: LlamaContext,
    private readonly chatWrapper: ChatWrapper,
    private readonly engineInfo: EngineInfo,
    private readonly maxQueue: number,
  ) {
    this.pieces = new TokenPieces(model);
    this.slots = [];
    for (let id = 0; id < engineInfo.sequences; id++) {
      const predictor = new PredictionLookup();
      const sequence = context.getSequence({ tokenPredictor: predictor });
      this.slots.push({ id, sequence, predictor, busy: false, lastUsed: 0 });
    }
    const tools = wrapperSupportsTools(chatWrapper);
    // A grammar can only steer a vocabulary that can spell JSON's punctuation.
    const json =
      model.detokenize(model.tokenize('{"a": [1, true, null]}')) === '{"a": [1, true, null]}';
    this.caps = {
      chat: true,
      tools,
      parallel_tool_calls: tools && chatWrapper.settings.functions.parallelism !== undefined,
      json_object: json,
      json_schema: json,
      logprobs: true,
      prediction: true,
      reasoning: chatWrapper.settings.segments?.thought !== undefined,
      // node-llama-cpp 3 evaluates text only (no multimodal projector support).
      vision: false,
      audio: false,
    };
  }

  static async load(opts: LlamaEngineOptions): Promise<LlamaEngine> {
    const ownsLlama = opts.llama === undefined;
    const llama =
      opts.llama ??
      (await getLlama({
        gpu: false,
        // Only the prebuilt binaries from npm: never try to compile or download llama.cpp.
        build: 'never',
        logLevel: LlamaLogLevel.error,
        maxThreads: Math.max(1, availableParallelism()),
      }));
    const model = await llama.loadModel({ modelPath: opts.modelPath });
    const threads = Math.max(1, Math.floor(opts.threads ?? defaultThreads(model.size)));
    const sequences = Math.max(1, Math.floor(opts.sequences ?? DEFAULT_SEQUENCES));
    const trainContextSize = model.trainContextSize;
    const wanted =
      opts.contextSize ?? Math.min(trainContextSize || DEFAULT_CONTEXT_SIZE, DEFAULT_CONTEXT_SIZE);
    const context = await model.createContext({
      contextSize: wanted,
      sequences,
      threads: { ideal: threads, min: threads },
      // Prefix reuse relies on the whole context staying addressable.
      swaFullCache: true,
    });
    const chatWrapper = resolveChatWrapper(model);
    const general = model.fileInfo.metadata.general;
    const modelName = opts.modelName ?? general?.name ?? basename(opts.modelPath, '.gguf');
    const release = llama.llamaCppRelease.release;
    const contextSize = context.contextSize;
    const fingerprint = createHash('sha256')
      .update(`${release}|${opts.modelPath}|${model.size}|${contextSize}|${sequences}|${threads}`)
      .digest('hex')
      .slice(0, 10);
    const info: EngineInfo = {
      modelName,
      modelPath: opts.modelPath,
      contextSize,
      trainContextSize,
      sequences,
      threads,
      vocabularySize: model.fileInfo.metadata.tokenizer?.ggml?.tokens?.length ?? 0,
      chatWrapper: chatWrapper.wrapperName,
      llamaCppRelease: release,
      systemFingerprint: `llamacpp-${release}-${fingerprint}`,
    };
    return new LlamaEngine(
      llama,
      ownsLlama,
      model,
      context,
      chatWrapper,
      info,
      opts.maxQueue ?? DEFAULT_MAX_QUEUE,
    );
  }

  info(): EngineInfo {
    return this.engineInfo;
  }

  capabilities(): EngineCapabilities {
    return { ...this.caps };
  }

  stats(): EngineStats {
    let kv = 0;
    for (const s of this.slots) kv += s.sequence.nextTokenIndex;
    return {
      processing: this.slots.filter((s) => s.busy).length,
      deferred: this.waiters.length,
      kvCacheTokens: kv,
      kvCacheCapacity: this.engineInfo.contextSize * this.slots.length,
      requestsTotal: this.totals.requests,
      abortedTotal: this.totals.aborted,
      promptTokensTotal: this.totals.promptTokens,
      cachedPromptTokensTotal: this.totals.cachedPromptTokens,
      promptSecondsTotal: this.totals.promptSeconds,
      predictedTokensTotal: this.totals.predictedTokens,
      predictedSecondsTotal: this.totals.predictedSeconds,
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const w of this.waiters.splice(0)) {
      w.cleanup();
      w.reject(new ServiceError('unavailable', { message: 'The worker is shutting down.' }));
    }
    await Promise.allSettled([...this.active]);
    await this.context.dispose();
    await this.model.dispose();
    if (this.ownsLlama) await this.llama.dispose();
  }

  /** Runs one chat completion request to the end (or until `signal` aborts it). */
  complete(request: ChatRequest, run: RunOptions = {}): Promise<CompletionResult> {
    if (this.closed) {
      return Promise.reject(
        new ServiceError('unavailable', { message: 'The worker is shutting down.' }),
      );
    }
    const p = this.completeNow(request, run);
    this.active.add(p);
    const forget = (): void => {
      this.active.delete(p);
    };
    p.then(forget, forget);
    return p;
  }

  private async completeNow(request: ChatRequest, run: RunOptions): Promise<CompletionResult> {
    const plan = await this.prepare(request);
    this.totals.requests++;
    const slot = await this.acquire(plan.promptTokens, run.signal);
    try {
      run.onStart?.();
      const choices: ChoiceResult[] = [];
      let cached = 0;
      let accepted: number | null = plan.predictionTokens ? 0 : null;
      let rejected: number | null = plan.predictionTokens ? 0 : null;
      let reasoning = 0;
      for (let index = 0; index < plan.n; index++) {
        if (run.signal?.aborted) break;
        const r = plan.chat
          ? await this.runChatChoice(slot, plan, index, run)
          : await this.runTextChoice(slot, plan, index, run);
        reasoning += r.reasoning;
        if (index === 0) cached = r.cached;
        if (accepted !== null && rejected !== null) {
          accepted += r.accepted;
          rejected += r.rejected;
        }
        choices.push(r.choice);
        run.onEvent?.({ type: 'finish', index, finishReason: r.choice.finishReason });
      }
      const completion = choices.reduce((a, c) => a + c.completionTokens, 0);
      this.totals.promptTokens += plan.promptTokens.length;
      this.totals.cachedPromptTokens += cached;
      const aborted = run.signal?.aborted ?? false;
      if (aborted) this.totals.aborted++;
      return {
        choices,
        aborted,
        usage: {
          prompt_tokens: plan.promptTokens.length,
          completion_tokens: completion,
          total_tokens: plan.promptTokens.length + completion,
          prompt_tokens_details: { cached_tokens: cached, audio_tokens: null },
          completion_tokens_details: {
            reasoning_tokens: this.caps.reasoning ? reasoning : null,
            audio_tokens: null,
            accepted_prediction_tokens: accepted,
            rejected_prediction_tokens: rejected,
          },
        },
      };
    } finally {
      slot.predictor.setPrediction([]);
      this.release(slot);
    }
  }

  // ------------------------------------------------------------ planning

  private async prepare(req: ChatRequest): Promise<Plan> {
    const name = this.engineInfo.modelName;
    req.messages.forEach((m, i) => {
      if (typeof m.content === 'string' || !m.content) return;
      m.content.forEach((part, j) => {
        if (part.type === 'text') return;
        const what = part.type.startsWith('input_audio') ? 'audio' : part.type;
        throw capabilityMissing(
          `messages[${i}].content[${j}]`,
          `The model ${name} reads text only; it cannot take ${what} input.`,
        );
      });
    });

    const tools = req.tools ?? [];
    const choice = req.tool_choice ?? 'auto';
    const useTools = tools.length > 0 && choice !== 'none';
    if (useTools && !this.caps.tools) {
      throw capabilityMissing('tools', `The model ${name} has no tool-calling chat template.`);
    }
    const rf = req.response_format ?? { type: 'text' };
    if (rf.type !== 'text') {
      if (!this.caps[rf.type]) {
        throw capabilityMissing(
          'response_format',
          `The model ${name} cannot produce ${rf.type} output.`,
        );
      }
      if (useTools) {
        throw unsupportedCombination(
          'response_format',
          'response_format json_object/json_schema cannot be combined with tools on the llama engine.',
        );
      }
    }
    const logprobs = req.logprobs === true;
    if (useTools && logprobs) {
      throw unsupportedCombination(
        'logprobs',
        'logprobs cannot be combined with tools on the llama engine.',
      );
    }

    const history = toChatHistory(req.messages);
    const only = typeof choice === 'object' ? choice.function.name : null;
    const functions = useTools ? await this.toolFunctions(tools, only) : undefined;
    const forced = functions !== undefined && (choice === 'required' || only !== null);
    const state = this.chatWrapper.generateContextState({
      chatHistory: history,
      availableFunctions: functions,
      documentFunctionParams: functions ? true : undefined,
    });
    const promptTokens = state.contextText.tokenize(this.model.tokenizer);

    const grammar = rf.type === 'text' ? undefined : await this.grammarFor(rf);
    const requestStops = typeof req.stop === 'string' ? [req.stop] : (req.stop ?? []);
    const stops = this.resolveStops(grammar ? [] : state.stopGenerationTriggers);
    stops.texts.push(...requestStops);
    for (const t of grammar?.stopGenerationTriggers ?? []) {
      if (typeof t === 'string') stops.texts.push(t);
      else if (!Array.isArray(t)) stops.texts.push(this.textOfTrigger(t as LlamaText));
    }

    const ctx = this.engineInfo.contextSize;
    const requested = req.max_completion_tokens ?? req.max_tokens ?? null;
    // The field the client sent: `max_completion_tokens` wins, as it does above.
    const field = req.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens';
    if (promptTokens.length >= ctx) throw contextError(promptTokens.length, requested, ctx, field);
    if (requested !== null && promptTokens.length + requested > ctx) {
      throw contextError(promptTokens.length, requested, ctx, field);
    }

    let tokenBias: TokenBias | undefined;
    const eogBias = new Map<number, number>();
    if (req.logit_bias && Object.keys(req.logit_bias).length > 0) {
      tokenBias = new TokenBias(this.model.tokenizer);
      for (const [key, bias] of Object.entries(req.logit_bias)) {
        const id = Number(key);
        if (this.engineInfo.vocabularySize > 0 && id >= this.engineInfo.vocabularySize) {
          throw new ServiceError('invalid_value', {
            message: `logit_bias.${key} is not a token id of this model (vocabulary size ${this.engineInfo.vocabularySize})`,
            param: `logit_bias.${key}`,
          });
        }
        // OpenAI adds the bias to the logit; ±100 effectively bans or forces the token.
        if (this.model.isEogToken(id as Token)) eogBias.set(id, bias);
        else tokenBias.set(id as Token, { logit: bias });
      }
    }

    let predictionTokens: Token[] | null = null;
    if (req.prediction) {
      const text = contentText(req.prediction.content);
      predictionTokens = this.model.tokenize(text, false);
    }

    return {
      history,
      promptTokens,
      n: req.n ?? 1,
      maxTokens: requested ?? ctx - promptTokens.length,
      temperature: req.temperature ?? DEFAULT_TEMPERATURE,
      topP: req.top_p ?? DEFAULT_TOP_P,
      seed:
        req.seed !== undefined && req.seed !== null
          ? toUint32Seed(req.seed)
          : randomInt(0, 2 ** 32),
      tokenBias,
      eogBias,
      frequencyPenalty: req.frequency_penalty ?? 0,
      presencePenalty: req.presence_penalty ?? 0,
      logprobs,
      topLogprobs: logprobs ? (req.top_logprobs ?? 0) : 0,
      grammar,
      stops,
      requestStops,
      ignoreEos: req.ignore_eos === true,
      predictionTokens,
      // Reasoning models go through LlamaChat too, which keeps thoughts out of the content;
      // logprobs and grammars need the token loop, where thoughts stay in the text.
      chat:
        functions || (this.caps.reasoning && !logprobs && grammar === undefined)
          ? {
              functions,
              parallel: req.parallel_tool_calls !== false,
              wrapper: forced ? new ForcedCallChatWrapper(this.chatWrapper) : this.chatWrapper,
              forced:
                forced && Object.keys(functions!).length === 1 ? Object.keys(functions!)[0]! : null,
            }
          : null,
    };
  }

  /** Text the model would produce for a trigger, or a token id for a lone control token. */
  private resolveStops(triggers: readonly LlamaText[]): Stops {
    const stops: Stops = { texts: [], tokens: new Set() };
    for (const trigger of triggers) {
      const tokens = trigger.tokenize(this.model.tokenizer);
      const only = tokens[0];
      if (tokens.length === 1 && only !== undefined && this.pieces.bytes(only).length === 0) {
        stops.tokens.add(only as number);
      } else {
        stops.texts.push(this.textOfTrigger(trigger));
      }
    }
    return stops;
  }

  private textOfTrigger(trigger: LlamaText): string {
    const tokens = trigger.tokenize(this.model.tokenizer);
    const bytes: number[] = [];
    for (const t of tokens) bytes.push(...this.pieces.bytes(t));
    return new TextDecoder().decode(Uint8Array.from(bytes));
  }

  /** Compiles (or reuses) the grammar of a converted schema, or the generic JSON one. */
  private compile(schema: GbnfJsonSchema | null): Promise<LlamaGrammar> {
    const key = schema === null ? 'json' : JSON.stringify(schema);
    let g = this.grammarCache.get(key);
    if (g === undefined) {
      g =
        schema === null
          ? this.llama.getGrammarFor('json')
          : this.llama.createGrammarForJsonSchema<GbnfJsonSchema>(schema);
      // Bounded: a client sending a new schema each time must not grow memory forever.
      if (this.grammarCache.size >= GRAMMAR_CACHE_SIZE) {
        const oldest = this.grammarCache.keys().next().value;
        if (oldest !== undefined) this.grammarCache.delete(oldest);
      }
      this.grammarCache.set(key, g);
      g.catch(() => this.grammarCache.delete(key));
    }
    return g;
  }

  /** A client schema as a compiled grammar; a 400 naming `param` when it cannot be one. */
  private async schemaGrammar(
    schema: unknown,
    strict: boolean,
    param: string,
  ): Promise<{ schema: GbnfJsonSchema; grammar: LlamaGrammar }> {
    try {
      const converted = toGrammarSchema(schema, strict);
      return { schema: converted, grammar: await this.compile(converted) };
    } catch (err) {
      throw new ServiceError('invalid_value', {
        message: `${param} cannot be enforced by grammar-constrained sampling: ${err instanceof Error ? err.message : String(err)}`,
        param,
      });
    }
  }

  private async grammarFor(
    rf: Exclude<ChatRequest['response_format'], null | undefined>,
  ): Promise<LlamaGrammar> {
    if (rf.type !== 'json_schema') return this.compile(null);
    const { json_schema: js } = rf;
    return (
      await this.schemaGrammar(
        js.schema ?? {},
        js.strict === true,
        'response_format.json_schema.schema',
      )
    ).grammar;
  }

  /**
   * The tools LlamaChat may call (only the named one for a named `tool_choice`), their
   * parameter schemas converted and compiled up front so a bad schema is a 400 here,
   * not a failure in the middle of generation.
   */
  private async toolFunctions(
    tools: readonly ToolDefinition[],
    only: string | null,
  ): Promise<ChatModelFunctions> {
    const out: Record<string, { description?: string; params?: GbnfJsonSchema }> = {};
    for (let i = 0; i < tools.length; i++) {
      const t = tools[i] as ToolDefinition;
      if (only !== null && t.function.name !== only) continue;
      const params = t.function.parameters;
      out[t.function.name] = {
        description: t.function.description,
        params: params
          ? (
              await this.schemaGrammar(
                params,
                t.function.strict === true,
                `tools[${i}].function.parameters`,
              )
            ).schema
          : undefined,
      };
    }
    return out;
  }

  // ------------------------------------------------------------ slots

  private bestFreeSlot(prompt: readonly Token[]): Slot | undefined {
    let best: Slot | undefined;
    let bestShared = -1;
    for (const s of this.slots) {
      if (s.busy) continue;
      const shared = s.sequence.compareContextTokens(prompt.slice()).firstDifferentIndex;
      if (
        shared > bestShared ||
        (shared === bestShared && best !== undefined && s.lastUsed < best.lastUsed)
      ) {
        best = s;
        bestShared = shared;
      }
    }
    return best;
  }

  private acquire(prompt: readonly Token[], signal: AbortSignal | undefined): Promise<Slot> {
    if (signal?.aborted) return Promise.reject(new ServiceError('cancelled'));
    const free = this.bestFreeSlot(prompt);
    if (free) {
      free.busy = true;
      return Promise.resolve(free);
    }
    if (this.waiters.length >= this.maxQueue) {
      return Promise.reject(
        new ServiceError('capacity_exceeded', {
          message: `All ${this.slots.length} slots are busy and ${this.waiters.length} requests are waiting.`,
        }),
      );
    }
    return new Promise<Slot>((resolve, reject) => {
      const onAbort = (): void => {
        const i = this.waiters.indexOf(waiter);
        if (i !== -1) this.waiters.splice(i, 1);
        this.totals.aborted++;
        reject(new ServiceError('cancelled'));
      };
      const waiter: Waiter = {
        resolve,
        reject,
        cleanup: () => signal?.removeEventListener('abort', onAbort),
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  private release(slot: Slot): void {
    slot.lastUsed = Date.now();
    const next = this.waiters.shift();
    if (!next) {
      slot.busy = false;
      return;
    }
    next.cleanup();
    // FIFO: the slot passes straight to the longest waiter (it stays busy).
    next.resolve(slot);
  }

  /** Erases what the slot holds past the shared prefix; returns the reused length. */
  private async reusePrefix(slot: Slot, prompt: readonly Token[]): Promise<number> {
    const seq = slot.sequence;
    const shared = seq.compareContextTokens(prompt.slice()).firstDifferentIndex;
    // At least one prompt token must be evaluated to get the next-token logits.
    const keep = Math.min(shared, prompt.length - 1);
    if (seq.nextTokenIndex > keep) {
      await seq.eraseContextTokenRanges([{ start: keep, end: seq.nextTokenIndex }]);
    }
    return keep;
  }

  // ------------------------------------------------------------ generation

  private logprobEntry(
    token: Token,
    probs: ReadonlyMap<number, number> | undefined,
    top: number,
  ): LogprobEntry {
    const bytes = this.pieces.bytes(token);
    const entry = (t: number, p: number) => {
      const b = this.pieces.bytes(t as Token);
      return { token: tokenDisplay(b), logprob: safeLog(p), bytes: [...b] };
    };
    return {
      token: tokenDisplay(bytes),
      logprob: safeLog(probs?.get(token as number) ?? 0),
      bytes: [...bytes],
      top_logprobs: probs ? topTokens(probs, top).map(([t, p]) => entry(t, p)) : [],
    };
  }

  private async runTextChoice(
    slot: Slot,
    plan: Plan,
    index: number,
    run: RunOptions,
  ): Promise<ChoiceRun> {
    const seq = slot.sequence;
    const started = performance.now();
    const cached = await this.reusePrefix(slot, plan.promptTokens);
    slot.predictor.setPrediction(plan.predictionTokens ?? []);

    const grammarState = plan.grammar
      ? new LlamaGrammarEvaluationState({ model: this.model, grammar: plan.grammar })
      : undefined;
    const seed = (plan.seed + index) >>> 0;
    // See sampling.ts: logprobs with sampling, or a bias on end-of-generation tokens, draw
    // the token in JS from llama.cpp's full distribution (not possible under a grammar,
    // whose state lives in llama.cpp).
    const sampleInJs =
      grammarState === undefined &&
      ((plan.logprobs && plan.temperature > 0) || plan.eogBias.size > 0);
    const random = sampleInJs ? mulberry32(seed) : undefined;
    const generated: Token[] = [];
    const penalize = plan.frequencyPenalty !== 0 || plan.presencePenalty !== 0;
    const options: SequenceEvaluateOptions = {
      temperature: sampleInJs ? 0 : plan.temperature,
      topP: plan.topP,
      topK: 0,
      minP: 0,
      seed,
      tokenBias: plan.tokenBias,
      grammarEvaluationState: grammarState,
      repeatPenalty: penalize
        ? {
            punishTokens: () => generated,
            maxPunishTokens: plan.maxTokens,
            penalty: 1,
            frequencyPenalty: plan.frequencyPenalty,
            presencePenalty: plan.presencePenalty,
          }
        : undefined,
      // EOG is decided here: JS sampling may pick something else than llama.cpp's choice.
      yieldEogToken: true,
    };
    const text = new ChoiceText(plan.stops.texts, grammarState !== undefined);
    const emit = (r: { text: string; logprobs: LogprobEntry[] }): void => {
      if (!run.onEvent || (r.text === '' && r.logprobs.length === 0)) return;
      run.onEvent({
        type: 'content',
        index,
        text: r.text,
        logprobs: plan.logprobs ? r.logprobs : null,
      });
    };
    const entries: LogprobEntry[] = [];
    const iterator = evaluate(
      seq,
      plan.promptTokens.slice(cached),
      plan.logprobs || sampleInJs,
      options,
    );
    let finish: FinishReason = 'length';
    let firstTokenAt = 0;
    let override: Token | undefined;
    try {
      while (generated.length < plan.maxTokens) {
        if (run.signal?.aborted) {
          finish = 'stop';
          break;
        }
        const step = await iterator.next(override);
        override = undefined;
        if (step.done) {
          finish = 'stop';
          break;
        }
        if (firstTokenAt === 0) firstTokenAt = performance.now();
        let token = step.value.token;
        let probs = step.value.probabilities as ReadonlyMap<number, number> | undefined;
        if (probs && plan.eogBias.size > 0) probs = applyLogitBias(probs, plan.eogBias);
        if (random && probs) {
          const drawn = sampleToken(probs, plan.temperature, plan.topP, random) as Token;
          if (drawn !== token) override = drawn;
          token = drawn;
        }
        if (
          !plan.ignoreEos &&
          (this.model.isEogToken(token) || plan.stops.tokens.has(token as number))
        ) {
          finish = 'stop';
          break;
        }
        generated.push(token);
        const entry = plan.logprobs ? this.logprobEntry(token, probs, plan.topLogprobs) : undefined;
        const r = text.push(this.pieces.bytes(token), entry);
        entries.push(...r.logprobs);
        emit(r);
        if (r.stopped) {
          finish = 'stop';
          break;
        }
      }
    } finally {
      await iterator.return();
    }
    const tail = text.finish();
    entries.push(...tail.logprobs);
    emit(tail);

    const ended = performance.now();
    const promptEnd = firstTokenAt || ended;
    this.totals.promptSeconds += (promptEnd - started) / 1000;
    this.totals.predictedSeconds += (ended - promptEnd) / 1000;
    this.totals.predictedTokens += generated.length;

    const counts = predictionCounts(plan.predictionTokens ?? [], generated);
    return {
      cached,
      reasoning: 0,
      accepted: counts.accepted,
      rejected: counts.rejected,
      choice: {
        index,
        content: text.text,
        toolCalls: null,
        logprobs: plan.logprobs ? entries : null,
        finishReason: finish,
        completionTokens: generated.length,
      },
    };
  }

  private async runChatChoice(
    slot: Slot,
    plan: Plan,
    index: number,
    run: RunOptions,
  ): Promise<ChoiceRun> {
    const chatPlan = plan.chat;
    if (!chatPlan) throw new Error('runChatChoice without a chat plan');
    const seq = slot.sequence;
    const started = performance.now();
    const cached = Math.min(
      seq.compareContextTokens(plan.promptTokens).firstDifferentIndex,
      plan.promptTokens.length - 1,
    );
    slot.predictor.setPrediction(plan.predictionTokens ?? []);
    const meterBefore = seq.tokenMeter.usedOutputTokens;
    const chat = new LlamaChat({
      contextSequence: seq,
      chatWrapper: chatPlan.wrapper,
      autoDisposeSequence: false,
    });
    // Arguments as the model wrote them (streamed or not, the same text): node-llama-cpp's
    // params chunks, minus the whitespace its JSON grammar lets a call end with.
    const calls = new Map<
      number,
      { id: string; name: string; text: string; pendingSpace: string }
    >();
    const penalize = plan.frequencyPenalty !== 0 || plan.presencePenalty !== 0;
    let firstTokenAt = 0;
    let reasoning = 0;
    let streamed = '';
    try {
      const res = await chat
        .generateResponse(plan.history, {
          functions: chatPlan.functions,
          documentFunctionParams: chatPlan.functions ? true : undefined,
          maxParallelFunctionCalls: chatPlan.parallel ? undefined : 1,
          temperature: plan.temperature,
          topP: plan.topP,
          topK: 0,
          minP: 0,
          seed: (plan.seed + index) >>> 0,
          tokenBias: plan.tokenBias,
          repeatPenalty: penalize
            ? {
                penalty: 1,
                frequencyPenalty: plan.frequencyPenalty,
                presencePenalty: plan.presencePenalty,
                lastTokens: plan.maxTokens,
                penalizeNewLine: true,
              }
            : false,
          maxTokens: plan.maxTokens,
          customStopTriggers: plan.requestStops.length > 0 ? plan.requestStops : undefined,
          signal: run.signal,
          stopOnAbortSignal: true,
          onToken: () => {
            if (firstTokenAt === 0) firstTokenAt = performance.now();
          },
          onResponseChunk: (chunk) => {
            // Thoughts are counted, never sent: deltas carry content and tool calls only.
            if (chunk.type === 'segment') reasoning += chunk.tokens.length;
            else if (chunk.text !== '') {
              streamed += chunk.text;
              run.onEvent?.({ type: 'content', index, text: chunk.text, logprobs: null });
            }
          },
          onFunctionCallParamsChunk: (c) => {
            let call = calls.get(c.callIndex);
            if (!call) {
              call = { id: callId(), name: c.functionName, text: '', pendingSpace: '' };
              calls.set(c.callIndex, call);
              run.onEvent?.({
                type: 'tool_call',
                index,
                call: {
                  index: c.callIndex,
                  id: call.id,
                  type: 'function',
                  function: { name: c.functionName, arguments: '' },
                },
              });
            }
            const chunk = call.pendingSpace + c.paramsChunk;
            const body = chunk.replace(/\s+$/, '');
            call.pendingSpace = c.done ? '' : chunk.slice(body.length);
            if (body === '') return;
            call.text += body;
            run.onEvent?.({
              type: 'tool_call',
              index,
              call: { index: c.callIndex, function: { arguments: body } },
            });
          },
        })
        .catch((err: unknown) => {
          // The context filled while the reply was still growing (the function-call syntax
          // LlamaChat adds is not in the token budget the request was checked against) and
          // it could not shift: the reply ends there, cut by the context as by max_tokens.
          if (!contextFull(err)) throw err;
          return null;
        });
      // A forced call cut off by max_tokens before its arguments began (the tokens went to
      // the call syntax and the name): it is still that call, with no arguments yet, when
      // only one function could be called. Without it the reply would be nothing at all.
      if (
        (!res || res.metadata.stopReason === 'maxTokens') &&
        chatPlan.forced !== null &&
        calls.size === 0 &&
        (res?.functionCalls ?? []).length === 0
      ) {
        const call = { id: callId(), name: chatPlan.forced, text: '', pendingSpace: '' };
        calls.set(0, call);
        run.onEvent?.({
          type: 'tool_call',
          index,
          call: {
            index: 0,
            id: call.id,
            type: 'function',
            function: { name: call.name, arguments: '' },
          },
        });
      }
      // Every call the model began, as the stream sent them: the complete ones
      // (`functionCalls`) and one cut off by max_tokens, whose arguments are the JSON
      // written so far (OpenAI returns a truncated call the same way, with
      // finish_reason `length`). Streamed and not, the same calls.
      const done = res?.functionCalls ?? [];
      const indexes = [...new Set([...calls.keys(), ...done.keys()])].sort((a, b) => a - b);
      const toolCalls: WireToolCall[] = indexes.map((i) => {
        const raw = calls.get(i);
        const c = done[i];
        return {
          id: raw?.id ?? callId(),
          type: 'function',
          function: {
            name: c?.functionName ?? raw!.name,
            arguments: raw && raw.text !== '' ? raw.text : c ? JSON.stringify(c.params ?? {}) : '',
          },
        };
      });
      const ended = performance.now();
      const promptEnd = firstTokenAt || ended;
      const completionTokens = seq.tokenMeter.usedOutputTokens - meterBefore;
      this.totals.promptSeconds += (promptEnd - started) / 1000;
      this.totals.predictedSeconds += (ended - promptEnd) / 1000;
      this.totals.predictedTokens += completionTokens;
      const response = res ? res.response : streamed;
      const counts = predictionCounts(
        plan.predictionTokens ?? [],
        plan.predictionTokens ? this.model.tokenize(response, false) : [],
      );
      // The token limit wins (or the context's): a reply it cut off is `length`, tool
      // calls or not.
      const finish: FinishReason =
        !res || res.metadata.stopReason === 'maxTokens'
          ? 'length'
          : toolCalls.length > 0
            ? 'tool_calls'
            : 'stop';
      return {
        cached: Math.max(0, cached),
        reasoning,
        accepted: counts.accepted,
        rejected: counts.rejected,
        choice: {
          index,
          content: toolCalls.length > 0 && response === '' ? null : response,
          toolCalls: toolCalls.length > 0 ? toolCalls : null,
          logprobs: null,
          finishReason: finish,
          completionTokens,
        },
      };
    } finally {
      chat.dispose({ disposeSequence: false });
    }
  }
}

/** node-llama-cpp's error when a chat's reply filled the context and could not shift it. */
function contextFull(err: unknown): boolean {
  return err instanceof Error && /too small to fit the context shift size/.test(err.message);
}
