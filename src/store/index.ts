export {
  openStore,
  migrationsFolder,
  isUniqueViolation,
  isDatabaseUnavailable,
  type Db,
  type Store,
  type OpenStoreOptions,
} from './db.js';
export * as tables from './schema.js';
