/**
 * One HTTP attempt of a webhook delivery: POST the exact body with the
 * signature headers through the SSRF-guarded agent, never following redirects
 * (a 3xx is a failed attempt), reading at most the first 1 KiB of the answer.
 * The 30-second limit is enforced by the caller through the abort signal; once
 * the status is in, the answer counts whatever happens to its body.
 */
import type { Dispatcher } from 'undici';
import { request } from '../runtime/http-client.js';

export const USER_AGENT = 'Switchyard-Webhooks/1.0';
export const RESPONSE_BODY_LIMIT = 1024;

export interface SendResult {
  status: number;
  /** First 1 KiB of the response body (UTF-8, a character split by the limit left out). */
  body: string;
}

export interface Sender {
  send(
    url: string,
    headers: Record<string, string>,
    body: string,
    signal: AbortSignal,
  ): Promise<SendResult>;
}

export class HttpSender implements Sender {
  constructor(private readonly agent: Dispatcher) {}

  async send(
    url: string,
    headers: Record<string, string>,
    body: string,
    signal: AbortSignal,
  ): Promise<SendResult> {
    const res = await request(url, {
      method: 'POST',
      headers,
      body,
      signal,
      dispatcher: this.agent,
    });
    const chunks: Buffer[] = [];
    let size = 0;
    try {
      for await (const chunk of res.body) {
        const b = chunk as Buffer;
        chunks.push(b);
        size += b.length;
        // Enough for the stored prefix: stop reading a large or endless answer.
        if (size >= RESPONSE_BODY_LIMIT) {
          res.body.destroy();
          break;
        }
      }
    } catch {
      // The status line decided the attempt (spec: a 2xx within 30 s is success);
      // the body is only stored. One cut off by the time limit or a broken
      // connection is kept as far as it came.
      res.body.destroy();
    }
    const text = utf8Prefix(Buffer.concat(chunks), RESPONSE_BODY_LIMIT).toString('utf8');
    return { status: res.statusCode, body: text };
  }
}

/**
 * The first `limit` bytes of `b` without a character the limit splits. Decoding a
 * split character gives U+FFFD, which the receiver never sent, and whose 3 bytes
 * fit in the limit when 3 of a 4-byte character's did, so cutting the decoded text
 * again would keep it. Checked from `limit` bytes on: the read stops there, so a
 * body of exactly `limit` bytes may be cut off too.
 */
export function utf8Prefix(b: Buffer, limit: number): Buffer {
  if (b.length < limit) return b;
  // The last character's lead byte: at most 3 continuation bytes (10xxxxxx) back.
  let lead = limit - 1;
  while (lead > 0 && lead > limit - 4 && (b[lead]! & 0xc0) === 0x80) lead--;
  const first = b[lead]!;
  const size = first >= 0xf0 ? 4 : first >= 0xe0 ? 3 : first >= 0xc0 ? 2 : 1;
  return b.subarray(0, lead + size > limit ? lead : limit);
}
