/**
 * SSRF guard for webhook deliveries (spec: Delivery and retry rules, rule 4).
 *
 * A tenant chooses the URL we POST to, so without this guard any project could
 * make the router talk to its own loopback, the cloud metadata service or the
 * operator's private network. The rules:
 *
 * 1. Address policy. `forbiddenRange(ip)` names the special-purpose range an
 *    address falls in (see FORBIDDEN_RANGES), or null for ordinary public
 *    unicast. Addresses that carry an IPv4 address inside IPv6 are judged by
 *    the embedded IPv4: IPv4-mapped `::ffff:0:0/96` and NAT64 `64:ff9b::/96`
 *    (so `[::ffff:127.0.0.1]` and `[64:ff9b::a9fe:a9fe]` are refused while
 *    `64:ff9b::1.1.1.1` is public). 6to4 `2002::/16` is refused outright rather
 *    than judged by its embedded IPv4: it is deprecated (RFC 7526), no
 *    legitimate receiver needs it, and a host with a 6to4 interface would send
 *    `2002:7f00:1::` straight to the embedded 127.0.0.1. Anything IPv6 outside
 *    global unicast `2000::/3` is refused as a catch-all, so ranges IANA carves
 *    out later are closed by default. Unparseable input is refused (fail closed).
 * 2. Operator override. `createAddressPolicy({ allowCidrs })`, fed by
 *    SWITCHYARD_WEBHOOK_ALLOW_CIDRS (empty by default), exempts listed ranges so
 *    tests and on-premise installs can deliver to loopback or a private network.
 *    An exempt address is allowed even if it is in a forbidden range.
 * 3. Creation/update check (fast feedback). `validateWebhookUrl` accepts only
 *    `https:` without userinfo; judges literal-IP hosts on the WHATWG-normalised
 *    hostname (the URL parser already turns `2130706433`, `0177.0.0.1`,
 *    `0x7f.1` and `127.1` into `127.0.0.1`, and compresses bracketed IPv6); refuses
 *    names that by convention resolve inside a site (`localhost`, `*.localhost`,
 *    `*.local`, `*.internal`, `*.home.arpa`, `*.localdomain`) unless every
 *    address they resolve to is operator-exempt; resolves other names and
 *    refuses the URL if ANY address is not allowed.
 * 4. Connect-time check (the real guard). DNS can change between creation and
 *    delivery (rebinding), so `createGuardedAgent` builds an undici Agent whose
 *    connector resolves through `createGuardedLookup`: every address the name
 *    resolves to is checked and the connection fails with an `ESSRF` error
 *    before any TCP packet is sent if one is not allowed. Node never calls
 *    `lookup` for literal IPs, so the connector checks literal hosts itself, and
 *    after connecting it checks the socket's actual peer address as a last line.
 *    The agent speaks HTTPS only, never follows redirects (undici's `request`
 *    does not, and no redirect interceptor is installed: a 3xx is a failed
 *    attempt), and never consults HTTP_PROXY/HTTPS_PROXY (a plain Agent, not
 *    EnvHttpProxyAgent). SWITCHYARD_WEBHOOK_CA_FILE adds a CA to the public
 *    roots rather than replacing them.
 */
import { lookup as dnsLookup } from 'node:dns/promises';
import { isIP, type LookupFunction } from 'node:net';
import { createSecureContext, rootCertificates } from 'node:tls';
import type { Agent as UndiciAgent, buildConnector as UndiciConnector } from 'undici';
import { Agent, buildConnector } from '../runtime/http-client.js';

// ---------------------------------------------------------------------------
// Address parsing (own parser: we need the bytes, including embedded IPv4)
// ---------------------------------------------------------------------------

type Family = 4 | 6;

interface Parsed {
  family: Family;
  bytes: Uint8Array;
}

const IPV4_PART = /^(?:0|[1-9][0-9]{0,2})$/;
const IPV6_GROUP = /^[0-9a-fA-F]{1,4}$/;

/**
 * Strict dotted-quad only. Leading zeros are refused (fail closed) because some
 * stacks read them as octal; URL hosts reach here already normalised.
 */
function parseIPv4(s: string): Uint8Array | null {
  const parts = s.split('.');
  if (parts.length !== 4) return null;
  const out = new Uint8Array(4);
  for (let i = 0; i < 4; i++) {
    const p = parts[i]!;
    if (!IPV4_PART.test(p)) return null;
    const n = Number(p);
    if (n > 255) return null;
    out[i] = n;
  }
  return out;
}

function parseGroups(side: string): number[] | null {
  if (side === '') return [];
  const words: number[] = [];
  const groups = side.split(':');
  for (let i = 0; i < groups.length; i++) {
    const g = groups[i]!;
    if (i === groups.length - 1 && g.includes('.')) {
      const v4 = parseIPv4(g);
      if (!v4) return null;
      words.push((v4[0]! << 8) | v4[1]!, (v4[2]! << 8) | v4[3]!);
    } else {
      if (!IPV6_GROUP.test(g)) return null;
      words.push(parseInt(g, 16));
    }
  }
  return words;
}

function parseIPv6(input: string): Uint8Array | null {
  // A zone id (`fe80::1%eth0`) does not change which range the address is in.
  const pct = input.indexOf('%');
  const s = pct === -1 ? input : input.slice(0, pct);
  const halves = s.split('::');
  if (halves.length > 2) return null;
  let words: number[];
  if (halves.length === 2) {
    const head = parseGroups(halves[0]!);
    const tail = parseGroups(halves[1]!);
    if (!head || !tail || head.length + tail.length > 7) return null;
    // An embedded IPv4 is only valid as the very last element.
    if (halves[0]!.includes('.')) return null;
    words = [...head, ...new Array<number>(8 - head.length - tail.length).fill(0), ...tail];
  } else {
    const all = parseGroups(s);
    if (!all || all.length !== 8) return null;
    words = all;
  }
  const out = new Uint8Array(16);
  words.forEach((w, i) => {
    out[i * 2] = w >> 8;
    out[i * 2 + 1] = w & 0xff;
  });
  return out;
}

function parseAddress(ip: string): Parsed | null {
  let s = ip.trim();
  if (s.startsWith('[') && s.endsWith(']')) s = s.slice(1, -1);
  if (s.includes(':')) {
    const bytes = parseIPv6(s);
    return bytes ? { family: 6, bytes } : null;
  }
  const bytes = parseIPv4(s);
  return bytes ? { family: 4, bytes } : null;
}

interface Cidr {
  family: Family;
  bytes: Uint8Array;
  bits: number;
}

function inCidr(addr: Uint8Array, cidr: Cidr): boolean {
  const full = cidr.bits >> 3;
  for (let i = 0; i < full; i++) if (addr[i] !== cidr.bytes[i]) return false;
  const rest = cidr.bits & 7;
  if (rest === 0) return true;
  const mask = (0xff << (8 - rest)) & 0xff;
  return (addr[full]! & mask) === (cidr.bytes[full]! & mask);
}

/** `a.b.c.d/n`, `x::y/n` or a bare address; host bits are ignored. Null if invalid. */
function parseCidr(entry: string): Cidr | null {
  const trimmed = entry.trim();
  const slash = trimmed.indexOf('/');
  const addr = parseAddress(slash === -1 ? trimmed : trimmed.slice(0, slash));
  if (!addr) return null;
  const max = addr.family === 4 ? 32 : 128;
  let bits = max;
  if (slash !== -1) {
    const b = trimmed.slice(slash + 1);
    if (!/^[0-9]{1,3}$/.test(b)) return null;
    bits = Number(b);
    if (bits > max) return null;
  }
  return { family: addr.family, bytes: addr.bytes, bits };
}

function mustCidr(entry: string): Cidr {
  const c = parseCidr(entry);
  if (!c) throw new Error(`invalid CIDR: ${JSON.stringify(entry)}`);
  return c;
}

const MAPPED: Cidr = {
  family: 6,
  bytes: Uint8Array.from([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0]),
  bits: 96,
};

// ---------------------------------------------------------------------------
// The forbidden ranges
// ---------------------------------------------------------------------------

export interface ForbiddenRange {
  cidr: string;
  description: string;
  /**
   * True for IPv6 ranges that carry an IPv4 address in their last 32 bits and
   * are judged by it instead of being refused outright.
   */
  judgedByEmbeddedIpv4?: boolean;
}

/** First match wins, so narrower ranges come before the ranges containing them. */
export const FORBIDDEN_IPV4_RANGES: readonly ForbiddenRange[] = [
  { cidr: '0.0.0.0/8', description: '"this network" (RFC 791)' },
  { cidr: '10.0.0.0/8', description: 'private (RFC 1918)' },
  { cidr: '100.64.0.0/10', description: 'carrier-grade NAT (RFC 6598)' },
  { cidr: '127.0.0.0/8', description: 'loopback' },
  { cidr: '169.254.0.0/16', description: 'link-local / cloud metadata' },
  { cidr: '172.16.0.0/12', description: 'private (RFC 1918)' },
  { cidr: '192.0.0.0/24', description: 'IETF protocol assignments (RFC 6890)' },
  { cidr: '192.0.2.0/24', description: 'documentation TEST-NET-1' },
  { cidr: '192.88.99.0/24', description: '6to4 relay anycast (RFC 7526)' },
  { cidr: '192.168.0.0/16', description: 'private (RFC 1918)' },
  { cidr: '198.18.0.0/15', description: 'benchmarking (RFC 2544)' },
  { cidr: '198.51.100.0/24', description: 'documentation TEST-NET-2' },
  { cidr: '203.0.113.0/24', description: 'documentation TEST-NET-3' },
  { cidr: '224.0.0.0/4', description: 'multicast' },
  { cidr: '255.255.255.255/32', description: 'limited broadcast' },
  { cidr: '240.0.0.0/4', description: 'reserved (class E)' },
];

export const FORBIDDEN_IPV6_RANGES: readonly ForbiddenRange[] = [
  { cidr: '::ffff:0:0/96', description: 'IPv4-mapped', judgedByEmbeddedIpv4: true },
  { cidr: '64:ff9b::/96', description: 'NAT64 (RFC 6052)', judgedByEmbeddedIpv4: true },
  { cidr: '::/128', description: 'unspecified' },
  { cidr: '::1/128', description: 'loopback' },
  { cidr: '::/96', description: 'IPv4-compatible (deprecated, RFC 4291)' },
  { cidr: '::ffff:0:0:0/96', description: 'IPv4-translated (RFC 2765)' },
  { cidr: '64:ff9b:1::/48', description: 'NAT64 local-use (RFC 8215)' },
  { cidr: '100::/64', description: 'discard-only (RFC 6666)' },
  { cidr: '2001::/32', description: 'Teredo (RFC 4380)' },
  { cidr: '2001:2::/48', description: 'benchmarking (RFC 5180)' },
  { cidr: '2001:10::/28', description: 'ORCHID (RFC 4843)' },
  { cidr: '2001:20::/28', description: 'ORCHIDv2 (RFC 7343)' },
  { cidr: '2001::/23', description: 'IETF protocol assignments (RFC 2928)' },
  { cidr: '2001:db8::/32', description: 'documentation (RFC 3849)' },
  { cidr: '2002::/16', description: '6to4 (deprecated, RFC 7526)' },
  { cidr: '3fff::/20', description: 'documentation (RFC 9637)' },
  { cidr: 'fc00::/7', description: 'unique-local (RFC 4193)' },
  { cidr: 'fe80::/10', description: 'link-local' },
  { cidr: 'fec0::/10', description: 'site-local (deprecated, RFC 3879)' },
  { cidr: 'ff00::/8', description: 'multicast' },
];

/** Everything IPv6 outside this is refused: IANA allocates global unicast only here. */
const GLOBAL_UNICAST_V6 = mustCidr('2000::/3');

const V4_TABLE = FORBIDDEN_IPV4_RANGES.map((r) => ({ range: r, cidr: mustCidr(r.cidr) }));
const V6_TABLE = FORBIDDEN_IPV6_RANGES.map((r) => ({ range: r, cidr: mustCidr(r.cidr) }));

function v4Verdict(bytes: Uint8Array): string | null {
  for (const { range, cidr } of V4_TABLE) {
    if (inCidr(bytes, cidr)) return `${range.cidr} ${range.description}`;
  }
  return null;
}

function verdict(addr: Parsed): string | null {
  if (addr.family === 4) return v4Verdict(addr.bytes);
  for (const { range, cidr } of V6_TABLE) {
    if (!inCidr(addr.bytes, cidr)) continue;
    if (range.judgedByEmbeddedIpv4) {
      const inner = v4Verdict(addr.bytes.slice(12));
      return inner === null ? null : `${range.cidr} ${range.description} of ${inner}`;
    }
    return `${range.cidr} ${range.description}`;
  }
  if (!inCidr(addr.bytes, GLOBAL_UNICAST_V6)) return 'outside IPv6 global unicast 2000::/3';
  return null;
}

/**
 * Why `ip` may not receive webhooks (the range and its purpose), or null for
 * an ordinary public address. Input that is not an IP address is refused.
 */
export function forbiddenRange(ip: string): string | null {
  const addr = parseAddress(ip);
  if (!addr) return 'not an IP address';
  return verdict(addr);
}

export function isForbiddenAddress(ip: string): boolean {
  return forbiddenRange(ip) !== null;
}

// ---------------------------------------------------------------------------
// Policy with the operator's allowlist
// ---------------------------------------------------------------------------

export interface AddressPolicy {
  /** True when webhooks may be delivered to `ip`. */
  isAllowed(ip: string): boolean;
  /** True when `ip` is inside one of the operator's allowCidrs. */
  isExempt(ip: string): boolean;
  /** The operator's exemptions as given (for the loud start-up log). */
  readonly allowCidrs: readonly string[];
}

export interface AddressPolicyOptions {
  /** CIDRs or single addresses exempted from the forbidden ranges. */
  allowCidrs?: readonly string[];
}

/**
 * Throws on an invalid allowCidrs entry: it comes from operator configuration
 * and a typo must stop start-up rather than silently exempt nothing.
 */
export function createAddressPolicy(options: AddressPolicyOptions = {}): AddressPolicy {
  const allowCidrs = Object.freeze([...(options.allowCidrs ?? [])]);
  const exempt = allowCidrs.map((entry): Cidr => {
    const c = parseCidr(entry);
    if (!c) throw new Error(`invalid webhook allowCidrs entry: ${JSON.stringify(entry)}`);
    // `::ffff:a.b.c.d/n` (n >= 96) names an IPv4 range; store it as one so it
    // matches plain IPv4 peers too.
    if (c.family === 6 && c.bits >= 96 && inCidr(c.bytes, MAPPED)) {
      return { family: 4, bytes: c.bytes.slice(12), bits: c.bits - 96 };
    }
    return c;
  });

  const isExempt = (ip: string): boolean => {
    if (exempt.length === 0) return false;
    const addr = parseAddress(ip);
    if (!addr) return false;
    // A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d; match it as IPv4.
    const forms: Parsed[] = [addr];
    if (addr.family === 6 && inCidr(addr.bytes, MAPPED)) {
      forms.push({ family: 4, bytes: addr.bytes.slice(12) });
    }
    return forms.some((f) => exempt.some((c) => c.family === f.family && inCidr(f.bytes, c)));
  };

  return {
    allowCidrs,
    isExempt,
    isAllowed: (ip) => isExempt(ip) || forbiddenRange(ip) === null,
  };
}

/** Splits SWITCHYARD_WEBHOOK_ALLOW_CIDRS (comma- or space-separated) into entries. */
export function parseAllowCidrs(value: string | undefined): string[] {
  if (!value) return [];
  return value
    .split(/[\s,]+/)
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
}

// ---------------------------------------------------------------------------
// Resolution
// ---------------------------------------------------------------------------

export interface ResolvedAddress {
  address: string;
  family: number;
}

/** Every address a name resolves to; injectable so tests can simulate rebinding. */
export type Resolver = (hostname: string) => Promise<readonly ResolvedAddress[]>;

/** getaddrinfo through libuv's thread pool, like Node's own connect path. */
export const systemResolver: Resolver = (hostname) => dnsLookup(hostname, { all: true });

/** The error every SSRF refusal at connect time carries; dispatchers key on `code`. */
export class SsrfError extends Error {
  readonly code = 'ESSRF';
  constructor(
    message: string,
    readonly host: string,
    readonly address: string | null,
  ) {
    super(message);
    this.name = 'SsrfError';
  }
}

function refused(host: string, address: string, why: string | null): SsrfError {
  const shown = address === host ? address : `${host} (${address})`;
  return new SsrfError(
    `webhook delivery refused: ${shown} is ${why ?? 'not allowed'}`,
    host,
    address,
  );
}

function notFound(hostname: string): NodeJS.ErrnoException {
  const err: NodeJS.ErrnoException = new Error(`getaddrinfo ENOTFOUND ${hostname}`);
  err.code = 'ENOTFOUND';
  err.syscall = 'getaddrinfo';
  return err;
}

function familyOf(option: number | 'IPv4' | 'IPv6' | undefined): number {
  if (option === 'IPv4') return 4;
  if (option === 'IPv6') return 6;
  return option ?? 0;
}

/**
 * A `net`/`tls` lookup hook that resolves with `resolver` and refuses the
 * connection if ANY resolved address is not allowed: checking only the one
 * Node picks would let a mixed answer (public + private) through on a retry
 * or under happy-eyeballs fallback.
 */
export function createGuardedLookup(
  policy: AddressPolicy,
  resolver: Resolver = systemResolver,
): LookupFunction {
  return (hostname, options, callback) => {
    // Promise.resolve().then catches a resolver that throws synchronously; the
    // two-argument then keeps a throwing callback from being called twice.
    Promise.resolve()
      .then(() => resolver(hostname))
      .then(
        (addresses) => {
          for (const a of addresses) {
            if (!policy.isAllowed(a.address)) {
              callback(refused(hostname, a.address, forbiddenRange(a.address)), '');
              return;
            }
          }
          const family = familyOf(options.family);
          const usable = addresses.filter(
            (a) => family === 0 || a.family === family || isIP(a.address) === family,
          );
          const first = usable[0];
          if (!first) {
            callback(notFound(hostname), '');
            return;
          }
          if (options.all) {
            callback(
              null,
              usable.map((a) => ({ address: a.address, family: isIP(a.address) })),
            );
          } else {
            callback(null, first.address, isIP(first.address));
          }
        },
        (err: unknown) => {
          const e: NodeJS.ErrnoException =
            err instanceof Error ? err : new Error(`lookup failed for ${hostname}`);
          callback(e, '');
        },
      );
  };
}

// ---------------------------------------------------------------------------
// Creation/update check
// ---------------------------------------------------------------------------

export type UrlRejection =
  | 'invalid_url'
  | 'https_required'
  | 'userinfo_not_allowed'
  | 'internal_hostname'
  | 'forbidden_address'
  | 'unresolvable';

export type UrlCheck =
  { ok: true; url: URL } | { ok: false; reason: UrlRejection; message: string };

/** Generous for real receivers, small enough to keep rows and logs bounded. */
export const MAX_WEBHOOK_URL_LENGTH = 2048;

const INTERNAL_SUFFIXES = ['localhost', 'local', 'internal', 'home.arpa', 'localdomain'];

function isInternalName(host: string): boolean {
  return INTERNAL_SUFFIXES.some((s) => host === s || host.endsWith(`.${s}`));
}

function reject(reason: UrlRejection, message: string): UrlCheck {
  return { ok: false, reason, message };
}

/**
 * Fast feedback for webhook create/update. Not a substitute for the guarded
 * agent: DNS may answer differently at delivery time.
 */
export async function validateWebhookUrl(
  input: string,
  policy: AddressPolicy,
  resolver: Resolver = systemResolver,
): Promise<UrlCheck> {
  if (input.length > MAX_WEBHOOK_URL_LENGTH) {
    return reject('invalid_url', `url must be at most ${MAX_WEBHOOK_URL_LENGTH} characters`);
  }
  let url: URL;
  try {
    url = new URL(input);
  } catch {
    return reject('invalid_url', 'url is not a valid absolute URL');
  }
  if (url.protocol !== 'https:') return reject('https_required', 'url must use https://');
  if (url.username !== '' || url.password !== '') {
    return reject('userinfo_not_allowed', 'url must not contain a user name or password');
  }

  // url.hostname is WHATWG-normalised: numeric IPv4 spellings are already
  // dotted-quad and IPv6 is bracketed and compressed, so one check covers them.
  const host = url.hostname.toLowerCase();
  if (host.startsWith('[') || isIP(host) !== 0) {
    const ip = host.startsWith('[') ? host.slice(1, -1) : host;
    if (!policy.isAllowed(ip)) {
      return reject(
        'forbidden_address',
        `url host ${ip} is a private or special-purpose address (${forbiddenRange(ip)})`,
      );
    }
    return { ok: true, url };
  }

  const name = host.endsWith('.') ? host.slice(0, -1) : host;
  if (name === '') return reject('invalid_url', 'url has no host');

  let addresses: readonly ResolvedAddress[];
  try {
    addresses = await resolver(name);
  } catch (err) {
    const code = err instanceof Error && 'code' in err ? String(err.code) : 'error';
    return reject('unresolvable', `url host ${name} does not resolve (${code})`);
  }
  if (addresses.length === 0) {
    return reject('unresolvable', `url host ${name} does not resolve`);
  }

  if (isInternalName(name)) {
    // Such names are site-internal by convention; only an operator who has
    // exempted every address they point to can use them.
    if (!addresses.every((a) => policy.isExempt(a.address))) {
      return reject('internal_hostname', `url host ${name} is an internal name`);
    }
    return { ok: true, url };
  }

  for (const a of addresses) {
    if (!policy.isAllowed(a.address)) {
      return reject(
        'forbidden_address',
        `url host ${name} resolves to a private or special-purpose address ` +
          `${a.address} (${forbiddenRange(a.address)})`,
      );
    }
  }
  return { ok: true, url };
}

// ---------------------------------------------------------------------------
// Connect-time guard
// ---------------------------------------------------------------------------

export interface GuardedAgentOptions {
  policy: AddressPolicy;
  /** Extra trusted CA(s) (PEM), added to Node's bundled roots. */
  ca?: string | Buffer | ReadonlyArray<string | Buffer>;
  /** Defaults to getaddrinfo; injectable for tests. */
  resolver?: Resolver;
  /** TCP + TLS connect timeout; undici's default (10 s) when omitted. */
  connectTimeoutMs?: number;
  /** Pool tuning passed through; the connector itself cannot be replaced. */
  agentOptions?: Omit<UndiciAgent.Options, 'connect' | 'factory'>;
}

/**
 * An undici connector that refuses non-HTTPS, refuses literal-IP hosts the
 * policy forbids, resolves names through the guarded lookup, and re-checks the
 * connected peer address before handing the socket to undici.
 */
export function createGuardedConnector(options: GuardedAgentOptions): UndiciConnector.connector {
  const { policy } = options;
  const extra = options.ca === undefined ? [] : ([] as Array<string | Buffer>).concat(options.ca);
  const base = buildConnector({
    lookup: createGuardedLookup(policy, options.resolver),
    // Passing `ca` replaces Node's default trust, so the bundled roots are
    // included explicitly and the operator's CA is only ever added.
    // Built once: passing `ca` per connection made Node rebuild a TLS context from
    // ~145 root certificates for every connection (20-30 ms of CPU each).
    ...(extra.length > 0
      ? { secureContext: createSecureContext({ ca: [...rootCertificates, ...extra] }) }
      : {}),
    ...(options.connectTimeoutMs !== undefined ? { timeout: options.connectTimeoutMs } : {}),
  });

  return (opts, callback) => {
    const host = opts.hostname;
    if (opts.protocol !== 'https:') {
      callback(
        new SsrfError(`webhook delivery refused: ${opts.protocol} is not https:`, host, null),
        null,
      );
      return;
    }
    // undici strips IPv6 brackets before calling the connector.
    if (isIP(host) !== 0 && !policy.isAllowed(host)) {
      callback(refused(host, host, forbiddenRange(host)), null);
      return;
    }
    base(opts, (err, socket) => {
      if (err) {
        callback(err, null);
        return;
      }
      const peer = socket.remoteAddress;
      if (peer === undefined || !policy.isAllowed(peer)) {
        socket.destroy();
        callback(refused(host, peer ?? 'unknown', peer ? forbiddenRange(peer) : 'unknown'), null);
        return;
      }
      callback(null, socket);
    });
  };
}

/**
 * The dispatcher for webhook deliveries: pass it as `dispatcher` to undici's
 * `request`. Never make it the global dispatcher; it is for webhook traffic only.
 */
export function createGuardedAgent(options: GuardedAgentOptions): UndiciAgent {
  return new Agent({ ...options.agentOptions, connect: createGuardedConnector(options) });
}
