export {
  openStore,
  migrationsFolder,
  isUniqueViolation,
  isDatabaseUnavailable,
  isUnstorableText,
  sqlState,
  type Db,
  type Store,
  type OpenStoreOptions,
} from './db.js';
export * as tables from './schema.js';
