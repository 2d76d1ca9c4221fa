import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import {
  loadSecretKey,
  parseSecretKey,
  SealedValueError,
  SECRET_KEY_FILE,
  SecretBox,
} from './at-rest.js';

const key = randomBytes(32);
const box = new SecretBox(key);
const SEED = 'GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ';

/** Changes one character of `s` at `i` to another of the base64url alphabet. */
function flip(s: string, i: number): string {
  const c = s[i] === 'A' ? 'B' : 'A';
  return s.slice(0, i) + c + s.slice(i + 1);
}

function refused(fn: () => unknown, problem?: 'format' | 'authentication'): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof SealedValueError, `expected SealedValueError, got ${String(err)}`);
    if (problem) assert.equal(err.problem, problem);
    return true;
  });
}

describe('SecretBox', () => {
  it('opens what it sealed, for the same context', () => {
    for (const plaintext of [SEED, '', 'é 🔑 ünïcödé']) {
      const sealed = box.seal(plaintext, 'user_1');
      assert.equal(box.open(sealed, 'user_1'), plaintext);
    }
  });

  it('writes a printable v1 string, never the plaintext', () => {
    const sealed = box.seal(SEED, 'user_1');
    assert.match(sealed, /^v1\.[A-Za-z0-9_-]{16}\.[A-Za-z0-9_-]+$/);
    assert.ok(!sealed.includes(SEED));
  });

  it('uses a fresh nonce per seal', () => {
    const seen = new Set<string>();
    for (let i = 0; i < 100; i++) seen.add(box.seal(SEED, 'user_1').split('.')[1]!);
    assert.equal(seen.size, 100);
    assert.notEqual(box.seal(SEED, 'user_1'), box.seal(SEED, 'user_1'));
  });

  it('refuses a value copied to another context', () => {
    const sealed = box.seal(SEED, 'user_1');
    refused(() => box.open(sealed, 'user_2'), 'authentication');
    refused(() => box.open(sealed, ''), 'authentication');
  });

  it('refuses a value sealed with another key', () => {
    const sealed = new SecretBox(randomBytes(32)).seal(SEED, 'user_1');
    refused(() => box.open(sealed, 'user_1'), 'authentication');
  });

  it('refuses every single-character change to the nonce, ciphertext and tag', () => {
    const sealed = box.seal(SEED, 'user_1');
    const [, nonce, body] = sealed.split('.') as [string, string, string];
    for (let i = 0; i < nonce.length; i++) {
      refused(() => box.open(`v1.${flip(nonce, i)}.${body}`, 'user_1'));
    }
    for (let i = 0; i < body.length; i++) {
      refused(() => box.open(`v1.${nonce}.${flip(body, i)}`, 'user_1'));
    }
  });

  it('refuses a truncated or extended body', () => {
    const sealed = box.seal(SEED, 'user_1');
    const [, nonce, body] = sealed.split('.') as [string, string, string];
    refused(() => box.open(`v1.${nonce}.${body.slice(0, -4)}`, 'user_1'));
    refused(() => box.open(`v1.${nonce}.${body}AAAA`, 'user_1'));
  });

  const malformed: Array<[string, string]> = [
    ['', 'empty'],
    ['v1', 'version only'],
    ['v1..', 'empty parts'],
    ['v2.AAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA', 'unknown version'],
    ['v1.AAAA.AAAAAAAAAAAAAAAAAAAAAA', 'short nonce'],
    ['v1.AAAAAAAAAAAAAAAA.AAAA', 'body shorter than a tag'],
    ['v1.AAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA.x', 'four parts'],
    ['v1.AAAAAAAAAAAAAAA=.AAAAAAAAAAAAAAAAAAAAAA', 'padding'],
    ['v1.AAAAAAAAAAAAAAA+.AAAAAAAAAAAAAAAAAAAAAA', 'base64 alphabet'],
    ['v1.AAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAB', 'non-canonical base64url'],
  ];
  for (const [sealed, what] of malformed) {
    it(`refuses a bad format: ${what}`, () => refused(() => box.open(sealed, 'user_1'), 'format'));
  }

  it('refuses a key that is not 32 bytes', () => {
    assert.throws(() => new SecretBox(randomBytes(16)), /32 bytes/);
  });

  it('is unaffected by later changes to the caller key buffer', () => {
    const k = randomBytes(32);
    const b = new SecretBox(k);
    const sealed = b.seal(SEED, 'u');
    k.fill(0);
    assert.equal(b.open(sealed, 'u'), SEED);
  });
});

describe('secret key formats', () => {
  const raw = randomBytes(32);
  const accepted: Array<[string, string]> = [
    [raw.toString('base64'), 'base64, padded'],
    [raw.toString('base64').replace(/=$/, ''), 'base64, unpadded'],
    [raw.toString('base64url'), 'base64url'],
    [raw.toString('base64url') + '=', 'base64url, padded'],
    [raw.toString('hex'), 'hex'],
    [raw.toString('hex').toUpperCase(), 'upper-case hex'],
    [`  ${raw.toString('base64')}\n`, 'surrounding whitespace'],
  ];
  for (const [text, what] of accepted) {
    it(`accepts ${what}`, () => {
      assert.deepEqual(parseSecretKey(text), raw);
      const loaded = loadSecretKey({ fromEnv: text, dataDir: null });
      assert.equal(loaded.source, 'env');
      assert.deepEqual(loaded.key, raw);
    });
  }

  const refusedKeys: Array<[string, string]> = [
    [randomBytes(16).toString('base64'), '16 bytes'],
    [randomBytes(31).toString('base64'), '31 bytes'],
    [randomBytes(33).toString('base64'), '33 bytes'],
    [randomBytes(32).toString('hex').slice(1), '63 hex characters'],
    ['g'.repeat(64), '64 non-hex characters'],
    ['correct horse battery staple', 'a passphrase'],
    [raw.toString('base64').slice(0, 42) + '!=', 'a foreign character'],
    [raw.toString('base64url').slice(0, 42) + 'B', 'non-canonical last character'],
  ];
  for (const [text, what] of refusedKeys) {
    it(`refuses ${what} with a clear error that does not echo it`, () => {
      assert.equal(parseSecretKey(text), null);
      assert.throws(
        () => loadSecretKey({ fromEnv: text, dataDir: null }),
        (err: unknown) =>
          err instanceof Error &&
          err.message.includes('SWITCHYARD_SECRET_KEY') &&
          !err.message.includes(text),
      );
    });
  }
});

describe('loadSecretKey', () => {
  const dirs: string[] = [];
  const tempDir = (): string => {
    const d = mkdtempSync(join(tmpdir(), 'swy-at-rest-'));
    dirs.push(d);
    return d;
  };
  after(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  it('keeps a random key in memory without a data directory', () => {
    for (const dataDir of [null, 'memory://']) {
      const a = loadSecretKey({ fromEnv: undefined, dataDir });
      const b = loadSecretKey({ fromEnv: undefined, dataDir });
      assert.equal(a.source, 'memory');
      assert.equal(a.key.length, 32);
      assert.notDeepEqual(a.key, b.key);
    }
  });

  it('creates the key file once, mode 0600, and reuses it', () => {
    const dataDir = join(tempDir(), 'nested', 'data');
    const first = loadSecretKey({ fromEnv: undefined, dataDir });
    assert.equal(first.source, 'file');
    assert.equal(first.key.length, 32);
    const path = join(dataDir, SECRET_KEY_FILE);
    assert.equal(statSync(path).mode & 0o777, 0o600);
    const second = loadSecretKey({ fromEnv: undefined, dataDir });
    assert.deepEqual(second.key, first.key);
    // No temporary files are left behind.
    assert.deepEqual(readdirSync(dataDir), [SECRET_KEY_FILE]);
    // The file holds a value the environment variable accepts.
    const fromEnv = loadSecretKey({ fromEnv: readFileSync(path, 'utf8'), dataDir: null });
    assert.deepEqual(fromEnv.key, first.key);
  });

  it('prefers the environment variable to the file', () => {
    const dataDir = tempDir();
    loadSecretKey({ fromEnv: undefined, dataDir });
    const raw = randomBytes(32);
    const loaded = loadSecretKey({ fromEnv: raw.toString('hex'), dataDir });
    assert.equal(loaded.source, 'env');
    assert.deepEqual(loaded.key, raw);
  });

  it('treats an empty variable as unset', () => {
    assert.equal(loadSecretKey({ fromEnv: '', dataDir: null }).source, 'memory');
  });

  it('refuses a key file it cannot read as a key', () => {
    const dataDir = tempDir();
    writeFileSync(join(dataDir, SECRET_KEY_FILE), 'not a key\n', { mode: 0o600 });
    assert.throws(() => loadSecretKey({ fromEnv: undefined, dataDir }), /secret-key must hold/);
  });

  it('a value sealed under the file key opens after a reload', () => {
    const dataDir = tempDir();
    const sealed = new SecretBox(loadSecretKey({ fromEnv: undefined, dataDir }).key).seal(
      SEED,
      'user_1',
    );
    const reloaded = new SecretBox(loadSecretKey({ fromEnv: undefined, dataDir }).key);
    assert.equal(reloaded.open(sealed, 'user_1'), SEED);
  });
});
