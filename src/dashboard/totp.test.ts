import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { FakeClock } from '../runtime/clock.js';
import { newTotpSecret, totpCode, totpStep, totpUri, verifyTotp } from './totp.js';

// RFC 6238 appendix B: the SHA-1 seed is the ASCII string "12345678901234567890".
const RFC_SECRET = Buffer.from('12345678901234567890', 'ascii');
const RFC_SECRET_BASE32 = 'GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ';
const STEP_MS = 30_000;

describe('TOTP codes (RFC 6238 SHA-1 vectors, last 6 digits)', () => {
  const vectors: Array<[number, string]> = [
    [59, '287082'],
    [1111111109, '081804'],
    [1111111111, '050471'],
    [1234567890, '005924'],
    [2000000000, '279037'],
    [20000000000, '353130'],
  ];
  it('encodes the RFC seed as the expected base32', () => {
    assert.equal(
      newTotpSecret(() => RFC_SECRET),
      RFC_SECRET_BASE32,
    );
  });
  for (const [seconds, code] of vectors) {
    it(`T=${seconds}s gives ${code}`, () => {
      assert.equal(totpCode(RFC_SECRET_BASE32, seconds * 1000), code);
      const r = verifyTotp(RFC_SECRET_BASE32, code, seconds * 1000, null);
      assert.deepEqual(r, { ok: true, step: Math.floor(seconds / 30) });
    });
  }
});

describe('verifyTotp', () => {
  const secret = newTotpSecret();
  const clock = new FakeClock();
  // The middle of a step, so ±15 s stays inside it.
  clock.set(Math.floor(clock.now() / STEP_MS) * STEP_MS + STEP_MS / 2);
  const now = clock.now();
  const step = totpStep(now);
  const codeAt = (offsetSteps: number): string => totpCode(secret, now + offsetSteps * STEP_MS);

  it('accepts the current code and returns its step', () => {
    assert.deepEqual(verifyTotp(secret, codeAt(0), now, null), { ok: true, step });
  });

  it('accepts one step of drift either way, and reports the step the code belongs to', () => {
    assert.deepEqual(verifyTotp(secret, codeAt(-1), now, null), { ok: true, step: step - 1 });
    assert.deepEqual(verifyTotp(secret, codeAt(1), now, null), { ok: true, step: step + 1 });
  });

  it('refuses two steps of drift either way', () => {
    for (const offset of [-2, 2, -3, 3]) {
      const code = codeAt(offset);
      // A random code may collide with a neighbouring step's: skip that rare case.
      if ([-1, 0, 1].some((o) => codeAt(o) === code)) continue;
      assert.deepEqual(verifyTotp(secret, code, now, null), { ok: false }, `offset ${offset}`);
    }
  });

  it('follows the clock: a code stays valid until its next-but-one step', () => {
    const code = codeAt(0);
    const c = new FakeClock(now);
    c.advance(STEP_MS);
    assert.equal(verifyTotp(secret, code, c.now(), null).ok, true);
    c.advance(STEP_MS);
    assert.equal(verifyTotp(secret, code, c.now(), null).ok, false);
  });

  it('refuses a replayed code, and codes of steps at or before the last used', () => {
    const first = verifyTotp(secret, codeAt(0), now, null);
    assert.ok(first.ok);
    assert.deepEqual(verifyTotp(secret, codeAt(0), now, first.step), { ok: false });
    assert.deepEqual(verifyTotp(secret, codeAt(-1), now, first.step), { ok: false });
    // The next step's code is still good once.
    const next = verifyTotp(secret, codeAt(1), now, first.step);
    assert.deepEqual(next, { ok: true, step: step + 1 });
    assert.deepEqual(verifyTotp(secret, codeAt(1), now + STEP_MS, step + 1), { ok: false });
  });

  it('refuses everything when the last used step is beyond the window', () => {
    assert.deepEqual(verifyTotp(secret, codeAt(1), now, step + 1), { ok: false });
    assert.deepEqual(verifyTotp(secret, codeAt(0), now, step + 50), { ok: false });
  });

  it('accepts surrounding whitespace', () => {
    assert.equal(verifyTotp(secret, `  ${codeAt(0)}\n`, now, null).ok, true);
  });

  it('refuses anything but exactly 6 ASCII digits', () => {
    const code = codeAt(0);
    const bad = [
      '',
      '      ',
      code.slice(0, 5),
      code + '0',
      `${code.slice(0, 3)} ${code.slice(3)}`,
      `${code.slice(0, 3)}-${code.slice(3)}`,
      '12345a',
      '+12345',
      '-12345',
      '1e5000',
      // Arabic-Indic and full-width digits are digits to Unicode, not to us.
      code.replace(/[0-9]/g, (d) => String.fromCharCode(0x0660 + Number(d))),
      code.replace(/[0-9]/g, (d) => String.fromCharCode(0xff10 + Number(d))),
      '0'.repeat(10_000),
    ];
    for (const input of bad) {
      assert.deepEqual(verifyTotp(secret, input, now, null), { ok: false }, JSON.stringify(input));
    }
  });

  it('refuses another secret’s code', () => {
    const other = newTotpSecret();
    const code = totpCode(other, now);
    if ([-1, 0, 1].some((o) => codeAt(o) === code)) return;
    assert.deepEqual(verifyTotp(secret, code, now, null), { ok: false });
  });

  it('uses only the time it is given', () => {
    const past = Date.UTC(2001, 0, 1);
    const code = totpCode(secret, past);
    assert.equal(verifyTotp(secret, code, past, null).ok, true);
  });

  it('throws on a malformed secret (a bug, not user input)', () => {
    assert.throws(() => verifyTotp('not base32!', '123456', now, null));
    assert.throws(() => verifyTotp('AAAA', '123456', now, null));
  });
});

describe('newTotpSecret', () => {
  it('is 20 random bytes in unpadded base32', () => {
    const seen = new Set<string>();
    for (let i = 0; i < 100; i++) {
      const s = newTotpSecret();
      assert.match(s, /^[A-Z2-7]{32}$/);
      seen.add(s);
    }
    assert.equal(seen.size, 100);
  });
});

describe('totpUri', () => {
  it('is the otpauth URI authenticator apps scan', () => {
    const uri = new URL(totpUri(RFC_SECRET_BASE32, 'ann@example.com'));
    assert.equal(uri.protocol, 'otpauth:');
    assert.equal(uri.host, 'totp');
    assert.equal(decodeURIComponent(uri.pathname), '/Switchyard:ann@example.com');
    assert.equal(uri.searchParams.get('secret'), RFC_SECRET_BASE32);
    assert.equal(uri.searchParams.get('issuer'), 'Switchyard');
    // SHA-1, 6 digits and 30 s are the defaults apps assume when omitted.
    for (const p of ['algorithm', 'digits', 'period']) {
      const v = uri.searchParams.get(p);
      assert.ok(v === null || ['SHA1', '6', '30'].includes(v), `${p}=${v}`);
    }
  });

  it('encodes the issuer and account', () => {
    const uri = totpUri(RFC_SECRET_BASE32, 'ann b+c@example.com', 'Acme & Co');
    assert.ok(uri.startsWith('otpauth://totp/Acme%20%26%20Co:ann%20b%2Bc%40example.com?'), uri);
    assert.equal(new URL(uri).searchParams.get('issuer'), 'Acme & Co');
  });

  it('refuses a colon in the issuer or account', () => {
    assert.throws(() => totpUri(RFC_SECRET_BASE32, 'a:b@example.com'), /":"/);
    assert.throws(() => totpUri(RFC_SECRET_BASE32, 'ann@example.com', 'A:B'), /":"/);
  });
});
