/**
 * TOTP second factor (RFC 6238), in the form every authenticator app accepts:
 * HMAC-SHA-1, 6 digits, 30-second steps, a base32 secret of 20 random bytes
 * (the 160 bits RFC 4226 recommends). otplib does the HOTP arithmetic and the
 * constant-time comparison; this module fixes its parameters and adds the
 * rules the dashboard needs.
 *
 * Verification accepts the current step and one either side, so a phone clock
 * up to about 30 s off still works, and no wider: each extra step is another
 * code an attacker may guess. A code whose step is at or before `lastUsedStep`
 * is refused, which makes each code usable once (a code seen over a shoulder
 * or replayed from a log is dead) and also refuses older codes after a newer
 * one was used. The caller stores the returned `step` as the new
 * `lastUsedStep`; verifying and storing it must be one atomic update, or two
 * concurrent logins could both spend the same code.
 *
 * Input is exactly 6 ASCII digits after trimming surrounding whitespace;
 * anything else is refused before any HMAC is computed. Time comes only from
 * the arguments, so tests and callers with an injected clock agree on it.
 */
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import type * as Otplib from 'otplib';

/**
 * otplib, loaded at the first TOTP operation: a router whose dashboard nobody
 * enrols in never needs it, and it is 1.0 MiB of V8 heap (idle router, heap used
 * after two collections; docs/BENCHMARKS.md). Its CommonJS build is the same API.
 */
let otplibModule: typeof Otplib | null = null;
function otplib(): typeof Otplib {
  otplibModule ??= createRequire(import.meta.url)('otplib') as typeof Otplib;
  return otplibModule;
}

const PARAMS = { algorithm: 'sha1', digits: 6, period: 30 } as const;
const PERIOD_MS = PARAMS.period * 1000;
const SECRET_BYTES = 20;
/** Steps accepted either side of the current one (clock drift). */
const DRIFT_STEPS = 1;
const CODE_PATTERN = /^[0-9]{6}$/;

/** A new secret: 20 random bytes in unpadded base32 (32 characters). */
export function newTotpSecret(random: (n: number) => Buffer = randomBytes): string {
  return new (otplib().ScureBase32Plugin)().encode(random(SECRET_BYTES), { padding: false });
}

/**
 * The `otpauth://totp/Issuer:account?secret=...&issuer=Issuer` URI an
 * authenticator app scans. Throws when the issuer or account contains `:`,
 * which apps read as the separator between the two.
 */
export function totpUri(secret: string, account: string, issuer = 'Switchyard'): string {
  if (issuer.includes(':') || account.includes(':')) {
    throw new Error('a TOTP issuer or account name cannot contain ":"');
  }
  return otplib().generateURI({ strategy: 'totp', issuer, label: account, secret, ...PARAMS });
}

/** The time step a Unix time in milliseconds falls in. */
export function totpStep(ms: number): number {
  return Math.floor(ms / PERIOD_MS);
}

function epochSeconds(ms: number): number {
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`invalid time: ${ms}`);
  return Math.floor(ms / 1000);
}

/** The code for the step `atMs` falls in (tests and tooling; never shown to users). */
export function totpCode(secret: string, atMs: number): string {
  return otplib().generateSync({ strategy: 'totp', secret, epoch: epochSeconds(atMs), ...PARAMS });
}

export type TotpVerification = { ok: true; step: number } | { ok: false };

/**
 * Checks a code typed by the user at `nowMs`. Throws only on a malformed
 * secret or time (a bug or a corrupted row, not user input).
 */
export function verifyTotp(
  secret: string,
  code: string,
  nowMs: number,
  lastUsedStep: number | null,
): TotpVerification {
  const epoch = epochSeconds(nowMs);
  const token = code.trim();
  if (!CODE_PATTERN.test(token)) return { ok: false };
  const newest = totpStep(nowMs) + DRIFT_STEPS;
  // otplib rejects an `afterTimeStep` beyond its window rather than answering
  // no; every step in the window is then already used.
  if (lastUsedStep !== null && lastUsedStep >= newest) return { ok: false };
  const result = otplib().verifySync({
    strategy: 'totp',
    secret,
    token,
    epoch,
    // In seconds: one period either side reaches exactly one step either side.
    epochTolerance: DRIFT_STEPS * PARAMS.period,
    afterTimeStep: lastUsedStep !== null && lastUsedStep >= 0 ? lastUsedStep : undefined,
    ...PARAMS,
  });
  if (!result.valid) return { ok: false };
  if (!('timeStep' in result)) throw new Error('otplib returned a HOTP result for TOTP');
  return { ok: true, step: result.timeStep };
}
