/**
 * Batch input files: JSON Lines, one request per line, checked as the bytes
 * arrive (an upload is never held whole in memory).
 *
 * `LineSplitter` cuts a byte stream at `\n` (a UTF-8 multi-byte sequence never
 * contains 0x0a, so cutting bytes is safe) and hands over each line, `\r\n`
 * endings, blank lines and a UTF-8 byte order mark opening the file allowed; a line that is not valid UTF-8 is handed over as
 * null (decoding would put U+FFFD in place of its bytes and send changed text to
 * the model), and the checker refuses it. `BatchLineChecker` checks each line against
 * OpenAI's batch input format: an object `{custom_id, method: "POST", url, body}`
 * with a non-empty `custom_id` unique in the file (without U+0000 or a lone
 * surrogate, which the database cannot keep as sent), a supported `url`, a `body`
 * object (not streamed) within the request body limit (a longer line is not kept
 * whole: the splitter drops it past `maxLineBytes`), and at most `MAX_BATCH_REQUESTS`
 * requests. A violation is 400 `invalid_value` naming the line, `param` the request
 * field that carried the content (`file` for the Files API).
 */
import { isUtf8 } from 'node:buffer';
import { ServiceError } from '../errors/index.js';

export const BATCH_URLS = ['/v1/chat/completions', '/v1/embeddings'] as const;
export type BatchUrl = (typeof BATCH_URLS)[number];
export const MAX_BATCH_REQUESTS = 50_000;
const MAX_CUSTOM_ID = 512;

/** Room a line has around its body (`custom_id` of up to 512 characters, method, url). */
const LINE_ENVELOPE_BYTES = 16 * 1024;

/** A line the splitter stopped keeping: longer than its `maxLineBytes`. */
export interface LongLine {
  tooLong: true;
}

export interface BatchLine {
  customId: string;
  url: BatchUrl;
  body: Record<string, unknown>;
}

export class LineSplitter {
  private rest: Buffer[] = [];
  private restBytes = 0;
  /** The current line passed `maxLineBytes`: its bytes are dropped up to its end. */
  private long = false;
  private lineNo = 0;

  /**
   * `line` is null when the line's bytes are not valid UTF-8, a `LongLine` when it
   * is longer than `maxLineBytes` (so a line without end is never held whole).
   */
  constructor(
    private readonly onLine: (line: string | null | LongLine, lineNo: number) => void,
    private readonly maxLineBytes = Infinity,
  ) {}

  push(chunk: Buffer): void {
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(0x0a, start);
      if (nl < 0) break;
      const piece = chunk.subarray(start, nl);
      if (this.long || this.restBytes + piece.length > this.maxLineBytes) {
        this.emit(null);
      } else {
        this.emit(this.rest.length ? Buffer.concat([...this.rest, piece]) : piece);
      }
      start = nl + 1;
    }
    if (start < chunk.length) this.keep(chunk.subarray(start));
  }

  end(): void {
    if (this.long || this.rest.length) this.emit(this.long ? null : Buffer.concat(this.rest));
  }

  private keep(piece: Buffer): void {
    if (this.long) return;
    if (this.restBytes + piece.length > this.maxLineBytes) {
      this.long = true;
      this.rest = [];
      this.restBytes = 0;
      return;
    }
    this.rest.push(Buffer.from(piece));
    this.restBytes += piece.length;
  }

  /** `bytes` null: the line was too long. */
  private emit(bytes: Buffer | null): void {
    this.rest = [];
    this.restBytes = 0;
    this.long = false;
    this.lineNo++;
    if (bytes === null) return this.onLine({ tooLong: true }, this.lineNo);
    // A UTF-8 byte order mark opening the file (Windows editors write one) is not
    // part of the first line's JSON.
    if (this.lineNo === 1 && bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf) {
      bytes = bytes.subarray(3);
    }
    this.onLine(isUtf8(bytes) ? bytes.toString('utf8').replace(/\r$/, '') : null, this.lineNo);
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export class BatchLineChecker {
  private readonly seen = new Set<string>();
  count = 0;

  /** What a line may hold: a body within the request body limit, and its envelope. */
  readonly maxLineBytes: number;

  /** `maxBodyBytes`: the request body limit (SWITCHYARD_MAX_BODY_BYTES) a line's body must fit. */
  constructor(
    private readonly param: string,
    private readonly maxBodyBytes = Infinity,
  ) {
    this.maxLineBytes = maxBodyBytes + LINE_ENVELOPE_BYTES;
  }

  private fail(lineNo: number, message: string): never {
    throw new ServiceError('invalid_value', {
      message: `Line ${lineNo} of the batch input: ${message}`,
      param: this.param,
    });
  }

  /** The line's request, or null for a blank line; throws on anything else (null: not UTF-8). */
  check(line: string | null | LongLine, lineNo: number): BatchLine | null {
    if (line === null) this.fail(lineNo, 'the line is not valid UTF-8.');
    if (typeof line !== 'string') this.fail(lineNo, this.tooLarge());
    if (line.trim() === '') return null;
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch {
      this.fail(lineNo, 'not valid JSON.');
    }
    if (!isObject(v)) this.fail(lineNo, 'each line must be a JSON object.');
    const { custom_id: customId, method, url, body } = v;
    if (typeof customId !== 'string' || customId === '') {
      this.fail(lineNo, "'custom_id' must be a non-empty string.");
    }
    // What PostgreSQL's text cannot hold as sent (a lone surrogate would be stored as
    // U+FFFD, and the results' custom_id would not be the input's).
    if (customId.includes('\u0000') || !customId.isWellFormed()) {
      this.fail(lineNo, "'custom_id' holds a NUL character or a lone UTF-16 surrogate.");
    }
    if (customId.length > MAX_CUSTOM_ID) {
      this.fail(lineNo, `'custom_id' is longer than ${MAX_CUSTOM_ID} characters.`);
    }
    if (this.seen.has(customId)) {
      this.fail(lineNo, `'custom_id' ${JSON.stringify(customId)} is not unique in the file.`);
    }
    if (method !== 'POST') this.fail(lineNo, '\'method\' must be "POST".');
    if (typeof url !== 'string' || !(BATCH_URLS as readonly string[]).includes(url)) {
      this.fail(lineNo, `'url' must be one of ${BATCH_URLS.join(', ')}.`);
    }
    if (!isObject(body)) this.fail(lineNo, "'body' must be a JSON object.");
    if (body.stream === true) this.fail(lineNo, 'streaming is not supported in a batch.');
    if (
      this.maxBodyBytes !== Infinity &&
      Buffer.byteLength(JSON.stringify(body)) > this.maxBodyBytes
    ) {
      this.fail(lineNo, this.tooLarge());
    }
    if (++this.count > MAX_BATCH_REQUESTS) {
      this.fail(lineNo, `a batch holds at most ${MAX_BATCH_REQUESTS} requests.`);
    }
    this.seen.add(customId);
    return { customId, url: url as BatchUrl, body };
  }

  private tooLarge(): string {
    return `the request is larger than a request body may be (${this.maxBodyBytes} bytes).`;
  }

  /** After the last line: a batch file must hold at least one request. */
  finish(): void {
    if (this.count === 0) {
      throw new ServiceError('invalid_value', {
        message: 'The batch input holds no requests.',
        param: this.param,
      });
    }
  }
}
