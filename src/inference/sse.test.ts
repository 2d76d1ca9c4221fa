import assert from 'node:assert/strict';
import { once } from 'node:events';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  drained,
  isDone,
  parseSseStream,
  SSE_DONE,
  SSE_KEEPALIVE,
  sseData,
  sseError,
  sseErrorBody,
  SseLimitError,
  SseParser,
  type SseEvent,
} from './sse.js';
import { validateErrorResponse, validateStreamError } from '../../test/support/openai-schemas.js';

const enc = new TextEncoder();

/** Feeds `chunks` (strings are UTF-8 encoded) and collects every event, end() included. */
function parse(chunks: Array<string | Uint8Array>, parser = new SseParser()): SseEvent[] {
  const out: SseEvent[] = [];
  for (const c of chunks) out.push(...parser.feed(typeof c === 'string' ? enc.encode(c) : c));
  out.push(...parser.end());
  return out;
}

/** Splits `bytes` at the given offsets (sorted, deduplicated, clamped). */
function splitAt(bytes: Uint8Array, cuts: number[]): Uint8Array[] {
  const points = [...new Set(cuts.map((c) => Math.min(Math.max(c, 0), bytes.length)))].sort(
    (a, b) => a - b,
  );
  const out: Uint8Array[] = [];
  let prev = 0;
  for (const p of points) {
    out.push(bytes.subarray(prev, p));
    prev = p;
  }
  out.push(bytes.subarray(prev));
  return out;
}

describe('SseParser', () => {
  const cases: Array<{ name: string; input: string[]; events: SseEvent[] }> = [
    {
      name: 'one data event per blank line',
      input: ['data: {"a":1}\n\ndata: {"a":2}\n\n'],
      events: [{ data: '{"a":1}' }, { data: '{"a":2}' }],
    },
    {
      name: 'CRLF line endings (vLLM behind some proxies)',
      input: ['data: one\r\n\r\ndata: two\r\n\r\n'],
      events: [{ data: 'one' }, { data: 'two' }],
    },
    {
      name: 'lone CR line endings',
      input: ['data: one\r\rdata: two\r\r'],
      events: [{ data: 'one' }, { data: 'two' }],
    },
    {
      name: 'CRLF split between chunks does not add a blank line',
      input: ['data: a\r', '\ndata: b\r', '\n\r', '\n'],
      events: [{ data: 'a\nb' }],
    },
    {
      name: 'multi-line data is joined with LF',
      input: ['data: line 1\ndata: line 2\ndata:\ndata: line 4\n\n'],
      events: [{ data: 'line 1\nline 2\n\nline 4' }],
    },
    {
      name: 'comments are keep-alives, not events',
      input: [': ping\n\n: keep-alive\ndata: x\n: between\n\n'],
      events: [{ data: 'x' }],
    },
    {
      name: 'named events (our own error frames, llama.cpp /v1/responses)',
      input: ['event: error\ndata: {"error":{}}\n\nevent: message\ndata: m\n\n'],
      events: [
        { event: 'error', data: '{"error":{}}' },
        { event: 'message', data: 'm' },
      ],
    },
    {
      name: 'the event type resets after each dispatch and on an empty event',
      input: ['event: a\n\ndata: 1\n\nevent: b\ndata: 2\n\ndata: 3\n\n'],
      events: [{ data: '1' }, { event: 'b', data: '2' }, { data: '3' }],
    },
    {
      name: 'only one leading space is stripped; no space is fine',
      input: ['data:x\n\ndata:  two spaces\n\ndata: a: b\n\n'],
      events: [{ data: 'x' }, { data: ' two spaces' }, { data: 'a: b' }],
    },
    {
      name: 'a field without a colon has an empty value',
      input: ['data\n\n'],
      events: [{ data: '' }],
    },
    {
      name: 'a field that only starts with `data` or `event` is another field',
      input: ['datum: x\nevents: e\ndata: y\n\nevent\ndata: z\n\n'],
      events: [{ data: 'y' }, { data: 'z' }],
    },
    {
      name: 'id, retry and unknown fields are ignored',
      input: ['id: 7\nretry: 1000\nfoo: bar\ndata: d\n\n'],
      events: [{ data: 'd' }],
    },
    {
      name: 'blank lines without data dispatch nothing',
      input: ['\n\n\r\n\n'],
      events: [],
    },
    {
      name: '[DONE] is an ordinary event',
      input: ['data: {"x":1}\n\ndata: [DONE]\n\n'],
      events: [{ data: '{"x":1}' }, { data: '[DONE]' }],
    },
    {
      name: 'a pending event is flushed at end of input',
      input: ['data: {"x":1}\n\ndata: last'],
      events: [{ data: '{"x":1}' }, { data: 'last' }],
    },
    {
      name: 'a leading BOM is dropped',
      input: ['\uFEFFdata: bom\n\n'],
      events: [{ data: 'bom' }],
    },
  ];
  for (const c of cases) {
    it(c.name, () => {
      assert.deepEqual(parse(c.input), c.events);
      // Byte by byte gives the same result: no assumption about chunk boundaries.
      const bytes = enc.encode(c.input.join(''));
      assert.deepEqual(parse([...bytes].map((b) => Uint8Array.of(b))), c.events);
    });
  }

  it('holds back a split multi-byte character until it is complete', () => {
    const bytes = enc.encode('data: héllo 世界 🦙\n\n');
    const parser = new SseParser();
    const seen: SseEvent[] = [];
    for (const b of bytes) {
      for (const ev of parser.feed(Uint8Array.of(b))) seen.push(ev);
    }
    assert.deepEqual(seen, [{ data: 'héllo 世界 🦙' }]);
    assert.deepEqual(parser.end(), []);
  });

  it('replaces invalid UTF-8 instead of throwing', () => {
    const events = parse([Uint8Array.of(0x64, 0x61, 0x74, 0x61, 0x3a, 0x20, 0xff, 0x0a, 0x0a)]);
    assert.deepEqual(events, [{ data: '\uFFFD' }]);
  });

  it('flushes a truncated multi-byte sequence at end as U+FFFD', () => {
    const euro = enc.encode('€');
    assert.deepEqual(parse([enc.encode('data: '), euro.subarray(0, 2)]), [{ data: '\uFFFD' }]);
  });

  it('returns no events until a line completes', () => {
    const parser = new SseParser();
    assert.deepEqual(parser.feed(enc.encode('data: {"par')), []);
    assert.deepEqual(parser.feed(enc.encode('tial":true}\n')), []);
    assert.deepEqual(parser.feed(enc.encode('\n')), [{ data: '{"partial":true}' }]);
  });

  it('bounds an endless line', () => {
    const parser = new SseParser({ maxEventChars: 64 });
    assert.throws(() => parser.feed(enc.encode('data: ' + 'x'.repeat(100))), SseLimitError);
  });

  it('bounds an event made of many data lines', () => {
    const parser = new SseParser({ maxEventChars: 64 });
    assert.throws(() => parser.feed(enc.encode('data: 0123456789\n'.repeat(10))), SseLimitError);
  });

  it('rejects feed after end', () => {
    const parser = new SseParser();
    parser.end();
    assert.throws(() => parser.feed(enc.encode('data: x\n\n')));
    assert.deepEqual(parser.end(), []);
  });

  it('parses an async byte stream', async () => {
    async function* body() {
      yield enc.encode('data: {"a"');
      yield enc.encode(':1}\n\nda');
      yield enc.encode('ta: [DONE]\n\n');
    }
    const events: SseEvent[] = [];
    for await (const ev of parseSseStream(body())) events.push(ev);
    assert.deepEqual(events, [{ data: '{"a":1}' }, { data: '[DONE]' }]);
    assert.equal(isDone(events[1]!), true);
    assert.equal(isDone(events[0]!), false);
  });
});

describe('SseParser properties', () => {
  // Values exclude CR and LF (they end lines); any other code point, astral ones
  // included, must survive byte-level splitting intact.
  const lineText = fc
    .string({ unit: 'binary', maxLength: 24 })
    .map((s) => s.replace(/[\r\n]/g, ''));
  const event = fc.record({
    event: fc.option(
      lineText.filter((s) => s.length > 0 && !s.startsWith(' ')),
      { nil: undefined },
    ),
    lines: fc.array(lineText, { minLength: 1, maxLength: 4 }),
    comment: fc.option(lineText, { nil: undefined }),
  });
  const eol = fc.constantFrom('\n', '\r\n', '\r');

  /** Serialises events with a random line ending per line; returns text and expected events. */
  const stream = fc
    .array(fc.tuple(event, fc.array(eol, { minLength: 8, maxLength: 8 })), { maxLength: 8 })
    .map((items) => {
      let text = '';
      const expected: SseEvent[] = [];
      for (const [ev, ends] of items) {
        let k = 0;
        const end = () => {
          let e = ends[k++ % ends.length]!;
          // On the wire a CR ending followed by an LF ending is one CRLF.
          if (e === '\n' && text.endsWith('\r')) e = '\r\n';
          return e;
        };
        if (ev.comment !== undefined) text += ':' + ev.comment + end();
        if (ev.event !== undefined) text += 'event: ' + ev.event + end();
        for (const line of ev.lines) text += 'data: ' + line + end();
        text += end();
        expected.push(
          ev.event === undefined
            ? { data: ev.lines.join('\n') }
            : { event: ev.event, data: ev.lines.join('\n') },
        );
      }
      return { text, expected };
    });

  it('splitting the byte stream anywhere yields the same events', () => {
    fc.assert(
      fc.property(stream, fc.array(fc.nat(), { maxLength: 12 }), ({ text, expected }, cuts) => {
        const bytes = enc.encode(text);
        const whole = parse([bytes]);
        assert.deepEqual(whole, expected);
        const scaled = cuts.map((c) => (bytes.length === 0 ? 0 : c % (bytes.length + 1)));
        assert.deepEqual(parse(splitAt(bytes, scaled)), expected);
      }),
      { numRuns: 300 },
    );
  });

  it('never emits a broken character, even when every cut lands inside one', () => {
    const wide = fc
      .array(fc.constantFrom('é', '世', '🦙', '𝄞', 'a', '€'), { minLength: 1, maxLength: 20 })
      .map((a) => a.join(''));
    fc.assert(
      fc.property(wide, fc.integer({ min: 1, max: 7 }), (text, step) => {
        const bytes = enc.encode('data: ' + text + '\n\n');
        const cuts: number[] = [];
        for (let i = step; i < bytes.length; i += step) cuts.push(i);
        const events = parse(splitAt(bytes, cuts));
        assert.deepEqual(events, [{ data: text }]);
        assert.ok(!events[0]!.data.includes('\uFFFD'), events[0]!.data);
      }),
      { numRuns: 200 },
    );
  });
});

describe('SSE writers', () => {
  it('frames a data event and the terminator', () => {
    assert.equal(sseData({ a: 'x\ny' }), 'data: {"a":"x\\ny"}\n\n');
    assert.equal(SSE_DONE, 'data: [DONE]\n\n');
    assert.equal(SSE_KEEPALIVE.startsWith(':'), true);
    assert.deepEqual(parse([sseData({ a: 1 }) + SSE_KEEPALIVE + SSE_DONE]), [
      { data: '{"a":1}' },
      { data: '[DONE]' },
    ]);
  });

  it('renders a timeout as an error event with type timeout_error', () => {
    const frame = sseError('request_timeout', 'The stream was idle for 120 s.');
    assert.equal(
      frame,
      'event: error\ndata: {"error":{"message":"The stream was idle for 120 s.",' +
        '"type":"timeout_error","code":"request_timeout","param":null}}\n\n',
    );
    const [ev] = parse([frame]);
    assert.equal(ev?.event, 'error');
    const body: unknown = JSON.parse(ev!.data);
    assert.deepEqual(validateStreamError(body), []);
    assert.deepEqual(validateErrorResponse(body), []);
  });

  it('renders a cancellation with code cancelled and no type', () => {
    const [ev] = parse([sseError('cancelled')]);
    assert.equal(ev?.event, 'error');
    const body = JSON.parse(ev!.data) as { error: Record<string, unknown> };
    assert.equal(body.error.code, 'cancelled');
    assert.equal('type' in body.error, false);
    assert.equal(typeof body.error.message, 'string');
    assert.deepEqual(validateStreamError(body), []);
  });

  it('keeps the catalogue type for other mid-stream failures', () => {
    assert.deepEqual(sseErrorBody('upstream_error', 'worker died'), {
      error: { message: 'worker died', type: 'server_error', code: 'upstream_error', param: null },
    });
  });
});

describe('drained', () => {
  it('resolves at once for a response already closed, or a request already aborted', async () => {
    // A client that never reads, then leaves while the writer waits for a drain.
    let res!: http.ServerResponse;
    const server = http.createServer((_req, r) => {
      res = r;
      r.writeHead(200, { 'content-type': 'text/event-stream' });
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const client = net.connect((server.address() as AddressInfo).port, '127.0.0.1');
    client.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
    await once(server, 'request');
    client.pause();
    const ac = new AbortController();
    res.on('close', () => ac.abort());
    const frame = sseData({ text: 'x'.repeat(64 * 1024) });
    while (res.write(frame));
    // The writer waits for the drain; the client leaves meanwhile.
    const closed = once(res, 'close');
    client.destroy();
    await closed;
    assert.equal(ac.signal.aborted, true);
    // The next frame is refused as well; waiting for it must not hang.
    assert.equal(res.write(frame), false);
    const second = await Promise.race([
      drained(res, ac.signal).then(() => 'resolved'),
      new Promise((r) => setTimeout(() => r('hung'), 1000)),
    ]);
    assert.equal(second, 'resolved');
    const aborted = await Promise.race([
      drained({ destroyed: false, once() {}, off() {} } as never, ac.signal).then(() => 'resolved'),
      new Promise((r) => setTimeout(() => r('hung'), 1000)),
    ]);
    assert.equal(aborted, 'resolved');
    server.close();
  });
});
