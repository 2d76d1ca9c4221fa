/**
 * OpenAI's Conversations API (scope `inference`), under the endpoint base URL and the
 * project alias `/<project_id>/v1`, with the files routes' access rules and the
 * project's shared management limit (spec, Limits: conversations share the 60 a
 * minute): `POST /conversations` `{items?, metadata?}`, `GET`/`POST`(metadata)/`DELETE
 * /conversations/{id}`, `GET`/`POST /conversations/{id}/items`, `GET`/`DELETE
 * /conversations/{id}/items/{item_id}`. Items are the Responses API's input items
 * (at most 20 per request, as OpenAI); a response made with `conversation` reads them
 * as its history and appends its input and output (responses/routes.ts).
 */
import type { FastifyInstance, FastifyPluginAsync, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { projectOf, surfaceAccess } from '../files/access.js';
import { listPage, listQuery, parseField } from '../http/validate.js';
import { parseInputItem, storedItem } from '../responses/request.js';
import type { Services } from '../runtime/services.js';
import { ConversationService, notFound, type Item } from './service.js';

export const MAX_ITEMS_PER_REQUEST = 20;

const metadata = z
  .record(
    z.string().max(64, 'keys up to 64 characters'),
    z.string().max(512, 'values up to 512 characters'),
  )
  .refine((m) => Object.keys(m).length <= 16, 'at most 16 pairs');

const createBody = z.object({
  items: z.array(z.unknown()).max(MAX_ITEMS_PER_REQUEST).nullish(),
  metadata: metadata.nullish(),
});
const updateBody = z.object({ metadata });
const itemsBody = z.object({ items: z.array(z.unknown()).min(1).max(MAX_ITEMS_PER_REQUEST) });

function items(raw: readonly unknown[] | null | undefined): Item[] {
  return (raw ?? []).map((v, i) => storedItem(parseInputItem(v, ['items', i])) as Item);
}

type P = { conversationId: string; itemId: string };
type Q = { limit?: string; order?: string; after?: string };

export function conversationRoutes(s: Services): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    const svc = new ConversationService(s.store.db, s.clock, () => s.dispatcher.poke());
    for (const hook of surfaceAccess(s)) app.addHook('preParsing', hook);
    const id = (r: FastifyRequest) => (r.params as P).conversationId;
    const scope = (r: FastifyRequest) => ({
      projectId: projectOf(r),
      boundTo: r.apiKey!.endpointId,
    });

    for (const root of ['/:projectId/:endpointSlug/v1', '/:projectId/v1']) {
      const base = `${root}/conversations`;
      app.post(base, async (r) => {
        const body = parseField(createBody, r.body ?? {});
        return svc.create(projectOf(r), r.surfaceEndpoint?.id ?? null, {
          items: items(body.items),
          metadata: body.metadata ?? {},
        });
      });
      app.get(`${base}/:conversationId`, async (r) => {
        const c = await svc.get(scope(r), id(r));
        if (!c) throw notFound(id(r));
        return c;
      });
      app.post(`${base}/:conversationId`, async (r) => {
        const body = parseField(updateBody, r.body);
        return svc.update(scope(r), id(r), body.metadata);
      });
      app.delete(`${base}/:conversationId`, async (r) => svc.remove(scope(r), id(r)));
      app.get<{ Querystring: Q }>(`${base}/:conversationId/items`, async (r) =>
        svc.items(scope(r), id(r), listQuery(r.query)),
      );
      app.post(`${base}/:conversationId/items`, async (r) => {
        const body = parseField(itemsBody, r.body);
        const added = await svc.append(scope(r), id(r), items(body.items));
        return listPage(added, added.length);
      });
      app.get(`${base}/:conversationId/items/:itemId`, async (r) =>
        svc.item(scope(r), id(r), (r.params as P).itemId),
      );
      app.delete(`${base}/:conversationId/items/:itemId`, async (r) =>
        svc.removeItem(scope(r), id(r), (r.params as P).itemId),
      );
    }
  };
}
