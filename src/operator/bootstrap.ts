/**
 * First-run bootstrap of the demo: a model, a project, an endpoint and one API
 * key, created once (a `settings` row marks it done) so that `npm start` on a
 * fresh machine gives a working endpoint. Later starts reuse the records and
 * never mint another key.
 */
import { and, eq } from 'drizzle-orm';
import type { Endpoint } from '../endpoints/repository.js';
import type { Project } from '../projects/repository.js';
import type { Services } from '../runtime/services.js';
import { isUniqueViolation, tables } from '../store/index.js';

const SETTING = 'demo_bootstrap';
export const DEMO_MODEL = 'switchyard-demo';
export const DEMO_TIER = 'cpu';
export const DEMO_CONTEXT_WINDOW = 4096;

export interface DemoInfo {
  project: Project;
  endpoint: Endpoint;
  /** The full key, only on the start that created it. */
  key: string | null;
}

export async function ensureDemo(s: Services): Promise<DemoInfo> {
  const db = s.store.db;
  const now = new Date(s.clock.now());
  const marker = await db
    .select()
    .from(tables.settings)
    .where(eq(tables.settings.key, SETTING))
    .limit(1);
  const saved = marker[0]?.value as { projectId?: string; endpointSlug?: string } | undefined;
  if (saved?.projectId && saved.endpointSlug) {
    const project = await s.projects.find(saved.projectId);
    const endpoint = project ? await s.endpoints.get(project.id, saved.endpointSlug) : null;
    if (project && endpoint) return { project, endpoint, key: null };
  }
  if (marker[0]) {
    // The demo's records were deleted: they are made again, with a new key. Only
    // this stale marker goes (one another instance replaced already stays).
    await db
      .delete(tables.settings)
      .where(and(eq(tables.settings.key, SETTING), eq(tables.settings.value, marker[0].value)));
  }

  // Several instances may start at once on an empty shared database: each record is
  // found or created, and a create another instance won (unique violation) is found.
  const model = await findOrCreate(
    () => s.models.findByName(DEMO_MODEL, null),
    () =>
      s.models.create(
        {
          name: DEMO_MODEL,
          contextWindow: DEMO_CONTEXT_WINDOW,
          capabilities: ['tool_calling', 'json_schema', 'logprobs'],
          ownedBy: 'switchyard',
        },
        now,
      ),
  );
  const project = await findOrCreate(
    () => s.projects.find('demo'),
    () => s.projects.create({ slug: 'demo', name: 'Demo project', creditCents: 10_000 }, now),
  );
  const endpoint = await findOrCreate(
    () => s.endpoints.get(project.id, 'demo'),
    () =>
      s.endpoints.create(
        {
          projectId: project.id,
          slug: 'demo',
          name: 'Demo endpoint',
          modelId: model.id,
          tierId: DEMO_TIER,
          maxRequestsPerMinute: 192,
          maxTokensPerMinute: 1_000_000,
          status: 'provisioning',
          provisioningState: 'waiting_for_worker',
          provisionedWorkerId: null,
        },
        now,
      ),
  );
  // The marker is the claim: the one instance whose insert lands mints the key, so
  // there is one demo key however many start together. (An instance that dies
  // between the two leaves the demo without a key: `switchyard admin key create`.)
  const claimed = await db
    .insert(tables.settings)
    .values({ key: SETTING, value: { projectId: project.externalId, endpointSlug: endpoint.slug } })
    .onConflictDoNothing()
    .returning({ key: tables.settings.key });
  if (claimed.length === 0) return { project, endpoint, key: null };
  const { value } = await s.keys.create(
    project,
    { name: 'demo', scopes: ['inference', 'management'] },
    now,
  );
  return { project, endpoint, key: value };
}

async function findOrCreate<T>(
  find: () => Promise<T | null>,
  create: () => Promise<T>,
): Promise<T> {
  const found = await find();
  if (found) return found;
  try {
    return await create();
  } catch (err) {
    if (!isUniqueViolation(err)) throw err;
    const winner = await find();
    if (!winner) throw err;
    return winner;
  }
}
