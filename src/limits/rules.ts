/**
 * Boundary checks for rules and times, shared by both backends so they reject
 * exactly the same inputs. Cheap enough for the hot path: a few comparisons
 * per rule and a pairwise duplicate check over a handful of rules.
 */
import type { Rule } from './types.js';

/**
 * Products of a rule's numbers (e.g. (burst + 1) * windowMs GCRA ticks) stay
 * below this, so the integer arithmetic in doubles (JS and Redis Lua alike)
 * is exact.
 */
const MAX_EXACT = 2 ** 48;

function positiveInt(n: number): boolean {
  return Number.isSafeInteger(n) && n >= 1;
}

export function validateRule(r: Rule): void {
  if (typeof r.key !== 'string' || r.key.length === 0) {
    throw new RangeError('rate-limit rule needs a non-empty key');
  }
  if (!positiveInt(r.limit) || !positiveInt(r.windowMs)) {
    throw new RangeError(
      `rate-limit rule ${r.kind}:${r.key}: limit and windowMs must be integers >= 1`,
    );
  }
  switch (r.kind) {
    case 'burst':
      if (!Number.isSafeInteger(r.burst) || r.burst < 0) {
        throw new RangeError(`rate-limit rule burst:${r.key}: burst must be an integer >= 0`);
      }
      if ((r.burst + 1) * r.windowMs > MAX_EXACT || r.limit > MAX_EXACT / r.windowMs) {
        throw new RangeError(`rate-limit rule burst:${r.key}: numbers too large`);
      }
      return;
    case 'window':
    case 'sum':
      if (r.limit > MAX_EXACT)
        throw new RangeError(`rate-limit rule ${r.kind}:${r.key}: limit too large`);
      return;
    default:
      throw new RangeError(
        `unknown rate-limit rule kind: ${(r as { kind: unknown }).kind as string}`,
      );
  }
}

/** Validates every rule and that no (kind, key) appears twice: all-or-nothing evaluates each rule against the state before the request, so a repeated key would be checked twice against the same count. */
export function validateRules(rules: readonly Rule[]): void {
  for (let i = 0; i < rules.length; i++) {
    const r = rules[i]!;
    validateRule(r);
    for (let j = 0; j < i; j++) {
      const o = rules[j]!;
      if (o.key === r.key && o.kind === r.kind) {
        throw new RangeError(`rate-limit rule ${r.kind}:${r.key} appears twice in one acquire`);
      }
    }
  }
}

/** The limiter works in whole milliseconds; fractions are dropped so both backends agree bit for bit. */
export function toMs(nowMs: number): number {
  if (!Number.isFinite(nowMs)) throw new RangeError('nowMs must be a finite number');
  return Math.floor(nowMs);
}

/** Usage amounts are whole units; fractions round up (never under-count). */
export function toAmount(amount: number): number {
  if (!Number.isFinite(amount) || amount < 0) {
    throw new RangeError('amount must be a finite number >= 0');
  }
  const a = Math.ceil(amount);
  if (a > MAX_EXACT) throw new RangeError('amount too large');
  return a;
}

/** A release's bucket: a whole ms, as every bucket is. */
export function toBucket(atMs: number): number {
  if (!Number.isSafeInteger(atMs)) throw new RangeError('atMs must be a whole number of ms');
  return atMs;
}

export function validateSumArgs(key: string, windowMs: number): void {
  if (typeof key !== 'string' || key.length === 0)
    throw new RangeError('sum key must be non-empty');
  if (!positiveInt(windowMs)) throw new RangeError('windowMs must be an integer >= 1');
}
