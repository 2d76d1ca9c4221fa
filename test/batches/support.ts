/** Helpers for the batch tests: batch input files and waiting for a batch's status. */
import { setTimeout as sleep } from 'node:timers/promises';
import { eq } from 'drizzle-orm';
import { toFile } from 'openai';
import { tables } from '../../src/store/index.js';
import type { InferenceFixture } from '../support/inference.js';

export function chatLine(customId: string, body: Record<string, unknown> = {}): string {
  return JSON.stringify({
    custom_id: customId,
    method: 'POST',
    url: '/v1/chat/completions',
    body: {
      model: 'anything',
      messages: [{ role: 'user', content: `Say something about ${customId}` }],
      max_tokens: 8,
      ...body,
    },
  });
}

export async function uploadBatchInput(f: InferenceFixture, lines: string[]): Promise<string> {
  const file = await f.client.files.create({
    file: await toFile(Buffer.from(lines.join('\n') + '\n'), 'batch.jsonl'),
    purpose: 'batch',
  });
  return file.id;
}

/** Waits (real time, reading the database, not the rate-limited API) for a batch's status. */
export async function waitForStatus(
  f: InferenceFixture,
  id: string,
  statuses: string[],
  ms = 15_000,
): Promise<void> {
  const end = Date.now() + ms;
  const db = f.server.services.store.db;
  for (;;) {
    const [row] = await db
      .select({ status: tables.batches.status })
      .from(tables.batches)
      .where(eq(tables.batches.id, id));
    if (row && statuses.includes(row.status)) return;
    if (Date.now() > end)
      throw new Error(`batch ${id} is ${row?.status}, not ${statuses.join('|')}`);
    await sleep(10);
  }
}

export interface OutputLine {
  id: string;
  custom_id: string;
  response: {
    status_code: number;
    request_id: string | null;
    body: Record<string, unknown>;
  } | null;
  error: { code: string; message: string } | null;
}

export async function readLines(f: InferenceFixture, fileId: string): Promise<OutputLine[]> {
  const text = await (await f.client.files.content(fileId)).text();
  return text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as OutputLine);
}
