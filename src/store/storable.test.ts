import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { storableJson, storableValue } from './storable.js';

describe('storableJson', () => {
  it('replaces every U+0000 with U+FFFD, in values and keys, and nothing else', () => {
    const value = {
      content: 'a\u0000b\u0000',
      ['k\u0000']: ['\u0000'],
      // Text that spells an escape: a backslash, then `u0000`.
      literal: 'x\\u0000y',
      // An escaped backslash followed by a real NUL.
      both: '\\\u0000',
    };
    const out = JSON.parse(storableJson(JSON.stringify(value))) as Record<string, unknown>;
    assert.deepEqual(out, {
      content: 'a\uFFFDb\uFFFD',
      ['k\uFFFD']: ['\uFFFD'],
      literal: 'x\\u0000y',
      both: '\\\uFFFD',
    });
  });

  it('replaces lone surrogates with U+FFFD and keeps pairs, raw or escaped', () => {
    const value = {
      lone: 'a\ud800b',
      low: '\udc00',
      reversed: '\udc00\ud800',
      pair: 'x\ud83d\ude00y',
      ['k\udbff']: 1,
      // Text that spells an escape of a surrogate: a backslash, then `ud800`.
      literal: '\\ud800',
    };
    const json = JSON.stringify(value);
    const out = JSON.parse(storableJson(json)) as Record<string, unknown>;
    assert.deepEqual(out, {
      lone: 'a\uFFFDb',
      low: '\uFFFD',
      reversed: '\uFFFD\uFFFD',
      pair: 'x\u{1F600}y',
      ['k\uFFFD']: 1,
      literal: '\\ud800',
    });
    // A pair a worker wrote as two escapes stays a pair.
    const escapedPair = '{"c":"\\uD83D\\uDE00 \\ud800"}';
    assert.equal(storableJson(escapedPair), '{"c":"\\uD83D\\uDE00 \\ufffd"}');
  });

  it('returns a text without U+0000 as it is', () => {
    const json = JSON.stringify({ content: 'plain \\u0000 text', n: 1 });
    assert.equal(storableJson(json), json);
  });

  it('storableValue: the same object when clean, a repaired copy when not', () => {
    const clean = { a: ['x', { b: 'y \u{1F600}' }] };
    assert.equal(storableValue(clean), clean);
    const dirty = { output: [{ text: 'a\u0000b\ud800' }], n: 1 };
    assert.deepEqual(storableValue(dirty), { output: [{ text: 'a\uFFFDb\uFFFD' }], n: 1 });
    assert.equal(dirty.output[0]!.text, 'a\u0000b\ud800', 'the original is left as it was');
  });
});
