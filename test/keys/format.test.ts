import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  bearerToken,
  displayPrefix,
  generateKey,
  hashKey,
  parseKey,
} from '../../src/keys/index.js';

describe('API key format', () => {
  it('is swy_<project_slug>_<43 base64url chars of 32 random bytes>', () => {
    const k = generateKey('acme-prod');
    assert.match(k.value, /^swy_acme-prod_[A-Za-z0-9_-]{43}$/);
    const token = k.value.slice('swy_acme-prod_'.length);
    assert.equal(Buffer.from(token, 'base64url').length, 32);
    assert.equal(k.hash, hashKey(k.value));
    assert.match(k.hash, /^[0-9a-f]{64}$/);
    assert.equal(k.prefix, displayPrefix('acme-prod', token));
    assert.equal(k.prefix, `swy_acme-prod_${token.slice(0, 4)}`);
  });

  it('takes its token from the random source, all 32 bytes of it', () => {
    const seen: number[] = [];
    const k = generateKey('p', (n) => {
      seen.push(n);
      return Buffer.alloc(n, 0xab);
    });
    assert.deepEqual(seen, [32]);
    assert.equal(k.value, `swy_p_${Buffer.alloc(32, 0xab).toString('base64url')}`);
  });

  it('has full entropy: no repeats and byte values spread uniformly', () => {
    const counts = new Array<number>(256).fill(0);
    const values = new Set<string>();
    const n = 2000;
    for (let i = 0; i < n; i++) {
      const k = generateKey('e');
      values.add(k.value);
      for (const b of Buffer.from(parseKey(k.value)!.token, 'base64url')) counts[b]!++;
    }
    assert.equal(values.size, n);
    // Chi-square over 256 byte values (255 degrees of freedom); the 99.99th
    // percentile is about 350, so a working CSPRNG fails this once in 10,000 runs.
    const expected = (n * 32) / 256;
    const chi = counts.reduce((acc, c) => acc + (c - expected) ** 2 / expected, 0);
    assert.ok(chi < 350, `chi-square ${chi.toFixed(1)} too high`);
  });

  it('refuses slugs that would make keys ambiguous', () => {
    assert.throws(() => generateKey('has_underscore'));
    assert.throws(() => generateKey('Upper'));
    assert.throws(() => generateKey(''));
  });

  it('parses only well-formed keys', () => {
    const good = generateKey('demo').value;
    assert.deepEqual(parseKey(good)?.projectSlug, 'demo');
    const bad = [
      '',
      'swy_demo_',
      'sk-abc',
      good.slice(0, -1),
      good + 'x',
      good.replace('swy_', 'SWY_'),
      `swy_demo_${'!'.repeat(43)}`,
      `swy__${'a'.repeat(43)}`,
      'x'.repeat(10_000),
    ];
    for (const b of bad) assert.equal(parseKey(b), null, b);
  });

  it('reads bearer tokens case-insensitively and rejects other schemes', () => {
    assert.equal(bearerToken('Bearer abc'), 'abc');
    assert.equal(bearerToken('bearer abc'), 'abc');
    assert.equal(bearerToken('BEARER  abc '), 'abc');
    assert.equal(bearerToken('Basic abc'), null);
    assert.equal(bearerToken('Bearer '), null);
    assert.equal(bearerToken(undefined), null);
  });
});
