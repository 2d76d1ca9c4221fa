/**
 * The exec broker (role `broker`): ZeroMQ with CURVE and ZAP, the enrollment
 * protocol and agent sessions. `startBroker` is what `switchyard serve` calls;
 * the control plane passes its `AgentDirectory` and receives an
 * `AgentTransport`.
 */
import { join } from 'node:path';
import type { Config } from '../../config/index.js';
import type { Clock } from '../../runtime/clock.js';
import type { Logger } from '../../runtime/logger.js';
import type { AgentDirectory } from '../contracts.js';
import { Broker } from './broker.js';
import { loadBrokerKeyPair } from './keys.js';

export { AgentNotConnectedError, Broker, type BrokerOptions } from './broker.js';
export {
  generateKeyPair,
  keyProof,
  loadBrokerKeyPair,
  publicKeyFromSecret,
  type CurveKeyPair,
} from './keys.js';
export { PROTOCOL_VERSION } from './protocol.js';

/** Name of the broker's key file in the data directory (mode 0600). */
export const BROKER_KEY_FILE = 'exec-broker.key';

export function brokerKeyPair(config: Config) {
  return loadBrokerKeyPair(join(config.dataDir, BROKER_KEY_FILE), config.execSecretKey);
}

export async function startBroker(deps: {
  config: Config;
  directory: AgentDirectory;
  clock: Clock;
  logger: Logger;
}): Promise<Broker> {
  const { config } = deps;
  const host = config.execBind.includes(':') ? `[${config.execBind}]` : config.execBind;
  return Broker.start({
    directory: deps.directory,
    clock: deps.clock,
    logger: deps.logger.child({ component: 'exec-broker' }),
    keyPair: brokerKeyPair(config),
    bind: {
      enroll: `tcp://${host}:${config.execEnrollPort}`,
      agents: `tcp://${host}:${config.execAgentPort}`,
    },
    ...(config.execPublicHost ? { publicHost: config.execPublicHost } : {}),
  });
}
