/**
 * Encryption at rest for the small secrets the dashboard keeps in the database
 * (TOTP seeds): the spec requires them encrypted, so a copy of the database
 * alone (a backup, a replica, a leaked dump) gives no second factor.
 *
 * Algorithm: AES-256-GCM with a fresh random 12-byte nonce per `seal`, and the
 * caller's `context` (the owning user's id) as additional authenticated data.
 * GCM authenticates as well as encrypts, so a changed byte anywhere, the wrong
 * key, or a sealed value copied into another user's row (a different context)
 * all fail `open` with a `SealedValueError` instead of yielding another secret.
 * Random 96-bit nonces are safe for far more seals than a dashboard makes with
 * one key (NIST's bound is 2^32).
 *
 * Format: `v1.<base64url nonce>.<base64url ciphertext‖tag>`, printable so it
 * fits a text column and a log line (never logged, but safe to). The version
 * prefix is also part of the authenticated data, and leaves room for a later
 * key id or algorithm without guessing at old rows.
 *
 * The key: SWITCHYARD_SECRET_KEY (32 bytes as base64, base64url or hex) when
 * set, which every instance sharing one database must then be given; else
 * `<data dir>/secret-key`, created on first start with mode 0600 like the
 * operator token file (its content is itself a valid SWITCHYARD_SECRET_KEY, to
 * copy to other instances); else, without a data directory, a random key in
 * memory, which suits only an in-memory database that dies with it.
 */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { linkSync, mkdirSync, readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const VERSION = 'v1';
const ALGORITHM = 'aes-256-gcm';
export const SECRET_KEY_BYTES = 32;
const NONCE_BYTES = 12;
const TAG_BYTES = 16;
export const SECRET_KEY_FILE = 'secret-key';

/** Why a sealed value did not open: unreadable, or readable but not authentic. */
export type SealedValueProblem = 'format' | 'authentication';

export class SealedValueError extends Error {
  override readonly name = 'SealedValueError';
  constructor(
    readonly problem: SealedValueProblem,
    options?: { cause: unknown },
  ) {
    // One message for tampering, wrong key and wrong context: GCM cannot tell
    // them apart, and neither should a caller.
    super(
      problem === 'format'
        ? 'sealed value is not in the v1 format'
        : 'sealed value does not open (tampered, wrong context or wrong key)',
      options,
    );
  }
}

/**
 * Strict base64url: Node's decoder skips characters it does not know and
 * ignores the unused low bits of the last one, so two different strings could
 * decode to the same bytes. Only the canonical spelling is accepted, so every
 * change to the stored text is a change the cipher sees.
 */
function decodeBase64url(s: string): Buffer | null {
  if (!/^[A-Za-z0-9_-]+$/.test(s)) return null;
  const bytes = Buffer.from(s, 'base64url');
  return bytes.toString('base64url') === s ? bytes : null;
}

function aad(context: string): Buffer {
  // The version prefix has a fixed length, so prefix and context cannot be
  // split two ways.
  return Buffer.from(`${VERSION}.${context}`, 'utf8');
}

export class SecretBox {
  private readonly key: Buffer;

  constructor(key: Buffer) {
    if (key.length !== SECRET_KEY_BYTES) {
      throw new Error(`secret key must be ${SECRET_KEY_BYTES} bytes, got ${key.length}`);
    }
    // A copy, so a caller zeroing or reusing its buffer does not change ours.
    this.key = Buffer.from(key);
  }

  seal(plaintext: string, context: string): string {
    const nonce = randomBytes(NONCE_BYTES);
    const cipher = createCipheriv(ALGORITHM, this.key, nonce, { authTagLength: TAG_BYTES });
    cipher.setAAD(aad(context));
    const body = Buffer.concat([
      cipher.update(plaintext, 'utf8'),
      cipher.final(),
      cipher.getAuthTag(),
    ]);
    return `${VERSION}.${nonce.toString('base64url')}.${body.toString('base64url')}`;
  }

  /** Throws `SealedValueError` unless `sealed` was made by `seal` with this key and context. */
  open(sealed: string, context: string): string {
    const parts = sealed.split('.');
    if (parts.length !== 3 || parts[0] !== VERSION) throw new SealedValueError('format');
    const nonce = decodeBase64url(parts[1]!);
    const body = decodeBase64url(parts[2]!);
    if (!nonce || nonce.length !== NONCE_BYTES || !body || body.length < TAG_BYTES) {
      throw new SealedValueError('format');
    }
    const decipher = createDecipheriv(ALGORITHM, this.key, nonce, { authTagLength: TAG_BYTES });
    decipher.setAAD(aad(context));
    decipher.setAuthTag(body.subarray(body.length - TAG_BYTES));
    const ciphertext = body.subarray(0, body.length - TAG_BYTES);
    let plaintext: Buffer;
    try {
      plaintext = Buffer.concat([decipher.update(ciphertext), decipher.final()]);
    } catch (err) {
      throw new SealedValueError('authentication', { cause: err });
    }
    return plaintext.toString('utf8');
  }
}

const KEY_FORMATS = '32 bytes as base64, base64url or 64 hex characters';

/**
 * Parses a key written as 64 hex characters or as base64/base64url (padded or
 * not). Returns null for anything else, so the caller names where it came from;
 * the value itself never goes into an error message.
 */
export function parseSecretKey(text: string): Buffer | null {
  const s = text.trim();
  if (/^[0-9a-fA-F]{64}$/.test(s)) return Buffer.from(s, 'hex');
  // 32 bytes are 43 base64 characters and one `=` of padding.
  const unpadded = s.endsWith('=') ? s.slice(0, -1) : s;
  if (!/^[A-Za-z0-9+/_-]{43}$/.test(unpadded)) return null;
  const urlForm = unpadded.replace(/\+/g, '-').replace(/\//g, '_');
  return decodeBase64url(urlForm);
}

/**
 * Reads the key file, or creates it. The new key is written to a private
 * temporary file and then hard-linked into place: `link` fails when the name
 * exists, so two instances starting together on one data directory agree on a
 * single key, and neither ever reads a half-written file.
 */
function keyFromFile(dataDir: string): Buffer {
  const path = join(dataDir, SECRET_KEY_FILE);
  for (;;) {
    let text: string | undefined;
    try {
      text = readFileSync(path, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    if (text !== undefined) {
      const key = parseSecretKey(text);
      if (!key) throw new Error(`${path} must hold a secret key: ${KEY_FORMATS}`);
      return key;
    }
    mkdirSync(dataDir, { recursive: true });
    const key = randomBytes(SECRET_KEY_BYTES);
    const tmp = `${path}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
    writeFileSync(tmp, key.toString('base64url') + '\n', { mode: 0o600, flag: 'wx' });
    try {
      linkSync(tmp, path);
      return key;
    } catch (err) {
      // Another instance created it first: loop and read theirs.
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    } finally {
      unlinkSync(tmp);
    }
  }
}

export function loadSecretKey(opts: { fromEnv: string | undefined; dataDir: string | null }): {
  key: Buffer;
  source: 'env' | 'file' | 'memory';
} {
  // An empty variable counts as unset, as for the other SWITCHYARD_* secrets.
  if (opts.fromEnv !== undefined && opts.fromEnv.trim() !== '') {
    const key = parseSecretKey(opts.fromEnv);
    if (!key) throw new Error(`SWITCHYARD_SECRET_KEY must be ${KEY_FORMATS}`);
    return { key, source: 'env' };
  }
  if (opts.dataDir === null || opts.dataDir === 'memory://') {
    return { key: randomBytes(SECRET_KEY_BYTES), source: 'memory' };
  }
  return { key: keyFromFile(opts.dataDir), source: 'file' };
}
