/**
 * Per-request routing hints: the `X-SLO-TTFT-Ms` / `X-SLO-TPOT-Ms` headers and the
 * body's `service_tier`.
 *
 * Header rule (spec): each must be a positive number; an invalid value is ignored,
 * never an error, and the hints only bias worker selection. "Positive number" is
 * read strictly: a decimal literal (`250`, `12.5`, `.5`, `1e3`) after trimming,
 * finite and > 0. Signs, hex, `Infinity`, units (`250ms`), empty strings and
 * repeated headers (Node joins them with `, `) are ignored.
 *
 * `service_tier` is validated at the request boundary (an unknown value is a 400
 * there); here anything that is not `flex` or `priority` behaves as `default`.
 */

export type ServiceTierHint = 'flex' | 'priority' | 'auto' | 'default';

/** The spec's score adjustment per hint; docs/ROUTING.md says where it applies. */
export const TIER_ADJUSTMENT: Readonly<Record<ServiceTierHint, number>> = {
  flex: -15,
  priority: 15,
  auto: 0,
  default: 0,
};

export interface SloTargets {
  /** Target time to first token in ms. */
  ttftMs?: number;
  /** Target time per output token in ms. */
  tpotMs?: number;
}

export const SLO_TTFT_HEADER = 'x-slo-ttft-ms';
export const SLO_TPOT_HEADER = 'x-slo-tpot-ms';

const DECIMAL = /^(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/;

/** One header value as a positive finite number, or undefined when invalid or absent. */
export function parseSloValue(value: string | readonly string[] | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'string') return value.length === 1 ? parseSloValue(value[0]) : undefined;
  const s = value.trim();
  if (!DECIMAL.test(s)) return undefined;
  const n = Number(s);
  return Number.isFinite(n) && n > 0 ? n : undefined;
}

/** Header bag as Node gives it (lower-case names). */
export type HeaderBag = Readonly<Record<string, string | readonly string[] | undefined>>;

export function parseSloHeaders(headers: HeaderBag): SloTargets {
  const out: SloTargets = {};
  const ttft = parseSloValue(headers[SLO_TTFT_HEADER]);
  const tpot = parseSloValue(headers[SLO_TPOT_HEADER]);
  if (ttft !== undefined) out.ttftMs = ttft;
  if (tpot !== undefined) out.tpotMs = tpot;
  return out;
}

export function parseServiceTier(value: unknown): ServiceTierHint {
  return value === 'flex' || value === 'priority' || value === 'auto' ? value : 'default';
}
