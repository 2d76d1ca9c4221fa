/**
 * OpenAI's Stored Chat Completions API under `/<project_id>/<endpoint_slug>/v1`
 * (scope `inference`), so `client.chat.completions.list`, `retrieve`, `update`,
 * `delete` and `messages.list` of the official SDKs work unchanged:
 * `GET /chat/completions` (`model`, `metadata[key]=value`, `after`, `limit` 1–100
 * (20), `order` (`asc`)), `GET`/`POST` (`{metadata}`)/`DELETE
 * /chat/completions/{id}`, `GET /chat/completions/{id}/messages` (`after`, `limit`,
 * `order` (`asc`)). What is stored, and when: service.ts.
 *
 * Access as the conversations' and files' routes (files/access.ts): a key of the
 * path's project with scope `inference` (and its own quota), the path's endpoint
 * must exist and the key's binding allow it, then the project's shared management
 * limit (60 a minute). A bound key sees only what its endpoint made; an id of
 * another project, or of another endpoint for a bound key, is 404
 * `chat_completion_not_found`.
 */
import type { FastifyInstance, FastifyPluginAsync, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { ServiceError } from '../errors/index.js';
import { surfaceAccess } from '../files/access.js';
import { listPage, listQuery, parseField } from '../http/validate.js';
import type { Services } from '../runtime/services.js';
import type { ListOptions, StoredCompletions, Viewer } from './service.js';

const metadata = z
  .record(
    z.string().max(64, 'keys up to 64 characters'),
    z.string().max(512, 'values up to 512 characters'),
  )
  .refine((m) => Object.keys(m).length <= 16, 'at most 16 pairs');

const updateBody = z.strictObject({ metadata: metadata.nullable() });

/** The query fields read; a repeated one (an array) is the wrong type. */
const pageQuery = z.object({
  after: z.string().optional(),
  limit: z.string().optional(),
  order: z.string().optional(),
});
const listQueryFields = pageQuery.extend({ model: z.string().optional() });

/**
 * `metadata[key]`, as the SDKs write a filter (qs's bracket form): the key is all
 * between the first `[` and the last `]`, so a key holding brackets is matched as
 * it was sent. Any other parameter named `metadata…` is refused, not ignored.
 */
const METADATA_FILTER = /^metadata\[(.*)\]$/s;

type Query = Record<string, unknown>;

function page(q: Query) {
  const p = parseField(pageQuery, q);
  // OpenAI's default order for these lists is ascending.
  return listQuery({ ...p, order: p.order ?? 'asc' });
}

function listOptions(q: Query): ListOptions {
  const fields = parseField(listQueryFields, q);
  // No prototype: `metadata[__proto__]=v` is a key like any other, not a lost one.
  const filters: Record<string, string> = Object.create(null) as Record<string, string>;
  for (const [k, v] of Object.entries(q)) {
    if (!k.startsWith('metadata')) continue;
    const m = METADATA_FILTER.exec(k);
    if (m === null) {
      throw new ServiceError('invalid_value', {
        message: `Invalid '${k}': filter on metadata as metadata[key]=value.`,
        param: k,
      });
    }
    if (typeof v !== 'string') {
      throw new ServiceError('invalid_type', {
        message: `Invalid '${k}': expected one string.`,
        param: k,
      });
    }
    filters[m[1]!] = v;
  }
  return { ...page(q), model: fields.model, metadata: filters };
}

function viewer(r: FastifyRequest): Viewer {
  const key = r.apiKey!;
  return { projectId: key.projectId, endpointId: key.endpointId };
}

type P = { completionId: string };

export function storedCompletionRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    const svc: StoredCompletions = s.completions;
    for (const hook of surfaceAccess(s)) app.addHook('preParsing', hook);
    const id = (r: FastifyRequest) => (r.params as P).completionId;
    const base = '/:projectId/:endpointSlug/v1/chat/completions';

    app.get(base, async (r) => {
      const o = listOptions(r.query as Query);
      return listPage(await svc.list(viewer(r), o), o.limit);
    });
    app.get(`${base}/:completionId`, async (r) => svc.get(viewer(r), id(r)));
    app.post(`${base}/:completionId`, async (r) => {
      const body = parseField(updateBody, r.body);
      return svc.update(viewer(r), id(r), body.metadata ?? {});
    });
    app.delete(`${base}/:completionId`, async (r) => svc.remove(viewer(r), id(r)));
    app.get(`${base}/:completionId/messages`, async (r) => {
      const { limit, order, after } = page(r.query as Query);
      const all = await svc.messages(viewer(r), id(r));
      let items = order === 'asc' ? all : all.reverse();
      if (after !== undefined) {
        const i = items.findIndex((m) => m.id === after);
        if (i < 0) {
          throw new ServiceError('invalid_value', {
            message: `No message '${after}' in this chat completion.`,
            param: 'after',
          });
        }
        items = items.slice(i + 1);
      }
      return listPage(items, limit);
    });
  };
}
