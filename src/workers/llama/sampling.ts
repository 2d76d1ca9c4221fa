/**
 * Sampling decisions that stay in JavaScript, as pure functions.
 *
 * llama.cpp's sampler chain reports the probabilities it sampled from *after*
 * temperature and top-p truncation, which is not what `logprobs` means (OpenAI, vLLM
 * and llama.cpp's server all report the model's distribution). So when a request wants
 * logprobs with temperature > 0 and no grammar, the engine asks llama.cpp for the full
 * distribution (greedy chain: logit bias and penalties applied, nothing truncated) and
 * draws the token here: temperature, then top-p, then a draw from a seeded PRNG. The
 * same seed gives the same tokens.
 *
 * With a grammar the token must be drawn by llama.cpp itself (the grammar state lives
 * there), so that case keeps llama.cpp's sampler and reports its distribution; see
 * `engine.ts`.
 */

/** Floor for log(0): JSON has no -Infinity, and vLLM uses the same value. */
export const MIN_LOGPROB = -9999;

/** Any integer seed (OpenAI allows negatives and 53-bit values) as llama.cpp's uint32. */
export function toUint32Seed(seed: number): number {
  const m = Math.trunc(seed) % 4294967296;
  return m < 0 ? m + 4294967296 : m;
}

export function safeLog(p: number): number {
  return p > 0 ? Math.max(MIN_LOGPROB, Math.log(p)) : MIN_LOGPROB;
}

/**
 * Draws a token from `probs` (token → probability, any order) after temperature
 * (`p^(1/T)`, renormalized) and nucleus truncation (smallest top set whose mass reaches
 * `topP`). Temperature 0 is greedy. Ties keep the lower token id first so the result
 * does not depend on map order.
 */
export function sampleToken(
  probs: ReadonlyMap<number, number>,
  temperature: number,
  topP: number,
  random: () => number,
): number {
  const entries: Array<[number, number]> = [];
  let max = 0;
  for (const [token, p] of probs) {
    if (p > 0) {
      entries.push([token, p]);
      if (p > max) max = p;
    }
  }
  if (entries.length === 0) throw new Error('empty distribution');
  if (temperature === 0) {
    let best = entries[0] as [number, number];
    for (const e of entries) if (e[1] > best[1] || (e[1] === best[1] && e[0] < best[0])) best = e;
    return best[0];
  }
  // Work in log space relative to the maximum so small temperatures do not underflow.
  const invT = 1 / temperature;
  let total = 0;
  for (const e of entries) {
    e[1] = Math.exp((Math.log(e[1]) - Math.log(max)) * invT);
    total += e[1];
  }
  entries.sort((a, b) => b[1] - a[1] || a[0] - b[0]);
  let keep = entries.length;
  if (topP < 1) {
    let mass = 0;
    for (let i = 0; i < entries.length; i++) {
      mass += (entries[i] as [number, number])[1] / total;
      if (mass >= topP) {
        keep = i + 1;
        break;
      }
    }
  }
  let kept = 0;
  for (let i = 0; i < keep; i++) kept += (entries[i] as [number, number])[1];
  let r = random() * kept;
  for (let i = 0; i < keep; i++) {
    const [token, w] = entries[i] as [number, number];
    r -= w;
    if (r < 0) return token;
  }
  return (entries[keep - 1] as [number, number])[0];
}

/** The `top` most likely tokens of a distribution, most likely first (ties: lower id). */
export function topTokens(
  probs: ReadonlyMap<number, number>,
  top: number,
): Array<[number, number]> {
  if (top <= 0) return [];
  const best: Array<[number, number]> = [];
  for (const [token, p] of probs) {
    if (best.length < top) {
      best.push([token, p]);
      best.sort((a, b) => b[1] - a[1] || a[0] - b[0]);
      continue;
    }
    const last = best[best.length - 1] as [number, number];
    if (p > last[1] || (p === last[1] && token < last[0])) {
      best[best.length - 1] = [token, p];
      best.sort((a, b) => b[1] - a[1] || a[0] - b[0]);
    }
  }
  return best;
}

/**
 * Adds logit biases to a distribution and renormalizes: p_t·e^bias / Σ. Used for the
 * end-of-generation tokens, whose bias node-llama-cpp's `TokenBias` silently drops.
 */
export function applyLogitBias(
  probs: ReadonlyMap<number, number>,
  bias: ReadonlyMap<number, number>,
): Map<number, number> {
  const out = new Map<number, number>();
  let total = 0;
  for (const [t, p] of probs) {
    const b = bias.get(t);
    const q = b === undefined ? p : p * Math.exp(b);
    out.set(t, q);
    total += q;
  }
  if (total > 0) for (const [t, q] of out) out.set(t, q / total);
  return out;
}
