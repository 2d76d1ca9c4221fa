/**
 * The execution broker: the router's side of the agent transport.
 *
 * Two ROUTER sockets with CURVE on (the broker's server keypair), in a ZeroMQ
 * context of their own whose ZAP handler decides which peers may finish the
 * handshake:
 * - the enrollment socket admits any CURVE key and only handles `ENROLL`;
 * - the agent socket admits only keys the directory knows as enrolled, not
 *   deleted agents (`agentForKey`); any other key gets ZAP 400 and never
 *   connects.
 * A session starts with `HELLO` (key proof, see keys.ts) and binds the ZeroMQ
 * routing id to the agent. `isConnected` is true while a session is open and
 * its lease (from the last `RENEW`, on the injected clock) is current; the
 * control plane's scheduler decides what an expired lease means. Messages of
 * one peer are handled in order; different peers do not wait for each other.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { Context, Router } from 'zeromq';
import type {
  AgentDirectory,
  AgentTransport,
  DispatchOutcome,
  DispatchRequest,
} from '../contracts.js';
import type { Clock, Timer } from '../../runtime/clock.js';
import type { Logger } from '../../runtime/logger.js';
import { verifyKeyProof, type CurveKeyPair } from './keys.js';
import {
  agentInbound,
  decode,
  encode,
  enrollInbound,
  MAX_MESSAGE_BYTES,
  outcomeFromWire,
  SendQueue,
  ZAP_DOMAIN_AGENTS,
  ZAP_DOMAIN_ENROLL,
  type AgentInbound,
  type ByeCode,
  type OutgoingMessage,
} from './protocol.js';
import { ZapHandler, type ZapDecision, type ZapRequest } from './zap.js';

/** `dispatch` / `cancel` to an agent without a current session. */
export class AgentNotConnectedError extends Error {
  readonly code = 'agent_not_connected';
  constructor(readonly agentId: string) {
    super(`agent ${agentId} is not connected to this broker`);
  }
}

export interface BrokerOptions {
  directory: AgentDirectory;
  clock: Clock;
  logger: Logger;
  keyPair: CurveKeyPair;
  /** ZeroMQ endpoints to bind, e.g. `tcp://0.0.0.0:7601`; port 0 picks a free port. */
  bind: { enroll: string; agents: string };
  /** Host agents are told to use (default: the bound address; 127.0.0.1 for a wildcard). */
  publicHost?: string;
  /** How long a send to one agent may wait on a full queue before it fails (ms). */
  sendTimeoutMs?: number;
}

interface Session {
  routingId: Buffer;
  agentKey: string;
  agentId: string;
  leaseMs: number;
  /** Clock time of the last accepted renewal (or of the HELLO). */
  renewedAt: number;
}

const SEND_TIMEOUT_MS = 1_000;

/** How long a closing socket keeps trying to deliver what it holds (the BYEs). */
const LINGER_MS = 100;

export class Broker implements AgentTransport {
  readonly serverPublicKey: string;
  readonly endpoints: { enroll: string; agents: string };

  private readonly sessionsByRoute = new Map<string, Session>();
  private readonly sessionsByAgent = new Map<string, Session>();
  private readonly chains = new Map<string, Promise<void>>();
  private readonly enrollSend: SendQueue;
  private readonly agentSend: SendQueue;
  private readonly loops: Promise<void>[] = [];
  private sweepTimer: Timer | undefined;
  private closing: Promise<void> | undefined;

  private constructor(
    private readonly opts: BrokerOptions,
    private readonly zap: ZapHandler,
    private readonly enrollSocket: Router,
    private readonly agentSocket: Router,
  ) {
    this.serverPublicKey = opts.keyPair.publicKey;
    this.enrollSend = new SendQueue(enrollSocket);
    this.agentSend = new SendQueue(agentSocket);
    this.endpoints = {
      enroll: advertised(enrollSocket.lastEndpoint ?? opts.bind.enroll, opts.publicHost),
      agents: advertised(agentSocket.lastEndpoint ?? opts.bind.agents, opts.publicHost),
    };
  }

  static async start(opts: BrokerOptions): Promise<Broker> {
    // A context of its own: the ZAP endpoint is per context, and two brokers in
    // one process (tests, a restart) must not share a handler.
    const context = new Context();
    let authorize: (req: ZapRequest) => Promise<ZapDecision> = async () => ({
      status: '500',
      reason: 'starting',
    });
    const zap = new ZapHandler(context, (req) => authorize(req), opts.logger);
    await zap.start();
    const common = {
      context,
      curveServer: true,
      curveSecretKey: opts.keyPair.secretKey,
      maxMessageSize: MAX_MESSAGE_BYTES,
      mandatory: true,
      sendTimeout: opts.sendTimeoutMs ?? SEND_TIMEOUT_MS,
      linger: LINGER_MS,
      heartbeatInterval: 10_000,
      heartbeatTimeout: 30_000,
      ipv6: opts.bind.enroll.includes('[') || opts.bind.agents.includes('['),
    };
    const enrollSocket = new Router({ ...common, zapDomain: ZAP_DOMAIN_ENROLL });
    const agentSocket = new Router({ ...common, zapDomain: ZAP_DOMAIN_AGENTS });
    try {
      await enrollSocket.bind(opts.bind.enroll);
      await agentSocket.bind(opts.bind.agents);
    } catch (err) {
      enrollSocket.close();
      agentSocket.close();
      await zap.close();
      throw err;
    }
    const broker = new Broker(opts, zap, enrollSocket, agentSocket);
    authorize = (req) => broker.authorize(req);
    broker.loops.push(broker.receive(enrollSocket, 'e', (r, f) => broker.onEnroll(r, f)));
    broker.loops.push(broker.receive(agentSocket, 'a', (r, f) => broker.onAgent(r, f)));
    broker.scheduleSweep();
    opts.logger.info(
      {
        enroll: broker.endpoints.enroll,
        agents: broker.endpoints.agents,
        serverKey: broker.serverPublicKey,
      },
      'exec broker listening',
    );
    return broker;
  }

  isConnected(agentId: string, agentKey?: string): boolean {
    const s = this.sessionsByAgent.get(agentId);
    return (
      s !== undefined &&
      (agentKey === undefined || s.agentKey === agentKey) &&
      this.opts.clock.now() < s.renewedAt + s.leaseMs
    );
  }

  /** Agent ids with a current session (for diagnostics). */
  connectedAgents(): string[] {
    return [...this.sessionsByAgent.keys()].filter((id) => this.isConnected(id));
  }

  async dispatch(agentId: string, req: DispatchRequest): Promise<void> {
    const s = this.requireSession(agentId, req.agentKey);
    await this.sendToSession(s, {
      type: 'DISPATCH',
      invocation_id: req.invocationId,
      tool: req.tool,
      arguments: req.arguments,
      timeout_ms: req.timeoutMs,
    });
    this.opts.logger.debug(
      { agentId, invocationId: req.invocationId, tool: req.tool },
      'dispatched',
    );
  }

  async cancel(agentId: string, invocationId: string): Promise<void> {
    const s = this.requireSession(agentId);
    await this.sendToSession(s, { type: 'CANCEL', invocation_id: invocationId });
  }

  close(): Promise<void> {
    this.closing ??= this.shutdown();
    return this.closing;
  }

  private async shutdown(): Promise<void> {
    this.sweepTimer?.cancel();
    // Tell connected agents, so they reconnect (to a restarted or another router) at once.
    await Promise.allSettled(
      [...this.sessionsByAgent.values()].map((s) =>
        this.send(s.routingId, {
          type: 'BYE',
          code: 'broker_shutdown',
          message: 'broker shutting down',
        }),
      ),
    );
    this.sessionsByAgent.clear();
    this.sessionsByRoute.clear();
    this.enrollSocket.close();
    this.agentSocket.close();
    await Promise.allSettled(this.loops);
    await Promise.allSettled([...this.chains.values()]);
    // No unbind() before close(): unbinding a listener while libzmq's I/O threads
    // still tear down the session of a peer that has just gone (an agent's BYE) made
    // libzmq 4.3.5 abort the whole process ("Assertion failed: _state == term_ack_sent
    // || _state == term_req_sent2", pipe.cpp:355; 5-8 % of runs of
    // test/exec-transport/session.test.ts under CPU load, none in 80 runs without it).
    // close() returns before the I/O threads have released the ports and ended the
    // sessions, and each session holds a pipe to the ZAP socket; no event says when
    // that is done, so the broker waits out the linger before closing the ZAP socket
    // and resolving, after which a restarted broker can bind the same ports. Real
    // time, not the clock's: this waits for libzmq's threads.
    await sleep(LINGER_MS + 50);
    await this.zap.close();
    this.opts.logger.info('exec broker stopped');
  }

  private requireSession(agentId: string, agentKey?: string): Session {
    if (this.closing || !this.isConnected(agentId, agentKey)) {
      throw new AgentNotConnectedError(agentId);
    }
    return this.sessionsByAgent.get(agentId)!;
  }

  private async sendToSession(s: Session, msg: OutgoingMessage): Promise<void> {
    try {
      await this.send(s.routingId, msg);
    } catch (err) {
      if ((err as { code?: string }).code === 'EHOSTUNREACH') {
        // The connection is gone (libzmq dropped the routing id): the session is over.
        this.dropSession(s);
        throw new AgentNotConnectedError(s.agentId);
      }
      throw err;
    }
  }

  private send(routingId: Buffer, msg: OutgoingMessage): Promise<void> {
    return this.agentSend.send([routingId, encode(msg)]);
  }

  // ZAP: which peers may finish the CURVE handshake on which socket.
  private async authorize(req: ZapRequest): Promise<ZapDecision> {
    if (req.mechanism !== 'CURVE' || !req.curvePublicKey) {
      return { status: '400', reason: 'CURVE required' };
    }
    if (req.domain === ZAP_DOMAIN_ENROLL) {
      // Anyone may try to enroll; the join key decides.
      return { status: '200', userId: req.curvePublicKey };
    }
    if (req.domain === ZAP_DOMAIN_AGENTS) {
      const agent = await this.opts.directory.agentForKey(req.curvePublicKey);
      if (!agent) {
        this.opts.logger.info(
          { agentKey: req.curvePublicKey, address: req.address },
          'agent socket: unknown CURVE key refused',
        );
        return { status: '400', reason: 'unknown agent key' };
      }
      return { status: '200', userId: agent.agentId };
    }
    return { status: '400', reason: 'unknown domain' };
  }

  private async receive(
    socket: Router,
    prefix: string,
    handle: (routingId: Buffer, frame: Buffer | undefined) => Promise<void>,
  ): Promise<void> {
    try {
      for await (const [routingId, frame] of socket) {
        if (!routingId) continue;
        this.serially(`${prefix}:${routingId.toString('hex')}`, () => handle(routingId, frame));
      }
    } catch (err) {
      if (!socket.closed) this.opts.logger.error({ err }, 'exec broker receive loop stopped');
    }
  }

  /** Runs the tasks of one peer in order, each after the previous one settled. */
  private serially(key: string, task: () => Promise<void>): void {
    const prev = this.chains.get(key) ?? Promise.resolve();
    const next = prev.then(task).catch((err: unknown) => {
      this.opts.logger.error({ err }, 'exec broker: message handling failed');
    });
    this.chains.set(key, next);
    void next.then(() => {
      if (this.chains.get(key) === next) this.chains.delete(key);
    });
  }

  private async onEnroll(routingId: Buffer, frame: Buffer | undefined): Promise<void> {
    const reply = (msg: OutgoingMessage) =>
      this.enrollSend.send([routingId, encode(msg)]).catch((err: unknown) => {
        this.opts.logger.warn({ err }, 'enrollment reply not delivered');
      });
    const decoded = decode(frame, enrollInbound);
    if (!decoded.ok) {
      await reply({ type: 'ERROR', code: decoded.code, message: decoded.message });
      return;
    }
    const m = decoded.msg;
    if (!verifyKeyProof(this.opts.keyPair.secretKey, m.curve_public_key, 'enroll', m.key_proof)) {
      await reply({
        type: 'ERROR',
        code: 'key_proof_invalid',
        message: 'key_proof does not prove possession of curve_public_key',
      });
      return;
    }
    let result;
    try {
      result = await this.opts.directory.enroll({
        joinKey: m.join_key,
        registrationName: m.registration_name,
        curvePublicKey: m.curve_public_key,
        manifest: m.manifest,
      });
    } catch (err) {
      this.opts.logger.error({ err }, 'enrollment failed');
      await reply({
        type: 'ERROR',
        code: 'internal_error',
        message: 'enrollment failed; retry later',
      });
      return;
    }
    if (result.ok) {
      this.opts.logger.info(
        {
          agentId: result.agentId,
          registrationName: m.registration_name,
          agentKey: m.curve_public_key,
        },
        'agent enrolled',
      );
      await reply({
        type: 'ENROLLED',
        agent_id: result.agentId,
        lease_ms: result.leaseMs,
        manifest_hash: result.manifestHash,
      });
    } else {
      this.opts.logger.info(
        { code: result.code, registrationName: m.registration_name, agentKey: m.curve_public_key },
        'enrollment rejected',
      );
      await reply({
        type: 'ENROLL_REJECTED',
        code: result.code,
        message: result.message,
        ...(result.param !== undefined ? { param: result.param } : {}),
      });
    }
  }

  private async onAgent(routingId: Buffer, frame: Buffer | undefined): Promise<void> {
    const route = routingId.toString('hex');
    const reply = (msg: OutgoingMessage) =>
      this.send(routingId, msg).catch((err: unknown) => {
        this.opts.logger.debug({ err }, 'agent reply not delivered');
      });
    const decoded = decode(frame, agentInbound);
    if (!decoded.ok) {
      await reply({ type: 'ERROR', code: decoded.code, message: decoded.message });
      return;
    }
    const m: AgentInbound = decoded.msg;
    if (m.type === 'HELLO') return this.onHello(routingId, m, reply);
    if (m.type === 'PING') return reply({ type: 'PONG', ...(m.nonce ? { nonce: m.nonce } : {}) });
    if (m.type === 'PONG') return;
    const s = this.sessionsByRoute.get(route);
    if (!s) {
      if (m.type !== 'BYE') {
        await reply({ type: 'BYE', code: 'session_unknown', message: 'send HELLO first' });
      }
      return;
    }
    switch (m.type) {
      case 'BYE':
        this.opts.logger.info({ agentId: s.agentId, code: m.code }, 'agent disconnected');
        this.dropSession(s);
        return;
      case 'RENEW': {
        // The key this session was opened with must still be the agent's: a rotated-out
        // key loses its session at its next renewal (and is sent nothing meanwhile).
        const lease = await this.opts.directory.renew(s.agentId, s.agentKey);
        if (!lease) {
          this.dropSession(s);
          await reply({
            type: 'BYE',
            code: 'agent_unknown',
            message: 'agent is not enrolled with this key',
          });
          return;
        }
        s.renewedAt = this.opts.clock.now();
        s.leaseMs = lease.leaseMs;
        await reply({ type: 'RENEWED', lease_ms: lease.leaseMs });
        return;
      }
      case 'STARTED':
        await this.opts.directory.started(m.invocation_id, s.agentId);
        return;
      case 'RESULT': {
        const outcome: DispatchOutcome = outcomeFromWire(m.outcome);
        // Acknowledged only once recorded: otherwise the agent sends it again.
        await this.opts.directory.finished(m.invocation_id, s.agentId, outcome);
        await reply({ type: 'RESULT_ACK', invocation_id: m.invocation_id });
        return;
      }
    }
  }

  private async onHello(
    routingId: Buffer,
    m: Extract<AgentInbound, { type: 'HELLO' }>,
    reply: (msg: OutgoingMessage) => Promise<void>,
  ): Promise<void> {
    if (!verifyKeyProof(this.opts.keyPair.secretKey, m.agent_key, 'hello', m.key_proof)) {
      await reply({
        type: 'ERROR',
        code: 'key_proof_invalid',
        message: 'key_proof does not prove possession of agent_key',
      });
      return;
    }
    const bye = (code: ByeCode, message: string) => reply({ type: 'BYE', code, message });
    const agent = await this.opts.directory.agentForKey(m.agent_key);
    const lease = agent ? await this.opts.directory.renew(agent.agentId) : null;
    if (!agent || !lease) {
      await bye('agent_unknown', 'agent is not enrolled');
      return;
    }
    const old = this.sessionsByAgent.get(agent.agentId);
    if (old && !old.routingId.equals(routingId)) {
      this.dropSession(old);
      void this.send(old.routingId, {
        type: 'BYE',
        code: 'superseded',
        message: 'a newer session of this agent connected',
      }).catch(() => undefined);
    }
    const s: Session = {
      routingId,
      agentKey: m.agent_key,
      agentId: agent.agentId,
      leaseMs: lease.leaseMs,
      renewedAt: this.opts.clock.now(),
    };
    this.sessionsByRoute.set(routingId.toString('hex'), s);
    this.sessionsByAgent.set(agent.agentId, s);
    this.opts.logger.info(
      { agentId: agent.agentId, agentVersion: m.agent_version },
      'agent connected',
    );
    await reply({ type: 'WELCOME', agent_id: agent.agentId, lease_ms: lease.leaseMs });
  }

  private dropSession(s: Session): void {
    const route = s.routingId.toString('hex');
    if (this.sessionsByRoute.get(route) === s) this.sessionsByRoute.delete(route);
    if (this.sessionsByAgent.get(s.agentId) === s) this.sessionsByAgent.delete(s.agentId);
  }

  /**
   * Forgets sessions whose lease ran out a full lease ago: the agent is gone
   * (a late renewal inside that window still revives the session).
   */
  private scheduleSweep(): void {
    this.sweepTimer = this.opts.clock.setTimer(30_000, () => {
      const now = this.opts.clock.now();
      for (const s of [...this.sessionsByRoute.values()]) {
        if (now >= s.renewedAt + 2 * s.leaseMs) this.dropSession(s);
      }
      if (!this.closing) this.scheduleSweep();
    });
  }
}

/** The endpoint agents should dial: wildcard and `publicHost` substituted. */
function advertised(endpoint: string, publicHost: string | undefined): string {
  const m = /^tcp:\/\/(.+):(\d+)$/.exec(endpoint);
  if (!m) return endpoint;
  const bound = m[1]!;
  const wildcard = bound === '0.0.0.0' || bound === '*' || bound === '[::]' || bound === '::';
  const host = publicHost ?? (wildcard ? '127.0.0.1' : bound);
  const shown = host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
  return `tcp://${shown}:${m[2]}`;
}
