/**
 * A worker's graceful drain (`switchyard worker` on SIGTERM):
 *
 * 1. tell the router it is draining (registered workers: `POST
 *    /admin/v1/workers/{id}/drain`), so no router picks it for new requests;
 * 2. stop accepting connections (idle keep-alive sockets close; a request that a
 *    router had already sent on a busy one is still served);
 * 3. wait until every open HTTP request has finished, or the drain deadline
 *    (`--drain-ms`, default 30 s) has passed;
 * 4. deregister and close, cutting whatever is still open: the router ends
 *    those streams with the `cancelled` SSE error, as for any worker that dies.
 *
 * A second SIGTERM or SIGINT skips the wait. The wait runs on the injected clock.
 */
import type { Server } from 'node:http';
import type { Clock } from '../runtime/clock.js';

/** The worker's open HTTP requests, counted from arrival to the response's close. */
export class InFlight {
  private n = 0;
  private waiters: Array<() => void> = [];

  /** Counts every request `server` receives from now on. */
  track(server: Server): void {
    server.on('request', (_req, res) => {
      this.n++;
      // `close` fires once the response is done or its connection ended, whichever first.
      res.once('close', () => this.leave());
    });
  }

  get count(): number {
    return this.n;
  }

  /** Resolves as soon as no request is open (at once if none is). */
  idle(): Promise<void> {
    if (this.n === 0) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  private leave(): void {
    this.n = Math.max(0, this.n - 1);
    if (this.n > 0) return;
    const w = this.waiters;
    this.waiters = [];
    for (const resolve of w) resolve();
  }
}

export type DrainOutcome = 'idle' | 'deadline' | 'interrupted';

/**
 * Waits for `inFlight` to reach zero, at most `deadlineMs` by `clock`, or until
 * `interrupt` resolves (a second signal). Says which came first.
 */
export async function waitForDrain(o: {
  inFlight: InFlight;
  clock: Clock;
  deadlineMs: number;
  interrupt?: Promise<void>;
}): Promise<DrainOutcome> {
  let timer: { cancel(): void } | undefined;
  const deadline = new Promise<DrainOutcome>((resolve) => {
    timer = o.clock.setTimer(o.deadlineMs, () => resolve('deadline'));
  });
  const racers: Array<Promise<DrainOutcome>> = [
    o.inFlight.idle().then(() => 'idle' as const),
    deadline,
  ];
  if (o.interrupt) racers.push(o.interrupt.then(() => 'interrupted' as const));
  try {
    return await Promise.race(racers);
  } finally {
    timer?.cancel();
  }
}
