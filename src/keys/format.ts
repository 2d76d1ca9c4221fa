/**
 * API key format: `swy_<project_slug>_<token>`, the token being 32 bytes of
 * `crypto.randomBytes` in base64url (43 characters, 256 bits). Project slugs
 * never contain `_`, so a key splits unambiguously. Only the SHA-256 of the
 * whole value and a short display prefix are ever stored.
 */
import crypto, { createHash, randomBytes } from 'node:crypto';

export const KEY_PREFIX = 'swy';
export const TOKEN_BYTES = 32;
const TOKEN_CHARS = 43; // base64url of 32 bytes, unpadded
/** Characters of the token shown in the display prefix. */
const DISPLAY_TOKEN_CHARS = 4;

export const SLUG_PATTERN = /^[a-z0-9](?:[a-z0-9-]{0,62})$/;
const KEY_PATTERN = /^swy_([a-z0-9][a-z0-9-]{0,62})_([A-Za-z0-9_-]{43})$/;

export interface ParsedKey {
  projectSlug: string;
  token: string;
}

export function generateKey(
  projectSlug: string,
  random: (n: number) => Buffer = randomBytes,
): { value: string; hash: string; prefix: string } {
  if (!SLUG_PATTERN.test(projectSlug)) throw new Error(`invalid project slug: ${projectSlug}`);
  const token = random(TOKEN_BYTES).toString('base64url');
  const value = `${KEY_PREFIX}_${projectSlug}_${token}`;
  return { value, hash: hashKey(value), prefix: displayPrefix(projectSlug, token) };
}

export function displayPrefix(projectSlug: string, token: string): string {
  return `${KEY_PREFIX}_${projectSlug}_${token.slice(0, DISPLAY_TOKEN_CHARS)}`;
}

/** Null when the value cannot be a Switchyard key (checked before any lookup). */
export function parseKey(value: string): ParsedKey | null {
  if (value.length > 4 + 64 + 1 + TOKEN_CHARS) return null;
  const m = KEY_PATTERN.exec(value);
  if (!m) return null;
  return { projectSlug: m[1]!, token: m[2]! };
}

/** Node's one-shot digest (20.12+): a third of `createHash` per call, on every request. */
const oneShot = (crypto as { hash?: (alg: string, data: string, enc: 'hex') => string }).hash;

export function hashKey(value: string): string {
  return oneShot
    ? oneShot('sha256', value, 'hex')
    : createHash('sha256').update(value, 'utf8').digest('hex');
}

/** Extracts the bearer token from an Authorization header value. */
export function bearerToken(header: string | undefined): string | null {
  if (!header) return null;
  // RFC 7235: the scheme is case-insensitive.
  if (header.length < 8 || header.slice(0, 7).toLowerCase() !== 'bearer ') return null;
  const token = header.slice(7).trim();
  return token === '' ? null : token;
}
