/**
 * The limiter's vocabulary: rules in, decisions out. Both backends (memory,
 * Redis) implement `LimiterBackend` and are held to one contract suite.
 */

export type Rule =
  /**
   * Tier limit: sustained `limit` per `windowMs`, plus `burst` extra capacity.
   * In any sliding window of windowMs at most limit + burst are admitted; after
   * a quiet period a client can send burst + 1 at once; sustained rate is
   * limit / windowMs. Algorithm: GCRA (see index.ts).
   */
  | { kind: 'burst'; key: string; limit: number; burst: number; windowMs: number }
  /**
   * Rolling window: at most `limit` admitted in any window of `windowMs`
   * (per-key quota, endpoint requests per minute, the per-project management
   * limit). Algorithm: sliding-window log (see index.ts).
   */
  | { kind: 'window'; key: string; limit: number; windowMs: number }
  /**
   * Rolling sum (tokens per minute): denied while the sum added in the last
   * windowMs is >= limit. Admission adds nothing; `add()` adds usage afterwards.
   */
  | { kind: 'sum'; key: string; limit: number; windowMs: number };

export type RuleKind = Rule['kind'];

export interface Decision {
  /** This rule's verdict. */
  allowed: boolean;
  /**
   * The limit as clients should see it: the most `remaining` can be. For 'burst': burst + 1,
   * what a full bucket admits at once (the sustained rate is the rule's `limit` per
   * windowMs); for 'sum': units, e.g. tokens.
   */
  limit: number;
  /**
   * Admissions left now (>= 0): after this request when it was admitted,
   * otherwise without it. For 'sum' it is units left (limit - current sum).
   */
  remaining: number;
  /**
   * Ms until `remaining` is back to `limit` absent other traffic: every counted entry
   * expired / the bucket full again.
   */
  resetMs: number;
  /** 0 when allowed; else ms until this rule would admit one request (exact, absent other traffic). */
  retryAfterMs: number;
}

export interface LimiterBackend {
  /**
   * All-or-nothing across rules: the request is counted against every rule
   * only if every rule allows it; otherwise nothing is counted. Returns one
   * Decision per rule, in the same order. Rules must have distinct
   * (kind, key) pairs; an invalid rule throws (or rejects) a RangeError.
   */
  acquire(rules: readonly Rule[], nowMs: number): Promise<Decision[]> | Decision[];
  /** Adds `amount` (whole units; fractions round up) to a 'sum' rule's key at nowMs. */
  add(key: string, amount: number, windowMs: number, nowMs: number): Promise<void> | void;
  /**
   * Gives back one admission of the 'window' rule `key`: the one counted in bucket
   * `atMs`, which is `nowMs + resetMs - windowMs` of the decision that admitted it
   * (both backends report exactly that). Nothing happens when that bucket has
   * expired or holds nothing. Atomic like `acquire`: with Redis, instances giving
   * back and acquiring at once never see a half-done release.
   */
  release(key: string, windowMs: number, atMs: number, nowMs: number): Promise<void> | void;
  /** Releases the backend's own resources (never a connection it was handed). */
  close(): Promise<void>;
}
