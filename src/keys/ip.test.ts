import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ipAllowed, unmapIp } from './ip.js';

describe('key IP filters', () => {
  const cases: Array<[string[], string[], string, boolean, string]> = [
    [[], [], '203.0.113.9', true, 'both empty: any address'],
    [['10.0.0.1'], [], '10.0.0.1', true, 'allowlisted address'],
    [['10.0.0.1'], [], '10.0.0.2', false, 'not on the allowlist'],
    [['10.0.0.0/8'], [], '10.255.1.2', true, 'inside an allowed CIDR'],
    [['10.0.0.0/8'], [], '11.0.0.1', false, 'outside the allowed CIDR'],
    [['10.0.0.0/8'], ['10.0.0.5'], '10.0.0.5', false, 'blocklist wins over allowlist'],
    [[], ['192.0.2.0/24'], '192.0.2.77', false, 'blocked CIDR'],
    [[], ['192.0.2.0/24'], '198.51.100.1', true, 'not blocked'],
    [['10.0.0.1'], [], '::ffff:10.0.0.1', true, 'IPv4-mapped IPv6 compares as IPv4'],
    [['::ffff:10.0.0.1'], [], '10.0.0.1', true, 'mapped entry matches plain IPv4'],
    [['::ffff:10.0.0.0/104'], [], '10.9.9.9', true, 'mapped CIDR entry'],
    [[], ['10.0.0.1'], '::ffff:10.0.0.1', false, 'mapped address is blocked as IPv4'],
    [['2001:db8::/32'], [], '2001:db8:1::5', true, 'IPv6 CIDR'],
    [['2001:db8::/32'], [], '2001:db9::1', false, 'outside IPv6 CIDR'],
    [['2001:db8::1'], [], '2001:0db8:0000::1', true, 'IPv6 spelled differently'],
    [[], ['::1'], '::1', false, 'blocked IPv6 loopback'],
    [['10.0.0.1'], [], 'garbage', false, 'unparseable client address with a list'],
    [[], ['::/0'], '203.0.113.9', true, 'blocking every IPv6 client leaves IPv4 ones'],
    [[], ['::/0'], '::ffff:203.0.113.9', true, 'a mapped IPv4 client is IPv4 there too'],
    [[], ['::/0'], '2001:db8::1', false, 'blocking every IPv6 client blocks IPv6 ones'],
    [['::/0'], [], '203.0.113.9', false, 'allowing every IPv6 client admits no IPv4 one'],
    [['::/0'], [], '2001:db8::1', true, 'allowing every IPv6 client admits IPv6 ones'],
    [['0.0.0.0/0'], [], '2001:db8::1', false, 'allowing every IPv4 client admits no IPv6 one'],
    [['::/0', '0.0.0.0/0'], [], '198.51.100.7', true, 'both families allowed'],
  ];
  for (const [allowedIps, blockedIps, addr, expected, what] of cases) {
    it(what, () => {
      assert.equal(ipAllowed({ allowedIps, blockedIps }, addr), expected);
    });
  }
  it('unmaps only IPv4-mapped addresses', () => {
    assert.equal(unmapIp('::ffff:1.2.3.4'), '1.2.3.4');
    assert.equal(unmapIp('::1'), '::1');
  });
});
