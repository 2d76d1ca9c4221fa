/**
 * The wire protocol between the broker and `switchyard agent` (version 1),
 * documented in docs/EXEC-PROTOCOL.md. Every message is one ZeroMQ frame
 * holding a UTF-8 JSON object `{v: 1, type, ...}` with snake_case fields; the
 * agent uses a DEALER socket, the broker a ROUTER (which prepends the routing
 * id). Both sides validate what they receive with the schemas below and work
 * with typed data after that.
 */
import { z } from 'zod';
import type { DispatchOutcome } from '../contracts.js';

export const PROTOCOL_VERSION = 1;

/** ZAP domains of the two broker sockets (RFC 27), so one handler tells them apart. */
export const ZAP_DOMAIN_ENROLL = 'switchyard-exec-enroll';
export const ZAP_DOMAIN_AGENTS = 'switchyard-exec-agents';

/** Largest message either broker socket accepts (bytes). */
export const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

/** Codes of `ERROR` messages (protocol faults, not enrollment decisions). */
export type ProtocolErrorCode =
  | 'protocol_error'
  | 'unsupported_version'
  | 'unexpected_message'
  | 'key_proof_invalid'
  | 'internal_error';

/** Codes of `BYE` messages: why a session ends. */
export type ByeCode =
  'broker_shutdown' | 'session_unknown' | 'agent_unknown' | 'superseded' | 'agent_shutdown';

const id = z.string().min(1).max(128);
const z85Key = z.string().length(40);

const outcome = z.discriminatedUnion('kind', [
  z.object({
    kind: z.literal('exited'),
    // Any number: the control plane fails an invocation whose exit code is no 32-bit
    // integer (`invalid_exit_code`); refused here, the RESULT would be lost.
    exit_code: z.number(),
    duration_ms: z.number().int().nonnegative(),
    stdout: z.string(),
    stderr: z.string(),
    truncated: z.boolean(),
  }),
  z.object({
    kind: z.literal('error'),
    error_code: z.string().min(1).max(64),
    error_message: z.string().max(4096),
    duration_ms: z.number().int().nonnegative(),
  }),
  z.object({ kind: z.literal('timeout'), elapsed_ms: z.number().int().nonnegative() }),
  z.object({ kind: z.literal('cancelled'), duration_ms: z.number().int().nonnegative() }),
]);
export type WireOutcome = z.infer<typeof outcome>;

const v = z.literal(PROTOCOL_VERSION);

// Agent -> broker, enrollment socket.
const enroll = z.object({
  v,
  type: z.literal('ENROLL'),
  join_key: z.string().min(1).max(512),
  registration_name: z.string().min(1).max(256),
  manifest: z.unknown(),
  curve_public_key: z85Key,
  key_proof: z.string().min(1).max(128),
  agent_version: z.string().max(64).optional(),
});
export const enrollInbound = z.discriminatedUnion('type', [enroll]);
export type EnrollInbound = z.infer<typeof enrollInbound>;

// Broker -> agent, enrollment socket.
const enrolled = z.object({
  v,
  type: z.literal('ENROLLED'),
  agent_id: id,
  lease_ms: z.number().int().positive(),
  manifest_hash: z.string(),
});
const enrollRejected = z.object({
  v,
  type: z.literal('ENROLL_REJECTED'),
  code: z.enum([
    'exec_manifest_invalid',
    'agent_name_in_use',
    'agent_name_conflict',
    'join_key_invalid',
  ]),
  message: z.string(),
  param: z.string().optional(),
});
const error = z.object({
  v,
  type: z.literal('ERROR'),
  code: z.string(),
  message: z.string(),
});
export const enrollOutbound = z.discriminatedUnion('type', [enrolled, enrollRejected, error]);
export type EnrollOutbound = z.infer<typeof enrollOutbound>;

const ping = z.object({ v, type: z.literal('PING'), nonce: z.string().max(64).optional() });
const pong = z.object({ v, type: z.literal('PONG'), nonce: z.string().max(64).optional() });
const bye = z.object({ v, type: z.literal('BYE'), code: z.string(), message: z.string() });

// Agent -> broker, agent socket.
const hello = z.object({
  v,
  type: z.literal('HELLO'),
  agent_key: z85Key,
  key_proof: z.string().min(1).max(128),
  agent_version: z.string().max(64).optional(),
});
const renew = z.object({ v, type: z.literal('RENEW') });
const started = z.object({ v, type: z.literal('STARTED'), invocation_id: id });
const result = z.object({ v, type: z.literal('RESULT'), invocation_id: id, outcome });
export const agentInbound = z.discriminatedUnion('type', [
  hello,
  renew,
  started,
  result,
  ping,
  pong,
  bye,
]);
export type AgentInbound = z.infer<typeof agentInbound>;

// Broker -> agent, agent socket.
const welcome = z.object({
  v,
  type: z.literal('WELCOME'),
  agent_id: id,
  lease_ms: z.number().int().positive(),
});
const renewed = z.object({ v, type: z.literal('RENEWED'), lease_ms: z.number().int().positive() });
const dispatch = z.object({
  v,
  type: z.literal('DISPATCH'),
  invocation_id: id,
  tool: z.string().min(1).max(64),
  arguments: z.unknown(),
  timeout_ms: z.number().int().positive(),
});
const cancel = z.object({ v, type: z.literal('CANCEL'), invocation_id: id });
const resultAck = z.object({ v, type: z.literal('RESULT_ACK'), invocation_id: id });
export const agentOutbound = z.discriminatedUnion('type', [
  welcome,
  renewed,
  dispatch,
  cancel,
  resultAck,
  ping,
  pong,
  bye,
  error,
]);
export type AgentOutbound = z.infer<typeof agentOutbound>;

/** Distributes Omit over a union, so each member keeps its own fields. */
type OmitV<T> = T extends unknown ? Omit<T, 'v'> : never;

export type OutgoingMessage = OmitV<EnrollInbound | EnrollOutbound | AgentInbound | AgentOutbound>;

export function encode(msg: OutgoingMessage): Buffer {
  return Buffer.from(JSON.stringify({ v: PROTOCOL_VERSION, ...msg }));
}

export type Decoded<T> =
  | { ok: true; msg: T }
  | { ok: false; code: 'protocol_error' | 'unsupported_version'; message: string };

/** Parses and validates one frame; never throws. */
export function decode<T>(frame: Buffer | undefined, schema: z.ZodType<T>): Decoded<T> {
  if (!frame) return { ok: false, code: 'protocol_error', message: 'empty message' };
  let raw: unknown;
  try {
    raw = JSON.parse(frame.toString('utf8'));
  } catch {
    return { ok: false, code: 'protocol_error', message: 'message is not JSON' };
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
    return { ok: false, code: 'protocol_error', message: 'message is not a JSON object' };
  }
  const version = (raw as { v?: unknown }).v;
  if (version !== PROTOCOL_VERSION) {
    return {
      ok: false,
      code: 'unsupported_version',
      message: `protocol version ${JSON.stringify(version)} is not supported (this side speaks ${PROTOCOL_VERSION})`,
    };
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const where = issue && issue.path.length ? ` at ${issue.path.join('.')}` : '';
    return {
      ok: false,
      code: 'protocol_error',
      message: `invalid message${where}: ${issue?.message ?? 'schema mismatch'}`,
    };
  }
  return { ok: true, msg: parsed.data };
}

export function outcomeToWire(o: DispatchOutcome): WireOutcome {
  switch (o.kind) {
    case 'exited':
      return {
        kind: 'exited',
        exit_code: o.exitCode,
        duration_ms: o.durationMs,
        stdout: o.stdout,
        stderr: o.stderr,
        truncated: o.truncated,
      };
    case 'error':
      return {
        kind: 'error',
        error_code: o.errorCode,
        error_message: o.errorMessage,
        duration_ms: o.durationMs,
      };
    case 'timeout':
      return { kind: 'timeout', elapsed_ms: o.elapsedMs };
    case 'cancelled':
      return { kind: 'cancelled', duration_ms: o.durationMs };
  }
}

export function outcomeFromWire(o: WireOutcome): DispatchOutcome {
  switch (o.kind) {
    case 'exited':
      return {
        kind: 'exited',
        exitCode: o.exit_code,
        durationMs: o.duration_ms,
        stdout: o.stdout,
        stderr: o.stderr,
        truncated: o.truncated,
      };
    case 'error':
      return {
        kind: 'error',
        errorCode: o.error_code,
        errorMessage: o.error_message,
        durationMs: o.duration_ms,
      };
    case 'timeout':
      return { kind: 'timeout', elapsedMs: o.elapsed_ms };
    case 'cancelled':
      return { kind: 'cancelled', durationMs: o.duration_ms };
  }
}

/**
 * Serialises sends on one zeromq.js socket: it allows a single blocking
 * `send()` at a time (a second one fails with EBUSY).
 */
export class SendQueue {
  private tail: Promise<unknown> = Promise.resolve();
  constructor(private readonly socket: { send(msg: Buffer | Buffer[]): Promise<void> }) {}

  send(msg: Buffer | Buffer[]): Promise<void> {
    const next = this.tail.then(() => this.socket.send(msg));
    this.tail = next.catch(() => undefined);
    return next;
  }
}
