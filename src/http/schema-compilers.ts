/**
 * Fastify's schema compilers (Ajv for validation, fast-json-stringify for
 * serialization), loaded only when a route declares a schema.
 *
 * Fastify builds both factories when the instance is created, whatever its
 * routes, and that loads Ajv (about 110 modules) and fast-json-stringify. No
 * Switchyard route has a Fastify schema: request bodies are checked by zod and
 * hand-written validators that produce the spec's error envelope
 * (src/http/validate.ts, src/inference/request.ts). Left to Fastify, the two
 * cost every router 1.1 MiB of V8 heap it never uses (idle router, heap used
 * after two collections; docs/BENCHMARKS.md). Passed as `schemaController`, these
 * builders require the real ones on first use, so a route that does declare a
 * schema later still gets Fastify's own compilers.
 *
 * One difference remains for such a route: Fastify treats these builders as
 * custom, and a custom validator receives a `headers` schema as written instead
 * of with its property names lower-cased. Declare header schemas in lower case.
 */
import { createRequire } from 'node:module';
import type { FastifyServerOptions } from 'fastify';

/** What Fastify calls a compiler factory: (shared schemas, options) → compiler. */
type Factory = (externalSchemas: unknown, options: unknown) => unknown;

// Resolved from Fastify's own location: they are its dependencies, not ours.
const fromFastify = createRequire(createRequire(import.meta.url).resolve('fastify'));

/** A factory that requires Fastify's own one (a module exporting its builder) on first call. */
function lazyFactory(module: string): Factory {
  let real: Factory | null = null;
  return (externalSchemas, options) => {
    real ??= (fromFastify(module) as () => Factory)();
    return real(externalSchemas, options);
  };
}

export const lazySchemaCompilers = {
  compilersFactory: {
    buildValidator: lazyFactory('@fastify/ajv-compiler'),
    buildSerializer: lazyFactory('@fastify/fast-json-stringify-compiler'),
  },
} as unknown as NonNullable<FastifyServerOptions['schemaController']>;
