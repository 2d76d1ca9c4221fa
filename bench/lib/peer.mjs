/**
 * The peer gateway `npm run bench` compares Switchyard with: Portkey's OSS AI
 * gateway (`@portkey-ai/gateway`, pinned in bench/peer/package.json, with
 * `@hono/node-server` held at 1.14.1 through npm overrides: later versions break
 * its streaming on Node 20, Portkey-AI/gateway#1389). It is installed on demand
 * into bench/peer/node_modules (git-ignored) from the committed lock file, and
 * configured per request (`x-portkey-provider: openai`,
 * `x-portkey-custom-host: <sim>/v1`) to the same sim worker as Switchyard.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const PEER_DIR = fileURLToPath(new URL('../peer/', import.meta.url));
const ENTRY = join(PEER_DIR, 'node_modules', '@portkey-ai', 'gateway', 'build', 'start-server.js');

export const PEER_NAME = 'Portkey AI gateway 1.15.2 (OSS)';

/** Installs the pinned peer once (`npm ci` in bench/peer); returns its entry script. */
export function ensurePeer(log) {
  if (!existsSync(ENTRY)) {
    log(`installing the peer gateway into ${PEER_DIR} (npm ci, once)`);
    execFileSync('npm', ['ci', '--no-audit', '--no-fund', '--loglevel=error'], {
      cwd: PEER_DIR,
      stdio: ['ignore', 'ignore', 'inherit'],
    });
  }
  return ENTRY;
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** Request headers that make the peer proxy to the sim (an OpenAI-compatible host). */
export function peerHeaders(simUrl) {
  return {
    'content-type': 'application/json',
    authorization: 'Bearer bench',
    'x-portkey-provider': 'openai',
    'x-portkey-custom-host': simUrl,
  };
}
