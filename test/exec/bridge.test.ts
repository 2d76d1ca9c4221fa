/**
 * The chat-completions tool bridge (`x_exec: true`) through the official
 * `openai` SDK against the router and a `sim` worker (which calls the first
 * offered tool on `[sim:tool_call]` and, given a tool result, answers quoting
 * it): non-streaming and streaming round trips with the invocation and its
 * exec.* events, usage summed over the rounds and recorded once, the
 * workspace field, tool failures fed back to the model, and the errors
 * (tool_executor_unavailable, model_capability_missing, scope_insufficient,
 * client tools). One suite runs the tool on a real `switchyard agent` over CURVE.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { eq } from 'drizzle-orm';
import OpenAI from 'openai';
import { tables } from '../../src/store/index.js';
import { inferenceFixture, type InferenceFixture } from '../support/inference.js';
import { validateChunk, validateCompletion } from '../support/openai-schemas.js';
import { AutoTransport, startRealAgent, until, type RealAgent } from './agents.js';
import { enrollAgent, events, tool, type ExecProject } from './support.js';

type Body = OpenAI.Chat.ChatCompletionCreateParamsNonStreaming;
type StreamBody = OpenAI.Chat.ChatCompletionCreateParamsStreaming;

/** The bridge's extra request fields; the SDK forwards unknown body fields as they are. */
const bridged = <T>(body: T, extra: Record<string, unknown> = {}): T =>
  ({ ...body, x_exec: true, ...extra }) as T;

async function execProject(f: InferenceFixture): Promise<ExecProject> {
  const m = await f.server.admin('POST', '/projects/inf/keys', { scopes: ['management'] });
  const e = await f.server.admin('POST', '/projects/inf/keys', { scopes: ['execution'] });
  const proj = await f.server.admin('GET', '/projects/inf');
  return {
    projectId: f.projectId,
    projectUuid: String(proj.body.uuid),
    slug: 'inf',
    exec: String(e.body.key),
    mgmt: String(m.body.key),
    inference: f.key,
  };
}

async function apiError(p: Promise<unknown>): Promise<InstanceType<typeof OpenAI.APIError>> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof OpenAI.APIError, String(err));
    return err;
  }
  assert.fail('expected an API error');
}

describe('chat tool bridge (x_exec) with the OpenAI SDK', () => {
  let f: InferenceFixture;
  let p: ExecProject;
  let t: AutoTransport;
  let agentId: string;
  before(async () => {
    f = await inferenceFixture({ keyScopes: ['inference', 'execution'] });
    p = await execProject(f);
    t = new AutoTransport(f.server.services.exec, (req) =>
      req.tool === 'broken'
        ? { exitCode: 2, stdout: '', stderr: 'disk on fire' }
        : { exitCode: 0, stdout: `AGENT-OUTPUT-${req.tool}-${JSON.stringify(req.arguments)}` },
    );
    f.server.services.exec.setTransport(t);
    const pathSchema = {
      type: 'object',
      properties: { path: { type: 'string' } },
      required: ['path'],
      additionalProperties: false,
    };
    agentId = (
      await enrollAgent(f.server, p, {
        name: 'bridge-agent',
        tools: [tool('fs.read', { input_schema: pathSchema, risk: 'read_only' })],
        transport: t,
      })
    ).agentId;
  });
  after(() => f.close());

  const ask = (content: string) => ({
    model: 'anything',
    messages: [{ role: 'user' as const, content }],
    max_tokens: 600,
  });

  async function invocationsOf(requestId: string) {
    const ws = await f.server.services.store.db
      .select()
      .from(tables.workspaces)
      .where(eq(tables.workspaces.name, `chat ${requestId}`));
    assert.equal(ws.length, 1, 'one workspace per bridged request');
    return f.server.services.store.db
      .select()
      .from(tables.invocations)
      .where(eq(tables.invocations.workspaceId, ws[0]!.id));
  }

  async function usageRow(requestId: string) {
    await f.server.services.usage.flush();
    const [row] = await f.server.services.store.db
      .select()
      .from(tables.usageRecords)
      .where(eq(tables.usageRecords.requestId, requestId));
    return row;
  }

  it('non-streaming: the model calls a catalog tool, the agent runs it, the model answers with the result', async () => {
    const before = f.worker.stats().httpRequests;
    const data = await f.client.chat.completions.create(
      bridged<Body>(ask('Read the config file. [sim:tool_call]')),
    );
    assert.deepEqual(validateCompletion(data), []);
    assert.equal(f.worker.stats().httpRequests - before, 2, 'two rounds upstream');
    const choice = data.choices[0]!;
    assert.equal(choice.finish_reason, 'stop');
    assert.equal(choice.message.tool_calls ?? null, null);
    assert.match(choice.message.content ?? '', /AGENT-OUTPUT-fs\.read-/);
    assert.equal(data.service_tier, 'cpu' as never);

    const invs = await invocationsOf(data.id);
    assert.equal(invs.length, 1);
    const inv = invs[0]!;
    assert.equal(inv.tool, 'fs.read');
    assert.equal(inv.status, 'completed');
    assert.equal(typeof (inv.arguments as Record<string, unknown>).path, 'string');
    assert.equal(t.dispatched.at(-1)?.agentId, agentId);
    const dispatched = await events(f.server, p.projectUuid, 'exec.dispatched');
    assert.ok(dispatched.some((e) => e.data.invocation_id === inv.externalId));
    const completed = await events(f.server, p.projectUuid, 'exec.completed');
    assert.ok(completed.some((e) => e.data.invocation_id === inv.externalId));

    // One usage record for the request, carrying the sum of both rounds.
    const u = data.usage!;
    assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
    const row = await usageRow(data.id);
    assert.ok(row);
    assert.equal(row.status, 'completed');
    assert.equal(row.promptTokens, u.prompt_tokens);
    assert.equal(row.completionTokens, u.completion_tokens);
    // The second round's prompt alone already holds the first round's prompt.
    const single = await f.client.chat.completions.create(ask('Read the config file.'));
    assert.ok(u.prompt_tokens > 2 * single.usage!.prompt_tokens, 'prompts of both rounds summed');
  });

  it('streaming: tool rounds first, then the answer streams; service_tier on every chunk; usage summed', async () => {
    for (const includeUsage of [true, false]) {
      const stream = await f.client.chat.completions.create(
        bridged<StreamBody>({
          ...ask('Stream the config file. [sim:tool_call]'),
          stream: true,
          ...(includeUsage ? { stream_options: { include_usage: true } } : {}),
        }),
      );
      const chunks = [];
      for await (const c of stream) chunks.push(c);
      assert.ok(chunks.length >= 3);
      assert.equal(new Set(chunks.map((c) => c.id)).size, 1);
      let text = '';
      for (const c of chunks) {
        assert.deepEqual(validateChunk(c), [], JSON.stringify(c));
        assert.equal(c.service_tier, 'cpu' as never);
        for (const ch of c.choices) {
          assert.equal(ch.delta.tool_calls, undefined, 'tool rounds never reach the client');
          text += ch.delta.content ?? '';
        }
      }
      assert.equal(chunks[0]!.choices[0]!.delta.role, 'assistant');
      assert.equal(chunks.filter((c) => c.choices[0]?.delta.role).length, 1, 'role once');
      assert.match(text, /AGENT-OUTPUT-fs\.read-/);
      const finishes = chunks.flatMap((c) => c.choices.map((x) => x.finish_reason)).filter(Boolean);
      assert.deepEqual(finishes, ['stop']);
      const last = chunks.at(-1)!;
      const row = await usageRow(last.id);
      assert.ok(row);
      assert.equal(row.stream, 1);
      if (includeUsage) {
        assert.deepEqual(last.choices, []);
        assert.equal(last.usage!.prompt_tokens, row.promptTokens);
        assert.equal(last.usage!.completion_tokens, row.completionTokens);
      } else {
        assert.ok(
          chunks.every((c) => !c.usage),
          'no usage without include_usage',
        );
      }
      assert.equal((await invocationsOf(last.id)).length, 1);
    }
  });

  it('store: true keeps the bridged answer as the client got it, streamed or not', async () => {
    const plain = await f.client.chat.completions.create(
      bridged<Body>({
        ...ask('Read it and keep it. [sim:tool_call]'),
        store: true,
        metadata: { b: '1' },
      }),
    );
    const stream = await f.client.chat.completions.create(
      bridged<StreamBody>({
        ...ask('Stream it and keep it. [sim:tool_call]'),
        stream: true,
        store: true,
      }),
    );
    let text = '';
    let id = '';
    for await (const c of stream) {
      id = c.id;
      text += c.choices[0]?.delta.content ?? '';
    }
    await f.server.services.completions.flush();
    const kept = await f.client.chat.completions.retrieve(plain.id);
    assert.deepEqual(kept, { ...plain, metadata: { b: '1' } });
    const keptStream = await f.client.chat.completions.retrieve(id);
    assert.equal(keptStream.choices[0]!.message.content, text);
    assert.match(text, /AGENT-OUTPUT-fs\.read-/);
    assert.equal(keptStream.choices[0]!.finish_reason, 'stop');
    assert.equal(keptStream.choices[0]!.message.tool_calls, null, 'tool rounds are not the answer');
    const row = await usageRow(id);
    assert.equal(keptStream.usage!.prompt_tokens, row!.promptTokens);
    const messages = await f.client.chat.completions.messages.list(id);
    assert.deepEqual(
      messages.data.map((m) => m.content),
      ['Stream it and keep it. [sim:tool_call]'],
    );
  });

  it('x_exec_workspace_id: the invocations run in that workspace; a bad id is 400', async () => {
    const ws = await f.server.call('POST', `/${p.projectId}/v1/exec/workspaces`, {
      key: p.exec,
      body: { name: 'chosen' },
    });
    const wsId = String(ws.body.id);
    const data = await f.client.chat.completions.create(
      bridged<Body>(ask('Use my workspace. [sim:tool_call]'), { x_exec_workspace_id: wsId }),
    );
    assert.match(data.choices[0]!.message.content ?? '', /AGENT-OUTPUT/);
    const list = await f.server.call(
      'GET',
      `/${p.projectId}/v1/exec/invocations?workspace_id=${wsId}`,
      { key: p.exec },
    );
    assert.equal((list.body.data as unknown[]).length, 1);
    const bad = await apiError(
      f.client.chat.completions.create(
        bridged<Body>(ask('x [sim:tool_call]'), { x_exec_workspace_id: 'not-a-workspace' }),
      ),
    );
    assert.equal(bad.status, 400);
    assert.equal(bad.code, 'invalid_workspace_id');
    assert.equal(bad.param, 'x_exec_workspace_id');
  });

  it('a failing tool is reported to the model, which still answers', async () => {
    const tp = new AutoTransport(f.server.services.exec, () => ({
      exitCode: 2,
      stdout: '',
      stderr: 'disk on fire',
    }));
    tp.connected = t.connected;
    f.server.services.exec.setTransport(tp);
    try {
      const data = await f.client.chat.completions.create(
        bridged<Body>(ask('Try it. [sim:tool_call]')),
      );
      const text = data.choices[0]!.message.content ?? '';
      assert.match(text, /"status":"failed"/);
      assert.match(text, /disk on fire/);
      assert.match(text, /nonzero_exit/);
      const failed = await events(f.server, p.projectUuid, 'exec.failed');
      assert.ok(failed.length >= 1);
    } finally {
      f.server.services.exec.setTransport(t);
    }
  });

  it('503 tool_executor_unavailable when no agent is online for the called tool (both modes)', async () => {
    t.connected.delete(agentId);
    try {
      for (const stream of [false, true]) {
        const body = { ...ask('Read it. [sim:tool_call]'), ...(stream ? { stream: true } : {}) };
        const err = await apiError(f.client.chat.completions.create(bridged(body as Body)));
        assert.equal(err.status, 503);
        assert.equal(err.code, 'tool_executor_unavailable');
        assert.equal(err.type, 'server_error');
        assert.equal(err.headers?.get('retry-after'), '5');
      }
      // A bad workspace id is the client's 400 whether or not an agent is online,
      // even with no tool in the catalog at all (no agent of the project online).
      const catalog = f.server.services.exec.catalog;
      const list = catalog.list.bind(catalog);
      catalog.list = async () => [];
      const bad = await apiError(
        f.client.chat.completions.create(
          bridged<Body>(ask('x [sim:tool_call]'), {
            x_exec_workspace_id: '7f518730-67d2-5b93-a71a-9f7000000000',
          }),
        ),
      );
      catalog.list = list;
      assert.equal(bad.status, 400);
      assert.equal(bad.code, 'invalid_workspace_id');
    } finally {
      t.connected.add(agentId);
    }
  });

  it('the tier deadline bounds the whole exchange: 408, and the running invocation is cancelled', async () => {
    t.hang.add('fs.read');
    try {
      const sent = t.dispatched.length;
      const pending = apiError(
        f.client.chat.completions.create(bridged<Body>(ask('Hang. [sim:tool_call]'))),
      );
      await until(() => t.dispatched.length > sent, 5_000, 'the dispatch');
      const invId = t.dispatched.at(-1)!.req.invocationId;
      f.server.clock.advance(300_000); // the cpu tier's request deadline
      const err = await pending;
      assert.equal(err.status, 408);
      assert.equal(err.code, 'request_timeout');
      assert.equal(err.type, 'timeout_error');
      const inv = await until(async () => {
        const r = await f.server.call('GET', `/${p.projectId}/v1/exec/invocations/${invId}`, {
          key: p.exec,
        });
        return r.body.status === 'cancelled' ? r : undefined;
      });
      assert.equal(inv.body.status, 'cancelled');
      assert.ok(
        t.cancelled.some((c) => c.invocationId === invId),
        'the agent was told',
      );
      const row = await usageRow(String(err.headers?.get('x-request-id')));
      assert.equal(row?.status, 'timeout');
    } finally {
      t.hang.delete('fs.read');
      // Time jumped past the agent's lease: renew it, as the agent would.
      await f.server.services.exec.renew(agentId);
    }
  });

  it('400 model_capability_missing when the endpoint model lacks tool_calling', async () => {
    const s = f.server;
    await s.admin('POST', '/models', {
      name: 'plain-model',
      context_window: 4096,
      capabilities: [],
    });
    await s.admin('POST', '/workers', {
      model: 'plain-model',
      tier: 'cpu',
      url: f.worker.url,
      id: 'sim-plain',
    });
    const e = await s.admin('POST', '/projects/inf/endpoints', {
      slug: 'plain',
      name: 'Plain',
      model: 'plain-model',
      tier: 'cpu',
    });
    assert.equal(e.status, 201, e.text);
    const client = new OpenAI({
      baseURL: `${s.url}/${f.projectId}/plain/v1`,
      apiKey: f.key,
      maxRetries: 0,
    });
    const err = await apiError(client.chat.completions.create(bridged<Body>(ask('hi'))));
    assert.equal(err.status, 400);
    assert.equal(err.code, 'model_capability_missing');
    assert.equal(err.param, 'x_exec');
  });

  it('403 scope_insufficient (authentication_error) for a key without the execution scope', async () => {
    const k = await f.server.admin('POST', '/projects/inf/keys', { scopes: ['inference'] });
    const client = new OpenAI({ baseURL: f.baseURL, apiKey: String(k.body.key), maxRetries: 0 });
    const err = await apiError(client.chat.completions.create(bridged<Body>(ask('hi'))));
    assert.equal(err.status, 403);
    assert.equal(err.code, 'scope_insufficient');
    assert.equal(err.type, 'authentication_error');
    // The same key without x_exec is fine.
    const ok = await client.chat.completions.create(ask('hi'));
    assert.equal(ok.object, 'chat.completion');
  });

  it('client tools cannot be combined with x_exec (the bridge owns the tool list)', async () => {
    const err = await apiError(
      f.client.chat.completions.create(
        bridged<Body>({
          ...ask('hi'),
          tools: [{ type: 'function', function: { name: 'mine', parameters: { type: 'object' } } }],
        }),
      ),
    );
    assert.equal(err.status, 400);
    assert.equal(err.code, 'unsupported_value');
    assert.equal(err.param, 'tools');
  });
});

describe('chat tool bridge with a real switchyard agent over CURVE', () => {
  let f: InferenceFixture;
  let agent: RealAgent;
  const dir = mkdtempSync(join(tmpdir(), 'swy-bridge-agent-'));
  before(async () => {
    f = await inferenceFixture({ keyScopes: ['inference', 'execution'] });
    const p = await execProject(f);
    const jk = await f.server.call('POST', `/${p.projectId}/v1/join_keys`, {
      key: p.mgmt,
      body: { name: 'bridge' },
    });
    assert.equal(jk.status, 201, jk.text);
    agent = await startRealAgent(f.server, {
      dir,
      name: 'real-bridge',
      joinKey: String(jk.body.key),
      tools: [
        {
          name: 'host.echo',
          description: 'Echoes its arguments.',
          input_schema: {
            type: 'object',
            properties: { path: { type: 'string' } },
            required: ['path'],
          },
          risk: 'read_only',
          mcp_visible: true,
          default_timeout_ms: 10_000,
          command: ['sh', '-c', 'echo "REAL-AGENT-SAYS $SWITCHYARD_TOOL_ARGS"'],
        },
      ],
    });
  });
  after(async () => {
    await agent?.close();
    await f?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('runs the model’s tool call on the agent process and answers with its output (streamed)', async () => {
    const stream = await f.client.chat.completions.create(
      bridged<StreamBody>({
        model: 'x',
        messages: [{ role: 'user', content: 'Echo something. [sim:tool_call]' }],
        max_tokens: 600,
        stream: true,
        stream_options: { include_usage: true },
      }),
    );
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const c of stream) {
      for (const ch of c.choices) text += ch.delta.content ?? '';
      usage = c.usage ?? usage;
    }
    assert.match(text, /REAL-AGENT-SAYS \{\\"path\\":/);
    assert.ok(usage && usage.prompt_tokens > 0);
    const list = await f.server.services.store.db.select().from(tables.invocations);
    assert.equal(list.length, 1);
    assert.equal(list[0]!.status, 'completed');
    assert.equal(list[0]!.exitCode, 0);
  });
});
