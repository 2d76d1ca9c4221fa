/**
 * Secrets of the execution surface. Both are 32 crypto-random bytes in
 * base64url (43 characters, 256 bits) behind a literal prefix; only the
 * SHA-256 hex of the whole value is stored, plus a short display prefix.
 * - join keys `swyjk_<token>`: enroll agents (management API, shown once);
 * - user tokens `swyu_<token>`: a person's bearer token for approval
 *   decisions (operator API, shown once).
 */
import { randomBytes } from 'node:crypto';
import { sha256Hex } from './canonical.js';

const TOKEN = /^[A-Za-z0-9_-]{43}$/;

function make(prefix: string): { value: string; hash: string; prefix: string } {
  const token = randomBytes(32).toString('base64url');
  const value = `${prefix}_${token}`;
  return { value, hash: sha256Hex(value), prefix: `${prefix}_${token.slice(0, 4)}` };
}

function parse(prefix: string, value: string): string | null {
  if (!value.startsWith(`${prefix}_`)) return null;
  return TOKEN.test(value.slice(prefix.length + 1)) ? sha256Hex(value) : null;
}

export const JOIN_KEY_PREFIX = 'swyjk';
export const USER_TOKEN_PREFIX = 'swyu';

export const generateJoinKey = () => make(JOIN_KEY_PREFIX);
export const generateUserToken = () => make(USER_TOKEN_PREFIX);

/** The hash to look up, or null when the value cannot be a join key. */
export const joinKeyHash = (value: string) => parse(JOIN_KEY_PREFIX, value);
export const userTokenHash = (value: string) => parse(USER_TOKEN_PREFIX, value);
