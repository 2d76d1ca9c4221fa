/**
 * How Switchyard opens PGlite, in-process (store/db.ts) or in its thread
 * (pglite-worker.ts): the same options both ways.
 */
import { PGlite, type PGliteOptions } from '@electric-sql/pglite';

/**
 * Bytes that PGlite reads as a Blob (it calls `arrayBuffer()` and looks at `type`).
 * Node 20's `Blob.arrayBuffer()` reads through a stream in 64 KiB pieces and joins
 * them: a data-directory dump of 40 MB took 0.3–0.5 s of CPU to read back on this
 * project's 2-core VM, each time a database was opened from it.
 *
 * `shared`: every read returns the same bytes, for a reader that only copies out of
 * them: PGlite unpacks a data-directory dump with its file system's `writeFile`,
 * which copies (a copy of 40 MB costs about 0.1 s, mostly page faults). Otherwise
 * each read gets its own copy, as from a Blob: the file-system bundle's files are
 * views into the buffer it is handed.
 */
export function bytesAsBlob(bytes: Uint8Array, shared = false): Blob {
  const copy = () => bytes.slice().buffer;
  const whole = bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength;
  const same = shared ? (whole ? bytes.buffer : copy()) : null;
  return { type: '', size: bytes.byteLength, arrayBuffer: async () => same ?? copy() } as Blob;
}

export interface PgliteOpen {
  dataDir: string;
  from?: Uint8Array | undefined;
  sharedBuffers?: string | undefined;
}

export function pgliteOptions(o: PgliteOpen): PGliteOptions {
  return {
    ...(o.dataDir === 'memory://' ? {} : { dataDir: o.dataDir }),
    ...(o.from ? { loadDataDir: bytesAsBlob(o.from, true) } : {}),
    ...(o.sharedBuffers
      ? { startParams: [...PGlite.defaultStartParams, '-c', `shared_buffers=${o.sharedBuffers}`] }
      : {}),
  };
}
