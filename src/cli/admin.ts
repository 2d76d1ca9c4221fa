/**
 * `switchyard admin`: a client of the operator API. Global options: `--url`
 * (default $SWITCHYARD_URL or http://127.0.0.1:$PORT), `--token` (default
 * $SWITCHYARD_ADMIN_TOKEN, else the token saved in the data directory),
 * `--json` (print the raw JSON response, for scripts).
 */
import { parseArgs } from 'node:util';
import { request } from '../runtime/http-client.js';
import { readStoredAdminToken } from '../http/admin-auth.js';
import { loadConfig } from '../config/index.js';

const USAGE = `usage: switchyard admin [--url URL] [--token T] [--json] <resource> <action> [options]

  project create --slug S --name N [--credit-cents C]
  project list
  model create --name N --context-window W [--capability C ...] [--owned-by O]
  model list
  worker add --model M [--project P] --tier free|cpu|gpu|self_hosted --worker-url http://host:port/v1 [--id ID]
             [--scheduling-policy fcfs|priority]
  worker list
  worker remove ID
  worker drain ID    (no new requests; those on it finish; for maintenance of a static worker)
  worker resume ID
  endpoint create --project P --slug S --name N --model M --tier T [--max-rpm N] [--max-tpm N]
  endpoint list --project P
  key create --project P [--name N] [--scope S ...] [--expires-at ISO] [--endpoint-id UUID]
             [--allowed-ip IP ...] [--blocked-ip IP ...] [--quota-requests N] [--quota-window S]
  key list --project P
  key rotate ID --project P [--scope S ...]   (prints the new value once; the old one works 24 h)
  key revoke ID --project P

  user create --name N --email E [--password-stdin]   (the dashboard password from stdin)
  user list
  user password USER --password-stdin                 (resets it; ends the user's sessions)
  member add --project P --user USER --role owner|admin|approver|viewer
  member list --project P

  webhook create --project PID --hook-url https://... --event TYPE ... [--description D]
  webhook list --project PID [--limit N] [--after ID]
  webhook get|delete|test ID --project PID
  webhook deliveries ID --project PID [--limit N] [--after DEL]
  webhook attempts ID DELIVERY --project PID
  webhook redeliver ID DELIVERY --project PID
    (webhook commands call the project API with a management-scope key:
     --key K or $SWITCHYARD_API_KEY; PID is the project's external id)

P is a project's external id (proj_...) or slug.
`;

class CliError extends Error {}
/** Bad usage (a required flag missing, a malformed value): the usage, exit 2, no request. */
class UsageError extends CliError {}

/** The commands whose positional ID is required, and what the ID names. */
const ID_COMMANDS: Record<string, 'worker' | 'key'> = {
  'worker remove': 'worker',
  'worker drain': 'worker',
  'worker resume': 'worker',
  'key rotate': 'key',
  'key revoke': 'key',
};

type Json = Record<string, unknown>;

interface Ctx {
  url: string;
  token: string;
  json: boolean;
}

async function call(
  ctx: Ctx,
  method: string,
  path: string,
  body?: Json,
  auth: { prefix: string; token: string } = { prefix: '/admin/v1', token: ctx.token },
): Promise<Json> {
  const res = await request(ctx.url + auth.prefix + path, {
    method: method as 'GET',
    headers: {
      authorization: `Bearer ${auth.token}`,
      ...(body ? { 'content-type': 'application/json' } : {}),
    },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.body.text();
  let parsed: Json;
  try {
    parsed = JSON.parse(text) as Json;
  } catch {
    throw new CliError(`unexpected response (${res.statusCode}): ${text.slice(0, 200)}`);
  }
  if (res.statusCode >= 400) {
    const err = (parsed.error ?? {}) as Json;
    const param = err.param ? ` (param: ${String(err.param)})` : '';
    throw new CliError(
      `${String(err.code ?? res.statusCode)}: ${String(err.message ?? text)}${param}`,
    );
  }
  return parsed;
}

function intOpt(name: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n)) throw new UsageError(`--${name} must be an integer`);
  return n;
}

function need(name: string, v: string | undefined): string {
  if (v === undefined || v === '') throw new UsageError(`--${name} is required`);
  return v;
}

function table(rows: Json[], cols: string[]): string {
  if (rows.length === 0) return '(none)\n';
  const cells = rows.map((r) => cols.map((c) => formatCell(r[c])));
  const widths = cols.map((c, i) => Math.max(c.length, ...cells.map((row) => row[i]!.length)));
  const line = (vals: string[]) =>
    vals
      .map((v, i) => v.padEnd(widths[i]!))
      .join('  ')
      .trimEnd();
  return [line(cols), ...cells.map(line)].join('\n') + '\n';
}

function formatCell(v: unknown): string {
  if (v === null || v === undefined) return '-';
  if (Array.isArray(v)) return v.join(',');
  return String(v);
}

export async function admin(argv: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        url: { type: 'string' },
        token: { type: 'string' },
        json: { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h', default: false },
        slug: { type: 'string' },
        name: { type: 'string' },
        'credit-cents': { type: 'string' },
        'context-window': { type: 'string' },
        capability: { type: 'string', multiple: true },
        'owned-by': { type: 'string' },
        model: { type: 'string' },
        tier: { type: 'string' },
        'worker-url': { type: 'string' },
        'scheduling-policy': { type: 'string' },
        id: { type: 'string' },
        project: { type: 'string' },
        'max-rpm': { type: 'string' },
        'max-tpm': { type: 'string' },
        scope: { type: 'string', multiple: true },
        'expires-at': { type: 'string' },
        'endpoint-id': { type: 'string' },
        'allowed-ip': { type: 'string', multiple: true },
        'blocked-ip': { type: 'string', multiple: true },
        'quota-requests': { type: 'string' },
        'quota-window': { type: 'string' },
        key: { type: 'string' },
        'hook-url': { type: 'string' },
        event: { type: 'string', multiple: true },
        description: { type: 'string' },
        limit: { type: 'string' },
        after: { type: 'string' },
        email: { type: 'string' },
        'password-stdin': { type: 'boolean', default: false },
        user: { type: 'string' },
        role: { type: 'string' },
      },
      strict: true,
    });
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n\n${USAGE}`);
    return 2;
  }
  const { values: o, positionals } = parsed;
  if (o.help || positionals.length === 0) {
    process.stdout.write(USAGE);
    return o.help ? 0 : 2;
  }
  // Commands that act on one record name it: without it, the usage (exit 2), not a
  // request for an empty id.
  const [resource, action, arg, arg2] = positionals;
  const command = `${resource} ${action}`;
  const idOf = ID_COMMANDS[command];
  if (idOf && !(arg ?? (idOf === 'worker' ? o.id : undefined))) {
    process.stderr.write(`switchyard admin: ${command}: the ${idOf} ID is required\n\n${USAGE}`);
    return 2;
  }
  const config = loadConfig();
  const token = o.token ?? config.adminToken ?? readStoredAdminToken(config.dataDir) ?? '';
  if (!token && positionals[0] !== 'webhook') {
    process.stderr.write(
      'switchyard admin: no operator token (--token or SWITCHYARD_ADMIN_TOKEN)\n',
    );
    return 2;
  }
  const ctx: Ctx = {
    // An empty variable is unset, as for every setting (src/config).
    url: (o.url ?? (process.env.SWITCHYARD_URL || `http://127.0.0.1:${config.port}`)).replace(
      /\/+$/,
      '',
    ),
    token,
    json: o.json ?? false,
  };
  const apiKey = o.key ?? process.env.SWITCHYARD_API_KEY;
  const hook = (method: string, path: string, body?: Json) => {
    if (!apiKey)
      throw new CliError('webhook commands need a management key (--key or SWITCHYARD_API_KEY)');
    const prefix = `/${encodeURIComponent(need('project', o.project))}/v1/webhooks`;
    return call(ctx, method, path, body, { prefix, token: apiKey });
  };
  const hookId = () => `/${encodeURIComponent(need('ID', arg))}`;
  const project = () => encodeURIComponent(need('project', o.project));
  try {
    let result: Json;
    let human: (r: Json) => string;
    const listOf = (cols: string[]) => (r: Json) => table((r.data as Json[]) ?? [], cols);
    const record = (cols: string[]) => (r: Json) => table([r], cols);
    switch (command) {
      case 'project create':
        result = await call(ctx, 'POST', '/projects', {
          slug: need('slug', o.slug),
          name: o.name ?? o.slug,
          ...(o['credit-cents'] ? { credit_cents: intOpt('credit-cents', o['credit-cents']) } : {}),
        });
        human = record(['id', 'slug', 'name', 'credit_cents']);
        break;
      case 'project list':
        result = await call(ctx, 'GET', '/projects');
        human = listOf(['id', 'slug', 'name', 'credit_cents', 'billing_status']);
        break;
      case 'model create':
        result = await call(ctx, 'POST', '/models', {
          name: need('name', o.name),
          context_window: intOpt('context-window', need('context-window', o['context-window'])),
          capabilities: o.capability ?? [],
          ...(o['owned-by'] ? { owned_by: o['owned-by'] } : {}),
        });
        human = record(['id', 'context_window', 'capabilities', 'owned_by']);
        break;
      case 'model list':
        result = await call(ctx, 'GET', '/models');
        human = listOf(['id', 'context_window', 'capabilities', 'owned_by']);
        break;
      case 'worker add':
        result = await call(ctx, 'POST', '/workers', {
          model: need('model', o.model),
          ...(o.project ? { project: o.project } : {}),
          tier: need('tier', o.tier),
          url: need('worker-url', o['worker-url']),
          ...(o.id ? { id: o.id } : {}),
          ...(o['scheduling-policy'] ? { scheduling_policy: o['scheduling-policy'] } : {}),
        });
        human = record(['id', 'model', 'tier', 'url', 'scheduling_policy', 'status']);
        break;
      case 'worker list':
        result = await call(ctx, 'GET', '/workers');
        human = listOf(['id', 'model', 'tier', 'url', 'source', 'status']);
        break;
      case 'worker drain':
      case 'worker resume': {
        const id = encodeURIComponent(arg ?? o.id ?? '');
        result = await call(ctx, 'POST', `/workers/${id}/${action}`);
        human = record(['id', 'url', 'status']);
        break;
      }
      case 'worker remove':
        result = await call(ctx, 'DELETE', `/workers/${encodeURIComponent(arg ?? o.id ?? '')}`);
        human = (r) => `removed ${String(r.id)}\n`;
        break;
      case 'endpoint create':
        result = await call(ctx, 'POST', `/projects/${project()}/endpoints`, {
          slug: need('slug', o.slug),
          name: o.name ?? o.slug,
          model: need('model', o.model),
          tier: need('tier', o.tier),
          ...(o['max-rpm'] ? { max_requests_per_minute: intOpt('max-rpm', o['max-rpm']) } : {}),
          ...(o['max-tpm'] ? { max_tokens_per_minute: intOpt('max-tpm', o['max-tpm']) } : {}),
        });
        human = record(['id', 'slug', 'model_name', 'tier_id', 'status']);
        break;
      case 'endpoint list':
        result = await call(ctx, 'GET', `/projects/${project()}/endpoints`);
        human = listOf(['id', 'slug', 'model_name', 'tier_id', 'status', 'provisioning_state']);
        break;
      case 'key create':
        result = await call(ctx, 'POST', `/projects/${project()}/keys`, {
          ...(o.name ? { name: o.name } : {}),
          ...(o.scope ? { scopes: o.scope } : {}),
          ...(o['expires-at'] ? { expiresAt: o['expires-at'] } : {}),
          ...(o['endpoint-id'] ? { endpointId: o['endpoint-id'] } : {}),
          ...(o['allowed-ip'] ? { allowedIps: o['allowed-ip'] } : {}),
          ...(o['blocked-ip'] ? { blockedIps: o['blocked-ip'] } : {}),
          ...(o['quota-requests']
            ? { quotaRequests: intOpt('quota-requests', o['quota-requests']) }
            : {}),
          ...(o['quota-window'] ? { quotaWindow: intOpt('quota-window', o['quota-window']) } : {}),
        });
        human = (r) =>
          table([r], ['id', 'prefix', 'scopes', 'expiresAt']) +
          `\nAPI key (shown once, store it now):\n  ${String(r.key)}\n`;
        break;
      case 'user create':
        result = await call(ctx, 'POST', '/users', {
          name: need('name', o.name),
          email: need('email', o.email),
          ...(o['password-stdin'] ? { password: await passwordFromStdin() } : {}),
        });
        human = (r) =>
          table([r], ['id', 'name', 'email', 'password_set']) +
          `\nUser token for approval decisions (shown once):\n  ${String(r.token)}\n`;
        break;
      case 'user list':
        result = await call(ctx, 'GET', '/users');
        human = listOf(['id', 'name', 'email']);
        break;
      case 'user password': {
        if (!o['password-stdin']) throw new UsageError('user password: give --password-stdin');
        const user = arg ?? need('user', o.user);
        result = await call(ctx, 'POST', `/users/${encodeURIComponent(user)}/password`, {
          password: await passwordFromStdin(),
        });
        human = (r) => `password set for ${String(r.id)}; their sessions have ended\n`;
        break;
      }
      case 'member add':
        result = await call(ctx, 'POST', `/projects/${project()}/members`, {
          user_id: need('user', o.user),
          role: need('role', o.role),
        });
        human = record(['user_id', 'role']);
        break;
      case 'member list':
        result = await call(ctx, 'GET', `/projects/${project()}/members`);
        human = listOf(['user_id', 'role']);
        break;
      case 'key list':
        result = await call(ctx, 'GET', `/projects/${project()}/keys`);
        human = listOf(['id', 'prefix', 'status', 'scopes', 'expiresAt', 'endpointId']);
        break;
      case 'key rotate':
        result = await call(
          ctx,
          'POST',
          `/projects/${project()}/keys/${encodeURIComponent(need('ID', arg))}/rotate`,
          o.scope ? { scopes: o.scope } : {},
        );
        human = (r) =>
          table([r], ['id', 'prefix', 'scopes', 'rotatedAt']) +
          `\nNew API key (shown once; the previous value keeps working for 24 hours):\n  ${String(r.key)}\n`;
        break;
      case 'key revoke':
        result = await call(
          ctx,
          'DELETE',
          `/projects/${project()}/keys/${encodeURIComponent(need('ID', arg))}`,
        );
        human = record(['id', 'prefix', 'status', 'revokedAt']);
        break;
      case 'webhook create':
        result = await hook('POST', '', {
          url: need('hook-url', o['hook-url']),
          events: o.event ?? [],
          ...(o.description ? { description: o.description } : {}),
        });
        human = (r) =>
          table([r], ['id', 'url', 'events', 'is_active']) +
          `\nSigning secret (shown once, store it now):\n  ${String(r.secret)}\n`;
        break;
      case 'webhook list': {
        const q = new URLSearchParams();
        if (o.limit) q.set('limit', o.limit);
        if (o.after) q.set('after', o.after);
        result = await hook('GET', q.size ? `?${q}` : '');
        human = listOf(['id', 'url', 'events', 'is_active']);
        break;
      }
      case 'webhook get':
        result = await hook('GET', hookId());
        human = record(['id', 'url', 'events', 'is_active', 'description']);
        break;
      case 'webhook delete':
        result = await hook('DELETE', hookId());
        human = (r) => `deleted ${String(r.id)}\n`;
        break;
      case 'webhook test':
        result = await hook('POST', `${hookId()}/test`);
        human = record(['success', 'http_status', 'error_message']);
        break;
      case 'webhook deliveries': {
        const q = new URLSearchParams();
        if (o.limit) q.set('limit', o.limit);
        if (o.after) q.set('after', o.after);
        result = await hook('GET', `${hookId()}/deliveries${q.size ? `?${q}` : ''}`);
        human = listOf([
          'id',
          'event_type',
          'status',
          'attempt_count',
          'http_status',
          'created_at',
        ]);
        break;
      }
      case 'webhook attempts':
        result = await hook(
          'GET',
          `${hookId()}/deliveries/${encodeURIComponent(need('DELIVERY', arg2))}/attempts`,
        );
        human = listOf(['attempt', 'outcome', 'http_status', 'error', 'duration_ms', 'started_at']);
        break;
      case 'webhook redeliver':
        result = await hook(
          'POST',
          `${hookId()}/deliveries/${encodeURIComponent(need('DELIVERY', arg2))}/redeliver`,
        );
        human = record(['id', 'event_type', 'status', 'attempt_count']);
        break;
      default:
        process.stderr.write(
          `switchyard admin: unknown command '${positionals.join(' ')}'\n\n${USAGE}`,
        );
        return 2;
    }
    process.stdout.write(ctx.json ? JSON.stringify(result) + '\n' : human(result));
    return 0;
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`switchyard admin: ${err.message}\n\n${USAGE}`);
      return 2;
    }
    if (err instanceof CliError) {
      process.stderr.write(`switchyard admin: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
}

/**
 * A password from standard input, not an argument (arguments show in process
 * lists and shell history): its first line, without the line end.
 */
async function passwordFromStdin(): Promise<string> {
  let text = '';
  for await (const chunk of process.stdin) {
    text += String(chunk);
    if (text.includes('\n')) break;
  }
  const line = text.split(/\r?\n/, 1)[0] ?? '';
  if (!line) throw new CliError('--password-stdin: standard input held no password');
  return line;
}
