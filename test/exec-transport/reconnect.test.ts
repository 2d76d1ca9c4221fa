/**
 * Reconnection when the broker stops answering without a goodbye (a hung
 * router or a black-holed network, simulated by a TCP relay that stops
 * forwarding): the unanswered renewal ends the session (`lease_lost`), the
 * agent retries with backoff (HELLO unanswered → `hello_timeout`) and is back
 * as soon as the path is. And the backoff schedule itself.
 */
import assert from 'node:assert/strict';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { AgentClient, backoffDelay } from '../../src/exec/agent/client.js';
import { loadManifestFile } from '../../src/exec/agent/manifest.js';
import type { Broker } from '../../src/exec/broker/index.js';
import {
  eventually,
  FakeDirectory,
  JOIN_KEY,
  manifestFile,
  silentLogger,
  startTestBroker,
  tempDir,
} from './support.js';

/** A TCP relay that can stop forwarding (bytes wait, connections stay open). */
class Relay {
  private server: Server;
  private pairs = new Set<[Socket, Socket]>();
  private frozen = false;
  port = 0;

  constructor(private readonly target: { host: string; port: number }) {
    this.server = createServer((down) => {
      const up = connect(target.port, target.host);
      const pair: [Socket, Socket] = [down, up];
      this.pairs.add(pair);
      down.on('data', (d) => up.write(d));
      up.on('data', (d) => down.write(d));
      const close = () => {
        this.pairs.delete(pair);
        down.destroy();
        up.destroy();
      };
      down.on('close', close).on('error', close);
      up.on('close', close).on('error', close);
      if (this.frozen) {
        down.pause();
        up.pause();
      }
    });
  }

  async listen(): Promise<string> {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    this.port = (this.server.address() as { port: number }).port;
    return `tcp://127.0.0.1:${this.port}`;
  }

  freeze(frozen: boolean): void {
    this.frozen = frozen;
    for (const [a, b] of this.pairs) {
      if (frozen) {
        a.pause();
        b.pause();
      } else {
        a.resume();
        b.resume();
      }
    }
  }

  async close(): Promise<void> {
    for (const [a, b] of this.pairs) {
      a.destroy();
      b.destroy();
    }
    await new Promise((r) => this.server.close(r));
  }
}

describe('reconnecting when the broker goes silent', () => {
  const tmp = tempDir('swy-reconnect-');
  const directory = new FakeDirectory();
  let broker: Broker;
  let relay: Relay;
  let agent: AgentClient;
  let running: Promise<void>;
  const reasons: string[] = [];

  before(async () => {
    directory.leaseMs = 300;
    const started = await startTestBroker(directory);
    broker = started.broker;
    const m = /:(\d+)$/.exec(broker.endpoints.agents)!;
    relay = new Relay({ host: '127.0.0.1', port: Number(m[1]) });
    const relayed = await relay.listen();
    agent = new AgentClient({
      enrollEndpoint: broker.endpoints.enroll,
      agentEndpoint: relayed,
      serverKey: started.keyPair.publicKey,
      joinKey: JOIN_KEY,
      registrationName: 'relayed',
      manifest: loadManifestFile(manifestFile(tmp.dir)),
      keyFile: join(tmp.dir, 'agent.key'),
      logger: silentLogger,
      toolEnv: {},
      reconnectMinMs: 20,
      reconnectMaxMs: 100,
      requestTimeoutMs: 300,
    });
    agent.on('disconnected', (r) => reasons.push(r));
    const connected = new Promise((r) => agent.once('connected', r));
    running = agent.run();
    await connected;
  });
  after(async () => {
    await agent.stop();
    await running;
    await relay.close();
    await broker.close();
    tmp.cleanup();
  });

  it('an unanswered renewal ends the session; retries back off until the path is back', async () => {
    relay.freeze(true);
    await eventually(() => reasons.includes('lease_lost'), 2_000, 'lease_lost');
    await eventually(() => reasons.includes('hello_timeout'), 2_000, 'a retry that got no WELCOME');
    const reconnected = new Promise<string>((r) => agent.once('connected', r));
    relay.freeze(false);
    const agentId = await reconnected;
    await eventually(() => broker.isConnected(agentId), 2_000, 'connected again');
  });
});

describe('backoff schedule', () => {
  it('doubles from the minimum up to the maximum, with half of it random', () => {
    const low = () => 0;
    const high = () => 0.999999;
    assert.deepEqual(
      [0, 1, 2, 3, 4, 5, 10].map((a) => backoffDelay(a, 500, 30_000, low)),
      [250, 500, 1_000, 2_000, 4_000, 8_000, 15_000],
    );
    assert.deepEqual(
      [0, 1, 2, 6, 7, 40].map((a) => backoffDelay(a, 500, 30_000, high)),
      [500, 1_000, 2_000, 30_000, 30_000, 30_000],
    );
    for (let a = 0; a < 12; a++) {
      const d = backoffDelay(a, 500, 30_000, Math.random);
      const ceiling = Math.min(30_000, 500 * 2 ** a);
      assert.ok(d >= ceiling / 2 && d <= ceiling, `attempt ${a}: ${d}`);
    }
  });
});
