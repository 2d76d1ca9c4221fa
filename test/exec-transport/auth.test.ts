/**
 * Who may talk to the broker. The agent socket admits only CURVE keys the
 * directory knows (ZAP 400 for the rest, before any message); neither socket
 * talks to a peer without CURVE or with the wrong server key; key proofs stop
 * a peer from enrolling or connecting as a key it does not hold; the
 * enrollment socket handles nothing but ENROLL.
 */
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Dealer } from 'zeromq';
import { AgentClient } from '../../src/exec/agent/client.js';
import { saveIdentity } from '../../src/exec/agent/identity.js';
import { loadManifestFile } from '../../src/exec/agent/manifest.js';
import type { Broker } from '../../src/exec/broker/index.js';
import { generateKeyPair, keyProof, type CurveKeyPair } from '../../src/exec/broker/keys.js';
import {
  eventually,
  FakeDirectory,
  JOIN_KEY,
  manifestFile,
  silentLogger,
  startTestBroker,
  tempDir,
} from './support.js';

interface RawPeer {
  socket: Dealer;
  authFailures: number;
  request(msg: unknown, timeoutMs?: number): Promise<Record<string, unknown> | null>;
}

function rawPeer(endpoint: string, curve: { server: string; pair: CurveKeyPair } | null): RawPeer {
  const socket = new Dealer(
    curve
      ? {
          curveServerKey: curve.server,
          curvePublicKey: curve.pair.publicKey,
          curveSecretKey: curve.pair.secretKey,
          linger: 0,
        }
      : { linger: 0 },
  );
  const peer: RawPeer = {
    socket,
    authFailures: 0,
    async request(msg, timeoutMs = 400) {
      socket.receiveTimeout = timeoutMs;
      socket.sendTimeout = timeoutMs;
      try {
        await socket.send(typeof msg === 'string' ? msg : JSON.stringify(msg));
        const [frame] = await socket.receive();
        return JSON.parse(frame!.toString()) as Record<string, unknown>;
      } catch (err) {
        if ((err as { code?: string }).code === 'EAGAIN') return null;
        throw err;
      }
    },
  };
  socket.events.on('handshake:error:auth', () => peer.authFailures++);
  socket.connect(endpoint);
  return peer;
}

describe('broker authentication', () => {
  const tmp = tempDir('swy-auth-');
  const directory = new FakeDirectory();
  let broker: Broker;
  let server: CurveKeyPair;
  const peers: RawPeer[] = [];
  const clients: AgentClient[] = [];
  const peer = (endpoint: string, curve: { server: string; pair: CurveKeyPair } | null) => {
    const p = rawPeer(endpoint, curve);
    peers.push(p);
    return p;
  };
  const enrollMsg = (pair: CurveKeyPair, proofBy: CurveKeyPair = pair) => ({
    v: 1,
    type: 'ENROLL',
    join_key: JOIN_KEY,
    registration_name: `raw-${pair.publicKey.slice(0, 6)}`,
    manifest: { version: 1, tools: [] },
    curve_public_key: pair.publicKey,
    key_proof: keyProof(proofBy.secretKey, server.publicKey, 'enroll', pair.publicKey),
  });
  const helloMsg = (agentKey: string, proofBy: CurveKeyPair) => ({
    v: 1,
    type: 'HELLO',
    agent_key: agentKey,
    key_proof: keyProof(proofBy.secretKey, server.publicKey, 'hello', agentKey),
  });

  before(async () => {
    ({ broker, keyPair: server } = await startTestBroker(directory));
  });
  after(async () => {
    for (const c of clients) await c.stop();
    for (const p of peers) p.socket.close();
    await broker.close();
    tmp.cleanup();
  });

  it('the enrollment socket answers a CURVE peer holding the key it enrolls', async () => {
    const pair = generateKeyPair();
    const reply = await peer(broker.endpoints.enroll, { server: server.publicKey, pair }).request(
      enrollMsg(pair),
      2_000,
    );
    assert.equal(reply?.type, 'ENROLLED');
    assert.equal(directory.enrolls.at(-1)?.curvePublicKey, pair.publicKey);
  });

  it('a peer without CURVE gets no answer and reaches no handler', async () => {
    const before = directory.enrolls.length;
    const lookups = directory.keyLookups;
    const pair = generateKeyPair();
    assert.equal(await peer(broker.endpoints.enroll, null).request(enrollMsg(pair)), null);
    assert.equal(
      await peer(broker.endpoints.agents, null).request(helloMsg(pair.publicKey, pair)),
      null,
    );
    assert.equal(directory.enrolls.length, before);
    assert.equal(directory.keyLookups, lookups, 'no ZAP request even');
  });

  it('a peer with the wrong server key gets no answer', async () => {
    const before = directory.enrolls.length;
    const pair = generateKeyPair();
    const wrong = generateKeyPair().publicKey;
    assert.equal(
      await peer(broker.endpoints.enroll, { server: wrong, pair }).request(enrollMsg(pair)),
      null,
    );
    assert.equal(directory.enrolls.length, before);
  });

  it('a peer with an unknown CURVE key is refused on the agent socket (ZAP 400)', async () => {
    const pair = generateKeyPair();
    const p = peer(broker.endpoints.agents, { server: server.publicKey, pair });
    assert.equal(await p.request(helloMsg(pair.publicKey, pair)), null);
    await eventually(() => p.authFailures > 0, 2_000, 'handshake:error:auth');
    assert.deepEqual(broker.connectedAgents(), []);
  });

  it('an enrolled key completes the handshake and gets WELCOME', async () => {
    const pair = generateKeyPair();
    const agentId = directory.add(pair.publicKey);
    const p = peer(broker.endpoints.agents, { server: server.publicKey, pair });
    const reply = await p.request(helloMsg(pair.publicKey, pair), 2_000);
    assert.deepEqual(reply, {
      v: 1,
      type: 'WELCOME',
      agent_id: agentId,
      lease_ms: directory.leaseMs,
    });
    assert.equal(p.authFailures, 0);
    assert.ok(broker.isConnected(agentId));
  });

  it('an enrolled agent cannot claim another agent key in HELLO', async () => {
    const mallory = generateKeyPair();
    const victim = generateKeyPair();
    directory.add(mallory.publicKey, 'mallory');
    const victimId = directory.add(victim.publicKey, 'victim');
    const p = peer(broker.endpoints.agents, { server: server.publicKey, pair: mallory });
    const reply = await p.request(helloMsg(victim.publicKey, mallory), 2_000);
    assert.equal(reply?.type, 'ERROR');
    assert.equal(reply?.code, 'key_proof_invalid');
    assert.equal(broker.isConnected(victimId), false);
  });

  it('ENROLL for a key the peer does not hold is refused before the directory', async () => {
    const before = directory.enrolls.length;
    const pair = generateKeyPair();
    const other = generateKeyPair();
    const reply = await peer(broker.endpoints.enroll, { server: server.publicKey, pair }).request(
      enrollMsg(other, pair),
      2_000,
    );
    assert.equal(reply?.type, 'ERROR');
    assert.equal(reply?.code, 'key_proof_invalid');
    assert.equal(directory.enrolls.length, before);
  });

  it('the enrollment socket handles only ENROLL; bad frames get protocol errors', async () => {
    const pair = generateKeyPair();
    const p = peer(broker.endpoints.enroll, { server: server.publicKey, pair });
    const hello = await p.request(helloMsg(pair.publicKey, pair), 2_000);
    assert.equal(hello?.type, 'ERROR');
    assert.equal(hello?.code, 'protocol_error');
    assert.equal((await p.request('not json', 2_000))?.code, 'protocol_error');
    assert.equal(
      (await p.request({ ...enrollMsg(pair), v: 2 }, 2_000))?.code,
      'unsupported_version',
    );
  });

  it('a rotated-out key: sent nothing, and its session ends at its next renewal', async () => {
    const old = generateKeyPair();
    const agentId = directory.add(old.publicKey, 'rotating');
    const p = peer(broker.endpoints.agents, { server: server.publicKey, pair: old });
    assert.equal((await p.request(helloMsg(old.publicKey, old), 2_000))?.type, 'WELCOME');
    assert.ok(broker.isConnected(agentId, old.publicKey));
    const fresh = generateKeyPair();
    directory.rotate(agentId, fresh.publicKey);
    // The control plane dispatches with the agent's key now: not to this session.
    assert.equal(broker.isConnected(agentId, fresh.publicKey), false);
    await assert.rejects(
      broker.dispatch(agentId, {
        invocationId: 'inv_rot',
        tool: 't',
        arguments: {},
        timeoutMs: 1_000,
        agentKey: fresh.publicKey,
      }),
      /not connected/,
    );
    const reply = await p.request({ v: 1, type: 'RENEW' }, 2_000);
    assert.equal(reply?.type, 'BYE');
    assert.equal(reply?.code, 'agent_unknown');
    assert.equal(broker.isConnected(agentId), false);
  });

  it('a message before HELLO gets BYE session_unknown', async () => {
    const pair = generateKeyPair();
    directory.add(pair.publicKey, 'early');
    const p = peer(broker.endpoints.agents, { server: server.publicKey, pair });
    const reply = await p.request({ v: 1, type: 'RENEW' }, 2_000);
    assert.equal(reply?.type, 'BYE');
    assert.equal(reply?.code, 'session_unknown');
  });

  it('the agent client reports a refused key and keeps retrying', async () => {
    const keyFile = join(tmp.dir, 'stale.key');
    // An identity that believes it is enrolled, but the directory does not know its key.
    saveIdentity(keyFile, {
      ...generateKeyPair(),
      agentId: 'agt_deleted',
      serverKey: server.publicKey,
    });
    const c = new AgentClient({
      enrollEndpoint: broker.endpoints.enroll,
      agentEndpoint: broker.endpoints.agents,
      serverKey: server.publicKey,
      manifest: loadManifestFile(manifestFile(tmp.dir)),
      keyFile,
      logger: silentLogger,
      toolEnv: {},
      reconnectMinMs: 20,
      reconnectMaxMs: 40,
      requestTimeoutMs: 1_000,
    });
    clients.push(c);
    let refused = 0;
    c.on('refused', () => refused++);
    void c.run();
    await eventually(() => refused >= 2, 3_000, 'two refusals');
  });
});
