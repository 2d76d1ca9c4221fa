/**
 * The Redis backend (REDIS_URL set): every acquire is one EVALSHA of one Lua
 * script over all the rules' keys (script.ts), so any number of router
 * instances sharing a Redis enforce one limit exactly, in one round trip.
 * Every key written carries a PEXPIRE ending when its state is equivalent to
 * no state, so Redis memory is bounded by the keys active within a window.
 *
 * Errors (Redis unreachable, timeouts) reject the returned promise; whether
 * to fail open or closed is the caller's policy, per limit type.
 */
import type { Redis } from 'ioredis';
import { ACQUIRE_LUA, ADD_LUA, RELEASE_LUA } from './script.js';
import { toAmount, toBucket, toMs, validateRules, validateSumArgs } from './rules.js';
import type { Decision, LimiterBackend, Rule, RuleKind } from './types.js';

const ACQUIRE = 'swyRateLimitAcquire';
const ADD = 'swyRateLimitAdd';
const RELEASE = 'swyRateLimitRelease';

type ScriptCall = (this: Redis, numKeys: number, ...args: (string | number)[]) => Promise<unknown>;

function isScriptCall(v: unknown): v is ScriptCall {
  return typeof v === 'function';
}

/** Connections that already carry the commands (defineCommand is per connection). */
const defined = new WeakSet<Redis>();

/** The command ioredis built from defineCommand (EVALSHA, with EVAL on NOSCRIPT). */
function command(redis: Redis, name: string): ScriptCall {
  if (!defined.has(redis)) {
    redis.defineCommand(ACQUIRE, { lua: ACQUIRE_LUA });
    redis.defineCommand(ADD, { lua: ADD_LUA });
    redis.defineCommand(RELEASE, { lua: RELEASE_LUA });
    defined.add(redis);
  }
  const fn: unknown = Reflect.get(redis, name);
  if (!isScriptCall(fn)) throw new Error(`ioredis did not define ${name}`);
  return fn;
}

const KIND_CODE: Record<RuleKind, string> = { burst: 'b', window: 'w', sum: 's' };

function parseReply(reply: unknown, n: number): Decision[] {
  if (!Array.isArray(reply) || reply.length !== n * 5) {
    throw new Error('rate-limit script returned an unexpected reply');
  }
  const out = new Array<Decision>(n);
  for (let i = 0; i < n; i++) {
    const f = reply.slice(i * 5, i * 5 + 5).map((x: unknown) => {
      if (typeof x !== 'number') throw new Error('rate-limit script returned a non-integer');
      return x;
    });
    out[i] = {
      allowed: f[0] === 1,
      limit: f[1]!,
      remaining: f[2]!,
      resetMs: f[3]!,
      retryAfterMs: f[4]!,
    };
  }
  return out;
}

export class RedisLimiter implements LimiterBackend {
  private readonly acquireCmd: ScriptCall;
  private readonly addCmd: ScriptCall;
  private readonly releaseCmd: ScriptCall;

  constructor(
    private readonly redis: Redis,
    private readonly prefix = 'swy:rl:',
  ) {
    this.acquireCmd = command(redis, ACQUIRE);
    this.addCmd = command(redis, ADD);
    this.releaseCmd = command(redis, RELEASE);
  }

  async acquire(rules: readonly Rule[], nowMs: number): Promise<Decision[]> {
    validateRules(rules);
    const now = toMs(nowMs);
    const n = rules.length;
    if (n === 0) return [];
    const keys: string[] = [];
    const args: (string | number)[] = [now];
    for (const r of rules) {
      const code = KIND_CODE[r.kind];
      // Distinct key spaces per kind: 'w:x' and 'wt:x' differ at their second
      // character, so no user key can make one kind's key equal another's.
      keys.push(`${this.prefix}${code}:${r.key}`, `${this.prefix}${code}t:${r.key}`);
      args.push(code, r.limit, r.kind === 'burst' ? r.burst : 0, r.windowMs);
    }
    const reply = await this.acquireCmd.call(this.redis, keys.length, ...keys, ...args);
    return parseReply(reply, n);
  }

  async add(key: string, amount: number, windowMs: number, nowMs: number): Promise<void> {
    validateSumArgs(key, windowMs);
    const a = toAmount(amount);
    const now = toMs(nowMs);
    if (a === 0) return;
    await this.addCmd.call(
      this.redis,
      2,
      `${this.prefix}s:${key}`,
      `${this.prefix}st:${key}`,
      now,
      a,
      windowMs,
    );
  }

  async release(key: string, windowMs: number, atMs: number, nowMs: number): Promise<void> {
    validateSumArgs(key, windowMs);
    const q = toBucket(atMs);
    const now = toMs(nowMs);
    await this.releaseCmd.call(
      this.redis,
      2,
      `${this.prefix}w:${key}`,
      `${this.prefix}wt:${key}`,
      now,
      q,
      windowMs,
    );
  }

  /** Nothing to release: the connection belongs to whoever handed it over. */
  async close(): Promise<void> {}
}
