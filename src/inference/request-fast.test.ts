/**
 * `conforms` (request-fast.ts) against the zod schema it stands in for: whenever it
 * says yes, the schema accepts the body and returns the same value for every field
 * it declares. Bodies come from a generator of valid requests of every shape the
 * fast path covers, and from those bodies with one slot changed: a value replaced
 * (wrong types, values at and just past each bound, enumeration neighbours), a key
 * removed, or an unknown key added to a nested object.
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
const tool = fc.record({
  type: fc.constant('function'),
  function: fc.record(
    {
      name: fc.string({ minLength: 1, maxLength: 8 }),
      description: text,
      parameters: objectOf,
      strict: nullable(fc.boolean()),
    },
    { requiredKeys: ['name'] },
  ),
});
const toolChoice = fc.oneof(
  fc.constantFrom('auto', 'none', 'required'),
  fc.record({ type: fc.constant('function'), function: fc.record({ name: text }) }),
);
const responseFormat = fc.oneof(
  fc.record({ type: fc.constantFrom('text', 'json_object') }),
  fc.record({
    type: fc.constant('json_schema'),
    json_schema: fc.record(
      { name: text, description: text, schema: objectOf, strict: nullable(fc.boolean()) },
      { requiredKeys: ['name'] },
    ),
  }),
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
    seed: nullable(fc.oneof(fc.integer(), fc.constant(Number.MAX_SAFE_INTEGER))),
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

/** `a`, or now and then one of `odd`: values at and just past the field's rules. */
function edge<T>(a: fc.Arbitrary<T>, ...odd: Json[]): fc.Arbitrary<Json> {
  return fc.oneof({ arbitrary: a as fc.Arbitrary<Json>, weight: 3 }, fc.constantFrom(...odd));
}
/** A record of `fields`, sometimes with a key the schema does not declare. */
function nearRecord(fields: Record<string, fc.Arbitrary<Json>>, required: string[]) {
  return fc
    .tuple(fc.record(fields, { requiredKeys: required }), fc.option(fc.constant(1)))
    .map(([o, extra]) => (extra === null ? o : { ...o, zz_unknown: extra }));
}
const nearText = edge(text, null, 5, ['x']);
const nearTextPart = nearRecord(
  { type: edge(fc.constant('text'), 'refusal', 'txt'), text: nearText },
  ['type'],
);
const nearPart = fc.oneof(
  nearTextPart,
  nearRecord(
    {
      type: fc.constant('image_url'),
      image_url: nearRecord({ url: nearText, detail: nearText }, []),
    },
    ['type'],
  ),
  nearRecord({ type: fc.constant('refusal'), refusal: nearText }, ['type']),
  fc.constant({ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } }),
  fc.constant({ type: 'file', file: { file_id: 'f' } }),
);
const nearToolCall = nearRecord(
  {
    id: nearText,
    type: edge(fc.constant('function'), 'tool'),
    function: nearRecord({ name: nearText, arguments: nearText }, []),
  },
  [],
);
const nearMessage = nearRecord(
  {
    role: fc.constantFrom('system', 'user', 'assistant', 'tool', 'developer', 'function', ''),
    content: fc.oneof(nearText, fc.array(nearPart, { maxLength: 2 })),
    name: nearText,
    tool_call_id: nearText,
    tool_calls: edge(fc.array(nearToolCall, { maxLength: 2 }), null, {}),
  },
  [],
);
const nearTool = nearRecord(
  {
    type: edge(fc.constant('function'), 'tool'),
    function: nearRecord(
      {
        name: edge(fc.string({ minLength: 1, maxLength: 4 }), '', null, 3),
        description: nearText,
        parameters: edge(objectOf, null, [], 'x'),
        strict: edge(fc.boolean(), null, 'true'),
      },
      [],
    ),
  },
  [],
);
const nearFormat = fc.oneof(
  nearRecord({ type: fc.constantFrom('text', 'json_object', 'json', '') }, []),
  nearRecord(
    {
      type: fc.constant('json_schema'),
      json_schema: nearRecord(
        {
          name: nearText,
          description: nearText,
          schema: edge(objectOf, null, []),
          strict: edge(fc.boolean(), null, 1),
        },
        [],
      ),
    },
    [],
  ),
);
const sixteen = Object.fromEntries(Array.from({ length: 16 }, (_, i) => [`k${i}`, 'v']));

/**
 * For each field, values just outside its rules (and, for the nested ones, objects
 * bent at one of their own fields now and then); a body gets one of them, in one field.
 */
const faults: Record<string, fc.Arbitrary<Json>> = {
  model: fc.constantFrom('', null, 1, []),
  messages: fc.oneof(
    fc.constantFrom<Json>([], null, {}, 'x'),
    fc.array(nearMessage, { minLength: 1, maxLength: 2 }),
  ),
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
  seed: fc.constantFrom(2 ** 53, -(2 ** 53), 1e20, 0.5, '1'),
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
  tools: fc.oneof(fc.array(nearTool, { minLength: 1, maxLength: 2 }), fc.constantFrom({}, 'x')),
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
  response_format: fc.oneof(nearFormat, fc.constantFrom('json_object', 1)),
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
const oddValue: fc.Arbitrary<Json> = fc.oneof(
  fc.constantFrom<Json>(
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
  ),
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
