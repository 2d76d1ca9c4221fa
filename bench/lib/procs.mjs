/**
 * Child processes of the benchmark, pinned to CPUs with `taskset`.
 *
 * Every child is registered so that a normal exit, an error or SIGINT/SIGTERM
 * ends it: nothing the benchmark starts outlives it. Long-running children
 * (router, sim) are awaited until they print a ready line; one-shot children
 * (wrk, load clients) are bounded by a hard timeout after which they are killed.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';

/** @type {Set<import('node:child_process').ChildProcess>} */
const children = new Set();

function alive(child) {
  return child.exitCode === null && child.signalCode === null;
}

/** Synchronous last resort (process 'exit' handler): SIGKILL whatever is left. */
export function killAllNow() {
  for (const c of children) if (alive(c)) c.kill('SIGKILL');
  children.clear();
}

/** Pins this process (all its threads) to `cpu`, away from the measured process's CPU. */
export function pinSelf(cpu) {
  execFileSync('taskset', ['-a', '-cp', String(cpu), String(process.pid)], { stdio: 'ignore' });
}

/** SIGTERM, then SIGKILL after `graceMs`; resolves when the child has exited. */
export function stopProcess(child, graceMs = 5000) {
  if (!alive(child)) {
    children.delete(child);
    return Promise.resolve();
  }
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      if (alive(child)) child.kill('SIGKILL');
    }, graceMs);
    child.once('exit', () => {
      clearTimeout(timer);
      children.delete(child);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

export async function stopAll() {
  await Promise.all([...children].map((c) => stopProcess(c)));
}

let handlersInstalled = false;
/** Kills every child on exit, on SIGINT/SIGTERM and on an uncaught error. */
export function installCleanup() {
  if (handlersInstalled) return;
  handlersInstalled = true;
  process.on('exit', killAllNow);
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.on(sig, () => {
      process.stderr.write(`\nbench: ${sig}, stopping child processes\n`);
      killAllNow();
      process.exit(130);
    });
  }
}

let niceness = 0;
/**
 * Scheduling priority of every child started from now on (`nice -n`, negative
 * needs root). On a machine shared with other work this keeps neighbours from
 * taking the pinned CPUs; it does not change what the processes do.
 */
export function setNiceness(n) {
  niceness = n;
}

/** `taskset` (and `nice`) exec the command, so the child's pid is the command's own. */
function pinned(cpu, cmd, args) {
  const [file, argv] = cpu === null ? [cmd, args] : ['taskset', ['-c', String(cpu), cmd, ...args]];
  return niceness === 0 ? [file, argv] : ['nice', ['-n', String(niceness), file, ...argv]];
}

/**
 * Starts a long-running process and resolves once a stdout line matches `ready`
 * (returning the match), or rejects when it exits first or `timeoutMs` passes.
 */
export function startService({ name, cpu, cmd, args, env, ready, timeoutMs = 30_000 }) {
  const [file, argv] = pinned(cpu, cmd, args);
  const child = spawn(file, argv, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  let out = '';
  let err = '';
  return new Promise((resolve, reject) => {
    const fail = (msg) => {
      clearTimeout(timer);
      if (alive(child)) child.kill('SIGKILL');
      reject(
        new Error(
          `${name}: ${msg}\n--- stdout ---\n${out.slice(-2000)}\n--- stderr ---\n${err.slice(-2000)}`,
        ),
      );
    };
    const timer = setTimeout(() => fail(`not ready after ${timeoutMs} ms`), timeoutMs);
    child.on('error', (e) => fail(e.message));
    child.once('exit', (code, sig) => fail(`exited early (code ${code}, signal ${sig})`));
    child.stderr.on('data', (d) => {
      err = (err + d).slice(-20_000);
    });
    child.stdout.on('data', (d) => {
      out = (out + d).slice(-20_000);
      const m = ready.exec(out);
      if (m) {
        clearTimeout(timer);
        child.removeAllListeners('exit');
        child.on('exit', () => children.delete(child));
        // Keep draining the pipes so a chatty child can never block on a full pipe.
        child.stdout.removeAllListeners('data');
        child.stdout.resume();
        resolve({ child, pid: child.pid, match: m, stderrTail: () => err });
      }
    });
  });
}

/** Runs a one-shot command to completion (killed after `timeoutMs`); returns its output. */
export function runProcess({ cpu, cmd, args, env, timeoutMs }) {
  const [file, argv] = pinned(cpu, cmd, args);
  const child = spawn(file, argv, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      if (alive(child)) child.kill('SIGKILL');
    }, timeoutMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      children.delete(child);
      reject(e);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      children.delete(child);
      if (code !== 0) {
        reject(
          new Error(
            `${cmd} ${args.join(' ')} failed (code ${code}, signal ${signal})\n${stderr.slice(-3000)}`,
          ),
        );
      } else resolve({ stdout, stderr });
    });
  });
}

/** True when `cmd` can be executed. */
export function hasCommand(cmd, args = ['--version']) {
  const r = spawnSync(cmd, args, { stdio: 'ignore' });
  return !(r.error && r.error.code === 'ENOENT');
}

/** Resident set size and its peak, in MiB, from /proc/<pid>/status. */
export function memoryOf(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field) => {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status);
    return m ? Number(m[1]) : null;
  };
  const mib = (v) => (v === null ? null : Math.round((v / 1024) * 10) / 10);
  return {
    rssMiB: mib(kb('VmRSS')),
    peakRssMiB: mib(kb('VmHWM')),
    // Anonymous: the V8 heap, malloc, stacks; file-backed: the node binary and libraries.
    anonMiB: mib(kb('RssAnon')),
    fileMiB: mib(kb('RssFile')),
  };
}

const CLK_TCK = (() => {
  const r = spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' });
  const n = Number(r.stdout);
  return Number.isFinite(n) && n > 0 ? n : 100;
})();

/** Busy time of one CPU in ns, from /proc/stat (user+nice+system+irq+softirq+steal). */
function cpuBusyNs(cpu) {
  const line = readFileSync('/proc/stat', 'utf8')
    .split('\n')
    .find((l) => l.startsWith(`cpu${cpu} `));
  if (!line) return 0;
  const [user, nice, system, , , irq, softirq, steal] = line
    .trim()
    .split(/\s+/)
    .slice(1)
    .map(Number);
  return ((user + nice + system + irq + softirq + steal) * 1e9) / CLK_TCK;
}

/**
 * CPU accounting of a process pinned to `cpu`, from the scheduler: `runNs`, its
 * time on a CPU summed over its threads (/proc/<pid>/task/<tid>/schedstat);
 * `waitNs`, the time its main thread (the event loop) was runnable but waited
 * for the CPU; and the busy time of that CPU (/proc/stat). CPU time per request
 * stays meaningful when other work on a shared machine makes requests per
 * second and latency say more about the machine than about the process.
 */
export function schedOf(pid, cpu) {
  let runNs = 0;
  let waitNs = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      const [run, wait] = readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ');
      runNs += Number(run);
      if (tid === String(pid)) waitNs = Number(wait);
    } catch {
      // The thread ended between the listing and the read: its time is gone with it.
    }
  }
  return { runNs, waitNs, cpuBusyNs: cpuBusyNs(cpu), at: Number(process.hrtime.bigint()) };
}

/**
 * Between two `schedOf` samples: the process's CPU ms and share of wall time;
 * `waitShare`, the share of wall time its event loop was ready to run but
 * another thread had the CPU (contention); `othersShare`, the share of wall
 * time anything else ran on its CPU, idle time it did not want included
 * (10 ms tick resolution).
 */
export function cpuBetween(a, b) {
  const wall = b.at - a.at;
  const run = b.runNs - a.runNs;
  const others = Math.max(0, b.cpuBusyNs - a.cpuBusyNs - run);
  const share = (ns) => Math.round((ns / wall) * 1000) / 1000;
  return {
    wallMs: Math.round(wall / 1e6),
    cpuMs: Math.round(run / 1e6),
    cpuShare: share(run),
    waitShare: share(b.waitNs - a.waitNs),
    othersShare: share(others),
  };
}

/**
 * Waits (at most `maxMs`) until the process uses under 5% of a CPU over 200 ms,
 * so a phase does not start while the previous one's backlog (usage batches,
 * GC) is still being worked off.
 */
export async function waitIdle(pid, cpu, maxMs = 30_000) {
  const until = Date.now() + maxMs;
  while (Date.now() < until) {
    const a = schedOf(pid, cpu);
    await new Promise((r) => setTimeout(r, 200));
    if (cpuBetween(a, schedOf(pid, cpu)).cpuShare < 0.05) return true;
  }
  return false;
}
