import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ServiceError } from '../errors/index.js';
import {
  BATCH_URLS,
  BatchLineChecker,
  LineSplitter,
  MAX_BATCH_REQUESTS,
  type LongLine,
} from './jsonl.js';

/** Every line the splitter hands over, as `[lineNo, text]`, for `chunks` pushed in turn. */
function split(...chunks: (string | Buffer)[]): [number, string | null | LongLine][] {
  const out: [number, string | null | LongLine][] = [];
  const s = new LineSplitter((line, n) => out.push([n, line]));
  for (const c of chunks) s.push(typeof c === 'string' ? Buffer.from(c) : c);
  s.end();
  return out;
}

function line(fields: Record<string, unknown>): string {
  return JSON.stringify({
    custom_id: 'r-1',
    method: 'POST',
    url: '/v1/chat/completions',
    body: { model: 'm', messages: [{ role: 'user', content: 'hi' }] },
    ...fields,
  });
}

/** The refusal `check` throws for `text` as line `lineNo` (after `before` were accepted). */
function refusal(
  text: string,
  opts: { lineNo?: number; before?: string[]; param?: string } = {},
): ServiceError {
  const c = new BatchLineChecker(opts.param ?? 'file');
  (opts.before ?? []).forEach((l, i) => c.check(l, i + 1));
  const lineNo = opts.lineNo ?? (opts.before?.length ?? 0) + 1;
  try {
    c.check(text, lineNo);
  } catch (err) {
    assert.ok(err instanceof ServiceError, String(err));
    return err;
  }
  assert.fail(`accepted: ${text.slice(0, 80)}`);
}

function assertRefused(err: ServiceError, lineNo: number, what: RegExp, param = 'file'): void {
  assert.equal(err.code, 'invalid_value');
  assert.equal(err.status, 400);
  assert.equal(err.type, 'invalid_request_error');
  assert.equal(err.param, param);
  assert.match(err.message, new RegExp(`^Line ${lineNo} of the batch input: `), err.message);
  assert.match(err.message, what);
}

describe('LineSplitter', () => {
  it('hands over each line numbered from 1; a trailing newline adds no line', () => {
    assert.deepEqual(split('a\nb\nc\n'), [
      [1, 'a'],
      [2, 'b'],
      [3, 'c'],
    ]);
    // Without the final newline, end() hands over the last line.
    assert.deepEqual(split('a\nb'), [
      [1, 'a'],
      [2, 'b'],
    ]);
    assert.deepEqual(split(''), []);
    assert.deepEqual(split(), []);
  });

  it('hands over blank lines (they keep their number) and strips one \\r of a \\r\\n ending', () => {
    assert.deepEqual(split('a\r\n\r\n\nb\r\n\n'), [
      [1, 'a'],
      [2, ''],
      [3, ''],
      [4, 'b'],
      [5, ''],
    ]);
    // Only a final \r goes; one inside the line stays.
    assert.deepEqual(split('x\ry\r\r\n'), [[1, 'x\ry\r']]);
  });

  it('drops a UTF-8 byte order mark at the start of the file, and only there', () => {
    assert.deepEqual(split(Buffer.from([0xef, 0xbb]), Buffer.from([0xbf, 0x61, 0x0a, 0x62])), [
      [1, 'a'],
      [2, 'b'],
    ]);
    assert.deepEqual(split('a\n\uFEFFb\n'), [
      [1, 'a'],
      [2, '\uFEFFb'],
    ]);
  });

  it('joins a line cut across chunks, \\r\\n and multi-byte characters included', () => {
    assert.deepEqual(split('{"a":', '1}\r', '\n{"b"', ':2}\n', 'tail'), [
      [1, '{"a":1}'],
      [2, '{"b":2}'],
      [3, 'tail'],
    ]);
    const text = Buffer.from('héllo — 日本\nzwei\n');
    // Every cut of the bytes, including ones inside a UTF-8 sequence, gives the same lines.
    for (let i = 0; i <= text.length; i++) {
      assert.deepEqual(
        split(text.subarray(0, i), text.subarray(i)),
        [
          [1, 'héllo — 日本'],
          [2, 'zwei'],
        ],
        `cut at ${i}`,
      );
    }
    // One byte at a time.
    const bytes = [...text].map((b) => Buffer.from([b]));
    assert.deepEqual(split(...bytes), [
      [1, 'héllo — 日本'],
      [2, 'zwei'],
    ]);
  });

  it('hands over a line that is not valid UTF-8 as null, even when cut across chunks', () => {
    const bad = Buffer.concat([
      Buffer.from('{"input":"'),
      Buffer.from([0xff, 0xc3]),
      Buffer.from('"}'),
    ]);
    assert.deepEqual(split(Buffer.concat([Buffer.from('ok\n'), bad, Buffer.from('\nfine\n')])), [
      [1, 'ok'],
      [2, null],
      [3, 'fine'],
    ]);
    // A truncated multi-byte sequence at the end of a line (é is c3 a9).
    assert.deepEqual(split(Buffer.from([0x61, 0xc3]), Buffer.from('\n')), [[1, null]]);
    // The same sequence whole, split between two pushes, is valid.
    assert.deepEqual(split(Buffer.from([0x61, 0xc3]), Buffer.from([0xa9, 0x0a])), [[1, 'aé']]);
    // U+FFFD written as UTF-8 is valid text, not a decoding failure.
    assert.deepEqual(split('\uFFFD\n'), [[1, '\uFFFD']]);
  });

  it('hands over a line longer than maxLineBytes as too long, without keeping it', () => {
    const out: [number, string | null | LongLine][] = [];
    const s = new LineSplitter((line, n) => out.push([n, line]), 4);
    for (const c of ['ab', 'cd\nabc', 'de', 'fgh', '\nxy\nlonger']) s.push(Buffer.from(c));
    s.end();
    assert.deepEqual(out, [
      [1, 'abcd'],
      [2, { tooLong: true }],
      [3, 'xy'],
      [4, { tooLong: true }],
    ]);
  });

  it('does not keep a reference to a pushed chunk the caller may reuse', () => {
    const out: (string | null | LongLine)[] = [];
    const s = new LineSplitter((l) => out.push(l));
    const buf = Buffer.from('abc');
    s.push(buf);
    buf.write('XYZ');
    s.push(Buffer.from('\n'));
    s.end();
    assert.deepEqual(out, ['abc']);
  });
});

describe('BatchLineChecker', () => {
  it('accepts a request to each batch URL', () => {
    assert.deepEqual([...BATCH_URLS], ['/v1/chat/completions', '/v1/embeddings']);
    const c = new BatchLineChecker('file');
    const chat = c.check(line({ custom_id: 'chat-1' }), 1);
    assert.deepEqual(chat, {
      customId: 'chat-1',
      url: '/v1/chat/completions',
      body: { model: 'm', messages: [{ role: 'user', content: 'hi' }] },
    });
    const emb = c.check(
      line({ custom_id: 'emb-1', url: '/v1/embeddings', body: { model: 'e', input: ['a', 'b'] } }),
      2,
    );
    assert.deepEqual(emb, {
      customId: 'emb-1',
      url: '/v1/embeddings',
      body: { model: 'e', input: ['a', 'b'] },
    });
    assert.equal(c.count, 2);
    c.finish();
  });

  it('accepts surrounding whitespace, extra fields, an empty body, stream: false', () => {
    const c = new BatchLineChecker('file');
    const r = c.check(`  ${line({ extra: 1, body: {} })}\t`, 1);
    assert.deepEqual(r, { customId: 'r-1', url: '/v1/chat/completions', body: {} });
    assert.ok(c.check(line({ custom_id: 'r-2', body: { stream: false } }), 2));
    // The longest custom_id allowed.
    assert.ok(c.check(line({ custom_id: 'x'.repeat(512) }), 3));
    assert.equal(c.count, 3);
  });

  it('skips blank and whitespace-only lines: null, not counted', () => {
    const c = new BatchLineChecker('file');
    for (const blank of ['', ' ', '\t', '  \t \r']) assert.equal(c.check(blank, 1), null);
    assert.equal(c.count, 0);
    assert.throws(
      () => c.finish(),
      (e: unknown) =>
        e instanceof ServiceError &&
        e.code === 'invalid_value' &&
        e.param === 'file' &&
        /holds no requests/.test(e.message),
    );
    c.check(line({}), 5);
    c.finish();
  });

  it('refuses a line that is not JSON, or not a JSON object', () => {
    for (const bad of ['{', '{"custom_id": "a",}', 'hello', "{'a': 1}", '{"a":1}{"b":2}']) {
      assertRefused(refusal(bad, { lineNo: 7 }), 7, /not valid JSON/);
    }
    for (const bad of ['[]', '[{"custom_id":"a"}]', '"text"', '42', 'null', 'true']) {
      assertRefused(refusal(bad, { lineNo: 3 }), 3, /must be a JSON object/);
    }
  });

  it('refuses a line that is not valid UTF-8, naming it', () => {
    const c = new BatchLineChecker('input_file_id');
    assert.throws(
      () => c.check(null, 9),
      (e: unknown) => {
        assert.ok(e instanceof ServiceError);
        assertRefused(e, 9, /not valid UTF-8/, 'input_file_id');
        return true;
      },
    );
  });

  it('refuses a missing, empty, non-string or too long custom_id', () => {
    for (const id of [undefined, '', 5, null, ['a'], { a: 1 }]) {
      assertRefused(
        refusal(line({ custom_id: id }), { lineNo: 2 }),
        2,
        /'custom_id' must be a non-empty string/,
      );
    }
    assertRefused(
      refusal(line({ custom_id: 'x'.repeat(513) }), { lineNo: 4 }),
      4,
      /'custom_id' is longer than 512 characters/,
    );
  });

  it('refuses a custom_id used twice, naming the second line', () => {
    const err = refusal(line({ custom_id: 'dup' }), {
      before: [line({ custom_id: 'dup' }), '', line({ custom_id: 'other' })],
    });
    assertRefused(err, 4, /'custom_id' "dup" is not unique in the file/);
    // A refused line's custom_id was not recorded.
    const c = new BatchLineChecker('file');
    assert.throws(() => c.check(line({ custom_id: 'z', method: 'GET' }), 1));
    assert.ok(c.check(line({ custom_id: 'z' }), 2));
  });

  it('refuses a method other than POST', () => {
    for (const method of [undefined, 'GET', 'post', 'PUT', 1]) {
      assertRefused(refusal(line({ method }), { lineNo: 9 }), 9, /'method' must be "POST"/);
    }
  });

  it('refuses a url that is not a batch URL', () => {
    for (const url of [
      undefined,
      '/v1/responses',
      '/v1/completions',
      'v1/embeddings',
      '/v1/embeddings/',
      '/v1/chat/completions?x=1',
      'https://api.openai.com/v1/chat/completions',
      42,
    ]) {
      const err = refusal(line({ url }), { lineNo: 11 });
      assertRefused(err, 11, /'url' must be one of \/v1\/chat\/completions, \/v1\/embeddings/);
    }
  });

  it('refuses a body that is not an object, and a streamed body', () => {
    for (const body of [undefined, null, 'hi', 3, [], [{ model: 'm' }]]) {
      assertRefused(refusal(line({ body }), { lineNo: 6 }), 6, /'body' must be a JSON object/);
    }
    assertRefused(
      refusal(line({ body: { model: 'm', stream: true } }), { lineNo: 8 }),
      8,
      /streaming is not supported/,
    );
  });

  it('names the line it was given, and the param it was built with', () => {
    for (const param of ['file', 'input_file_id', 'part_ids']) {
      assertRefused(refusal('nope', { lineNo: 12345, param }), 12345, /not valid JSON/, param);
    }
  });

  it(`holds at most ${MAX_BATCH_REQUESTS} requests`, () => {
    const c = new BatchLineChecker('input_file_id');
    for (let i = 1; i <= MAX_BATCH_REQUESTS; i++) {
      c.check(`{"custom_id":"r${i}","method":"POST","url":"/v1/embeddings","body":{}}`, i);
    }
    assert.equal(c.count, MAX_BATCH_REQUESTS);
    // Blank lines do not count towards the limit.
    assert.equal(c.check('', MAX_BATCH_REQUESTS + 1), null);
    const n = MAX_BATCH_REQUESTS + 2;
    assert.throws(
      () => c.check(`{"custom_id":"last","method":"POST","url":"/v1/embeddings","body":{}}`, n),
      (e: unknown) => {
        assert.ok(e instanceof ServiceError);
        assertRefused(e, n, /a batch holds at most 50000 requests/, 'input_file_id');
        return true;
      },
    );
  });

  it('checks a whole file fed through the splitter, with the right line number', () => {
    const lines = [
      line({ custom_id: 'a' }),
      '',
      line({ custom_id: 'b', url: '/v1/embeddings', body: { input: 'x' } }),
      line({ custom_id: 'c', url: '/v1/files' }),
    ];
    const c = new BatchLineChecker('file');
    const seen: string[] = [];
    const s = new LineSplitter((l, n) => {
      const r = c.check(l, n);
      if (r) seen.push(r.customId);
    });
    const bytes = Buffer.from(lines.join('\r\n') + '\r\n');
    assert.throws(
      () => {
        for (let i = 0; i < bytes.length; i += 7) s.push(bytes.subarray(i, i + 7));
        s.end();
      },
      (e: unknown) => {
        assert.ok(e instanceof ServiceError);
        assertRefused(e, 4, /'url' must be one of/);
        return true;
      },
    );
    assert.deepEqual(seen, ['a', 'b']);
  });
});
