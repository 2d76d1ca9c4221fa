/**
 * `switchyard agent`: an execution agent. Enrolls with a join key (once; the
 * identity file keeps the keypair and agent id across restarts), connects to
 * the router's exec broker over CURVE, renews its lease and runs the tools of
 * its manifest file as subprocesses. Flags win over the environment.
 *
 * Exit codes: 0 stopped by SIGTERM/SIGINT, 2 bad usage or settings,
 * 3 enrollment rejected (`enrollment rejected: <code>: <message>`),
 * 4 enrollment impossible (not enrolled and no join key, or a protocol fault),
 * 1 anything else.
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { pino } from 'pino';
import {
  AgentClient,
  EnrollmentFailedError,
  EnrollmentRejectedError,
} from '../exec/agent/client.js';
import { IdentityFileError } from '../exec/agent/identity.js';
import { loadManifestFile, ManifestFileError } from '../exec/agent/manifest.js';
import { isZ85Key } from '../exec/broker/z85.js';
import { createLogger } from '../runtime/logger.js';

export const EXIT_USAGE = 2;
export const EXIT_ENROLLMENT_REJECTED = 3;
export const EXIT_ENROLLMENT_FAILED = 4;

const USAGE = `usage: switchyard agent --server-key=KEY --manifest FILE [options]

  --enroll-endpoint URL  enrollment socket (SWITCHYARD_AGENT_ENROLL_ENDPOINT, tcp://127.0.0.1:7601)
  --endpoint URL         agent socket (SWITCHYARD_AGENT_ENDPOINT, tcp://127.0.0.1:7602)
  --server-key=KEY       the broker's CURVE public key, Z85 (SWITCHYARD_AGENT_SERVER_KEY;
                         quote it, and keep the '=': a Z85 key may start with '-')
  --join-key KEY         join key for the first enrollment (SWITCHYARD_AGENT_JOIN_KEY;
                         prefer the environment or --join-key-file: flags show in ps)
  --join-key-file PATH   file holding the join key (SWITCHYARD_AGENT_JOIN_KEY_FILE)
  --name NAME            registration name (SWITCHYARD_AGENT_NAME)
  --manifest FILE        manifest file, JSON (SWITCHYARD_AGENT_MANIFEST)
  --key-file FILE        identity file, mode 0600 (SWITCHYARD_AGENT_KEY_FILE, ./switchyard-agent.key)
  --kill-grace-ms N      SIGTERM → SIGKILL grace (SWITCHYARD_AGENT_KILL_GRACE_MS, 2000)
  --max-output-bytes N   kept of stdout and of stderr (SWITCHYARD_AGENT_MAX_OUTPUT_BYTES, 65536)
  --reconnect-min-ms N   first reconnect delay (SWITCHYARD_AGENT_RECONNECT_MIN_MS, 500)
  --reconnect-max-ms N   largest reconnect delay (SWITCHYARD_AGENT_RECONNECT_MAX_MS, 30000)
  --log-level LEVEL      (LOG_LEVEL, info)
`;

class UsageError extends Error {}

function num(name: string, raw: string | undefined, def: number, min: number): number {
  if (raw === undefined || raw === '') return def;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min)
    throw new UsageError(`--${name} must be an integer >= ${min}`);
  return n;
}

/**
 * A broker socket: the broker binds TCP only. Checked here, or ZeroMQ's bare
 * "Protocol not supported" / "Invalid argument" would end the agent later (exit 1).
 */
function endpoint(name: string, raw: string): string {
  if (!/^tcp:\/\/[^\s/]+:\d{1,5}$/.test(raw))
    throw new UsageError(`--${name}: a broker endpoint tcp://HOST:PORT is required, not '${raw}'`);
  return raw;
}

export async function agent(argv: string[], env: NodeJS.ProcessEnv = process.env): Promise<number> {
  let client: AgentClient;
  let logger: ReturnType<typeof createLogger>;
  try {
    const { values } = parseArgs({
      args: argv,
      options: {
        'enroll-endpoint': { type: 'string' },
        endpoint: { type: 'string' },
        'server-key': { type: 'string' },
        'join-key': { type: 'string' },
        'join-key-file': { type: 'string' },
        name: { type: 'string' },
        manifest: { type: 'string' },
        'key-file': { type: 'string' },
        'kill-grace-ms': { type: 'string' },
        'max-output-bytes': { type: 'string' },
        'reconnect-min-ms': { type: 'string' },
        'reconnect-max-ms': { type: 'string' },
        'log-level': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
    });
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const serverKey = values['server-key'] ?? env.SWITCHYARD_AGENT_SERVER_KEY;
    if (!isZ85Key(serverKey)) {
      throw new UsageError('--server-key: the broker public key (40 Z85 characters) is required');
    }
    const manifestPath = values.manifest ?? env.SWITCHYARD_AGENT_MANIFEST;
    if (!manifestPath) throw new UsageError('--manifest: a manifest file is required');
    // Flags first (--join-key, then --join-key-file), then the environment likewise.
    const joinKey =
      values['join-key'] ??
      (values['join-key-file'] ? readJoinKeyFile(values['join-key-file']) : undefined) ??
      (env.SWITCHYARD_AGENT_JOIN_KEY || undefined) ??
      (env.SWITCHYARD_AGENT_JOIN_KEY_FILE
        ? readJoinKeyFile(env.SWITCHYARD_AGENT_JOIN_KEY_FILE)
        : undefined);
    const name = values.name ?? (env.SWITCHYARD_AGENT_NAME || undefined);
    const manifest = loadManifestFile(manifestPath);
    // Synchronous stdout: an agent logs little, and lines must not wait in a buffer.
    const level = values['log-level'] ?? (env.LOG_LEVEL || 'info');
    if (level !== 'silent' && !Object.hasOwn(pino.levels.values, level)) {
      throw new UsageError(
        `--log-level: one of ${Object.keys(pino.levels.values).join(', ')}, silent`,
      );
    }
    logger = createLogger(level, pino.destination({ dest: 1, sync: true })).child({
      component: 'agent',
    });
    // Tools inherit the environment without the agent's own settings (the join key).
    const toolEnv = Object.fromEntries(
      Object.entries(env).filter(([k]) => !k.startsWith('SWITCHYARD_AGENT_')),
    );
    client = new AgentClient({
      enrollEndpoint: endpoint(
        'enroll-endpoint',
        values['enroll-endpoint'] ??
          (env.SWITCHYARD_AGENT_ENROLL_ENDPOINT || 'tcp://127.0.0.1:7601'),
      ),
      agentEndpoint: endpoint(
        'endpoint',
        values.endpoint ?? (env.SWITCHYARD_AGENT_ENDPOINT || 'tcp://127.0.0.1:7602'),
      ),
      serverKey,
      ...(joinKey ? { joinKey } : {}),
      ...(name ? { registrationName: name } : {}),
      manifest,
      keyFile: values['key-file'] ?? (env.SWITCHYARD_AGENT_KEY_FILE || './switchyard-agent.key'),
      logger,
      toolEnv,
      killGraceMs: num(
        'kill-grace-ms',
        values['kill-grace-ms'] ?? env.SWITCHYARD_AGENT_KILL_GRACE_MS,
        2000,
        0,
      ),
      maxOutputBytes: num(
        'max-output-bytes',
        values['max-output-bytes'] ?? env.SWITCHYARD_AGENT_MAX_OUTPUT_BYTES,
        65_536,
        0,
      ),
      reconnectMinMs: num(
        'reconnect-min-ms',
        values['reconnect-min-ms'] ?? env.SWITCHYARD_AGENT_RECONNECT_MIN_MS,
        500,
        1,
      ),
      reconnectMaxMs: num(
        'reconnect-max-ms',
        values['reconnect-max-ms'] ?? env.SWITCHYARD_AGENT_RECONNECT_MAX_MS,
        30_000,
        1,
      ),
    });
  } catch (err) {
    if (
      err instanceof UsageError ||
      err instanceof ManifestFileError ||
      err instanceof IdentityFileError ||
      isParseArgsError(err)
    ) {
      process.stderr.write(`switchyard agent: ${(err as Error).message}\n\n${USAGE}`);
      return EXIT_USAGE;
    }
    throw err;
  }

  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    void client.stop();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  logger.info({ agentKey: client.publicKey, agentId: client.agentId }, 'agent starting');
  try {
    await client.run();
    return 0;
  } catch (err) {
    if (stopping) return 0;
    if (err instanceof EnrollmentRejectedError) {
      const param = err.param ? ` (${err.param})` : '';
      process.stderr.write(`enrollment rejected: ${err.code}: ${err.message}${param}\n`);
      return EXIT_ENROLLMENT_REJECTED;
    }
    if (err instanceof EnrollmentFailedError) {
      process.stderr.write(`enrollment failed: ${err.code}: ${err.message}\n`);
      return EXIT_ENROLLMENT_FAILED;
    }
    throw err;
  } finally {
    process.off('SIGTERM', stop);
    process.off('SIGINT', stop);
    await client.stop();
  }
}

/** The join key a file holds, without the line end (LF or CRLF) an editor leaves. */
function readJoinKeyFile(path: string): string {
  try {
    return readFileSync(path, 'utf8').trim();
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    throw new UsageError(`join key file ${path}: ${e.code ?? e.message}`);
  }
}

function isParseArgsError(err: unknown): boolean {
  const code = (err as { code?: string }).code;
  return typeof code === 'string' && code.startsWith('ERR_PARSE_ARGS');
}
