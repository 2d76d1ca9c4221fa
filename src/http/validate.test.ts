import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { parseBody, parseField } from './validate.js';

const schema = z
  .object({
    url: z.string(),
    events: z.array(z.string()).min(1),
    metadata: z.record(z.string(), z.string()).optional(),
  })
  .strict();

function refusal(input: unknown): ServiceError {
  try {
    parseBody(schema, input);
  } catch (err) {
    assert.ok(err instanceof ServiceError);
    return err;
  }
  assert.fail('accepted');
}

describe('parseBody', () => {
  it('a missing field is missing; a field of the wrong type is not', () => {
    const missing = refusal({ events: ['a'] });
    assert.equal(missing.code, 'invalid_body');
    assert.equal(missing.param, 'url');
    assert.equal(missing.message, "Missing required parameter: 'url'.");

    for (const [input, param] of [
      [{ url: 123, events: ['a'] }, 'url'],
      [{ url: 'https://x', events: 'a' }, 'events'],
      [{ url: 'https://x', events: ['a'], metadata: { a: 1 } }, 'metadata.a'],
    ] as const) {
      const wrong = refusal(input);
      assert.equal(wrong.param, param);
      assert.doesNotMatch(wrong.message, /Missing/, wrong.message);
      assert.match(wrong.message, new RegExp(`^Invalid '${param.replace('.', '\\.')}': `));
    }
  });

  it('names the unknown key, and the body itself when it is not an object', () => {
    assert.equal(refusal({ url: 'u', events: ['a'], extra: 1 }).param, 'extra');
    const notObject = refusal([]);
    assert.equal(notObject.param, null);
    assert.doesNotMatch(notObject.message, /Missing/);
  });
});

describe('parseField', () => {
  it('a record key refused by its own schema says why, not "Invalid key in record"', () => {
    const schema = z.object({
      metadata: z.record(z.string().max(64, 'keys up to 64 characters'), z.string()),
    });
    const key = 'k'.repeat(70);
    assert.throws(
      () => parseField(schema, { metadata: { [key]: 'v' } }),
      (e: unknown) =>
        e instanceof ServiceError &&
        e.code === 'invalid_value' &&
        e.param === `metadata.${key}` &&
        /keys up to 64 characters/.test(e.message),
    );
  });
});
