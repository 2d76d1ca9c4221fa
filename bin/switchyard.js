#!/usr/bin/env -S node --max-semi-space-size=4
// Entry point of the `switchyard` binary: runs the compiled CLI (npm run build).
//
// The flags on the first line are the router's V8 settings (`npm start` runs this file
// directly, and bench/lib/services.mjs reads them from here): young-generation
// semi-spaces of at most 4 MiB instead of 16. A router allocates ~50 KB per request;
// with the default each scavenge copied about twice as much and paused the event loop
// about twice as long (1.1-2.2 ms against 0.8 on a slow VM), the router held 24 MiB
// more resident, and the time spent in scavenges overall stayed within 1.5x
// (docs/BENCHMARKS.md, "Young-generation size"). Run through `node` yourself, pass
// the same flag.
import { main } from '../dist/cli/main.js';

main(process.argv.slice(2)).then(
  (code) => {
    if (typeof code === 'number') process.exitCode = code;
  },
  (err) => {
    console.error(err instanceof Error ? err.message : err);
    process.exitCode = 1;
  },
);
