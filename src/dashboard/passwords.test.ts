import assert from 'node:assert/strict';
import { randomBytes, scryptSync } from 'node:crypto';
import { describe, it } from 'node:test';
import {
  hashPassword,
  MAX_PASSWORD_LENGTH,
  MIN_PASSWORD_LENGTH,
  passwordProblem,
  verifyPassword,
} from './passwords.js';

const PASSWORD = 'correct horse battery staple';

describe('passwordProblem', () => {
  // '🦊' is one code point but two UTF-16 units: 11 of them are 22 units, still too short.
  const cases: Array<[string, boolean, string]> = [
    ['', false, 'empty'],
    ['a'.repeat(11), false, '11 ASCII characters'],
    ['a'.repeat(12), true, '12 ASCII characters'],
    ['🦊'.repeat(11), false, '11 emoji (22 UTF-16 units)'],
    ['🦊'.repeat(12), true, '12 emoji'],
    ['a'.repeat(MAX_PASSWORD_LENGTH), true, '1024 characters'],
    ['a'.repeat(MAX_PASSWORD_LENGTH + 1), false, '1025 characters'],
    ['🦊'.repeat(MAX_PASSWORD_LENGTH), true, '1024 emoji (2048 UTF-16 units)'],
  ];
  for (const [password, ok, what] of cases) {
    it(`${ok ? 'accepts' : 'refuses'} ${what}`, () => {
      const problem = passwordProblem(password);
      if (ok) assert.equal(problem, null);
      else assert.equal(typeof problem, 'string');
    });
  }

  it('says what is wrong', () => {
    assert.match(passwordProblem('short')!, /at least 12 characters/);
    assert.match(passwordProblem('a'.repeat(1025))!, /at most 1024 characters/);
    assert.equal(MIN_PASSWORD_LENGTH, 12);
  });
});

describe('hashPassword and verifyPassword', () => {
  it('verifies the right password and refuses others', async () => {
    const stored = await hashPassword(PASSWORD);
    assert.equal(await verifyPassword(PASSWORD, stored), true);
    assert.equal(await verifyPassword(PASSWORD + ' ', stored), false);
    assert.equal(await verifyPassword('Correct horse battery staple', stored), false);
    assert.equal(await verifyPassword('', stored), false);
  });

  it('stores the algorithm, its parameters, salt and hash', async () => {
    const stored = await hashPassword(PASSWORD);
    assert.match(stored, /^scrypt\$16384\$8\$1\$[A-Za-z0-9_-]{22}\$[A-Za-z0-9_-]{43}$/);
    assert.ok(!stored.includes(PASSWORD));
  });

  it('salts: two hashes of one password differ and both verify', async () => {
    const [a, b] = await Promise.all([hashPassword(PASSWORD), hashPassword(PASSWORD)]);
    assert.notEqual(a, b);
    assert.equal(await verifyPassword(PASSWORD, a), true);
    assert.equal(await verifyPassword(PASSWORD, b), true);
  });

  it('honours the parameters stored with the hash', async () => {
    const salt = randomBytes(16);
    for (const [N, r, p, len] of [
      [1024, 8, 1, 32],
      [32768, 8, 1, 32],
      [4096, 4, 2, 64],
    ] as const) {
      const hash = scryptSync(PASSWORD, salt, len, { N, r, p, maxmem: 256 * N * r });
      const stored = `scrypt$${N}$${r}$${p}$${salt.toString('base64url')}$${hash.toString('base64url')}`;
      assert.equal(await verifyPassword(PASSWORD, stored), true, `N=${N} r=${r} p=${p}`);
      assert.equal(await verifyPassword('wrong password!', stored), false);
    }
  });

  it('normalises with NFKC, so composed and decomposed accents match', async () => {
    const composed = 'caf\u00e9 au lait, s\u2019il vous pla\u00eet';
    const decomposed = composed.normalize('NFD');
    assert.notEqual(composed, decomposed);
    const stored = await hashPassword(composed);
    assert.equal(await verifyPassword(decomposed, stored), true);
    // Full-width letters are the same letters under NFKC.
    const fullWidth = await hashPassword('\uff30\uff41\uff53\uff53\uff57\uff4f\uff52\uff44-123456');
    assert.equal(await verifyPassword('Password-123456', fullWidth), true);
  });

  it('answers false, without throwing, for a malformed stored string', async () => {
    const good = await hashPassword(PASSWORD);
    const [, N, r, p, salt, hash] = good.split('$') as [
      string,
      string,
      string,
      string,
      string,
      string,
    ];
    const bad = [
      '',
      'scrypt',
      good + '$extra',
      good.replace(/^scrypt/, 'bcrypt'),
      `scrypt$${N}$${r}$${p}$${salt}`,
      `scrypt$1000$${r}$${p}$${salt}$${hash}`, // N not a power of two
      `scrypt$1$${r}$${p}$${salt}$${hash}`, // N too small
      `scrypt$0$${r}$${p}$${salt}$${hash}`,
      `scrypt$-16384$${r}$${p}$${salt}$${hash}`,
      `scrypt$16384.0$${r}$${p}$${salt}$${hash}`,
      `scrypt$${2 ** 30}$${r}$${p}$${salt}$${hash}`, // would need 128 GiB
      `scrypt$${N}$0$${p}$${salt}$${hash}`,
      `scrypt$${N}$${r}$99$${salt}$${hash}`,
      `scrypt$${N}$${r}$${p}$$${hash}`,
      `scrypt$${N}$${r}$${p}$${salt}$`,
      `scrypt$${N}$${r}$${p}$${salt}!$${hash}`,
      `scrypt$${N}$${r}$${p}$${salt}$${hash.slice(0, 10)}`, // hash too short to trust
      `scrypt$${N}$${r}$${p}$${salt}$${hash}=`,
    ];
    for (const stored of bad) {
      assert.equal(await verifyPassword(PASSWORD, stored), false, JSON.stringify(stored));
    }
  });
});
