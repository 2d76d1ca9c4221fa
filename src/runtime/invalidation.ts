/**
 * Cache invalidation across router instances. A change (key revoked or
 * rotated, endpoint or worker changed) is applied to this instance's caches at
 * once and, when Redis is configured, published on one pub/sub channel so every
 * other instance drops its cached copy within milliseconds. Without Redis the
 * caches' short TTL (1 s by default) bounds staleness instead.
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Logger } from './logger.js';

const KINDS = ['key', 'endpoint', 'workers', 'project'] as const;
export type InvalidationKind = (typeof KINDS)[number];

export interface Invalidation {
  kind: InvalidationKind;
  id: string;
}

type Handler = (m: Invalidation) => void;

export const INVALIDATION_CHANNEL = 'swy:invalidate';

export class InvalidationBus {
  private readonly handlers: Handler[] = [];
  /** Identifies this instance, so it ignores its own echoes. */
  private readonly origin = randomUUID();

  private constructor(
    private readonly pub: Redis | null,
    private readonly sub: Redis | null,
    private readonly logger: Logger,
  ) {}

  static local(logger: Logger): InvalidationBus {
    return new InvalidationBus(null, null, logger);
  }

  static async redis(pub: Redis, sub: Redis, logger: Logger): Promise<InvalidationBus> {
    const bus = new InvalidationBus(pub, sub, logger);
    sub.on('message', (channel: string, raw: string) => {
      if (channel !== INVALIDATION_CHANNEL) return;
      bus.receive(raw);
    });
    // Not awaited: with Redis down at start the subscription completes when it is back.
    sub.subscribe(INVALIDATION_CHANNEL).catch((err: unknown) => {
      logger.warn({ err }, 'redis subscribe failed; caches fall back to their TTL');
    });
    return bus;
  }

  on(handler: Handler): void {
    this.handlers.push(handler);
  }

  /** Applies locally at once, then tells the other instances. */
  async publish(kind: InvalidationKind, id: string): Promise<void> {
    this.dispatch({ kind, id });
    if (!this.pub) return;
    try {
      await this.pub.publish(
        INVALIDATION_CHANNEL,
        JSON.stringify({ kind, id, origin: this.origin }),
      );
    } catch (err) {
      // Other instances fall back to their cache TTL; the change itself is durable.
      this.logger.warn({ err, kind }, 'invalidation publish failed');
    }
  }

  private receive(raw: string): void {
    let m: { kind?: unknown; id?: unknown; origin?: unknown };
    try {
      m = JSON.parse(raw) as typeof m;
    } catch {
      return;
    }
    if (m.origin === this.origin) return;
    // Every kind a publisher sends (the list is the type's): a kind left out here was
    // dropped on the other instances, and a project's credit or billing status
    // changed there only when their 1 s cache expired.
    if (KINDS.includes(m.kind as InvalidationKind) && typeof m.id === 'string') {
      this.dispatch({ kind: m.kind as InvalidationKind, id: m.id });
    }
  }

  private dispatch(m: Invalidation): void {
    for (const h of this.handlers) h(m);
  }

  async close(): Promise<void> {
    this.sub?.disconnect();
    this.pub?.disconnect();
  }
}
