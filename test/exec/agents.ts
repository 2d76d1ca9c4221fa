/**
 * Agents for the tool-bridge and MCP tests: an in-memory transport that runs
 * each dispatched invocation at once (started, then finished with an exit code
 * and output decided by a per-tool script), and a real `switchyard agent`
 * process (bin/switchyard.js over dist/, built beforehand) enrolled over CURVE
 * with a broker wired to the test router's control plane.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pino } from 'pino';
import { Broker, generateKeyPair } from '../../src/exec/broker/index.js';
import type { DispatchRequest } from '../../src/exec/contracts.js';
import type { ExecService } from '../../src/exec/service.js';
import assert from 'node:assert/strict';
import type { TestServer } from '../support/harness.js';
import { inferenceFixture, type InferenceFixture } from '../support/inference.js';
import { spawnSwitchyard, type Spawned } from '../support/process.js';
import { enrollAgent, FakeTransport, tool, type ExecProject } from './support.js';

export type Script = (req: DispatchRequest) => {
  exitCode: number;
  stdout: string;
  stderr?: string;
};

/** A FakeTransport whose agents answer every dispatch right away. */
export class AutoTransport extends FakeTransport {
  /** Tools that never answer (stay running until cancelled). */
  readonly hang = new Set<string>();

  constructor(
    private readonly exec: ExecService,
    private readonly script: Script,
  ) {
    super();
  }

  override async dispatch(agentId: string, req: DispatchRequest): Promise<void> {
    await super.dispatch(agentId, req);
    if (this.hang.has(req.tool)) return;
    setImmediate(() => {
      void (async () => {
        await this.exec.started(req.invocationId, agentId);
        const out = this.script(req);
        await this.exec.finished(req.invocationId, agentId, {
          kind: 'exited',
          exitCode: out.exitCode,
          durationMs: 7,
          stdout: out.stdout,
          stderr: out.stderr ?? '',
          truncated: false,
        });
      })();
    });
  }
}

export interface RealAgent {
  broker: Broker;
  proc: Spawned;
  close(): Promise<void>;
}

/**
 * Starts a broker on ephemeral ports for the server's control plane, plugs it
 * in as the transport, and spawns `switchyard agent` with `tools` (manifest
 * entries with `command`), enrolled with `joinKey`. Resolves once the agent
 * is connected and its tools are in the catalog.
 */
export async function startRealAgent(
  s: TestServer,
  opts: { dir: string; name: string; joinKey: string; tools: Array<Record<string, unknown>> },
): Promise<RealAgent> {
  const keyPair = generateKeyPair();
  const broker = await Broker.start({
    directory: s.services.exec,
    clock: s.clock,
    logger: pino({ level: 'silent' }),
    keyPair,
    bind: { enroll: 'tcp://127.0.0.1:0', agents: 'tcp://127.0.0.1:0' },
  });
  s.services.exec.setTransport(broker);
  const manifest = join(opts.dir, `${opts.name}.manifest.json`);
  writeFileSync(manifest, JSON.stringify({ version: 1, tools: opts.tools }));
  const proc = spawnSwitchyard(['agent', '--name', opts.name], {
    SWITCHYARD_AGENT_ENROLL_ENDPOINT: broker.endpoints.enroll,
    SWITCHYARD_AGENT_ENDPOINT: broker.endpoints.agents,
    SWITCHYARD_AGENT_SERVER_KEY: keyPair.publicKey,
    SWITCHYARD_AGENT_MANIFEST: manifest,
    SWITCHYARD_AGENT_KEY_FILE: join(opts.dir, `${opts.name}.key`),
    SWITCHYARD_AGENT_JOIN_KEY: opts.joinKey,
    SWITCHYARD_AGENT_RECONNECT_MIN_MS: '20',
    SWITCHYARD_AGENT_RECONNECT_MAX_MS: '200',
    LOG_LEVEL: 'info',
  });
  try {
    await proc.waitFor(/"msg":"connected to broker"/, 20_000);
  } catch (err) {
    await proc.stop('SIGKILL');
    await broker.close();
    throw err;
  }
  return {
    broker,
    proc,
    close: async () => {
      await proc.stop('SIGTERM');
      s.services.exec.setTransport(null);
      await broker.close();
    },
  };
}

/** Polls (real time) until `check` resolves truthy. */
export async function until<T>(
  check: () => Promise<T | undefined | false> | T | undefined | false,
  timeoutMs = 10_000,
  what = 'condition',
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * The tool bridge's set-up against a worker of the test's own: an inference fixture
 * whose endpoint `workerUrl` serves instead of the sim (worker id `workerId`), a key
 * with `execution`, and an agent `agent` offering `fs.read` over an AutoTransport that
 * answers every call with exit code 0 and `stdout`.
 */
export async function bridgeFixture(opts: {
  workerUrl: string;
  workerId: string;
  agent: string;
  stdout?: string;
}): Promise<{ f: InferenceFixture; t: AutoTransport }> {
  const f = await inferenceFixture({ keyScopes: ['inference', 'execution'] });
  const del = await f.server.admin('DELETE', '/workers/sim-1');
  assert.ok(del.status < 300, del.text);
  const add = await f.server.admin('POST', '/workers', {
    model: 'sim-model',
    tier: 'cpu',
    url: opts.workerUrl,
    id: opts.workerId,
  });
  assert.ok(add.status < 300, add.text);
  const m = await f.server.admin('POST', '/projects/inf/keys', { scopes: ['management'] });
  const proj = await f.server.admin('GET', '/projects/inf');
  const p: ExecProject = {
    projectId: f.projectId,
    projectUuid: String(proj.body.uuid),
    slug: 'inf',
    exec: f.key,
    mgmt: String(m.body.key),
    inference: f.key,
  };
  const stdout = opts.stdout ?? '';
  const t = new AutoTransport(f.server.services.exec, () => ({ exitCode: 0, stdout }));
  f.server.services.exec.setTransport(t);
  await enrollAgent(f.server, p, { name: opts.agent, tools: [tool('fs.read')], transport: t });
  return { f, t };
}
