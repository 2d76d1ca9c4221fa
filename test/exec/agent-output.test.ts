/**
 * What a real `switchyard agent` answers is stored whatever bytes the tool wrote: a
 * U+0000 (binary output, `find -print0`) cannot go in a PostgreSQL text column, so it
 * is kept as U+FFFD, as a worker's answer is (src/store/storable.ts), instead of the
 * result failing to record and the invocation hanging until the timeout backstop.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { pino } from 'pino';
import { Dealer } from 'zeromq';
import { Broker, generateKeyPair } from '../../src/exec/broker/index.js';
import { keyProof } from '../../src/exec/broker/keys.js';
import type { ToolSpec } from '../../src/exec/contracts.js';
import { startTestServer, type TestServer } from '../support/harness.js';
import { startRealAgent, until, type RealAgent } from './agents.js';
import { events, joinKey, seedExecProject, tool, workspace, type ExecProject } from './support.js';

/** Creates an invocation of `tool` and waits (real time, at most `ms`) until it ends. */
async function runToEnd(
  s: TestServer,
  p: ExecProject,
  tool: string,
  args: Record<string, unknown>,
  ms: number,
) {
  const r = await s.call('POST', `/${p.projectId}/v1/exec/invocations`, {
    key: p.exec,
    body: { tool, arguments: args, workspace_id: await workspace(s, p) },
  });
  assert.equal(r.status, 201, r.text);
  const id = String(r.body.id);
  const done = await until(
    async () => {
      const g = await s.call('GET', `/${p.projectId}/v1/exec/invocations/${id}`, { key: p.exec });
      return ['completed', 'failed', 'cancelled'].includes(String(g.body.status)) && g;
    },
    ms,
    'the invocation to end',
  );
  return { id, done };
}

describe('agent output with NUL bytes (real switchyard agent)', () => {
  let s: TestServer;
  let p: ExecProject;
  let agent: RealAgent;
  const dir = mkdtempSync(join(tmpdir(), 'swy-exec-output-'));
  before(async () => {
    s = await startTestServer();
    p = await seedExecProject(s, 'agent-output');
    agent = await startRealAgent(s, {
      dir,
      name: 'nul-writer',
      joinKey: await joinKey(s, p),
      tools: [
        {
          name: 'print0',
          description: 'Writes NUL-separated names to stdout and stderr.',
          input_schema: { type: 'object' },
          risk: 'read_only',
          default_timeout_ms: 10_000,
          command: ['sh', '-c', "printf 'a\\000b\\000'; printf 'e\\000' >&2"],
        },
      ],
    });
  });
  after(async () => {
    await agent?.close();
    await s?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('completes with each NUL kept as U+FFFD in stdout and stderr', async () => {
    const { done } = await runToEnd(s, p, 'print0', {}, 10_000);
    assert.equal(done.body.status, 'completed', done.text);
    assert.equal(done.body.exit_code, 0);
    assert.equal(done.body.stdout, 'a\uFFFDb\uFFFD');
    assert.equal(done.body.stderr, 'e\uFFFD');
  });
});

/**
 * A DEALER speaking the agent protocol itself (an agent of another make, or a buggy
 * one): enrolls, opens a session, and answers each DISPATCH with the RESULT `answer`
 * makes of it.
 */
async function rawAgent(
  broker: Broker,
  serverKey: string,
  jk: string,
  tools: ToolSpec[],
  answer: (dispatch: Record<string, unknown>) => Record<string, unknown>,
): Promise<{ acks: string[]; close(): void }> {
  const pair = generateKeyPair();
  const curve = {
    curveServerKey: serverKey,
    curvePublicKey: pair.publicKey,
    curveSecretKey: pair.secretKey,
    linger: 0,
    receiveTimeout: 5_000,
  };
  const enroll = new Dealer(curve);
  enroll.connect(broker.endpoints.enroll);
  await enroll.send(
    JSON.stringify({
      v: 1,
      type: 'ENROLL',
      join_key: jk,
      registration_name: `raw-${pair.publicKey.slice(0, 6).replace(/[^a-zA-Z0-9]/g, 'x')}`,
      manifest: { version: 1, tools },
      curve_public_key: pair.publicKey,
      key_proof: keyProof(pair.secretKey, serverKey, 'enroll', pair.publicKey),
    }),
  );
  const [enrolled] = await enroll.receive();
  enroll.close();
  assert.equal(JSON.parse(enrolled!.toString()).type, 'ENROLLED', enrolled!.toString());
  const socket = new Dealer(curve);
  socket.connect(broker.endpoints.agents);
  const acks: string[] = [];
  await socket.send(
    JSON.stringify({
      v: 1,
      type: 'HELLO',
      agent_key: pair.publicKey,
      key_proof: keyProof(pair.secretKey, serverKey, 'hello', pair.publicKey),
    }),
  );
  const [welcome] = await socket.receive();
  assert.equal(JSON.parse(welcome!.toString()).type, 'WELCOME', welcome!.toString());
  socket.receiveTimeout = -1;
  void (async () => {
    try {
      for await (const [frame] of socket) {
        const m = JSON.parse(frame!.toString()) as Record<string, unknown>;
        if (m.type === 'RESULT_ACK') acks.push(String(m.invocation_id));
        if (m.type !== 'DISPATCH') continue;
        await socket.send(
          JSON.stringify({
            v: 1,
            type: 'RESULT',
            invocation_id: m.invocation_id,
            outcome: answer(m),
          }),
        );
      }
    } catch {
      // closed
    }
  })();
  return { acks, close: () => socket.close() };
}

describe('an agent reporting an exit code no integer column holds', () => {
  let s: TestServer;
  let p: ExecProject;
  let broker: Broker;
  let agent: { acks: string[]; close(): void };
  before(async () => {
    s = await startTestServer();
    p = await seedExecProject(s, 'agent-exit-code');
    const keyPair = generateKeyPair();
    broker = await Broker.start({
      directory: s.services.exec,
      clock: s.clock,
      logger: pino({ level: 'silent' }),
      keyPair,
      bind: { enroll: 'tcp://127.0.0.1:0', agents: 'tcp://127.0.0.1:0' },
    });
    s.services.exec.setTransport(broker);
    agent = await rawAgent(
      broker,
      keyPair.publicKey,
      await joinKey(s, p),
      [tool('odd', { input_schema: { type: 'object' } })],
      (m) => ({
        kind: 'exited',
        exit_code: (m.arguments as { code: number }).code,
        duration_ms: 5,
        stdout: 'out',
        stderr: '',
        truncated: false,
      }),
    );
  });
  after(async () => {
    agent?.close();
    s?.services.exec.setTransport(null);
    await broker?.close();
    await s?.close();
  });

  for (const code of [2 ** 31, -(2 ** 31) - 1, 2 ** 53 - 1, 1.5]) {
    it(`exit_code ${code}: the result is recorded (failed, invalid_exit_code), not lost`, async () => {
      const { id, done } = await runToEnd(s, p, 'odd', { path: '/', code }, 5_000);
      assert.equal(done.body.status, 'failed', done.text);
      assert.equal(done.body.exit_code, null);
      assert.equal(done.body.stdout, 'out');
      const err = done.body.error as { code: string; message: string };
      assert.equal(err.code, 'invalid_exit_code');
      assert.match(err.message, new RegExp(String(code).replace('.', '\\.')));
      await until(() => agent.acks.includes(id), 5_000, 'RESULT_ACK');
      const failed = (await events(s, p.projectUuid, 'exec.failed')).find(
        (e) => e.data.invocation_id === id,
      );
      assert.equal(failed?.data.error_code, 'invalid_exit_code');
    });
  }
});
