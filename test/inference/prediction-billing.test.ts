/**
 * Predicted outputs: prediction tokens the model discarded were still generated,
 * so they are billed (spec, Usage: `rejected_prediction_tokens`, "still billed")
 * and count in the endpoint's tokens per minute, while the usage the client sees
 * stays as the worker reported it. The sim accepts the first half of a prediction
 * and rejects the rest.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { tables } from '../../src/store/index.js';
import { inferenceFixture, type InferenceFixture } from '../support/inference.js';

/** Cents per million tokens: 1 token costs this many micro-cents. */
const PROMPT_PRICE = 100;
const COMPLETION_PRICE = 1000;

const PREDICTION =
  'The quick brown fox jumps over the lazy dog, then it runs across the field and into the woods.';

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  completion_tokens_details: {
    accepted_prediction_tokens: number | null;
    rejected_prediction_tokens: number | null;
  };
}

describe('rejected prediction tokens', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await inferenceFixture({
      prices: [PROMPT_PRICE, COMPLETION_PRICE],
      creditCents: 1_000_000,
    });
  });
  after(() => f.close());

  async function ask(stream: boolean): Promise<{ id: string; usage: Usage }> {
    const res = await fetch(`${f.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${f.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'x',
        messages: [{ role: 'user', content: 'Rewrite the sentence.' }],
        prediction: { type: 'content', content: PREDICTION },
        max_tokens: 200,
        stream,
        ...(stream ? { stream_options: { include_usage: true } } : {}),
      }),
    });
    assert.equal(res.status, 200);
    const id = res.headers.get('x-request-id')!;
    if (!stream) return { id, usage: ((await res.json()) as { usage: Usage }).usage };
    const events = (await res.text())
      .split('\n\n')
      .filter((e) => e.startsWith('data: {'))
      .map((e) => JSON.parse(e.slice(6)) as { usage?: Usage | null });
    return { id, usage: events.at(-1)!.usage! };
  }

  it('are billed and counted per minute; the usage shown keeps the worker numbers', async () => {
    let tokens = 0;
    for (const stream of [false, true]) {
      const { id, usage } = await ask(stream);
      const rejected = usage.completion_tokens_details.rejected_prediction_tokens;
      assert.ok(rejected !== null && rejected > 0, `no rejected tokens: ${JSON.stringify(usage)}`);
      // As the worker reported it: rejected tokens are not added to what the client sees.
      assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);

      await f.server.services.usage.flush();
      const rows = await f.server.services.store.db.select().from(tables.usageRecords);
      const row = rows.find((r) => r.requestId === id);
      assert.ok(row, `no usage record for ${id}`);
      assert.equal(row.completionTokens, usage.completion_tokens);
      assert.equal(row.rejectedPredictionTokens, rejected);
      assert.equal(
        row.costMicrocents,
        usage.prompt_tokens * PROMPT_PRICE +
          (usage.completion_tokens + rejected) * COMPLETION_PRICE,
      );
      tokens += usage.prompt_tokens + usage.completion_tokens + rejected;

      // The endpoint's tokens-per-minute window holds them too.
      const limit = 1_000_000_000;
      const [d] = await f.server.services.limiter.acquire(
        [{ kind: 'sum', key: `etpm:${row.endpointId}`, limit, windowMs: 60_000 }],
        f.server.clock.now(),
      );
      assert.equal(limit - d!.remaining, tokens);
    }
  });
});
