/**
 * A worker's graceful drain, as an operator meets it in a rolling restart: real
 * `switchyard worker --engine sim --register` processes behind an in-process
 * router, driven through the `openai` SDK (no SDK retries).
 *
 * 1. SIGTERM while the worker streams: the router marks it `draining` and sends the
 *    requests that follow to the other worker; every stream already open on it runs
 *    to its last token and `[DONE]`; then the worker deregisters and exits 0.
 * 2. Past `--drain-ms` the worker closes what is still open: that stream ends, after
 *    its content so far, with the `cancelled` SSE error, and the worker exits 0.
 *
 * Runs the built binary (`npm run build` first), like the other process tests.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import OpenAI, { APIError } from 'openai';
import { startTestServer, type TestServer } from '../support/harness.js';
import { spawnSwitchyard, type Spawned } from '../support/process.js';

const WORKER_TOKEN = 'drain-proc-token';
const TIER = 'self_hosted';
const TPOT_MS = 20;

interface Outcome {
  worker: string | null;
  tokens: number;
  done: boolean;
  error: unknown;
}

const describeError = (e: unknown) =>
  e instanceof APIError ? `${e.status ?? 'SSE'} ${e.code ?? ''}: ${e.message}` : String(e);

async function until(what: string, check: () => boolean | Promise<boolean>, ms = 15_000) {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) assert.fail(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('switchyard worker drains on SIGTERM (real processes)', { timeout: 90_000 }, () => {
  let s: TestServer;
  const clients = new Map<string, OpenAI>();
  const spawned: Spawned[] = [];
  const killAll = () => {
    for (const p of spawned) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  };

  async function startWorker(model: string, extra: string[] = []) {
    const p = spawnSwitchyard(
      ['worker', '--engine', 'sim', '--port', '0', '--model', model, '--tier', TIER]
        .concat(['--tpot-ms', String(TPOT_MS), '--register', s.url])
        .concat(extra),
      { SWITCHYARD_WORKER_TOKEN: WORKER_TOKEN },
    );
    spawned.push(p);
    const id = (await p.waitFor(/"msg":"registered with \S+ as ([^\s"]+)"/, 15_000))[1]!;
    return { p, id };
  }

  const workers = async () =>
    (await s.admin('GET', '/workers')).body.data as Array<Record<string, unknown>>;

  const messages = (len: number) => [
    { role: 'user' as const, content: `[sim:len=${len}] ${randomUUID()}` },
  ];

  function stream(slug: string, len: number): { o: Outcome; end: Promise<Outcome> } {
    const o: Outcome = { worker: null, tokens: 0, done: false, error: null };
    const end = (async () => {
      try {
        const { data, response } = await clients
          .get(slug)!
          .chat.completions.create({ model: 'x', stream: true, messages: messages(len) })
          .withResponse();
        o.worker = response.headers.get('x-service-worker-id');
        for await (const chunk of data) if (chunk.choices[0]?.delta?.content) o.tokens++;
        o.done = true;
      } catch (err) {
        o.error = err;
      }
      return o;
    })();
    return { o, end };
  }

  before(async () => {
    process.on('exit', killAll);
    s = await startTestServer({
      env: {
        SWITCHYARD_ROUTE_CACHE_TTL_MS: '0',
        SWITCHYARD_WORKER_TOKEN: WORKER_TOKEN,
        SWITCHYARD_WORKER_HEARTBEAT_MS: '200',
      },
    });
    const p = await s.admin('POST', '/projects', { slug: 'dq', name: 'DQ' });
    const k = await s.admin('POST', '/projects/dq/keys', {});
    for (const [slug, model] of [
      ['chat', 'dq-sim'],
      ['late', 'dq-late'],
    ] as const) {
      assert.equal(
        (await s.admin('POST', '/models', { name: model, context_window: 4096 })).status,
        201,
      );
      const e = await s.admin('POST', '/projects/dq/endpoints', {
        slug,
        name: slug,
        model,
        tier: TIER,
      });
      assert.equal(e.status, 201, e.text);
      clients.set(
        slug,
        new OpenAI({
          baseURL: `${s.url}/${String(p.body.id)}/${slug}/v1`,
          apiKey: String(k.body.key),
          maxRetries: 0,
        }),
      );
    }
  });
  after(async () => {
    killAll();
    process.off('exit', killAll);
    await s.close();
  });

  it('open streams finish, new requests go elsewhere, then it deregisters and exits 0', async () => {
    // Both workers start first (a start can take seconds on a loaded machine, longer than
    // the streams last); b is drained meanwhile so that the streams all go to a.
    const a = await startWorker('dq-sim');
    const b = await startWorker('dq-sim');
    assert.equal((await s.admin('POST', `/workers/${b.id}/drain`)).status, 200);
    const LEN = 100; // 2 s of tokens each
    const streams = [stream('chat', LEN), stream('chat', LEN), stream('chat', LEN)];
    await until('every stream under way', () => streams.every((x) => x.o.tokens > 0));
    assert.ok(streams.every((x) => x.o.worker === a.id));
    assert.equal((await s.admin('POST', `/workers/${b.id}/resume`)).status, 200);
    await until('b a candidate again', async () =>
      (await workers()).some((w) => w.id === b.id && w.status !== 'draining'),
    );

    const exited = new Promise<number | null>((r) => a.p.child.once('exit', (c) => r(c)));
    a.p.child.kill('SIGTERM');
    await a.p.waitFor(/draining: 3 request\(s\) open/);
    assert.equal((await workers()).find((w) => w.id === a.id)?.status, 'draining');

    // Sent during the drain: all to the other worker.
    for (let i = 0; i < 4; i++) {
      const { response } = await clients
        .get('chat')!
        .chat.completions.create({ model: 'x', messages: messages(3) })
        .withResponse();
      assert.equal(response.headers.get('x-service-worker-id'), b.id);
    }
    assert.equal(a.p.child.exitCode, null, 'still running while its streams are open');

    for (const x of streams) {
      const o = await x.end;
      assert.equal(o.error, null, describeError(o.error));
      assert.equal(o.done, true);
      assert.equal(o.tokens, LEN);
    }
    assert.equal(await exited, 0);
    assert.match(a.p.stdout(), /drained/);
    assert.match(a.p.stdout(), new RegExp(`deregistered ${a.id}`));
    assert.equal(
      (await workers()).some((w) => w.id === a.id),
      false,
    );
  });

  it('past --drain-ms the open stream ends with the cancelled error; the worker exits 0', async () => {
    const c = await startWorker('dq-late', ['--drain-ms', '300']);
    const LEN = 2000; // 40 s of tokens: only the drain deadline ends it
    const x = stream('late', LEN);
    await until('the stream under way', () => x.o.tokens > 0);
    const exited = new Promise<number | null>((r) => c.p.child.once('exit', (code) => r(code)));
    c.p.child.kill('SIGTERM');
    const o = await x.end;
    assert.ok(o.error instanceof APIError, describeError(o.error));
    assert.equal(o.error.code, 'cancelled', describeError(o.error));
    assert.ok(o.tokens > 0 && o.tokens < LEN, `${o.tokens} tokens`);
    assert.equal(await exited, 0);
    assert.match(c.p.stdout(), /drain deadline passed: closing 1 open request\(s\)/);
  });
});
