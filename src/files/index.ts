/** The files domain's entry module (files, uploads, batch input format, stored bytes). */
export { CHUNK_BYTES, readChunks, deleteChunks, type Tx } from './blobs.js';
export {
  BATCH_URLS,
  BatchLineChecker,
  LineSplitter,
  MAX_BATCH_REQUESTS,
  type BatchLine,
  type BatchUrl,
} from './jsonl.js';
export {
  FileService,
  newFileId,
  publicFile,
  PURPOSES,
  type FileObject,
  type Purpose,
} from './service.js';
export { UploadService } from './uploads.js';
export { surfaceAccess, projectOf } from './access.js';
