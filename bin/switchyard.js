#!/usr/bin/env -S node --max-semi-space-size=4 --single-threaded-gc --v8-pool-size=1
// Entry point of the `switchyard` binary: runs the compiled CLI (npm run build).
//
// The flags on the first line are the router's V8 settings (`npm start` runs this file
// directly, and bench/lib/services.mjs reads them from here): young-generation
// semi-spaces of at most 4 MiB instead of 16. A router allocates ~50 KB per request;
// with the default each scavenge copied about twice as much and paused the event loop
// about twice as long (1.1-2.2 ms against 0.8 on a slow VM), the router held 24 MiB
// more resident, and the time spent in scavenges overall stayed within 1.5x
// (docs/BENCHMARKS.md, "Young-generation size").
//
// --single-threaded-gc: V8 does all its garbage collection on the main thread instead of
// handing marking, sweeping and parallel scavenging to helper threads. A router serves
// from one event loop and is sized by the core it gets; with one core (a pinned process,
// a container limited to one CPU) the helpers only take that core from the event loop,
// and the marking they cannot do lands back on the main thread in long steps: 16 ms
// steps of incremental marking at 1,000 req/s, the router's p99.9 at 15-27 ms. On one
// thread V8 marks in steps of about 0.2 ms (p99.9 5.9-6.3 ms, p99 3.4-3.6 against
// 4.6-5.5 ms; docs/BENCHMARKS.md, "Garbage collection on one core").
// Run through `node` yourself, pass the same flags.
import { main } from '../dist/cli/main.js';

main(process.argv.slice(2)).then(
  (code) => {
    if (typeof code === 'number') process.exitCode = code;
  },
  (err) => {
    console.error(err instanceof Error ? err.message : err);
    // Exit now: a failure after start-up opened the database, Redis or timers would
    // leave a process that holds them and never listens (nor ends) otherwise.
    process.exit(1);
  },
);
