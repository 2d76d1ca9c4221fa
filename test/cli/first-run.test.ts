/**
 * A fresh data directory, `switchyard serve` as `npm start` runs it: the banner's
 * curl returns the demo endpoint in the spec's shape; `switchyard admin --json`
 * commands chain in a script; a second start reuses the data and prints no key.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { runSwitchyard, spawnSwitchyard, type Spawned } from '../support/process.js';

const run = promisify(execFile);

describe('first run of switchyard serve', () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'swy-first-run-'));
  const env = { SWITCHYARD_DATA_DIR: dataDir, PORT: '0', LOG_LEVEL: 'warn' };
  let server: Spawned | undefined;
  after(async () => {
    await server?.stop();
    rmSync(dataDir, { recursive: true, force: true });
  });

  let projectId = '';
  let baseUrl = '';

  it('prints the base URL, project, endpoint, a key and snippets that work', async () => {
    server = spawnSwitchyard(['serve'], env);
    await server.waitFor(/const r = await client\.chat\.completions\.create/);
    const out = server.stdout();
    baseUrl = out.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/)![1]!;
    projectId = out.match(/Demo project: (proj_[0-9a-f]+)/)![1]!;
    assert.match(out, /endpoint: demo/);
    const key = out.match(/Demo API key \(shown once, store it now\):\n\s+(swy_demo_\S+)/)![1]!;
    assert.match(key, /^swy_demo_[A-Za-z0-9_-]{43}$/);
    assert.match(out, /Operator token \(shown once/);
    assert.match(out, new RegExp(`baseURL: '${baseUrl}/${projectId}/demo/v1'`));

    // Run the printed curl exactly as a user would paste it.
    const curlLine = out
      .split('\n')
      .find((l) => l.trim().startsWith(`curl -s ${baseUrl}/${projectId}/v1/endpoints`))!;
    const { stdout } = await run('bash', ['-c', curlLine.trim()]);
    const listed = JSON.parse(stdout) as { object: string; data: Array<Record<string, unknown>> };
    assert.equal(listed.object, 'list');
    assert.equal(listed.data.length, 1);
    const e = listed.data[0]!;
    assert.equal(e.object, 'endpoint');
    assert.equal(e.slug, 'demo');
    assert.equal(e.status, 'active');
    assert.equal(e.provisioned_worker_id, 'embedded-demo');
    assert.equal(e.model_name, 'switchyard-demo');
    assert.ok(
      !server.stdout().includes('"level"'),
      'no JSON log lines at warn level on a clean start',
    );
  });

  it('switchyard admin --json commands chain in a script', async () => {
    const adminEnv = { ...env, SWITCHYARD_URL: baseUrl };
    const script = `
      set -euo pipefail
      sw() { node "$BIN" admin --json "$@"; }
      pid=$(sw project create --slug scripted --name Scripted | node -e 'process.stdin.on("data",d=>console.log(JSON.parse(d).id))')
      sw model create --name scripted-model --context-window 2048 --capability tool_calling >/dev/null
      sw endpoint create --project "$pid" --slug chat --name Chat --model scripted-model --tier gpu >/dev/null
      key=$(sw key create --project "$pid" --scope inference | node -e 'process.stdin.on("data",d=>console.log(JSON.parse(d).key))')
      curl -s "$SWITCHYARD_URL/$pid/v1/endpoints" -H "Authorization: Bearer $key"
    `;
    const { stdout } = await run('bash', ['-c', script], {
      env: {
        ...process.env,
        ...adminEnv,
        BIN: join(import.meta.dirname, '..', '..', 'bin', 'switchyard.js'),
      },
    });
    const listed = JSON.parse(stdout) as { data: Array<Record<string, unknown>> };
    assert.deepEqual(
      listed.data.map((e) => [e.slug, e.tier_id, e.model_name, e.status]),
      [['chat', 'gpu', 'scripted-model', 'provisioning']],
    );

    const human = await runSwitchyard(['admin', 'project', 'list'], adminEnv);
    assert.equal(human.code, 0, human.stderr);
    assert.match(human.stdout, /scripted/);
    const worker = await runSwitchyard(
      [
        'admin',
        '--json',
        'worker',
        'add',
        '--model',
        'scripted-model',
        '--tier',
        'cpu',
        '--worker-url',
        'http://127.0.0.1:9/v1',
        '--scheduling-policy',
        'priority',
      ],
      adminEnv,
    );
    assert.equal(worker.code, 0, worker.stderr);
    const added = JSON.parse(worker.stdout) as { id: string; scheduling_policy: string };
    assert.equal(added.scheduling_policy, 'priority');
    const drained = await runSwitchyard(['admin', 'worker', 'drain', added.id], adminEnv);
    assert.equal(drained.code, 0, drained.stderr);
    assert.match(drained.stdout, /^wkr_\S+\s+http:\/\/127\.0\.0\.1:9\/v1\s+draining$/m);
    const workerList = await runSwitchyard(['admin', '--json', 'worker', 'list'], adminEnv);
    const rows = (JSON.parse(workerList.stdout) as { data: Array<{ id: string; status: string }> })
      .data;
    assert.equal(rows.find((w) => w.id === added.id)?.status, 'draining');
    const resumed = await runSwitchyard(
      ['admin', '--json', 'worker', 'resume', added.id],
      adminEnv,
    );
    assert.equal(resumed.code, 0, resumed.stderr);
    assert.notEqual((JSON.parse(resumed.stdout) as { status: string }).status, 'draining');
    const bad = await runSwitchyard(['admin', 'project', 'create', '--slug', 'Bad_Slug'], adminEnv);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /invalid_body: .*\(param: slug\)/);
    const noToken = await runSwitchyard(['admin', 'project', 'list'], {
      SWITCHYARD_URL: baseUrl,
      SWITCHYARD_DATA_DIR: join(dataDir, 'elsewhere'),
    });
    assert.equal(noToken.code, 2);
  });

  it('a second start reuses the data and prints no key', async () => {
    assert.equal(await server!.stop(), 0);
    server = spawnSwitchyard(['serve'], env);
    await server.waitFor(/Try it:/);
    const out = server.stdout();
    assert.equal(out.match(/Demo project: (proj_[0-9a-f]+)/)![1], projectId);
    assert.doesNotMatch(out, /swy_demo_[A-Za-z0-9_-]{43}/);
    assert.doesNotMatch(out, /Operator token/);
    assert.match(out, /shown on the first start/);
  });
});

describe('switchyard admin key and webhook commands', () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'swy-admin-cli-'));
  const env = {
    SWITCHYARD_DATA_DIR: dataDir,
    PORT: '0',
    LOG_LEVEL: 'warn',
    SWITCHYARD_DEMO: '0',
    SWITCHYARD_ADMIN_TOKEN: 'cli-test-token',
  };
  let server: Spawned | undefined;
  let base: string;
  before(async () => {
    server = spawnSwitchyard(['serve'], env);
    base = (await server.waitFor(/listening on (http:\/\/127\.0\.0\.1:\d+)/))[1]!;
  });
  after(async () => {
    await server?.stop();
    rmSync(dataDir, { recursive: true, force: true });
  });
  /** `switchyard admin --json …`, expected to succeed: its JSON. */
  const cli = async (...args: string[]) => {
    const r = await runSwitchyard(['admin', '--json', ...args], { ...env, SWITCHYARD_URL: base });
    assert.equal(r.code, 0, `${args.join(' ')}: ${r.stderr}`);
    return JSON.parse(r.stdout) as Record<string, unknown>;
  };

  it('rotate and revoke keys; create, list, test and delete webhooks', async () => {
    const p = await cli('project', 'create', '--slug', 'clip', '--name', 'CLI');
    const pid = String(p.id);
    const k = await cli('key', 'create', '--project', pid, '--scope', 'management');
    const rotated = await cli('key', 'rotate', String(k.id), '--project', pid);
    assert.notEqual(rotated.key, k.key);
    assert.equal(rotated.id, k.id);
    const listed = await cli('key', 'list', '--project', pid);
    assert.equal((listed.data as unknown[]).length, 1);
    // Webhooks use the (rotated) management key; an https URL that resolves publicly
    // is needed, so expect the SSRF refusal for a loopback one instead.
    const refused = await runSwitchyard(
      [
        'admin',
        'webhook',
        'create',
        '--project',
        pid,
        '--hook-url',
        'https://127.0.0.1/h',
        '--event',
        'exec.failed',
        '--key',
        String(rotated.key),
      ],
      { ...env, SWITCHYARD_URL: base },
    );
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /invalid_body: .*\(param: url\)/);
    const none = await cli('webhook', 'list', '--project', pid, '--key', String(rotated.key));
    assert.deepEqual(none.data, []);
    const revoked = await cli('key', 'revoke', String(k.id), '--project', pid);
    assert.equal(revoked.status, 'revoked');
    const after = await runSwitchyard(
      ['admin', 'webhook', 'list', '--project', pid, '--key', String(rotated.key)],
      { ...env, SWITCHYARD_URL: base },
    );
    assert.equal(after.code, 1);
    assert.match(after.stderr, /invalid_api_key/);
  });

  it('--limit and --after page through the webhooks', async () => {
    const pid = String((await cli('project', 'create', '--slug', 'pages')).id);
    const key = String((await cli('key', 'create', '--project', pid, '--scope', 'management')).key);
    const hook = (...args: string[]) => cli('webhook', ...args, '--project', pid, '--key', key);
    const made: string[] = [];
    for (const n of [1, 2]) {
      const w = await hook(
        'create',
        '--hook-url',
        // A public address: accepted (no event is ever delivered in this test).
        `https://93.184.215.14/h${n}`,
        '--event',
        'exec.failed',
      );
      made.push(String(w.id));
    }
    const first = await hook('list', '--limit', '1');
    const ids = (r: Record<string, unknown>) => (r.data as Array<{ id: string }>).map((w) => w.id);
    assert.equal(ids(first).length, 1);
    assert.equal(first.has_more, true);
    const second = await hook('list', '--limit', '1', '--after', ids(first)[0]!);
    assert.equal(second.has_more, false);
    assert.deepEqual([...ids(first), ...ids(second)].sort(), [...made].sort());
  });
});
