/**
 * The arithmetic of bench/tail.mjs, pure functions over plain data (tested in
 * tail-analysis.test.mjs). Every time is in nanoseconds of the machine's
 * monotonic clock as a Number (values near 10^12 to 10^13 are exact in a double).
 *
 * A request's stamps: `due`, `sent`, `done` from the client; `arrived`, `answered`
 * from the upstream; when the router's stamps are known (lib/router-stamps.mjs), its
 * `routerArrive` (headers parsed), `create` (upstream request created), `socket`
 * (written to the upstream socket), `headers` (upstream response headers) and
 * `finish` (its response finished).
 */

import { percentile } from './stats.mjs';

const ms = (ns) => ns / 1e6;

/**
 * Joins the client's rows ([seed, due, sent, done, status]), the upstream's stamps
 * (Map seed → [arrived, answered]) and the router's (Map seed → [arrive, create,
 * socket, headers, finish], or null). Requests that failed or that the upstream did
 * not see are left out.
 */
export function joinRequests(clientRows, upstream, router = null) {
  const out = [];
  for (const [seed, due, sent, done, status] of clientRows) {
    const u = upstream.get(seed);
    if (status !== 200 || !u) continue;
    const r = router?.get(seed);
    const req = {
      seed,
      due: Number(due),
      sent: Number(sent),
      done: Number(done),
      arrived: Number(u[0]),
      answered: Number(u[1]),
    };
    if (r && r.every((x) => x !== null && x !== undefined)) {
      [req.routerArrive, req.create, req.socket, req.headers, req.finish] = r.map(Number);
    }
    out.push(req);
  }
  return out;
}

/** The legs of one request in ms (see bench/tail.mjs); the router's split when known. */
export function legsOf(r) {
  const legs = {
    total: ms(r.done - r.due),
    lag: ms(r.sent - r.due),
    inbound: ms(r.arrived - r.sent),
    upstream: ms(r.answered - r.arrived),
    outbound: ms(r.done - r.answered),
  };
  if (r.routerArrive === undefined) return { legs, inside: null };
  return {
    legs,
    inside: {
      toRouter: ms(r.routerArrive - r.sent),
      inRouter: ms(r.create - r.routerArrive),
      toSocket: ms(r.socket - r.create),
      toUpstream: ms(r.arrived - r.socket),
      back: ms(r.headers - r.answered),
      outRouter: ms(r.finish - r.headers),
      toClient: ms(r.done - r.finish),
    },
  };
}

/** The requests at or above the `p`th percentile of total latency, slowest first. */
export function slowest(requests, p = 99) {
  const sorted = [...requests].sort((a, b) => b.done - b.due - (a.done - a.due));
  return sorted.slice(0, Math.max(1, Math.ceil(((100 - p) / 100) * sorted.length)));
}

function medians(objs) {
  const keys = Object.keys(objs[0]);
  return Object.fromEntries(
    keys.map((k) => [
      k,
      percentile(
        objs.map((o) => o[k]).sort((a, b) => a - b),
        50,
      ),
    ]),
  );
}

function means(objs) {
  const keys = Object.keys(objs[0]);
  return Object.fromEntries(keys.map((k) => [k, objs.reduce((n, o) => n + o[k], 0) / objs.length]));
}

/**
 * p50, p99, the median of each leg over all requests and its mean over the slowest
 * 1 %, and the same for the router's inside split when every request has one.
 * `gcs` ([{kind, start, ms}]) adds how many of the slowest overlapped a collection.
 */
export function summarize(requests, gcs = null) {
  const all = requests.map(legsOf);
  const totals = all.map((x) => x.legs.total).sort((a, b) => a - b);
  const slow = slowest(requests);
  const slowLegs = slow.map(legsOf);
  const s = {
    n: requests.length,
    p50: percentile(totals, 50),
    p99: percentile(totals, 99),
    median: medians(all.map((x) => x.legs)),
    slowMean: means(slowLegs.map((x) => x.legs)),
    slowAt: slow.map((r) => Math.round(ms(r.due - requests[0].due))).sort((a, b) => a - b),
    insideMedian: null,
    insideSlowMean: null,
    slowDuringGc: null,
  };
  if (all.every((x) => x.inside)) {
    s.insideMedian = medians(all.map((x) => x.inside));
    s.insideSlowMean = means(slowLegs.map((x) => x.inside));
  }
  if (gcs) {
    s.slowDuringGc = slow.filter((r) =>
      gcs.some((g) => g.start < r.done && g.start + g.ms * 1e6 > r.due),
    ).length;
  }
  return s;
}

// ---------------------------------------------------------------------------------------
// The scheduler's view (perf sched_switch / sched_wakeup, system-wide)

const SWITCH =
  /^\s*\[(\d+)\]\s+([\d.]+): sched:sched_switch: prev_comm=(.*?) prev_pid=(\d+) prev_prio=-?\d+ prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)/;
const WAKEUP = /^\s*\[(\d+)\]\s+([\d.]+): sched:sched_wakeup: comm=(.*?) pid=(\d+)/;

/**
 * Parses `perf script -F cpu,time,event,trace` of sched_switch and sched_wakeup
 * (recorded with `-k CLOCK_MONOTONIC`, so its seconds are the stamps' clock).
 */
export function parseSched(text) {
  const switches = [];
  const wakeups = [];
  for (const line of text.split('\n')) {
    let m = SWITCH.exec(line);
    if (m) {
      switches.push({
        cpu: Number(m[1]),
        t: Math.round(Number(m[2]) * 1e9),
        prevPid: Number(m[4]),
        prevState: m[5],
        next: `${m[6]}:${m[7]}`,
        nextPid: Number(m[7]),
      });
      continue;
    }
    m = WAKEUP.exec(line);
    if (m) wakeups.push({ t: Math.round(Number(m[2]) * 1e9), pid: Number(m[4]) });
  }
  return { switches, wakeups };
}

/** [[t, state]] of one thread: 'running', 'runnable' (wants a CPU) or 'sleeping'. */
export function threadTimeline(sched, tid) {
  const events = [];
  for (const s of sched.switches) {
    if (s.prevPid === tid) {
      events.push([s.t, s.prevState.startsWith('R') ? 'runnable' : 'sleeping']);
    }
    if (s.nextPid === tid) events.push([s.t, 'running']);
  }
  for (const w of sched.wakeups) if (w.pid === tid) events.push([w.t, 'wake']);
  events.sort((a, b) => a[0] - b[0]);
  const out = [];
  let state = 'sleeping';
  for (const [t, e] of events) {
    // A wake-up of a thread already running or runnable changes nothing.
    const next = e === 'wake' ? (state === 'sleeping' ? 'runnable' : state) : e;
    if (next !== state) out.push([t, next]);
    state = next;
  }
  return out;
}

/** [[t, task]] of what ran on `cpu` ('comm:pid'; the idle task is 'swapper/N:0'). */
export function cpuTimeline(sched, cpu) {
  return sched.switches.filter((s) => s.cpu === cpu).map((s) => [s.t, s.next]);
}

/** The pieces of a step timeline between a and b: [[start, end, value]]. */
export function segments(timeline, a, b, before = 'sleeping') {
  let lo = 0;
  let hi = timeline.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (timeline[mid][0] <= a) lo = mid + 1;
    else hi = mid;
  }
  const out = [];
  let value = lo > 0 ? timeline[lo - 1][1] : before;
  let t = a;
  for (let i = lo; i < timeline.length && timeline[i][0] < b; i++) {
    if (timeline[i][0] > t) out.push([t, timeline[i][0], value]);
    t = timeline[i][0];
    value = timeline[i][1];
  }
  if (b > t) out.push([t, b, value]);
  return out;
}

/** Time spent in each value of a step timeline between a and b: {value: ns}. */
export function timeIn(timeline, a, b, before = 'sleeping') {
  const out = {};
  for (const [s, e, v] of segments(timeline, a, b, before)) out[v] = (out[v] ?? 0) + (e - s);
  return out;
}

/**
 * For each of the slowest requests, the window from the client's send to the
 * router's parse of it: what the router's main thread did in it (running other
 * work, runnable while something else held its CPU, or sleeping: the request was
 * not there yet) and who held the router's CPU meanwhile.
 */
export function attributeWindows(slow, sched, routerPid, routerCpu) {
  const main = threadTimeline(sched, routerPid);
  const cpu = cpuTimeline(sched, routerCpu);
  const state = { running: 0, runnable: 0, sleeping: 0 };
  const dominant = {};
  const occupants = {};
  let n = 0;
  for (const r of slow) {
    if (r.routerArrive === undefined) continue;
    n++;
    const s = timeIn(main, r.sent, r.routerArrive);
    for (const k of Object.keys(state)) state[k] += s[k] ?? 0;
    const top = Object.keys(state).reduce((a, b) => ((s[a] ?? 0) >= (s[b] ?? 0) ? a : b));
    dominant[top] = (dominant[top] ?? 0) + 1;
    // Only the time the main thread wanted its CPU counts against the CPU's occupants.
    for (const [a, b, v] of segments(main, r.sent, r.routerArrive)) {
      if (v !== 'runnable') continue;
      for (const [task, ns] of Object.entries(timeIn(cpu, a, b, '?'))) {
        occupants[task] = (occupants[task] ?? 0) + ns;
      }
    }
  }
  return {
    n,
    meanMs: Object.fromEntries(Object.entries(state).map(([k, v]) => [k, n ? ms(v) / n : 0])),
    dominant,
    occupantsMs: Object.entries(occupants)
      .map(([task, ns]) => [task, ms(ns)])
      .sort((a, b) => b[1] - a[1]),
  };
}
