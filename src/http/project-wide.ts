/**
 * Routes whose path names no endpoint act on the whole project: keys, webhooks at
 * the project path, budget alerts, join keys and agents, the execution surface
 * (tools, workspaces, invocations, approvals, the MCP server, the broker's key). A
 * key bound to an endpoint is refused there (403 `endpoint_restricted`): its binding
 * cannot be checked against a path without an endpoint, and a project-wide resource
 * (an agent enrolled for every endpoint, an alert on the project's spend) is more
 * than the one endpoint the key was given. The chat tool bridge (`x_exec`) reaches
 * the execution plane through its endpoint's path and is not refused.
 */
import { ServiceError } from '../errors/index.js';

/** Throws 403 `endpoint_restricted` when the key is bound to an endpoint. */
export function refuseBoundKey(key: { endpointId: string | null }, what: string): void {
  if (key.endpointId !== null) {
    throw new ServiceError('endpoint_restricted', {
      message: `A key bound to an endpoint cannot use ${what} (project-wide); use a key not bound to an endpoint.`,
    });
  }
}
