/**
 * Capability manifest validation (the `exec_manifest_invalid` protocol code).
 *
 * Accepted form (docs/EXEC.md): `{version: 1, tools: [ToolSpec, …]}` with
 * 1..256 tools; unknown keys refused; per tool a `name` matching
 * `^[a-zA-Z0-9_.-]{1,64}$` and unique in the manifest, a `description` (at most
 * 1,024 characters), an `input_schema` that is a valid JSON Schema (draft
 * 2020-12, compiled by Ajv) whose root has `type: "object"` (tool arguments are
 * JSON objects, as in chat-completions tool calls), a `risk` from RISKS,
 * `mcp_visible` (default false) and `default_timeout_ms` 1..3,600,000
 * (default 60,000). The first failure is reported with its field path in
 * `param` (`tools[1].input_schema`).
 *
 * The *accepted manifest* is the normalised object (defaults filled in), and
 * `manifest_hash` is the SHA-256 of its canonical JSON (see canonical.ts), so
 * an agent can compute the same hash from its own manifest file.
 */
import type { Ajv2020 as Ajv2020Type, ValidateFunction } from 'ajv/dist/2020.js';
import { createRequire } from 'node:module';
import { LRUCache } from 'lru-cache';
import { z } from 'zod';
import { formatPath } from '../http/validate.js';
import { storableJson } from '../store/storable.js';
import { RISKS, type Manifest, type ToolSpec } from './contracts.js';
import { canonicalHash } from './canonical.js';

export const TOOL_NAME = /^[a-zA-Z0-9_.-]{1,64}$/;
export const MAX_TOOLS = 256;
export const MAX_TIMEOUT_MS = 3_600_000;
export const DEFAULT_TOOL_TIMEOUT_MS = 60_000;

const toolSchema = z
  .object({
    name: z.string().regex(TOOL_NAME, 'must match ^[a-zA-Z0-9_.-]{1,64}$'),
    description: z.string().max(1024),
    input_schema: z.record(z.string(), z.unknown()),
    risk: z.enum(RISKS),
    mcp_visible: z.boolean().default(false),
    default_timeout_ms: z
      .number()
      .int()
      .min(1)
      .max(MAX_TIMEOUT_MS)
      .default(DEFAULT_TOOL_TIMEOUT_MS),
  })
  .strict();

const manifestSchema = z
  .object({
    version: z.literal(1),
    tools: z.array(toolSchema).min(1).max(MAX_TOOLS),
  })
  .strict();

export type ManifestCheck =
  { ok: true; manifest: Manifest; hash: string } | { ok: false; message: string; param: string };

/** One Ajv instance: schemas are compiled, never evaluated as code from agents' strings. */
/**
 * Ajv, created on first use through a synchronous require: a router that never
 * sees an agent manifest or a tool invocation does not keep it in memory.
 */
let ajvInstance: Ajv2020Type | null = null;
function ajvLib(): Ajv2020Type {
  if (!ajvInstance) {
    const { Ajv2020 } = createRequire(import.meta.url)('ajv/dist/2020.js') as {
      Ajv2020: typeof Ajv2020Type;
    };
    ajvInstance = new Ajv2020({
      allErrors: false,
      strict: false,
      validateFormats: false,
      code: { regExp: linearRegExp },
    });
  }
  return ajvInstance;
}

/**
 * `pattern` and `patternProperties` run on RE2's linear-time engine (re2js, pure
 * JavaScript), not V8's backtracking RegExp: an agent's schema pattern such as
 * `^(a+)+$` and a client's argument of 30 `a`s and a `!` would otherwise hold the
 * router's event loop for seconds, for every tenant (and twice as long per extra
 * character). A pattern RE2 cannot run (backreferences, lookaround) fails to
 * compile, so its manifest is refused at enrollment (`exec_manifest_invalid`).
 */
const linearRegExp = Object.assign(
  (pattern: string) => {
    const { RE2JS } = createRequire(import.meta.url)('re2js') as typeof import('re2js');
    const re = RE2JS.compile(pattern);
    // Ajv keeps compiled patterns by their string form: it must be the pattern (as
    // RegExp's and the re2 package's are), or every pattern would share the first.
    return { test: (s: string) => re.matcher(s).find(), toString: () => pattern };
  },
  { code: 'RE2JS' },
);

export function validateManifest(raw: unknown): ManifestCheck {
  const r = manifestSchema.safeParse(raw);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    const path = [...issue.path];
    if (issue.code === 'unrecognized_keys' && issue.keys[0]) path.push(issue.keys[0]);
    const param = formatPath(path) ?? 'manifest';
    return { ok: false, message: `Invalid '${param}': ${issue.message}`, param };
  }
  const seen = new Set<string>();
  for (const [i, tool] of r.data.tools.entries()) {
    if (seen.has(tool.name)) {
      const param = `tools[${i}].name`;
      return { ok: false, message: `Duplicate tool name '${tool.name}'.`, param };
    }
    seen.add(tool.name);
    // The accepted manifest is stored as jsonb, which holds no U+0000 and no lone
    // surrogate (JSON.stringify writes both as escapes, which storableJson repairs).
    for (const field of ['description', 'input_schema'] as const) {
      const json = JSON.stringify(tool[field]);
      if (storableJson(json) !== json) {
        const param = `tools[${i}].${field}`;
        return {
          ok: false,
          message: `Invalid '${param}': a NUL character (U+0000) or a lone UTF-16 surrogate is not accepted.`,
          param,
        };
      }
    }
    const param = `tools[${i}].input_schema`;
    if (tool.input_schema.type !== 'object') {
      return { ok: false, message: `Invalid '${param}': the root must have type "object".`, param };
    }
    const problem = schemaProblem(tool.input_schema);
    if (problem) return { ok: false, message: `Invalid '${param}': ${problem}`, param };
  }
  const manifest: Manifest = { version: 1, tools: r.data.tools as ToolSpec[] };
  return { ok: true, manifest, hash: canonicalHash(manifest) };
}

function schemaProblem(schema: Record<string, unknown>): string | null {
  const ajv = ajvLib();
  try {
    if (!ajv.validateSchema(schema)) return ajv.errorsText(ajv.errors, { dataVar: 'schema' });
    // Compiling also resolves `$ref`s; the result is cached per hash below.
    ajv.compile(schema);
    return null;
  } catch (err) {
    return err instanceof Error ? err.message : 'not a valid JSON Schema';
  } finally {
    ajv.removeSchema(schema);
  }
}

/** Compiled argument validators by `<manifest hash>:<tool>`, bounded. */
const validators = new LRUCache<string, ValidateFunction>({ max: 2048 });

/**
 * Validates invocation arguments against a tool's `input_schema`. Returns null
 * when valid, else the failing path under `arguments` and a message.
 */
export function checkArguments(
  manifestHash: string,
  tool: ToolSpec,
  args: unknown,
): { param: string; message: string } | null {
  const key = `${manifestHash}:${tool.name}`;
  let validate = validators.get(key);
  if (!validate) {
    const ajv = ajvLib();
    validate = ajv.compile(tool.input_schema);
    ajv.removeSchema(tool.input_schema);
    validators.set(key, validate);
  }
  if (validate(args)) return null;
  const e = validate.errors?.[0];
  const pointer = e?.instancePath ?? '';
  const segs = pointer
    .split('/')
    .slice(1)
    .map((s) => s.replaceAll('~1', '/').replaceAll('~0', '~'))
    .map((s) => (/^\d+$/.test(s) ? Number(s) : s));
  if (e?.keyword === 'required') segs.push(String(e.params.missingProperty));
  const param = formatPath(['arguments', ...segs]) ?? 'arguments';
  return { param, message: `Invalid '${param}': ${e?.message ?? 'does not match the schema'}` };
}
