/**
 * `conforms` (request-fast.ts) against the zod schema it stands in for: whenever it
 * says yes, the schema accepts the body and returns the same value for every field
 * it declares. Bodies come from generators (valid requests of every shape the fast
 * path covers; those with one field, or one nested field, bent just outside its rule;
 * those with one slot replaced, removed or given an unknown key beside it) and, for
 * every slot of one rich valid body, from each of those changes in turn.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { conforms } from './request-fast.js';
import { parseChatRequest, requestSchema } from './request.js';

type Json = unknown;

const text = fc.string({ maxLength: 8 });
const nullable = <T>(a: fc.Arbitrary<T>) => fc.option(a, { nil: null });
const objectOf = fc.dictionary(
  text.filter((k) => k !== '__proto__'),
  fc.jsonValue({ maxDepth: 2 }),
  { maxKeys: 3, noNullPrototype: true },
);

const textPart = fc.record({ type: fc.constant('text'), text });
const imagePart = fc.record({
  type: fc.constant('image_url'),
  image_url: fc.record({ url: text, detail: text }, { requiredKeys: ['url'] }),
});
const refusalPart = fc.record({ type: fc.constant('refusal'), refusal: text });
const content = fc.oneof(
  text,
  fc.array(fc.oneof(textPart, imagePart, refusalPart), { minLength: 1, maxLength: 3 }),
  fc.constant(null),
);
const toolCall = fc.record({
  id: text,
  type: fc.constant('function'),
  function: fc.record({ name: text, arguments: text }),
});
const message = fc.record(
  {
    role: fc.constantFrom('system', 'user', 'assistant', 'tool', 'developer'),
    content,
    name: nullable(text),
    tool_call_id: nullable(text),
    tool_calls: nullable(fc.array(toolCall, { maxLength: 2 })),
  },
  { requiredKeys: ['role'] },
);
const toolFunction = fc.record(
  {
    // Any name without whitespace (no engine can call a function named with a space).
    name: fc.string({ minLength: 1, maxLength: 8 }).filter((n) => !/\s/.test(n)),
    description: text,
    parameters: objectOf,
    strict: nullable(fc.boolean()),
  },
  { requiredKeys: ['name'] },
);
const tool = fc.record({ type: fc.constant('function'), function: toolFunction });
const toolChoice = fc.oneof(
  fc.constantFrom('auto', 'none', 'required'),
  fc.record({ type: fc.constant('function'), function: fc.record({ name: text }) }),
);
const jsonSchema = fc.record(
  { name: text, description: text, schema: objectOf, strict: nullable(fc.boolean()) },
  { requiredKeys: ['name'] },
);
const jsonSchemaFormat = fc.record({ type: fc.constant('json_schema'), json_schema: jsonSchema });
const responseFormat = fc.oneof(
  fc.record({ type: fc.constantFrom('text', 'json_object') }),
  jsonSchemaFormat,
);
const unit = (min: number, max: number) => fc.double({ min, max, noNaN: true });

/** Every field optional but model and messages; an optional one may also be null. */
const validBody = fc.record(
  {
    model: fc.string({ minLength: 1, maxLength: 8 }),
    messages: fc.array(message, { minLength: 1, maxLength: 3 }),
    max_tokens: nullable(fc.oneof(fc.integer({ min: 1 }), fc.constant(1e20))),
    max_completion_tokens: nullable(fc.integer({ min: 1 })),
    temperature: nullable(unit(0, 2)),
    top_p: nullable(unit(0, 1)),
    stream: nullable(fc.boolean()),
    stream_options: nullable(
      fc.record({ include_usage: nullable(fc.boolean()) }, { requiredKeys: [] }),
    ),
    stop: nullable(fc.oneof(text, fc.array(text, { maxLength: 4 }))),
    frequency_penalty: nullable(unit(-2, 2)),
    presence_penalty: nullable(unit(-2, 2)),
    n: nullable(fc.integer({ min: 1, max: 128 })),
    seed: nullable(
      fc.oneof(
        fc.integer(),
        fc.constantFrom(Number.MAX_SAFE_INTEGER, 2 ** 62, 100000000000000000, -(2 ** 63)),
      ),
    ),
    logprobs: nullable(fc.boolean()),
    top_logprobs: nullable(fc.integer({ min: 0, max: 20 })),
    logit_bias: nullable(
      fc.dictionary(fc.stringMatching(/^\d{1,5}$/), unit(-100, 100), {
        maxKeys: 3,
        noNullPrototype: true,
      }),
    ),
    tools: nullable(fc.array(tool, { maxLength: 2 })),
    tool_choice: nullable(toolChoice),
    parallel_tool_calls: nullable(fc.boolean()),
    response_format: nullable(responseFormat),
    metadata: nullable(
      fc.dictionary(
        fc.string({ maxLength: 64 }).filter((k) => k !== '__proto__'),
        fc.string({ maxLength: 512 }),
        { maxKeys: 16, noNullPrototype: true },
      ),
    ),
    user: nullable(text),
    store: nullable(fc.boolean()),
    reasoning_effort: nullable(fc.constantFrom('low', 'medium', 'high')),
    service_tier: nullable(fc.constantFrom('flex', 'priority', 'auto', 'default')),
    prediction: nullable(
      fc.record({
        type: fc.constant('content'),
        content: fc.oneof(text, fc.array(textPart, { maxLength: 2 })),
      }),
    ),
    modalities: nullable(fc.array(text, { maxLength: 2 })),
    x_exec: nullable(fc.boolean()),
    an_unknown_field: fc.jsonValue({ maxDepth: 1 }),
  },
  { requiredKeys: ['model', 'messages'] },
);

type Rec = Record<string, Json>;

/**
 * A record from `valid` with exactly one thing wrong: one field replaced by a value
 * from `odd`, or a key the schema does not declare added.
 */
function bent(valid: fc.Arbitrary<unknown>, odd: Record<string, fc.Arbitrary<Json>>) {
  const keys = [...Object.keys(odd), 'zz_unknown'];
  return fc
    .tuple(valid as fc.Arbitrary<Rec>, fc.constantFrom(...keys))
    .chain(([o, k]) =>
      k === 'zz_unknown'
        ? fc.constant<Json>({ ...o, zz_unknown: 1 })
        : odd[k]!.map((v): Json => ({ ...o, [k]: v })),
    );
}
/** An array of `good` items with one `bad` one among them. */
function oneBad(good: fc.Arbitrary<unknown>, bad: fc.Arbitrary<Json>) {
  return fc
    .tuple(fc.array(good as fc.Arbitrary<Json>, { maxLength: 2 }), bad, fc.nat())
    .map(([items, b, i]) => {
      const out = [...items];
      out.splice(i % (out.length + 1), 0, b);
      return out;
    });
}
const oddText = fc.constantFrom<Json>(null, 5, ['x'], {});
const oddObject = fc.constantFrom<Json>(null, [], 'x', 1);
const oddBool = fc.constantFrom<Json>('true', 1, {});
const badPart = fc.oneof(
  bent(textPart, { type: fc.constantFrom('refusal', 'txt', 1), text: oddText }),
  bent(imagePart, {
    image_url: fc.oneof(
      bent(fc.record({ url: text, detail: text }), { url: oddText, detail: oddText }),
      oddObject,
    ),
  }),
  bent(refusalPart, { type: fc.constant('text'), refusal: oddText }),
  fc.constant({ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } }),
  fc.constant({ type: 'file', file: { file_id: 'f' } }),
);
const badToolCall = bent(toolCall, {
  id: oddText,
  type: fc.constantFrom('tool', null),
  function: fc.oneof(
    bent(fc.record({ name: text, arguments: text }), { name: oddText, arguments: oddText }),
    oddObject,
  ),
});
const badMessage = bent(message, {
  role: fc.constantFrom('function', '', null, 1),
  content: fc.oneof(fc.constantFrom<Json>(5, [], {}), oneBad(textPart, badPart)),
  name: fc.constantFrom(5, ['x'], {}),
  tool_call_id: fc.constantFrom(5, ['x']),
  tool_calls: fc.oneof(fc.constantFrom<Json>({}, 'x'), oneBad(toolCall, badToolCall)),
});
const badTool = bent(tool, {
  type: fc.constantFrom('tool', null),
  function: fc.oneof(
    bent(toolFunction, {
      name: fc.constantFrom<Json>('', null, 3),
      description: oddText,
      parameters: oddObject,
      strict: oddBool,
    }),
    oddObject,
  ),
});
const badFormat = fc.oneof(
  fc.record({ type: fc.constantFrom<Json>('json', '', null) }),
  bent(fc.record({ type: fc.constantFrom('text', 'json_object') }), {}),
  bent(jsonSchemaFormat, {
    json_schema: fc.oneof(
      bent(jsonSchema, {
        name: fc.constantFrom<Json>(null, 5),
        description: oddText,
        schema: oddObject,
        strict: oddBool,
      }),
      oddObject,
    ),
  }),
);
const sixteen = Object.fromEntries(Array.from({ length: 16 }, (_, i) => [`k${i}`, 'v']));

/**
 * For each field, values just outside its rules (and, for the nested ones, objects
 * bent at one of their own fields now and then); a body gets one of them, in one field.
 */
const faults: Record<string, fc.Arbitrary<Json>> = {
  model: fc.constantFrom('', null, 1, []),
  messages: fc.oneof(fc.constantFrom<Json>([], null, {}, 'x'), oneBad(message, badMessage)),
  max_tokens: fc.constantFrom(0, -1, 1.5, '1', true),
  max_completion_tokens: fc.constantFrom(0, 2.5, -0.5),
  temperature: fc.constantFrom(-1e-9, 2 + 1e-9, 2.5, -1, '1'),
  top_p: fc.constantFrom(-1e-9, 1 + 1e-9, 1.5, '0.5'),
  frequency_penalty: fc.constantFrom(-2 - 1e-9, 2 + 1e-9, '0'),
  presence_penalty: fc.constantFrom(-2 - 1e-9, 2 + 1e-9, []),
  stream: fc.constantFrom('true', 0, 1, []),
  logprobs: fc.constantFrom('true', 1),
  parallel_tool_calls: fc.constantFrom('no', 0),
  store: fc.constantFrom('yes', 1),
  x_exec: fc.constantFrom(1, 'true'),
  stream_options: fc.constantFrom<Json>(
    true,
    [],
    'x',
    { include_usage: 1 },
    { include_usage: 'true' },
    { include_usage: true, x: 1 },
    { x: 1 },
  ),
  stop: fc.constantFrom<Json>(['a', 'b', 'c', 'd', 'e'], ['a', 1], 5, {}, [null]),
  n: fc.constantFrom(0, 129, 1.5, 2 ** 53, '2'),
  seed: fc.constantFrom(2 ** 63, -(2 ** 63) - 2048, 1e20, 0.5, '1'),
  top_logprobs: fc.constantFrom(-1, 21, 0.5, '1'),
  logit_bias: fc.constantFrom<Json>(
    { '': 1 },
    { a: 1 },
    { '1.5': 1 },
    { '-1': 1 },
    { '\uff11': 1 },
    { '1': 100.5 },
    { '1': -100.5 },
    { '1': '1' },
    { '1': null },
    [],
    'x',
  ),
  tools: fc.oneof(oneBad(tool, badTool), fc.constantFrom<Json>({}, 'x')),
  tool_choice: fc.constantFrom<Json>(
    'any',
    1,
    { type: 'tool', function: { name: 'x' } },
    { type: 'function', function: { name: 1 } },
    { type: 'function', function: { name: 'x', y: 1 } },
    { type: 'function', function: { name: 'x' }, y: 1 },
    { type: 'function' },
    { type: 'function', function: null },
  ),
  response_format: fc.oneof(badFormat, fc.constantFrom<Json>('json_object', 1)),
  metadata: fc.constantFrom<Json>(
    { ['k'.repeat(64)]: 'v', ['k'.repeat(65)]: 'v' },
    { k: 'v'.repeat(512), j: 'v'.repeat(513) },
    { ...sixteen, k16: 'v' },
    { a: 1 },
    { a: null },
    [],
    'x',
  ),
  user: fc.constantFrom<Json>(5, [], {}),
  reasoning_effort: fc.constantFrom('minimal', '', 1),
  service_tier: fc.constantFrom('scale', 1, ''),
  prediction: fc.constantFrom<Json>(
    { type: 'text', content: 'x' },
    { type: 'content', content: null },
    { type: 'content', content: [{ type: 'text', text: 1 }] },
    { type: 'content', content: [{ type: 'refusal', text: 'x' }] },
    { type: 'content', content: [{ type: 'text', text: 'x', y: 1 }] },
    { type: 'content', content: 'x', x: 1 },
    { type: 'content' },
    'x',
  ),
  modalities: fc.constantFrom<Json>('text', [1], {}),
};

/** A valid body with one field bent just outside its rules. */
const oneFault = fc
  .tuple(validBody, fc.constantFrom(...Object.keys(faults)))
  .chain(([body, field]) => faults[field]!.map((v) => plain({ ...body, [field]: v })));

/** Values at and just past the schema's bounds, wrong types, enumeration neighbours. */
const ODD_VALUES: readonly Json[] = [
  null,
  -0,
  0,
  1,
  2,
  2.0000001,
  -2,
  -2.0000001,
  1.5,
  0.5,
  -1,
  20,
  21,
  100,
  100.5,
  -100.5,
  128,
  129,
  2 ** 53,
  2 ** 53 + 2,
  -(2 ** 53) - 2,
  1e20,
  '',
  '12',
  '1a',
  'x'.repeat(64),
  'x'.repeat(65),
  'x'.repeat(512),
  'x'.repeat(513),
  'auto',
  'none',
  'required',
  'function',
  'text',
  'content',
  'json_schema',
  'json_object',
  'image_url',
  'refusal',
  'input_audio',
  'file',
  'low',
  'minimal',
  'flex',
  'scale',
  'user',
  'tool',
  'function_call',
  true,
  false,
  [],
  {},
  ['text'],
  ['a', 'b', 'c', 'd', 'e'],
  { type: 'text', text: 'x' },
  { type: 'input_audio', input_audio: { data: 'x', format: 'wav' } },
];
const oddValue: fc.Arbitrary<Json> = fc.oneof(
  fc.constantFrom<Json>(...ODD_VALUES),
  fc.jsonValue({ maxDepth: 2 }),
);

/**
 * As JSON.parse builds it: ordinary objects (fast-check may make null-prototype
 * ones), every number kept as it is (-0 included).
 */
function plain(v: Json): Json {
  if (Array.isArray(v)) return v.map(plain);
  if (typeof v === 'object' && v !== null) {
    const o: Record<string, Json> = {};
    for (const [k, x] of Object.entries(v)) o[k] = plain(x);
    return o;
  }
  return v;
}

type Slot = { parent: Record<string, Json> | Json[]; key: string | number };

function slots(v: Json, out: Slot[] = []): Slot[] {
  if (Array.isArray(v)) {
    v.forEach((x, i) => {
      out.push({ parent: v, key: i });
      slots(x, out);
    });
  } else if (typeof v === 'object' && v !== null) {
    for (const [k, x] of Object.entries(v)) {
      out.push({ parent: v as Record<string, Json>, key: k });
      slots(x, out);
    }
  }
  return out;
}

/** The body with one slot changed: replaced, removed, or an unknown key beside it. */
const mutatedBody = fc
  .tuple(validBody, fc.nat(), fc.constantFrom('replace', 'remove', 'add'), oddValue)
  .map(([body, pick, how, value]) => {
    const b = plain(body) as Record<string, Json>;
    const all = slots(b);
    const s = all[pick % all.length]!;
    if (how === 'replace') {
      (s.parent as Record<string | number, Json>)[s.key] = value;
    } else if (how === 'remove') {
      if (Array.isArray(s.parent)) s.parent.splice(s.key as number, 1);
      else delete s.parent[s.key as string];
    } else if (!Array.isArray(s.parent)) {
      s.parent.zz_unknown = value;
    }
    return plain(b);
  });

/** The schema accepts `body` and returns, for every field it declares, the body's value. */
function assertSchemaAgrees(body: unknown): void {
  const parsed = requestSchema.safeParse(body);
  assert.ok(parsed.success, `conforms() accepted what the schema refuses: ${JSON.stringify(body)}`);
  const b = body as Record<string, unknown>;
  const data = parsed.data as Record<string, unknown>;
  for (const k of Object.keys(requestSchema.shape)) assert.deepStrictEqual(data[k], b[k], k);
}

describe('conforms: the fast check of the chat request', () => {
  it('accepts only what the schema accepts, with the values the schema returns', () => {
    let accepted = 0;
    fc.assert(
      fc.property(fc.oneof(validBody.map(plain), oneFault, mutatedBody), (body) => {
        if (!conforms(body)) return;
        accepted++;
        assertSchemaAgrees(body);
      }),
      { numRuns: 30_000 },
    );
    // The check above is only as strong as the accepted share is large.
    assert.ok(accepted > 5_000, `only ${accepted} bodies took the fast path`);
  });

  it('accepts no single-slot change of a rich valid body that the schema refuses', () => {
    // Every slot of a body using every covered shape: replaced by each odd value,
    // removed, or given an unknown key beside it.
    const rich = {
      model: 'm',
      messages: [
        { role: 'system', content: 'Be brief.', name: 'sys' },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'What is this?' },
            { type: 'image_url', image_url: { url: 'https://example.com/a.png', detail: 'low' } },
          ],
        },
        {
          role: 'assistant',
          content: [{ type: 'refusal', refusal: 'No.' }],
          tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }],
        },
        { role: 'tool', tool_call_id: 'c1', content: 'ok' },
      ],
      max_tokens: 10,
      max_completion_tokens: 20,
      temperature: 1,
      top_p: 0.5,
      stream: true,
      stream_options: { include_usage: true },
      stop: ['a', 'b'],
      frequency_penalty: 1,
      presence_penalty: -1,
      n: 1,
      seed: 7,
      logprobs: true,
      top_logprobs: 3,
      logit_bias: { '50256': -100 },
      tools: [
        {
          type: 'function',
          function: { name: 'f', description: 'd', parameters: { type: 'object' }, strict: true },
        },
      ],
      tool_choice: { type: 'function', function: { name: 'f' } },
      parallel_tool_calls: false,
      response_format: {
        type: 'json_schema',
        json_schema: { name: 'x', description: 'd', schema: { type: 'object' }, strict: null },
      },
      metadata: { k: 'v' },
      user: 'u',
      store: false,
      reasoning_effort: 'low',
      service_tier: 'flex',
      prediction: { type: 'content', content: [{ type: 'text', text: 'p' }] },
      modalities: ['text'],
      x_exec: false,
    };
    assert.ok(conforms(rich));
    const count = slots(rich).length;
    let checked = 0;
    for (let n = 0; n < count; n++) {
      const variants: Array<(s: Slot) => void> = [
        ...ODD_VALUES.map((v) => (s: Slot) => {
          (s.parent as Record<string | number, Json>)[s.key] = structuredClone(v);
        }),
        (s) => {
          if (Array.isArray(s.parent)) s.parent.splice(s.key as number, 1);
          else delete s.parent[s.key as string];
        },
        (s) => {
          if (!Array.isArray(s.parent)) s.parent.zz_unknown = 1;
        },
      ];
      for (const change of variants) {
        const body = structuredClone(rich) as Json;
        change(slots(body)[n]!);
        if (conforms(body)) assertSchemaAgrees(body);
        checked++;
      }
    }
    assert.ok(checked > 3_000, `${checked}`);
  });

  it('takes every valid body of the shapes it covers', () => {
    fc.assert(
      fc.property(validBody.map(plain), (body) => {
        assert.ok(conforms(body), JSON.stringify(body));
      }),
      { numRuns: 5_000 },
    );
  });

  it('leaves shapes it does not cover to the schema, which still judges them', () => {
    const audio = {
      model: 'm',
      messages: [
        {
          role: 'user',
          content: [{ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } }],
        },
      ],
    };
    const extraKey = { model: 'm', messages: [{ role: 'user', content: 'hi', extra: 1 }] };
    for (const body of [audio, extraKey]) {
      assert.equal(conforms(body), false);
      assert.doesNotThrow(() => parseChatRequest(body));
    }
    // An unknown nested key is stripped by the schema, not forwarded in `messages`.
    assert.deepEqual(parseChatRequest(extraKey).messages, [{ role: 'user', content: 'hi' }]);
  });

  it('gives the same request either way', () => {
    const body = {
      model: 'm',
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: [{ type: 'text', text: 'Weather?' }] },
        {
          role: 'assistant',
          content: null,
          tool_calls: [{ id: 'c1', type: 'function', function: { name: 'w', arguments: '{}' } }],
        },
        { role: 'tool', tool_call_id: 'c1', content: 'sunny' },
      ],
      tools: [{ type: 'function', function: { name: 'w', parameters: { type: 'object' } } }],
      tool_choice: 'auto',
      stop: 'END',
      max_completion_tokens: 50,
      stream: true,
      stream_options: { include_usage: true },
      metadata: { a: 'b' },
      service_tier: 'priority',
    };
    assert.ok(conforms(body));
    // The same body with an unknown nested key goes through zod; it is stripped there.
    const viaSchema = structuredClone(body) as typeof body & { messages: object[] };
    (viaSchema.messages[0] as Record<string, unknown>).x = 1;
    assert.equal(conforms(viaSchema), false);
    const fast = parseChatRequest(body);
    const slow = parseChatRequest(viaSchema);
    assert.deepStrictEqual({ ...fast, body: null }, { ...slow, body: null });
  });
});
