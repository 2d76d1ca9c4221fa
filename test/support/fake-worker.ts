/**
 * A test's own OpenAI-compatible worker (one that misbehaves the way the test needs):
 * `server` listening on a free loopback port, its `/v1` base URL, and a close that
 * drops the connections the router keeps alive.
 */
import { once } from 'node:events';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export async function listenWorker(
  server: Server,
): Promise<{ url: string; close: () => Promise<void> }> {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    close: async () => {
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    },
  };
}

/**
 * A request listener for a fake worker that answers POSTs from their JSON body
 * (`handle`), and anything else (the router's health checks) with an empty 200.
 */
export function onPost(
  handle: (body: Record<string, unknown>, res: ServerResponse) => void,
): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    let raw = '';
    req.setEncoding('utf8');
    req.on('data', (d: string) => (raw += d));
    req.on('end', () => {
      if (req.method !== 'POST') {
        res.end('');
        return;
      }
      handle(JSON.parse(raw) as Record<string, unknown>, res);
    });
  };
}
