/**
 * The service logger (pino). Secrets never reach a log line: Authorization
 * headers, API keys, webhook secrets, operator tokens and TOTP seeds are
 * redacted by path, wherever they appear in a logged object.
 */
import {
  pino,
  type Bindings,
  type ChildLoggerOptions,
  type DestinationStream,
  type LogFn,
  type Logger,
} from 'pino';

export const REDACT_PATHS = [
  'req.headers.authorization',
  'req.headers.cookie',
  'req.headers["x-csrf-token"]',
  'headers.authorization',
  'authorization',
  'key',
  'apiKey',
  'api_key',
  'token',
  'secret',
  'adminToken',
  'totp_secret',
  'totpSecret',
  '*.key',
  '*.apiKey',
  '*.api_key',
  '*.token',
  '*.secret',
  '*.adminToken',
  '*.totp_secret',
  '*.totpSecret',
  '*.authorization',
];

/**
 * A secret's shape as it would appear in a URL path: API keys (`swy_…`), exec join
 * keys and user tokens (`swyjk…`, `swyu…`), webhook secrets (`whsec_…`). A client
 * that puts one in a path (by mistake, or probing) must not have it logged.
 */
const SECRET_IN_PATH = /(?:swy|whsec_)[A-Za-z0-9_-]{16,}/g;

/** A request URL as logged: no query string, no secret-shaped path segment. */
export function logUrl(url: string): string {
  const path = url.split('?', 1)[0]!;
  return path.includes('swy') || path.includes('whsec_')
    ? path.replace(SECRET_IN_PATH, '[REDACTED]')
    : path;
}

export function createLogger(
  level: string,
  destination?: DestinationStream,
  service = 'switchyard',
): Logger {
  let dest = destination;
  if (!dest) {
    // Buffered, asynchronous stdout: one write per 4 KiB instead of one syscall per
    // line (per-request access logs cost ~8% of a core at thousands of req/s when
    // written synchronously). Flushed on exit so the last lines are not lost.
    const boom = pino.destination({ dest: 1, minLength: 4096, sync: false });
    process.once('exit', () => {
      try {
        boom.flushSync();
      } catch {
        // stdout already closed: nothing more can be written anyway.
      }
    });
    dest = boom;
  }
  return pino(
    {
      level,
      base: { service },
      redact: { paths: REDACT_PATHS, censor: '[REDACTED]' },
    },
    dest,
  );
}

export type { Logger };

type LevelName = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace';
type LogArgs = Parameters<LogFn>;

/**
 * Fastify's per-request logger (`request.log`), made only when a line is written.
 * Fastify builds a pino child for every request, and pino serialises the child's
 * bindings through the wildcard redaction above: about 6 % of every byte the router
 * allocated per chat completion (heap-sampled at 1,000 req/s), for a logger most
 * requests never write to. This stands in for it with the same methods and makes
 * the real child (same bindings, same options) on the first line at an enabled level.
 */
export class LazyRequestLogger {
  private real: Logger | null = null;

  constructor(
    private readonly parent: Logger,
    private readonly bindings: Bindings,
    private readonly opts: ChildLoggerOptions,
  ) {}

  private get logger(): Logger {
    return (this.real ??= this.parent.child(this.bindings, this.opts));
  }

  get level(): string {
    return this.real?.level ?? this.opts.level ?? this.parent.level;
  }

  set level(level: string) {
    this.logger.level = level;
  }

  isLevelEnabled(level: string): boolean {
    if (this.real) return this.real.isLevelEnabled(level);
    const values = this.parent.levels.values;
    const min = values[this.level];
    const at = values[level];
    return min !== undefined && at !== undefined && at >= min;
  }

  private write(level: LevelName, args: LogArgs): void {
    if (!this.isLevelEnabled(level)) return;
    (this.logger[level] as (...a: LogArgs) => void)(...args);
  }

  fatal(...args: LogArgs): void {
    this.write('fatal', args);
  }
  error(...args: LogArgs): void {
    this.write('error', args);
  }
  warn(...args: LogArgs): void {
    this.write('warn', args);
  }
  info(...args: LogArgs): void {
    this.write('info', args);
  }
  debug(...args: LogArgs): void {
    this.write('debug', args);
  }
  trace(...args: LogArgs): void {
    this.write('trace', args);
  }
  silent(): void {}

  child(bindings: Bindings, options?: ChildLoggerOptions): Logger {
    return this.logger.child(bindings, options);
  }
}
