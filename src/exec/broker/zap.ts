/**
 * The ZAP handler (ZeroMQ RFC 27) of the broker's ZeroMQ context: libzmq asks
 * it about every CURVE handshake on a socket of that context, over a ROUTER
 * bound to `inproc://zeromq.zap.01`. Request frames (after the routing id and
 * the empty delimiter): version `1.0`, request id, domain, address, identity,
 * mechanism, credentials (for CURVE one frame: the client's 32-byte public
 * key). Reply: version, request id, status code (`200` admit, `400` refuse,
 * `500` internal error, the client retries), status text, user id, metadata.
 * A refused peer never completes the handshake: no message of it reaches the
 * socket.
 */
import { Router, type Context } from 'zeromq';
import type { Logger } from '../../runtime/logger.js';
import { SendQueue } from './protocol.js';
import { z85Encode } from './z85.js';

export const ZAP_ENDPOINT = 'inproc://zeromq.zap.01';

export interface ZapRequest {
  domain: string;
  /** The peer's IP address. */
  address: string;
  mechanism: string;
  /** The client's CURVE public key (Z85) for mechanism CURVE, else null. */
  curvePublicKey: string | null;
}

export type ZapDecision =
  { status: '200'; userId: string } | { status: '400' | '500'; reason: string };

export type ZapAuthorizer = (req: ZapRequest) => Promise<ZapDecision>;

export class ZapHandler {
  private readonly socket: Router;
  private readonly sender: SendQueue;
  private loop: Promise<void> | undefined;

  constructor(
    context: Context,
    private readonly authorize: ZapAuthorizer,
    private readonly logger: Logger,
  ) {
    this.socket = new Router({ context, linger: 0 });
    this.sender = new SendQueue(this.socket);
  }

  /** Binds the handler; must run before any CURVE server socket of the context accepts peers. */
  async start(): Promise<void> {
    await this.socket.bind(ZAP_ENDPOINT);
    this.loop = this.run();
  }

  private async run(): Promise<void> {
    try {
      for await (const frames of this.socket) {
        // Each request is answered on its own: a slow directory lookup must not hold up others.
        void this.answer(frames);
      }
    } catch (err) {
      if (!this.socket.closed) this.logger.error({ err }, 'ZAP handler stopped');
    }
  }

  private async answer(frames: Buffer[]): Promise<void> {
    const [routing, delimiter, version, requestId, domain, address, _identity, mechanism, cred] =
      frames;
    if (!routing || !delimiter || !version || !requestId) return; // not a ZAP request
    let decision: ZapDecision;
    if (version.toString() !== '1.0' || !domain || !mechanism) {
      decision = { status: '400', reason: 'malformed ZAP request' };
    } else {
      const mech = mechanism.toString();
      try {
        decision = await this.authorize({
          domain: domain.toString(),
          address: address?.toString() ?? '',
          mechanism: mech,
          curvePublicKey: mech === 'CURVE' && cred?.length === 32 ? z85Encode(cred) : null,
        });
      } catch (err) {
        this.logger.error({ err }, 'ZAP authorization failed');
        decision = { status: '500', reason: 'authorization unavailable' };
      }
    }
    const reply = [
      routing,
      delimiter,
      Buffer.from('1.0'),
      requestId,
      Buffer.from(decision.status),
      Buffer.from(decision.status === '200' ? 'OK' : decision.reason),
      Buffer.from(decision.status === '200' ? decision.userId : ''),
      Buffer.alloc(0),
    ];
    try {
      await this.sender.send(reply);
    } catch (err) {
      if (!this.socket.closed) this.logger.warn({ err }, 'ZAP reply failed');
    }
  }

  async close(): Promise<void> {
    this.socket.close();
    await this.loop;
  }
}
