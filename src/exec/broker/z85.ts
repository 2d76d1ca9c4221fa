/**
 * Z85 (ZeroMQ RFC 32): the text form of CURVE keys. A 32-byte key is 40
 * characters. libzmq gives keys in this form; the ZAP handler receives the
 * peer's key as 32 raw bytes and the key proofs need raw bytes, so both
 * directions are needed here.
 */
const ALPHABET =
  '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#';

const DECODE = new Int16Array(128).fill(-1);
for (let i = 0; i < ALPHABET.length; i++) DECODE[ALPHABET.charCodeAt(i)] = i;

export function z85Encode(bytes: Uint8Array): string {
  if (bytes.length % 4 !== 0) throw new Error('z85: length must be a multiple of 4');
  let out = '';
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  for (let i = 0; i < bytes.length; i += 4) {
    let v = view.getUint32(i);
    const chunk: string[] = new Array<string>(5);
    for (let j = 4; j >= 0; j--) {
      chunk[j] = ALPHABET[v % 85]!;
      v = Math.floor(v / 85);
    }
    out += chunk.join('');
  }
  return out;
}

export function z85Decode(text: string): Buffer {
  if (text.length % 5 !== 0) throw new Error('z85: length must be a multiple of 5');
  const out = Buffer.alloc((text.length / 5) * 4);
  for (let i = 0, o = 0; i < text.length; i += 5, o += 4) {
    let v = 0;
    for (let j = 0; j < 5; j++) {
      const code = text.charCodeAt(i + j);
      const d = code < 128 ? DECODE[code]! : -1;
      if (d < 0) throw new Error('z85: invalid character');
      v = v * 85 + d;
    }
    if (v > 0xffffffff) throw new Error('z85: value out of range');
    out.writeUInt32BE(v, o);
  }
  return out;
}

/** A CURVE key in Z85: 40 characters of the alphabet. */
export function isZ85Key(text: unknown): text is string {
  if (typeof text !== 'string' || text.length !== 40) return false;
  try {
    z85Decode(text);
    return true;
  } catch {
    return false;
  }
}
