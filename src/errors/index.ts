import { catalogue, type ErrorCode, type ErrorType } from './catalogue.js';

export { catalogue, type ErrorCode, type ErrorType } from './catalogue.js';

export interface ErrorEnvelope {
  error: {
    message: string;
    type: ErrorType;
    code: ErrorCode;
    param: string | null;
    [extra: string]: unknown;
  };
}

/** An error with a catalogue code; the HTTP layer renders it as the spec's envelope. */
export class ServiceError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly type: ErrorType;
  readonly retryable: boolean;
  readonly param: string | null;
  /** Extra fields inside `error` (e.g. `retry_after`, `retry_strategy`). */
  readonly extra: Record<string, unknown> | undefined;
  /** Extra response headers (e.g. `Retry-After`). */
  readonly headers: Record<string, string> | undefined;

  constructor(
    code: ErrorCode,
    opts: {
      message?: string;
      param?: string | null;
      extra?: Record<string, unknown>;
      headers?: Record<string, string>;
      cause?: unknown;
      /**
       * Overrides the catalogue status where the spec gives a code two statuses
       * (`exec_tool_not_found`: 404 on the catalog read route, 400 as an
       * invocation target). Nothing else may use it.
       */
      status?: number;
    } = {},
  ) {
    const spec = catalogue[code];
    super(
      opts.message ?? spec.message,
      opts.cause === undefined ? undefined : { cause: opts.cause },
    );
    this.name = 'ServiceError';
    this.code = code;
    this.status = opts.status ?? spec.status;
    this.type = spec.type;
    this.retryable = spec.retryable;
    this.param = opts.param ?? null;
    this.extra = opts.extra;
    this.headers = opts.headers;
  }

  toEnvelope(): ErrorEnvelope {
    return {
      error: {
        message: this.message,
        type: this.type,
        code: this.code,
        param: this.param,
        ...this.extra,
      },
    };
  }
}

export function serviceError(
  code: ErrorCode,
  message?: string,
  param?: string | null,
): ServiceError {
  return new ServiceError(code, { message, param: param ?? null });
}
