/**
 * Waiting on real processes, which move in real time: polls a condition every
 * few milliseconds up to a deadline. (A fake-clock test waits with inference.ts's
 * until(), which only turns the event loop.)
 */
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Calls `check` every `every` ms until it returns a value (not undefined): that
 * value, and how long it took. Fails the test with `what` (a string, or a function
 * that describes the last state seen) once `ms` have passed.
 */
export async function pollUntil<T>(
  what: string | (() => string),
  check: () => Promise<T | undefined> | T | undefined,
  ms: number,
  every = 50,
): Promise<{ value: T; after: number }> {
  const t0 = Date.now();
  for (;;) {
    const v = await check();
    if (v !== undefined) return { value: v, after: Date.now() - t0 };
    if (Date.now() - t0 > ms) {
      assert.fail(`${typeof what === 'string' ? what : what()}: not within ${ms} ms`);
    }
    await sleep(every);
  }
}
