/**
 * Billing gates: usage debits credit in the same transaction that records it;
 * a project without credit gets 402 `insufficient_quota` on priced models, one in
 * dunning 402 `billing_delinquent`; `service_tier: priority` costs 1.25×.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { tables } from '../../src/store/index.js';
import { inferenceFixture, type InferenceFixture } from '../support/inference.js';

describe('billing gates', () => {
  let f: InferenceFixture;
  before(async () => {
    // 1 cent of credit; 100,000 cents per million tokens = 0.1 cent per token.
    f = await inferenceFixture({ prices: [100_000, 100_000], creditCents: 1 });
  });
  after(() => f.close());

  const ask = (extra: Record<string, unknown> = {}) =>
    f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'same prompt' }],
      max_tokens: 4,
      seed: 1,
      ...extra,
    } as never);

  it('debits usage from credit and refuses with 402 insufficient_quota once it is used up', async () => {
    const r = await ask();
    const tokens = r.usage!.prompt_tokens + r.usage!.completion_tokens;
    await f.server.services.usage.flush();
    const p = await f.server.admin('GET', '/projects/inf');
    assert.equal(p.body.spent_cents, (tokens * 100_000) / 1_000_000);
    assert.ok(Number(p.body.remaining_credit_cents) <= 0);
    f.server.clock.advance(f.server.services.config.routeCacheTtlMs + 1);
    await assert.rejects(ask(), (err: unknown) => {
      assert.ok(err instanceof OpenAI.APIError);
      assert.equal(err.status, 402);
      assert.equal(err.code, 'insufficient_quota');
      assert.equal(err.type, 'insufficient_quota');
      return true;
    });
  });

  it('a top-up takes effect at once', async () => {
    const t = await f.server.admin('PATCH', '/projects/inf', { add_credit_cents: 1000 });
    assert.equal(t.status, 200, t.text);
    assert.ok(Number(t.body.remaining_credit_cents) > 0);
    await ask();
  });

  it('priority costs 1.25 times the default tier', async () => {
    const a = await ask({ user: 'plain' });
    const b = await ask({ user: 'prio', service_tier: 'priority' });
    assert.deepEqual(a.usage, b.usage);
    await f.server.services.usage.flush();
    const rows = await f.server.services.store.db.select().from(tables.usageRecords);
    const plain = rows.find((r) => r.user === 'plain')!;
    const prio = rows.find((r) => r.user === 'prio')!;
    assert.equal(prio.costMicrocents, Math.round(plain.costMicrocents * 1.25));
    assert.equal(prio.priceMultiplier, 1.25);
  });

  it('a project in dunning gets 402 billing_delinquent', async () => {
    await f.server.admin('PATCH', '/projects/inf', { billing_status: 'delinquent' });
    await assert.rejects(ask(), (err: unknown) => {
      assert.ok(err instanceof OpenAI.APIError);
      assert.equal(err.status, 402);
      assert.equal(err.code, 'billing_delinquent');
      return true;
    });
    await f.server.admin('PATCH', '/projects/inf', { billing_status: 'active' });
    await ask();
  });
});

/** 0.1 cent per token and 5 cents of credit; each token takes 1 s of the fake clock. */
function fiveCents(): Promise<InferenceFixture> {
  return inferenceFixture({
    prices: [100_000, 100_000],
    creditCents: 5,
    simOnFakeClock: true,
    sim: { tpotMs: 1_000 },
  });
}

describe('billing gate: requests in flight hold credit', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await fiveCents();
  });
  after(() => f.close());

  it('long requests started together cannot overrun the credit: 402 once their maximum is held', async () => {
    // Each may cost (prompt estimate + 10 tokens) x 0.1 cent, about 2 cents; nothing
    // is spent on record until one ends. Streamed, each resolves with its headers:
    // admitted, waiting for its first token on the fake clock.
    const body = {
      model: 'x',
      messages: [{ role: 'user' as const, content: 'a long one' }],
      max_tokens: 10,
      stream: true as const,
    };
    // Six at once, the balance not yet cached: each sees the others' holds (the
    // balance is read once for all, then each compares and holds in one step).
    const all = await Promise.allSettled(
      Array.from({ length: 6 }, () => f.client.chat.completions.create(body)),
    );
    const open = all.flatMap((r) =>
      r.status === 'fulfilled' ? [r.value[Symbol.asyncIterator]()] : [],
    );
    const refusals = all.flatMap((r) => (r.status === 'rejected' ? [r.reason as unknown] : []));
    assert.equal(open.length, 3, 'three fit in 5 cents at about 2 cents held each');
    for (const e of refusals) {
      assert.ok(e instanceof OpenAI.APIError && e.status === 402, String(e));
    }
    // Admitted, it would wait for the fake clock: bounded so that a regression fails.
    const refused = await f.client.chat.completions
      .create({ ...body, stream: false }, { signal: AbortSignal.timeout(5_000) })
      .then(
        () => null,
        (e: unknown) => e,
      );
    assert.ok(refused instanceof OpenAI.APIError, String(refused));
    assert.equal(refused.status, 402);
    assert.equal(refused.code, 'insufficient_quota');
    // They finish (and are billed); their reservations are given back.
    const ends = open.map(async (it) => {
      while (!(await it.next()).done);
    });
    for (let i = 0; i < 12; i++) {
      await new Promise((r) => setTimeout(r, 20));
      f.server.clock.advance(1_000);
    }
    await Promise.all(ends);
    assert.equal(f.server.services.billing['reserved'].size, 0);
  });
});

describe('billing gate: a prediction is held too', () => {
  let f: InferenceFixture;
  before(async () => {
    f = await fiveCents();
  });
  after(() => f.close());

  it('a request with a long prediction holds what its rejected prediction tokens may cost', async () => {
    // Rejected prediction tokens are billed (spec, Usage): with three output tokens,
    // some 60 of these are, 6 cents, more than the credit; max_tokens alone held about 2.
    // Streamed, it resolves with its first token and waits for the next on the fake clock.
    const prediction = Array.from({ length: 30 }, (_, i) => `word${i} next`).join(' ');
    const long = await f.client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'Rewrite it.' }],
      prediction: { type: 'content', content: prediction },
      max_tokens: 3,
      stream: true,
      stream_options: { include_usage: true },
    });
    const it = long[Symbol.asyncIterator]();
    // Admitted, it would wait for the fake clock: bounded so that a regression fails.
    const refused = await f.client.chat.completions
      .create(
        { model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 },
        { signal: AbortSignal.timeout(5_000) },
      )
      .then(
        () => null,
        (e: unknown) => e,
      );
    assert.ok(refused instanceof OpenAI.APIError, String(refused));
    assert.equal(refused.status, 402);
    const ends = (async () => {
      let usage: OpenAI.CompletionUsage | null | undefined;
      for (let r = await it.next(); !r.done; r = await it.next()) usage ??= r.value.usage;
      return usage;
    })();
    for (let i = 0; i < 4; i++) {
      await new Promise((r) => setTimeout(r, 20));
      f.server.clock.advance(1_000);
    }
    const usage = await ends;
    assert.ok((usage?.completion_tokens_details?.rejected_prediction_tokens ?? 0) >= 50);
    assert.equal(f.server.services.billing['reserved'].size, 0);
  });
});

describe('billing gate: requests waiting in the router queue hold credit too', () => {
  let f: InferenceFixture;
  before(async () => {
    // One request at a time to the worker: the others wait in the router's queue.
    f = await inferenceFixture({
      tier: 'gpu',
      prices: [100_000, 100_000],
      creditCents: 5,
      simOnFakeClock: true,
      sim: { tpotMs: 1_000 },
      env: { SWITCHYARD_WORKER_MAX_INFLIGHT: '1', SWITCHYARD_ROUTER_QUEUE_TIMEOUT_MS: '600000' },
    });
  });
  after(() => f.close());

  it('a burst is admitted only as far as the credit holds, queued requests included', async () => {
    // Each may cost (prompt estimate + 5 tokens) x 0.1 cent, about 1.9 cents.
    const all = Promise.allSettled(
      Array.from({ length: 6 }, () =>
        f.client.chat.completions.create({
          model: 'x',
          messages: [{ role: 'user', content: 'a long one' }],
          max_tokens: 5,
        }),
      ),
    );
    let settled = false;
    void all.then(() => (settled = true));
    // Time passes for the requests that got through, one at a time.
    for (let i = 0; i < 400 && !settled; i++) {
      await new Promise((r) => setTimeout(r, 10));
      f.server.clock.advance(500);
    }
    const results = await all;
    const served = results.filter((r) => r.status === 'fulfilled').length;
    const refused = results.flatMap((r) =>
      r.status === 'rejected' && r.reason instanceof OpenAI.APIError ? [r.reason.status] : [],
    );
    assert.equal(served, 3, JSON.stringify(results.map((r) => r.status)));
    assert.deepEqual(refused, [402, 402, 402]);
    assert.equal(f.server.services.billing['reserved'].size, 0);
  });
});
