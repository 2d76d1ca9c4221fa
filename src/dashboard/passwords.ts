/**
 * Dashboard passwords: the acceptance rule and the stored hash.
 *
 * Rule: 12 to 1024 characters (the spec recommends a 12-character minimum;
 * the upper bound only keeps a request from feeding megabytes to the hash).
 * Characters are Unicode code points of the NFKC form, so an emoji counts as
 * one character, not as the two UTF-16 units JavaScript's `length` sees.
 *
 * Hash: scrypt, a memory-hard function, so guessing passwords from a stolen
 * database costs memory as well as time on every try. A random 16-byte salt per
 * hash makes equal passwords hash differently. The stored string carries its
 * own parameters, `scrypt$N$r$p$<salt>$<hash>` (salt and hash in base64url), so
 * the cost can be raised later and old hashes still verify with the
 * parameters they were made with. Node's async `scrypt` runs on the libuv
 * pool: tens of milliseconds of work per call that must not stall the event loop.
 *
 * Passwords are NFKC-normalised before hashing: the same password typed on
 * another keyboard or OS (composed vs decomposed accents, full-width forms)
 * must still match.
 *
 * `verifyPassword` never throws on a bad stored string (a hand-edited or
 * truncated row): it answers false, and the login fails like any wrong
 * password. Parameters from the row are bounded before use, so a corrupted
 * row cannot ask for gigabytes of memory.
 */
import { randomBytes, scrypt, timingSafeEqual, type ScryptOptions } from 'node:crypto';

export const MIN_PASSWORD_LENGTH = 12;
export const MAX_PASSWORD_LENGTH = 1024;

const COST = { N: 16384, r: 8, p: 1 } as const;
const SALT_BYTES = 16;
const HASH_BYTES = 32;
/** Node refuses scrypt above `maxmem` (32 MiB by default); this bounds what a stored row may ask. */
const MAX_MEMORY = 256 * 1024 * 1024;

function normalise(password: string): string {
  return password.normalize('NFKC');
}

function codePoints(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

/** Null when the password is acceptable, else a message to show the user. */
export function passwordProblem(password: string): string | null {
  const n = codePoints(normalise(password));
  if (n < MIN_PASSWORD_LENGTH) {
    return `Password must be at least ${MIN_PASSWORD_LENGTH} characters long.`;
  }
  if (n > MAX_PASSWORD_LENGTH) {
    return `Password must be at most ${MAX_PASSWORD_LENGTH} characters long.`;
  }
  return null;
}

function derive(
  password: string,
  salt: Buffer,
  length: number,
  cost: { N: number; r: number; p: number },
): Promise<Buffer> {
  const options: ScryptOptions = { ...cost, maxmem: 2 * 128 * cost.N * cost.r };
  return new Promise((resolve, reject) => {
    scrypt(normalise(password), salt, length, options, (err, key) =>
      err ? reject(err) : resolve(key),
    );
  });
}

export async function hashPassword(password: string): Promise<string> {
  const salt = randomBytes(SALT_BYTES);
  const hash = await derive(password, salt, HASH_BYTES, COST);
  return [
    'scrypt',
    COST.N,
    COST.r,
    COST.p,
    salt.toString('base64url'),
    hash.toString('base64url'),
  ].join('$');
}

interface StoredHash {
  N: number;
  r: number;
  p: number;
  salt: Buffer;
  hash: Buffer;
}

function decimal(s: string | undefined, max: number): number | null {
  if (s === undefined || !/^[1-9][0-9]{0,9}$/.test(s)) return null;
  const n = Number(s);
  return n <= max ? n : null;
}

function bytes(s: string | undefined, min: number, max: number): Buffer | null {
  if (s === undefined || !/^[A-Za-z0-9_-]+$/.test(s)) return null;
  const b = Buffer.from(s, 'base64url');
  return b.length >= min && b.length <= max && b.toString('base64url') === s ? b : null;
}

function parseStored(stored: string): StoredHash | null {
  const parts = stored.split('$');
  if (parts.length !== 6 || parts[0] !== 'scrypt') return null;
  const N = decimal(parts[1], 2 ** 24);
  const r = decimal(parts[2], 64);
  const p = decimal(parts[3], 16);
  const salt = bytes(parts[4], 8, 64);
  const hash = bytes(parts[5], 16, 64);
  if (N === null || r === null || p === null || !salt || !hash) return null;
  // scrypt requires N to be a power of two above 1.
  if (N < 2 || (N & (N - 1)) !== 0) return null;
  if (128 * N * r > MAX_MEMORY / 2) return null;
  return { N, r, p, salt, hash };
}

/** False for a wrong password and for a stored string this module did not make. */
export async function verifyPassword(password: string, stored: string): Promise<boolean> {
  const parsed = parseStored(stored);
  if (!parsed) return false;
  const { salt, hash, ...cost } = parsed;
  const candidate = await derive(password, salt, hash.length, cost);
  return timingSafeEqual(candidate, hash);
}
