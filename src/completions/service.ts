/**
 * Stored chat completions (OpenAI's `store: true`): what is kept, and the reads and
 * changes of the Stored Chat Completions API (routes.ts).
 *
 * A completed chat request with `store: true` is kept as the client got it: the
 * ChatCompletion (non-streaming: the very JSON text sent; streaming: the chunks
 * assembled, assemble.ts, with the usage the stream counted), the request's
 * `messages` and `metadata`, its project, endpoint and model. Kept until deleted.
 *
 * Off the hot path: `save` returns at once; the write starts on a later turn of the
 * event loop (`setImmediate`), after the answer has left, and a failure is logged,
 * never the client's. Pending writes are bounded (`MAX_PENDING`): past it, while
 * the database is slow or away, a completion is not stored and that is logged, so
 * an outage cannot fill the router's memory. `flush()` waits for what is pending
 * (`close()` at shutdown, tests).
 *
 * PostgreSQL's jsonb holds no U+0000, which a chat request may carry in a message,
 * in `metadata` or in what the model wrote: such a completion is stored with each
 * U+0000 replaced by U+FFFD (`storableJson`), rather than lost. The JSON text is
 * checked once; a text without one is stored as it is.
 *
 * Visibility: a completion belongs to its project; a key bound to an endpoint sees
 * only the completions made through that endpoint (as stored Responses).
 */
import { and, asc, desc, eq, gt, lt, sql, type SQL } from 'drizzle-orm';
import { ServiceError } from '../errors/index.js';
import { storableJson } from '../store/storable.js';
import type { Logger } from '../runtime/logger.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';

const { chatCompletions } = tables;

/** Writes waiting at most; past it a completion is not stored (and that is logged). */
export const MAX_PENDING = 1000;

export interface CompletionToStore {
  /** The completion id (= X-Request-ID). */
  id: string;
  projectId: string;
  endpointId: string;
  /** The endpoint's model, as the completion reports it. */
  model: string;
  /** The ChatCompletion as sent to the client: its JSON text, or the object. */
  body: string | object;
  /** The request's `messages`, as validated. */
  messages: readonly unknown[];
  metadata: Readonly<Record<string, string>> | undefined;
  /** Epoch ms: the request's start. */
  createdAt: number;
}

/** Who is asking: the key's project, and the endpoint it is bound to (null: any). */
export interface Viewer {
  projectId: string;
  endpointId: string | null;
}

export interface ListOptions {
  model: string | undefined;
  metadata: Record<string, string>;
  after: string | undefined;
  limit: number;
  order: 'asc' | 'desc';
}

type Row = typeof chatCompletions.$inferSelect;

export function notFound(id: string): ServiceError {
  return new ServiceError('chat_completion_not_found', {
    message: `No stored chat completion with id '${id}'.`,
  });
}

/** The ChatCompletion with its `metadata`, as the API answers it. */
export function completionObject(row: Pick<Row, 'body' | 'metadata'>): Record<string, unknown> {
  return { ...row.body, metadata: row.metadata };
}

export class StoredCompletions {
  private readonly pending = new Set<Promise<void>>();
  /** Completions not stored because too many writes were waiting. */
  dropped = 0;

  constructor(
    private readonly db: Db,
    private readonly logger: Logger,
  ) {}

  /** Stores a completion later, off the caller's path; never throws. */
  save(c: CompletionToStore): void {
    if (this.pending.size >= MAX_PENDING) {
      this.dropped++;
      this.logger.warn({ id: c.id }, 'stored completions: too many writes pending; not stored');
      return;
    }
    const p: Promise<void> = new Promise<void>((resolve) => setImmediate(resolve))
      .then(() => this.insert(c))
      .catch((err: unknown) => {
        this.logger.error({ err, id: c.id }, 'stored completions: storing a completion failed');
      })
      .finally(() => this.pending.delete(p));
    this.pending.add(p);
  }

  /** Waits until every write started so far has finished. */
  async flush(): Promise<void> {
    while (this.pending.size > 0) await Promise.all([...this.pending]);
  }

  close(): Promise<void> {
    return this.flush();
  }

  private async insert(c: CompletionToStore): Promise<void> {
    const body = storableJson(typeof c.body === 'string' ? c.body : JSON.stringify(c.body));
    const messages = storableJson(JSON.stringify(c.messages));
    const metadata = storableJson(JSON.stringify(c.metadata ?? {}));
    await this.db
      .insert(chatCompletions)
      .values({
        id: c.id,
        projectId: c.projectId,
        endpointId: c.endpointId,
        model: c.model,
        body: sql`${body}::jsonb`,
        messages: sql`${messages}::jsonb`,
        metadata: sql`${metadata}::jsonb`,
        createdAt: new Date(c.createdAt),
      })
      .onConflictDoNothing();
  }

  private visible(v: Viewer): SQL {
    const project = eq(chatCompletions.projectId, v.projectId);
    return v.endpointId === null
      ? project
      : and(project, eq(chatCompletions.endpointId, v.endpointId))!;
  }

  private async row(v: Viewer, id: string): Promise<Row | null> {
    const rows = await this.db
      .select()
      .from(chatCompletions)
      .where(and(eq(chatCompletions.id, id), this.visible(v)))
      .limit(1);
    return rows[0] ?? null;
  }

  async get(v: Viewer, id: string): Promise<Record<string, unknown>> {
    const row = await this.row(v, id);
    if (!row) throw notFound(id);
    return completionObject(row);
  }

  /** One page of the viewer's completions, fetched with one more than `limit`. */
  async list(v: Viewer, o: ListOptions): Promise<Record<string, unknown>[]> {
    const where: SQL[] = [this.visible(v)];
    if (o.model !== undefined) where.push(eq(chatCompletions.model, o.model));
    if (Object.keys(o.metadata).length > 0) {
      where.push(sql`${chatCompletions.metadata} @> ${JSON.stringify(o.metadata)}::jsonb`);
    }
    if (o.after !== undefined) {
      const cursor = await this.db
        .select({ seq: chatCompletions.seq })
        .from(chatCompletions)
        .where(and(eq(chatCompletions.id, o.after), this.visible(v)))
        .limit(1);
      if (!cursor[0]) {
        throw new ServiceError('invalid_value', {
          message: `No stored chat completion '${o.after}' to list after.`,
          param: 'after',
        });
      }
      const seq = cursor[0].seq;
      where.push(o.order === 'asc' ? gt(chatCompletions.seq, seq) : lt(chatCompletions.seq, seq));
    }
    const rows = await this.db
      .select({ body: chatCompletions.body, metadata: chatCompletions.metadata })
      .from(chatCompletions)
      .where(and(...where))
      .orderBy(o.order === 'asc' ? asc(chatCompletions.seq) : desc(chatCompletions.seq))
      .limit(o.limit + 1);
    return rows.map(completionObject);
  }

  async update(
    v: Viewer,
    id: string,
    metadata: Record<string, string>,
  ): Promise<Record<string, unknown>> {
    const rows = await this.db
      .update(chatCompletions)
      .set({ metadata })
      .where(and(eq(chatCompletions.id, id), this.visible(v)))
      .returning({ body: chatCompletions.body, metadata: chatCompletions.metadata });
    if (!rows[0]) throw notFound(id);
    return completionObject(rows[0]);
  }

  async remove(v: Viewer, id: string) {
    const rows = await this.db
      .delete(chatCompletions)
      .where(and(eq(chatCompletions.id, id), this.visible(v)))
      .returning({ id: chatCompletions.id });
    if (!rows[0]) throw notFound(id);
    return { object: 'chat.completion.deleted' as const, id, deleted: true };
  }

  /** The stored request messages, each with its id `<completion id>-<index>`. */
  async messages(v: Viewer, id: string): Promise<Record<string, unknown>[]> {
    const rows = await this.db
      .select({ messages: chatCompletions.messages })
      .from(chatCompletions)
      .where(and(eq(chatCompletions.id, id), this.visible(v)))
      .limit(1);
    if (!rows[0]) throw notFound(id);
    return rows[0].messages.map((m, i) => storeMessage(`${id}-${i}`, m));
  }
}

/**
 * A request message as the messages list shows it (OpenAI's ChatCompletionStoreMessage):
 * its `id` first, the message's fields, and `content_parts`: null for string content;
 * for a list of parts, the parts, with `content` their text joined (null without text).
 */
function storeMessage(id: string, m: Record<string, unknown>): Record<string, unknown> {
  const content = m.content;
  if (!Array.isArray(content)) return { id, ...m, content_parts: null };
  let text: string | null = null;
  for (const part of content as unknown[]) {
    const t = (part as { type?: unknown; text?: unknown } | null) ?? {};
    if (t.type === 'text' && typeof t.text === 'string') text = (text ?? '') + t.text;
  }
  return { id, ...m, content: text, content_parts: content };
}
