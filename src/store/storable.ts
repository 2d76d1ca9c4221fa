/**
 * Text PostgreSQL can store. Its text and jsonb hold no U+0000, and jsonb no lone
 * UTF-16 surrogate (JSON.stringify writes one as `\ud800`, which jsonb refuses). What
 * a client sends is refused by name (src/http/json-body.ts); what a worker answers
 * was already sent as it was, so the stored copy keeps U+FFFD in its place.
 */

/**
 * Escapes that decode to what PostgreSQL cannot store may be in this JSON text:
 * `\u0000`, or a UTF-16 surrogate (paired or lone; the decoded strings tell).
 */
export const UNSTORABLE_ESCAPE = /\\u(?:0000|[dD][89a-fA-F])/;

/**
 * Every escape in JSON text, left to right (each backslash of valid JSON starts
 * one, so `\\` is consumed whole and never read as the start of another): first
 * a surrogate pair (kept), then U+0000 or a lone surrogate (group `bad`), then every
 * other escape (kept).
 */
const ESCAPE =
  /\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|(?<bad>u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2}))|u[0-9a-fA-F]{4}|[^u])/g;

/**
 * JSON text that PostgreSQL's jsonb accepts: every U+0000 and every lone UTF-16
 * surrogate (escapes, as JSON.stringify writes both: `\u0000`, `\ud800`) becomes
 * U+FFFD. A text without one is returned as is.
 */
export function storableJson(json: string): string {
  if (!UNSTORABLE_ESCAPE.test(json)) return json;
  return json.replace(ESCAPE, (m: string, ...rest: unknown[]) =>
    (rest.at(-1) as { bad?: string }).bad === undefined ? m : '\\ufffd',
  );
}

/**
 * A JSON value as `storableJson` would store it: the same value when it holds no
 * U+0000 or lone surrogate (one serialisation to tell), else a repaired copy.
 */
export function storableValue<T>(value: T): T {
  const json = JSON.stringify(value);
  return UNSTORABLE_ESCAPE.test(json) ? (JSON.parse(storableJson(json)) as T) : value;
}
