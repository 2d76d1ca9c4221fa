export * from './format.js';
export * from './scopes.js';
export * from './record.js';
export { KeyRepository, InactiveKeyError, prefixOf, type NewKey } from './repository.js';
export { ipAllowed, unmapIp } from './ip.js';
export { KeyVerifier, type Verification } from './verifier.js';
export { createKeyBody, isIpOrCidr, type CreateKeyBody } from './schemas.js';
