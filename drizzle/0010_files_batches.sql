CREATE TABLE "batch_requests" (
	"batch_id" text NOT NULL,
	"idx" integer NOT NULL,
	"custom_id" text NOT NULL,
	"body" text NOT NULL,
	"status" text DEFAULT 'pending' NOT NULL,
	"result" text,
	CONSTRAINT "batch_requests_batch_id_idx_pk" PRIMARY KEY("batch_id","idx"),
	CONSTRAINT "batch_requests_status_check" CHECK ("batch_requests"."status" in ('pending', 'completed', 'failed'))
);
--> statement-breakpoint
CREATE TABLE "batches" (
	"id" text PRIMARY KEY NOT NULL,
	"seq" bigserial NOT NULL,
	"project_id" uuid NOT NULL,
	"endpoint_id" uuid NOT NULL,
	"key_id" uuid NOT NULL,
	"endpoint" text NOT NULL,
	"input_file_id" text NOT NULL,
	"completion_window" text NOT NULL,
	"status" text NOT NULL,
	"output_file_id" text,
	"error_file_id" text,
	"errors" jsonb,
	"metadata" jsonb,
	"total" integer NOT NULL,
	"completed" integer DEFAULT 0 NOT NULL,
	"failed" integer DEFAULT 0 NOT NULL,
	"expires_at" timestamp with time zone NOT NULL,
	"in_progress_at" timestamp with time zone,
	"finalizing_at" timestamp with time zone,
	"completed_at" timestamp with time zone,
	"failed_at" timestamp with time zone,
	"expired_at" timestamp with time zone,
	"cancelling_at" timestamp with time zone,
	"cancelled_at" timestamp with time zone,
	"lease_until" timestamp with time zone,
	"lease_token" bigint DEFAULT 0 NOT NULL,
	"created_at" timestamp with time zone NOT NULL,
	CONSTRAINT "batches_status_check" CHECK ("batches"."status" in ('validating', 'failed', 'in_progress', 'finalizing', 'completed', 'expired', 'cancelling', 'cancelled'))
);
--> statement-breakpoint
CREATE TABLE "blob_chunks" (
	"owner" text NOT NULL,
	"seq" integer NOT NULL,
	"data" "bytea" NOT NULL,
	CONSTRAINT "blob_chunks_owner_seq_pk" PRIMARY KEY("owner","seq")
);
--> statement-breakpoint
CREATE TABLE "files" (
	"id" text PRIMARY KEY NOT NULL,
	"seq" bigserial NOT NULL,
	"project_id" uuid NOT NULL,
	"filename" text NOT NULL,
	"purpose" text NOT NULL,
	"bytes" bigint DEFAULT 0 NOT NULL,
	"status" text NOT NULL,
	"created_at" timestamp with time zone NOT NULL,
	CONSTRAINT "files_status_check" CHECK ("files"."status" in ('uploading', 'processed'))
);
--> statement-breakpoint
CREATE TABLE "upload_parts" (
	"id" text PRIMARY KEY NOT NULL,
	"upload_id" text NOT NULL,
	"bytes" bigint NOT NULL,
	"created_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
CREATE TABLE "uploads" (
	"id" text PRIMARY KEY NOT NULL,
	"project_id" uuid NOT NULL,
	"filename" text NOT NULL,
	"purpose" text NOT NULL,
	"bytes" bigint NOT NULL,
	"mime_type" text NOT NULL,
	"status" text NOT NULL,
	"file_id" text,
	"expires_at" timestamp with time zone NOT NULL,
	"created_at" timestamp with time zone NOT NULL,
	CONSTRAINT "uploads_status_check" CHECK ("uploads"."status" in ('pending', 'completed', 'cancelled', 'expired'))
);
--> statement-breakpoint
ALTER TABLE "batch_requests" ADD CONSTRAINT "batch_requests_batch_id_batches_id_fk" FOREIGN KEY ("batch_id") REFERENCES "public"."batches"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "batches" ADD CONSTRAINT "batches_project_id_projects_id_fk" FOREIGN KEY ("project_id") REFERENCES "public"."projects"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "batches" ADD CONSTRAINT "batches_endpoint_id_endpoints_id_fk" FOREIGN KEY ("endpoint_id") REFERENCES "public"."endpoints"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "batches" ADD CONSTRAINT "batches_key_id_api_keys_id_fk" FOREIGN KEY ("key_id") REFERENCES "public"."api_keys"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "files" ADD CONSTRAINT "files_project_id_projects_id_fk" FOREIGN KEY ("project_id") REFERENCES "public"."projects"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "upload_parts" ADD CONSTRAINT "upload_parts_upload_id_uploads_id_fk" FOREIGN KEY ("upload_id") REFERENCES "public"."uploads"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "uploads" ADD CONSTRAINT "uploads_project_id_projects_id_fk" FOREIGN KEY ("project_id") REFERENCES "public"."projects"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "batches_project_seq_idx" ON "batches" USING btree ("project_id","seq");--> statement-breakpoint
CREATE INDEX "batches_active_idx" ON "batches" USING btree ("seq") WHERE "batches"."status" in ('validating', 'in_progress', 'finalizing', 'cancelling');--> statement-breakpoint
CREATE INDEX "files_project_seq_idx" ON "files" USING btree ("project_id","seq");--> statement-breakpoint
CREATE INDEX "upload_parts_upload_idx" ON "upload_parts" USING btree ("upload_id");--> statement-breakpoint
CREATE INDEX "uploads_project_idx" ON "uploads" USING btree ("project_id");