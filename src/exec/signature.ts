/**
 * The check a re-emitter runs before forwarding an `exec.approval_requested`
 * payload (spec: "A system that re-emits an exec.approval_requested payload
 * must first verify the original signature"). It verifies the original
 * delivery's `X-Webhook-Signature` over the exact raw body and timestamp with
 * the endpoint secret (webhooks/signing.ts: constant-time, 5-minute window),
 * then checks the body is an `exec.approval_requested` envelope whose `data`
 * matches the catalogue's payload schema. Only then is the payload returned,
 * re-emitted as received, never re-serialised.
 */
import { ACTIVE_PAYLOADS } from '../events/catalogue.js';
import { verifyWebhook, type VerifyFailure, type VerifyWebhookInput } from '../webhooks/signing.js';

export type ApprovalRequestedPayload = ReturnType<
  (typeof ACTIVE_PAYLOADS)['exec.approval_requested']['parse']
>;

export type ApprovalSignatureResult =
  | { ok: true; eventId: string; data: ApprovalRequestedPayload }
  | { ok: false; reason: VerifyFailure | 'not_approval_requested' | 'invalid_payload' };

export function verifyApprovalRequestedSignature(
  input: VerifyWebhookInput,
): ApprovalSignatureResult {
  const v = verifyWebhook(input);
  if (!v.ok) return { ok: false, reason: v.reason };
  let envelope: unknown;
  try {
    const text =
      typeof input.body === 'string' ? input.body : Buffer.from(input.body).toString('utf8');
    envelope = JSON.parse(text);
  } catch {
    return { ok: false, reason: 'invalid_payload' };
  }
  const e = envelope as { id?: unknown; type?: unknown; object?: unknown; data?: unknown };
  if (e.object !== 'event' || e.type !== 'exec.approval_requested' || typeof e.id !== 'string') {
    return { ok: false, reason: 'not_approval_requested' };
  }
  const data = ACTIVE_PAYLOADS['exec.approval_requested'].safeParse(e.data);
  if (!data.success) return { ok: false, reason: 'invalid_payload' };
  return { ok: true, eventId: e.id, data: data.data };
}
