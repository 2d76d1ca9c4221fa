/**
 * CURVE key handling: Z85 against libzmq's own keys, the public key derived
 * from a secret, the broker key file (created once with mode 0600, reused,
 * overridden by the setting), key proofs, and message decoding.
 */
import assert from 'node:assert/strict';
import { chmodSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { curveKeyPair } from 'zeromq';
import { loadBrokerKeyPair } from '../../src/exec/broker/index.js';
import {
  checkKeyPair,
  keyProof,
  publicKeyFromSecret,
  verifyKeyProof,
  writePrivateJson,
} from '../../src/exec/broker/keys.js';
import { agentInbound, decode } from '../../src/exec/broker/protocol.js';
import { isZ85Key, z85Decode, z85Encode } from '../../src/exec/broker/z85.js';
import { tempDir } from './support.js';

describe('CURVE keys', () => {
  const tmp = tempDir('swy-keys-');
  after(() => tmp.cleanup());

  it('Z85 round-trips libzmq keys; the public key follows from the secret', () => {
    for (let i = 0; i < 20; i++) {
      const { publicKey, secretKey } = curveKeyPair();
      assert.equal(z85Decode(publicKey).length, 32);
      assert.equal(z85Encode(z85Decode(publicKey)), publicKey);
      assert.equal(publicKeyFromSecret(secretKey), publicKey);
    }
    // RFC 32's test vector.
    const bytes = Buffer.from([0x86, 0x4f, 0xd2, 0x6f, 0xb5, 0x59, 0xf7, 0x5b]);
    assert.equal(z85Encode(bytes), 'HelloWorld');
    assert.ok(z85Decode('HelloWorld').equals(bytes));
    assert.equal(isZ85Key('x'.repeat(39)), false);
    assert.equal(isZ85Key('"'.repeat(40)), false);
  });

  it('the broker key file is created once with mode 0600 and reused', () => {
    const file = join(tmp.dir, 'data', 'exec-broker.key');
    const first = loadBrokerKeyPair(file);
    assert.equal(statSync(file).mode & 0o777, 0o600);
    assert.deepEqual(loadBrokerKeyPair(file), first);
    const saved = JSON.parse(readFileSync(file, 'utf8')) as Record<string, string>;
    assert.equal(saved.public_key, first.publicKey);
    // The setting wins over the file.
    const other = curveKeyPair();
    assert.deepEqual(loadBrokerKeyPair(file, other.secretKey), other);
  });

  it('a private file is replaced whole (a new file renamed over it), never rewritten in place', () => {
    const dir = join(tmp.dir, 'replace');
    const file = join(dir, 'identity.json');
    writePrivateJson(file, { n: 1 });
    const before = statSync(file);
    chmodSync(file, 0o644); // restored from a backup, say
    writePrivateJson(file, { n: 2, pad: 'x'.repeat(10_000) });
    const now = statSync(file);
    // Rewritten in place (truncate, then write), a crash between the two left an
    // empty file, and the agent's keypair with it.
    assert.notEqual(now.ino, before.ino, 'the old file was truncated and rewritten');
    assert.equal(now.mode & 0o777, 0o600);
    assert.deepEqual(JSON.parse(readFileSync(file, 'utf8')), { n: 2, pad: 'x'.repeat(10_000) });
    assert.deepEqual(readdirSync(dir), ['identity.json'], 'no temporary file left');
  });

  it('a key file whose halves do not match is refused', () => {
    const file = join(tmp.dir, 'bad.key');
    writeFileSync(
      file,
      JSON.stringify({
        public_key: curveKeyPair().publicKey,
        secret_key: curveKeyPair().secretKey,
      }),
    );
    assert.throws(() => loadBrokerKeyPair(file), /does not match/);
    assert.throws(() => checkKeyPair({ secretKey: 'short' }), /40 Z85/);
  });

  it('key proofs: the broker verifies what only the key holder could compute', () => {
    const broker = curveKeyPair();
    const agent = curveKeyPair();
    const other = curveKeyPair();
    const proof = keyProof(agent.secretKey, broker.publicKey, 'hello', agent.publicKey);
    assert.ok(verifyKeyProof(broker.secretKey, agent.publicKey, 'hello', proof));
    assert.equal(verifyKeyProof(broker.secretKey, agent.publicKey, 'enroll', proof), false);
    assert.equal(verifyKeyProof(broker.secretKey, other.publicKey, 'hello', proof), false);
    const forged = keyProof(other.secretKey, broker.publicKey, 'hello', agent.publicKey);
    assert.equal(verifyKeyProof(broker.secretKey, agent.publicKey, 'hello', forged), false);
    // Bound to the broker: useless at another one.
    const elsewhere = curveKeyPair();
    assert.equal(verifyKeyProof(elsewhere.secretKey, agent.publicKey, 'hello', proof), false);
  });

  it('decoding: version, JSON and schema faults are told apart', () => {
    const ok = decode(Buffer.from('{"v":1,"type":"RENEW"}'), agentInbound);
    assert.deepEqual(ok, { ok: true, msg: { v: 1, type: 'RENEW' } });
    const v2 = decode(Buffer.from('{"v":2,"type":"RENEW"}'), agentInbound);
    assert.equal(v2.ok ? '' : v2.code, 'unsupported_version');
    const junk = decode(Buffer.from('nope'), agentInbound);
    assert.equal(junk.ok ? '' : junk.code, 'protocol_error');
    const bad = decode(
      Buffer.from('{"v":1,"type":"RESULT","invocation_id":"inv_1","outcome":{"kind":"exited"}}'),
      agentInbound,
    );
    assert.ok(!bad.ok && bad.code === 'protocol_error' && /outcome/.test(bad.message));
  });
});
