/**
 * mulberry32: a tiny, fast, well-mixed 32-bit PRNG (period 2^32) returning
 * floats in [0, 1). Everything seeded in Switchyard uses it: the sim's
 * deterministic output, llama sampling in JavaScript, the routing bench's
 * traces and the chaos tests' kill schedules.
 */
export type Rng = () => number;

export function mulberry32(seed: number): Rng {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
