/**
 * GCRA (generic cell rate algorithm) for 'burst' rules, as pure functions over
 * plain numbers. The Redis script (script.ts) repeats these formulas line for
 * line; the contract suite checks the two agree.
 *
 * Exact arithmetic: the emission interval T = windowMs / limit ms is rarely a
 * whole number (60 000 / 64 = 937.5), and doubles near 1.7e12 ms carry only
 * about 1/4096 ms of precision, enough for rounding to flip an exact
 * retry-after by a millisecond. So time is counted in ticks of 1/limit ms:
 * T = windowMs ticks and the tolerance tau = burst * T = burst * windowMs
 * ticks, both integers. The theoretical arrival time (TAT) is stored as whole
 * ms plus a remainder in ticks; only the debt (TAT - now, in ticks, bounded by
 * roughly (burst + 1) * windowMs) is ever multiplied out.
 */
import type { Decision } from './types.js';

/** TAT = tatMs + tatRem / den ms; den is the rule's limit when written. */
export interface GcraState {
  tatMs: number;
  tatRem: number;
  den: number;
}

/**
 * Ticks (1/limit ms) from nowMs until the TAT; 0 when the TAT is not in the
 * future (the state is then the same as no state).
 */
export function gcraDebt(s: Readonly<GcraState> | undefined, limit: number, nowMs: number): number {
  if (s === undefined) return 0;
  let ms = s.tatMs;
  let rem = s.tatRem;
  if (s.den !== limit) {
    // The limit changed since this TAT was written: its remainder is in other
    // ticks. Rounding the TAT up to a whole ms is conservative by < 1 ms.
    if (rem > 0) ms += 1;
    rem = 0;
  }
  if (ms < nowMs) return 0;
  return (ms - nowMs) * limit + rem;
}

/** Conforming iff TAT - now <= tau. */
export function gcraAllows(debt: number, burst: number, windowMs: number): boolean {
  return debt <= burst * windowMs;
}

/**
 * The decision for a request seen with `debt`; `admitted` says whether it was
 * counted (all rules allowed), which moves the TAT one interval on.
 */
export function gcraDecision(
  debt: number,
  limit: number,
  burst: number,
  windowMs: number,
  admitted: boolean,
): Decision {
  const tau = burst * windowMs;
  const d = admitted ? debt + windowMs : debt;
  // k more requests now conform while d + (k - 1) * T <= tau.
  const remaining = Math.max(0, Math.floor((tau - d) / windowMs) + 1);
  const allowed = debt <= tau;
  return {
    allowed,
    // What a full bucket admits at once: remaining runs from here down to 0.
    limit: burst + 1,
    remaining,
    resetMs: Math.ceil(d / limit),
    // The earliest now' with TAT - now' <= tau, rounded up to a whole ms.
    retryAfterMs: allowed ? 0 : Math.ceil((debt - tau) / limit),
  };
}

/** The state after admitting one request at nowMs: TAT = max(TAT, now) + T. */
export function gcraNext(debt: number, limit: number, windowMs: number, nowMs: number): GcraState {
  const d = debt + windowMs;
  const whole = Math.floor(d / limit);
  return { tatMs: nowMs + whole, tatRem: d - whole * limit, den: limit };
}

/** The first ms at which the state equals no state (for sweeps and PEXPIRE). */
export function gcraExpiresAt(s: Readonly<GcraState>): number {
  return s.tatRem > 0 ? s.tatMs + 1 : s.tatMs;
}
