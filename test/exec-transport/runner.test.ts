/**
 * The agent's tool runner on its own: arguments on stdin and in the
 * environment, exit code and output, timeout with SIGTERM then SIGKILL,
 * cancel, the output bound, a command that cannot start. Real subprocesses
 * with timeouts of a few hundred milliseconds at most.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { runTool, type RunOptions } from '../../src/exec/agent/runner.js';
import { sh, tempDir } from './support.js';

const base: RunOptions = {
  invocationId: 'inv_test',
  toolName: 't',
  arguments: { path: '/tmp', n: 2 },
  timeoutMs: 5_000,
  killGraceMs: 150,
  maxOutputBytes: 1024,
  baseEnv: { PATH: process.env.PATH },
};

describe('tool runner', () => {
  const tmp = tempDir('swy-runner-');
  after(() => tmp.cleanup());

  it('passes the arguments on stdin and in SWITCHYARD_TOOL_ARGS, reports exit code and output', async () => {
    const run = runTool(
      {
        command: sh(
          'cat; echo; echo "env:$SWITCHYARD_TOOL_ARGS:$SWITCHYARD_INVOCATION_ID"; echo oops >&2; exit 3',
        ),
      },
      base,
    );
    const o = await run.outcome;
    assert.equal(o.kind, 'exited');
    if (o.kind !== 'exited') return;
    assert.equal(o.exitCode, 3);
    const args = JSON.stringify(base.arguments);
    assert.equal(o.stdout, `${args}\nenv:${args}:inv_test\n`);
    assert.equal(o.stderr, 'oops\n');
    assert.equal(o.truncated, false);
    assert.ok(o.durationMs >= 0 && o.durationMs < 5_000);
  });

  it('runs the tool in its cwd with its env', async () => {
    const o = await runTool(
      { command: sh('pwd; echo "$GREETING"'), cwd: tmp.dir, env: { GREETING: 'hi' } },
      base,
    ).outcome;
    assert.equal(o.kind, 'exited');
    if (o.kind === 'exited') assert.match(o.stdout, /swy-runner-.*\nhi\n$/);
  });

  it('times out: SIGTERM first, then SIGKILL after the grace when the tool ignores it', async () => {
    const mark = join(tmp.dir, 'stubborn-mark');
    const o = await runTool(
      {
        command: sh(`trap 'echo term >> "$MARK"' TERM; while :; do sleep 0.02; done`),
        env: { MARK: mark },
      },
      { ...base, timeoutMs: 150, killGraceMs: 150 },
    ).outcome;
    assert.equal(o.kind, 'timeout');
    if (o.kind !== 'timeout') return;
    assert.ok(existsSync(mark), 'the tool saw SIGTERM');
    assert.match(readFileSync(mark, 'utf8'), /term/);
    // Still running after SIGTERM: only SIGKILL, a grace later, ended it.
    assert.ok(o.elapsedMs >= 290, `elapsed ${o.elapsedMs} ms covers timeout + grace`);
    assert.ok(o.elapsedMs < 2_000, `elapsed ${o.elapsedMs} ms`);
  });

  it('times out a tool that honours SIGTERM without waiting for the grace', async () => {
    const o = await runTool(
      { command: ['sleep', '5'] },
      { ...base, timeoutMs: 100, killGraceMs: 5_000 },
    ).outcome;
    assert.equal(o.kind, 'timeout');
    if (o.kind === 'timeout') assert.ok(o.elapsedMs >= 95 && o.elapsedMs < 1_000, `${o.elapsedMs}`);
  });

  it('kills the whole process group (a child of the tool goes too)', async () => {
    const pidFile = join(tmp.dir, 'child-pid');
    const o = await runTool(
      { command: sh(`sleep 5 & echo $! > "${pidFile}"; wait`) },
      { ...base, timeoutMs: 150 },
    ).outcome;
    assert.equal(o.kind, 'timeout');
    const childPid = Number(readFileSync(pidFile, 'utf8'));
    await new Promise((r) => setTimeout(r, 50));
    // Gone, or a zombie waiting for a parent that does not reap (PID 1 in some containers).
    let state = 'gone';
    try {
      state = readFileSync(`/proc/${childPid}/stat`, 'utf8').split(' ')[2]!;
    } catch {
      // no such process: it was killed and reaped
    }
    assert.ok(state === 'gone' || state === 'Z', `child state ${state}`);
  });

  /** Gone, or a zombie waiting for a parent that does not reap (PID 1 in some containers). */
  const ended = (pid: number): boolean => {
    try {
      return readFileSync(`/proc/${pid}/stat`, 'utf8').split(' ')[2] === 'Z';
    } catch {
      return true; // no such process: it was killed and reaped
    }
  };
  const until = async (ok: () => boolean, ms: number): Promise<boolean> => {
    const start = Date.now();
    while (!ok()) {
      if (Date.now() - start > ms) return false;
      await new Promise((r) => setTimeout(r, 10));
    }
    return true;
  };

  it('ends what the tool left in the background when it exits, at once when it honours SIGTERM', async () => {
    const pidFile = join(tmp.dir, 'bg-pid');
    const o = await runTool({ command: sh(`sleep 30 & echo $! > "${pidFile}"; echo done`) }, base)
      .outcome;
    assert.equal(o.kind, 'exited');
    if (o.kind === 'exited') assert.equal(o.stdout, 'done\n');
    const bg = Number(readFileSync(pidFile, 'utf8'));
    // SIGTERM at the tool's exit, not SIGKILL after the grace.
    assert.ok(await until(() => ended(bg), base.killGraceMs / 2), `background child ${bg} runs on`);
  });

  it('a background child that ignores SIGTERM gets SIGKILL after the grace', async () => {
    const pidFile = join(tmp.dir, 'bg-stubborn-pid');
    const started = Date.now();
    const o = await runTool(
      // The child writes its pid once it ignores SIGTERM, and the tool exits only then:
      // a SIGTERM sent before the child's `trap` ran would end it at once.
      {
        command: sh(
          `sh -c 'trap "" TERM; echo $$ > "$0"; exec sleep 30' "${pidFile}" & ` +
            `while [ ! -s "${pidFile}" ]; do sleep 0.01; done; exit 0`,
        ),
      },
      // A grace longer than the wait for the pipes the child holds (200 ms).
      { ...base, killGraceMs: 800 },
    ).outcome;
    assert.equal(o.kind, 'exited');
    const bg = Number(readFileSync(pidFile, 'utf8'));
    assert.equal(ended(bg), false, 'still there within the grace');
    assert.ok(await until(() => ended(bg), 3_000), `background child ${bg} outlived the grace`);
    assert.ok(Date.now() - started >= 800);
  });

  it('cancels', async () => {
    const run = runTool({ command: ['sleep', '5'] }, base);
    setTimeout(() => run.cancel(), 50);
    const o = await run.outcome;
    assert.equal(o.kind, 'cancelled');
    if (o.kind === 'cancelled') assert.ok(o.durationMs >= 45 && o.durationMs < 1_000);
  });

  it('bounds stdout and stderr and says so', async () => {
    const o = await runTool(
      { command: sh('head -c 5000 /dev/zero | tr "\\0" x; echo short >&2') },
      { ...base, maxOutputBytes: 1024 },
    ).outcome;
    assert.equal(o.kind, 'exited');
    if (o.kind !== 'exited') return;
    assert.equal(o.stdout, 'x'.repeat(1024));
    assert.equal(o.stderr, 'short\n');
    assert.equal(o.truncated, true);
    assert.equal(o.exitCode, 0);
  });

  it('cuts the output on a UTF-8 character boundary, not inside a character', async () => {
    // 'é' is two bytes: a bound of 1023 falls inside the 512th.
    const o = await runTool(
      { command: sh("i=0; while [ $i -lt 600 ]; do printf '\\303\\251'; i=$((i+1)); done") },
      { ...base, maxOutputBytes: 1023 },
    ).outcome;
    assert.equal(o.kind, 'exited');
    if (o.kind !== 'exited') return;
    assert.equal(o.stdout, 'é'.repeat(511), 'no U+FFFD where the cut fell');
    assert.equal(o.truncated, true);
  });

  it('reports a command that cannot start as an error', async () => {
    const o = await runTool({ command: ['/nonexistent/tool'] }, base).outcome;
    assert.equal(o.kind, 'error');
    if (o.kind === 'error') {
      assert.equal(o.errorCode, 'spawn_failed');
      assert.match(o.errorMessage, /ENOENT/);
    }
  });

  it('leaves SWITCHYARD_TOOL_ARGS out when the arguments are too big for the environment', async () => {
    const big = { blob: 'y'.repeat(200 * 1024) };
    const o = await runTool(
      { command: sh('wc -c; echo "[${SWITCHYARD_TOOL_ARGS:-unset}]"') },
      { ...base, arguments: big },
    ).outcome;
    assert.equal(o.kind, 'exited');
    if (o.kind === 'exited') {
      assert.match(o.stdout, new RegExp(`^\\s*${JSON.stringify(big).length}\\n\\[unset\\]\\n$`));
    }
  });
});
