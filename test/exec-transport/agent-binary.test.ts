/**
 * The real `switchyard agent` binary (bin/switchyard.js over dist/, built
 * before the tests) against an in-process broker: a rejected enrollment
 * prints the code and exits 3; a good one connects, runs a tool whose
 * environment carries no agent secret, survives a broker restart, stops on
 * SIGTERM with exit 0 and a BYE, and a restart reuses its identity without
 * enrolling again. Secrets never appear in its output.
 */
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Broker } from '../../src/exec/broker/index.js';
import type { CurveKeyPair } from '../../src/exec/broker/keys.js';
import type { FakeClock } from '../../src/runtime/clock.js';
import { runSwitchyard, spawnSwitchyard, type Spawned } from '../support/process.js';
import {
  eventually,
  FakeDirectory,
  JOIN_KEY,
  manifestFile,
  sh,
  startTestBroker,
  tempDir,
} from './support.js';

describe('switchyard agent (binary)', () => {
  const tmp = tempDir('swy-agent-bin-');
  const directory = new FakeDirectory();
  let broker: Broker;
  let clock: FakeClock;
  let keyPair: CurveKeyPair;
  let manifest: string;
  let proc: Spawned | undefined;
  const keyFile = join(tmp.dir, 'agent.key');

  before(async () => {
    directory.leaseMs = 300;
    ({ broker, clock, keyPair } = await startTestBroker(directory));
    manifest = manifestFile(tmp.dir, [
      {
        name: 'env',
        description: 'prints its environment',
        input_schema: { type: 'object' },
        risk: 'read_only',
        mcp_visible: false,
        default_timeout_ms: 5_000,
        command: sh('env'),
      },
    ]);
  });
  after(async () => {
    await proc?.stop('SIGKILL');
    await broker.close();
    tmp.cleanup();
  });

  const env = (extra: Record<string, string> = {}) => ({
    SWITCHYARD_AGENT_ENROLL_ENDPOINT: broker.endpoints.enroll,
    SWITCHYARD_AGENT_ENDPOINT: broker.endpoints.agents,
    SWITCHYARD_AGENT_SERVER_KEY: keyPair.publicKey,
    SWITCHYARD_AGENT_MANIFEST: manifest,
    SWITCHYARD_AGENT_KEY_FILE: keyFile,
    SWITCHYARD_AGENT_RECONNECT_MIN_MS: '20',
    SWITCHYARD_AGENT_RECONNECT_MAX_MS: '200',
    SWITCHYARD_AGENT_KILL_GRACE_MS: '100',
    ...extra,
  });
  const connections = (p: Spawned) => p.stdout().split('"msg":"connected to broker"').length - 1;

  it('a rejected enrollment prints `enrollment rejected: <code>: <message>` and exits 3', async () => {
    const r = await runSwitchyard(
      ['agent', '--name', 'bin-agent', '--key-file', join(tmp.dir, 'rejected.key')],
      env({ SWITCHYARD_AGENT_JOIN_KEY: 'swyjk_not_a_real_key' }),
    );
    assert.equal(r.code, 3, r.stderr);
    assert.match(r.stderr, /^enrollment rejected: join_key_invalid: join key unknown or revoked$/m);
    assert.ok(!(r.stdout + r.stderr).includes('swyjk_not_a_real_key'), 'join key not printed');
  });

  it('enrolls, connects and runs a tool; tools do not see the agent settings', async () => {
    proc = spawnSwitchyard(
      ['agent', '--name', 'bin-agent'],
      env({ SWITCHYARD_AGENT_JOIN_KEY: JOIN_KEY }),
    );
    await proc.waitFor(/"msg":"connected to broker"/, 15_000);
    assert.equal(directory.enrolls.at(-1)?.registrationName, 'bin-agent');
    const agentId = [...directory.agents.values()].at(-1)!.agentId;
    assert.match(agentId, /^agt_/);
    assert.ok(broker.isConnected(agentId));

    await broker.dispatch(agentId, {
      invocationId: 'inv_bin_1',
      tool: 'echo',
      arguments: { a: 1 },
      timeoutMs: 5_000,
    });
    const o = await eventually(() => directory.outcomeOf('inv_bin_1'), 5_000, 'echo result');
    assert.equal(o.kind, 'exited');
    if (o.kind === 'exited') {
      assert.equal(o.exitCode, 3);
      assert.equal(o.stdout, '{"a":1}\nenv:{"a":1}\n');
    }

    await broker.dispatch(agentId, {
      invocationId: 'inv_bin_env',
      tool: 'env',
      arguments: {},
      timeoutMs: 5_000,
    });
    const e = await eventually(() => directory.outcomeOf('inv_bin_env'), 5_000, 'env result');
    assert.equal(e.kind, 'exited');
    if (e.kind === 'exited') {
      assert.match(e.stdout, /^SWITCHYARD_INVOCATION_ID=inv_bin_env$/m);
      assert.doesNotMatch(e.stdout, /SWITCHYARD_AGENT_/);
      assert.ok(!e.stdout.includes(JOIN_KEY));
    }

    await broker.dispatch(agentId, {
      invocationId: 'inv_bin_t',
      tool: 'sleep',
      arguments: {},
      timeoutMs: 100,
    });
    assert.equal(
      (await eventually(() => directory.outcomeOf('inv_bin_t'), 5_000, 'timeout'))?.kind,
      'timeout',
    );
  });

  it('reconnects after the broker restarts', async () => {
    const before = connections(proc!);
    const endpoints = broker.endpoints;
    await broker.close();
    ({ broker } = await startTestBroker(directory, { keyPair, clock, bind: endpoints }));
    await eventually(() => connections(proc!) > before, 10_000, 'reconnection');
    const agentId = [...directory.agents.values()].at(-1)!.agentId;
    await eventually(() => broker.isConnected(agentId), 2_000, 'connected on the new broker');
  });

  it('SIGTERM: says BYE and exits 0; secrets never reach its output', async () => {
    const agentId = [...directory.agents.values()].at(-1)!.agentId;
    assert.equal(await proc!.stop('SIGTERM'), 0);
    await eventually(() => !broker.isConnected(agentId), 2_000, 'session dropped');
    const out = proc!.stdout() + proc!.stderr();
    assert.ok(!out.includes(JOIN_KEY), 'join key not logged');
    const secret = (JSON.parse(readFileSync(keyFile, 'utf8')) as { secret_key: string }).secret_key;
    assert.ok(!out.includes(secret), 'secret key not logged');
    assert.ok(!out.includes(keyPair.secretKey));
  });

  it('a restart keeps its identity and does not enroll again', async () => {
    const enrolls = directory.enrolls.length;
    const agentId = [...directory.agents.values()].at(-1)!.agentId;
    proc = spawnSwitchyard(['agent'], env()); // no join key, no name: the key file has the agent id
    await proc.waitFor(/"msg":"connected to broker"/, 15_000);
    assert.match(proc.stdout(), new RegExp(`"agentId":"${agentId}"`));
    assert.equal(directory.enrolls.length, enrolls);
    assert.ok(broker.isConnected(agentId));
    assert.equal(await proc.stop('SIGTERM'), 0);
  });

  it('a restart with a changed manifest enrolls it again, and without a join key refuses to run', async () => {
    const agentId = [...directory.agents.values()].at(-1)!.agentId;
    mkdirSync(join(tmp.dir, 'changed'));
    const changed = manifestFile(join(tmp.dir, 'changed'), [
      {
        name: 'env',
        description: 'prints its environment',
        input_schema: { type: 'object' },
        risk: 'destructive', // was read_only: the router must learn it before dispatching
        mcp_visible: false,
        default_timeout_ms: 5_000,
        command: sh('env'),
      },
    ]);
    const refused = await runSwitchyard(['agent'], env({ SWITCHYARD_AGENT_MANIFEST: changed }));
    assert.equal(refused.code, 4, refused.stderr);
    assert.match(refused.stderr, /^enrollment failed: manifest_changed: /m);
    assert.equal(broker.isConnected(agentId), false);

    const enrolls = directory.enrolls.length;
    proc = spawnSwitchyard(
      ['agent'],
      env({ SWITCHYARD_AGENT_MANIFEST: changed, SWITCHYARD_AGENT_JOIN_KEY: JOIN_KEY }),
    );
    await proc.waitFor(/"msg":"connected to broker"/, 15_000);
    assert.equal(directory.enrolls.length, enrolls + 1, 'enrolled again');
    const again = directory.enrolls.at(-1)!;
    assert.equal(again.registrationName, 'bin-agent', 'the enrolled name, from the identity file');
    const sent = again.manifest as { tools: Array<{ name: string; risk: string }> };
    assert.equal(sent.tools.find((t) => t.name === 'env')?.risk, 'destructive');
    assert.match(proc.stdout(), new RegExp(`"agentId":"${agentId}"`), 'the same agent');
    assert.equal(await proc.stop('SIGTERM'), 0);

    // And the next restart with that manifest needs nothing more.
    proc = spawnSwitchyard(['agent'], env({ SWITCHYARD_AGENT_MANIFEST: changed }));
    await proc.waitFor(/"msg":"connected to broker"/, 15_000);
    assert.equal(directory.enrolls.length, enrolls + 1);
    assert.equal(await proc.stop('SIGTERM'), 0);
  });
  it('a truncated identity file: says which file and exits 2, no parser message', async () => {
    const broken = join(tmp.dir, 'truncated.key');
    writeFileSync(broken, '{"version": 1, "public_key": "abc', { mode: 0o600 });
    const r = await runSwitchyard(['agent', '--key-file', broken], env());
    assert.equal(r.code, 2, r.stderr);
    assert.match(
      r.stderr,
      /^switchyard agent: key file .*truncated\.key is not a switchyard agent key file/m,
    );
    assert.doesNotMatch(r.stderr, /SyntaxError|Unexpected|at position|^\s+at /m);
  });

  it('a join key file that cannot be read: says so and exits 2', async () => {
    const r = await runSwitchyard(
      ['agent', '--name', 'bin-agent', '--key-file', join(tmp.dir, 'nofile.key')],
      env({ SWITCHYARD_AGENT_JOIN_KEY_FILE: join(tmp.dir, 'missing-join-key') }),
    );
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /^switchyard agent: join key file .*missing-join-key: ENOENT/m);
  });

  it('--join-key-file wins over SWITCHYARD_AGENT_JOIN_KEY (flags win), its CRLF ignored', async () => {
    const file = join(tmp.dir, 'join-key');
    writeFileSync(file, `${JOIN_KEY}\r\n`, { mode: 0o600 });
    proc = spawnSwitchyard(
      [
        'agent',
        '--name',
        'file-agent',
        '--join-key-file',
        file,
        '--key-file',
        join(tmp.dir, 'f.key'),
      ],
      env({ SWITCHYARD_AGENT_JOIN_KEY: 'swyjk_stale_env_key' }),
    );
    await proc.waitFor(/"msg":"connected to broker"/, 10_000);
    assert.equal(directory.enrolls.at(-1)?.registrationName, 'file-agent');
    assert.equal(await proc.stop('SIGTERM'), 0);
  });
  it('a second agent on the same identity file: the first, superseded, exits 1 saying so', async () => {
    const shared = join(tmp.dir, 'shared.key');
    const first = spawnSwitchyard(
      ['agent', '--name', 'shared-agent', '--key-file', shared],
      env({ SWITCHYARD_AGENT_JOIN_KEY: JOIN_KEY }),
    );
    let second: Spawned | undefined;
    try {
      await first.waitFor(/"msg":"connected to broker"/, 10_000);
      second = spawnSwitchyard(['agent', '--key-file', shared], env());
      await second.waitFor(/"msg":"connected to broker"/, 10_000);
      await eventually(() => first.child.exitCode !== null, 10_000, 'the first agent exits');
      assert.equal(first.child.exitCode, 1, first.stderr());
      assert.match(first.stderr(), /another agent process uses this identity/);
      // Not taken back: the second stays the one connected.
      assert.equal(second.stdout().split('"msg":"connected to broker"').length - 1, 1);
      assert.equal(await second.stop('SIGTERM'), 0);
    } finally {
      await first.stop('SIGKILL');
      await second?.stop('SIGKILL');
    }
  });
  it('an endpoint that is no tcp://HOST:PORT is bad usage: exit 2 naming the flag', async () => {
    for (const [flag, value] of [
      ['--enroll-endpoint', 'http://router:7601'],
      ['--endpoint', 'tcp://router'],
    ]) {
      const r = await runSwitchyard(
        ['agent', '--name', 'x', '--key-file', join(tmp.dir, 'ep.key'), `${flag}=${value}`],
        env({ SWITCHYARD_AGENT_JOIN_KEY: JOIN_KEY }),
      );
      assert.equal(r.code, 2, `${flag}: ${r.stderr}`);
      assert.match(r.stderr, new RegExp(`^switchyard agent: ${flag}: `, 'm'));
    }
  });
  it('an unknown --log-level is bad usage (exit 2); an empty LOG_LEVEL is unset', async () => {
    const keyFile = join(tmp.dir, 'lvl.key');
    const bad = await runSwitchyard(['agent', '--key-file', keyFile, '--log-level', 'loud'], env());
    assert.equal(bad.code, 2, bad.stderr);
    assert.match(bad.stderr, /^switchyard agent: --log-level: /m);
    // Not enrolled and no join key: exit 4 once it runs, so the empty level was accepted.
    const empty = await runSwitchyard(['agent', '--key-file', keyFile], env({ LOG_LEVEL: '' }));
    assert.equal(empty.code, 4, empty.stderr);
    assert.match(empty.stdout, /"msg":"agent starting"/);
  });
});
