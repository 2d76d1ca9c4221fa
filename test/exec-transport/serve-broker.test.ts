/**
 * `switchyard serve` starts the exec broker (role `broker`, on by default):
 * the banner shows its endpoints and server key, the key is kept in the data
 * directory with mode 0600, and the real control plane answers an agent's
 * enrollment through it (a bogus join key → `join_key_invalid`, exit 3).
 */
import assert from 'node:assert/strict';
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { runSwitchyard, spawnSwitchyard, type Spawned } from '../support/process.js';
import { tempDir } from './support.js';

describe('serve runs the exec broker', () => {
  const tmp = tempDir('swy-serve-broker-');
  let server: Spawned | undefined;
  after(async () => {
    await server?.stop();
    tmp.cleanup();
  });

  it('prints the broker endpoints and key; enrollment reaches the control plane', async () => {
    const dataDir = join(tmp.dir, 'data');
    server = spawnSwitchyard(['serve'], {
      SWITCHYARD_DATA_DIR: dataDir,
      PORT: '0',
      SWITCHYARD_DEMO: '0',
      LOG_LEVEL: 'warn',
    });
    const [, enroll, agents] = await server.waitFor(
      /Exec broker: enroll (tcp:\/\/127\.0\.0\.1:\d+)\s+agents (tcp:\/\/127\.0\.0\.1:\d+)/,
    );
    const [, serverKey] = await server.waitFor(/Exec broker server key: (\S{40})/);
    const file = join(dataDir, 'exec-broker.key');
    assert.equal(statSync(file).mode & 0o777, 0o600);
    assert.equal(
      (JSON.parse(readFileSync(file, 'utf8')) as { public_key: string }).public_key,
      serverKey,
    );

    const manifest = join(tmp.dir, 'manifest.json');
    writeFileSync(
      manifest,
      JSON.stringify({
        version: 1,
        tools: [
          {
            name: 'noop',
            description: 'does nothing',
            input_schema: { type: 'object' },
            risk: 'low',
            mcp_visible: false,
            default_timeout_ms: 1000,
            command: ['true'],
          },
        ],
      }),
    );
    const r = await runSwitchyard(
      ['agent', `--enroll-endpoint=${enroll}`, `--endpoint=${agents}`, `--server-key=${serverKey}`],
      {
        SWITCHYARD_AGENT_MANIFEST: manifest,
        SWITCHYARD_AGENT_NAME: 'probe',
        SWITCHYARD_AGENT_JOIN_KEY: 'swyjk_bogus',
        SWITCHYARD_AGENT_KEY_FILE: join(tmp.dir, 'agent.key'),
        LOG_LEVEL: 'warn',
      },
    );
    assert.equal(r.code, 3, r.stderr);
    assert.match(r.stderr, /^enrollment rejected: join_key_invalid: /m);
    assert.ok(!server.stdout().includes('swyjk_bogus'), 'join key not logged by the router');
  });
});
