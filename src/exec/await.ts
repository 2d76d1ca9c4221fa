/**
 * Waiting for an invocation to settle, for callers that run a tool and need its
 * outcome in the same request (the chat-completions tool bridge, the MCP
 * server). The record is re-read after every committed exec change in this
 * process (`ExecService.onChange`) and, as a backstop for changes made by
 * another router instance, every `pollMs` on the injected clock. Waiting never
 * changes the invocation; the caller decides what to do when it gives up.
 */
import type { PublicInvocation } from './invocations.js';
import type { ExecService } from './service.js';

export interface AwaitOptions {
  /** Stops waiting (the caller's request ended); resolves with the current record. */
  signal?: AbortSignal;
  /** Also stop once the invocation reaches one of these non-terminal states. */
  until?: readonly string[];
  /** Backstop re-read period. */
  pollMs?: number;
}

const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

export function isSettled(inv: PublicInvocation, until: readonly string[] = []): boolean {
  return TERMINAL.has(inv.status) || until.includes(inv.status);
}

/**
 * Resolves with the invocation once it is terminal (or in a state of `until`),
 * or with its current record when `signal` aborts.
 */
export async function awaitInvocation(
  exec: ExecService,
  projectId: string,
  invocationId: string,
  opts: AwaitOptions = {},
): Promise<PublicInvocation> {
  const pollMs = opts.pollMs ?? 250;
  let wake: (() => void) | null = null;
  let dirty = false;
  const poke = () => {
    dirty = true;
    wake?.();
  };
  // Subscribe before the first read so a change in between is not missed.
  const off = exec.onChange(poke);
  opts.signal?.addEventListener('abort', poke);
  try {
    for (;;) {
      dirty = false;
      const inv = await exec.invocations.get(projectId, invocationId);
      if (isSettled(inv, opts.until) || opts.signal?.aborted) return inv;
      if (dirty) continue;
      await new Promise<void>((resolve) => {
        const timer = exec.ctx.clock.setTimer(pollMs, () => resolve());
        wake = () => {
          timer.cancel();
          resolve();
        };
      });
      wake = null;
    }
  } finally {
    off();
    opts.signal?.removeEventListener('abort', poke);
  }
}
