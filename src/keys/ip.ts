/**
 * IP filtering of API keys (spec: Authentication, rule 4). `allowedIps`
 * non-empty: only those addresses pass; `blockedIps` is checked after and wins.
 * Entries are IPv4/IPv6 addresses or CIDR ranges; an IPv4-mapped IPv6 address
 * (`::ffff:10.0.0.1`, what a dual-stack socket reports) compares as IPv4.
 * An IPv4 client is matched against the IPv4 entries only (and `::ffff:a.b.c.d/n`
 * ones with n ≥ 96, which are IPv4 ranges): node's BlockList alone would also put
 * it inside any IPv6 range that spans `::ffff:0:0/96`, so `::/0` ("every IPv6
 * client") would block or admit every IPv4 client as well.
 * Compiled lists are memoised per key record, so the hot path does no parsing.
 */
import { BlockList, isIP } from 'node:net';

/** One list's entries, by family (a list with no entries compiles to null). */
interface Families {
  v4: BlockList;
  v6: BlockList;
}

interface Compiled {
  allowed: Families | null;
  blocked: Families | null;
}

const cache = new WeakMap<object, Compiled>();

function compile(entries: readonly string[]): Families | null {
  if (entries.length === 0) return null;
  const list = { v4: new BlockList(), v6: new BlockList() };
  for (const raw of entries) {
    const entry = unmapEntry(raw);
    const slash = entry.indexOf('/');
    const addr = slash === -1 ? entry : entry.slice(0, slash);
    const fam = isIP(addr);
    if (fam === 0) continue;
    const into = fam === 4 ? list.v4 : list.v6;
    const type = fam === 4 ? 'ipv4' : 'ipv6';
    if (slash === -1) into.addAddress(addr, type);
    else into.addSubnet(addr, Number(entry.slice(slash + 1)), type);
  }
  return list;
}

const MAPPED = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i;

/** `::ffff:a.b.c.d` → `a.b.c.d`; other addresses unchanged. */
export function unmapIp(addr: string): string {
  const m = MAPPED.exec(addr);
  return m ? m[1]! : addr;
}

function unmapEntry(entry: string): string {
  const slash = entry.indexOf('/');
  if (slash === -1) return unmapIp(entry);
  const addr = entry.slice(0, slash);
  const m = MAPPED.exec(addr);
  if (!m) return entry;
  // ::ffff:a.b.c.d/n with n >= 96 is the IPv4 range a.b.c.d/(n-96).
  const bits = Number(entry.slice(slash + 1));
  return bits >= 96 ? `${m[1]}/${bits - 96}` : entry;
}

export function ipAllowed(
  key: { allowedIps: readonly string[]; blockedIps: readonly string[] },
  address: string | undefined,
): boolean {
  if (key.allowedIps.length === 0 && key.blockedIps.length === 0) return true;
  let c = cache.get(key);
  if (!c) {
    c = { allowed: compile(key.allowedIps), blocked: compile(key.blockedIps) };
    cache.set(key, c);
  }
  if (!address) return false;
  const addr = unmapIp(address);
  const fam = isIP(addr);
  if (fam === 0) return false;
  const v4 = fam === 4;
  const type = v4 ? 'ipv4' : 'ipv6';
  if (c.allowed && !(v4 ? c.allowed.v4 : c.allowed.v6).check(addr, type)) return false;
  if (c.blocked && (v4 ? c.blocked.v4 : c.blocked.v6).check(addr, type)) return false;
  return true;
}
