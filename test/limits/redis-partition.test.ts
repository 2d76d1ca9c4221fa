/**
 * Redis partitioned (packets dropped, no reset), between the router and a real Redis:
 * a proxy that forwards both ways until told to hold everything. The limiter's
 * commands time out (500 ms) instead of holding every request for as long as the
 * partition lasts (30 s before), limits fail open as documented, later requests do
 * not each wait out a timeout (the limiter backs off for a second), and once the
 * partition heals the limits are enforced again.
 */
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { inferenceFixture, postChat, type InferenceFixture } from '../support/inference.js';

const redisUrl = process.env.TEST_REDIS_URL;
if (process.env.CI === 'true' && !redisUrl) throw new Error('CI=true needs TEST_REDIS_URL');

/**
 * A TCP proxy to Redis that can stop forwarding (a partition) and resume. Held bytes
 * are delivered when it resumes, as TCP retransmits across a partition that heals.
 */
async function partitionableProxy(target: URL) {
  let held = false;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port || 6379), target.hostname);
    sockets.add(client).add(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    if (held) {
      client.pause();
      upstream.pause();
    }
    for (const s of [client, upstream]) {
      s.on('error', () => undefined);
      s.on('close', () => {
        sockets.delete(client);
        sockets.delete(upstream);
        client.destroy();
        upstream.destroy();
      });
    }
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `redis://127.0.0.1:${(server.address() as net.AddressInfo).port}${target.pathname}`,
    hold: (on: boolean) => {
      held = on;
      for (const s of sockets) {
        if (on) s.pause();
        else s.resume();
      }
    },
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise<void>((r) => server.close(() => r()));
    },
  };
}

describe('limits when Redis is partitioned', { skip: redisUrl ? false : 'needs Redis' }, () => {
  let f: InferenceFixture;
  let proxy: Awaited<ReturnType<typeof partitionableProxy>>;
  before(async () => {
    proxy = await partitionableProxy(new URL(redisUrl!));
    f = await inferenceFixture({ env: { REDIS_URL: proxy.url } });
  });
  after(async () => {
    await f.close();
    await proxy.close();
  });

  const ask = async () => {
    const t0 = Date.now();
    const r = await postChat(f, { max_tokens: 2 });
    await r.arrayBuffer();
    return {
      status: r.status,
      limited: r.headers.get('ratelimit-limit') !== null,
      ms: Date.now() - t0,
    };
  };

  it(
    'commands time out, limits fail open without a stall, and come back after the heal',
    { timeout: 30_000 },
    async () => {
      const healthy = await ask();
      assert.equal(healthy.status, 200);
      assert.ok(healthy.limited, 'limits answered by Redis carry their headers');

      proxy.hold(true);
      const first = await ask();
      assert.equal(first.status, 200, 'fail open');
      assert.equal(first.limited, false);
      assert.ok(first.ms < 3000, `the first request waited ${first.ms} ms (a command timeout)`);
      // Within the back-off: no second timeout to wait out.
      const next = await ask();
      assert.equal(next.status, 200);
      assert.ok(next.ms < 400, `the next request waited ${next.ms} ms`);

      proxy.hold(false);
      // The fake clock moves the back-off on; the connection may need a moment.
      f.server.clock.advance(1500);
      let back = false;
      for (let i = 0; i < 100 && !back; i++) {
        back = (await ask()).limited;
        if (!back) {
          f.server.clock.advance(1500);
          await new Promise((r) => setTimeout(r, 50));
        }
      }
      assert.ok(back, 'limits are enforced again after the partition heals');
    },
  );
});
