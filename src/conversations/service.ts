/**
 * Conversations API storage: a project's conversations and their items, in the
 * Responses API's item shape (messages with text parts, function calls and their
 * outputs), in order. `conversation.created` and `conversation.deleted` events are
 * written in the same transaction as the change. Deleting a conversation hides it
 * and drops its items.
 *
 * A conversation belongs to the endpoint under whose path it was made (none when made
 * under the project alias): a key bound to an endpoint sees only its endpoint's, as
 * with responses and batches, so a turn made through another endpoint never reaches
 * it through a shared conversation. An unbound key sees them all.
 */
import { randomBytes } from 'node:crypto';
import { and, asc, desc, eq, gt, isNull, lt, or } from 'drizzle-orm';
import { ServiceError } from '../errors/index.js';
import { listPage } from '../http/validate.js';
import { emitEvent, type Tx } from '../events/outbox.js';
import type { Clock } from '../runtime/clock.js';
import type { Db } from '../store/index.js';
import { tables } from '../store/index.js';

const { conversations, conversationItems } = tables;

export type Item = Record<string, unknown> & { id: string };

/** Whose conversations: a project's, and the endpoint a bound key is bound to (null: all). */
export interface ConversationScope {
  projectId: string;
  boundTo: string | null;
  /**
   * A response made through this endpoint reads and extends the conversation: then an
   * unbound key too may use only this endpoint's conversations or the project alias's,
   * so that no endpoint's turn lands where a key bound to another would read it.
   */
  through?: string;
}

/** The live conversation `id` as `scope` sees it. */
function conversationOf(scope: ConversationScope, id: string) {
  return and(
    eq(conversations.id, id),
    eq(conversations.projectId, scope.projectId),
    isNull(conversations.deletedAt),
    scope.boundTo !== null
      ? eq(conversations.endpointId, scope.boundTo)
      : scope.through !== undefined
        ? or(isNull(conversations.endpointId), eq(conversations.endpointId, scope.through))
        : undefined,
  );
}

export interface ConversationObject {
  id: string;
  object: 'conversation';
  created_at: number;
  metadata: Record<string, string>;
}

function toObject(row: typeof conversations.$inferSelect): ConversationObject {
  return {
    id: row.id,
    object: 'conversation',
    created_at: Math.floor(row.createdAt.getTime() / 1000),
    metadata: row.metadata,
  };
}

export function notFound(id: string, param: string | null = null): ServiceError {
  return new ServiceError('conversation_not_found', {
    message: `No conversation with id '${id}'.`,
    param,
  });
}

export class ConversationService {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock,
    private readonly poke: () => void = () => {},
  ) {}

  private now(): Date {
    return new Date(this.clock.now());
  }

  /** `lock`: held to the transaction's end (`FOR UPDATE`), for an append. */
  private async row(tx: Tx, scope: ConversationScope, id: string, lock = false) {
    const q = tx.select().from(conversations).where(conversationOf(scope, id)).limit(1);
    const rows = lock ? await q.for('update') : await q;
    return rows[0] ?? null;
  }

  /** `endpointId`: the endpoint under whose path it is made (null: the project alias). */
  async create(
    projectId: string,
    endpointId: string | null,
    input: { items: Item[]; metadata: Record<string, string> },
  ): Promise<ConversationObject> {
    const now = this.now();
    const id = `conv_${randomBytes(24).toString('hex')}`;
    const conv = await this.db.transaction(async (tx) => {
      const [row] = await tx
        .insert(conversations)
        .values({ id, projectId, endpointId, metadata: input.metadata, createdAt: now })
        .returning();
      await this.insertItems(tx, id, input.items, now);
      const obj = toObject(row!);
      await emitEvent(tx, { projectId, type: 'conversation.created', data: { ...obj }, now });
      return obj;
    });
    this.poke();
    return conv;
  }

  async get(scope: ConversationScope, id: string): Promise<ConversationObject | null> {
    const row = await this.row(this.db, scope, id);
    return row ? toObject(row) : null;
  }

  async update(
    scope: ConversationScope,
    id: string,
    metadata: Record<string, string>,
  ): Promise<ConversationObject> {
    const rows = await this.db
      .update(conversations)
      .set({ metadata })
      .where(conversationOf(scope, id))
      .returning();
    if (!rows[0]) throw notFound(id);
    return toObject(rows[0]);
  }

  async remove(scope: ConversationScope, id: string) {
    const now = this.now();
    const answer = await this.db.transaction(async (tx) => {
      const rows = await tx
        .update(conversations)
        .set({ deletedAt: now })
        .where(conversationOf(scope, id))
        .returning({ id: conversations.id });
      if (!rows[0]) throw notFound(id);
      await tx.delete(conversationItems).where(eq(conversationItems.conversationId, id));
      const deleted = { id, object: 'conversation.deleted' as const, deleted: true };
      await emitEvent(tx, {
        projectId: scope.projectId,
        type: 'conversation.deleted',
        data: deleted,
        now,
      });

      return deleted;
    });
    this.poke();
    return answer;
  }

  private async insertItems(tx: Tx, conversationId: string, items: Item[], now: Date) {
    if (items.length === 0) return;
    // One statement, rows in order: `seq` follows the VALUES order.
    await tx
      .insert(conversationItems)
      .values(items.map((item) => ({ conversationId, id: item.id, item, createdAt: now })));
  }

  /**
   * Appends items (in `tx` when given: the Responses API adds a response's turn). The
   * conversation's row is locked to the commit: `seq` comes from one sequence for all
   * conversations, so two appends at once would otherwise interleave their rows (each
   * row draws its value as it is inserted), and a later append could commit a lower
   * `seq` than one a reader already paged past. A delete waits for it, or it for the
   * delete, and then finds the conversation gone.
   */
  async append(scope: ConversationScope, id: string, items: Item[], tx?: Tx): Promise<Item[]> {
    const run = async (t: Tx) => {
      if (!(await this.row(t, scope, id, true))) throw notFound(id);
      await this.insertItems(t, id, items, this.now());
      return items;
    };
    return tx ? run(tx) : this.db.transaction(run);
  }

  /** Every item in order (the history a response continues). */
  async allItems(scope: ConversationScope, id: string): Promise<Item[] | null> {
    if (!(await this.row(this.db, scope, id))) return null;
    const rows = await this.db
      .select({ item: conversationItems.item })
      .from(conversationItems)
      .where(eq(conversationItems.conversationId, id))
      .orderBy(asc(conversationItems.seq));
    return rows.map((r) => r.item as Item);
  }

  async items(
    scope: ConversationScope,
    id: string,
    q: { limit: number; order: 'asc' | 'desc'; after: string | undefined },
  ) {
    if (!(await this.row(this.db, scope, id))) throw notFound(id);
    let cursor: number | null = null;
    if (q.after !== undefined) {
      const at = await this.db
        .select({ seq: conversationItems.seq })
        .from(conversationItems)
        .where(and(eq(conversationItems.conversationId, id), eq(conversationItems.id, q.after)))
        .limit(1);
      if (!at[0]) {
        throw new ServiceError('invalid_value', {
          message: `No item '${q.after}' in this conversation.`,
          param: 'after',
        });
      }
      cursor = at[0].seq;
    }
    const asc_ = q.order === 'asc';
    const rows = await this.db
      .select({ item: conversationItems.item })
      .from(conversationItems)
      .where(
        and(
          eq(conversationItems.conversationId, id),
          cursor === null
            ? undefined
            : asc_
              ? gt(conversationItems.seq, cursor)
              : lt(conversationItems.seq, cursor),
        ),
      )
      .orderBy(asc_ ? asc(conversationItems.seq) : desc(conversationItems.seq))
      .limit(q.limit + 1);
    return listPage(
      rows.map((r) => r.item as Item),
      q.limit,
    );
  }

  async item(scope: ConversationScope, id: string, itemId: string): Promise<Item> {
    if (!(await this.row(this.db, scope, id))) throw notFound(id);
    const rows = await this.db
      .select({ item: conversationItems.item })
      .from(conversationItems)
      .where(and(eq(conversationItems.conversationId, id), eq(conversationItems.id, itemId)))
      .limit(1);
    if (!rows[0]) {
      throw new ServiceError('item_not_found', {
        message: `No item '${itemId}' in this conversation.`,
      });
    }
    return rows[0].item as Item;
  }

  async removeItem(
    scope: ConversationScope,
    id: string,
    itemId: string,
  ): Promise<ConversationObject> {
    const row = await this.row(this.db, scope, id);
    if (!row) throw notFound(id);
    const gone = await this.db
      .delete(conversationItems)
      .where(and(eq(conversationItems.conversationId, id), eq(conversationItems.id, itemId)))
      .returning({ id: conversationItems.id });
    if (!gone[0]) {
      throw new ServiceError('item_not_found', {
        message: `No item '${itemId}' in this conversation.`,
      });
    }
    return toObject(row);
  }
}
