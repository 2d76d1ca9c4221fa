/**
 * The agent's side of the transport (`switchyard agent`).
 *
 * 1. Enrollment, once: `ENROLL` on the enrollment socket with the join key,
 *    registration name, manifest and a proof of the agent's CURVE key. Skipped
 *    when the identity file already holds an agent id for this broker key and
 *    the manifest it enrolled with; a changed manifest enrolls again (join key
 *    required).
 *    A rejection is final (`EnrollmentRejectedError`); no answer is retried
 *    with backoff.
 * 2. Sessions, forever: a DEALER to the agent socket, `HELLO` → `WELCOME`,
 *    then `RENEW` every third of the lease. A renewal left unanswered for a
 *    whole interval, a `BYE`, or a refused handshake ends the session; the
 *    next one starts after an exponential backoff with jitter (reset once a
 *    session is welcomed). Tools keep running across sessions; their results
 *    are kept until the broker acknowledges them and sent again on the next
 *    session. A `BYE superseded` (another process with this identity connected)
 *    ends `run()` with an error instead.
 * Timers here are real: the agent is a separate process with real tools.
 */
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import { Dealer } from 'zeromq';
import type { Logger } from '../../runtime/logger.js';
import { keyProof } from '../broker/keys.js';
import {
  agentOutbound,
  decode,
  encode,
  enrollOutbound,
  MAX_MESSAGE_BYTES,
  outcomeToWire,
  SendQueue,
  type AgentOutbound,
  type OutgoingMessage,
  type WireOutcome,
} from '../broker/protocol.js';
import type { DispatchOutcome } from '../contracts.js';
import { validateManifest } from '../manifest.js';
import { loadOrCreateIdentity, saveIdentity, type AgentIdentity } from './identity.js';
import type { LocalManifest } from './manifest.js';
import { runTool, type RunningTool } from './runner.js';

export type RejectionCode =
  'exec_manifest_invalid' | 'agent_name_in_use' | 'agent_name_conflict' | 'join_key_invalid';

/** The router refused the enrollment (one of the spec's enrollment protocol codes). */
export class EnrollmentRejectedError extends Error {
  constructor(
    readonly code: RejectionCode,
    message: string,
    readonly param?: string,
  ) {
    super(message);
  }
}

/** Enrollment cannot proceed for another reason (protocol fault, missing settings). */
export class EnrollmentFailedError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export interface AgentClientOptions {
  enrollEndpoint: string;
  agentEndpoint: string;
  /** The broker's CURVE public key (Z85), pinned. */
  serverKey: string;
  /** Needed only until the agent is enrolled. Never logged. */
  joinKey?: string;
  registrationName?: string;
  manifest: LocalManifest;
  /** The identity file (keypair and agent id), mode 0600. */
  keyFile: string;
  logger: Logger;
  /** Environment tools inherit (the caller removes the agent's own settings). */
  toolEnv: Record<string, string | undefined>;
  reconnectMinMs?: number;
  reconnectMaxMs?: number;
  /** How long to wait for ENROLLED / WELCOME before trying again (ms). */
  requestTimeoutMs?: number;
  killGraceMs?: number;
  maxOutputBytes?: number;
  /** Times a result is sent without acknowledgement before it is dropped. */
  maxResultAttempts?: number;
  /** [0, 1); injected so backoff schedules are testable. */
  random?: () => number;
}

export interface AgentClientEvents {
  enrolled: [agentId: string];
  connected: [agentId: string, leaseMs: number];
  disconnected: [reason: string];
  renewed: [leaseMs: number];
  refused: [];
}

/** Exponential backoff with "equal jitter": half fixed, half random. */
export function backoffDelay(
  attempt: number,
  minMs: number,
  maxMs: number,
  random: () => number,
): number {
  const ceiling = Math.min(maxMs, minMs * 2 ** Math.min(attempt, 30));
  return Math.round(ceiling / 2 + (ceiling / 2) * random());
}

interface PendingResult {
  outcome: WireOutcome;
  attempts: number;
  /** performance.now() of the last send. */
  sentAt: number;
}

interface ActiveSession {
  send(msg: OutgoingMessage): void;
}

export class AgentClient extends EventEmitter<AgentClientEvents> {
  private identity: AgentIdentity;
  private stopped = false;
  private stopWaiters: Array<() => void> = [];
  private currentSocket: Dealer | undefined;
  private session: ActiveSession | undefined;
  private readonly running = new Map<string, RunningTool>();
  private readonly unacked = new Map<string, PendingResult>();
  private readonly o: Required<
    Pick<
      AgentClientOptions,
      | 'reconnectMinMs'
      | 'reconnectMaxMs'
      | 'requestTimeoutMs'
      | 'killGraceMs'
      | 'maxOutputBytes'
      | 'maxResultAttempts'
      | 'random'
    >
  >;

  constructor(private readonly opts: AgentClientOptions) {
    super();
    this.identity = loadOrCreateIdentity(opts.keyFile).identity;
    this.o = {
      reconnectMinMs: opts.reconnectMinMs ?? 500,
      reconnectMaxMs: opts.reconnectMaxMs ?? 30_000,
      requestTimeoutMs: opts.requestTimeoutMs ?? 10_000,
      killGraceMs: opts.killGraceMs ?? 2_000,
      maxOutputBytes: opts.maxOutputBytes ?? 64 * 1024,
      maxResultAttempts: opts.maxResultAttempts ?? 5,
      random: opts.random ?? Math.random,
    };
  }

  get publicKey(): string {
    return this.identity.publicKey;
  }

  get agentId(): string | undefined {
    return this.identity.agentId;
  }

  /** Enrolls unless already enrolled with this broker; then runs sessions until `stop()`. */
  async run(): Promise<void> {
    await this.ensureEnrolled();
    let attempt = 0;
    while (!this.stopped) {
      const { reason, welcomed } = await this.runSession();
      if (this.stopped) break;
      // Only another process with this identity opens a newer session than ours (our
      // own next session starts after this one closed): reconnecting would take the
      // session back from it, and the two would supersede each other for ever.
      if (reason === 'bye:superseded') {
        throw new Error(
          `another agent process uses this identity (key file ${this.opts.keyFile}) and ` +
            'took over its session: give each agent its own --key-file',
        );
      }
      this.emit('disconnected', reason);
      if (welcomed) attempt = 0;
      const delay = backoffDelay(
        attempt++,
        this.o.reconnectMinMs,
        this.o.reconnectMaxMs,
        this.o.random,
      );
      this.opts.logger.info({ reason, retryInMs: delay }, 'session ended; reconnecting');
      await this.sleep(delay);
    }
  }

  /** Stops: running tools are killed and reported, the broker is told, sockets close. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    const outcomes = [...this.running.values()].map((t) => {
      t.cancel();
      return t.outcome;
    });
    // Bounded by the kill grace: SIGKILL ends every tool.
    await Promise.allSettled(outcomes);
    this.session?.send({ type: 'BYE', code: 'agent_shutdown', message: 'agent stopping' });
    // Let the last messages leave before the socket closes.
    await new Promise((r) => setTimeout(r, 50));
    this.currentSocket?.close();
    for (const w of this.stopWaiters.splice(0)) w();
  }

  async ensureEnrolled(): Promise<string> {
    const id = this.identity;
    // What the control plane would record for the manifest given now (the same
    // validation and canonical hash as the router); null if it would refuse it.
    const local = validateManifest(this.opts.manifest.manifest);
    const localHash = local.ok ? local.hash : null;
    if (id.agentId && id.serverKey === this.opts.serverKey) {
      // The catalog (tools, risk, schemas, timeouts) is the manifest accepted at
      // enrollment. A manifest changed since must be enrolled again, or the router
      // would dispatch by stale risk classes (a tool made destructive would run
      // without approval): without a join key to do so, the agent refuses to start.
      if (id.manifestHash === undefined || id.manifestHash === localHash) return id.agentId;
      this.opts.logger.warn(
        { agentId: id.agentId, enrolled: id.manifestHash, now: localHash },
        'the manifest changed since enrollment; enrolling it again',
      );
      if (!this.opts.joinKey) {
        throw new EnrollmentFailedError(
          'manifest_changed',
          'the manifest differs from the one this agent enrolled with: give a join key to ' +
            'enroll it again, or restore the enrolled manifest',
        );
      }
    } else if (id.agentId) {
      this.opts.logger.warn(
        { agentId: id.agentId },
        'enrolled with another broker key; enrolling again with this one',
      );
    }
    const joinKey = this.opts.joinKey;
    const registrationName = this.opts.registrationName ?? id.registrationName;
    if (!joinKey || !registrationName) {
      throw new EnrollmentFailedError(
        'not_enrolled',
        'this agent is not enrolled yet: give a join key and a registration name',
      );
    }
    let attempt = 0;
    for (;;) {
      if (this.stopped) throw new EnrollmentFailedError('stopped', 'agent stopped');
      const reply = await this.enrollOnce(joinKey, registrationName);
      if (reply === null || (reply.type === 'ERROR' && reply.code === 'internal_error')) {
        const delay = backoffDelay(
          attempt++,
          this.o.reconnectMinMs,
          this.o.reconnectMaxMs,
          this.o.random,
        );
        this.opts.logger.warn(
          { retryInMs: delay, endpoint: this.opts.enrollEndpoint },
          reply ? 'enrollment failed on the router; retrying' : 'no enrollment answer; retrying',
        );
        await this.sleep(delay);
        continue;
      }
      if (reply.type === 'ENROLL_REJECTED') {
        throw new EnrollmentRejectedError(reply.code, reply.message, reply.param);
      }
      if (reply.type === 'ERROR') throw new EnrollmentFailedError(reply.code, reply.message);
      this.identity = {
        ...this.identity,
        agentId: reply.agent_id,
        serverKey: this.opts.serverKey,
        registrationName,
        manifestHash: reply.manifest_hash,
      };
      saveIdentity(this.opts.keyFile, this.identity);
      this.opts.logger.info(
        { agentId: reply.agent_id, manifestHash: reply.manifest_hash, registrationName },
        'enrolled',
      );
      this.emit('enrolled', reply.agent_id);
      return reply.agent_id;
    }
  }

  private curveOptions() {
    return {
      curveServerKey: this.opts.serverKey,
      curvePublicKey: this.identity.publicKey,
      curveSecretKey: this.identity.secretKey,
      linger: 0,
    };
  }

  /** One ENROLL round trip; null when no answer came in time. */
  private async enrollOnce(joinKey: string, registrationName: string) {
    const sock = new Dealer({
      ...this.curveOptions(),
      receiveTimeout: this.o.requestTimeoutMs,
      sendTimeout: this.o.requestTimeoutMs,
    });
    this.currentSocket = sock;
    try {
      sock.connect(this.opts.enrollEndpoint);
      await sock.send(
        encode({
          type: 'ENROLL',
          join_key: joinKey,
          registration_name: registrationName,
          manifest: this.opts.manifest.manifest,
          curve_public_key: this.identity.publicKey,
          key_proof: this.proof('enroll'),
        }),
      );
      const [frame] = await sock.receive();
      const decoded = decode(frame, enrollOutbound);
      if (!decoded.ok) {
        throw new EnrollmentFailedError(decoded.code, `bad answer from router: ${decoded.message}`);
      }
      return decoded.msg;
    } catch (err) {
      if (err instanceof EnrollmentFailedError) throw err;
      const code = (err as { code?: string }).code;
      if (code === 'EAGAIN' || this.stopped) return null;
      throw err;
    } finally {
      sock.close();
    }
  }

  private proof(purpose: 'enroll' | 'hello'): string {
    return keyProof(this.identity.secretKey, this.opts.serverKey, purpose, this.identity.publicKey);
  }

  /** One session on the agent socket; resolves when it ends, with why. */
  private async runSession(): Promise<{ reason: string; welcomed: boolean }> {
    const sock = new Dealer({
      ...this.curveOptions(),
      sendTimeout: this.o.requestTimeoutMs,
      heartbeatInterval: 10_000,
      heartbeatTimeout: 30_000,
    });
    this.currentSocket = sock;
    const sender = new SendQueue(sock);
    const log = this.opts.logger;
    let welcomed = false;
    let end!: (reason: string) => void;
    const ended = new Promise<string>((resolve) => (end = resolve));
    const send = (msg: OutgoingMessage) => {
      sender.send(encode(msg)).catch((err: unknown) => {
        if (!sock.closed) log.debug({ err, type: msg.type }, 'send failed');
      });
    };
    const stopWaiter = () => end('stopped');
    this.stopWaiters.push(stopWaiter);

    sock.events.on('handshake:error:auth', (ev) => {
      log.error(
        { status: ev.error.status, agentId: this.identity.agentId },
        'broker refused this agent key (not enrolled, deleted or rotated)',
      );
      this.emit('refused');
      end('refused');
    });

    let renewTimer: NodeJS.Timeout | undefined;
    let renewPending = false;
    const startRenewals = (leaseMs: number) => {
      clearInterval(renewTimer);
      const interval = Math.max(10, Math.floor(leaseMs / 3));
      renewTimer = setInterval(() => {
        if (renewPending) return end('lease_lost');
        renewPending = true;
        send({ type: 'RENEW' });
        this.resendResults(send, interval);
      }, interval);
    };

    const helloTimer = setTimeout(() => end('hello_timeout'), this.o.requestTimeoutMs);
    const handle = (m: AgentOutbound) => {
      switch (m.type) {
        case 'WELCOME':
          clearTimeout(helloTimer);
          welcomed = true;
          this.session = { send };
          log.info({ agentId: m.agent_id, leaseMs: m.lease_ms }, 'connected to broker');
          startRenewals(m.lease_ms);
          this.resendResults(send, 0, false);
          this.emit('connected', m.agent_id, m.lease_ms);
          return;
        case 'RENEWED':
          renewPending = false;
          this.emit('renewed', m.lease_ms);
          return;
        case 'DISPATCH':
          return this.onDispatch(m, send);
        case 'CANCEL':
          return this.onCancel(m.invocation_id, send);
        case 'RESULT_ACK':
          this.unacked.delete(m.invocation_id);
          return;
        case 'PING':
          return send({ type: 'PONG', ...(m.nonce ? { nonce: m.nonce } : {}) });
        case 'PONG':
          return;
        case 'BYE':
          if (m.code === 'agent_unknown') {
            log.error({ agentId: this.identity.agentId }, 'broker does not know this agent');
          }
          return end(`bye:${m.code}`);
        case 'ERROR':
          log.error({ code: m.code, message: m.message }, 'broker reported a protocol error');
          if (!welcomed) end(`error:${m.code}`);
          return;
      }
    };

    const receiving = (async () => {
      try {
        for await (const [frame] of sock) {
          const decoded = decode(frame, agentOutbound);
          if (!decoded.ok) log.warn({ code: decoded.code }, decoded.message);
          else handle(decoded.msg);
        }
      } catch (err) {
        if (!sock.closed) log.warn({ err }, 'receive failed');
      }
      end('socket_closed');
    })();

    sock.connect(this.opts.agentEndpoint);
    send({ type: 'HELLO', agent_key: this.identity.publicKey, key_proof: this.proof('hello') });

    const reason = await ended;
    clearTimeout(helloTimer);
    clearInterval(renewTimer);
    this.session = undefined;
    this.stopWaiters = this.stopWaiters.filter((w) => w !== stopWaiter);
    if (!sock.closed) sock.close(); // on stop(), already closed after its BYE
    await receiving;
    return { reason, welcomed };
  }

  private onDispatch(m: Extract<AgentOutbound, { type: 'DISPATCH' }>, send: ActiveSession['send']) {
    const id = m.invocation_id;
    if (this.running.has(id)) return send({ type: 'STARTED', invocation_id: id });
    const done = this.unacked.get(id);
    if (done) return send({ type: 'RESULT', invocation_id: id, outcome: done.outcome });
    const tool = this.opts.manifest.commands.get(m.tool);
    if (!tool) {
      this.report(id, {
        kind: 'error',
        errorCode: 'tool_unknown',
        errorMessage: `this agent has no tool '${m.tool}'`,
        durationMs: 0,
      });
      return;
    }
    const run = runTool(tool, {
      invocationId: id,
      toolName: m.tool,
      arguments: m.arguments,
      timeoutMs: m.timeout_ms,
      killGraceMs: this.o.killGraceMs,
      maxOutputBytes: this.o.maxOutputBytes,
      baseEnv: this.opts.toolEnv,
    });
    this.running.set(id, run);
    this.opts.logger.info(
      { invocationId: id, tool: m.tool, timeoutMs: m.timeout_ms },
      'tool started',
    );
    send({ type: 'STARTED', invocation_id: id });
    void run.outcome.then((outcome) => {
      this.running.delete(id);
      const final: DispatchOutcome =
        this.stopped && outcome.kind === 'cancelled'
          ? {
              kind: 'error',
              errorCode: 'agent_shutdown',
              errorMessage: 'the agent stopped while the tool ran',
              durationMs: outcome.durationMs,
            }
          : outcome;
      this.opts.logger.info(
        { invocationId: id, tool: m.tool, outcome: final.kind },
        'tool finished',
      );
      this.report(id, final);
    });
  }

  private onCancel(id: string, send: ActiveSession['send']) {
    const run = this.running.get(id);
    if (run) {
      this.opts.logger.info({ invocationId: id }, 'cancelling tool');
      run.cancel();
      return;
    }
    const done = this.unacked.get(id);
    if (done) return send({ type: 'RESULT', invocation_id: id, outcome: done.outcome });
    // Not running here (finished and acknowledged, or lost in an agent restart):
    // answer so the router can settle the invocation.
    this.report(id, { kind: 'cancelled', durationMs: 0 });
  }

  private report(id: string, outcome: DispatchOutcome) {
    const wire = fitResult(id, outcomeToWire(outcome));
    this.unacked.set(id, { outcome: wire, attempts: 1, sentAt: performance.now() });
    this.session?.send({ type: 'RESULT', invocation_id: id, outcome: wire });
  }

  /**
   * Sends again the results not acknowledged for `olderThanMs`. Within a session a
   * result sent `maxResultAttempts` times without an answer is dropped (the broker
   * cannot record it); at the start of a session (`count` false) all go again.
   */
  private resendResults(send: ActiveSession['send'], olderThanMs: number, count = true) {
    const now = performance.now();
    for (const [id, p] of this.unacked) {
      if (now - p.sentAt < olderThanMs) continue;
      if (count && p.attempts >= this.o.maxResultAttempts) {
        this.opts.logger.warn({ invocationId: id }, 'result never acknowledged; dropped');
        this.unacked.delete(id);
        continue;
      }
      if (count) p.attempts++;
      p.sentAt = now;
      send({ type: 'RESULT', invocation_id: id, outcome: p.outcome });
    }
  }

  private sleep(ms: number): Promise<void> {
    if (this.stopped) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        this.stopWaiters = this.stopWaiters.filter((w) => w !== done);
        resolve();
      };
      const t = setTimeout(done, ms);
      this.stopWaiters.push(done);
    });
  }
}

/** What a RESULT may take of the broker's message bound (the rest: the envelope). */
const RESULT_BYTES = MAX_MESSAGE_BYTES - 4096;

/**
 * The outcome cut so that its RESULT fits one message: the broker drops the connection
 * of a peer that sends a larger one (ZeroMQ's maximum message size), again at every
 * resend, so a tool allowed more output (`--max-output-bytes`, and JSON escaping
 * grows binary output up to six times) would never be recorded. The longer of stdout
 * and stderr is halved until it fits, and `truncated` says so.
 */
function fitResult(invocationId: string, outcome: WireOutcome): WireOutcome {
  if (outcome.kind !== 'exited') return outcome;
  let o = outcome;
  const size = () => encode({ type: 'RESULT', invocation_id: invocationId, outcome: o }).length;
  while (size() > RESULT_BYTES) {
    const field = o.stdout.length >= o.stderr.length ? 'stdout' : 'stderr';
    o = { ...o, [field]: halve(o[field]), truncated: true };
  }
  return o;
}

/** The first half of `s`, without splitting a surrogate pair. */
function halve(s: string): string {
  let end = Math.floor(s.length / 2);
  const last = s.charCodeAt(end - 1);
  if (last >= 0xd800 && last <= 0xdbff) end--;
  return s.slice(0, end);
}
