/**
 * Server-Sent Events framing for chat-completion streams, both directions.
 *
 * Reading (upstream worker -> router): `SseParser` is an incremental parser that
 * follows the WHATWG event-stream rules. Bytes arrive split anywhere, so:
 *  - decoding goes through one streaming `TextDecoder`, which holds back the bytes of
 *    an incomplete UTF-8 sequence until the rest arrives; a character is never
 *    emitted broken (a leading BOM is dropped, invalid bytes become U+FFFD);
 *  - lines end in `\n`, `\r\n` or a lone `\r`; a `\r` at the very end of a chunk is
 *    taken as a line end at once and a `\n` opening the next chunk is then skipped,
 *    so a `\r\n` split across chunks never yields an extra blank line (which would
 *    dispatch an event early);
 *  - `data:` lines of one event are joined with `\n`; `:` lines are comments
 *    (keep-alives); an event is dispatched on a blank line and only when it had
 *    data; `id:` and `retry:` are ignored (the router never reconnects upstream).
 * `[DONE]` is an ordinary event (`isDone` recognises it); the caller decides.
 * One deliberate leniency: at end of input, a pending event is dispatched even
 * without its closing blank line, because some upstreams close right after the
 * last `data:` line. A truncated final event can therefore surface; callers
 * parse its JSON and treat a failure as a broken upstream.
 *
 * Writing (router -> client): `sseData`, `SSE_DONE`, `SSE_KEEPALIVE` and
 * `sseError`, which renders the spec's mid-stream error event: `event: error`
 * with the error envelope as data. A timeout carries `type: timeout_error`; a
 * cancellation carries code `cancelled` and no `type` (spec, Errors envelope).
 */
import type { ServerResponse } from 'node:http';
import { catalogue, type ErrorCode } from '../errors/index.js';
import type { AbortLike } from '../runtime/cancel.js';

export interface SseEvent {
  /** The `event:` field; absent for the default (`message`) type. */
  event?: string;
  data: string;
}

export interface SseParserOptions {
  /**
   * Upper bound, in characters, on one undelimited line or one event's data. A
   * worker that never sends a line end must not grow the router's memory without
   * bound. Default 16 MiB.
   */
  maxEventChars?: number;
}

/** Thrown by `SseParser` when an upstream line or event exceeds `maxEventChars`. */
export class SseLimitError extends Error {
  constructor(limit: number) {
    super(`SSE line or event exceeds ${limit} characters`);
    this.name = 'SseLimitError';
  }
}

const LF = 10;
const COLON = 58;
const SPACE = 32;
const DEFAULT_MAX_EVENT_CHARS = 16 * 1024 * 1024;
/** Returned when a feed completes no event, so the common case allocates nothing. */
const NO_EVENTS: readonly SseEvent[] = Object.freeze([]);

export class SseParser {
  private readonly decoder = new TextDecoder('utf-8');
  private readonly maxEventChars: number;
  /** Decoded text after the last complete line. */
  private buf = '';
  /** The previous chunk ended in `\r`; drop a `\n` that opens the next text. */
  private skipLF = false;
  private data: string | undefined = undefined;
  private eventType: string | undefined = undefined;
  private ended = false;

  constructor(opts: SseParserOptions = {}) {
    this.maxEventChars = opts.maxEventChars ?? DEFAULT_MAX_EVENT_CHARS;
  }

  /** Feeds raw upstream bytes; returns the events they complete (often none). */
  feed(chunk: Uint8Array): readonly SseEvent[] {
    if (this.ended) throw new Error('SseParser.feed called after end()');
    return this.consume(this.decoder.decode(chunk, { stream: true }), false);
  }

  /** Signals end of input; flushes held-back bytes and dispatches a pending event. */
  end(): readonly SseEvent[] {
    if (this.ended) return NO_EVENTS;
    this.ended = true;
    return this.consume(this.decoder.decode(), true);
  }

  private consume(text: string, final: boolean): readonly SseEvent[] {
    if (this.skipLF && text.length > 0) {
      this.skipLF = false;
      if (text.charCodeAt(0) === LF) text = text.slice(1);
    }
    const buf = this.buf.length === 0 ? text : this.buf + text;
    const len = buf.length;
    let out: SseEvent[] | undefined;
    let pos = 0;
    // Both terminators are searched once and re-searched only after being passed,
    // so a buffer without any `\r` costs one scan, not one per line.
    let nl = buf.indexOf('\n');
    let cr = buf.indexOf('\r');
    while (nl !== -1 || cr !== -1) {
      let end: number;
      let next: number;
      if (cr === -1 || (nl !== -1 && nl < cr)) {
        end = nl;
        next = nl + 1;
      } else {
        end = cr;
        if (cr + 1 < len) {
          next = buf.charCodeAt(cr + 1) === LF ? cr + 2 : cr + 1;
        } else {
          next = cr + 1;
          if (!final) this.skipLF = true;
        }
      }
      out = this.line(buf, pos, end, out);
      pos = next;
      if (nl !== -1 && nl < pos) nl = buf.indexOf('\n', pos);
      if (cr !== -1 && cr < pos) cr = buf.indexOf('\r', pos);
    }
    this.buf = pos === 0 ? buf : buf.slice(pos);
    if (final) {
      if (this.buf.length > 0) out = this.line(this.buf, 0, this.buf.length, out);
      this.buf = '';
      out = this.dispatch(out);
    } else if (this.buf.length > this.maxEventChars) {
      throw new SseLimitError(this.maxEventChars);
    }
    return out ?? NO_EVENTS;
  }

  /** Interprets one line `buf[start, end)`; returns the (lazily created) output list. */
  private line(
    buf: string,
    start: number,
    end: number,
    out: SseEvent[] | undefined,
  ): SseEvent[] | undefined {
    if (start === end) return this.dispatch(out);
    // Only `data` and `event` matter, so the field is matched in place rather than
    // by searching for the colon: no substring, no scan past the line.
    if (buf.startsWith('data', start)) {
      const value = this.valueOf(buf, start + 4, end);
      if (value === undefined) return out;
      this.data = this.data === undefined ? value : this.data + '\n' + value;
      if (this.data.length > this.maxEventChars) throw new SseLimitError(this.maxEventChars);
    } else if (buf.startsWith('event', start)) {
      const value = this.valueOf(buf, start + 5, end);
      if (value !== undefined) this.eventType = value === '' ? undefined : value;
    }
    // Comments (`:`), `id`, `retry` and unknown fields are ignored.
    return out;
  }

  /**
   * The value of a field whose name ends at `at`: what follows the colon minus one
   * leading space, '' for a bare field name, undefined when the name continues
   * (`datum:` is not `data`).
   */
  private valueOf(buf: string, at: number, end: number): string | undefined {
    if (at === end) return '';
    if (at > end || buf.charCodeAt(at) !== COLON) return undefined;
    let from = at + 1;
    if (from < end && buf.charCodeAt(from) === SPACE) from++;
    return buf.slice(from, end);
  }

  private dispatch(out: SseEvent[] | undefined): SseEvent[] | undefined {
    const data = this.data;
    const eventType = this.eventType;
    this.data = undefined;
    this.eventType = undefined;
    if (data === undefined) return out;
    const ev: SseEvent = eventType === undefined ? { data } : { event: eventType, data };
    if (out === undefined) return [ev];
    out.push(ev);
    return out;
  }
}

/** Parses a whole upstream body (e.g. an undici response body) into events. */
export async function* parseSseStream(
  source: AsyncIterable<Uint8Array>,
  opts?: SseParserOptions,
): AsyncGenerator<SseEvent, void, undefined> {
  const parser = new SseParser(opts);
  for await (const chunk of source) yield* parser.feed(chunk);
  yield* parser.end();
}

/** The stream terminator every OpenAI-compatible server sends. */
export const DONE_DATA = '[DONE]';

export function isDone(ev: SseEvent): boolean {
  return ev.data === DONE_DATA;
}

/** One data event; JSON.stringify escapes line breaks, so the frame cannot split. */
export function sseData(payload: object): string {
  return 'data: ' + JSON.stringify(payload) + '\n\n';
}

export const SSE_DONE = 'data: [DONE]\n\n';

/** A comment frame: keeps idle connections (and proxies) from timing out. */
export const SSE_KEEPALIVE = ': keep-alive\n\n';

/** The `error` member of a mid-stream error event. */
export interface SseErrorBody {
  message: string;
  type?: string;
  code: ErrorCode;
  param: string | null;
}

/** The data of the spec's mid-stream error event (see `sseError`). */
export function sseErrorBody(
  code: ErrorCode,
  message?: string,
  param: string | null = null,
): { error: SseErrorBody } {
  const spec = catalogue[code];
  const msg = message ?? spec.message;
  // The spec sends a cancellation without `type`; every other code keeps its
  // catalogue type (a timeout is `timeout_error`).
  const error: SseErrorBody =
    code === 'cancelled'
      ? { message: msg, code, param }
      : { message: msg, type: spec.type, code, param };
  return { error };
}

/**
 * A mid-stream error as the spec frames it: an SSE event named `error` whose data
 * is the error envelope. `sseError('request_timeout', 'Stream idle for 120 s.')`
 * gives `type: timeout_error`; `sseError('cancelled')` has no `type`.
 */
export function sseError(code: ErrorCode, message?: string, param: string | null = null): string {
  return 'event: error\ndata: ' + JSON.stringify(sseErrorBody(code, message, param)) + '\n\n';
}

/**
 * Resolves when a client stream that refused a write can take more: it drained,
 * closed, or the request was aborted (back-pressure for SSE writers). A stream
 * already closed, or a request already aborted, resolves at once: their events
 * have fired and will not fire again (a write to a closed response is refused too).
 */
export function drained(raw: ServerResponse, signal: AbortLike): Promise<void> {
  if (signal.aborted || raw.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      raw.off('drain', done);
      raw.off('close', done);
      signal.removeEventListener('abort', done);
      resolve();
    };
    raw.once('drain', done);
    raw.once('close', done);
    signal.addEventListener('abort', done);
  });
}
