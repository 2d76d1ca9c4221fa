/**
 * The time bound of one chat completion, on the injected clock: the tier's
 * deadline until the answer starts (`started`), then the idle timeout on every
 * gap (`touch` on each upstream byte; no timer churn per chunk). Either one fires
 * the abort controller once and records which (`timedOut`).
 *
 * `armIdleNow`: the chat path arms the idle timer from the start (a stream that
 * stalls before its first token is bounded by both); the tool bridge arms it only
 * once the answer streams (its tool rounds are bounded by the deadline alone).
 */
import type { Clock, Timer } from '../runtime/clock.js';

export class Deadline {
  timedOut: 'deadline' | 'idle' | null = null;
  private readonly deadlineTimer: Timer;
  private idleTimer: Timer | null = null;
  private lastActivity: number;

  constructor(
    private readonly clock: Clock,
    private readonly abort: { abort(): void },
    deadlineMs: number,
    private readonly idleMs: number | null,
    armIdleNow = true,
  ) {
    this.lastActivity = clock.now();
    this.deadlineTimer = clock.setTimer(deadlineMs, () => this.fire('deadline'));
    if (idleMs !== null && armIdleNow) this.armIdle(idleMs);
  }

  /** Called on every upstream byte. */
  touch(): void {
    this.lastActivity = this.clock.now();
  }

  /** The answer started: from now on only the idle timeout bounds it. */
  started(): void {
    this.deadlineTimer.cancel();
    if (this.idleTimer === null && this.idleMs !== null) this.armIdle(this.idleMs);
  }

  private armIdle(ms: number): void {
    this.idleTimer = this.clock.setTimer(ms, () => {
      const idle = this.clock.now() - this.lastActivity;
      if (idle >= this.idleMs!) this.fire('idle');
      else this.armIdle(this.idleMs! - idle);
    });
  }

  private fire(kind: 'deadline' | 'idle'): void {
    if (this.timedOut) return;
    this.timedOut = kind;
    this.abort.abort();
  }

  clear(): void {
    this.deadlineTimer.cancel();
    this.idleTimer?.cancel();
  }
}
