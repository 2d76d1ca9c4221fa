/**
 * An inference fixture: the test router, a `sim` worker registered for a model
 * and tier, a project, an endpoint and a key, and an OpenAI SDK client pointed
 * at the endpoint's base URL.
 */
import assert from 'node:assert/strict';
import { setImmediate as tick } from 'node:timers/promises';
import OpenAI from 'openai';
import { tables } from '../../src/store/index.js';
import {
  clockSleep,
  startSimWorker,
  type SimWorker,
  type SimWorkerOptions,
} from '../../src/workers/sim/index.js';
import { startTestServer, type TestServer } from './harness.js';

export interface InferenceFixture {
  server: TestServer;
  worker: SimWorker;
  client: OpenAI;
  projectId: string;
  key: string;
  baseURL: string;
  close(): Promise<void>;
}

export async function inferenceFixture(
  opts: {
    tier?: 'free' | 'cpu' | 'gpu' | 'self_hosted';
    contextWindow?: number;
    capabilities?: string[];
    sim?: SimWorkerOptions;
    /** Drive the sim's delays with the router's fake clock. */
    simOnFakeClock?: boolean;
    /** Cents per million tokens: [prompt, completion]. */
    prices?: [number, number];
    creditCents?: number;
    keyScopes?: string[];
    env?: Record<string, string>;
    /** The router's storage (PGlite unless asked; `postgres` needs TEST_DATABASE_URL). */
    driver?: 'pglite' | 'postgres';
    deps?: Parameters<typeof startTestServer>[0] extends infer O
      ? O extends { deps?: infer D }
        ? D
        : never
      : never;
  } = {},
): Promise<InferenceFixture> {
  const server = await startTestServer({
    ...(opts.driver ? { driver: opts.driver } : {}),
    ...(opts.deps ? { deps: opts.deps } : {}),
    ...(opts.env ? { env: opts.env } : {}),
  });
  const model = 'sim-model';
  const worker = await startSimWorker({
    model,
    contextWindow: 4096,
    ...(opts.simOnFakeClock ? { sleep: clockSleep(server.clock), clock: server.clock } : {}),
    ...opts.sim,
  });
  const tier = opts.tier ?? 'cpu';
  const must = async (r: Promise<{ status: number; text: string }>) => {
    const res = await r;
    if (res.status >= 300) throw new Error(res.text);
  };
  await must(
    server.admin('POST', '/models', {
      name: model,
      context_window: opts.contextWindow ?? 4096,
      capabilities: opts.capabilities ?? ['tool_calling', 'json_schema', 'logprobs'],
      ...(opts.prices
        ? {
            prompt_price_cents_per_mtok: opts.prices[0],
            completion_price_cents_per_mtok: opts.prices[1],
          }
        : {}),
    }),
  );
  await must(server.admin('POST', '/workers', { model, tier, url: worker.url, id: 'sim-1' }));
  const p = await server.admin('POST', '/projects', {
    slug: 'inf',
    name: 'Inference',
    ...(opts.creditCents !== undefined ? { credit_cents: opts.creditCents } : {}),
  });
  await must(
    server.admin('POST', '/projects/inf/endpoints', { slug: 'chat', name: 'Chat', model, tier }),
  );
  const k = await server.admin('POST', '/projects/inf/keys', {
    scopes: opts.keyScopes ?? ['inference'],
  });
  const projectId = String(p.body.id);
  const key = String(k.body.key);
  const baseURL = `${server.url}/${projectId}/chat/v1`;
  const client = new OpenAI({ baseURL, apiKey: key, maxRetries: 0 });
  return {
    server,
    worker,
    client,
    projectId,
    key,
    baseURL,
    close: async () => {
      await server.close();
      await worker.close();
    },
  };
}

/**
 * POSTs a chat completion to the fixture's endpoint with raw `fetch` (status, headers
 * and body as sent): `{model: 'x', messages: [hi]}` plus `body`.
 */
export function postChat(
  f: InferenceFixture,
  body: Record<string, unknown> = {},
  signal?: AbortSignal,
  key = f.key,
): Promise<Response> {
  return fetch(`${f.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'x', messages: [{ role: 'user', content: 'hi' }], ...body }),
    ...(signal ? { signal } : {}),
  });
}

/** The `error` object of the SSE event named `error` in a stream's text. */
export function sseErrorEvent(text: string): Record<string, unknown> {
  const m = text.match(/event: error\ndata: (.*)\n\n/);
  assert.ok(m, `no error event in:\n${text}`);
  return (JSON.parse(m[1]!) as { error: Record<string, unknown> }).error;
}

/** The status of every usage record written so far (the recorder flushed first). */
export async function usageStatuses(f: InferenceFixture): Promise<string[]> {
  await f.server.services.usage.flush();
  const rows = await f.server.services.store.db.select().from(tables.usageRecords);
  return rows.map((r) => r.status);
}

/**
 * Waits until `cond` holds, turning the event loop (a few real milliseconds in all):
 * for fake-clock tests, where time moves only when the test advances it.
 */
export async function until(cond: () => boolean, what: string, max = 2000): Promise<void> {
  for (let i = 0; i < max; i++) {
    if (cond()) return;
    await tick();
    if (i % 50 === 49) await new Promise((r) => setTimeout(r, 2));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** The API error a call fails with (any other outcome fails the test). */
export async function apiError(p: Promise<unknown>): Promise<InstanceType<typeof OpenAI.APIError>> {
  try {
    await p;
  } catch (err) {
    if (err instanceof OpenAI.APIError) return err;
    throw err;
  }
  assert.fail('expected an API error');
}

/** A chat-completions function tool the sim engine can call (`[sim:tool_call]`). */
export const weatherTool = {
  type: 'function' as const,
  function: {
    name: 'get_weather',
    description: 'Weather for a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' } },
      required: ['city'],
    },
  },
};

/** A new key of the fixture's project (`inf`), made through the operator API. */
export async function inferenceKey(
  f: InferenceFixture,
  body: Record<string, unknown>,
): Promise<string> {
  const r = await f.server.admin('POST', '/projects/inf/keys', body);
  assert.equal(r.status, 201, r.text);
  return String(r.body.key);
}

/** Another endpoint of the fixture's project (`inf`), on the cpu tier; its id. */
export async function inferenceEndpoint(
  f: InferenceFixture,
  slug: string,
  model = 'sim-model',
): Promise<string> {
  const r = await f.server.admin('POST', '/projects/inf/endpoints', {
    slug,
    name: slug,
    model,
    tier: 'cpu',
  });
  assert.equal(r.status, 201, r.text);
  return String(r.body.id);
}
