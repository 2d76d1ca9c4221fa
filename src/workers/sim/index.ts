/**
 * Entry module of the sim inference worker: a deterministic, OpenAI-compatible
 * simulated engine with a configurable timing, queueing and KV-cache model, used
 * by tests and benchmarks. Other modules import from here only.
 */
export { SimEngine, clockSleep, realSleep, resolveEngineOptions } from './engine.js';
export type {
  PreparedRequest,
  RunHooks,
  RunResult,
  SimEngineOptions,
  SimEngineStats,
  NowClock,
  Sleep,
} from './engine.js';
export { contextLengthError, type ErrorStyle, type SimHttpError } from './errors.js';
export { ManualSleep } from './manual-sleep.js';
export {
  DEFAULT_EMBEDDING_DIM,
  embedText,
  embedTokens,
  float32Base64,
  similarity,
} from './pooling.js';
export { createSimHandler, startSimWorker } from './server.js';
export type { FailMode, SimWorker, SimWorkerOptions, SimWorkerStats } from './server.js';
export { countTokens, renderPrompt, tokenize, tokenizePrompt } from './tokenizer.js';
export type { ChatRequest, ChatCompletion, ChatCompletionChunk } from './wire.js';
