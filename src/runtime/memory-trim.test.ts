import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { FakeClock } from './clock.js';
import { MemoryTrimmer, type MemorySample } from './memory-trim.js';

const MiB = 1024 * 1024;
const quietLogger = { info: () => undefined, debug: () => undefined };

/** A trimmer reading `now.sample` (set by the test) and counting its trims. */
function rig(trimWorks = true) {
  const clock = new FakeClock();
  const now: { sample: MemorySample; duringConfirm?: MemorySample } = { sample: quiet(100) };
  const trims: Array<[number, number]> = [];
  let calls = 0;
  let collections = 0;
  let tunes = 0;
  const trimmer = new MemoryTrimmer({
    clock,
    logger: quietLogger,
    intervalMs: 5000,
    sample: () => now.sample,
    collect: () => {
      collections++;
    },
    wait: async () => {
      if (now.duringConfirm) now.sample = now.duringConfirm;
    },
    trim: async () => {
      calls++;
      if (trimWorks) now.sample = { ...now.sample, rss: now.sample.rss - 20 * MiB };
      return trimWorks;
    },
    tune: async () => {
      tunes++;
      return true;
    },
    onTrim: (before, after) => trims.push([before, after]),
  });
  return {
    clock,
    trimmer,
    trims,
    now,
    calls: () => calls,
    collections: () => collections,
    tunes: () => tunes,
  };
}

function quiet(rssMiB: number): MemorySample {
  return { utilization: 0.01, rss: rssMiB * MiB };
}
function busy(rssMiB: number): MemorySample {
  return { utilization: 0.5, rss: rssMiB * MiB };
}

describe('MemoryTrimmer', () => {
  it('trims in the first four quiet intervals after start and after each busy one, then stops', async () => {
    const r = rig();
    r.now.sample = quiet(140);
    for (let k = 0; k < 6; k++) await r.trimmer.tick();
    assert.equal(r.calls(), 4); // start-up counts as busy
    assert.deepEqual(r.trims[0], [140 * MiB, 120 * MiB]);
    r.now.sample = busy(150);
    await r.trimmer.tick();
    assert.equal(r.calls(), 4);
    r.now.sample = quiet(150);
    for (let k = 0; k < 6; k++) await r.trimmer.tick();
    assert.equal(r.calls(), 8);
  });

  it('runs one full collection of the JavaScript heap at the first quiet interval after a busy one', async () => {
    const r = rig();
    r.now.sample = quiet(140);
    await r.trimmer.tick();
    assert.equal(r.collections(), 1); // start-up counts as busy
    for (let k = 0; k < 5; k++) await r.trimmer.tick();
    assert.equal(r.collections(), 1);
    r.now.sample = busy(150);
    for (let k = 0; k < 3; k++) await r.trimmer.tick();
    assert.equal(r.collections(), 1); // never while busy
    r.now.sample = quiet(150);
    for (let k = 0; k < 4; k++) await r.trimmer.tick();
    assert.equal(r.collections(), 2);
    // A quiet process whose RSS grew is trimmed again, without a collection.
    r.now.sample = quiet(200);
    await r.trimmer.tick();
    assert.equal(r.calls(), 9);
    assert.equal(r.collections(), 2);
  });

  it('does not collect when traffic resumed right after the quiet interval', async () => {
    const r = rig();
    r.now.sample = quiet(140);
    r.now.duringConfirm = busy(140); // requests arrive while the collection is confirmed
    await r.trimmer.tick();
    assert.equal(r.collections(), 0);
    assert.equal(r.calls(), 0); // nothing at all this tick
    r.now.duringConfirm = undefined;
    r.now.sample = quiet(140);
    await r.trimmer.tick();
    assert.equal(r.collections(), 1); // still owed, done when quiet
    assert.equal(r.calls(), 1);
  });

  it('waits out the confirmation on its clock', async () => {
    const clock = new FakeClock();
    let collections = 0;
    const t = new MemoryTrimmer({
      clock,
      logger: quietLogger,
      intervalMs: 5000,
      sample: () => quiet(100),
      trim: async () => true,
      collect: () => {
        collections++;
      },
    });
    const tick = t.tick();
    await new Promise((res) => setImmediate(res));
    clock.advance(199);
    await new Promise((res) => setImmediate(res));
    assert.equal(collections, 0);
    clock.advance(1);
    await tick;
    assert.equal(collections, 1);
  });

  it('never trims while the event loop is busy', async () => {
    const r = rig();
    r.now.sample = busy(200);
    for (let k = 0; k < 20; k++) await r.trimmer.tick();
    assert.equal(r.calls(), 0);
  });

  it('trims a quiet process again when its RSS has grown by 8 MiB since the last trim', async () => {
    const r = rig();
    r.now.sample = quiet(180);
    for (let k = 0; k < 4; k++) await r.trimmer.tick();
    assert.equal(r.calls(), 4); // RSS after the last trim: 100 MiB
    r.now.sample = quiet(104);
    await r.trimmer.tick();
    assert.equal(r.calls(), 4); // +4 MiB: not worth a trim
    r.now.sample = quiet(109);
    await r.trimmer.tick();
    assert.equal(r.calls(), 5);
  });

  it('runs on its clock, and stops for good where trimming is not available', async () => {
    const r = rig(false);
    r.trimmer.start();
    assert.equal(r.tunes(), 1); // the thresholds are set once, at start
    r.clock.advance(4999);
    assert.equal(r.calls(), 0);
    r.clock.advance(1);
    await new Promise((res) => setImmediate(res));
    assert.equal(r.calls(), 1);
    r.clock.advance(60_000);
    await new Promise((res) => setImmediate(res));
    assert.equal(r.calls(), 1); // disabled after the first refusal, no timer left
    r.trimmer.stop();
  });

  it('an interval of 0 turns it off', async () => {
    const r = rig();
    const t = new MemoryTrimmer({
      clock: r.clock,
      logger: quietLogger,
      intervalMs: 0,
      trim: async () => assert.fail('trimmed'),
      tune: async () => assert.fail('tuned'),
    });
    t.start();
    r.clock.advance(60_000);
  });

  it("the full collection gives a load's garbage back without exposing gc globally (real V8)", () => {
    const mod = fileURLToPath(new URL('./memory-trim.ts', import.meta.url));
    // A child process (no --expose-gc): 400,000 objects that outlive several
    // scavenges, then dropped; one fullCollection() must free most of the heap.
    const script = `
      import v8 from 'node:v8';
      import { fullCollection } from ${JSON.stringify(mod)};
      const old = () => v8.getHeapStatistics().used_heap_size;
      // On globalThis: a local that is never read again may be collected early.
      globalThis.load = [];
      for (let i = 0; i < 400000; i++) globalThis.load.push({ i, s: 'x'.repeat(40) + i });
      await new Promise((r) => setTimeout(r, 20));
      const loaded = old();
      globalThis.load = null;
      fullCollection();
      console.log(JSON.stringify({ loaded, after: old(), globalGc: typeof globalThis.gc }));
    `;
    const out = spawnSync(
      process.execPath,
      ['--import', 'tsx', '--input-type=module', '-e', script],
      { encoding: 'utf8' },
    );
    assert.equal(out.status, 0, out.stderr);
    const r = JSON.parse(out.stdout.trim().split('\n').pop()!) as {
      loaded: number;
      after: number;
      globalGc: string;
    };
    assert.equal(r.globalGc, 'undefined');
    assert.ok(r.loaded > 20 * MiB, `heap only ${r.loaded / MiB} MiB after the load`);
    assert.ok(r.after < r.loaded / 4, `heap ${r.loaded / MiB} -> ${r.after / MiB} MiB`);
  });

  it('malloc_trim gives fragmented native memory back to the system (real glibc)', () => {
    // A child process: 3,000 native 60 KiB buffers (below glibc's mmap threshold, so
    // in malloc's arenas), every eighth kept alive so the freed ones sit between live
    // ones, then collected. Freed but resident until trimmed.
    const mod = fileURLToPath(new URL('./memory-trim.ts', import.meta.url));
    const script = `
      import { mallocTrim } from ${JSON.stringify(mod)};
      const keep = [];
      let bufs = [];
      for (let i = 0; i < 3000; i++) {
        const b = Buffer.allocUnsafeSlow(60 * 1024);
        b.fill(1);
        bufs.push(b);
        if (i % 8 === 7) keep.push(b);
      }
      bufs = null;
      gc(); gc();
      await new Promise((r) => setTimeout(r, 50));
      gc();
      const before = process.memoryUsage.rss();
      const ok = await mallocTrim();
      const after = process.memoryUsage.rss();
      console.log(JSON.stringify({ ok, before, after, kept: keep.length }));
    `;
    const out = spawnSync(
      process.execPath,
      ['--expose-gc', '--import', 'tsx', '--input-type=module', '-e', script],
      { encoding: 'utf8' },
    );
    assert.equal(out.status, 0, out.stderr);
    const r = JSON.parse(out.stdout.trim().split('\n').pop()!) as {
      ok: boolean;
      before: number;
      after: number;
    };
    assert.equal(r.ok, true);
    // About 160 MiB was freed between live buffers; most of it must go back.
    assert.ok(r.before - r.after > 100 * MiB, `RSS ${r.before / MiB} -> ${r.after / MiB} MiB`);
  });

  it("fixes glibc's thresholds: a large block keeps its own mapping after a larger one was freed (real glibc)", () => {
    // glibc raises its mmap threshold to the size of each mapped block that is freed
    // (and its trim threshold to twice that): after a 24 MiB block comes and goes, a
    // 2 MiB block is carved from the arena, where free memory at a thread arena's top
    // stays resident (the module comment). With tuneMalloc the threshold stays 1 MiB,
    // so the 2 MiB block is mapped on its own; malloc_info counts such blocks.
    const mod = fileURLToPath(new URL('./memory-trim.ts', import.meta.url));
    const run = (tune: boolean) => {
      const script = `
        import * as ffi from 'ffi-rs';
        import { readFileSync } from 'node:fs';
        import { tuneMalloc } from ${JSON.stringify(mod)};
        const tuned = ${tune} ? await tuneMalloc() : null;
        ffi.open({ library: 'c', path: 'libc.so.6' });
        const { External: E, U64, I32, String: S, Void } = ffi.DataType;
        const c = (funcName, retType, paramsType, paramsValue) =>
          ffi.load({ library: 'c', funcName, retType, paramsType, paramsValue });
        c('free', Void, [E], [c('malloc', E, [U64], [24 << 20])]);
        const block = c('malloc', E, [U64], [2 << 20]);
        const file = ${JSON.stringify(join(tmpdir(), `switchyard-malloc-info-${process.pid}-`))} + ${tune};
        const f = c('fopen', E, [S, S], [file, 'w']);
        c('malloc_info', I32, [I32, E], [0, f]);
        c('fclose', I32, [E], [f]);
        const xml = readFileSync(file, 'utf8');
        const mapped = /<total type="mmap" count="(\\d+)" size="(\\d+)"\\/>\\s*<system type="current"/.exec(xml);
        console.log(JSON.stringify({ tuned, mappedBlocks: Number(mapped[1]), mappedBytes: Number(mapped[2]) }));
        c('free', Void, [E], [block]);
      `;
      const out = spawnSync(
        process.execPath,
        ['--import', 'tsx', '--input-type=module', '-e', script],
        {
          encoding: 'utf8',
        },
      );
      assert.equal(out.status, 0, out.stderr);
      return JSON.parse(out.stdout.trim().split('\n').pop()!) as {
        tuned: boolean | null;
        mappedBlocks: number;
        mappedBytes: number;
      };
    };
    const untuned = run(false);
    assert.ok(untuned.mappedBytes < 2 << 20, JSON.stringify(untuned)); // glibc's own rule
    const tuned = run(true);
    assert.equal(tuned.tuned, true);
    assert.ok(tuned.mappedBytes >= 2 << 20, JSON.stringify(tuned));
  });
});
