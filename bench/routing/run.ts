/**
 * bench/routing: a discrete-event simulation of the router's worker choice (not HTTP)
 * over simulated heterogeneous workers, every policy replaying the same arrival
 * traces, several seeds. See docs/BENCHMARKS.md, "Routing".
 *
 *   node --import tsx bench/routing/run.ts [--seeds=5] [--duration=180] [--quick]
 *
 * Workers: w0, w1, w3 at speed 1, w2 1.5× slower, w3 killed at 40 % of the run (its
 * requests without a first token fail over at once; streaming ones fail).
 * Prints markdown tables and writes bench/results/routing-<timestamp>.json.
 *
 * Analysis flags (the default output is unchanged without them):
 *   --tail=switchyard[,"sglang cache-aware"]  classify each seed's top 1 % of TTFT (cold
 *     first request of a tenant, warm but queued, evicted, re-homed after the kill,
 *     failover, …) from sim-side traces; TAIL_ROWS=1 prints every tail request with the
 *     TTFT it would have had on each worker, TAIL_LIMIT=ms the count threshold (754).
 *   --oracle=1000[,…]  add "oracle" policies that read the simulated workers' exact queues
 *     and caches (not routers): greedy, and greedy with a hopeless rule at each target.
 *   --gate=G[,local|fifo][,steal[:F]]  experiment: Switchyard holds requests at the router
 *     until a worker has fewer than G without a first token; one queue served shortest
 *     prefill first (or `fifo`), or with `local` the worker chosen on arrival and each
 *     worker's router queue served shortest first; `steal` lets a free worker with an
 *     empty queue take the request cheapest on it from another's queue (at most F × its
 *     cost there). Not in the live router (docs/BENCHMARKS.md).
 *   --priority=RULE[,tier:X][,follow][,deadline:D]  experiment: every simulated worker
 *     orders its queues as vLLM's `--scheduling-policy priority` does (sim.ts), and
 *     Switchyard sends a priority per request (policies.ts, `PriorityRule`). RULE is
 *     `eft` (arrival + the estimated own prefill), `eft:K` (arrival + K × it), `sjf` (the
 *     estimate alone), `lst[:K]` (arrival − K × it, least slack first; `deadline:D` adds
 *     the request's X-SLO-TTFT-Ms, or D ms without one; `lst:0` is deadline first), or
 *     `hit[:K]` (two classes in arrival order: requests predicted to hit more than
 *     1 − 1/K of their prompt, K = 2 by default, before the others), or
 *     `classes[:MS]` (the live router's rule, src/routing/prefill-order.ts: `hit` with
 *     `follow` as integer priorities, arrival plus MS when cold, 500 by default), or
 *     `none` (ordered queues, no priority sent: prints the same as no flag). `tier:X`:
 *     service_tier `priority` sorts X ms earlier, `flex` X ms later; `follow`: a request
 *     whose predicted hit another request still has to prefill sorts no earlier than
 *     that one. The baselines send no priority: their rows are the same with or without.
 *   --hedge=D[,x:K][,gain:G]  experiment: hedged requests for Switchyard (HEDGE below): a
 *     request without a first token max(D, K × predicted TTFT) ms after dispatch is sent
 *     to a second worker too; the first to start streaming wins, the other is closed.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import type { ScoreConstants } from '../../src/routing/score.js';
import {
  allPolicies,
  Oracle,
  SCRAPE_MS,
  Switchyard,
  type Attempt,
  type Policy,
  type PriorityRule,
  type RouterView,
} from './policies.js';
import { EventQueue, SimWorker, type Job, type WorkerMetrics, type WorkerSpec } from './sim.js';
import { makeWorkload, WORKLOADS, type TraceRequest, type Workload } from './workloads.js';

const BASE: Omit<WorkerSpec, 'id' | 'slowdown'> = {
  maxRunning: 128,
  kvCacheTokens: 100_000,
  blockSize: 16,
  ttftMs: 15,
  prefillMsPerToken: 0.15,
  tpotMs: 20,
  batchSlope: 0.005,
};
const WORKERS: WorkerSpec[] = [
  { ...BASE, id: 'w0', slowdown: 1 },
  { ...BASE, id: 'w1', slowdown: 1 },
  { ...BASE, id: 'w2', slowdown: 1.5 },
  { ...BASE, id: 'w3', slowdown: 1 },
];
const KILLED = 'w3';
const KILL_AT = 0.4;

type Tier = 'priority' | 'default' | 'flex';

interface Result {
  id: number;
  tier: Tier;
  ttftMs?: number;
  tpotMs?: number;
  outTokens: number;
  status: 'ok' | 'failed' | 'rejected';
  good: boolean;
  trace?: Trace;
}

/** Per-request detail for --tail (the last attempt of the request). */
interface Trace {
  at: number;
  worker: string;
  failover: boolean;
  promptTokens: number;
  cached: number;
  predictedCached: number | undefined;
  /** Dispatch → admission (KV or slots), admission → prefill start, own prefill, ms. */
  admitWait: number;
  queueWait: number;
  prefillMs: number;
  /** Trace only: TTFT on each alive worker had nothing else arrived (sim internals). */
  would: Record<string, number>;
  /** The policy's predicted TTFT, when it has one. */
  predictedTtft: number | undefined;
  /** Most leading blocks × 16 any other alive worker held at dispatch. */
  cachedElsewhere: number;
  /** The tenant's prefix was sent to this worker before (so a cold start here is an eviction). */
  seenHere: boolean;
  /** No earlier request of the tenant (first of its prefix in the run). */
  tenantFirst: boolean;
  /** Before the kill, the tenant had only been sent to the killed worker. */
  onlyOnKilled: boolean;
}

interface RunStats {
  results: Result[];
  promptTokens: number;
  cachedTokens: number;
  endMs: number;
  chosen: Record<string, number>;
}

/**
 * Experiment (--gate=G[,fifo]): Switchyard's policies hold requests in a router queue
 * and send one to a worker only while it has fewer than G requests without a first
 * token; the queue is served shortest own prefill first (read exactly from the
 * simulated worker, an upper bound of what the prefix index could predict), or in
 * arrival order with `fifo`. Not a router the live code has.
 */
let GATE = 0;
let GATE_FIFO = false;
/** `local`: the worker is chosen on arrival; each worker's router queue is ordered. */
let GATE_LOCAL = false;
/** `local,steal`: a worker free with an empty router queue takes a request from another's. */
let GATE_STEAL = false;
/** `local,steal:F`: only a request whose prefill there costs at most F × its home cost. */
let STEAL_FACTOR = Infinity;

/**
 * Experiment (--hedge=D[,x:K][,gain:G]): a Switchyard request still without a first token
 * max(D, K × its predicted TTFT) ms after dispatch is sent once more, to the worker the
 * policy picks among the others (a hedged request, "The Tail at Scale"); the first
 * attempt to produce a first token wins and the router closes the other
 * (`SimWorker.cancel`). With gain:G the second attempt is sent only if its predicted TTFT
 * is below G × the first attempt's remaining predicted TTFT (at least the time since
 * the prediction was due).
 */
let HEDGE: { delayMs: number; k: number; gain: number } | undefined;

interface Race {
  won: boolean;
  legs: Array<{ job: Job; workerId: string; attempt: Attempt }>;
}

/** --priority: workers order their queues by vLLM priority; Switchyard's rule, if any. */
let PRIORITY_ORDER = false;
let PRIORITY_RULE: PriorityRule | undefined;

/**
 * Parses `classes` (the live router's rule), or `eft`, `eft:K`, `sjf`, `sjf:K`, `lst`, `lst:K`,
 * `hit`, `hit:K` or `none`, then optionally
 * `,tier:X`, `,follow`, `,deadline:D`.
 */
function parsePriority(spec: string): PriorityRule | undefined {
  const [rule = '', ...rest] = spec.split(',').map((x) => x.trim());
  const [order, k] = rule.split(':');
  let tierMs = 0;
  let follow = false;
  let deadlineMs = 0;
  for (const r of rest) {
    const [key, v] = r.split(':');
    if (key === 'follow' && v === undefined) follow = true;
    else if (key === 'tier' && Number.isFinite(Number(v))) tierMs = Number(v);
    else if (key === 'deadline' && Number(v) >= 0) deadlineMs = Number(v);
    else throw new Error(`--priority: ${r}?`);
  }
  if (order === 'none') return undefined;
  if (order === 'classes' && rest.length === 0) {
    // classes:MS sets the cold offset (default: PrefillOrder's).
    return { order, k: k === undefined ? 0 : Number(k), tierMs: 0, follow: true, deadlineMs: 0 };
  }
  if (order !== 'eft' && order !== 'sjf' && order !== 'lst' && order !== 'hit') {
    throw new Error(`--priority: ${rule}?`);
  }
  const weight = k === undefined ? (order === 'hit' ? 2 : 1) : Number(k);
  // lst:0 is earliest deadline first (the deadline alone).
  if (!(weight > 0 || (order === 'lst' && weight === 0))) throw new Error(`--priority: ${rule}?`);
  return { order, k: weight, tierMs, follow, deadlineMs };
}

function simulate(w: Workload, policy: Policy, trace = false): RunStats {
  const seenOn = new Map<string, Set<number>>();
  const tenantOf = (req: TraceRequest): number => req.blockKeys[4] ?? req.blockKeys[0] ?? -1;
  const ev = new EventQueue();
  const workers = new Map(
    WORKERS.map((s) => [s.id, new SimWorker(s, ev, { priorityOrder: PRIORITY_ORDER })]),
  );
  let alive = WORKERS.map((s) => s.id);
  const inFlight = new Map<string, number>();
  const scraped = new Map<string, WorkerMetrics>();
  const chosen: Record<string, number> = {};
  const results: Result[] = [];
  let endMs = 0;
  const view: RouterView = {
    get alive() {
      return alive;
    },
    get now() {
      return ev.now;
    },
    inFlight: (id) => inFlight.get(id) ?? 0,
    scraped: (id) => scraped.get(id),
    kvCacheTokens: (id) => workers.get(id)!.spec.kvCacheTokens,
    exact: (id, req) => {
      const wk = workers.get(id)!;
      return {
        ttft: wk.wouldTake(req.promptTokens, req.blockKeys),
        work: wk.ownPrefill(req.promptTokens, req.blockKeys),
      };
    },
  };
  // Requests on the killed worker that had not started, with their attempt.
  const attempts = new Map<
    Job,
    { req: TraceRequest; attempt: Attempt; tried: Set<string>; race?: Race }
  >();

  const scrape = (): void => {
    for (const [id, wk] of workers) if (wk.alive) scraped.set(id, wk.metrics());
    if (ev.now < w.durationMs * 1.5 || attempts.size > 0) ev.at(ev.now + SCRAPE_MS, scrape);
  };
  scrape();

  const done = (r: Result): void => {
    results.push(r);
    endMs = Math.max(endMs, ev.now);
  };

  const gate = GATE > 0 && policy.name.startsWith('switchyard') ? GATE : 0;
  const prefilling = new Map<string, number>();
  const held: Array<{ req: TraceRequest; tried: Set<string> }> = [];
  const pump = (): void => {
    for (;;) {
      const free = alive.filter((id) => (prefilling.get(id) ?? 0) < gate);
      if (free.length === 0 || held.length === 0) return;
      let bi = -1;
      let best = Infinity;
      for (let i = 0; i < held.length; i++) {
        const h = held[i]!;
        const ok = free.filter((id) => !h.tried.has(id));
        if (ok.length === 0) continue;
        if (GATE_FIFO) {
          bi = i;
          break;
        }
        for (const id of ok) {
          const c = workers.get(id)!.ownPrefill(h.req.promptTokens, h.req.blockKeys);
          if (c < best) {
            best = c;
            bi = i;
          }
        }
      }
      if (bi < 0) return;
      const h = held.splice(bi, 1)[0]!;
      const exclude = new Set([...h.tried, ...alive.filter((id) => !free.includes(id))]);
      dispatchNow(h.req, h.tried, exclude);
    }
  };

  const localQ = new Map<string, Job[]>();
  /**
   * `steal`: worker `id` is free and its queue empty: it takes, from the other workers'
   * router queues, the request whose prefill would be cheapest on it (within
   * STEAL_FACTOR of its cost at home). The request's attempt is re-made for `id`.
   */
  const steal = (id: string): boolean => {
    const wk = workers.get(id)!;
    let best: { from: string; i: number; cost: number } | undefined;
    for (const [from, q] of localQ) {
      if (from === id) continue;
      const home = workers.get(from)!;
      for (let i = 0; i < q.length; i++) {
        const j = q[i]!;
        const cost = wk.ownPrefill(j.promptTokens, j.blockKeys);
        if (cost > STEAL_FACTOR * home.ownPrefill(j.promptTokens, j.blockKeys)) continue;
        if (!best || cost < best.cost) best = { from, i, cost };
      }
    }
    if (!best) return false;
    const job = localQ.get(best.from)!.splice(best.i, 1)[0]!;
    const a = attempts.get(job)!;
    attempts.delete(job);
    inFlight.set(best.from, inFlight.get(best.from)! - 1);
    a.attempt.fail?.();
    const others = new Set(alive.filter((x) => x !== id));
    dispatchNow(a.req, a.tried, others);
    return true;
  };

  const pumpLocal = (id: string): void => {
    const q = localQ.get(id);
    const wk = workers.get(id)!;
    if (GATE_STEAL && (!q || q.length === 0) && (prefilling.get(id) ?? 0) < gate && wk.alive) {
      if (steal(id)) return; // dispatchNow pumped `id` with the stolen request
    }
    while (q && q.length > 0 && (prefilling.get(id) ?? 0) < gate && wk.alive) {
      let bi = 0;
      let best = Infinity;
      for (let i = 0; i < q.length; i++) {
        const c = wk.ownPrefill(q[i]!.promptTokens, q[i]!.blockKeys);
        if (c < best) {
          best = c;
          bi = i;
        }
      }
      const job = q.splice(bi, 1)[0]!;
      prefilling.set(id, (prefilling.get(id) ?? 0) + 1);
      wk.submit(job);
    }
  };

  const dispatch = (req: TraceRequest, tried: Set<string>): void => {
    if (gate === 0 || GATE_LOCAL) {
      dispatchNow(req, tried, tried);
      return;
    }
    held.push({ req, tried });
    pump();
  };

  const hedging = HEDGE !== undefined && policy.name.startsWith('switchyard');
  const dispatchNow = (
    req: TraceRequest,
    tried: Set<string>,
    exclude: Set<string>,
    race?: Race,
  ): void => {
    const tier: Tier = req.tier === 'priority' || req.tier === 'flex' ? req.tier : 'default';
    const attempt = policy.choose(req, view, exclude);
    if (!attempt) {
      if (!race) done({ id: req.id, tier, outTokens: 0, status: 'rejected', good: false });
      return;
    }
    const id = attempt.workerId;
    let tr: Trace | undefined;
    if (trace) {
      const tenant = tenantOf(req);
      let elsewhere = 0;
      let anywhere = false;
      let other = false;
      for (const [wid, wk] of workers) {
        const seen = seenOn.get(wid)?.has(tenant) ?? false;
        anywhere ||= seen;
        if (seen && wid !== KILLED) other = true;
        if (wid !== id && alive.includes(wid)) {
          elsewhere = Math.max(elsewhere, wk.cachedBlocks(req.blockKeys) * 16);
        }
      }
      tr = {
        at: req.at,
        worker: id,
        failover: tried.size > 0,
        promptTokens: req.promptTokens,
        cached: 0,
        predictedCached: attempt.predictedCachedTokens,
        predictedTtft: attempt.predictedTtftMs,
        would: Object.fromEntries(
          alive.map((wid) => [wid, workers.get(wid)!.wouldTake(req.promptTokens, req.blockKeys)]),
        ),
        admitWait: 0,
        queueWait: 0,
        prefillMs: 0,
        cachedElsewhere: elsewhere,
        seenHere: seenOn.get(id)?.has(tenant) ?? false,
        tenantFirst: !anywhere,
        onlyOnKilled: anywhere && !other,
      };
      const set = seenOn.get(id) ?? new Set<number>();
      set.add(tenant);
      seenOn.set(id, set);
    }
    const dispatchedAt = ev.now;
    chosen[id] = (chosen[id] ?? 0) + 1;
    inFlight.set(id, (inFlight.get(id) ?? 0) + 1);
    if (gate > 0 && !GATE_LOCAL) prefilling.set(id, (prefilling.get(id) ?? 0) + 1);
    let ttftMs = 0;
    let cached = 0;
    const job: Job = {
      promptTokens: req.promptTokens,
      blockKeys: req.blockKeys,
      outTokens: req.outTokens,
      cached: 0,
      tail: 0,
      started: false,
      seq: 0,
      ...(attempt.priority !== undefined ? { priority: attempt.priority } : {}),
      onFirstToken: (now, c) => {
        if (race) {
          race.won = true;
          for (const leg of race.legs) {
            if (leg.job === job) continue;
            workers.get(leg.workerId)!.cancel(leg.job);
            attempts.delete(leg.job);
            inFlight.set(leg.workerId, inFlight.get(leg.workerId)! - 1);
            leg.attempt.fail?.();
          }
          race.legs = race.legs.filter((l) => l.job === job);
        }
        ttftMs = now - req.at;
        cached = c;
        if (tr) {
          tr.cached = c;
          tr.admitWait = (job.admittedAt ?? now) - dispatchedAt;
          tr.queueWait = (job.prefillAt ?? now) - (job.admittedAt ?? now);
          tr.prefillMs = now - (job.prefillAt ?? now);
        }
        attempt.firstToken?.();
        if (gate > 0) {
          prefilling.set(id, prefilling.get(id)! - 1);
          if (GATE_LOCAL) pumpLocal(id);
          else pump();
        }
      },
      onFinish: (_now, tpotMs) => {
        attempts.delete(job);
        inFlight.set(id, inFlight.get(id)! - 1);
        attempt.finish?.({ ttftMs, tpotMs, promptTokens: req.promptTokens, cachedTokens: cached });
        done({
          id: req.id,
          tier,
          ttftMs,
          tpotMs,
          outTokens: req.outTokens,
          status: 'ok',
          good: ttftMs <= req.goal.ttftMs && tpotMs <= req.goal.tpotMs,
          ...(tr ? { trace: tr } : {}),
        });
      },
    };
    attempts.set(job, { req, attempt, tried, ...(race ? { race } : {}) });
    if (race) race.legs.push({ job, workerId: id, attempt });
    if (hedging && !race && tried.size === 0) {
      const r: Race = { won: false, legs: [{ job, workerId: id, attempt }] };
      race = r; // the first attempt's callbacks see the race too
      attempts.set(job, { req, attempt, tried, race: r });
      const h = HEDGE!;
      const predicted = attempt.predictedTtftMs ?? 0;
      const due = dispatchedAt + Math.max(h.delayMs, h.k * predicted);
      ev.at(due, () => {
        if (r.won || r.legs.length !== 1 || !attempts.has(job)) return;
        const others = new Set([...tried, ...r.legs.map((l) => l.workerId)]);
        if (h.gain > 0) {
          // Only if the other worker is predicted to be much sooner than what is left here.
          const probe = policy.choose(req, view, others);
          if (!probe) return;
          const left = Math.max(predicted - (ev.now - dispatchedAt), ev.now - dispatchedAt);
          const ok = (probe.predictedTtftMs ?? Infinity) < h.gain * left;
          probe.fail?.();
          if (!ok) return;
        }
        dispatchNow(req, tried, others, r);
      });
    }
    if (gate > 0 && GATE_LOCAL) {
      const q = localQ.get(id) ?? [];
      q.push(job);
      localQ.set(id, q);
      pumpLocal(id);
      // A worker sitting idle with nothing queued may take it (or another) at once.
      if (GATE_STEAL && q.length > 0) {
        for (const other of alive) {
          if (other !== id && (localQ.get(other)?.length ?? 0) === 0) pumpLocal(other);
        }
      }
    } else workers.get(id)!.submit(job);
  };

  for (const req of w.requests) ev.at(req.at, () => dispatch(req, new Set()));
  ev.at(w.durationMs * KILL_AT, () => {
    const victim = workers.get(KILLED)!;
    alive = alive.filter((id) => id !== KILLED);
    const { notStarted, streaming } = victim.kill();
    inFlight.set(KILLED, 0);
    prefilling.set(KILLED, 0);
    for (const job of streaming) {
      const a = attempts.get(job);
      if (!a) continue;
      attempts.delete(job);
      a.attempt.fail?.();
      const tier: Tier =
        a.req.tier === 'priority' || a.req.tier === 'flex' ? a.req.tier : 'default';
      done({ id: a.req.id, tier, outTokens: 0, status: 'failed', good: false });
    }
    const heldHere = localQ.get(KILLED) ?? [];
    localQ.delete(KILLED);
    for (const job of [...notStarted, ...heldHere]) {
      const a = attempts.get(job);
      if (!a) continue; // a hedge's losing attempt, already closed
      attempts.delete(job);
      a.attempt.fail?.();
      if (a.race) {
        a.race.legs = a.race.legs.filter((l) => l.job !== job);
        // The other attempt of a hedged request goes on alone.
        if (a.race.legs.length > 0) continue;
      }
      dispatch(a.req, new Set([...a.tried, KILLED]));
    }
  });
  ev.run();
  let promptTokens = 0;
  let cachedTokens = 0;
  for (const wk of workers.values()) {
    promptTokens += wk.promptTokens;
    cachedTokens += wk.cachedTokens;
  }
  return { results, promptTokens, cachedTokens, endMs, chosen };
}

function quantile(xs: number[], q: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!;
}

interface Summary {
  ttftP50: number;
  ttftP99: number;
  /** JSON only (not printed): the mean of the per-seed p99.9, like p99. */
  ttftP999: number;
  tpotP50: number;
  throughput: number;
  tokensPerS: number;
  cacheHit: number;
  goodput: number;
  failed: number;
  rejected: number;
  n: number;
}

function summarize(rs: Result[], run: RunStats, durationMs: number): Summary {
  const ok = rs.filter((r) => r.status === 'ok');
  const span = Math.max(durationMs, run.endMs) / 1000;
  return {
    ttftP50: quantile(
      ok.map((r) => r.ttftMs!),
      0.5,
    ),
    ttftP99: quantile(
      ok.map((r) => r.ttftMs!),
      0.99,
    ),
    ttftP999: quantile(
      ok.map((r) => r.ttftMs!),
      0.999,
    ),
    tpotP50: quantile(
      ok.map((r) => r.tpotMs!),
      0.5,
    ),
    throughput: ok.length / span,
    tokensPerS: ok.reduce((a, r) => a + r.outTokens, 0) / span,
    cacheHit: run.promptTokens ? run.cachedTokens / run.promptTokens : 0,
    goodput: rs.length ? rs.filter((r) => r.good).length / rs.length : 0,
    failed: rs.filter((r) => r.status === 'failed').length,
    rejected: rs.filter((r) => r.status === 'rejected').length,
    n: rs.length,
  };
}

function mean(xs: number[]): number {
  return xs.reduce((a, b) => a + b, 0) / xs.length;
}

function meanSummary(ss: Summary[]): Summary {
  const keys = Object.keys(ss[0]!) as Array<keyof Summary>;
  const out = {} as Summary;
  for (const k of keys) out[k] = mean(ss.map((s) => s[k]));
  return out;
}

const f0 = (x: number): string => (Number.isFinite(x) ? Math.round(x).toLocaleString('en') : '–');
const f1 = (x: number): string => (Number.isFinite(x) ? x.toFixed(1) : '–');
const pct = (x: number): string => `${(100 * x).toFixed(1)} %`;

function main(): void {
  const { values } = parseArgs({
    options: {
      seeds: { type: 'string', default: '5' },
      duration: { type: 'string', default: '180' },
      quick: { type: 'boolean', default: false },
      only: { type: 'string' },
      debug: { type: 'boolean', default: false },
      // Only the policies whose names start with one of these (comma-separated), e.g.
      // --policies=sglang,switchyard; the targets table needs all of them.
      policies: { type: 'string' },
      // JSON object of score constants to override, e.g. '{"sloMissMs":1000}'.
      constants: { type: 'string' },
      // First seed to run (seeds first-seed..seeds), e.g. --first-seed=6 --seeds=10.
      'first-seed': { type: 'string', default: '1' },
      // Decompose the top 1 % of TTFT of the named policies (comma-separated prefixes).
      tail: { type: 'string' },
      // Add oracle policies (they read the simulated workers; not routers): greedy and,
      // for each comma-separated target, the hopeless rule at that TTFT target.
      oracle: { type: 'string' },
      // Experiment: a router-side prefill gate for Switchyard (see GATE above).
      gate: { type: 'string' },
      // Experiment: vLLM priority queues on the workers and Switchyard's rule (see above).
      priority: { type: 'string' },
      // Experiment: hedged requests for Switchyard (see HEDGE above).
      hedge: { type: 'string' },
    },
  });
  if (values.hedge) {
    const [d, ...rest] = values.hedge.split(',');
    HEDGE = { delayMs: Number(d), k: 0, gain: 0 };
    for (const r of rest) {
      const [key, v] = r.split(':');
      if (key === 'x') HEDGE.k = Number(v);
      else if (key === 'gain') HEDGE.gain = Number(v);
      else throw new Error(`--hedge: ${r}?`);
    }
  }
  if (values.priority) {
    PRIORITY_ORDER = true;
    PRIORITY_RULE = parsePriority(values.priority);
  }
  if (values.gate) {
    const [g, order] = values.gate.split(',');
    GATE = Number(g);
    GATE_FIFO = order === 'fifo';
    GATE_LOCAL = order === 'local';
    const extra = values.gate.split(',')[2];
    if (extra !== undefined) {
      const [k, f] = extra.split(':');
      if (k !== 'steal' || !GATE_LOCAL) throw new Error(`--gate: ${extra}?`);
      GATE_STEAL = true;
      if (f !== undefined) STEAL_FACTOR = Number(f);
    }
  }
  const seeds = values.quick ? 1 : Number(values.seeds);
  const firstSeed = values.quick ? 1 : Number(values['first-seed']);
  const nSeeds = seeds - firstSeed + 1;
  const durationMs = (values.quick ? 30 : Number(values.duration)) * 1000;
  const constants = values.constants
    ? (JSON.parse(values.constants) as Partial<ScoreConstants>)
    : undefined;
  const only = values.policies?.split(',').map((s) => s.trim());
  const oracles = (): Policy[] =>
    values.oracle === undefined
      ? []
      : [
          new Oracle(),
          ...values.oracle
            .split(',')
            .filter((x) => x.trim() !== '')
            .map((x) => new Oracle(Number(x))),
        ];
  const policies = (): Policy[] => [
    ...allPolicies(constants, PRIORITY_RULE).filter(
      (p) => !only || only.some((o) => p.name.startsWith(o)),
    ),
    ...oracles(),
  ];
  const tailOf = values.tail?.split(',').map((s) => s.trim());
  const tails = new Map<string, Result[][]>();
  const names = values.only ? WORKLOADS.filter((n) => n === values.only) : [...WORKLOADS];
  const t0 = performance.now();
  const report: Record<string, Record<string, Summary & { perTier: Record<string, Summary> }>> = {};
  const lines: string[] = [];
  const verdicts: string[] = [];
  for (const name of names) {
    const perPolicy = new Map<string, { all: Summary[]; tiers: Record<string, Summary[]> }>();
    let requests = 0;
    const mae = new Map<string, number[]>();
    for (let seed = firstSeed; seed <= seeds; seed++) {
      const w = makeWorkload(name, seed, durationMs);
      requests += w.requests.length;
      for (const p of policies()) {
        const traced = !!tailOf?.some((o) => p.name === o);
        const run = simulate(w, p, traced);
        if (traced) {
          const key = `${name} / ${p.name}`;
          tails.set(key, [...(tails.get(key) ?? []), run.results]);
        }
        if (p instanceof Switchyard) {
          const list = mae.get(p.name) ?? [];
          list.push(p.scorer.index.predictionStats().meanAbsErrorTokens);
          mae.set(p.name, list);
        }
        if (values.debug && p instanceof Switchyard) {
          const ix = p.scorer.index;
          console.error(
            name,
            seed,
            JSON.stringify(ix.predictionStats()),
            ix.charsPerToken.toFixed(2),
          );
          console.error(
            p.scorer
              .snapshot()
              .map(
                (s) =>
                  `${s.workerId} m=${s.msPerToken?.toFixed(3)} b=${s.tpotBaseMs?.toFixed(1)} cap=${ix.capacityOf(s.workerId)} size=${ix.sizeOf(s.workerId)}`,
              )
              .join('\n'),
          );
          console.error(JSON.stringify(run.chosen));
        }
        const entry = perPolicy.get(p.name) ?? { all: [], tiers: {} };
        entry.all.push(summarize(run.results, run, durationMs));
        for (const tier of ['priority', 'default', 'flex'] as const) {
          const rs = run.results.filter((r) => r.tier === tier);
          if (rs.length) (entry.tiers[tier] ??= []).push(summarize(rs, run, durationMs));
        }
        perPolicy.set(p.name, entry);
      }
    }
    lines.push(
      `\n### ${name} (${Math.round(requests / nSeeds)} requests per seed, ${firstSeed === 1 ? seeds : `${firstSeed}–${seeds}`} seeds)\n`,
      '| policy | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | req/s | output tok/s | cache hit | goodput | failed | 429 |',
      '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
    );
    report[name] = {};
    for (const [policy, e] of perPolicy) {
      const s = meanSummary(e.all);
      const perTier: Record<string, Summary> = {};
      for (const [t, ss] of Object.entries(e.tiers)) perTier[t] = meanSummary(ss);
      report[name][policy] = { ...s, perTier };
      lines.push(
        `| ${policy} | ${f0(s.ttftP50)} | ${f0(s.ttftP99)} | ${f1(s.tpotP50)} | ${f1(s.throughput)} | ${f0(s.tokensPerS)} | ${pct(s.cacheHit)} | ${pct(s.goodput)} | ${f1(s.failed)} | ${f1(s.rejected)} |`,
      );
    }
    if (name === 'slo-mix') {
      lines.push(
        '\nPer tier (TTFT p99 ms / goodput):\n',
        '| policy | priority | default | flex |',
        '| --- | ---: | ---: | ---: |',
      );
      for (const [policy, r] of Object.entries(report[name])) {
        const cell = (t: string): string => {
          const s = r.perTier[t];
          return s ? `${f0(s.ttftP99)} / ${pct(s.goodput)}` : '–';
        };
        lines.push(`| ${policy} | ${cell('priority')} | ${cell('default')} | ${cell('flex')} |`);
      }
    }
    if (name !== 'prefix-free') {
      lines.push(
        `\nPrefix index, mean |predicted − reported cached_tokens| per request: ${[...mae]
          .map(([p, xs]) => `${p} ${f1(mean(xs))} tokens`)
          .join(', ')}.`,
      );
    }
    const sy = report[name]['switchyard'];
    if (!sy || !report[name]['least-queue']) continue;
    const base = Object.entries(report[name]).filter(
      ([p]) => !p.startsWith('switchyard') && !p.startsWith('oracle'),
    );
    const prefixHeavy = name !== 'prefix-free';
    if (prefixHeavy) {
      const bestP99 = Math.min(...base.map(([, s]) => s.ttftP99));
      const bestGood = Math.max(...base.map(([, s]) => s.goodput));
      const cut = 1 - sy.ttftP99 / bestP99;
      const met = cut >= 0.3 && sy.goodput > bestGood;
      verdicts.push(
        `| ${name} | p99 TTFT ${pct(cut)} below the best baseline; goodput ${pct(sy.goodput)} vs best baseline ${pct(bestGood)} | ${met ? 'met' : 'not met'} |`,
      );
    } else {
      const lq = report[name]['least-queue']!;
      const d99 = sy.ttftP99 / lq.ttftP99 - 1;
      const dGood = sy.goodput - lq.goodput;
      const met = d99 <= 0.05 && dGood >= -0.05 * lq.goodput;
      verdicts.push(
        `| ${name} | p99 TTFT ${d99 >= 0 ? '+' : ''}${pct(d99)} vs least-queue; goodput ${pct(sy.goodput)} vs ${pct(lq.goodput)} | ${met ? 'met' : 'not met'} |`,
      );
    }
  }
  lines.push(
    '\n### Targets\n',
    '| workload | switchyard | target |',
    '| --- | --- | --- |',
    ...verdicts,
  );
  for (const [key, runs] of tails) lines.push(...tailReport(key, runs, durationMs, firstSeed));
  const secs = (performance.now() - t0) / 1000;
  console.log(lines.join('\n'));
  console.log(
    `\n(${names.length} workloads × ${seeds} seeds × ${policies().length} policies in ${secs.toFixed(1)} s)`,
  );
  mkdirSync('bench/results', { recursive: true });
  const file = `bench/results/routing-${new Date().toISOString().replace(/[:.]/g, '-')}.json`;
  writeFileSync(file, JSON.stringify({ seeds, durationMs, workers: WORKERS, report }, null, 2));
  console.log(`wrote ${file}`);
}

/** Classifies each seed's top 1 % of TTFT (at or above that seed's p99). */
function tailReport(
  key: string,
  runs: Result[][],
  durationMs: number,
  firstSeed: number,
): string[] {
  const killAt = durationMs * KILL_AT;
  const classes = new Map<string, Trace[]>();
  const add = (c: string, t: Trace): void => {
    classes.set(c, [...(classes.get(c) ?? []), t]);
  };
  const byWorker: Record<string, number> = {};
  const byTime: Record<string, number> = {};
  let n = 0;
  const all: Array<Trace & { ttft: number; seed: number }> = [];
  const perSeed: string[] = [];
  runs.forEach((rs, seed) => {
    const ok = rs.filter((r) => r.status === 'ok');
    const p99 = quantile(
      ok.map((r) => r.ttftMs!),
      0.99,
    );
    const over = (x: number, from: number, to: number): number =>
      ok.filter((r) => r.ttftMs! > x && r.trace && r.trace.at >= from && r.trace.at < to).length;
    const lim = Number(process.env.TAIL_LIMIT ?? 754);
    perSeed.push(
      `seed ${seed + firstSeed}: p99 ${f0(p99)}, p99.9 ${f0(
        quantile(
          ok.map((r) => r.ttftMs!),
          0.999,
        ),
      )}, max ${f0(Math.max(...ok.map((r) => r.ttftMs!)))} (rank ${Math.ceil(0.99 * ok.length)} of ${ok.length}); > ${lim} ms: ${over(lim, 0, Infinity)} (< 10 s ${over(lim, 0, 10_000)}, kill…+10 s ${over(lim, killAt, killAt + 10_000)})`,
    );
    // Prefill work spent on requests that arrived in the first 10 s, by kind.
    const early: Record<string, [number, number]> = {};
    for (const r of ok) {
      const t = r.trace;
      if (!t || t.at >= 10_000) continue;
      const cold = t.cached < 0.5 * t.promptTokens;
      const kind = !cold
        ? 'warm'
        : t.tenantFirst
          ? 'cold-first'
          : t.seenHere
            ? 'cold-evicted'
            : 'cold-replica';
      const e = (early[kind] ??= [0, 0]);
      e[0]++;
      e[1] += t.prefillMs;
    }
    perSeed.push(
      `  first 10 s, requests / prefill ms: ${Object.entries(early)
        .map(([k, [c, ms]]) => `${k} ${c} / ${f0(ms)}`)
        .join(', ')}`,
    );
    for (const r of ok) {
      if (r.ttftMs! < p99 || !r.trace) continue;
      const t = r.trace;
      n++;
      all.push({ ...t, ttft: r.ttftMs!, seed: seed + firstSeed });
      byWorker[t.worker] = (byWorker[t.worker] ?? 0) + 1;
      const when =
        t.at < 10_000
          ? 'arrived < 10 s'
          : t.at >= killAt - 2000 && t.at < killAt + 10_000
            ? 'arrived kill−2 s…kill+10 s'
            : 'arrived elsewhere';
      byTime[when] = (byTime[when] ?? 0) + 1;
      const cold = t.cached < 0.5 * t.promptTokens;
      if (t.failover) add('failover from the killed worker', t);
      else if (!cold) add('warm (prefix cached): queueing', t);
      else if (t.tenantFirst) add('cold: first request of its tenant', t);
      else if (t.onlyOnKilled && t.at >= killAt) add('cold: tenant re-homed after the kill', t);
      else if (t.cachedElsewhere >= 0.5 * t.promptTokens) add('cold: cached on another worker', t);
      else if (t.seenHere) add('cold: evicted on this worker', t);
      else add('cold: other (evicted elsewhere, new here)', t);
    }
  });
  const m = (xs: number[]): string => f0(mean(xs));
  const out = [
    `\n### Tail of ${key}: ${n} requests at or above each seed's p99\n`,
    `By worker: ${JSON.stringify(byWorker)}; by arrival: ${JSON.stringify(byTime)}\n`,
    ...perSeed.map((l) => `- ${l}`),
    '',
    '| class | n | mean TTFT | dispatch→admit | admit→prefill (queue) | own prefill | prompt | cached | predicted cached | cached elsewhere | on w2 |',
    '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
  ];
  for (const [c, ts] of [...classes].sort((a, b) => b[1].length - a[1].length)) {
    out.push(
      `| ${c} | ${ts.length} | ${m(ts.map((t) => t.prefillMs + t.queueWait + t.admitWait))} | ${m(ts.map((t) => t.admitWait))} | ${m(ts.map((t) => t.queueWait))} | ${m(ts.map((t) => t.prefillMs))} | ${m(ts.map((t) => t.promptTokens))} | ${m(ts.map((t) => t.cached))} | ${m(ts.map((t) => t.predictedCached ?? NaN))} | ${m(ts.map((t) => t.cachedElsewhere))} | ${ts.filter((t) => t.worker === 'w2').length} |`,
    );
  }
  if (process.env.TAIL_ROWS) {
    out.push(
      '\nseed at_s worker ttft admit queue prefill prompt cached pred elsewhere flags | predTTFT | would-take per worker',
    );
    for (const t of all.sort((a, b) => a.seed - b.seed || a.at - b.at)) {
      out.push(
        `${t.seed} ${(t.at / 1000).toFixed(2)} ${t.worker} ${f0(t.ttft)} ${f0(t.admitWait)} ${f0(t.queueWait)} ${f0(t.prefillMs)} ${t.promptTokens} ${t.cached} ${t.predictedCached ?? '-'} ${t.cachedElsewhere} ${[t.failover ? 'F' : '', t.tenantFirst ? 'first' : '', t.seenHere ? 'seen' : '', t.onlyOnKilled ? 'w3only' : ''].join('')} | ${f0(t.predictedTtft ?? NaN)} | ${Object.entries(
          t.would,
        )
          .map(([k, v]) => `${k}:${f0(v)}`)
          .join(' ')}`,
      );
    }
  }
  return out;
}

main();
