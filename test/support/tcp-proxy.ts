/**
 * A TCP proxy for dependency-fault tests: a process under test connects to the
 * proxy instead of the real server (PostgreSQL, Redis...), and the test cuts
 * and restores the path without touching the shared server.
 *
 * - `cut('refuse')`: like the server going down. Every open connection is
 *   dropped (both ends) and new connections are dropped as soon as accepted.
 * - `cut('blackhole')`: like a network partition. Connections stay open but no
 *   byte passes in either direction; new connections are accepted and then
 *   hear nothing. `restore()` delivers what was held, as a healed network
 *   would.
 * - `restore()`: traffic flows again; new connections are forwarded.
 */
import { createServer, connect, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';

export type CutMode = 'refuse' | 'blackhole';

export interface TcpProxy {
  port: number;
  /** `url` with its host and port replaced by the proxy's. */
  rewrite(url: string): string;
  cut(mode: CutMode): void;
  restore(): void;
  state(): 'open' | CutMode;
  stats: { accepted: number; reset: number; open: number };
  close(): Promise<void>;
}

interface Pair {
  client: Socket;
  upstream: Socket | null;
  /** Bytes held while blackholed, per direction, delivered on restore. */
  toUpstream: Buffer[];
  toClient: Buffer[];
}

/**
 * Drops a connection at once. A plain destroy (FIN), not `resetAndDestroy()`
 * (RST): on Node 20 a reset socket with a write or shutdown pending can leave
 * the test process spinning at exit, waiting for a request that never completes.
 * The client sees the same thing either way: its connection ended mid-protocol.
 */
function reset(s: Socket | null): void {
  if (!s || s.destroyed) return;
  s.destroy();
}

export async function startTcpProxy(targetHost: string, targetPort: number): Promise<TcpProxy> {
  let mode: 'open' | CutMode = 'open';
  const pairs = new Set<Pair>();
  const stats = { accepted: 0, reset: 0, open: 0 };

  const dial = (p: Pair) => {
    const u = connect({ host: targetHost, port: targetPort });
    p.upstream = u;
    u.setNoDelay(true);
    u.on('data', (d: Buffer) => {
      if (mode === 'blackhole') p.toClient.push(d);
      else p.client.write(d);
    });
    u.on('error', () => reset(p.client));
    u.on('close', () => {
      if (mode !== 'blackhole') p.client.end();
    });
    for (const d of p.toUpstream.splice(0)) u.write(d);
  };

  const server: Server = createServer((client) => {
    stats.accepted++;
    if (mode === 'refuse') {
      stats.reset++;
      reset(client);
      return;
    }
    client.setNoDelay(true);
    const p: Pair = { client, upstream: null, toUpstream: [], toClient: [] };
    pairs.add(p);
    stats.open = pairs.size;
    client.on('data', (d: Buffer) => {
      if (mode === 'blackhole' || !p.upstream) p.toUpstream.push(d);
      else p.upstream.write(d);
    });
    client.on('error', () => reset(p.upstream));
    client.on('close', () => {
      pairs.delete(p);
      stats.open = pairs.size;
      if (p.upstream && !p.upstream.destroyed) p.upstream.end();
    });
    // A connection accepted during a partition is dialled when it heals.
    if (mode === 'open') dial(p);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;

  return {
    port,
    stats,
    rewrite(url) {
      const u = new URL(url);
      u.hostname = '127.0.0.1';
      u.port = String(port);
      return u.toString();
    },
    state: () => mode,
    cut(m) {
      mode = m;
      if (m === 'refuse') {
        for (const p of pairs) {
          stats.reset++;
          reset(p.client);
          reset(p.upstream);
        }
        pairs.clear();
        stats.open = 0;
      }
    },
    restore() {
      mode = 'open';
      for (const p of pairs) {
        if (!p.upstream) dial(p);
        else for (const d of p.toUpstream.splice(0)) p.upstream.write(d);
        for (const d of p.toClient.splice(0)) p.client.write(d);
      }
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const p of pairs) {
          reset(p.client);
          reset(p.upstream);
        }
        pairs.clear();
        server.close(() => resolve());
      }),
  };
}
