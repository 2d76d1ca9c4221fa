/**
 * The Redis connections used when `REDIS_URL` is set (rate limits, cache
 * invalidation). Without it every such concern runs in-process.
 *
 * Faults: the service's command connection has no offline queue, so commands
 * fail fast while Redis is unreachable and callers decide at once whether to
 * fail open or closed; ioredis keeps reconnecting in the background. Connection errors are
 * logged (at most once per 10 s per connection), never thrown at the process.
 */
import { Redis } from 'ioredis';
import type { Logger } from '../runtime/logger.js';

/**
 * A command that gets no answer in this long fails. Without a bound, a partition
 * that drops packets without resetting the connection (no RST) held every request
 * that asked the limiter for as long as it lasted (30 s in a test); the kernel's
 * keepalive, every 10 s, then finds the dead connection and ioredis reconnects.
 */
export const REDIS_COMMAND_TIMEOUT_MS = 500;

export function connectRedis(
  url: string,
  opts: {
    lazy?: boolean;
    offlineQueue?: boolean;
    logger?: Logger;
    name?: string;
    /** Commands only (the pub/sub connection waits for messages, not answers). */
    commandTimeoutMs?: number;
  } = {},
): Redis {
  const r = new Redis(url, {
    lazyConnect: opts.lazy ?? false,
    maxRetriesPerRequest: 1,
    enableOfflineQueue: opts.offlineQueue ?? true,
    connectTimeout: 2000,
    keepAlive: 10_000,
    ...(opts.commandTimeoutMs ? { commandTimeout: opts.commandTimeoutMs } : {}),
    // Reconnect quickly at first, then at most every 2 s.
    retryStrategy: (times) => Math.min(times * 100, 2000),
  });
  let lastLog = 0;
  r.on('error', (err: Error) => {
    const now = Date.now();
    if (now - lastLog < 10_000) return;
    lastLog = now;
    opts.logger?.warn({ err: err.message, connection: opts.name }, 'redis connection error');
  });
  return r;
}

/** Resolves when the connection is ready, or false after `ms`. */
export function redisReady(r: Redis, ms: number): Promise<boolean> {
  if (r.status === 'ready') return Promise.resolve(true);
  return new Promise((resolve) => {
    const t = setTimeout(() => {
      r.off('ready', onReady);
      resolve(false);
    }, ms);
    const onReady = () => {
      clearTimeout(t);
      resolve(true);
    };
    r.once('ready', onReady);
  });
}

export type { Redis };
