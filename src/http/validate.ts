/**
 * Boundary validation: parse untrusted input with a zod schema and turn the first
 * issue into a catalogue error whose `param` names the field path the way OpenAI
 * does (`messages[2].tool_call_id`).
 */
import type { z } from 'zod';
import { ServiceError, type ErrorCode } from '../errors/index.js';

export function formatPath(path: ReadonlyArray<PropertyKey>): string | null {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else out += out === '' ? String(seg) : `.${String(seg)}`;
  }
  return out === '' ? null : out;
}

export function issueToError(
  issue: z.core.$ZodIssue,
  code: ErrorCode = 'invalid_body',
): ServiceError {
  const path = [...issue.path];
  // For unrecognized keys, name the offending key itself.
  if (issue.code === 'unrecognized_keys' && issue.keys.length > 0) path.push(issue.keys[0]!);
  const param = formatPath(path);
  let message = issue.message;
  if (issue.code === 'invalid_type' && issue.input === undefined) {
    message = `Missing required parameter: '${param ?? 'body'}'.`;
  } else if (param) {
    message = `Invalid '${param}': ${issue.message}`;
  }
  return new ServiceError(code, { message, param });
}

export function parseBody<S extends z.ZodType>(
  schema: S,
  input: unknown,
  code: ErrorCode = 'invalid_body',
): z.output<S> {
  // With the input in each issue: a wrong type and a missing field read differently.
  const r = schema.safeParse(input, { reportInput: true });
  if (!r.success) throw issueToError(r.error.issues[0]!, code);
  return r.data;
}

/**
 * A request field parsed with `schema`, refused with OpenAI's codes: a field that is
 * absent is `missing_required_parameter`, a wrong type `invalid_type`, anything else
 * `invalid_value`. `prefix` is where `v` sits in the request (the start of `param`).
 */
export function parseField<S extends z.ZodType>(
  schema: S,
  v: unknown,
  prefix: ReadonlyArray<string | number> = [],
): z.output<S> {
  const r = schema.safeParse(v, { reportInput: true });
  if (r.success) return r.data;
  const issue = unionIssue(r.error.issues[0]!);
  const path = [...prefix, ...issue.path];
  if (issue.path.length > 0 && valueAt(v, issue.path) === undefined) {
    const param = formatPath(path);
    throw new ServiceError('missing_required_parameter', {
      message: `Missing required parameter: '${param}'.`,
      param,
    });
  }
  throw issueToError(
    { ...issue, path },
    issue.code === 'invalid_type' ? 'invalid_type' : 'invalid_value',
  );
}

/**
 * What a failed union means to the client. A value of none of the union's types is
 * a wrong type (`content: 5` where a string or a list of parts belongs); a value of
 * exactly one of them failed inside it, and that branch's issue names the field
 * (`content[0].type`). Anything else stays the union's own issue.
 */
function unionIssue(issue: z.core.$ZodIssue): z.core.$ZodIssue {
  // A record key that failed its own schema (`metadata` keys up to 64 characters):
  // that schema's message, not zod's generic "Invalid key in record".
  if (issue.code === 'invalid_key' && issue.issues.length > 0) {
    return { ...issue.issues[0]!, path: issue.path } as z.core.$ZodIssue;
  }
  if (issue.code !== 'invalid_union' || issue.errors.length === 0) return issue;
  const typeMiss = (b: z.core.$ZodIssue[]) =>
    b.length > 0 && b[0]!.code === 'invalid_type' && b[0]!.path.length === 0;
  const matched = issue.errors.filter((b) => !typeMiss(b));
  if (matched.length === 0) {
    const expected = issue.errors.map((b) => (b[0] as { expected?: string }).expected);
    return {
      code: 'invalid_type',
      expected: 'union' as never,
      path: issue.path,
      input: issue.input,
      message: `expected ${[...new Set(expected)].join(' or ')}`,
    } as z.core.$ZodIssue;
  }
  if (matched.length === 1 && matched[0]!.length > 0) {
    const inner = matched[0]![0]!;
    return unionIssue({ ...inner, path: [...issue.path, ...inner.path] } as z.core.$ZodIssue);
  }
  return issue;
}

function valueAt(body: unknown, path: ReadonlyArray<PropertyKey>): unknown {
  let v: unknown = body;
  for (const seg of path) {
    if (v === null || typeof v !== 'object') return undefined;
    v = (v as Record<PropertyKey, unknown>)[seg];
  }
  return v;
}

/**
 * OpenAI's list query (`limit` 1–100, default 20; `order` `asc` or `desc`, default
 * `desc`; `after`, a cursor the caller resolves), as the Responses and Conversations
 * item lists take it.
 */
export function listQuery(q: { limit?: string; order?: string; after?: string }): {
  limit: number;
  order: 'asc' | 'desc';
  after: string | undefined;
} {
  // Decimal digits only: Number() would also take ` 1`, `0x10` and `1e1`.
  const limit = q.limit === undefined ? 20 : /^[0-9]{1,3}$/.test(q.limit) ? Number(q.limit) : NaN;
  if (!Number.isInteger(limit) || limit < 1 || limit > 100) {
    throw new ServiceError('invalid_value', {
      message: 'limit must be an integer from 1 to 100.',
      param: 'limit',
    });
  }
  const order = q.order ?? 'desc';
  if (order !== 'asc' && order !== 'desc') {
    throw new ServiceError('invalid_value', {
      message: "order must be 'asc' or 'desc'.",
      param: 'order',
    });
  }
  return { limit, order, after: q.after };
}

/**
 * OpenAI's cursor-page envelope over items fetched with one more than `limit` (that
 * one says whether there is more): `{object: "list", data, first_id, last_id, has_more}`.
 */
export function listPage<T extends { id?: unknown }>(
  fetched: readonly T[],
  limit: number,
): {
  object: 'list';
  data: T[];
  first_id: string | null;
  last_id: string | null;
  has_more: boolean;
} {
  const data = fetched.slice(0, limit);
  return {
    object: 'list',
    data,
    first_id: (data[0]?.id as string | undefined) ?? null,
    last_id: (data[data.length - 1]?.id as string | undefined) ?? null,
    has_more: fetched.length > limit,
  };
}
