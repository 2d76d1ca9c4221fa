/**
 * Test doubles for the transport: an in-memory `AgentDirectory` that records
 * every call, a silent logger, manifests and polling helpers.
 */
import { validateManifest } from '../../src/exec/manifest.js';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import type {
  AgentDirectory,
  DispatchOutcome,
  EnrollRequest,
  EnrollResult,
} from '../../src/exec/contracts.js';
import { Broker } from '../../src/exec/broker/index.js';
import { generateKeyPair, type CurveKeyPair } from '../../src/exec/broker/keys.js';
import { FakeClock } from '../../src/runtime/clock.js';

export const JOIN_KEY = 'swyjk_test_join_key_secret';

export const silentLogger = pino({ level: 'silent' });

interface AgentRecord {
  agentId: string;
  name: string;
  key: string;
}

export class FakeDirectory implements AgentDirectory {
  leaseMs = 300;
  readonly joinKeys = new Set([JOIN_KEY]);
  /** Names a join key reserved for another live agent (→ agent_name_in_use). */
  readonly reservedNames = new Set<string>();
  readonly agents = new Map<string, AgentRecord>(); // by key
  readonly enrolls: EnrollRequest[] = [];
  readonly renewals: string[] = [];
  readonly startedCalls: Array<{ invocationId: string; agentId: string }> = [];
  readonly finishedCalls: Array<{
    invocationId: string;
    agentId: string;
    outcome: DispatchOutcome;
  }> = [];
  keyLookups = 0;
  private seq = 0;

  async enroll(req: EnrollRequest): Promise<EnrollResult> {
    this.enrolls.push(req);
    if (!this.joinKeys.has(req.joinKey)) {
      return { ok: false, code: 'join_key_invalid', message: 'join key unknown or revoked' };
    }
    const m = req.manifest as { version?: unknown; tools?: Array<Record<string, unknown>> };
    if (m?.version !== 1 || !Array.isArray(m.tools)) {
      return { ok: false, code: 'exec_manifest_invalid', message: 'bad manifest', param: 'tools' };
    }
    const bad = m.tools.findIndex((t) => typeof t.input_schema !== 'object');
    if (bad >= 0) {
      return {
        ok: false,
        code: 'exec_manifest_invalid',
        message: 'input_schema must be an object',
        param: `tools[${bad}].input_schema`,
      };
    }
    if (this.reservedNames.has(req.registrationName)) {
      return { ok: false, code: 'agent_name_in_use', message: 'name used by a live agent' };
    }
    const sameName = [...this.agents.values()].find((a) => a.name === req.registrationName);
    if (sameName && sameName.key !== req.curvePublicKey) {
      return { ok: false, code: 'agent_name_conflict', message: 'name enrolled with another key' };
    }
    const rec = this.agents.get(req.curvePublicKey) ?? {
      agentId: `agt_${(++this.seq).toString(16).padStart(8, '0')}`,
      name: req.registrationName,
      key: req.curvePublicKey,
    };
    this.agents.set(req.curvePublicKey, rec);
    return {
      ok: true,
      agentId: rec.agentId,
      projectId: '00000000-0000-0000-0000-000000000001',
      // What the control plane records: the canonical hash of the validated manifest.
      manifestHash: (() => {
        const v = validateManifest(req.manifest);
        return v.ok ? v.hash : 'sha256:invalid';
      })(),
      leaseMs: this.leaseMs,
    };
  }

  async agentForKey(key: string): Promise<{ agentId: string } | null> {
    this.keyLookups++;
    const rec = this.agents.get(key);
    return rec ? { agentId: rec.agentId } : null;
  }

  async renew(agentId: string, agentKey?: string): Promise<{ leaseMs: number } | null> {
    this.renewals.push(agentId);
    return [...this.agents.values()].some(
      (a) => a.agentId === agentId && (agentKey === undefined || a.key === agentKey),
    )
      ? { leaseMs: this.leaseMs }
      : null;
  }

  /** The agent's key replaced, as the API's rotate_key does. */
  rotate(agentId: string, newKey: string): void {
    const rec = [...this.agents.values()].find((a) => a.agentId === agentId)!;
    this.agents.delete(rec.key);
    this.agents.set(newKey, { ...rec, key: newKey });
  }

  async started(invocationId: string, agentId: string): Promise<void> {
    this.startedCalls.push({ invocationId, agentId });
  }

  async finished(invocationId: string, agentId: string, outcome: DispatchOutcome): Promise<void> {
    this.finishedCalls.push({ invocationId, agentId, outcome });
  }

  /** Registers an agent directly (as if enrolled earlier). */
  add(key: string, name = 'pre-enrolled'): string {
    const agentId = `agt_${(++this.seq).toString(16).padStart(8, '0')}`;
    this.agents.set(key, { agentId, name, key });
    return agentId;
  }

  outcomeOf(invocationId: string): DispatchOutcome | undefined {
    return this.finishedCalls.find((f) => f.invocationId === invocationId)?.outcome;
  }
}

export async function startTestBroker(
  directory: AgentDirectory,
  opts: {
    keyPair?: CurveKeyPair;
    bind?: { enroll: string; agents: string };
    clock?: FakeClock;
  } = {},
): Promise<{ broker: Broker; clock: FakeClock; keyPair: CurveKeyPair }> {
  const clock = opts.clock ?? new FakeClock();
  const keyPair = opts.keyPair ?? generateKeyPair();
  const broker = await Broker.start({
    directory,
    clock,
    logger: silentLogger,
    keyPair,
    bind: opts.bind ?? { enroll: 'tcp://127.0.0.1:0', agents: 'tcp://127.0.0.1:0' },
  });
  return { broker, clock, keyPair };
}

/** Polls until `check` returns a value other than undefined/false. */
export async function eventually<T>(
  check: () => T | undefined | false,
  timeoutMs = 5_000,
  what = 'condition',
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = check();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

export function tempDir(prefix: string): { dir: string; cleanup(): void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

export const sh = (script: string) => ['sh', '-c', script];

/** A manifest file with the tools the tests use. */
export function manifestFile(dir: string, extra: Array<Record<string, unknown>> = []): string {
  const tool = (name: string, command: string[], more: Record<string, unknown> = {}) => ({
    name,
    description: `${name} tool`,
    input_schema: { type: 'object' },
    risk: 'low',
    mcp_visible: true,
    default_timeout_ms: 10_000,
    command,
    ...more,
  });
  const manifest = {
    version: 1,
    tools: [
      tool('echo', sh('cat; echo; echo "env:$SWITCHYARD_TOOL_ARGS"; echo oops >&2; exit 3')),
      tool('sleep', sh('sleep 5')),
      tool('stubborn', sh(`trap 'echo term >> "$MARK"' TERM; while :; do sleep 0.02; done`), {
        env: { MARK: join(dir, 'term-mark') },
      }),
      tool('flood', sh('head -c 200000 /dev/zero | tr "\\0" x')),
      ...extra,
    ],
  };
  const path = join(dir, 'manifest.json');
  writeFileSync(path, JSON.stringify(manifest));
  return path;
}
