/**
 * Batch input files: JSON Lines, one request per line, checked as the bytes
 * arrive (an upload is never held whole in memory).
 *
 * `LineSplitter` cuts a byte stream at `\n` (a UTF-8 multi-byte sequence never
 * contains 0x0a, so cutting bytes is safe) and hands over each line, `\r\n`
 * endings and blank lines allowed; a line that is not valid UTF-8 is handed over as
 * null (decoding would put U+FFFD in place of its bytes and send changed text to
 * the model), and the checker refuses it. `BatchLineChecker` checks each line against
 * OpenAI's batch input format: an object `{custom_id, method: "POST", url, body}`
 * with a non-empty `custom_id` unique in the file (without U+0000 or a lone
 * surrogate, which the database cannot keep as sent), a supported `url`, a `body`
 * object (not streamed), and at most `MAX_BATCH_REQUESTS` requests. A violation is
 * 400 `invalid_value` naming the line, `param` the request field that carried the
 * content (`file` for the Files API).
 */
import { isUtf8 } from 'node:buffer';
import { ServiceError } from '../errors/index.js';

export const BATCH_URLS = ['/v1/chat/completions', '/v1/embeddings'] as const;
export type BatchUrl = (typeof BATCH_URLS)[number];
export const MAX_BATCH_REQUESTS = 50_000;
const MAX_CUSTOM_ID = 512;

export interface BatchLine {
  customId: string;
  url: BatchUrl;
  body: Record<string, unknown>;
}

export class LineSplitter {
  private rest: Buffer[] = [];
  private lineNo = 0;

  /** `line` is null when the line's bytes are not valid UTF-8. */
  constructor(private readonly onLine: (line: string | null, lineNo: number) => void) {}

  push(chunk: Buffer): void {
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(0x0a, start);
      if (nl < 0) break;
      const piece = chunk.subarray(start, nl);
      const whole = this.rest.length ? Buffer.concat([...this.rest, piece]) : piece;
      this.rest = [];
      this.emit(whole);
      start = nl + 1;
    }
    if (start < chunk.length) this.rest.push(Buffer.from(chunk.subarray(start)));
  }

  end(): void {
    if (this.rest.length) this.emit(Buffer.concat(this.rest));
    this.rest = [];
  }

  private emit(bytes: Buffer): void {
    this.lineNo++;
    this.onLine(isUtf8(bytes) ? bytes.toString('utf8').replace(/\r$/, '') : null, this.lineNo);
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export class BatchLineChecker {
  private readonly seen = new Set<string>();
  count = 0;

  constructor(private readonly param: string) {}

  private fail(lineNo: number, message: string): never {
    throw new ServiceError('invalid_value', {
      message: `Line ${lineNo} of the batch input: ${message}`,
      param: this.param,
    });
  }

  /** The line's request, or null for a blank line; throws on anything else (null: not UTF-8). */
  check(line: string | null, lineNo: number): BatchLine | null {
    if (line === null) this.fail(lineNo, 'the line is not valid UTF-8.');
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
    if (++this.count > MAX_BATCH_REQUESTS) {
      this.fail(lineNo, `a batch holds at most ${MAX_BATCH_REQUESTS} requests.`);
    }
    this.seen.add(customId);
    return { customId, url: url as BatchUrl, body };
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
