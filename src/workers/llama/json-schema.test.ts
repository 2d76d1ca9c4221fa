import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { SchemaError, toGrammarSchema } from './json-schema.js';

describe('toGrammarSchema', () => {
  it('rewrites anyOf, nullable and mixed type lists into oneOf', () => {
    assert.deepEqual(toGrammarSchema({ anyOf: [{ type: 'string' }, { type: 'null' }] }, true), {
      oneOf: [{ type: 'string' }, { type: 'null' }],
    });
    assert.deepEqual(toGrammarSchema({ type: 'integer', nullable: true }, false), {
      oneOf: [{ type: 'integer' }, { type: 'null' }],
    });
    assert.deepEqual(
      toGrammarSchema(
        { type: ['object', 'null'], properties: { a: { type: 'string' } }, required: ['a'] },
        true,
      ),
      {
        oneOf: [
          { type: 'object', properties: { a: { type: 'string' } }, required: ['a'] },
          { type: ['null'] },
        ],
      },
    );
    assert.deepEqual(toGrammarSchema({ type: ['string', 'null'] }, true), {
      type: ['string', 'null'],
    });
  });

  it('moves definitions to $defs and keeps references working', () => {
    const out = toGrammarSchema(
      {
        type: 'object',
        properties: { car: { $ref: '#/definitions/Car' } },
        required: ['car'],
        definitions: { Car: { type: 'object', properties: { track: { type: 'integer' } } } },
      },
      false,
    );
    assert.deepEqual(out, {
      $defs: { Car: { type: 'object', properties: { track: { type: 'integer' } } } },
      type: 'object',
      properties: { car: { $ref: '#/$defs/Car' } },
      required: ['car'],
    });
  });

  it('merges a single allOf (how pydantic attaches descriptions to references)', () => {
    const defs = { A: { type: 'string' } };
    assert.deepEqual(
      toGrammarSchema({ allOf: [{ $ref: '#/$defs/A' }], description: 'x', $defs: defs }, true),
      { description: 'x', $defs: defs, $ref: '#/$defs/A' },
    );
  });

  it('reads an empty schema or a bare object as "any value" / "any object"', () => {
    const any = toGrammarSchema({}, false) as { oneOf: unknown[] };
    assert.equal(any.oneOf.length, 3);
    assert.deepEqual(toGrammarSchema({ type: 'object' }, true), {
      type: 'object',
      additionalProperties: true,
    });
    assert.deepEqual(toGrammarSchema({ type: 'object', properties: {} }, true), {
      type: 'object',
      properties: {},
    });
  });

  it('drops unenforceable constraints unless the schema is strict', () => {
    const schema = { type: 'object', properties: { n: { type: 'number', minimum: 3 } } };
    assert.deepEqual(toGrammarSchema(schema, false), {
      type: 'object',
      properties: { n: { type: 'number' } },
    });
    assert.throws(
      () => toGrammarSchema(schema, true),
      (e: unknown) => e instanceof SchemaError && e.pointer === '/properties/n/minimum',
    );
    assert.throws(() => toGrammarSchema({ type: 'string', format: 'email' }, true), SchemaError);
    assert.deepEqual(toGrammarSchema({ type: 'string', format: 'email' }, false), {
      type: 'string',
    });
    assert.deepEqual(toGrammarSchema({ type: 'string', format: 'date' }, true), {
      type: 'string',
      format: 'date',
    });
  });

  it('rejects what no grammar can mean', () => {
    for (const [schema, pointer] of [
      [{ type: 'nonsense' }, '/type'],
      [{ type: 'object', properties: { a: { $ref: 'http://x/y.json' } } }, '/properties/a/$ref'],
      [{ allOf: [{ type: 'string' }, { type: 'number' }] }, '/allOf'],
      [{ enum: [{ a: 1 }] }, '/enum/0'],
      [false, ''],
      // What no value satisfies: the grammar would write output that breaks it.
      [{ type: 'object', properties: { a: { $ref: '#/$defs/nope' } } }, '/properties/a/$ref'],
      [{ $ref: '#/$defs/nope', $defs: { other: { type: 'string' } } }, '/$ref'],
      [{ type: 'array', items: { type: 'boolean' }, minItems: 2, maxItems: 1 }, '/minItems'],
      [{ type: 'string', minLength: 5, maxLength: 3 }, '/minLength'],
      [{ type: 'object', minProperties: 3, maxProperties: 1 }, '/minProperties'],
      [{ type: 'string', maxLength: -1 }, '/maxLength'],
      [{ type: 'array', minItems: 1.5 }, '/minItems'],
    ] as const) {
      assert.throws(
        () => toGrammarSchema(schema, false),
        (e: unknown) => e instanceof SchemaError && e.pointer === pointer,
        JSON.stringify(schema),
      );
    }
  });

  it('strict: a required property must be declared (a grammar writes only declared ones)', () => {
    const schema = {
      type: 'object',
      properties: { a: { type: 'boolean' } },
      required: ['a', 'b'],
      additionalProperties: false,
    };
    assert.throws(
      () => toGrammarSchema(schema, true),
      (e: unknown) => e instanceof SchemaError && e.pointer === '/required/1',
    );
    // Best effort without strict, as OpenAI's non-strict mode.
    assert.doesNotThrow(() => toGrammarSchema(schema, false));
    // A definition referenced before it is defined is fine.
    assert.doesNotThrow(() =>
      toGrammarSchema(
        { properties: { a: { $ref: '#/$defs/A' } }, $defs: { A: { type: 'string' } } },
        true,
      ),
    );
  });
});
