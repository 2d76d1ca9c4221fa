import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseServiceTier, parseSloHeaders, parseSloValue } from './slo.js';

describe('SLO headers', () => {
  const valid: Array<[string, number]> = [
    ['250', 250],
    ['12.5', 12.5],
    [' 40 ', 40],
    ['.5', 0.5],
    ['1e3', 1000],
    ['7.', 7],
  ];
  for (const [raw, want] of valid) {
    it(`accepts ${JSON.stringify(raw)}`, () => assert.equal(parseSloValue(raw), want));
  }
  const invalid = [
    '',
    ' ',
    '0',
    '0.0',
    '-5',
    '+5',
    'abc',
    '250ms',
    '0x10',
    'Infinity',
    'NaN',
    '1e999',
    '1,2',
    '5, 6',
    '1e',
    '.',
  ];
  for (const raw of invalid) {
    it(`ignores ${JSON.stringify(raw)}`, () => assert.equal(parseSloValue(raw), undefined));
  }
  it('ignores a repeated header, takes a single-element list', () => {
    assert.equal(parseSloValue(['100', '200']), undefined);
    assert.equal(parseSloValue(['100']), 100);
    assert.equal(parseSloValue(undefined), undefined);
  });
  it('reads both headers by their lower-case names; invalid ones are left out, never an error', () => {
    assert.deepEqual(parseSloHeaders({ 'x-slo-ttft-ms': '300', 'x-slo-tpot-ms': '25' }), {
      ttftMs: 300,
      tpotMs: 25,
    });
    assert.deepEqual(parseSloHeaders({ 'x-slo-ttft-ms': '-1', 'x-slo-tpot-ms': 'fast' }), {});
    assert.deepEqual(parseSloHeaders({ 'x-slo-tpot-ms': '25' }), { tpotMs: 25 });
  });
});

describe('service_tier hint', () => {
  it('keeps flex, priority and auto; anything else is default', () => {
    assert.equal(parseServiceTier('flex'), 'flex');
    assert.equal(parseServiceTier('priority'), 'priority');
    assert.equal(parseServiceTier('auto'), 'auto');
    assert.equal(parseServiceTier('default'), 'default');
    assert.equal(parseServiceTier(undefined), 'default');
    assert.equal(parseServiceTier('scale'), 'default');
  });
});
