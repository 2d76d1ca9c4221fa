-- A part is recorded `streaming` before its bytes arrive and becomes `stored` with them, so an
-- upload's cancel, expiry or completion drops the bytes of a part whose router died mid-stream.
ALTER TABLE "upload_parts" ADD COLUMN "status" text DEFAULT 'stored' NOT NULL;--> statement-breakpoint
ALTER TABLE "upload_parts" ADD CONSTRAINT "upload_parts_status_check" CHECK ("upload_parts"."status" in ('streaming', 'stored'));