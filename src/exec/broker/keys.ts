/**
 * CURVE keypairs and key-possession proofs.
 *
 * libzmq proves to the broker that a peer holds the secret half of the key it
 * presented, but zeromq.js does not expose which key a received message came
 * from (no message metadata). So an agent also proves its key inside the first
 * message of each session: `key_proof` = HMAC-SHA256 keyed with the X25519
 * shared secret of (agent, broker), over the purpose and the agent's public
 * key. Only the holder of the agent's secret key or of the broker's secret key
 * can compute it; it is only ever sent inside a CURVE session to the broker it
 * is bound to, so it cannot be observed, and it is useless at any other broker.
 * This binds the ZeroMQ routing id of the session to the proven key, so an
 * enrolled agent cannot claim another agent's identity.
 *
 * CURVE keys are X25519 keys (libsodium crypto_box), so Node's crypto computes
 * the same shared secret libzmq would.
 */
import {
  createHmac,
  createPrivateKey,
  createPublicKey,
  diffieHellman,
  timingSafeEqual,
  type KeyObject,
} from 'node:crypto';
import {
  chmodSync,
  closeSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { dirname } from 'node:path';
import { curveKeyPair } from 'zeromq';
import { isZ85Key, z85Decode, z85Encode } from './z85.js';

export interface CurveKeyPair {
  /** Z85, 40 characters. */
  publicKey: string;
  /** Z85, 40 characters. Never logged. */
  secretKey: string;
}

export type ProofPurpose = 'enroll' | 'hello';

// PKCS#8 prefix of a raw X25519 private key (RFC 8410).
const X25519_PKCS8_PREFIX = Buffer.from('302e020100300506032b656e04220420', 'hex');

function privateKeyObject(secretZ85: string): KeyObject {
  return createPrivateKey({
    key: Buffer.concat([X25519_PKCS8_PREFIX, z85Decode(secretZ85)]),
    format: 'der',
    type: 'pkcs8',
  });
}

function publicKeyObject(publicZ85: string): KeyObject {
  return createPublicKey({
    key: { kty: 'OKP', crv: 'X25519', x: z85Decode(publicZ85).toString('base64url') },
    format: 'jwk',
  });
}

export function generateKeyPair(): CurveKeyPair {
  const { publicKey, secretKey } = curveKeyPair();
  return { publicKey, secretKey };
}

/** The public half of a CURVE secret key (Z85 in, Z85 out). */
export function publicKeyFromSecret(secretZ85: string): string {
  const jwk = createPublicKey(privateKeyObject(secretZ85)).export({ format: 'jwk' });
  return z85Encode(Buffer.from(jwk.x!, 'base64url'));
}

/**
 * The proof that the holder of `ownSecret` is (or talks to) `peerPublic` about
 * the agent key `agentPublic`. The agent calls it with its secret and the
 * broker's public key; the broker with its secret and the agent's public key.
 */
export function keyProof(
  ownSecret: string,
  peerPublic: string,
  purpose: ProofPurpose,
  agentPublic: string,
): string {
  const shared = diffieHellman({
    privateKey: privateKeyObject(ownSecret),
    publicKey: publicKeyObject(peerPublic),
  });
  return createHmac('sha256', shared)
    .update(`switchyard-exec/1\n${purpose}\n${agentPublic}`)
    .digest('base64url');
}

export function verifyKeyProof(
  brokerSecret: string,
  agentPublic: string,
  purpose: ProofPurpose,
  proof: string,
): boolean {
  if (!isZ85Key(agentPublic)) return false;
  let expected: Buffer;
  try {
    expected = Buffer.from(keyProof(brokerSecret, agentPublic, purpose, agentPublic));
  } catch {
    // Not a point X25519 accepts: no one can hold its secret.
    return false;
  }
  const given = Buffer.from(proof);
  return given.length === expected.length && timingSafeEqual(given, expected);
}

/** Validates a keypair read from a file or the environment. */
export function checkKeyPair(pair: { publicKey?: unknown; secretKey?: unknown }): CurveKeyPair {
  if (!isZ85Key(pair.secretKey)) throw new Error('CURVE secret key must be 40 Z85 characters');
  const publicKey = publicKeyFromSecret(pair.secretKey);
  if (pair.publicKey !== undefined && pair.publicKey !== publicKey) {
    throw new Error('CURVE public key does not match the secret key');
  }
  return { publicKey, secretKey: pair.secretKey };
}

/**
 * Writes a JSON file only the owner can read, in place of any earlier one at once:
 * the bytes go to a temporary file beside it (mode 0600), flushed to disk, then
 * renamed over it, so a crash mid-write (an agent's re-enrollment, say) leaves the
 * old keypair or the new one, never an empty or half-written file.
 */
export function writePrivateJson(path: string, value: unknown): void {
  const text = JSON.stringify(value, null, 2) + '\n';
  mkdirSync(dirname(path), { recursive: true });
  const tmp = `${path}.${process.pid}.tmp`;
  try {
    const fd = openSync(tmp, 'w', 0o600);
    try {
      writeFileSync(fd, text);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    chmodSync(tmp, 0o600);
    renameSync(tmp, path);
  } catch (err) {
    rmSync(tmp, { force: true });
    throw err;
  }
}

/**
 * The broker's keypair: from `secretKey` (SWITCHYARD_EXEC_SECRET_KEY) when
 * given, else from the key file, created on first start (mode 0600). Every
 * router instance of a deployment must share it (agents pin the public key).
 */
export function loadBrokerKeyPair(file: string, secretKey?: string): CurveKeyPair {
  if (secretKey) return checkKeyPair({ secretKey });
  let raw: string | undefined;
  try {
    raw = readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  if (raw !== undefined) {
    const parsed = JSON.parse(raw) as { public_key?: unknown; secret_key?: unknown };
    return checkKeyPair({ publicKey: parsed.public_key, secretKey: parsed.secret_key });
  }
  const pair = generateKeyPair();
  mkdirSync(dirname(file), { recursive: true });
  try {
    // `wx`: two instances starting on one data directory must not overwrite each other.
    writeFileSync(
      file,
      JSON.stringify({ public_key: pair.publicKey, secret_key: pair.secretKey }, null, 2) + '\n',
      { mode: 0o600, flag: 'wx' },
    );
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return loadBrokerKeyPair(file);
    throw err;
  }
  return pair;
}
