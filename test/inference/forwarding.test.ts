/**
 * What the router forwards to a worker, seen by a worker that records each body:
 * - the spec's sampling defaults (temperature 0.7, top_p 0.9) when the client
 *   omitted them or sent null, so a third-party engine does not use its own;
 * - `max_tokens` / `max_completion_tokens` beyond 2^53 - 1 are accepted and clamped
 *   to the context window like any over-large value (spec, Limits), not rejected;
 * - an unknown field nested too deeply to re-serialize is the client's 400 naming
 *   it, never a worker failure (it used to be 502 and a breaker failure).
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { tables } from '../../src/store/index.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';
import { listenWorker, onPost } from '../support/fake-worker.js';

/** An OpenAI-compatible worker answering "ok" to everything, keeping every request body. */
async function recordingWorker() {
  const bodies: Array<Record<string, unknown>> = [];
  const server = http.createServer(
    onPost((body, res) => {
      bodies.push(body);
      // A test's unknown field, forwarded: answer 400 with that error object.
      if (body.fail_with) {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: body.fail_with }));
        return;
      }
      // vLLM's flat error body: `{object: "error", message, type, param, code: 400}`.
      if (body.fail_flat) {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.end(
          JSON.stringify({
            object: 'error',
            type: 'BadRequestError',
            code: 400,
            ...body.fail_flat,
          }),
        );
        return;
      }
      // A worker failing the request before it generates anything.
      if (body.fail_500) {
        res.writeHead(500, { 'content-type': 'application/json' });
        res.end('{"error":{"message":"boom"}}');
        return;
      }
      const base = { id: 'w-1', created: 0, model: 'rm' };
      const usage = body.usage_prompt_tokens
        ? { prompt_tokens: body.usage_prompt_tokens, completion_tokens: 1, total_tokens: 6 }
        : { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 };
      if (body.stream !== true) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(
          JSON.stringify({
            ...base,
            object: 'chat.completion',
            choices: [
              {
                index: 0,
                message: { role: 'assistant', content: 'ok' },
                finish_reason: 'stop',
                logprobs: null,
              },
            ],
            usage,
          }),
        );
        return;
      }
      const chunk = (choices: unknown[], extra: Record<string, unknown> = {}) =>
        `data: ${JSON.stringify({ ...base, object: 'chat.completion.chunk', choices, ...extra })}\n\n`;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      // A stream that ends before any token (no [DONE]): the worker gave up.
      if (body.stop_before_token) {
        res.end(
          chunk([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }]),
        );
        return;
      }
      res.end(
        chunk([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }]) +
          chunk([{ index: 0, delta: { content: 'ok' }, finish_reason: null }]) +
          chunk([{ index: 0, delta: {}, finish_reason: 'stop' }]) +
          chunk([], { usage }) +
          // Some servers close right after the last line, without its blank line.
          (body.done_unterminated ? 'data: [DONE]' : 'data: [DONE]\n\n'),
      );
    }),
  );
  return {
    ...(await listenWorker(server)),
    bodies,
  };
}

describe('the body a worker receives', () => {
  let s: TestServer;
  let w: Awaited<ReturnType<typeof recordingWorker>>;
  let url: string;
  let key: string;
  before(async () => {
    s = await startTestServer();
    w = await recordingWorker();
    const p = await seedProject(s, {
      slug: 'fwd',
      model: 'rm',
      tier: 'gpu',
      worker: { url: w.url, id: 'rec' },
      quotaRequests: 10_000,
    });
    url = `${p.baseURL}/chat/completions`;
    key = p.key;
  });
  after(async () => {
    await s.close();
    await w.close();
  });

  /** Posts a request; the raw JSON text lets a test send numbers JSON.stringify would not. */
  async function send(fields: Record<string, unknown> | string) {
    const extra = typeof fields === 'string' ? fields : JSON.stringify(fields).slice(1, -1);
    const base = '"model":"x","messages":[{"role":"user","content":"hi"}]';
    const res = await fetch(url, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: `{${base}${extra ? `,${extra}` : ''}}`,
    });
    const text = await res.text();
    return { status: res.status, headers: res.headers, text, body: w.bodies.at(-1) };
  }

  it('carries the spec defaults temperature 0.7 and top_p 0.9 unless the client set them', async () => {
    const cases: Array<[string, Record<string, unknown>, number, number]> = [
      ['omitted', {}, 0.7, 0.9],
      ['null', { temperature: null, top_p: null }, 0.7, 0.9],
      ['zero and one', { temperature: 0, top_p: 1 }, 0, 1],
      ['set', { temperature: 1.3, top_p: 0.5 }, 1.3, 0.5],
      ['one of them', { temperature: 0.2 }, 0.2, 0.9],
      ['streaming', { stream: true }, 0.7, 0.9],
    ];
    for (const [name, fields, temperature, topP] of cases) {
      const before = w.bodies.length;
      const r = await send(fields);
      assert.equal(r.status, 200, `${name}: ${r.text}`);
      assert.equal(w.bodies.length, before + 1);
      assert.equal(r.body?.temperature, temperature, name);
      assert.equal(r.body?.top_p, topP, name);
    }
  });

  it('max_tokens beyond 2^53 - 1 is clamped to the context window, not rejected', async () => {
    const cases: Array<[string, string, boolean]> = [
      ['100000000000000000000', '"max_tokens":1e20', false],
      ['1000000000000000000000', '"max_completion_tokens":1e21', false],
      ['100000000000000000000', '"max_completion_tokens":100000000000000000000', true],
      ['9007199254740992', '"max_tokens":9007199254740992', false],
    ];
    for (const [original, fields, stream] of cases) {
      const r = await send(stream ? `${fields},"stream":true` : fields);
      assert.equal(r.status, 200, `${fields}: ${r.text}`);
      const h = r.headers.get('x-service-max-tokens-clamped');
      const m = h?.match(/^(\d+) -> (\d+)$/);
      assert.ok(m, `${fields}: clamp header ${String(h)}`);
      assert.equal(m[1], original);
      const clamped = Number(m[2]);
      assert.ok(clamped > 3000 && clamped < 4096, `${fields}: clamped to ${clamped}`);
      assert.equal(r.body?.max_tokens, clamped, 'the worker gets the clamped value');
      assert.equal('max_completion_tokens' in (r.body ?? {}), false);
    }
  });

  it('still rejects a non-integer or non-positive max_tokens', async () => {
    const cases: Array<[string, string, string]> = [
      ['"max_tokens":1.5', 'invalid_type', 'max_tokens'],
      ['"max_completion_tokens":2.5', 'invalid_type', 'max_completion_tokens'],
      ['"max_tokens":0', 'invalid_value', 'max_tokens'],
      ['"max_completion_tokens":-1e20', 'invalid_value', 'max_completion_tokens'],
    ];
    for (const [fields, code, param] of cases) {
      const r = await send(fields);
      assert.equal(r.status, 400, fields);
      const err = (JSON.parse(r.text) as { error: { code: string; param: string } }).error;
      assert.equal(err.code, code, fields);
      assert.equal(err.param, param, fields);
    }
  });

  it('a field nested too deeply to forward: 400 naming it, and the worker is not blamed', async () => {
    for (const depth of [5_000, 200_000]) {
      for (const stream of [false, true]) {
        const before = w.bodies.length;
        const deep = `"extra":${'['.repeat(depth)}${']'.repeat(depth)}`;
        const r = await send(stream ? `${deep},"stream":true` : deep);
        assert.equal(r.status, 400, `${depth} levels, stream ${stream}: ${r.text}`);
        const err = (JSON.parse(r.text) as { error: { code: string; param: string | null } }).error;
        assert.equal(err.code, 'invalid_body');
        if (depth === 5_000) assert.equal(err.param, 'extra');
        assert.equal(w.bodies.length, before, 'nothing reached the worker');
      }
    }
    // No failure counted against the worker (nor its breaker), and it serves the next one.
    const metrics = (await fetch(`${s.url}/metrics`).then((r) => r.text())).split('\n');
    assert.equal(
      metrics.filter((l) => l.startsWith('switchyard_worker_errors_total{worker="rec"')).length,
      0,
      'no worker error recorded',
    );
    assert.equal((await send({})).status, 200);
  });

  it('the route with a trailing slash is the chat route, ids included', async () => {
    const res = await fetch(`${url}/`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'x', messages: [{ role: 'user', content: 'hi' }] }),
    });
    assert.equal(res.status, 200);
    const body = (await res.json()) as { id: string };
    assert.match(body.id, /^chatcmpl-[0-9a-f]{32}$/);
    assert.equal(res.headers.get('x-request-id'), body.id);
  });

  it("a worker's 400: its code and param when they mean the same to the client, else upstream_rejected", async () => {
    const cases: Array<[Record<string, unknown>, string, string | null]> = [
      [
        { message: 'no images', code: 'model_capability_missing', param: 'messages[0].content[0]' },
        'model_capability_missing',
        'messages[0].content[0]',
      ],
      [
        { message: 'bad bias', code: 'invalid_value', param: 'logit_bias.99999' },
        'invalid_value',
        'logit_bias.99999',
      ],
      [{ message: 'odd', code: 'internal_thing', param: 'x' }, 'upstream_rejected', 'x'],
      [{ message: 'plain' }, 'upstream_rejected', null],
    ];
    for (const [error, code, param] of cases) {
      const r = await send({ fail_with: error });
      assert.equal(r.status, 400, r.text);
      const e = (
        JSON.parse(r.text) as { error: { code: string; param: string | null; message: string } }
      ).error;
      assert.equal(e.code, code);
      assert.equal(e.param, param);
      assert.equal(e.message, error.message);
    }
    // vLLM's flat body: its param is kept too; its numeric code is not one of ours.
    const r = await send({ fail_flat: { message: 'dimensions too large', param: 'dimensions' } });
    assert.equal(r.status, 400, r.text);
    const e = (
      JSON.parse(r.text) as { error: { code: string; param: string | null; message: string } }
    ).error;
    assert.deepEqual(
      [e.code, e.param, e.message],
      ['upstream_rejected', 'dimensions', 'dimensions too large'],
    );
  });

  it("a worker's impossible token count is not billed: the router's estimate is, and recorded", async () => {
    for (const stream of [false, true]) {
      const r = await fetch(url, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'x',
          messages: [{ role: 'user', content: 'count me' }],
          usage_prompt_tokens: 1e20,
          stream,
          ...(stream ? { stream_options: { include_usage: true } } : {}),
        }),
      });
      assert.equal(r.status, 200);
      const text = await r.text();
      const id = r.headers.get('x-request-id')!;
      const usage = stream
        ? (
            JSON.parse(
              text
                .split('\n\n')
                .filter((e) => e.startsWith('data: {') && e.includes('"usage":{'))
                .at(-1)!
                .slice(6),
            ) as { usage: { prompt_tokens: number } }
          ).usage
        : (JSON.parse(text) as { usage: { prompt_tokens: number } }).usage;
      assert.ok(usage.prompt_tokens > 0 && usage.prompt_tokens < 100, JSON.stringify(usage));
      await s.services.usage.flush();
      const rows = await s.services.store.db.select().from(tables.usageRecords);
      const row = rows.find((x) => x.requestId === id);
      assert.equal(row?.promptTokens, usage.prompt_tokens, `stream: ${stream}`);
    }
  });

  it('a stream the worker ends on a bare `data: [DONE]` (no blank line) completes', async () => {
    const r = await send({ stream: true, done_unterminated: true });
    assert.equal(r.status, 200);
    assert.ok(r.text.endsWith('data: [DONE]\n\n'), r.text.slice(-80));
    assert.ok(!r.text.includes('event: error'), r.text);
    await s.services.usage.flush();
    const id = r.headers.get('x-request-id')!;
    const rows = await s.services.store.db.select().from(tables.usageRecords);
    const row = rows.find((x) => x.requestId === id);
    assert.equal(row?.status, 'completed');
    assert.equal(row?.promptTokens, 5, "the worker's own count, from its last chunk");
  });

  it('a stream that ends before its first token, with no worker to fail over to, is a 502', async () => {
    const r = await send({ stream: true, stop_before_token: true });
    assert.equal(r.status, 502, r.text);
    assert.match(String(r.headers.get('content-type')), /application\/json/);
    const e = (JSON.parse(r.text) as { error: { code: string } }).error;
    assert.equal(e.code, 'upstream_error');
  });

  it('a request the worker fails before generating anything is free, streamed or not', async () => {
    for (const stream of [false, true]) {
      const r = await send({ stream, fail_500: true });
      assert.equal(r.status, 502, r.text);
      await s.services.usage.flush();
      const id = r.headers.get('x-request-id')!;
      const rows = await s.services.store.db.select().from(tables.usageRecords);
      const row = rows.find((x) => x.requestId === id);
      assert.equal(row?.status, 'error', `stream: ${stream}`);
      assert.deepEqual([row?.promptTokens, row?.completionTokens], [0, 0], `stream: ${stream}`);
    }
  });

  it('a streaming client that sends Connection: close gets it, and the socket closes after [DONE]', async () => {
    const u = new URL(url);
    const body = JSON.stringify({
      model: 'x',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
    });
    const socket = net.connect(Number(u.port), u.hostname);
    let raw = '';
    socket.setEncoding('utf8');
    socket.on('data', (d: string) => (raw += d));
    const closed = once(socket, 'close');
    socket.write(
      `POST ${u.pathname} HTTP/1.1\r\nHost: ${u.host}\r\nAuthorization: Bearer ${key}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
        `Connection: close\r\n\r\n${body}`,
    );
    let bound: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([
      closed.then(() => 'closed'),
      new Promise((r) => (bound = setTimeout(r, 10_000, 'still open'))),
    ]);
    clearTimeout(bound);
    socket.destroy();
    assert.equal(outcome, 'closed', 'the server closes the connection after the stream');
    const head = raw.slice(0, raw.indexOf('\r\n\r\n')).toLowerCase();
    assert.match(head, /^http\/1\.1 200/);
    assert.match(head, /\r\nconnection: close/);
    assert.doesNotMatch(head, /keep-alive/);
    assert.ok(raw.includes('data: [DONE]'));
  });
});
