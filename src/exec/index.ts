export { ExecService } from './service.js';
export type { ExecSettings } from './context.js';
export { execRoutes } from './routes.js';
export { canonicalJson, canonicalHash } from './canonical.js';
export { validateManifest, checkArguments } from './manifest.js';
export { verifyApprovalRequestedSignature } from './signature.js';
export { DEFAULT_CHAIN, type Stage } from './approvals.js';
export * from './contracts.js';
