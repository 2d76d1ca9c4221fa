/** The markdown report printed at the end of `npm run bench` (and pasted into docs/BENCHMARKS.md). */

const f = (v, digits = 2) => (v === null || v === undefined ? 'n/a' : v.toFixed(digits));
const int = (v) => (v === null || v === undefined ? 'n/a' : Math.round(v).toLocaleString('en-US'));
const pctOf = (v) => (v === null || v === undefined ? 'n/a' : `${Math.round(v * 100)}%`);
const signed = (v) =>
  v === null || v === undefined ? 'n/a' : `${v >= 0 ? '+' : ''}${v.toFixed(3)}`;

export function markdownReport(r) {
  const out = [];
  const m = r.machine;
  out.push(`Run ${r.timestamp} on ${m.cpuModel} (nproc ${m.nproc}), Node ${m.node}, ${m.kernel}.`);
  out.push(
    `Load average (1/5/15 min) at start ${r.loadAverageAtStart.join(' / ')}, at end ${r.loadAverageAtEnd.join(' / ')}. "Waiting for its CPU": share of wall time the serving process's event loop was ready to run but another thread had its CPU (on CPU 1 the sim shares with the load generator by design; on CPU 0 it is contention, and latency verdicts above 5% are inconclusive).`,
  );
  out.push(
    `Router pinned to CPU ${r.config.routerCpu}; sim worker and load generators pinned to CPU ${r.config.loadCpu}${r.config.nice ? `; every child at nice ${r.config.nice}` : ''}.`,
  );
  out.push('');
  out.push('| Measure | Direct to sim | Through router | Added by router |');
  out.push('| --- | ---: | ---: | ---: |');
  const t = r.throughput;
  out.push(
    `| Max throughput, non-streaming (wrk, ${t.direct.connections} conns, ${t.direct.durationS} s) | ${int(t.direct.requestsPerSec)} req/s | ${int(t.router.requestsPerSec)} req/s | ${f((t.router.requestsPerSec / t.direct.requestsPerSec) * 100, 0)}% of direct |`,
  );
  out.push(
    `| CPU per request at max throughput (serving process: sim / router) | ${int(t.direct.cpu.cpuUsPerRequest)} µs | ${int(t.router.cpu.cpuUsPerRequest)} µs | |`,
  );
  out.push(
    `| Serving process busy / waiting for its CPU, during wrk | ${pctOf(t.direct.cpu.cpuShare)} / ${pctOf(t.direct.cpu.waitShare)} (shares CPU 1 with wrk by design) | ${pctOf(t.router.cpu.cpuShare)} / ${pctOf(t.router.cpu.waitShare)} | |`,
  );
  out.push(
    `| wrk latency p50 / p99 at max throughput (ms) | ${f(t.direct.latencyMs.p50)} / ${f(t.direct.latencyMs.p99)} | ${f(t.router.latencyMs.p50)} / ${f(t.router.latencyMs.p99)} | |`,
  );
  for (const fr of r.fixedRate) {
    const d = fr.direct.latencyMs;
    const rt = fr.router.latencyMs;
    const label = `${int(fr.rate)} req/s open loop, ${fr.direct.durationS} s`;
    for (const p of ['p50', 'p90', 'p99', 'max']) {
      out.push(
        `| ${label}: ${p} latency (ms) | ${f(d[p], 3)} | ${f(rt[p], 3)} | ${signed(fr.added[p])} |`,
      );
    }
    out.push(
      `| ${label}: CPU per request; busy / waiting for its CPU | ${int(fr.direct.cpu.cpuUsPerRequest)} µs; ${pctOf(fr.direct.cpu.cpuShare)} / ${pctOf(fr.direct.cpu.waitShare)} | ${int(fr.router.cpu.cpuUsPerRequest)} µs; ${pctOf(fr.router.cpu.cpuShare)} / ${pctOf(fr.router.cpu.waitShare)} | |`,
    );
    out.push(
      `| ${label}: completed / errors / incomplete | ${fr.direct.completed} / ${fr.direct.errors} / ${fr.direct.incomplete} | ${fr.router.completed} / ${fr.router.errors} / ${fr.router.incomplete} | |`,
    );
  }
  const s = r.ttfb;
  for (const p of ['p50', 'p99']) {
    out.push(
      `| Stream time to first byte ${p} (ms, ${s.direct.requests} sequential) | ${f(s.direct.firstByteMs[p], 3)} | ${f(s.router.firstByteMs[p], 3)} | ${signed(s.added[p])} |`,
    );
  }
  out.push(
    `| Streams: CPU per request; busy / waiting for its CPU | ${int(s.direct.cpu.cpuUsPerRequest)} µs; ${pctOf(s.direct.cpu.cpuShare)} / ${pctOf(s.direct.cpu.waitShare)} | ${int(s.router.cpu.cpuUsPerRequest)} µs; ${pctOf(s.router.cpu.cpuShare)} / ${pctOf(s.router.cpu.waitShare)} | |`,
  );
  out.push(
    `| Stream total time p50 (ms) | ${f(s.direct.totalMs.p50, 3)} | ${f(s.router.totalMs.p50, 3)} | ${signed(s.addedTotalP50)} |`,
  );
  out.push(
    `| RSS after the run (peak) | sim ${f(r.rss.sim.rssMiB, 1)} MiB (${f(r.rss.sim.peakRssMiB, 1)}) | router ${f(r.rss.router.rssMiB, 1)} MiB (${f(r.rss.router.peakRssMiB, 1)}) | |`,
  );
  const st = r.rss.settled;
  if (st) {
    const trims = st.trims
      ? `; ${st.trims.count} malloc trims so far, ${f(st.trims.releasedMiB, 1)} MiB given back`
      : '';
    out.push(
      `| RSS after ${st.afterIdleS} s idle | sim ${f(r.rss.sim.rssMiB, 1)} MiB | router ${f(st.router.rssMiB, 1)} MiB${trims} | |`,
    );
  }
  const rm = r.rss.router;
  if (rm.anonMiB != null) {
    const v8 = rm.v8
      ? `, of which the V8 heap ${f(rm.v8.totalMiB, 1)} (young generation ${f(rm.v8.newMiB, 1)}, old ${f(rm.v8.oldMiB, 1)})`
      : '';
    out.push(
      `| Router RSS after the run, by kind (MiB) | | anonymous ${f(rm.anonMiB, 1)}${v8}; file-backed (the node binary, libraries) ${f(rm.fileMiB, 1)} | |`,
    );
  }
  if (r.throughput.peer) peerTable(r, out);
  if (r.throughput.floor) floorTable(r, out);
  out.push('');
  out.push('| Target | Source | Measured | Status |');
  out.push('| --- | --- | --- | --- |');
  for (const g of r.targets) {
    out.push(
      `| ${g.name} | ${g.source} | ${g.measured} | ${g.status === 'met' ? 'met' : `**${g.status}**`} |`,
    );
  }
  const lag = r.fixedRate.map(
    (fr) =>
      `${int(fr.rate)} req/s: p50 ${f(fr.direct.sendLagMs.p50, 3)} ms, p99 ${f(fr.direct.sendLagMs.p99, 3)} ms`,
  );
  out.push('');
  out.push(
    `Open-loop client send lag behind schedule (direct runs; included in both latencies): ${lag.join('; ')}.`,
  );
  return out.join('\n');
}

/** Switchyard and the peer gateway side by side (both pinned to CPU 0, same sim). */
function peerTable(r, out) {
  const ratio = (a, b) => (a && b ? `${(a / b).toFixed(1)}x` : 'n/a');
  const t = r.throughput;
  out.push('');
  out.push(
    `Peer gateway: ${r.config.peer}, same sim worker, same pinning (CPU ${r.config.routerCpu}).`,
  );
  out.push('');
  out.push('| Measure | Switchyard | Peer | Switchyard vs peer |');
  out.push('| --- | ---: | ---: | ---: |');
  out.push(
    `| Max throughput, non-streaming (wrk) | ${int(t.router.requestsPerSec)} req/s | ${int(t.peer.requestsPerSec)} req/s (non-2xx ${t.peer.non2xx}) | ${ratio(t.router.requestsPerSec, t.peer.requestsPerSec)} |`,
  );
  out.push(
    `| CPU per request at max throughput | ${int(t.router.cpu.cpuUsPerRequest)} µs | ${int(t.peer.cpu.cpuUsPerRequest)} µs | ${ratio(t.peer.cpu.cpuUsPerRequest, t.router.cpu.cpuUsPerRequest)} less |`,
  );
  for (const fr of r.fixedRate) {
    if (!fr.peer) continue;
    for (const p of ['p50', 'p99']) {
      out.push(
        `| ${int(fr.rate)} req/s: added ${p} latency (ms) | ${signed(fr.added[p])} | ${signed(fr.peerAdded[p])} | |`,
      );
    }
    out.push(
      `| ${int(fr.rate)} req/s: completed / errors / incomplete | ${fr.router.completed} / ${fr.router.errors} / ${fr.router.incomplete} | ${fr.peer.completed} / ${fr.peer.errors} / ${fr.peer.incomplete} | |`,
    );
  }
  const s = r.ttfb;
  if (s.peer) {
    out.push(
      `| Stream TTFB added p50 / p99 (ms) | ${signed(s.added.p50)} / ${signed(s.added.p99)} | ${signed(s.peerAdded.p50)} / ${signed(s.peerAdded.p99)} | |`,
    );
  }
  if (r.rss.peer) {
    out.push(
      `| RSS after the run (peak) | ${f(r.rss.router.rssMiB, 1)} MiB (${f(r.rss.router.peakRssMiB, 1)}) | ${f(r.rss.peer.rssMiB, 1)} MiB (${f(r.rss.peer.peakRssMiB, 1)}) | |`,
      ...(r.rss.settled?.peer
        ? [
            `| RSS after ${r.rss.settled.afterIdleS} s idle | ${f(r.rss.settled.router.rssMiB, 1)} MiB | ${f(r.rss.settled.peer.rssMiB, 1)} MiB | |`,
          ]
        : []),
    );
  }
}

/**
 * The router beside the floor (a pass-through Node proxy with no logic, same CPU):
 * the floor's figures are what the extra hop costs on this machine; the last column
 * is what Switchyard's own work adds on top of that.
 */
function floorTable(r, out) {
  const t = r.throughput;
  const minus = (a, b) =>
    a === null || a === undefined || b === null || b === undefined ? null : a - b;
  out.push('');
  out.push(
    `Floor: ${r.config.floor}, same sim worker, same pinning (CPU ${r.config.routerCpu}) and the same V8 flags as the router. Its added latency is what the extra HTTP hop alone costs on this machine during this run.`,
  );
  out.push('');
  out.push('| Measure | Floor proxy | Switchyard | Switchyard above the floor |');
  out.push('| --- | ---: | ---: | ---: |');
  out.push(
    `| Max throughput, non-streaming (wrk) | ${int(t.floor.requestsPerSec)} req/s | ${int(t.router.requestsPerSec)} req/s | |`,
  );
  out.push(
    `| CPU per request at max throughput | ${int(t.floor.cpu.cpuUsPerRequest)} µs | ${int(t.router.cpu.cpuUsPerRequest)} µs | +${int(minus(t.router.cpu.cpuUsPerRequest, t.floor.cpu.cpuUsPerRequest))} µs |`,
  );
  for (const fr of r.fixedRate) {
    if (!fr.floor) continue;
    for (const p of ['p50', 'p99']) {
      out.push(
        `| ${int(fr.rate)} req/s: added ${p} latency (ms) | ${signed(fr.floorAdded[p])} | ${signed(fr.added[p])} | ${signed(minus(fr.added[p], fr.floorAdded[p]))} |`,
      );
    }
    out.push(
      `| ${int(fr.rate)} req/s: CPU per request | ${int(fr.floor.cpu.cpuUsPerRequest)} µs | ${int(fr.router.cpu.cpuUsPerRequest)} µs | |`,
    );
  }
  const s = r.ttfb;
  if (s.floor) {
    for (const p of ['p50', 'p99']) {
      out.push(
        `| Stream TTFB added ${p} (ms) | ${signed(s.floorAdded[p])} | ${signed(s.added[p])} | ${signed(minus(s.added[p], s.floorAdded[p]))} |`,
      );
    }
  }
  if (r.rss.floor) {
    out.push(
      `| RSS after the run (peak) | ${f(r.rss.floor.rssMiB, 1)} MiB (${f(r.rss.floor.peakRssMiB, 1)}) | ${f(r.rss.router.rssMiB, 1)} MiB (${f(r.rss.router.peakRssMiB, 1)}) | |`,
      ...(r.rss.settled?.floor
        ? [
            `| RSS after ${r.rss.settled.afterIdleS} s idle | ${f(r.rss.settled.floor.rssMiB, 1)} MiB | ${f(r.rss.settled.router.rssMiB, 1)} MiB | |`,
          ]
        : []),
    );
  }
}
