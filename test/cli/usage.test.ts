/**
 * The binary's help and bad flags, as an operator meets them: every command answers
 * `--help` with its usage on stdout (exit 0), and an unknown flag or a missing model
 * file with the reason and the usage on stderr (exit 2), never a stack trace.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { runSwitchyard } from '../support/process.js';

describe('switchyard usage', () => {
  it('--help: each command prints its usage and exits 0', async () => {
    for (const [args, first] of [
      [['--help'], /^usage: switchyard <command>/],
      [['serve', '--help'], /^usage: switchyard serve \[--port N\]/],
      [['worker', '-h'], /^usage: switchyard worker \[--engine sim\|llama\]/],
      [['agent', '--help'], /^usage: switchyard agent /],
      [['admin', '--help'], /^usage: switchyard admin /],
    ] as Array<[string[], RegExp]>) {
      const r = await runSwitchyard(args, {});
      assert.equal(r.code, 0, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stdout, first, args.join(' '));
    }
    // What the worker's usage names is what it accepts.
    const w = await runSwitchyard(['worker', '--help'], {});
    for (const flag of [
      '--ttft-ms',
      '--tpot-ms',
      '--max-running',
      '--kv-cache-tokens',
      '--model',
    ]) {
      assert.ok(w.stdout.includes(flag), flag);
    }
  });

  it('a bad flag or a missing model file: the reason and the usage, exit 2', async () => {
    for (const [args, reason] of [
      [['serve', '--bogus'], /^switchyard serve: Unknown option '--bogus'/],
      [['worker', '--bogus'], /^switchyard worker: Unknown option '--bogus'/],
      [
        ['worker', '--engine', 'llama', '--model', '/no/such/model.gguf'],
        /^switchyard worker: --model: no GGUF file at \/no\/such\/model\.gguf/,
      ],
    ] as Array<[string[], RegExp]>) {
      const r = await runSwitchyard(args, {});
      assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr, reason);
      assert.doesNotMatch(r.stderr, /\n\s+at /, 'no stack trace');
    }
  });
  it('admin: a missing required flag or a bad number is bad usage, exit 2, before any request', async () => {
    // Nothing listens on port 9: a request would fail with exit 1.
    const env = { SWITCHYARD_URL: 'http://127.0.0.1:9', SWITCHYARD_ADMIN_TOKEN: 'swyop_x' };
    for (const [args, reason] of [
      [['admin', 'project', 'create'], /^switchyard admin: --slug is required/],
      [['admin', 'key', 'list'], /^switchyard admin: --project is required/],
      [
        ['admin', 'model', 'create', '--name', 'm', '--context-window', 'lots'],
        /^switchyard admin: --context-window must be an integer/,
      ],
      [
        ['admin', 'user', 'password', 'u1'],
        /^switchyard admin: user password: give --password-stdin/,
      ],
    ] as Array<[string[], RegExp]>) {
      const r = await runSwitchyard(args, env);
      assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr, reason);
      assert.match(r.stderr, /^usage: switchyard admin /m);
    }
  });
  it('admin: an empty SWITCHYARD_URL is unset, as every setting: the default URL', async () => {
    const r = await runSwitchyard(['admin', 'project', 'list'], {
      SWITCHYARD_URL: '',
      PORT: '9', // nothing listens there
      SWITCHYARD_ADMIN_TOKEN: 'swyop_x',
    });
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /ECONNREFUSED 127\.0\.0\.1:9/);
  });
});
