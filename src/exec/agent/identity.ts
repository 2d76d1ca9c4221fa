/**
 * The agent's identity file: its CURVE keypair (created on first start), and
 * once enrolled the agent id, the broker key it enrolled with and the
 * registration name. Mode 0600: the secret key is the agent's credential.
 * Keeping the file keeps the identity across restarts; deleting it makes a new
 * agent (which needs a join key again).
 */
import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { checkKeyPair, generateKeyPair, writePrivateJson } from '../broker/keys.js';

export interface AgentIdentity {
  publicKey: string;
  secretKey: string;
  agentId?: string;
  /** The broker public key the agent enrolled with; another broker means enrolling again. */
  serverKey?: string;
  registrationName?: string;
  manifestHash?: string;
}

/** The identity file exists but holds no identity (damaged, truncated, another file). */
export class IdentityFileError extends Error {}

const fileSchema = z.object({
  version: z.literal(1),
  public_key: z.string(),
  secret_key: z.string(),
  agent_id: z.string().optional(),
  server_key: z.string().optional(),
  registration_name: z.string().optional(),
  manifest_hash: z.string().optional(),
});

export function loadOrCreateIdentity(path: string): { identity: AgentIdentity; created: boolean } {
  let raw: string;
  try {
    raw = readFileSync(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    const identity: AgentIdentity = generateKeyPair();
    saveIdentity(path, identity);
    return { identity, created: true };
  }
  const notAKeyFile = (why: string) =>
    new IdentityFileError(`key file ${path} is not a switchyard agent key file (${why})`);
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch {
    throw notAKeyFile('not JSON: truncated or damaged?');
  }
  const parsed = fileSchema.safeParse(json);
  if (!parsed.success) throw notAKeyFile('unexpected content');
  const f = parsed.data;
  let pair;
  try {
    pair = checkKeyPair({ publicKey: f.public_key, secretKey: f.secret_key });
  } catch (err) {
    throw notAKeyFile((err as Error).message);
  }
  return {
    identity: {
      ...pair,
      ...(f.agent_id !== undefined ? { agentId: f.agent_id } : {}),
      ...(f.server_key !== undefined ? { serverKey: f.server_key } : {}),
      ...(f.registration_name !== undefined ? { registrationName: f.registration_name } : {}),
      ...(f.manifest_hash !== undefined ? { manifestHash: f.manifest_hash } : {}),
    },
    created: false,
  };
}

export function saveIdentity(path: string, id: AgentIdentity): void {
  writePrivateJson(path, {
    version: 1,
    public_key: id.publicKey,
    secret_key: id.secretKey,
    agent_id: id.agentId,
    server_key: id.serverKey,
    registration_name: id.registrationName,
    manifest_hash: id.manifestHash,
  });
}
