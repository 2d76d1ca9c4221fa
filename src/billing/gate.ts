/**
 * The billing gate on the hot path: a project in dunning gets 402
 * `billing_delinquent`; a project whose credit is used up gets 402
 * `insufficient_quota` on priced models (a model with zero prices costs
 * nothing, so it stays usable). The project's balance is read through a
 * 1-second cache; spend is written by the usage recorder, so a project may
 * overrun its credit by at most the requests admitted within that second.
 */
import { ServiceError } from '../errors/index.js';
import {
  remainingMicrocents,
  type Project,
  type ProjectRepository,
} from '../projects/repository.js';
import type { Clock } from '../runtime/clock.js';
import { TtlCache } from '../runtime/ttl-cache.js';

export class BillingGate {
  private readonly cache: TtlCache<Project | null>;

  constructor(
    private readonly projects: ProjectRepository,
    clock: Clock,
    ttlMs: number,
  ) {
    // Exact after the TTL (no stale answer): credit running out must refuse the next request.
    this.cache = new TtlCache(clock, ttlMs, 10_000, false);
  }

  async check(projectId: string, priced: boolean): Promise<void> {
    const p = await this.cache.get(projectId, () => this.projects.getById(projectId));
    if (!p) return;
    if (p.billingStatus === 'delinquent') {
      throw new ServiceError('billing_delinquent', {
        message: 'The project has an unpaid balance; requests are refused until it is settled.',
      });
    }
    if (priced && remainingMicrocents(p) <= 0) {
      throw new ServiceError('insufficient_quota', {
        message: 'You exceeded your current quota: the project has no remaining credit.',
      });
    }
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
