/**
 * Backup codes: one-time codes a user types in place of a TOTP code when the
 * phone is lost. This module makes and hashes them; storing the hashes,
 * spending each one once and discarding the lot on regeneration belong to
 * the caller's database code.
 *
 * Shape: `xxxxx-xxxxx`, ten characters from a 31-symbol alphabet of digits
 * and lowercase letters without 0, o, 1, i and l, which are misread when
 * copied from paper. Ten symbols give 10 × log2(31) ≈ 49.5 bits: eight would
 * fall just short of the 40 bits asked for. Each symbol comes from
 * `crypto.randomInt`, which rejects out-of-range draws instead of taking a
 * modulo, so every symbol is equally likely.
 *
 * Only a SHA-256 of the normalised code is stored. A fast unsalted hash
 * suffices because the codes are random, not chosen by people, and only ever
 * stand in for the second factor behind a password. Normalising (lowercase,
 * no whitespace or hyphens) lets a user type `ABCDE FGHJK` or `abcdefghjk`.
 */
import { createHash, randomInt } from 'node:crypto';

export const BACKUP_CODE_COUNT = 10;
export const BACKUP_CODE_ALPHABET = '23456789abcdefghjkmnpqrstuvwxyz';
const GROUP = 5;
const SYMBOLS = 2 * GROUP;

const NORMALISED_PATTERN = new RegExp(`^[${BACKUP_CODE_ALPHABET}]{${SYMBOLS}}$`);

function normalise(input: string): string {
  return input.toLowerCase().replace(/[\s-]/g, '');
}

export function backupCodeHash(code: string): string {
  return createHash('sha256').update(normalise(code), 'utf8').digest('hex');
}

/**
 * True when the input, normalised, has the shape of a backup code; a 6-digit
 * TOTP code never does (it is too short), so a login form needs one field.
 */
export function looksLikeBackupCode(input: string): boolean {
  return NORMALISED_PATTERN.test(normalise(input));
}

/**
 * A fresh set: `codes` to show the user once, `hashes` (same order) to store.
 * `randomIndex(n)` returns a uniform integer in [0, n); injectable for tests.
 */
export function newBackupCodes(randomIndex: (n: number) => number = randomInt): {
  codes: string[];
  hashes: string[];
} {
  const codes = new Set<string>();
  // A repeat within one set is astronomically unlikely, but it would leave the
  // user fewer codes than shown, so draw again rather than assume; a source
  // that keeps repeating is broken, and looping on it forever would hide that.
  for (let draws = 0; codes.size < BACKUP_CODE_COUNT; draws++) {
    if (draws >= 2 * BACKUP_CODE_COUNT) throw new Error('random source keeps repeating');
    let s = '';
    for (let i = 0; i < SYMBOLS; i++) {
      const symbol = BACKUP_CODE_ALPHABET[randomIndex(BACKUP_CODE_ALPHABET.length)];
      if (symbol === undefined) throw new RangeError('random index out of range');
      s += symbol;
    }
    codes.add(`${s.slice(0, GROUP)}-${s.slice(GROUP)}`);
  }
  const list = [...codes];
  return { codes: list, hashes: list.map(backupCodeHash) };
}
