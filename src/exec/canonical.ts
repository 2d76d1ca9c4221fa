/**
 * Canonical JSON (RFC 8785 style) and its SHA-256, used for `manifest_hash`
 * and for the request hash behind `Idempotency-Key`:
 * - object keys sorted by UTF-16 code units (JavaScript's default sort, as
 *   RFC 8785 says), recursively; members whose value is `undefined` dropped;
 * - arrays keep their order;
 * - no whitespace; strings and numbers serialised as `JSON.stringify` does
 *   (the ECMAScript number form RFC 8785 adopts);
 * - the text hashed as UTF-8; the digest written as 64 lowercase hex digits.
 * Two values that are equal as JSON data therefore hash the same whatever
 * key order or spacing they arrived with.
 */
import { createHash } from 'node:crypto';

export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') {
    const s = JSON.stringify(value);
    if (s === undefined) throw new TypeError('not representable as JSON');
    return s;
  }
  if (Array.isArray(value)) {
    return `[${value.map((v) => (v === undefined ? 'null' : canonicalJson(v))).join(',')}]`;
  }
  const obj = value as Record<string, unknown>;
  const parts: string[] = [];
  for (const k of Object.keys(obj).sort()) {
    const v = obj[k];
    if (v === undefined) continue;
    parts.push(`${JSON.stringify(k)}:${canonicalJson(v)}`);
  }
  return `{${parts.join(',')}}`;
}

export function sha256Hex(text: string): string {
  return createHash('sha256').update(text, 'utf8').digest('hex');
}

/** SHA-256 hex of the canonical JSON of `value`. */
export function canonicalHash(value: unknown): string {
  return sha256Hex(canonicalJson(value));
}
