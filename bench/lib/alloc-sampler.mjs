/**
 * Preloaded into the router by bench/alloc.mjs (`--import`): the first SIGUSR2
 * starts V8's sampling heap profiler, counting objects that young- and old-
 * generation GCs collect as well (so the figures are everything allocated, not
 * only what is still alive), and the second stops it and writes the profile to
 * `$SWITCHYARD_ALLOC_PROFILE`. Not for production: only the bench loads it.
 */
import { writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import process from 'node:process';

const out = process.env.SWITCHYARD_ALLOC_PROFILE;
const session = new Session();
session.connect();
let sampling = false;
process.on('SIGUSR2', () => {
  if (!sampling) {
    sampling = true;
    session.post('HeapProfiler.enable', () =>
      session.post('HeapProfiler.startSampling', {
        samplingInterval: 512,
        // With SWITCHYARD_ALLOC_SURVIVORS=1 (`bench/alloc.mjs --survivors`): only objects
        // that outlived a scavenge (copied or promoted), which is what a scavenge's pause
        // pays for.
        includeObjectsCollectedByMinorGC: process.env.SWITCHYARD_ALLOC_SURVIVORS !== '1',
        includeObjectsCollectedByMajorGC: true,
      }),
    );
    return;
  }
  session.post('HeapProfiler.stopSampling', (err, r) => {
    if (!err && out) writeFileSync(out, JSON.stringify(r.profile));
  });
});
