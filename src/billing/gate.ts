/**
 * The billing gate on the hot path: a project in dunning gets 402
 * `billing_delinquent`; a project whose credit is used up gets 402
 * `insufficient_quota` on priced models (a model with zero prices costs
 * nothing, so it stays usable). The project's balance is read through a
 * 1-second cache; spend is written by the usage recorder when a request ends.
 *
 * Requests still running have spent nothing on record yet: each one this instance
 * admits reserves what it may cost at most (its prompt estimate and its max_tokens at
 * the model's prices) until it ends, and a request is refused once the credit less
 * those reservations is used up. So long streams started together cannot overrun the
 * credit without bound; what remains is one request's reservation, the requests of
 * the second the balance is cached, and other instances' requests in flight.
 */
import { ServiceError } from '../errors/index.js';
import {
  remainingMicrocents,
  type Project,
  type ProjectRepository,
} from '../projects/repository.js';
import type { Clock } from '../runtime/clock.js';
import { TtlCache } from '../runtime/ttl-cache.js';

const NOTHING = (): void => undefined;

export class BillingGate {
  private readonly cache: TtlCache<Project | null>;
  /** Micro-cents reserved per project by requests in flight here. */
  private readonly reserved = new Map<string, number>();

  constructor(
    private readonly projects: ProjectRepository,
    clock: Clock,
    ttlMs: number,
  ) {
    // Exact after the TTL (no stale answer): credit running out must refuse the next request.
    this.cache = new TtlCache(clock, ttlMs, 10_000, false);
  }

  /**
   * Refuses (402) or admits the request; `holdMicrocents` (what it may cost at most)
   * is then held against the project's credit until the returned function is called,
   * once the request has ended. The comparison and the hold happen in one step after
   * the balance is read, so requests arriving together each see the others' holds.
   */
  async check(projectId: string, priced: boolean, holdMicrocents = 0): Promise<() => void> {
    const p = await this.cache.get(projectId, () => this.projects.getById(projectId));
    if (!p) return NOTHING;
    if (p.billingStatus === 'delinquent') {
      throw new ServiceError('billing_delinquent', {
        message: 'The project has an unpaid balance; requests are refused until it is settled.',
      });
    }
    if (!priced) return NOTHING;
    const held = this.reserved.get(projectId) ?? 0;
    if (remainingMicrocents(p) - held <= 0) {
      throw new ServiceError('insufficient_quota', {
        message: 'You exceeded your current quota: the project has no remaining credit.',
      });
    }
    if (holdMicrocents <= 0) return NOTHING;
    this.reserved.set(projectId, held + holdMicrocents);
    let holding = true;
    return () => {
      if (!holding) return;
      holding = false;
      const left = (this.reserved.get(projectId) ?? 0) - holdMicrocents;
      if (left > 0) this.reserved.set(projectId, left);
      else this.reserved.delete(projectId);
    };
  }

  invalidate(projectId: string): void {
    this.cache.delete(projectId);
  }
}

/** Cost in micro-cents: tokens × cents per million tokens, times the multipliers. */
export function costMicrocents(
  usage: { promptTokens: number; completionTokens: number },
  prices: { promptPriceCentsPerMtok: number; completionPriceCentsPerMtok: number },
  multiplier: number,
): number {
  const base =
    usage.promptTokens * prices.promptPriceCentsPerMtok +
    usage.completionTokens * prices.completionPriceCentsPerMtok;
  return Math.round(base * multiplier);
}
