/**
 * The agent's manifest file: the capability manifest the router validates at
 * enrollment, plus what stays on this machine: how to run each tool
 * (`command` argv, optional `cwd` relative to the manifest file, optional
 * `env`). Only the local part is checked here; the router validates the rest
 * and answers `exec_manifest_invalid` naming the field.
 */
import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { z } from 'zod';
import type { ToolCommand } from './runner.js';

const localTool = z
  .object({
    name: z.string().min(1),
    command: z.array(z.string().min(1)).min(1),
    cwd: z.string().min(1).optional(),
    env: z.record(z.string(), z.string()).optional(),
  })
  .loose();

// `version` and the declared fields (duplicate names included) are the router's to
// judge: it answers `exec_manifest_invalid` naming the field, the spec's code.
const manifestFile = z.object({ tools: z.array(localTool) }).loose();

export interface LocalManifest {
  /** What is sent at enrollment: the file without `command`, `cwd`, `env`. */
  manifest: { tools: Array<Record<string, unknown>> } & Record<string, unknown>;
  /** How to run each tool, by name. */
  commands: Map<string, ToolCommand>;
}

export class ManifestFileError extends Error {}

export function parseManifest(raw: unknown, baseDir: string): LocalManifest {
  const parsed = manifestFile.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const where = issue && issue.path.length ? `${issue.path.join('.')}: ` : '';
    throw new ManifestFileError(`manifest: ${where}${issue?.message ?? 'invalid'}`);
  }
  const commands = new Map<string, ToolCommand>();
  const tools: Array<Record<string, unknown>> = [];
  for (const t of parsed.data.tools) {
    const { command, cwd, env, ...declared } = t;
    // A duplicate name is sent as written (the router refuses it); the first one runs.
    if (!commands.has(t.name))
      commands.set(t.name, {
        command,
        ...(cwd !== undefined ? { cwd: resolve(baseDir, cwd) } : {}),
        ...(env !== undefined ? { env } : {}),
      });
    tools.push(declared);
  }
  return { manifest: { ...parsed.data, tools }, commands };
}

export function loadManifestFile(path: string): LocalManifest {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, 'utf8'));
  } catch (err) {
    throw new ManifestFileError(`manifest ${path}: ${(err as Error).message}`);
  }
  return parseManifest(raw, dirname(resolve(path)));
}
