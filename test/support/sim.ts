/**
 * Sim workers started by a test file, all closed after its tests: `const worker =
 * simWorkers();` at the top of the file, then `await worker({...})` in each test.
 */
import { after } from 'node:test';
import {
  startSimWorker,
  type SimWorker,
  type SimWorkerOptions,
} from '../../src/workers/sim/server.js';

export function simWorkers(): (opts?: SimWorkerOptions) => Promise<SimWorker> {
  const workers: SimWorker[] = [];
  after(async () => {
    await Promise.all(workers.map((w) => w.close()));
  });
  return async (opts = {}) => {
    const w = await startSimWorker(opts);
    workers.push(w);
    return w;
  };
}
