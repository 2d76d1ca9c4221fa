import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import {
  CLAMP_HEADER,
  MESSAGE_OVERHEAD_TOKENS,
  NON_TEXT_PART_TOKENS,
  REPLY_PRIMING_TOKENS,
  TOOLS_PREAMBLE_TOKENS,
  TOOL_OVERHEAD_TOKENS,
  clampHeader,
  clampMaxTokens,
  estimatePromptTokens,
  parseTokenCountError,
  readTokenCountError,
  weightedLength,
  type PromptMessage,
} from './clamp.js';

const FRAME = REPLY_PRIMING_TOKENS + MESSAGE_OVERHEAD_TOKENS;

describe('estimatePromptTokens', () => {
  const CASES: ReadonlyArray<readonly [string, PromptMessage[], number]> = [
    ['no messages', [], REPLY_PRIMING_TOKENS],
    ['empty message', [{ content: '' }], FRAME],
    ['35 ASCII chars = 10 tokens', [{ content: 'a'.repeat(35) }], FRAME + 10],
    ['36 ASCII chars round up to 11', [{ content: 'a'.repeat(36) }], FRAME + 11],
    ['CJK counts about one token a character', [{ content: '你好世界' }], FRAME + 4],
    ['Cyrillic counts 2 chars each', [{ content: 'привет' }], FRAME + Math.ceil(12 / 3.5)],
    [
      'text parts add up, images are flat',
      [
        {
          content: [
            { type: 'text', text: 'a'.repeat(7) },
            { type: 'image_url' },
            { type: 'text', text: 'b'.repeat(7) },
          ],
        },
      ],
      FRAME + NON_TEXT_PART_TOKENS + 4,
    ],
    ['null content (tool-calling assistant)', [{ content: null }], FRAME],
    [
      'tool calls count name and arguments',
      [{ content: null, tool_calls: [{ function: { name: 'abc', arguments: 'd'.repeat(4) } }] }],
      FRAME + TOOL_OVERHEAD_TOKENS + 2,
    ],
    [
      'name and tool_call_id count',
      [{ content: 'ab', name: 'cd', tool_call_id: 'efg' }],
      FRAME + 2,
    ],
    ['two messages', [{ content: 'a' }, { content: 'b' }], FRAME + MESSAGE_OVERHEAD_TOKENS + 1],
  ];
  for (const [name, messages, expected] of CASES) {
    it(name, () => assert.equal(estimatePromptTokens(messages), expected));
  }

  it('adds the tool preamble and the serialised definitions', () => {
    const tools = [{ type: 'function', function: { name: 'f' } }];
    const json = JSON.stringify(tools).length;
    assert.equal(
      estimatePromptTokens([], tools),
      REPLY_PRIMING_TOKENS + TOOLS_PREAMBLE_TOKENS + TOOL_OVERHEAD_TOKENS + Math.ceil(json / 3.5),
    );
    assert.equal(estimatePromptTokens([], []), REPLY_PRIMING_TOKENS);
    assert.equal(estimatePromptTokens([], null), REPLY_PRIMING_TOKENS);
  });

  it('does not charge base64 images by their length', () => {
    const url = `data:image/png;base64,${'A'.repeat(100_000)}`;
    const parts = [{ type: 'image_url', image_url: { url } }];
    assert.equal(estimatePromptTokens([{ content: parts }]), FRAME + NON_TEXT_PART_TOKENS);
  });

  it('is never below ceil(chars / 4) and grows with the text (property)', () => {
    fc.assert(
      fc.property(fc.array(fc.string(), { maxLength: 6 }), fc.string(), (texts, more) => {
        const messages = texts.map((content) => ({ content }));
        const est = estimatePromptTokens(messages);
        const chars = texts.reduce((n, t) => n + t.length, 0);
        assert.ok(est >= Math.ceil(chars / 4));
        assert.ok(Number.isInteger(est));
        const longer = estimatePromptTokens([...messages, { content: more }]);
        assert.ok(longer >= est + MESSAGE_OVERHEAD_TOKENS);
      }),
    );
  });

  it('weights scripts by density', () => {
    assert.equal(weightedLength('abc'), 3);
    assert.equal(weightedLength('é'), 2);
    assert.equal(weightedLength('日'), 3.5);
    assert.equal(weightedLength('😀'), 7); // two surrogate code units
  });
});

describe('clampMaxTokens', () => {
  // [name, requested, promptTokens, contextWindow, value, clamped]
  const CASES: ReadonlyArray<
    readonly [string, number | undefined, number, number, number, boolean]
  > = [
    ['omitted means the rest of the window', undefined, 1000, 4096, 3096, false],
    ['fits: unchanged', 500, 1000, 4096, 500, false],
    ['exactly fits: unchanged', 3096, 1000, 4096, 3096, false],
    ['one over: clamped', 3097, 1000, 4096, 3096, true],
    ['far over: clamped', 100_000, 1000, 4096, 3096, true],
    ['prompt fills the window: minimum 1', 50, 4096, 4096, 1, true],
    ['prompt over the window: minimum 1', 50, 9000, 4096, 1, true],
    ['omitted with a full window: 1, not a clamp', undefined, 5000, 4096, 1, false],
    ['requested 1 with a full window: unchanged', 1, 5000, 4096, 1, false],
  ];
  for (const [name, requested, promptTokens, contextWindow, value, clamped] of CASES) {
    it(name, () => {
      const r = clampMaxTokens({ requested, promptTokens, contextWindow });
      assert.deepEqual(r, { value, clamped, original: requested });
    });
  }

  it('never exceeds what fits, never drops below 1, flags only reductions (property)', () => {
    fc.assert(
      fc.property(
        fc.option(fc.integer({ min: 1, max: 10_000_000 }), { nil: undefined }),
        fc.nat({ max: 2_000_000 }),
        fc.integer({ min: 1, max: 2_000_000 }),
        (requested, promptTokens, contextWindow) => {
          const r = clampMaxTokens({ requested, promptTokens, contextWindow });
          const fits = Math.max(1, contextWindow - promptTokens);
          assert.ok(r.value >= 1);
          assert.ok(r.value <= fits || r.value === requested);
          assert.equal(r.clamped, requested !== undefined && requested > fits);
          assert.equal(r.original, requested);
          if (!r.clamped && requested !== undefined) assert.equal(r.value, requested);
        },
      ),
    );
  });
});

describe('clampHeader', () => {
  it('formats <original> -> <clamped>', () => {
    assert.equal(clampHeader(5000, 3096), '5000 -> 3096');
    assert.equal(CLAMP_HEADER, 'X-Service-Max-Tokens-Clamped');
  });

  it('writes values past 2^53 in digits, not exponent form', () => {
    assert.equal(clampHeader(1e20, 4000), '100000000000000000000 -> 4000');
    assert.equal(clampHeader(1e21, 4000), '1000000000000000000000 -> 4000');
  });
});

// Wordings taken from the engines' sources:
// - vLLM ≤ 0.10, vllm/entrypoints/openai/serving_engine.py (_validate_input)
// - vLLM ≥ 0.11, same function and the score/serving preprocessors (VLLMValidationError)
// - vLLM renderers/params.py (_token_len_check) and the later "prompt contains" wording
// - llama.cpp tools/server/server-context.cpp (ERROR_TYPE_EXCEED_CONTEXT_SIZE), and
//   server-task.cpp, which adds n_prompt_tokens / n_ctx to the error object.
const VLLM_LEGACY =
  "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens " +
  '(1000 in the messages, 4000 in the completion). Please reduce the length of the messages or completion.';
const VLLM_TOO_LARGE =
  "'max_tokens' or 'max_completion_tokens' is too large: 4000. This model's maximum context length " +
  'is 4096 tokens and your request has 1000 input tokens (4000 > 4096 - 1000).';
const VLLM_RENDERER_EXACT =
  "This model's maximum context length is 8192 tokens. However, you requested 4096 output tokens " +
  'and your prompt contains 5000 input tokens, for a total of 9096 tokens. Please reduce the length ' +
  'of the input prompt or the number of requested output tokens.';
const VLLM_RENDERER_AT_LEAST =
  "This model's maximum context length is 8192 tokens. However, you requested 4096 output tokens " +
  'and your prompt contains at least 4097 input tokens, for a total of at least 8193 tokens. Please ' +
  'reduce the length of the input prompt or the number of requested output tokens.';
const VLLM_PASSED_TRUNCATED =
  "You passed 4097 input tokens and requested 4096 output tokens. However, the model's context " +
  'length is only 8192 tokens, resulting in a maximum input length of 4096 tokens. Please reduce ' +
  'the length of the input prompt.';
const VLLM_PASSED_EXACT =
  "You passed 5000 input tokens and requested 4096 output tokens. However, the model's context " +
  'length is only 8192 tokens, resulting in a maximum input length of 4096 tokens. Please reduce ' +
  'the length of the input prompt.';
const VLLM_PROMPT_ONLY =
  "This model's maximum context length is 4096 tokens. However, your request has 5000 input " +
  'tokens. Please reduce the length of the input messages.';
const VLLM_PROMPT_ONLY_LEGACY =
  "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens in the " +
  'messages, Please reduce the length of the messages.';

const vllmBody = (message: string) =>
  JSON.stringify({ error: { message, type: 'BadRequestError', param: 'max_tokens', code: 400 } });
const vllmLegacyBody = (message: string) =>
  JSON.stringify({ object: 'error', message, type: 'BadRequestError', param: null, code: 400 });
const llamaBody = (message: string, extra: Record<string, number> = {}) =>
  JSON.stringify({ error: { code: 400, message, type: 'exceed_context_size_error', ...extra } });

describe('parseTokenCountError', () => {
  // [name, status, body, corrected max_tokens]
  const CASES: ReadonlyArray<readonly [string, number, string, number | null]> = [
    ['vLLM ≤0.10, current envelope', 400, vllmBody(VLLM_LEGACY), 3096],
    ['vLLM ≤0.10, top-level ErrorResponse', 400, vllmLegacyBody(VLLM_LEGACY), 3096],
    ['vLLM ≥0.11 max_tokens too large', 400, vllmBody(VLLM_TOO_LARGE), 3096],
    [
      'vLLM ≥0.11 with parameter suffix',
      400,
      vllmBody(`${VLLM_TOO_LARGE} (parameter=max_tokens, value=4000)`),
      3096,
    ],
    ['vLLM renderer, exact count', 400, vllmBody(VLLM_RENDERER_EXACT), 3192],
    ['vLLM renderer, lower bound only', 400, vllmBody(VLLM_RENDERER_AT_LEAST), null],
    ['vLLM params, truncated count', 400, vllmBody(VLLM_PASSED_TRUNCATED), null],
    ['vLLM params, exact count', 400, vllmBody(VLLM_PASSED_EXACT), 3192],
    ['vLLM prompt alone too long', 400, vllmBody(VLLM_PROMPT_ONLY), null],
    ['vLLM ≤0.10 prompt alone too long', 400, vllmBody(VLLM_PROMPT_ONLY_LEGACY), null],
    ['vLLM message as plain text', 400, VLLM_LEGACY, 3096],
    [
      'llama.cpp current: prompt fills the context',
      400,
      llamaBody(
        'request (9412 tokens) exceeds the available context size (8192 tokens), try increasing it',
        { n_prompt_tokens: 9412, n_ctx: 8192 },
      ),
      null,
    ],
    [
      'llama.cpp older wording with counts that leave room',
      400,
      llamaBody('the request exceeds the available context size, try increasing it', {
        n_prompt_tokens: 1000,
        n_ctx: 4096,
      }),
      3096,
    ],
    [
      'llama.cpp older wording without counts',
      400,
      JSON.stringify({
        error: {
          code: 400,
          message: 'the request exceeds the available context size, try increasing it',
          type: 'invalid_request_error',
        },
      }),
      null,
    ],
    [
      'llama.cpp oldest wording',
      400,
      llamaBody('input (5000 tokens) is larger than the max context size (4096 tokens). skipping'),
      null,
    ],
    [
      'llama.cpp type and counts with an unfamiliar message',
      400,
      llamaBody('context full', { n_prompt_tokens: 100, n_ctx: 4096 }),
      3996,
    ],
    ['not a context error', 400, vllmBody('temperature must be in [0, 2]'), null],
    ['right words, wrong status', 500, vllmBody(VLLM_TOO_LARGE), null],
    ['empty body', 400, '', null],
    ['JSON that is not an object', 400, '[1,2]', null],
    [
      'a "correction" not below the refused value',
      400,
      vllmBody(
        "'max_tokens' or 'max_completion_tokens' is too large: 10. This model's maximum context length is 4096 tokens and your request has 1000 input tokens (10 > 4096 - 1000).",
      ),
      null,
    ],
    [
      'absurd counts',
      400,
      vllmBody(
        `'max_tokens' or 'max_completion_tokens' is too large: 4000. This model's maximum context length is ${'9'.repeat(400)} tokens and your request has 1000 input tokens`,
      ),
      null,
    ],
  ];
  for (const [name, status, body, expected] of CASES) {
    it(name, () => assert.equal(parseTokenCountError(status, body), expected));
  }

  it('reports what the engine said', () => {
    assert.deepEqual(readTokenCountError(400, vllmBody(VLLM_RENDERER_AT_LEAST)), {
      engine: 'vllm',
      contextWindow: 8192,
      requested: 4096,
      promptTokens: 4097,
      promptTokensExact: false,
    });
    assert.deepEqual(
      readTokenCountError(
        400,
        llamaBody(
          'request (9412 tokens) exceeds the available context size (8192 tokens), try increasing it',
          { n_prompt_tokens: 9412, n_ctx: 8192 },
        ),
      ),
      {
        engine: 'llama.cpp',
        promptTokens: 9412,
        contextWindow: 8192,
        requested: undefined,
        promptTokensExact: true,
      },
    );
    assert.equal(readTokenCountError(400, vllmBody('unrelated')), null);
  });

  it('never throws and returns null or a positive integer (property)', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 100, max: 599 }),
        fc.oneof(
          fc.string(),
          fc.json(),
          fc
            .tuple(fc.nat(), fc.nat(), fc.nat())
            .map(([a, b, c]) =>
              vllmBody(
                `'max_tokens' or 'max_completion_tokens' is too large: ${a}. This model's maximum context length is ${b} tokens and your request has ${c} input tokens (${a} > ${b} - ${c}).`,
              ),
            ),
        ),
        (status, body) => {
          const r = parseTokenCountError(status, body);
          assert.ok(r === null || (Number.isSafeInteger(r) && r >= 1));
        },
      ),
    );
  });
});
