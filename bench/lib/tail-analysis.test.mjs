import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  attributeWindows,
  joinRequests,
  legsOf,
  parseSched,
  segments,
  slowest,
  summarize,
  threadTimeline,
  timeIn,
} from './tail-analysis.mjs';

const MS = 1e6;

describe('tail analysis: requests', () => {
  it('joins client, upstream and router stamps and splits the legs', () => {
    const client = [
      [0, '1000000000', '1000100000', '1004000000', 200],
      [1, '1001000000', '1001000000', '1002000000', 500], // failed: left out
      [2, '1002000000', '1002000000', '1003000000', 200], // the upstream never saw it
    ];
    const upstream = new Map([
      [0, ['1002000000', '1002500000']],
      [1, ['1001100000', '1001200000']],
    ]);
    const router = new Map([
      [0, ['1001000000', '1001200000', '1001300000', '1003000000', '1003500000']],
    ]);
    const reqs = joinRequests(client, upstream, router);
    assert.equal(reqs.length, 1);
    const { legs, inside } = legsOf(reqs[0]);
    assert.deepEqual(legs, { total: 4, lag: 0.1, inbound: 1.9, upstream: 0.5, outbound: 1.5 });
    assert.deepEqual(inside, {
      toRouter: 0.9,
      inRouter: 0.2,
      toSocket: 0.1,
      toUpstream: 0.7,
      back: 0.5,
      outRouter: 0.5,
      toClient: 0.5,
    });
  });

  it('has no inside split without the router stamps', () => {
    const reqs = joinRequests([[0, 0, 0, 10, 200]], new Map([[0, [1, 2]]]));
    assert.equal(legsOf(reqs[0]).inside, null);
  });

  it('takes the slowest 1 % by total latency and summarises them', () => {
    const reqs = Array.from({ length: 200 }, (_, i) => ({
      seed: i,
      due: i * MS,
      sent: i * MS,
      arrived: i * MS + 0.1 * MS,
      answered: i * MS + 0.2 * MS,
      // Requests 50 to 52 are the slow ones: 9 ms (the 99th percentile is the 198th).
      done: i * MS + (i >= 50 && i <= 52 ? 9 : 1) * MS,
    }));
    assert.deepEqual(
      slowest(reqs).map((r) => r.seed),
      [50, 51],
    );
    // A collection from 50.5 to 52.5 ms overlaps requests 50 and 51 (due at 50 and 51 ms).
    const s = summarize(reqs, [{ kind: 'major', start: 50.5 * MS, ms: 2 }]);
    assert.equal(s.n, 200);
    assert.equal(s.p50, 1);
    assert.equal(s.p99, 9);
    assert.equal(s.slowMean.outbound, 8.8);
    assert.deepEqual(s.slowAt, [50, 51]);
    assert.equal(s.slowDuringGc, 2);
  });
});

const SCHED = `
[000]  100.000000: sched:sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=node next_pid=42 next_prio=120
[000]  100.001000: sched:sched_switch: prev_comm=node prev_pid=42 prev_prio=120 prev_state=R ==> next_comm=tokio-rt-worker next_pid=75 next_prio=120
[000]  100.004000: sched:sched_switch: prev_comm=tokio-rt-worker prev_pid=75 prev_prio=120 prev_state=S ==> next_comm=node next_pid=42 next_prio=120
[000]  100.005000: sched:sched_switch: prev_comm=node prev_pid=42 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
[001]  100.006000: sched:sched_wakeup: comm=node pid=42 prio=120 target_cpu=000
[000]  100.006500: sched:sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=node next_pid=42 next_prio=120
`;

describe('tail analysis: the scheduler', () => {
  const sched = parseSched(SCHED);

  it('parses switches and wake-ups on the stamps clock', () => {
    assert.equal(sched.switches.length, 5);
    assert.deepEqual(sched.wakeups, [{ t: 100_006_000_000, pid: 42 }]);
    assert.equal(sched.switches[1].next, 'tokio-rt-worker:75');
  });

  it("follows one thread's state and cuts timelines into windows", () => {
    assert.deepEqual(threadTimeline(sched, 42), [
      [100_000_000_000, 'running'],
      [100_001_000_000, 'runnable'],
      [100_004_000_000, 'running'],
      [100_005_000_000, 'sleeping'],
      [100_006_000_000, 'runnable'],
      [100_006_500_000, 'running'],
    ]);
    const tl = [
      [10, 'a'],
      [20, 'b'],
    ];
    assert.deepEqual(segments(tl, 5, 25), [
      [5, 10, 'sleeping'],
      [10, 20, 'a'],
      [20, 25, 'b'],
    ]);
    assert.deepEqual(timeIn(tl, 15, 30), { a: 5, b: 10 });
  });

  it('blames the window on whoever held the CPU while the router wanted it', () => {
    // Sent at 100.0005 s, parsed by the router at 100.0045 s: 0.5 ms running,
    // 3 ms runnable behind tokio, 0.5 ms running again.
    const slow = [{ sent: 100_000_500_000, routerArrive: 100_004_500_000 }];
    const a = attributeWindows(slow, sched, 42, 0);
    assert.equal(a.n, 1);
    assert.deepEqual(a.meanMs, { running: 1, runnable: 3, sleeping: 0 });
    assert.deepEqual(a.dominant, { runnable: 1 });
    assert.deepEqual(a.occupantsMs, [['tokio-rt-worker:75', 3]]);
  });
});
