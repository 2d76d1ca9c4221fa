/**
 * Agent sessions through a real broker and the in-process agent client: lease
 * renewals reach the directory and `isConnected` follows the broker's clock;
 * dispatch → STARTED → RESULT; timeout, cancel and truncation as outcomes;
 * dispatch to an agent without a session rejects; a stopping agent says BYE;
 * after a broker restart on the same ports the agent reconnects by itself.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { AgentClient } from '../../src/exec/agent/client.js';
import { loadManifestFile } from '../../src/exec/agent/manifest.js';
import { AgentNotConnectedError, type Broker } from '../../src/exec/broker/index.js';
import type { CurveKeyPair } from '../../src/exec/broker/keys.js';
import type { FakeClock } from '../../src/runtime/clock.js';
import {
  eventually,
  FakeDirectory,
  JOIN_KEY,
  manifestFile,
  silentLogger,
  startTestBroker,
  tempDir,
} from './support.js';

describe('agent sessions', () => {
  const tmp = tempDir('swy-session-');
  const directory = new FakeDirectory();
  let broker: Broker;
  let clock: FakeClock;
  let keyPair: CurveKeyPair;
  let agent: AgentClient;
  let agentId: string;
  let running: Promise<void>;
  let seq = 0;
  const inv = () => `inv_${(++seq).toString(16).padStart(8, '0')}`;

  before(async () => {
    directory.leaseMs = 300; // the agent renews every 100 ms (real time)
    ({ broker, clock, keyPair } = await startTestBroker(directory));
    agent = new AgentClient({
      enrollEndpoint: broker.endpoints.enroll,
      agentEndpoint: broker.endpoints.agents,
      serverKey: keyPair.publicKey,
      joinKey: JOIN_KEY,
      registrationName: 'session-agent',
      manifest: loadManifestFile(manifestFile(tmp.dir)),
      keyFile: join(tmp.dir, 'agent.key'),
      logger: silentLogger,
      toolEnv: { PATH: process.env.PATH },
      killGraceMs: 150,
      maxOutputBytes: 4096,
      reconnectMinMs: 20,
      reconnectMaxMs: 100,
      requestTimeoutMs: 1_000,
    });
    const connected = new Promise<string>((resolve) => agent.once('connected', resolve));
    running = agent.run();
    agentId = await connected;
  });
  after(async () => {
    await agent.stop();
    await running;
    await broker.close();
    tmp.cleanup();
  });

  it('renews its lease: each renewal reaches directory.renew', async () => {
    assert.ok(broker.isConnected(agentId));
    const before = directory.renewals.length;
    await eventually(() => directory.renewals.length >= before + 2, 2_000, 'two renewals');
    assert.ok(directory.renewals.slice(before).every((id) => id === agentId));
  });

  it('isConnected follows the lease on the broker clock', async () => {
    clock.advance(directory.leaseMs + 1);
    assert.equal(broker.isConnected(agentId), false, 'lease ran out on the broker clock');
    await assert.rejects(
      broker.dispatch(agentId, {
        invocationId: inv(),
        tool: 'echo',
        arguments: {},
        timeoutMs: 1000,
      }),
      AgentNotConnectedError,
    );
    // The next renewal (real time, ≤ 100 ms) brings it back.
    await eventually(() => broker.isConnected(agentId), 2_000, 'renewed again');
  });

  it('dispatch → STARTED → RESULT with exit code, stdout and stderr', async () => {
    const id = inv();
    const args = { msg: 'hello' };
    await broker.dispatch(agentId, {
      invocationId: id,
      tool: 'echo',
      arguments: args,
      timeoutMs: 5_000,
    });
    const outcome = await eventually(() => directory.outcomeOf(id), 5_000, 'result');
    assert.ok(directory.startedCalls.some((s) => s.invocationId === id && s.agentId === agentId));
    const startedAt = directory.startedCalls.findIndex((s) => s.invocationId === id);
    assert.ok(startedAt >= 0);
    assert.equal(outcome.kind, 'exited');
    if (outcome.kind !== 'exited') return;
    assert.equal(outcome.exitCode, 3);
    assert.equal(outcome.stdout, `${JSON.stringify(args)}\nenv:${JSON.stringify(args)}\n`);
    assert.equal(outcome.stderr, 'oops\n');
    assert.equal(outcome.truncated, false);
    assert.equal(directory.finishedCalls.find((f) => f.invocationId === id)?.agentId, agentId);
  });

  it('a tool that outlives timeout_ms → timeout, after SIGTERM then SIGKILL', async () => {
    const id = inv();
    await broker.dispatch(agentId, {
      invocationId: id,
      tool: 'stubborn',
      arguments: {},
      timeoutMs: 100,
    });
    const outcome = await eventually(() => directory.outcomeOf(id), 5_000, 'timeout result');
    assert.equal(outcome.kind, 'timeout');
    if (outcome.kind === 'timeout') assert.ok(outcome.elapsedMs >= 240, `${outcome.elapsedMs}`);
    assert.ok(existsSync(join(tmp.dir, 'term-mark')), 'SIGTERM came first');
  });

  it('cancel → cancelled', async () => {
    const id = inv();
    await broker.dispatch(agentId, {
      invocationId: id,
      tool: 'sleep',
      arguments: {},
      timeoutMs: 10_000,
    });
    await eventually(
      () => directory.startedCalls.some((s) => s.invocationId === id),
      2_000,
      'started',
    );
    await broker.cancel(agentId, id);
    const outcome = await eventually(() => directory.outcomeOf(id), 5_000, 'cancel result');
    assert.equal(outcome.kind, 'cancelled');
  });

  it('cancel of an invocation the agent does not run still settles it', async () => {
    const id = inv();
    await broker.cancel(agentId, id);
    const outcome = await eventually(() => directory.outcomeOf(id), 2_000, 'cancel answer');
    assert.deepEqual(outcome, { kind: 'cancelled', durationMs: 0 });
  });

  it('output beyond the bound is cut and flagged', async () => {
    const id = inv();
    await broker.dispatch(agentId, {
      invocationId: id,
      tool: 'flood',
      arguments: {},
      timeoutMs: 5_000,
    });
    const outcome = await eventually(() => directory.outcomeOf(id), 5_000, 'flood result');
    assert.equal(outcome.kind, 'exited');
    if (outcome.kind !== 'exited') return;
    assert.equal(outcome.stdout.length, 4096);
    assert.equal(outcome.truncated, true);
  });

  it('a result larger than the broker takes is cut to fit and flagged, not lost', async () => {
    // An agent allowed more output than one message carries (4 MiB): the broker would
    // drop the connection of a peer sending more, again at every resend.
    const big = new AgentClient({
      enrollEndpoint: broker.endpoints.enroll,
      agentEndpoint: broker.endpoints.agents,
      serverKey: keyPair.publicKey,
      joinKey: JOIN_KEY,
      registrationName: 'big-output-agent',
      manifest: loadManifestFile(
        manifestFile(tmp.dir, [
          {
            name: 'bigflood',
            description: 'bigflood tool',
            input_schema: { type: 'object' },
            risk: 'read_only',
            command: ['sh', '-c', 'head -c 5000000 /dev/zero | tr "\\0" x'],
          },
        ]),
      ),
      keyFile: join(tmp.dir, 'big-agent.key'),
      logger: silentLogger,
      toolEnv: { PATH: process.env.PATH },
      killGraceMs: 150,
      maxOutputBytes: 8 * 1024 * 1024,
      reconnectMinMs: 20,
      reconnectMaxMs: 100,
      requestTimeoutMs: 1_000,
    });
    const connected = new Promise<string>((resolve) => big.once('connected', resolve));
    const run = big.run();
    try {
      const bigId = await connected;
      const id = inv();
      await broker.dispatch(bigId, {
        invocationId: id,
        tool: 'bigflood',
        arguments: {},
        timeoutMs: 10_000,
      });
      const outcome = await eventually(() => directory.outcomeOf(id), 8_000, 'bigflood result');
      assert.equal(outcome.kind, 'exited');
      if (outcome.kind !== 'exited') return;
      assert.equal(outcome.exitCode, 0);
      assert.equal(outcome.truncated, true);
      assert.ok(outcome.stdout.length > 1_000_000, `kept ${outcome.stdout.length}`);
      assert.ok(outcome.stdout.length < 4 * 1024 * 1024);
      assert.match(outcome.stdout, /^x+$/);
    } finally {
      await big.stop();
      await run;
    }
  });

  it('an unknown tool is an error outcome', async () => {
    const id = inv();
    await broker.dispatch(agentId, {
      invocationId: id,
      tool: 'nope',
      arguments: {},
      timeoutMs: 5_000,
    });
    const outcome = await eventually(() => directory.outcomeOf(id), 2_000, 'error result');
    assert.equal(outcome.kind, 'error');
    if (outcome.kind === 'error') assert.equal(outcome.errorCode, 'tool_unknown');
  });

  it('dispatch to an agent that never connected rejects', async () => {
    await assert.rejects(
      broker.dispatch('agt_nobody', {
        invocationId: inv(),
        tool: 'echo',
        arguments: {},
        timeoutMs: 1,
      }),
      (err: unknown) => err instanceof AgentNotConnectedError && err.code === 'agent_not_connected',
    );
    await assert.rejects(broker.cancel('agt_nobody', 'inv_x'), AgentNotConnectedError);
  });

  it('reconnects by itself after a broker restart on the same ports', async () => {
    const endpoints = broker.endpoints;
    let disconnects = 0;
    agent.on('disconnected', () => disconnects++);
    const reconnected = new Promise<string>((resolve) => agent.once('connected', resolve));
    await broker.close();
    assert.equal(broker.isConnected(agentId), false);
    ({ broker } = await startTestBroker(directory, {
      keyPair,
      clock,
      bind: { enroll: endpoints.enroll, agents: endpoints.agents },
    }));
    assert.equal(await reconnected, agentId);
    assert.ok(disconnects >= 1);
    assert.ok(broker.isConnected(agentId));
    // And it works on the new broker.
    const id = inv();
    await broker.dispatch(agentId, {
      invocationId: id,
      tool: 'echo',
      arguments: {},
      timeoutMs: 5_000,
    });
    assert.equal(
      (await eventually(() => directory.outcomeOf(id), 5_000, 'result'))?.kind,
      'exited',
    );
  });

  it('a result the broker could not record is sent again on the next session', async () => {
    const id = inv();
    // The broker goes away while the tool runs; the result is delivered after reconnecting.
    const endpoints = broker.endpoints;
    await broker.dispatch(agentId, {
      invocationId: id,
      tool: 'echo',
      arguments: {},
      timeoutMs: 5_000,
    });
    await broker.close();
    await new Promise((r) => setTimeout(r, 100)); // the tool finishes while no broker listens
    const reconnected = new Promise<string>((resolve) => agent.once('connected', resolve));
    ({ broker } = await startTestBroker(directory, {
      keyPair,
      clock,
      bind: { enroll: endpoints.enroll, agents: endpoints.agents },
    }));
    await reconnected;
    const outcome = await eventually(() => directory.outcomeOf(id), 5_000, 'resent result');
    assert.equal(outcome.kind, 'exited');
  });

  it('a stopping agent says BYE: the broker drops the session at once', async () => {
    assert.ok(broker.isConnected(agentId));
    await agent.stop();
    await running;
    await eventually(() => !broker.isConnected(agentId), 2_000, 'session dropped');
  });
});
