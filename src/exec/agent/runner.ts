/**
 * Runs one dispatched tool as a subprocess and reports its `DispatchOutcome`.
 *
 * - The arguments go to the tool as JSON on stdin and in `SWITCHYARD_TOOL_ARGS`
 *   (left out when too big for the environment: stdin always has them).
 * - The tool runs in a process group of its own, so a timeout or cancel
 *   reaches its children too: SIGTERM to the group, then SIGKILL after the
 *   grace period if it is still there.
 * - The tool's process group ends with the tool: what it left running there when
 *   it exited (a command put in the background with `&`) gets SIGTERM, then SIGKILL
 *   after the grace, so no invocation leaves work behind that outlives its
 *   timeout, its cancel and its record. (A program that leaves the group with
 *   `setsid` leaves the agent's care too, as it would leave a container's.)
 * - An agent killed outright (SIGKILL, a crash) cannot signal its tools, so a
 *   reaper process does it for the agent (see `Reaper`).
 * - stdout and stderr are each kept up to `maxOutputBytes` (cut at a UTF-8
 *   character boundary); the rest is discarded and `truncated` set.
 * Time here is real (the tool is a real process); the callers keep it short in tests.
 */
import { spawn } from 'node:child_process';
import type { Socket } from 'node:net';
import { constants } from 'node:os';
import type { Writable } from 'node:stream';
import { performance } from 'node:perf_hooks';
import type { DispatchOutcome } from '../contracts.js';

export interface ToolCommand {
  /** argv; `command[0]` is looked up on PATH. */
  command: string[];
  cwd?: string;
  env?: Record<string, string>;
}

export interface RunOptions {
  invocationId: string;
  toolName: string;
  arguments: unknown;
  timeoutMs: number;
  /** SIGTERM → SIGKILL grace (ms). */
  killGraceMs: number;
  /** Bound of each of stdout and stderr (bytes). */
  maxOutputBytes: number;
  /** Environment the tool inherits (the agent strips its own secrets first). */
  baseEnv: Record<string, string | undefined>;
}

export interface RunningTool {
  readonly outcome: Promise<DispatchOutcome>;
  /** Kills the tool (SIGTERM, then SIGKILL); the outcome becomes `cancelled`. */
  cancel(): void;
}

/** Above this the arguments are passed on stdin only (Linux caps one env string at 128 KiB). */
export const MAX_ENV_ARGS_BYTES = 100 * 1024;

/** Time allowed for the pipes to drain after the tool exited (a grandchild may hold them). */
const DRAIN_AFTER_EXIT_MS = 200;

/**
 * The reaper: a shell process the agent starts with its first tool, in a process
 * group of its own and deaf to terminal signals. The agent writes to its stdin
 * `+<pgid>` when a tool starts and `-<pgid>` when it ends. At end of file (the agent
 * is gone, however it ended: the kernel closes its pipe) the reaper sends SIGTERM to
 * every group still listed, then SIGKILL after the grace, and exits.
 *
 * Written by hand: Node cannot set PR_SET_PDEATHSIG, which would reach only the
 * tool and not its children, and no package does this. `/bin/sh` costs about a
 * megabyte where a second Node process would cost forty.
 */
const REAPER_SCRIPT = `trap '' INT TERM HUP QUIT
groups=''
while read -r line; do
  case "$line" in
    +*) groups="$groups \${line#+}" ;;
    -*) g=\${line#-}; rest=''
        for x in $groups; do [ "$x" = "$g" ] || rest="$rest $x"; done
        groups=$rest ;;
  esac
done
[ -n "$groups" ] || exit 0
for g in $groups; do kill -TERM "-$g" 2>/dev/null; done
sleep "$1"
for g in $groups; do kill -KILL "-$g" 2>/dev/null; done`;

class Reaper {
  private static current: Reaper | null = null;
  private alive = true;

  private constructor(private readonly stdin: Writable) {}

  /** This process's reaper, started on first use (again if it died). */
  static get(killGraceMs: number): Reaper {
    if (Reaper.current?.alive) return Reaper.current;
    const child = spawn(
      '/bin/sh',
      ['-c', REAPER_SCRIPT, 'switchyard-reaper', String(killGraceMs / 1000)],
      {
        stdio: ['pipe', 'ignore', 'ignore'],
        detached: true,
      },
    );
    const reaper = new Reaper(child.stdin);
    const dead = () => {
      reaper.alive = false;
    };
    child.on('error', dead);
    child.on('exit', dead);
    child.stdin.on('error', dead);
    // Neither the reaper nor its pipe (a socket, though typed as a Writable) keeps the
    // agent running.
    child.unref();
    (child.stdin as Writable & Pick<Socket, 'unref'>).unref();
    Reaper.current = reaper;
    return reaper;
  }

  watch(pgid: number): void {
    if (this.alive) this.stdin.write(`+${pgid}\n`);
  }

  release(pgid: number): void {
    if (this.alive) this.stdin.write(`-${pgid}\n`);
  }
}

class BoundedBuffer {
  private chunks: Buffer[] = [];
  private size = 0;
  truncated = false;
  constructor(private readonly max: number) {}

  push(chunk: Buffer): void {
    const room = this.max - this.size;
    if (room <= 0) {
      if (chunk.length > 0) this.truncated = true;
      return;
    }
    const kept = chunk.length > room ? chunk.subarray(0, room) : chunk;
    if (kept.length < chunk.length) this.truncated = true;
    this.chunks.push(kept);
    this.size += kept.length;
  }

  text(): string {
    const bytes = Buffer.concat(this.chunks);
    // The bound may fall inside a character: end at the last whole one instead of
    // reporting a U+FFFD the tool never wrote.
    return (this.truncated ? bytes.subarray(0, utf8Boundary(bytes)) : bytes).toString('utf8');
  }
}

/** The length of `bytes` without a UTF-8 sequence left incomplete at its end. */
function utf8Boundary(bytes: Buffer): number {
  let start = bytes.length;
  // Back over at most three continuation bytes (10xxxxxx) to the sequence's lead byte.
  while (start > 0 && bytes.length - start < 3 && (bytes[start - 1]! & 0xc0) === 0x80) start--;
  if (start === 0) return bytes.length;
  const lead = bytes[start - 1]!;
  const need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
  return bytes.length - (start - 1) < need ? start - 1 : bytes.length;
}

export function runTool(tool: ToolCommand, opts: RunOptions): RunningTool {
  const startedAt = performance.now();
  const elapsed = () => Math.max(0, Math.round(performance.now() - startedAt));
  let stopReason: 'timeout' | 'cancelled' | undefined;
  let exited = false;
  let killTimer: NodeJS.Timeout | undefined;
  let settle!: (o: DispatchOutcome) => void;
  const outcome = new Promise<DispatchOutcome>((resolve) => (settle = resolve));
  let settled = false;
  const finish = (o: DispatchOutcome) => {
    if (settled) return;
    settled = true;
    clearTimeout(timeoutTimer);
    clearTimeout(killTimer);
    settle(o);
  };

  const argsJson = JSON.stringify(opts.arguments ?? null);
  const env: Record<string, string> = {};
  for (const [k, val] of Object.entries(opts.baseEnv)) if (val !== undefined) env[k] = val;
  Object.assign(env, tool.env ?? {});
  env.SWITCHYARD_INVOCATION_ID = opts.invocationId;
  env.SWITCHYARD_TOOL_NAME = opts.toolName;
  if (Buffer.byteLength(argsJson) <= MAX_ENV_ARGS_BYTES) env.SWITCHYARD_TOOL_ARGS = argsJson;
  else delete env.SWITCHYARD_TOOL_ARGS;

  const [file, ...args] = tool.command;
  const child = spawn(file!, args, {
    cwd: tool.cwd,
    env,
    stdio: ['pipe', 'pipe', 'pipe'],
    detached: true, // its own process group: signals reach the tool's children too
  });
  const reaper = child.pid === undefined ? null : Reaper.get(opts.killGraceMs);
  reaper?.watch(child.pid!);
  const stdout = new BoundedBuffer(opts.maxOutputBytes);
  const stderr = new BoundedBuffer(opts.maxOutputBytes);
  child.stdout.on('data', (d: Buffer) => stdout.push(d));
  child.stderr.on('data', (d: Buffer) => stderr.push(d));
  // A tool that never reads stdin closes it early: that is not an error.
  child.stdin.on('error', () => undefined);
  child.stdin.end(argsJson);

  const signalGroup = (signal: NodeJS.Signals) => {
    if (child.pid === undefined) return;
    try {
      process.kill(-child.pid, signal);
    } catch {
      // The group is gone already (ESRCH): nothing left to signal.
    }
  };
  const stop = (reason: 'timeout' | 'cancelled') => {
    if (stopReason || exited || settled) return;
    stopReason = reason;
    signalGroup('SIGTERM');
    killTimer = setTimeout(() => signalGroup('SIGKILL'), opts.killGraceMs);
  };
  const timeoutTimer = setTimeout(() => stop('timeout'), opts.timeoutMs);

  /** After the tool exited: ends what it left in its group; the reaper watches until then. */
  const endGroup = () => {
    const pid = child.pid!;
    signalGroup('SIGTERM');
    const left = () => {
      try {
        process.kill(-pid, 0);
        return true;
      } catch {
        return false; // ESRCH: no process is left in the group
      }
    };
    if (!left()) {
      reaper?.release(pid);
      return;
    }
    setTimeout(() => {
      signalGroup('SIGKILL');
      reaper?.release(pid);
    }, opts.killGraceMs).unref();
  };

  child.on('error', (err: NodeJS.ErrnoException) => {
    finish({
      kind: 'error',
      errorCode: 'spawn_failed',
      errorMessage: `cannot run ${file}: ${err.code ?? err.message}`,
      durationMs: elapsed(),
    });
  });

  child.on('exit', (code, signal) => {
    exited = true;
    clearTimeout(timeoutTimer);
    endGroup();
    const durationMs = elapsed();
    const report = () => {
      if (stopReason === 'timeout') return finish({ kind: 'timeout', elapsedMs: durationMs });
      if (stopReason === 'cancelled') return finish({ kind: 'cancelled', durationMs });
      const exitCode = code ?? 128 + (signal ? (constants.signals[signal] ?? 0) : 0);
      finish({
        kind: 'exited',
        exitCode,
        durationMs,
        stdout: stdout.text(),
        stderr: stderr.text(),
        truncated: stdout.truncated || stderr.truncated,
      });
    };
    // Collect what is still in the pipes, but do not wait for a grandchild that keeps them open.
    const drain = setTimeout(() => {
      child.stdout.destroy();
      child.stderr.destroy();
      report();
    }, DRAIN_AFTER_EXIT_MS);
    child.once('close', () => {
      clearTimeout(drain);
      report();
    });
  });

  return { outcome, cancel: () => stop('cancelled') };
}
