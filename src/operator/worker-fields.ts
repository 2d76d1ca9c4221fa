/**
 * What an operator's `POST /workers` and a worker's self-registration share: the
 * worker's URL and the model it serves.
 *
 * The model a worker serves, named by the operator's `POST /workers` or by a
 * worker registering itself. Model names are unique among the platform's models
 * and within each project's own, so a name may belong to several projects:
 * `project` (an id as in `/projects/{project}`) picks that project's own model,
 * or the platform's if it has none of that name. Without `project` the name means
 * the platform's model, else the one project model so named; when several
 * projects have it, the request must say which (400 naming `project`).
 */
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import type { ModelRecord } from '../models/repository.js';
import type { Services } from '../runtime/services.js';

/**
 * A worker's OpenAI base URL: http(s), its path ending in /v1, without a query or
 * fragment (the router appends `/chat/completions` to the path and sends neither).
 * Credentials in it are refused: the router would not send them (workers are reached
 * without them) and the URL is shown in the operator API and logged with the
 * worker's health.
 */
export const workerUrl = z
  .url({ protocol: /^https?$/ })
  .max(2048)
  .refine((u) => {
    // Runs on what failed `url()` too: an unparsable value is that check's to name.
    const parsed = URL.parse(u);
    return !parsed || (/\/v1\/?$/.test(parsed.pathname) && !/[?#]/.test(u));
  }, 'must end in /v1, without a query or fragment')
  .refine((u) => {
    // Runs on what failed `url()` too: an unparsable value is that check's to name.
    const parsed = URL.parse(u);
    return !parsed || (parsed.username === '' && parsed.password === '');
  }, 'must not hold a user name or password');

/** The project whose own model a worker's `model` names, when projects share the name. */
export const workerProject = z.string().min(1).max(200).optional();

export async function workerModel(
  s: Services,
  name: string,
  projectRef: string | undefined,
): Promise<ModelRecord> {
  const notFound = () =>
    new ServiceError('model_not_found', { message: `No model '${name}'.`, param: 'model' });
  if (projectRef !== undefined) {
    const p = await s.projects.find(projectRef);
    if (!p) {
      throw new ServiceError('project_not_found', {
        message: `No project '${projectRef}'.`,
        param: 'project',
      });
    }
    const m = await s.models.findByName(name, p.id);
    if (!m) throw notFound();
    return m;
  }
  const named = await s.models.named(name);
  const first = named[0];
  if (!first) throw notFound();
  if (first.projectId === null || named.length === 1) return first;
  throw new ServiceError('missing_required_parameter', {
    message: `${named.length} projects have a model named '${name}' and the platform has none: say which project's with 'project'.`,
    param: 'project',
  });
}
