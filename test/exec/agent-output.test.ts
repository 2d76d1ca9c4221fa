/**
 * What a real `switchyard agent` answers is stored whatever bytes the tool wrote: a
 * U+0000 (binary output, `find -print0`) cannot go in a PostgreSQL text column, so it
 * is kept as U+FFFD, as a worker's answer is (src/store/storable.ts), instead of the
 * result failing to record and the invocation hanging until the timeout backstop.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startTestServer, type TestServer } from '../support/harness.js';
import { startRealAgent, until, type RealAgent } from './agents.js';
import { joinKey, seedExecProject, workspace, type ExecProject } from './support.js';

describe('agent output with NUL bytes (real switchyard agent)', () => {
  let s: TestServer;
  let p: ExecProject;
  let agent: RealAgent;
  const dir = mkdtempSync(join(tmpdir(), 'swy-exec-output-'));
  before(async () => {
    s = await startTestServer();
    p = await seedExecProject(s, 'agent-output');
    agent = await startRealAgent(s, {
      dir,
      name: 'nul-writer',
      joinKey: await joinKey(s, p),
      tools: [
        {
          name: 'print0',
          description: 'Writes NUL-separated names to stdout and stderr.',
          input_schema: { type: 'object' },
          risk: 'read_only',
          default_timeout_ms: 10_000,
          command: ['sh', '-c', "printf 'a\\000b\\000'; printf 'e\\000' >&2"],
        },
      ],
    });
  });
  after(async () => {
    await agent?.close();
    await s?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('completes with each NUL kept as U+FFFD in stdout and stderr', async () => {
    const r = await s.call('POST', `/${p.projectId}/v1/exec/invocations`, {
      key: p.exec,
      body: { tool: 'print0', arguments: {}, workspace_id: await workspace(s, p) },
    });
    assert.equal(r.status, 201, r.text);
    const id = String(r.body.id);
    const done = await until(
      async () => {
        const g = await s.call('GET', `/${p.projectId}/v1/exec/invocations/${id}`, {
          key: p.exec,
        });
        return ['completed', 'failed', 'cancelled'].includes(String(g.body.status)) && g;
      },
      10_000,
      'the invocation to end',
    );
    assert.equal(done.body.status, 'completed', done.text);
    assert.equal(done.body.exit_code, 0);
    assert.equal(done.body.stdout, 'a\uFFFDb\uFFFD');
    assert.equal(done.body.stderr, 'e\uFFFD');
  });
});
