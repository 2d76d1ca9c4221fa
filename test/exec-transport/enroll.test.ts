/**
 * Enrollment over the broker's enrollment socket: success (identity file
 * written with mode 0600, a restart skips enrolling), and each of the spec's
 * enrollment protocol codes surfacing in the agent client.
 */
import assert from 'node:assert/strict';
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  AgentClient,
  EnrollmentFailedError,
  EnrollmentRejectedError,
  type AgentClientOptions,
} from '../../src/exec/agent/client.js';
import { loadManifestFile, parseManifest } from '../../src/exec/agent/manifest.js';
import type { Broker } from '../../src/exec/broker/index.js';
import { validateManifest } from '../../src/exec/manifest.js';
import type { CurveKeyPair } from '../../src/exec/broker/keys.js';
import {
  FakeDirectory,
  JOIN_KEY,
  manifestFile,
  silentLogger,
  startTestBroker,
  tempDir,
} from './support.js';

describe('enrollment', () => {
  const tmp = tempDir('swy-enroll-');
  const directory = new FakeDirectory();
  let broker: Broker;
  let keyPair: CurveKeyPair;
  let manifestPath: string;
  const clients: AgentClient[] = [];

  before(async () => {
    ({ broker, keyPair } = await startTestBroker(directory));
    manifestPath = manifestFile(tmp.dir);
  });
  after(async () => {
    for (const c of clients) await c.stop();
    await broker.close();
    tmp.cleanup();
  });

  const client = (keyFile: string, over: Partial<AgentClientOptions> = {}) => {
    const c = new AgentClient({
      enrollEndpoint: broker.endpoints.enroll,
      agentEndpoint: broker.endpoints.agents,
      serverKey: keyPair.publicKey,
      joinKey: JOIN_KEY,
      registrationName: 'builder-1',
      manifest: loadManifestFile(manifestPath),
      keyFile: join(tmp.dir, keyFile),
      logger: silentLogger,
      toolEnv: { PATH: process.env.PATH },
      requestTimeoutMs: 2_000,
      ...over,
    });
    clients.push(c);
    return c;
  };

  it('enrolls: the router gets the proven key and the manifest without local commands', async () => {
    const c = client('a.key');
    const agentId = await c.ensureEnrolled();
    assert.match(agentId, /^agt_/);
    const req = directory.enrolls.at(-1)!;
    assert.equal(req.joinKey, JOIN_KEY);
    assert.equal(req.registrationName, 'builder-1');
    assert.equal(req.curvePublicKey, c.publicKey);
    const m = req.manifest as { version: number; tools: Array<Record<string, unknown>> };
    assert.equal(m.version, 1);
    assert.deepEqual(
      m.tools.map((t) => t.name),
      ['echo', 'sleep', 'stubborn', 'flood'],
    );
    for (const t of m.tools) {
      assert.equal(t.command, undefined, 'command stays on the agent');
      assert.equal(t.env, undefined);
      assert.deepEqual(t.input_schema, { type: 'object' });
      assert.equal(t.risk, 'low');
    }
    const file = join(tmp.dir, 'a.key');
    assert.equal(statSync(file).mode & 0o777, 0o600);
    const saved = JSON.parse(readFileSync(file, 'utf8')) as Record<string, string>;
    assert.equal(saved.agent_id, agentId);
    assert.equal(saved.public_key, c.publicKey);
    assert.equal(saved.server_key, keyPair.publicKey);
    // The hash the control plane records, kept to notice a changed manifest later.
    const v = validateManifest(loadManifestFile(manifestPath).manifest);
    assert.ok(v.ok);
    assert.equal(saved.manifest_hash, v.hash);
  });

  it('a restart with the same identity file skips enrollment (no join key needed)', async () => {
    const before = directory.enrolls.length;
    const c = client('a.key', { joinKey: undefined });
    const agentId = await c.ensureEnrolled();
    assert.equal(directory.enrolls.length, before);
    assert.equal(agentId, JSON.parse(readFileSync(join(tmp.dir, 'a.key'), 'utf8')).agent_id);
  });

  it('join_key_invalid', async () => {
    const err = await client('b.key', { joinKey: 'swyjk_wrong' })
      .ensureEnrolled()
      .then(
        () => assert.fail('enrolled'),
        (e: unknown) => e,
      );
    assert.ok(err instanceof EnrollmentRejectedError);
    assert.equal(err.code, 'join_key_invalid');
    const saved = JSON.parse(readFileSync(join(tmp.dir, 'b.key'), 'utf8')) as Record<
      string,
      unknown
    >;
    assert.equal(saved.agent_id, undefined, 'no agent id stored after a rejection');
  });

  it('exec_manifest_invalid names the field', async () => {
    const bad = parseManifest(
      { version: 1, tools: [{ name: 'x', input_schema: 'nope', command: ['true'] }] },
      tmp.dir,
    );
    const err = await client('c.key', { manifest: bad })
      .ensureEnrolled()
      .then(
        () => assert.fail('enrolled'),
        (e: unknown) => e,
      );
    assert.ok(err instanceof EnrollmentRejectedError);
    assert.equal(err.code, 'exec_manifest_invalid');
    assert.equal(err.param, 'tools[0].input_schema');
  });

  it('agent_name_in_use', async () => {
    directory.reservedNames.add('taken');
    const err = await client('d.key', { registrationName: 'taken' })
      .ensureEnrolled()
      .then(
        () => assert.fail('enrolled'),
        (e: unknown) => e,
      );
    assert.ok(err instanceof EnrollmentRejectedError);
    assert.equal(err.code, 'agent_name_in_use');
  });

  it('agent_name_conflict: the same name with another CURVE key', async () => {
    // builder-1 was enrolled above with a.key's keypair; e.key is a new keypair.
    const err = await client('e.key')
      .ensureEnrolled()
      .then(
        () => assert.fail('enrolled'),
        (e: unknown) => e,
      );
    assert.ok(err instanceof EnrollmentRejectedError);
    assert.equal(err.code, 'agent_name_conflict');
  });

  it('a fresh agent without a join key cannot start', async () => {
    const err = await client('f.key', { joinKey: undefined })
      .ensureEnrolled()
      .then(
        () => assert.fail('enrolled'),
        (e: unknown) => e,
      );
    assert.ok(err instanceof EnrollmentFailedError);
    assert.equal(err.code, 'not_enrolled');
  });

  it('an identity file from another broker key enrolls again', async () => {
    const file = join(tmp.dir, 'a.key');
    const saved = JSON.parse(readFileSync(file, 'utf8')) as Record<string, string>;
    writeFileSync(file, JSON.stringify({ ...saved, server_key: 'x'.repeat(40) }));
    const before = directory.enrolls.length;
    const agentId = await client('a.key').ensureEnrolled();
    assert.equal(directory.enrolls.length, before + 1);
    assert.equal(agentId, saved.agent_id, 'same key, same agent');
  });
});
