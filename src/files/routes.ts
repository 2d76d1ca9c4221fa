/**
 * Files and uploads (scope `inference`, the shared management limit; access.ts),
 * under `/<project_id>/<endpoint_slug>/v1` (the base URL an OpenAI SDK client
 * uses for chat) and the project-level alias `/<project_id>/v1`. Files belong to
 * the project, whichever endpoint path they were uploaded through.
 *
 * - `POST /files` (multipart: `file`, `purpose`) → File; `GET /files` (`purpose`,
 *   `limit`, `after`, `order`) → list; `GET /files/{id}` → File; `DELETE /files/{id}`
 *   → `{id, object: "file", deleted: true}`; `GET /files/{id}/content` → the bytes.
 * - `POST /uploads` → Upload; `POST /uploads/{id}/parts` (multipart: `data`) → Part;
 *   `POST /uploads/{id}/complete` (`part_ids`, `md5?`) → Upload with its File;
 *   `POST /uploads/{id}/cancel` → Upload.
 *
 * Sizes: a file at most SWITCHYARD_MAX_FILE_BYTES (413 `payload_too_large`, `param`
 * `file`), a part at most SWITCHYARD_MAX_UPLOAD_PART_BYTES (`param` `data`); bytes are
 * streamed to the database as they arrive. A `batch` file must be valid batch input
 * (jsonl.ts), else 400 `invalid_value` with `param` `file`.
 */
import { Readable } from 'node:stream';
import multipart, { type Multipart } from '@fastify/multipart';
import type { FastifyInstance, FastifyPluginAsync, FastifyRequest } from 'fastify';
import { ServiceError } from '../errors/index.js';
import type { Services } from '../runtime/services.js';
import { projectOf, surfaceAccess } from './access.js';
import { ChunkWriter } from './blobs.js';
import { BatchLineChecker, LineSplitter } from './jsonl.js';
import { checkPurpose, FileService, type FileObject } from './service.js';
import { partTooLarge, UploadService } from './uploads.js';

interface P {
  projectId: string;
  endpointSlug?: string;
  fileId: string;
  uploadId: string;
}

function fileTooLarge(max: number): ServiceError {
  return new ServiceError('payload_too_large', {
    message: `A file holds at most ${max} bytes.`,
    param: 'file',
  });
}

/**
 * `attachment` with the file's name (RFC 6266): `filename*` in RFC 8187's UTF-8
 * percent-encoding, and a plain ASCII `filename` for clients that read only that
 * (taken as written, so it is not percent-encoded; other characters become `_`).
 */
function contentDisposition(filename: string): string {
  const ascii = filename.replace(/[^\x20-\x7e]|["\\]/g, '_');
  const encoded = encodeURIComponent(filename).replace(
    /['()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );
  return `attachment; filename="${ascii}"; filename*=UTF-8''${encoded}`;
}

function requireMultipart(request: FastifyRequest, field: string): void {
  if (!request.isMultipart()) {
    throw new ServiceError('unsupported_media_type', {
      message: `This route takes multipart/form-data with a '${field}' part.`,
    });
  }
}

/** busboy's own limit error (the stream is cut at the limit) as ours. */
function isTooLarge(err: unknown): boolean {
  return (err as { code?: string }).code === 'FST_REQ_FILE_TOO_LARGE';
}

/**
 * An error of the multipart stream itself as the client's: busboy's limits, and its
 * parser's refusals ("Boundary not found", "Unexpected end of form", …) as 400
 * `invalid_body`. Only errors raised while reading the request reach this, never
 * the database's.
 */
function multipartError(err: unknown): unknown {
  if (err instanceof ServiceError || isTooLarge(err)) return err;
  const code = (err as { code?: string }).code;
  if (code === 'FST_FILES_LIMIT' || code === 'FST_FIELDS_LIMIT' || code === 'FST_PARTS_LIMIT') {
    return new ServiceError('invalid_body', { message: 'The multipart body has too many parts.' });
  }
  const what = err instanceof Error ? err.message.replace(/^Multipart: /, '') : String(err);
  return new ServiceError('invalid_body', {
    message: `The multipart body is malformed: ${what.slice(0, 200)}.`,
    cause: err,
  });
}

/** A multipart body's parts, with busboy's errors as ours. */
async function* parts(request: FastifyRequest, fileSize: number): AsyncGenerator<Multipart> {
  try {
    yield* request.parts({ limits: { fileSize, files: 1, fields: 16 } });
  } catch (err) {
    throw multipartError(err);
  }
}

/** A file part's bytes, with busboy's errors (a body cut short, say) as ours. */
async function* bytesOf(file: AsyncIterable<unknown>): AsyncGenerator<Buffer> {
  try {
    for await (const buf of file) yield buf as Buffer;
  } catch (err) {
    throw multipartError(err);
  }
}

export function fileRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    const poke = () => s.dispatcher.poke();
    const files = new FileService(s.store.db, s.clock, poke);
    const uploads = new UploadService(
      s.store.db,
      s.clock,
      {
        maxFileBytes: s.config.maxFileBytes,
        maxPartBytes: s.config.maxUploadPartBytes,
        maxBodyBytes: s.config.maxBodyBytes,
      },
      poke,
    );
    const maxFile = s.config.maxFileBytes;
    const maxPart = s.config.maxUploadPartBytes;
    await app.register(multipart, { limits: { fileSize: Math.max(maxFile, maxPart) } });
    for (const hook of surfaceAccess(s)) app.addHook('preParsing', hook);

    /** POST /files: the `file` part is streamed to the database; `purpose` may come before or after it. */
    const createFile = async (request: FastifyRequest): Promise<FileObject> => {
      requireMultipart(request, 'file');
      const projectId = projectOf(request);
      let purpose: unknown;
      let upload: {
        id: string;
        bytes: number;
        batchError: unknown;
        checker: BatchLineChecker;
      } | null = null;
      let finished = false;
      try {
        for await (const part of parts(request, maxFile)) {
          if (part.type === 'field') {
            if (part.fieldname === 'purpose') purpose = part.value;
            continue;
          }
          if (part.fieldname !== 'file' || upload) {
            part.file.resume();
            continue;
          }
          // Refused before any byte is stored when the purpose came first.
          if (purpose !== undefined) checkPurpose(purpose);
          const id = await files.start(projectId, part.filename);
          const u = {
            id,
            bytes: 0,
            batchError: null as unknown,
            checker: new BatchLineChecker('file', s.config.maxBodyBytes),
          };
          upload = u;
          const writer = new ChunkWriter(s.store.db, id);
          // Checked as batch input while it streams, in case the purpose is (or turns out) `batch`.
          const splitter = new LineSplitter((line, n) => {
            if (u.batchError !== null) return;
            try {
              u.checker.check(line, n);
            } catch (err) {
              u.batchError = err;
            }
          }, u.checker.maxLineBytes);
          for await (const buf of bytesOf(part.file)) {
            await writer.write(buf);
            if (u.batchError === null) splitter.push(buf);
          }
          if (part.file.truncated) throw fileTooLarge(maxFile);
          await writer.end();
          if (u.batchError === null) splitter.end();
          u.bytes = writer.bytes;
        }
        if (!upload) {
          throw new ServiceError('missing_required_parameter', {
            message: "Missing required parameter: 'file'.",
            param: 'file',
          });
        }
        const p = checkPurpose(purpose);
        if (p === 'batch') {
          if (upload.batchError !== null) throw upload.batchError;
          upload.checker.finish();
        }
        const file = await files.finish(upload.id, p, upload.bytes);
        finished = true;
        return file;
      } catch (err) {
        if (isTooLarge(err)) throw fileTooLarge(maxFile);
        throw err;
      } finally {
        if (upload && !finished) await files.discard(upload.id);
      }
    };

    const addPart = async (request: FastifyRequest<{ Params: P }>) => {
      requireMultipart(request, 'data');
      let result: Awaited<ReturnType<UploadService['addPart']>> | null = null;
      try {
        for await (const part of parts(request, maxPart)) {
          if (part.type === 'field') continue;
          if (part.fieldname !== 'data' || result) {
            part.file.resume();
            continue;
          }
          const file = part.file;
          result = await uploads.addPart(
            projectOf(request),
            request.params.uploadId,
            (async function* () {
              yield* bytesOf(file);
              if (file.truncated) throw partTooLarge(maxPart);
            })(),
          );
        }
      } catch (err) {
        if (isTooLarge(err)) throw partTooLarge(maxPart);
        throw err;
      }
      if (!result) {
        throw new ServiceError('missing_required_parameter', {
          message: "Missing required parameter: 'data'.",
          param: 'data',
        });
      }
      return result;
    };

    /** The endpoint the caller's key is bound to (null: not bound): scopes batch results. */
    const boundTo = (r: FastifyRequest) => r.apiKey!.endpointId;
    for (const base of ['/:projectId/:endpointSlug/v1', '/:projectId/v1']) {
      app.post(`${base}/files`, createFile);
      app.get(`${base}/files`, async (r) => files.list(projectOf(r), r.query, boundTo(r)));
      app.get<{ Params: P }>(`${base}/files/:fileId`, async (r) =>
        files.retrieve(projectOf(r), r.params.fileId, boundTo(r)),
      );
      app.delete<{ Params: P }>(`${base}/files/:fileId`, async (r) =>
        files.remove(projectOf(r), r.params.fileId, boundTo(r)),
      );
      app.get<{ Params: P }>(`${base}/files/:fileId/content`, async (r, reply) => {
        const file = await files.get(projectOf(r), r.params.fileId, null, boundTo(r));
        reply.header('content-length', String(file.bytes));
        reply.header('content-disposition', contentDisposition(file.filename));
        return reply.type('application/octet-stream').send(Readable.from(files.content(file.id)));
      });

      app.post(`${base}/uploads`, async (r) => uploads.create(projectOf(r), r.body));
      app.post<{ Params: P }>(`${base}/uploads/:uploadId/parts`, addPart);
      app.post<{ Params: P }>(`${base}/uploads/:uploadId/complete`, async (r) =>
        uploads.complete(projectOf(r), r.params.uploadId, r.body),
      );
      app.post<{ Params: P }>(`${base}/uploads/:uploadId/cancel`, async (r) =>
        uploads.cancel(projectOf(r), r.params.uploadId),
      );
    }
  };
}
