/**
 * Request bodies for creating keys (operator API now; the key management API
 * later). Attribute names are the spec's.
 */
import { isIP } from 'node:net';
import { z } from 'zod';
import { SCOPES } from './scopes.js';

/** An IPv4/IPv6 address, or a CIDR range (an extension to the spec's addresses). */
export function isIpOrCidr(s: string): boolean {
  // A zone index (`fe80::1%eth0`) names an interface of one host, not an address.
  if (s.includes('%')) return false;
  const slash = s.indexOf('/');
  if (slash === -1) return isIP(s) !== 0;
  const addr = s.slice(0, slash);
  const bitsRaw = s.slice(slash + 1);
  const family = isIP(addr);
  if (family === 0 || !/^\d{1,3}$/.test(bitsRaw)) return false;
  const bits = Number(bitsRaw);
  return bits <= (family === 4 ? 32 : 128);
}

/**
 * The latest `expiresAt`: a time zone offset can put a timestamp of the year 9999 into
 * the year 10000 UTC, which a timestamp is not written in (a 500 at the insert).
 */
const LAST_TIMESTAMP_MS = Date.UTC(9999, 11, 31, 23, 59, 59, 999);

const ipList = z
  .array(z.string().refine(isIpOrCidr, 'must be an IPv4 or IPv6 address or CIDR range'))
  .max(256);

export const createKeyBody = z
  .object({
    name: z.string().max(200).optional(),
    scopes: z
      .array(z.enum(SCOPES))
      .min(1)
      .refine((a) => new Set(a).size === a.length, 'must not repeat a scope')
      .optional(),
    expiresAt: z.iso
      .datetime({ offset: true })
      .refine(
        (v) => new Date(v).getTime() <= LAST_TIMESTAMP_MS,
        'must not be later than 9999-12-31T23:59:59.999Z',
      )
      .nullable()
      .optional(),
    allowedIps: ipList.optional(),
    blockedIps: ipList.optional(),
    quotaRequests: z.number().int().min(1).max(1_000_000_000).optional(),
    quotaWindow: z.number().int().min(1).max(31_536_000).optional(),
    endpointId: z.uuid().nullable().optional(),
  })
  .strict();

export type CreateKeyBody = z.infer<typeof createKeyBody>;
