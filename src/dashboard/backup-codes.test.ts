import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, it } from 'node:test';
import {
  BACKUP_CODE_ALPHABET,
  BACKUP_CODE_COUNT,
  backupCodeHash,
  looksLikeBackupCode,
  newBackupCodes,
} from './backup-codes.js';

const SHAPE = /^[23456789abcdefghjkmnpqrstuvwxyz]{5}-[23456789abcdefghjkmnpqrstuvwxyz]{5}$/;

describe('newBackupCodes', () => {
  it('makes 10 distinct codes of the shape xxxxx-xxxxx, with their hashes in order', () => {
    const { codes, hashes } = newBackupCodes();
    assert.equal(BACKUP_CODE_COUNT, 10);
    assert.equal(codes.length, BACKUP_CODE_COUNT);
    assert.equal(new Set(codes).size, BACKUP_CODE_COUNT);
    for (const [i, code] of codes.entries()) {
      assert.match(code, SHAPE);
      assert.equal(hashes[i], backupCodeHash(code));
    }
    assert.equal(new Set(hashes).size, BACKUP_CODE_COUNT);
  });

  it('uses an alphabet without the ambiguous 0, o, 1, i and l, and carries at least 40 bits', () => {
    assert.equal(new Set(BACKUP_CODE_ALPHABET).size, BACKUP_CODE_ALPHABET.length);
    for (const c of '0o1il') assert.ok(!BACKUP_CODE_ALPHABET.includes(c), c);
    assert.ok(10 * Math.log2(BACKUP_CODE_ALPHABET.length) >= 40);
  });

  it('is random: 1000 codes are distinct, and every symbol turns up', () => {
    const all: string[] = [];
    for (let i = 0; i < 100; i++) all.push(...newBackupCodes().codes);
    assert.equal(all.length, 1000);
    assert.equal(new Set(all).size, 1000);
    const counts = new Map<string, number>();
    for (const code of all) {
      for (const c of code.replace('-', '')) counts.set(c, (counts.get(c) ?? 0) + 1);
    }
    assert.deepEqual([...counts.keys()].sort().join(''), BACKUP_CODE_ALPHABET);
    // 10,000 symbols over 31: about 323 each. A bias (a modulo, a fixed position)
    // would push some far out; 200..450 is over six standard deviations wide.
    for (const [c, n] of counts) assert.ok(n > 200 && n < 450, `${c}: ${n}`);
  });

  it('draws again when a code repeats, and refuses a source that only repeats', () => {
    let calls = 0;
    // The first two codes are identical, then every draw differs.
    const seq = (n: number): number => {
      const i = calls++;
      return i < 20 ? i % 10 : i % n;
    };
    const { codes } = newBackupCodes(seq);
    assert.equal(new Set(codes).size, BACKUP_CODE_COUNT);
    assert.throws(() => newBackupCodes(() => 0), /repeating/);
    assert.throws(() => newBackupCodes(() => 31), RangeError);
  });
});

describe('backupCodeHash', () => {
  const code = 'abcde-fghjk';
  const expected = createHash('sha256').update('abcdefghjk').digest('hex');

  it('is the SHA-256 hex of the normalised code', () => {
    assert.equal(backupCodeHash(code), expected);
  });

  for (const variant of [
    'abcdefghjk',
    'ABCDE-FGHJK',
    'AbCdEfGhJk',
    ' abcde fghjk ',
    'abc-de-fg-hjk',
  ]) {
    it(`matches the variant ${JSON.stringify(variant)}`, () => {
      assert.equal(backupCodeHash(variant), expected);
    });
  }

  it('differs for different codes', () => {
    assert.notEqual(backupCodeHash('abcde-fghjk'), backupCodeHash('abcde-fghjm'));
    const { codes } = newBackupCodes();
    assert.equal(new Set(codes.map(backupCodeHash)).size, codes.length);
  });
});

describe('looksLikeBackupCode', () => {
  const cases: Array<[string, boolean]> = [
    ['abcde-fghjk', true],
    ['ABCDE-FGHJK', true],
    ['abcdefghjk', true],
    [' abcde fghjk ', true],
    ['123456', false],
    ['123 456', false],
    ['', false],
    ['abcde-fghj', false],
    ['abcde-fghjkm', false],
    ['abcde-fghj0', false],
    ['abcde-fghjl', false],
    ['abcde_fghjk', false],
  ];
  for (const [input, expected] of cases) {
    it(`${JSON.stringify(input)} → ${expected}`, () => {
      assert.equal(looksLikeBackupCode(input), expected);
    });
  }

  it('recognises every generated code', () => {
    for (const code of newBackupCodes().codes) assert.ok(looksLikeBackupCode(code));
  });
});
