import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  errorEventMessage,
  estimatedUsage,
  extractUsage,
  normalizeCompletion,
  normalizeFinishReason,
  normalizeLogprobs,
  normalizeUsage,
  reframeChunk,
  StreamAccumulator,
  upstreamErrorMessage,
  usageChunk,
  type ChatCompletion,
  type ChatCompletionChunk,
  type ReframeContext,
  type StreamSummary,
  type Usage,
} from './reframe.js';
import { isDone, SseParser } from './sse.js';
import { ServiceError } from '../errors/index.js';
import { validateChunk, validateCompletion } from '../../test/support/openai-schemas.js';

const ctx: ReframeContext = {
  id: 'req_01HZX5K3Q9',
  created: 1767225600,
  model: 'qwen3-8b',
  serviceTier: 'gpu',
};

function usage(
  prompt: number,
  completion: number,
  extra: {
    cached?: number;
    reasoning?: number | null;
    accepted?: number | null;
    rejected?: number | null;
  } = {},
): Usage {
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: extra.cached ?? 0, audio_tokens: null },
    completion_tokens_details: {
      reasoning_tokens: extra.reasoning ?? null,
      audio_tokens: null,
      accepted_prediction_tokens: extra.accepted ?? null,
      rejected_prediction_tokens: extra.rejected ?? null,
    },
  };
}

// ---------------------------------------------------------------------------
// Realistic upstream streams, as the servers put them on the wire.

const vllmHead = {
  id: 'chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b',
  object: 'chat.completion.chunk',
  created: 1718000000,
  model: 'Qwen/Qwen3-8B',
};
const vllm = (choice: object, extra: object = {}) => ({ ...vllmHead, choices: [choice], ...extra });

const llamaHead = {
  created: 1754524122,
  id: 'chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1',
  model: 'gpt-oss-20b',
  system_fingerprint: 'b6097-9515c613',
  object: 'chat.completion.chunk',
};
const llama = (choice: object, extra: object = {}) => ({
  choices: [choice],
  ...llamaHead,
  ...extra,
});
const llamaTimings = {
  cache_n: 1024,
  prompt_n: 61,
  prompt_ms: 203.378,
  prompt_per_token_ms: 3.334,
  prompt_per_second: 299.9,
  predicted_n: 6,
  predicted_ms: 33.6,
  predicted_per_token_ms: 5.6,
  predicted_per_second: 178.5,
};

const ollamaHead = {
  id: 'chatcmpl-86',
  object: 'chat.completion.chunk',
  created: 1743277352,
  model: 'qwen3:8b',
  system_fingerprint: 'fp_ollama',
};
const ollama = (choice: object, extra: object = {}) => ({
  ...ollamaHead,
  choices: [choice],
  ...extra,
});

/** Upstream SSE text as on the wire (raw: JSON escapes stay escaped). */
function sse(text: TemplateStringsArray): string {
  return String.raw(text).replace(/^\n/, '');
}

interface StreamCase {
  name: string;
  /** The upstream body, `data: [DONE]` included. */
  wire: string;
  /** Concatenated delta.content the client must see. */
  content: string;
  /** Reasoning fragments that must never reach the client. */
  reasoning: string[];
  finish: string;
  usage: Usage;
  usageReported: boolean;
  fingerprint: string | null;
  toolCalls?: Array<{ id: string; name: string; arguments: string }>;
  logprobTokens?: string[];
}

const streamCases: StreamCase[] = [
  {
    name: 'vLLM with a reasoning parser (reasoning_content) and include_usage',
    wire: sse`
data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"reasoning_content":"The user greets me."},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"reasoning_content":" Reply briefly."},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"\n\nHello"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[],"usage":{"prompt_tokens":12,"total_tokens":26,"completion_tokens":14,"prompt_tokens_details":{"cached_tokens":0}}}

data: [DONE]

`,
    content: '\n\nHello!',
    reasoning: ['The user greets me.', ' Reply briefly.'],
    finish: 'stop',
    usage: usage(12, 14),
    usageReported: true,
    fingerprint: null,
  },
  {
    name: 'vLLM newer `reasoning` field, continuous usage stats on every chunk',
    wire: sse`
data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":20,"total_tokens":20,"completion_tokens":0}}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"reasoning":"Paris is the capital."},"logprobs":null,"finish_reason":null,"token_ids":[1]}],"usage":{"prompt_tokens":20,"total_tokens":25,"completion_tokens":5}}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"Paris."},"logprobs":null,"finish_reason":null,"token_ids":[2]}],"usage":{"prompt_tokens":20,"total_tokens":27,"completion_tokens":7}}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":20,"total_tokens":28,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":16}}}

data: [DONE]

`,
    content: 'Paris.',
    reasoning: ['Paris is the capital.'],
    finish: 'stop',
    usage: usage(20, 8, { cached: 16 }),
    usageReported: true,
    fingerprint: null,
  },
  {
    name: 'vLLM tool call streamed in fragments (hermes parser)',
    wire: sse`
data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-8a2e41","type":"function","index":0,"function":{"name":"get_weather"}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \""}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"Paris\"}"}}]},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[],"usage":{"prompt_tokens":180,"total_tokens":201,"completion_tokens":21,"prompt_tokens_details":null}}

data: [DONE]

`,
    content: '',
    reasoning: [],
    finish: 'tool_calls',
    usage: usage(180, 21),
    usageReported: true,
    fingerprint: null,
    toolCalls: [
      { id: 'chatcmpl-tool-8a2e41', name: 'get_weather', arguments: '{"city": "Paris"}' },
    ],
  },
  {
    name: 'vLLM with logprobs (-inf floored at -9999)',
    wire: sse`
data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.0312,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.0312,"bytes":[72,105]},{"token":"Hello","logprob":-3.51,"bytes":[72,101,108,108,111]}]}]},"finish_reason":null}]}

data: {"id":"chatcmpl-6c3a1f0e9b2d4e5f8a7b6c5d4e3f2a1b","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"!"},"logprobs":{"content":[{"token":"!","logprob":-9999,"bytes":[33],"top_logprobs":[{"token":"!","logprob":-9999,"bytes":[33]},{"token":".","logprob":-0.2,"bytes":[46]}]}]},"finish_reason":"length","stop_reason":null}]}

data: [DONE]

`,
    content: 'Hi!',
    reasoning: [],
    finish: 'length',
    // No usage chunk: the router counts one token per logprob entry.
    usage: usage(0, 2),
    usageReported: false,
    fingerprint: null,
    logprobTokens: ['Hi', '!'],
  },
  {
    name: 'llama.cpp reasoning model, include_usage (usage + timings on the last chunk)',
    wire: sse`
data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk"}

data: {"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":"We"}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk"}

data: {"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":" should greet."}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk"}

data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hello"}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk"}

data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"! 👋"}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk"}

data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk"}

data: {"choices":[],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk","usage":{"completion_tokens":6,"prompt_tokens":1085,"total_tokens":1091,"prompt_tokens_details":{"cached_tokens":1024}},"timings":{"cache_n":1024,"prompt_n":61,"prompt_ms":203.378,"prompt_per_token_ms":3.334,"prompt_per_second":299.9,"predicted_n":6,"predicted_ms":33.6,"predicted_per_token_ms":5.6,"predicted_per_second":178.5}}

data: [DONE]

`,
    content: 'Hello! 👋',
    reasoning: ['We', ' should greet.'],
    finish: 'stop',
    usage: usage(1085, 6, { cached: 1024 }),
    usageReported: true,
    fingerprint: 'b6097-9515c613',
  },
  {
    name: 'llama.cpp without include_usage: counts come from timings',
    wire: sse`
data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk"}

data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Bonjour"}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk"}

data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk","timings":{"cache_n":1024,"prompt_n":61,"prompt_ms":203.378,"prompt_per_token_ms":3.334,"prompt_per_second":299.9,"predicted_n":6,"predicted_ms":33.6,"predicted_per_token_ms":5.6,"predicted_per_second":178.5}}

data: [DONE]

`,
    content: 'Bonjour',
    reasoning: [],
    finish: 'stop',
    usage: usage(1085, 6, { cached: 1024 }),
    usageReported: true,
    fingerprint: 'b6097-9515c613',
  },
  {
    name: 'older llama.cpp: usage on the finish chunk, no details, timings without cache_n',
    wire: sse`
data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi"}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk"}

data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk","usage":{"completion_tokens":2,"prompt_tokens":1085,"total_tokens":1087},"timings":{"prompt_n":1085,"prompt_ms":203.3,"predicted_n":2,"predicted_ms":9.3}}

data: [DONE]

`,
    content: 'Hi',
    reasoning: [],
    finish: 'stop',
    usage: usage(1085, 2),
    usageReported: true,
    fingerprint: 'b6097-9515c613',
  },
  {
    name: 'llama.cpp with logprobs (entries carry an `id`)',
    wire: sse`
data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk"}

data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Yes"},"logprobs":{"content":[{"id":9642,"token":"Yes","bytes":[89,101,115],"logprob":-0.0021,"top_logprobs":[{"id":9642,"token":"Yes","bytes":[89,101,115],"logprob":-0.0021},{"id":2822,"token":"No","bytes":[78,111],"logprob":-6.2}]}]}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk"}

data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1754524122,"id":"chatcmpl-yPk7z9nC22CofOlh100qQdHVEDMNYCb1","model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion.chunk","timings":{"cache_n":1024,"prompt_n":61,"prompt_ms":203.378,"prompt_per_token_ms":3.334,"prompt_per_second":299.9,"predicted_n":1,"predicted_ms":33.6,"predicted_per_token_ms":5.6,"predicted_per_second":178.5}}

data: [DONE]

`,
    content: 'Yes',
    reasoning: [],
    finish: 'stop',
    usage: usage(1085, 1, { cached: 1024 }),
    usageReported: true,
    fingerprint: 'b6097-9515c613',
    logprobTokens: ['Yes'],
  },
  {
    name: 'Ollama thinking model: role and empty content on every chunk, `reasoning` field',
    wire: sse`
data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning":"Okay, the user"},"finish_reason":null}]}

data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning":" wants a joke."},"finish_reason":null}]}

data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"Why did"},"finish_reason":null}]}

data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":" the llama cross?"},"finish_reason":null}]}

data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop"}]}

data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[],"usage":{"prompt_tokens":26,"completion_tokens":40,"total_tokens":66}}

data: [DONE]

`,
    content: 'Why did the llama cross?',
    reasoning: ['Okay, the user', ' wants a joke.'],
    finish: 'stop',
    usage: usage(26, 40),
    usageReported: true,
    fingerprint: 'fp_ollama',
  },
  {
    name: 'Ollama tool call: whole call in one chunk, then finish_reason tool_calls',
    wire: sse`
data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_hk81qg8b","index":0,"type":"function","function":{"name":"run_command","arguments":"{\"command\":\"ls -la\"}"}}]},"finish_reason":null}]}

data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"tool_calls"}]}

data: [DONE]

`,
    content: '',
    reasoning: [],
    finish: 'tool_calls',
    // Ollama sent no usage chunk: the router's estimate (characters of the call).
    usage: usage(0, 8),
    usageReported: false,
    fingerprint: 'fp_ollama',
    toolCalls: [{ id: 'call_hk81qg8b', name: 'run_command', arguments: '{"command":"ls -la"}' }],
  },
  {
    // Ollama's models without a dedicated parser (ollama/ollama#15457, #15497) give
    // every call of a turn index 0, one whole call per chunk, each with its own id.
    name: 'Ollama parallel tool calls: every call at index 0, each with its own id',
    wire: sse`
data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen2.5-coder:7b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_a1","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"hello.py\"}"}}]},"finish_reason":null}]}

data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen2.5-coder:7b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_b2","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"world.py\"}"}}]},"finish_reason":null}]}

data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen2.5-coder:7b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"tool_calls"}]}

data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":1743277352,"model":"qwen2.5-coder:7b","system_fingerprint":"fp_ollama","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":44,"total_tokens":164}}

data: [DONE]

`,
    content: '',
    reasoning: [],
    finish: 'tool_calls',
    usage: usage(120, 44),
    usageReported: true,
    fingerprint: 'fp_ollama',
    toolCalls: [
      { id: 'call_a1', name: 'file_write', arguments: '{"filePath":"hello.py"}' },
      { id: 'call_b2', name: 'file_write', arguments: '{"filePath":"world.py"}' },
    ],
  },
];

const utf8 = (s: string) => new TextEncoder().encode(s);

/** Encodes payloads as an upstream SSE body, `data: [DONE]` included. */
function sseBody(payloads: object[]): Uint8Array {
  let s = '';
  for (const p of payloads) s += `data: ${JSON.stringify(p)}\n\n`;
  return utf8(s + 'data: [DONE]\n\n');
}

interface StreamRun {
  chunks: ChatCompletionChunk[];
  wire: string;
  summary: StreamSummary;
  final: ChatCompletionChunk;
}

/** What the proxy does: parse bytes, reframe, forward; `chunkSize` splits the body. */
function runStream(body: Uint8Array, c: ReframeContext, chunkSize = 7): StreamRun {
  const parser = new SseParser();
  const acc = new StreamAccumulator(c, 1_000);
  const chunks: ChatCompletionChunk[] = [];
  let wire = '';
  let now = 1_000;
  let done = false;
  const onEvent = (data: string) => {
    if (done || data === '[DONE]') {
      done = true;
      return;
    }
    now += 10;
    const out = acc.accept(JSON.parse(data), now);
    if (out !== null) {
      chunks.push(out);
      wire += JSON.stringify(out);
    }
  };
  for (let i = 0; i < body.length; i += chunkSize) {
    for (const ev of parser.feed(body.subarray(i, i + chunkSize))) onEvent(ev.data);
  }
  for (const ev of parser.end()) onEvent(ev.data);
  const final = acc.usageChunk();
  wire += JSON.stringify(final);
  return { chunks, wire, summary: acc.summary(), final };
}

function assembledToolCalls(chunks: ChatCompletionChunk[]) {
  const calls: Array<{ id: string; name: string; arguments: string }> = [];
  for (const k of chunks) {
    for (const t of k.choices[0]?.delta.tool_calls ?? []) {
      const call = (calls[t.index] ??= { id: '', name: '', arguments: '' });
      if (t.id) call.id = t.id;
      if (t.function?.name) call.name += t.function.name;
      if (t.function?.arguments) call.arguments += t.function.arguments;
    }
  }
  return calls;
}

describe('streams from real upstreams', () => {
  for (const c of streamCases) {
    it(c.name, () => {
      const run = runStream(utf8(c.wire), ctx);
      for (const k of [...run.chunks, run.final])
        assert.deepEqual(validateChunk(k), [], JSON.stringify(k));

      for (const k of run.chunks) {
        assert.equal(k.id, ctx.id);
        assert.equal(k.model, ctx.model);
        assert.equal(k.created, ctx.created);
        assert.equal(k.service_tier, 'gpu');
        assert.equal(k.system_fingerprint, c.fingerprint);
        assert.equal(k.usage, undefined);
      }
      // The role is announced exactly once, on the first chunk.
      assert.equal(run.chunks[0]?.choices[0]?.delta.role, 'assistant');
      assert.equal(run.chunks.filter((k) => k.choices.some((ch) => ch.delta.role)).length, 1);

      const content = run.chunks.map((k) => k.choices[0]?.delta.content ?? '').join('');
      assert.equal(content, c.content);
      for (const r of c.reasoning) assert.ok(!run.wire.includes(r.trim()), `leaked ${r}`);
      // Upstream-only keys never survive (`reasoning_tokens` in usage is the spec's).
      const leakedKey =
        /"(reasoning_content|reasoning|thinking|stop_reason|token_ids|timings)"/.exec(run.wire);
      assert.equal(leakedKey, null, run.wire);

      const finishes = run.chunks.flatMap((k) => k.choices.map((ch) => ch.finish_reason));
      assert.deepEqual(
        finishes.filter((f) => f !== null),
        [c.finish],
      );
      assert.deepEqual(assembledToolCalls(run.chunks), c.toolCalls ?? []);
      if (c.logprobTokens) {
        const tokens = run.chunks.flatMap(
          (k) => k.choices[0]?.logprobs?.content?.map((e) => e.token) ?? [],
        );
        assert.deepEqual(tokens, c.logprobTokens);
      }

      assert.deepEqual(run.summary.usage, c.usage);
      assert.equal(run.summary.usageReported, c.usageReported);
      assert.deepEqual(run.final.usage, c.usage);
      assert.deepEqual(run.final.choices, []);
      assert.equal(run.final.system_fingerprint, c.fingerprint);
      assert.deepEqual(run.summary.finishReasons, [c.finish]);
      assert.equal(run.summary.finished, true);
      assert.equal(run.summary.contentEmitted, c.content !== '' || c.toolCalls !== undefined);
      assert.equal(run.summary.chunksForwarded, run.chunks.length);
      assert.equal(typeof run.summary.ttftMs, 'number');
    });
  }

  it('gives the same chunks however the bytes are split, CRLF or LF', () => {
    for (const c of streamCases) {
      const expected = runStream(utf8(c.wire), ctx, 1 << 20).wire;
      // Some proxies rewrite line ends to CRLF; JSON escapes hold no raw LF.
      const crlf = utf8(c.wire.replace(/\n/g, '\r\n'));
      for (const size of [1, 2, 3, 5, 64]) {
        assert.equal(runStream(crlf, ctx, size).wire, expected);
      }
    }
  });
});

// ---------------------------------------------------------------------------

describe('reframeChunk', () => {
  it('replaces id, model, created and tier; keeps the fingerprint; strips extras', () => {
    const out = reframeChunk(
      {
        ...llamaHead,
        choices: [
          {
            index: 0,
            delta: { content: 'x', reasoning_content: 'y', extra: 1 },
            finish_reason: null,
            stop_reason: 'eos',
            token_ids: [5],
          },
        ],
        timings: llamaTimings,
        service_tier: 'default',
        prompt_token_ids: [1, 2],
      },
      ctx,
    );
    assert.deepEqual(out, {
      id: ctx.id,
      object: 'chat.completion.chunk',
      created: ctx.created,
      model: ctx.model,
      service_tier: 'gpu',
      system_fingerprint: 'b6097-9515c613',
      choices: [{ index: 0, delta: { content: 'x' }, logprobs: null, finish_reason: null }],
    });
  });

  const dropped: Array<[string, unknown]> = [
    [
      'a reasoning-only delta',
      vllm({ index: 0, delta: { reasoning_content: 'hmm' }, finish_reason: null }),
    ],
    [
      'a reasoning-only delta with its logprobs',
      vllm({
        index: 0,
        delta: { reasoning: 'hmm' },
        logprobs: { content: [{ token: 'hmm', logprob: -1, bytes: null, top_logprobs: [] }] },
        finish_reason: null,
      }),
    ],
    ['an empty delta', vllm({ index: 0, delta: {}, finish_reason: null })],
    [
      'an empty-string content delta',
      vllm({ index: 0, delta: { content: '' }, finish_reason: null }),
    ],
    [
      'a usage-only chunk',
      {
        ...vllmHead,
        choices: [],
        usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
      },
    ],
    [
      'an upstream error object',
      { error: { message: 'boom', type: 'InternalServerError', code: 500 } },
    ],
    ['a non-object', 'data'],
    ['null', null],
    ['choices that are not objects', { choices: [1, 'x', null] }],
  ];
  for (const [name, payload] of dropped) {
    it(`drops ${name}`, () => assert.equal(reframeChunk(payload, ctx), null));
  }

  it('keeps a finish-only chunk with an empty delta', () => {
    const out = reframeChunk(llama({ finish_reason: 'stop', index: 0, delta: {} }), ctx);
    assert.deepEqual(out?.choices, [
      { index: 0, delta: {}, logprobs: null, finish_reason: 'stop' },
    ]);
  });

  it('forwards, ensures or drops the role as asked', () => {
    const roleOnly = llama({
      finish_reason: null,
      index: 0,
      delta: { role: 'assistant', content: null },
    });
    assert.deepEqual(reframeChunk(roleOnly, ctx)?.choices[0]?.delta, {
      role: 'assistant',
      content: '',
    });
    assert.equal(reframeChunk(roleOnly, ctx, 'drop'), null);
    const text = vllm({ index: 0, delta: { content: 'a' }, finish_reason: null });
    assert.deepEqual(reframeChunk(text, ctx)?.choices[0]?.delta, { content: 'a' });
    assert.deepEqual(reframeChunk(text, ctx, 'ensure')?.choices[0]?.delta, {
      role: 'assistant',
      content: 'a',
    });
    // A worker's odd role value never reaches the client.
    const odd = vllm({ index: 0, delta: { role: 'model', content: 'a' }, finish_reason: null });
    assert.equal(reframeChunk(odd, ctx)?.choices[0]?.delta.role, 'assistant');
  });

  it('streams a refusal in delta.refusal', () => {
    const out = reframeChunk(
      vllm({ index: 0, delta: { refusal: "I can't help" }, finish_reason: null }),
      ctx,
    );
    assert.deepEqual(out?.choices[0]?.delta, { refusal: "I can't help" });
    assert.deepEqual(validateChunk(out), []);
  });

  it('joins content parts and stringifies object tool arguments', () => {
    const out = reframeChunk(
      vllm({
        index: 0,
        delta: {
          content: [
            { type: 'text', text: 'a' },
            { type: 'text', text: 'b' },
          ],
          tool_calls: [
            { index: 0, id: 'c1', function: { name: 'f', arguments: { x: 1 } } },
            { function: { arguments: null } },
          ],
        },
        finish_reason: null,
      }),
      ctx,
    );
    assert.deepEqual(out?.choices[0]?.delta, {
      content: 'ab',
      tool_calls: [
        { index: 0, id: 'c1', type: 'function', function: { name: 'f', arguments: '{"x":1}' } },
        { index: 1, function: {} },
      ],
    });
    assert.deepEqual(validateChunk(out), []);
  });

  it('keeps a logprobs-only chunk (bytes of a character still being assembled)', () => {
    const out = reframeChunk(
      llama({
        finish_reason: null,
        index: 0,
        delta: {},
        logprobs: {
          content: [{ id: 1, token: '\xe4', bytes: [228], logprob: -0.5, top_logprobs: [] }],
        },
      }),
      ctx,
    );
    assert.equal(out?.choices[0]?.logprobs?.content?.length, 1);
    assert.deepEqual(validateChunk(out), []);
  });

  it('trims logprob entries that belong to reasoning in a mixed delta', () => {
    const out = reframeChunk(
      vllm({
        index: 0,
        delta: { reasoning_content: 'secret', content: 'Hi' },
        logprobs: {
          content: [
            { token: 'secret', logprob: -1, bytes: null, top_logprobs: [] },
            { token: 'Hi', logprob: -0.1, bytes: [72, 105], top_logprobs: [] },
          ],
        },
        finish_reason: null,
      }),
      ctx,
    );
    assert.deepEqual(
      out?.choices[0]?.logprobs?.content?.map((e) => e.token),
      ['Hi'],
    );
    assert.ok(!JSON.stringify(out).includes('secret'), JSON.stringify(out));
  });
});

describe('normalizeLogprobs', () => {
  it('fills refusal, drops ids, converts prob, floors -inf, cuts top_logprobs', () => {
    const out = normalizeLogprobs(
      {
        content: [
          {
            id: 9642,
            token: 'Yes',
            bytes: [89, 101, 115],
            prob: 0.5,
            top_probs: [
              { id: 9642, token: 'Yes', bytes: [89, 101, 115], prob: 0.5 },
              { id: 2822, token: 'No', bytes: [78, 111], prob: 0.25 },
              { id: 7, token: 'Maybe', bytes: [77], prob: 0.01 },
            ],
          },
          {
            token: 'x',
            logprob: -Infinity,
            bytes: 'bad',
            top_logprobs: [{ token: 'x', logprob: NaN }],
          },
          { logprob: -1 },
        ],
      },
      2,
    );
    assert.deepEqual(out, {
      content: [
        {
          token: 'Yes',
          logprob: Math.log(0.5),
          bytes: [89, 101, 115],
          top_logprobs: [
            { token: 'Yes', logprob: Math.log(0.5), bytes: [89, 101, 115] },
            { token: 'No', logprob: Math.log(0.25), bytes: [78, 111] },
          ],
        },
        {
          token: 'x',
          logprob: -9999,
          bytes: null,
          top_logprobs: [{ token: 'x', logprob: -9999, bytes: null }],
        },
      ],
      refusal: null,
    });
  });

  it('is null for null, empty or unusable input', () => {
    for (const v of [
      null,
      undefined,
      {},
      { content: [] },
      { content: null, refusal: null },
      3,
      [],
    ]) {
      assert.equal(normalizeLogprobs(v), null);
    }
  });

  it('accepts a bare entry array and refusal entries', () => {
    const e = { token: 'a', logprob: -1, bytes: [97], top_logprobs: [] };
    assert.deepEqual(normalizeLogprobs([e]), { content: [e], refusal: null });
    assert.deepEqual(normalizeLogprobs({ content: null, refusal: [e] }), {
      content: null,
      refusal: [e],
    });
  });
});

describe('normalizeFinishReason', () => {
  const table: Array<[unknown, string | null]> = [
    ['stop', 'stop'],
    ['length', 'length'],
    ['tool_calls', 'tool_calls'],
    ['content_filter', 'content_filter'],
    ['function_call', 'function_call'],
    ['max_tokens', 'length'],
    ['limit', 'length'],
    ['tool_use', 'tool_calls'],
    ['eos', 'stop'],
    ['abort', 'stop'],
    [null, null],
    [undefined, null],
    ['', null],
    [3, null],
  ];
  for (const [input, expected] of table) {
    it(`${JSON.stringify(input)} -> ${JSON.stringify(expected)}`, () => {
      assert.equal(normalizeFinishReason(input), expected);
    });
  }
});

// ---------------------------------------------------------------------------

describe('normalizeUsage', () => {
  const table: Array<{
    name: string;
    input: unknown;
    timings?: unknown;
    prediction?: boolean;
    expected: Usage;
  }> = [
    {
      name: 'vLLM with prefix caching',
      input: {
        prompt_tokens: 1200,
        total_tokens: 1250,
        completion_tokens: 50,
        prompt_tokens_details: { cached_tokens: 1024 },
      },
      expected: usage(1200, 50, { cached: 1024 }),
    },
    {
      name: 'vLLM without caching: details null, completion_tokens null',
      input: {
        prompt_tokens: 7,
        total_tokens: 7,
        completion_tokens: null,
        prompt_tokens_details: null,
      },
      expected: usage(7, 0),
    },
    {
      name: 'vLLM cached_tokens null',
      input: {
        prompt_tokens: 7,
        total_tokens: 9,
        completion_tokens: 2,
        prompt_tokens_details: { cached_tokens: null },
      },
      expected: usage(7, 2),
    },
    {
      name: 'llama.cpp prompt_tokens_details',
      input: {
        completion_tokens: 247,
        prompt_tokens: 1085,
        total_tokens: 1332,
        prompt_tokens_details: { cached_tokens: 1024 },
      },
      expected: usage(1085, 247, { cached: 1024 }),
    },
    {
      name: 'llama.cpp timings.cache_n when details are missing',
      input: { completion_tokens: 247, prompt_tokens: 1085, total_tokens: 1332 },
      timings: { cache_n: 1024, prompt_n: 61, predicted_n: 247 },
      expected: usage(1085, 247, { cached: 1024 }),
    },
    {
      name: 'llama.cpp timings alone',
      input: undefined,
      timings: { cache_n: 1024, prompt_n: 61, predicted_n: 247 },
      expected: usage(1085, 247, { cached: 1024 }),
    },
    {
      name: 'Ollama bare counts',
      input: { prompt_tokens: 26, completion_tokens: 9, total_tokens: 35 },
      expected: usage(26, 9),
    },
    {
      name: 'reasoning tokens reported by the worker',
      input: {
        prompt_tokens: 10,
        completion_tokens: 300,
        total_tokens: 310,
        completion_tokens_details: { reasoning_tokens: 256 },
      },
      expected: usage(10, 300, { reasoning: 256 }),
    },
    {
      name: 'OpenAI-style zeros: audio zeros are null for text, prediction counts null without a prediction',
      input: {
        prompt_tokens: 10,
        completion_tokens: 5,
        total_tokens: 15,
        prompt_tokens_details: { cached_tokens: 0, audio_tokens: 0 },
        completion_tokens_details: {
          reasoning_tokens: 0,
          audio_tokens: 0,
          accepted_prediction_tokens: 0,
          rejected_prediction_tokens: 0,
        },
      },
      expected: usage(10, 5, { reasoning: 0 }),
    },
    {
      name: 'prediction used and reported',
      input: {
        prompt_tokens: 10,
        completion_tokens: 20,
        total_tokens: 30,
        completion_tokens_details: {
          accepted_prediction_tokens: 12,
          rejected_prediction_tokens: 3,
        },
      },
      prediction: true,
      expected: usage(10, 20, { accepted: 12, rejected: 3 }),
    },
    {
      name: 'prediction used, worker silent',
      input: { prompt_tokens: 10, completion_tokens: 20, total_tokens: 30 },
      prediction: true,
      expected: usage(10, 20),
    },
    {
      name: 'a wrong total is recomputed; cached is clamped to the prompt; floats and negatives are sanitised',
      input: {
        prompt_tokens: 10.7,
        completion_tokens: -3,
        total_tokens: 99,
        prompt_tokens_details: { cached_tokens: 50 },
      },
      expected: usage(10, 0, { cached: 10 }),
    },
    {
      name: 'garbage',
      input: 'usage',
      expected: usage(0, 0),
    },
  ];
  for (const c of table) {
    it(c.name, () => {
      const out = normalizeUsage(c.input, { timings: c.timings, predictionUsed: c.prediction });
      assert.deepEqual(out, c.expected);
      assert.deepEqual(validateChunk(usageChunk(out, ctx)), []);
    });
  }

  it('extractUsage reads usage or final timings, and nothing else', () => {
    assert.deepEqual(
      extractUsage({ usage: { prompt_tokens: 1, completion_tokens: 2 } }),
      usage(1, 2),
    );
    assert.deepEqual(extractUsage({ timings: { prompt_n: 3, predicted_n: 4 } }), usage(3, 4));
    assert.equal(extractUsage({ timings: { prompt_n: 3 } }), null);
    assert.equal(extractUsage({ usage: null }), null);
    assert.equal(extractUsage({ choices: [] }), null);
    assert.equal(extractUsage(null), null);
  });

  it('estimatedUsage has the full shape', () => {
    assert.deepEqual(estimatedUsage(12, 3), usage(12, 3));
  });
});

// ---------------------------------------------------------------------------

/** A worker's JSON body as it arrives (raw: JSON escapes stay escaped). */
function json(text: TemplateStringsArray): unknown {
  return JSON.parse(String.raw(text));
}

interface CompletionCase {
  name: string;
  upstream: unknown;
  ctx?: Partial<ReframeContext>;
  expected: Omit<ChatCompletion, 'id' | 'object' | 'created' | 'model' | 'service_tier'>;
}

const completionCases: CompletionCase[] = [
  {
    name: 'vLLM reasoning model: reasoning stripped, empty tool_calls become null, extras dropped',
    upstream: json`{"id":"chatcmpl-9b1e","object":"chat.completion","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"message":{"role":"assistant","content":"\n\nParis.","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":"User asks for the capital of France."},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":15,"total_tokens":40,"completion_tokens":25,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}`,
    expected: {
      choices: [
        {
          index: 0,
          message: {
            role: 'assistant',
            content: '\n\nParis.',
            refusal: null,
            tool_calls: null,
            annotations: [],
          },
          finish_reason: 'stop',
          logprobs: null,
        },
      ],
      usage: usage(15, 25),
      system_fingerprint: null,
    },
  },
  {
    name: 'vLLM tool call: content null, finish_reason tool_calls',
    upstream: json`{"id":"chatcmpl-2","object":"chat.completion","created":1718000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"chatcmpl-tool-5d1e","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}],"usage":{"prompt_tokens":180,"total_tokens":201,"completion_tokens":21,"prompt_tokens_details":{"cached_tokens":128}}}`,
    expected: {
      choices: [
        {
          index: 0,
          message: {
            role: 'assistant',
            content: null,
            refusal: null,
            tool_calls: [
              {
                id: 'chatcmpl-tool-5d1e',
                type: 'function',
                function: { name: 'get_weather', arguments: '{"city": "Paris"}' },
              },
            ],
            annotations: [],
          },
          finish_reason: 'tool_calls',
          logprobs: null,
        },
      ],
      usage: usage(180, 21, { cached: 128 }),
      system_fingerprint: null,
    },
  },
  {
    name: 'llama.cpp with timings and logprobs over reasoning and answer',
    upstream: json`{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"Yes","reasoning_content":"Think"},"logprobs":{"content":[{"id":1,"token":"Think","bytes":[84,104,105,110,107],"logprob":-0.3,"top_logprobs":[]},{"id":2,"token":"Yes","bytes":[89,101,115],"logprob":-0.1,"top_logprobs":[{"id":2,"token":"Yes","bytes":[89,101,115],"logprob":-0.1}]}]}}],"created":1754524122,"model":"gpt-oss-20b","system_fingerprint":"b6097-9515c613","object":"chat.completion","usage":{"completion_tokens":2,"prompt_tokens":1085,"total_tokens":1087,"prompt_tokens_details":{"cached_tokens":1024}},"id":"chatcmpl-abc","timings":{"cache_n":1024,"prompt_n":61,"prompt_ms":203.378,"prompt_per_token_ms":3.334,"prompt_per_second":299.9,"predicted_n":6,"predicted_ms":33.6,"predicted_per_token_ms":5.6,"predicted_per_second":178.5}}`,
    expected: {
      choices: [
        {
          index: 0,
          message: {
            role: 'assistant',
            content: 'Yes',
            refusal: null,
            tool_calls: null,
            annotations: [],
          },
          finish_reason: 'stop',
          logprobs: {
            content: [
              {
                token: 'Yes',
                logprob: -0.1,
                bytes: [89, 101, 115],
                top_logprobs: [{ token: 'Yes', logprob: -0.1, bytes: [89, 101, 115] }],
              },
            ],
            refusal: null,
          },
        },
      ],
      usage: usage(1085, 2, { cached: 1024 }),
      system_fingerprint: 'b6097-9515c613',
    },
  },
  {
    name: 'llama.cpp tool call without an id and older usage (timings cache_n)',
    upstream: json`{"choices":[{"finish_reason":"tool_calls","index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"lookup","arguments":"{\"q\":\"x\"}"}}]}}],"created":1754524122,"model":"m","system_fingerprint":"b4500-abcdef","object":"chat.completion","usage":{"completion_tokens":9,"prompt_tokens":100,"total_tokens":109},"id":"chatcmpl-x","timings":{"cache_n":64,"prompt_n":36,"predicted_n":9}}`,
    expected: {
      choices: [
        {
          index: 0,
          message: {
            role: 'assistant',
            content: null,
            refusal: null,
            tool_calls: [
              {
                id: `call_${ctx.id}_0_0`,
                type: 'function',
                function: { name: 'lookup', arguments: '{"q":"x"}' },
              },
            ],
            annotations: [],
          },
          finish_reason: 'tool_calls',
          logprobs: null,
        },
      ],
      usage: usage(100, 9, { cached: 64 }),
      system_fingerprint: 'b4500-abcdef',
    },
  },
  {
    name: 'Ollama thinking model (`reasoning`)',
    upstream: json`{"id":"chatcmpl-123","object":"chat.completion","created":1743277352,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"message":{"role":"assistant","content":"Paris.","reasoning":"The user wants the capital."},"finish_reason":"stop"}],"usage":{"prompt_tokens":18,"completion_tokens":30,"total_tokens":48}}`,
    expected: {
      choices: [
        {
          index: 0,
          message: {
            role: 'assistant',
            content: 'Paris.',
            refusal: null,
            tool_calls: null,
            annotations: [],
          },
          finish_reason: 'stop',
          logprobs: null,
        },
      ],
      usage: usage(18, 30),
      system_fingerprint: 'fp_ollama',
    },
  },
  {
    name: 'Ollama tool call: empty content becomes null, `index` dropped',
    upstream: json`{"id":"chatcmpl-124","object":"chat.completion","created":1743277352,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"message":{"role":"assistant","content":"","tool_calls":[{"id":"call_x1","index":0,"type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":90,"completion_tokens":20,"total_tokens":110}}`,
    expected: {
      choices: [
        {
          index: 0,
          message: {
            role: 'assistant',
            content: null,
            refusal: null,
            tool_calls: [
              {
                id: 'call_x1',
                type: 'function',
                function: { name: 'get_weather', arguments: '{"city":"Paris"}' },
              },
            ],
            annotations: [],
          },
          finish_reason: 'tool_calls',
          logprobs: null,
        },
      ],
      usage: usage(90, 20),
      system_fingerprint: 'fp_ollama',
    },
  },
  {
    name: 'a refusal: content null',
    upstream: json`{"choices":[{"index":0,"message":{"role":"assistant","content":"","refusal":"I can't help with that."},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`,
    expected: {
      choices: [
        {
          index: 0,
          message: {
            role: 'assistant',
            content: null,
            refusal: "I can't help with that.",
            tool_calls: null,
            annotations: [],
          },
          finish_reason: 'stop',
          logprobs: null,
        },
      ],
      usage: usage(5, 7),
      system_fingerprint: null,
    },
  },
  {
    name: 'no usage from the worker: estimated; a reasoning model with no answer gets ""; finish_reason repaired',
    upstream: json`{"choices":[{"index":0,"message":{"role":"assistant","content":null,"reasoning_content":"long thoughts"},"finish_reason":"length"},{"index":1,"message":{"content":[{"type":"text","text":"abcdefgh"}]},"finish_reason":"tool_calls"},{"message":{"content":"x"}}]}`,
    ctx: { promptTokensEstimate: 40 },
    expected: {
      choices: [
        {
          index: 0,
          message: {
            role: 'assistant',
            content: '',
            refusal: null,
            tool_calls: null,
            annotations: [],
          },
          finish_reason: 'length',
          logprobs: null,
        },
        {
          index: 1,
          message: {
            role: 'assistant',
            content: 'abcdefgh',
            refusal: null,
            tool_calls: null,
            annotations: [],
          },
          finish_reason: 'stop',
          logprobs: null,
        },
        {
          index: 2,
          message: {
            role: 'assistant',
            content: 'x',
            refusal: null,
            tool_calls: null,
            annotations: [],
          },
          finish_reason: 'stop',
          logprobs: null,
        },
      ],
      usage: usage(40, 3),
      system_fingerprint: null,
    },
  },
];

describe('normalizeCompletion', () => {
  for (const c of completionCases) {
    it(c.name, () => {
      const out = normalizeCompletion(c.upstream, { ...ctx, ...c.ctx });
      assert.deepEqual(out, {
        id: ctx.id,
        object: 'chat.completion',
        created: ctx.created,
        model: ctx.model,
        service_tier: ctx.serviceTier,
        ...c.expected,
      });
      assert.deepEqual(validateCompletion(out), []);
      const json = JSON.stringify(out);
      assert.equal(/"reasoning(_content)?"|Think|thoughts|capital\./.exec(json), null, json);
    });
  }

  it('cuts top_logprobs to the request and passes prediction counts through', () => {
    const out = normalizeCompletion(
      {
        choices: [
          {
            message: { content: 'a' },
            finish_reason: 'stop',
            logprobs: {
              content: [
                {
                  token: 'a',
                  logprob: -1,
                  bytes: [97],
                  top_logprobs: [
                    { token: 'a', logprob: -1, bytes: [97] },
                    { token: 'b', logprob: -2, bytes: [98] },
                  ],
                },
              ],
            },
          },
        ],
        usage: {
          prompt_tokens: 3,
          completion_tokens: 1,
          completion_tokens_details: {
            accepted_prediction_tokens: 1,
            rejected_prediction_tokens: 0,
          },
        },
      },
      { ...ctx, topLogprobs: 1, predictionUsed: true },
    );
    assert.equal(out.choices[0]?.logprobs?.content?.[0]?.top_logprobs.length, 1);
    assert.deepEqual(out.usage, usage(3, 1, { accepted: 1, rejected: 0 }));
    assert.deepEqual(validateCompletion(out), []);
  });

  it('logprobs without top_logprobs keeps no alternatives (llama.cpp sends 20 by default)', () => {
    const entry = {
      id: 9642,
      token: 'a',
      bytes: [97],
      logprob: -1,
      top_logprobs: Array.from({ length: 20 }, (_, i) => ({ token: `t${i}`, logprob: -i - 1 })),
    };
    const lp = { content: [entry] };
    const plain = { ...ctx, logprobs: true };
    const out = normalizeCompletion(
      { choices: [{ message: { content: 'a' }, finish_reason: 'stop', logprobs: lp }] },
      plain,
    );
    assert.deepEqual(out.choices[0]?.logprobs?.content?.[0]?.top_logprobs, []);
    assert.deepEqual(validateCompletion(out), []);
    const chunk = reframeChunk(
      { choices: [{ index: 0, delta: { content: 'a' }, logprobs: lp, finish_reason: null }] },
      plain,
    );
    assert.deepEqual(chunk?.choices[0]?.logprobs?.content?.[0]?.top_logprobs, []);
    // An explicit value is still the cut.
    const five = reframeChunk(
      { choices: [{ index: 0, delta: { content: 'a' }, logprobs: lp, finish_reason: null }] },
      { ...plain, topLogprobs: 5 },
    );
    assert.equal(five?.choices[0]?.logprobs?.content?.[0]?.top_logprobs.length, 5);
  });

  it('throws upstream_error for a body that is not a completion', () => {
    for (const bad of [null, 'x', {}, { choices: 'no' }, { error: { message: 'boom' } }]) {
      assert.throws(
        () => normalizeCompletion(bad, ctx),
        (e: unknown) => e instanceof ServiceError && e.code === 'upstream_error',
      );
    }
  });

  it('the validator catches what normalisation prevents', () => {
    const good = normalizeCompletion(completionCases[0]!.upstream, ctx);
    const leaked = structuredClone(good) as unknown as {
      choices: Array<{ message: Record<string, unknown> }>;
    };
    leaked.choices[0]!.message.reasoning_content = 'x';
    assert.notDeepEqual(validateCompletion(leaked), []);
    const badTotal = structuredClone(good);
    badTotal.usage.total_tokens = 1;
    assert.notDeepEqual(validateCompletion(badTotal), []);
    const emptyCalls = structuredClone(good) as unknown as {
      choices: Array<{ message: { tool_calls: unknown } }>;
    };
    emptyCalls.choices[0]!.message.tool_calls = [];
    assert.notDeepEqual(validateCompletion(emptyCalls), []);
    assert.notDeepEqual(validateCompletion({ ...good, service_tier: 'default' }), []);
  });
});

describe('upstreamErrorMessage', () => {
  it('recognises error objects only', () => {
    assert.equal(
      upstreamErrorMessage({
        error: { message: 'context too long', type: 'invalid_request_error', code: 400 },
      }),
      'context too long',
    );
    assert.equal(upstreamErrorMessage({ error: 'model not loaded' }), 'model not loaded');
    assert.equal(typeof upstreamErrorMessage({ error: { code: 500 } }), 'string');
    assert.equal(upstreamErrorMessage({ choices: [] }), null);
    assert.equal(upstreamErrorMessage({ error: null }), null);
    assert.equal(upstreamErrorMessage('x'), null);
  });
});

describe('errorEventMessage', () => {
  it('reads a message from whatever an `event: error` carries', () => {
    assert.equal(errorEventMessage('{"error":{"message":"oom"}}'), 'oom');
    assert.equal(errorEventMessage('{"message":"engine dead","type":"X"}'), 'engine dead');
    assert.equal(errorEventMessage('upstream reset'), 'upstream reset');
    assert.equal(typeof errorEventMessage('{}'), 'string');
    assert.equal(typeof errorEventMessage(''), 'string');
  });
});

// ---------------------------------------------------------------------------

describe('StreamAccumulator', () => {
  it('records usage and timing for a client that disconnected mid-stream', () => {
    const acc = new StreamAccumulator({ ...ctx, promptTokensEstimate: 30 }, 5_000);
    acc.accept(
      vllm({ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }),
      5_050,
    );
    acc.accept(
      vllm({ index: 0, delta: { reasoning_content: 'thinking hard' }, finish_reason: null }),
      5_120,
    );
    acc.accept(vllm({ index: 0, delta: { content: 'Once upon' }, finish_reason: null }), 5_200);
    acc.accept(vllm({ index: 0, delta: { content: ' a time' }, finish_reason: null }), 5_230);
    // The client goes away here; the proxy stops reading and records.
    const s = acc.summary();
    assert.equal(s.finished, false);
    assert.deepEqual(s.finishReasons, [null]);
    assert.equal(s.ttftMs, 120);
    assert.equal(s.firstContentMs, 200);
    assert.equal(s.contentEmitted, true);
    assert.equal(s.usageReported, false);
    // 3 generating chunks, 29 characters (~8 tokens): the larger estimate wins.
    assert.deepEqual(s.usage, usage(30, 8));
    assert.deepEqual(validateChunk(acc.usageChunk()), []);
  });

  it('gives each streamed tool call its own index, however the worker numbered them', () => {
    const call = (index: number | undefined, id: string | undefined, args: string) => ({
      ...(index === undefined ? {} : { index }),
      ...(id === undefined ? {} : { id, type: 'function' }),
      function: id === undefined ? { arguments: args } : { name: 'f', arguments: args },
    });
    const indexes = (deltas: object[][]) => {
      const acc = new StreamAccumulator(ctx, 0);
      return deltas.map((tc) =>
        acc
          .accept(ollama({ index: 0, delta: { tool_calls: tc }, finish_reason: null }), 1)!
          .choices[0]!.delta.tool_calls!.map((d) => d.index),
      );
    };
    // Right numbering (vLLM, llama.cpp, SGLang), an id repeated on every fragment too.
    assert.deepEqual(
      indexes([
        [call(0, 'a', '{')],
        [call(0, undefined, '}')],
        [call(1, 'b', '{')],
        [call(1, 'b', '}')],
        [call(0, undefined, ' ')],
      ]),
      [[0], [0], [1], [1], [0]],
    );
    // Ollama: index 0 for every call.
    assert.deepEqual(indexes([[call(0, 'a', '{}')], [call(0, 'b', '{}')], [call(0, 'c', '{}')]]), [
      [0],
      [1],
      [2],
    ]);
    // Ollama before 0.4.7: no index, one chunk per call or all in one.
    assert.deepEqual(indexes([[call(undefined, 'a', '{}')], [call(undefined, 'b', '{}')]]), [
      [0],
      [1],
    ]);
    assert.deepEqual(indexes([[call(undefined, 'a', '{}'), call(undefined, 'b', '{}')]]), [[0, 1]]);
  });

  it('reports no first token and no content for a stream that produced nothing', () => {
    const acc = new StreamAccumulator(ctx, 0);
    acc.accept(
      ollama({ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }),
      10,
    );
    const s = acc.summary();
    assert.equal(s.ttftMs, null);
    assert.equal(s.firstContentMs, null);
    assert.equal(s.contentEmitted, false);
    assert.deepEqual(s.usage, usage(0, 0));
  });

  it('a reasoning-only stream has a first token but no content', () => {
    const acc = new StreamAccumulator(ctx, 0);
    assert.equal(acc.firstTokenSeen, false);
    acc.accept(
      ollama({ index: 0, delta: { role: 'assistant', content: '', reasoning: 'hmm' } }),
      7,
    );
    assert.equal(acc.firstTokenSeen, true);
    const s = acc.summary();
    assert.equal(s.ttftMs, 7);
    assert.equal(s.contentEmitted, false);
    assert.equal(s.usage.completion_tokens, 1);
  });

  it('keeps the last fingerprint on chunks that omit it', () => {
    const acc = new StreamAccumulator(ctx, 0);
    acc.accept(ollama({ index: 0, delta: { content: 'a' } }), 1);
    const out = acc.accept({ choices: [{ index: 0, delta: { content: 'b' } }] }, 2);
    assert.equal(out?.system_fingerprint, 'fp_ollama');
  });

  it('ignores non-objects and error payloads', () => {
    const acc = new StreamAccumulator(ctx, 0);
    assert.equal(acc.accept('junk', 1), null);
    assert.equal(acc.accept({ error: { message: 'x' } }, 2), null);
    assert.equal(acc.summary().chunksForwarded, 0);
  });
});

// ---------------------------------------------------------------------------
// Properties

const SECRET = '\u00a7'; // never produced by the visible-text alphabet below
const visibleText = fc.string({
  unit: fc.constantFrom('a', 'b', ' ', 'é', '世', '🦙', '\n', '"'),
  maxLength: 12,
});
const secretText = visibleText.map((s) => SECRET + s + SECRET);
const reasoningKey = fc.constantFrom('reasoning_content', 'reasoning', 'thinking');
const finish = fc.constantFrom(null, null, null, 'stop', 'length', 'tool_calls', 'eos', 'abort');

/** One upstream delta choice mixing visible text, reasoning text and logprobs. */
const upstreamChoice = fc
  .record({
    role: fc.option(fc.constantFrom('assistant', 'model'), { nil: undefined }),
    content: fc.option(fc.oneof(visibleText, fc.constant(null)), { nil: undefined }),
    reasoningKey,
    reasoning: fc.option(secretText, { nil: undefined }),
    refusal: fc.option(visibleText, { nil: undefined }),
    toolArgs: fc.option(visibleText, { nil: undefined }),
    finish,
    withLogprobs: fc.boolean(),
  })
  .map((r) => {
    const delta: Record<string, unknown> = {};
    if (r.role !== undefined) delta.role = r.role;
    if (r.content !== undefined) delta.content = r.content;
    if (r.reasoning !== undefined) delta[r.reasoningKey] = r.reasoning;
    if (r.refusal !== undefined) delta.refusal = r.refusal;
    if (r.toolArgs !== undefined)
      delta.tool_calls = [{ index: 0, function: { arguments: r.toolArgs } }];
    // A worker that reports logprobs for every generated token, reasoning included.
    const tokens = [r.reasoning, typeof r.content === 'string' ? r.content : undefined].filter(
      (t): t is string => t !== undefined && t !== '',
    );
    const logprobs =
      r.withLogprobs && tokens.length > 0
        ? {
            content: tokens.map((token) => ({
              token,
              logprob: -0.5,
              bytes: null,
              top_logprobs: [{ token, logprob: -0.5, bytes: null }],
            })),
          }
        : null;
    return { index: 0, delta, logprobs, finish_reason: r.finish, stop_reason: null };
  });

const upstreamChunk = fc
  .record({
    choice: upstreamChoice,
    fingerprint: fc.option(fc.constantFrom('fp_ollama', 'b6097-9515c613'), { nil: undefined }),
    usage: fc.option(fc.record({ prompt_tokens: fc.nat(5000), completion_tokens: fc.nat(5000) }), {
      nil: undefined,
    }),
  })
  .map((r) => ({
    id: 'chatcmpl-up',
    object: 'chat.completion.chunk',
    created: 1,
    model: 'upstream-model',
    choices: [r.choice],
    ...(r.fingerprint === undefined ? {} : { system_fingerprint: r.fingerprint }),
    ...(r.usage === undefined ? {} : { usage: r.usage }),
  }));

describe('reframe properties', () => {
  it('reasoning text never reaches the client, streaming', () => {
    fc.assert(
      fc.property(fc.array(upstreamChunk, { maxLength: 12 }), (payloads) => {
        const acc = new StreamAccumulator(ctx, 0);
        let wire = '';
        payloads.forEach((p, i) => {
          const out = acc.accept(p, i);
          if (out !== null) wire += JSON.stringify(out);
        });
        wire += JSON.stringify(acc.usageChunk());
        assert.ok(!wire.includes(SECRET), wire);
      }),
      { numRuns: 300 },
    );
  });

  it('reasoning text never reaches the client, non-streaming', () => {
    const message = fc.record({
      content: fc.option(visibleText, { nil: null }),
      reasoningKey,
      reasoning: secretText,
      withLogprobs: fc.boolean(),
    });
    fc.assert(
      fc.property(message, (m) => {
        const tokens = [m.reasoning, ...(m.content ? [m.content] : [])];
        const out = normalizeCompletion(
          {
            choices: [
              {
                index: 0,
                message: { role: 'assistant', content: m.content, [m.reasoningKey]: m.reasoning },
                finish_reason: 'stop',
                logprobs: m.withLogprobs
                  ? {
                      content: tokens.map((token) => ({
                        token,
                        logprob: -1,
                        bytes: null,
                        top_logprobs: [],
                      })),
                    }
                  : null,
              },
            ],
          },
          ctx,
        );
        assert.ok(!JSON.stringify(out).includes(SECRET), JSON.stringify(out));
        assert.deepEqual(validateCompletion(out), []);
      }),
      { numRuns: 200 },
    );
  });

  it('every forwarded chunk matches the schema; visible text up to the finish survives in order', () => {
    fc.assert(
      fc.property(fc.array(upstreamChunk, { maxLength: 10 }), (payloads) => {
        const acc = new StreamAccumulator(ctx, 0);
        let seen = '';
        let expected = '';
        let finished = false;
        for (const p of payloads) {
          const c = p.choices[0]!.delta.content;
          if (typeof c === 'string' && !finished) expected += c;
          if (normalizeFinishReason(p.choices[0]!.finish_reason) !== null) finished = true;
          const out = acc.accept(p, 0);
          if (out === null) continue;
          assert.deepEqual(validateChunk(out), [], JSON.stringify(out));
          seen += out.choices[0]?.delta.content ?? '';
        }
        assert.equal(seen, expected);
        assert.deepEqual(validateChunk(acc.usageChunk()), []);
      }),
      { numRuns: 300 },
    );
  });

  it('a stream of n choices ends with one finish_reason for each of them, nothing after it, no other index', () => {
    // The worker's chunks at random indexes 0 to 2, with duplicate finish reasons and
    // text after them; the request asked for `n` choices.
    const stray = fc
      .tuple(upstreamChunk, fc.nat(2))
      .map(([c, index]) => ({ ...c, choices: [{ ...c.choices[0]!, index }] }));
    fc.assert(
      fc.property(fc.array(stray, { maxLength: 12 }), fc.integer({ min: 1, max: 2 }), (ps, n) => {
        const acc = new StreamAccumulator({ ...ctx, choices: n }, 0);
        const out = ps.map((p) => acc.accept(p, 0));
        out.push(acc.closingChunk());
        const finishes = new Map<number, number>();
        const tools = new Set<number>();
        for (const c of out) {
          if (c === null) continue;
          assert.deepEqual(validateChunk(c), [], JSON.stringify(c));
          for (const choice of c.choices) {
            assert.ok(choice.index < n, `index ${choice.index} with n = ${n}`);
            assert.equal(finishes.get(choice.index) ?? 0, 0, 'a delta after the finish_reason');
            if (choice.delta.tool_calls) tools.add(choice.index);
            if (choice.finish_reason !== null) finishes.set(choice.index, 1);
            if (choice.finish_reason === 'tool_calls') {
              assert.ok(tools.has(choice.index), 'tool_calls without a tool call streamed');
            }
          }
        }
        assert.deepEqual(
          [...finishes.keys()].sort(),
          Array.from({ length: n }, (_, i) => i),
        );
        assert.equal(acc.finished, true);
      }),
      { numRuns: 300 },
    );
  });

  it('usage always has the full shape and a consistent total, whatever the worker sent', () => {
    const anyValue = fc.oneof(
      fc.integer({ min: -10, max: 10_000 }),
      fc.double(),
      fc.constant(null),
      fc.string(),
      fc.constant(undefined),
    );
    const raw = fc.record({
      prompt_tokens: anyValue,
      completion_tokens: anyValue,
      total_tokens: anyValue,
      prompt_tokens_details: fc.oneof(
        fc.constant(null),
        fc.record({ cached_tokens: anyValue, audio_tokens: anyValue }),
      ),
      completion_tokens_details: fc.oneof(
        fc.constant(undefined),
        fc.record({
          reasoning_tokens: anyValue,
          accepted_prediction_tokens: anyValue,
          rejected_prediction_tokens: anyValue,
        }),
      ),
    });
    const timings = fc.option(
      fc.record({ cache_n: anyValue, prompt_n: anyValue, predicted_n: anyValue }),
      { nil: undefined },
    );
    fc.assert(
      fc.property(raw, timings, fc.boolean(), (u, t, predictionUsed) => {
        const out = normalizeUsage(u, { timings: t, predictionUsed });
        assert.deepEqual(validateChunk(usageChunk(out, ctx)), []);
        assert.equal(out.total_tokens, out.prompt_tokens + out.completion_tokens);
        if (!predictionUsed) {
          assert.equal(out.completion_tokens_details.accepted_prediction_tokens, null);
          assert.equal(out.completion_tokens_details.rejected_prediction_tokens, null);
        }
      }),
      { numRuns: 300 },
    );
  });

  it('stream parsing + reframing does not depend on how the bytes were split', () => {
    fc.assert(
      fc.property(
        fc.array(upstreamChunk, { maxLength: 8 }),
        fc.integer({ min: 1, max: 40 }),
        (payloads, size) => {
          const body = sseBody(payloads);
          assert.equal(runStream(body, ctx, size).wire, runStream(body, ctx, body.length + 1).wire);
        },
      ),
      { numRuns: 100 },
    );
  });
});

describe('isDone', () => {
  it('matches only the terminator', () => {
    assert.equal(isDone({ data: '[DONE]' }), true);
    assert.equal(isDone({ data: '"[DONE]"' }), false);
  });
});
