/**
 * Spawning the real `switchyard` binary (bin/switchyard.js over dist/, built by
 * `npm test` before the tests run) and reading what it prints.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { pgliteTemplatePath, TEST_PGLITE_SHARED_BUFFERS } from './pglite-template.js';

export const BIN = resolve(import.meta.dirname, '..', '..', 'bin', 'switchyard.js');

export interface Spawned {
  child: ChildProcess;
  stdout(): string;
  stderr(): string;
  /** Resolves when stdout matches, rejects when the process exits first or on timeout. */
  waitFor(re: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

/** The environment every spawned binary gets: PATH, HOME and the PGlite template when made. */
export function baseEnv(): Record<string, string> {
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? '',
    SWITCHYARD_PGLITE_SHARED_BUFFERS: TEST_PGLITE_SHARED_BUFFERS,
  };
  const template = pgliteTemplatePath();
  if (existsSync(template)) env.SWITCHYARD_PGLITE_TEMPLATE = template;
  return env;
}

export function spawnSwitchyard(args: string[], env: Record<string, string>): Spawned {
  const child = spawn(process.execPath, [BIN, ...args], {
    env: { ...baseEnv(), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  const exited = once(child, 'exit');
  return {
    child,
    stdout: () => out,
    stderr: () => err,
    waitFor(re, timeoutMs = 30_000) {
      return new Promise((resolvePromise, reject) => {
        const deadline = setTimeout(() => {
          cleanup();
          reject(new Error(`timeout waiting for ${re}\nstdout:\n${out}\nstderr:\n${err}`));
        }, timeoutMs);
        const check = () => {
          const m = out.match(re);
          if (m) {
            cleanup();
            resolvePromise(m);
          }
        };
        const onExit = () => {
          cleanup();
          reject(new Error(`process exited before ${re}\nstdout:\n${out}\nstderr:\n${err}`));
        };
        const cleanup = () => {
          clearTimeout(deadline);
          child.stdout!.off('data', check);
          child.off('exit', onExit);
        };
        child.stdout!.on('data', check);
        child.on('exit', onExit);
        check();
      });
    },
    async stop(signal = 'SIGTERM') {
      if (child.exitCode !== null) return child.exitCode;
      child.kill(signal);
      const [code] = (await exited) as [number | null];
      return code;
    },
  };
}

/** Runs the binary to completion. */
export async function runSwitchyard(
  args: string[],
  env: Record<string, string>,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const p = spawnSwitchyard(args, env);
  const [code] = (await once(p.child, 'exit')) as [number | null];
  return { code, stdout: p.stdout(), stderr: p.stderr() };
}
