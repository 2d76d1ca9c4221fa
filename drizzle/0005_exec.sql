CREATE TABLE "agents" (
	"id" uuid PRIMARY KEY NOT NULL,
	"external_id" text NOT NULL,
	"project_id" uuid NOT NULL,
	"registration_name" text NOT NULL,
	"curve_public_key" text NOT NULL,
	"status" text NOT NULL,
	"manifest" jsonb NOT NULL,
	"manifest_hash" text NOT NULL,
	"description" text DEFAULT '' NOT NULL,
	"metadata" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"join_key_id" uuid,
	"lease_expires_at" timestamp with time zone,
	"enrolled_at" timestamp with time zone NOT NULL,
	"last_seen_at" timestamp with time zone,
	"created_at" timestamp with time zone NOT NULL,
	"updated_at" timestamp with time zone NOT NULL,
	"deleted_at" timestamp with time zone,
	CONSTRAINT "agents_status_check" CHECK ("agents"."status" in ('enrolled', 'offline', 'deleted'))
);
--> statement-breakpoint
CREATE TABLE "approvals" (
	"id" uuid PRIMARY KEY NOT NULL,
	"external_id" text NOT NULL,
	"project_id" uuid NOT NULL,
	"invocation_id" uuid NOT NULL,
	"status" text NOT NULL,
	"stage" integer DEFAULT 0 NOT NULL,
	"chain" jsonb NOT NULL,
	"stage_deadline" timestamp with time zone NOT NULL,
	"decided_by" uuid,
	"reason" text,
	"created_at" timestamp with time zone NOT NULL,
	"decided_at" timestamp with time zone,
	"updated_at" timestamp with time zone NOT NULL,
	CONSTRAINT "approvals_status_check" CHECK ("approvals"."status" in ('pending', 'accepted', 'rejected', 'expired'))
);
--> statement-breakpoint
CREATE TABLE "invocations" (
	"id" uuid PRIMARY KEY NOT NULL,
	"external_id" text NOT NULL,
	"project_id" uuid NOT NULL,
	"workspace_id" uuid NOT NULL,
	"tool" text NOT NULL,
	"risk" text NOT NULL,
	"agent_id" uuid,
	"arguments" jsonb NOT NULL,
	"status" text NOT NULL,
	"idempotency_key" text,
	"request_hash" text NOT NULL,
	"timeout_ms" integer NOT NULL,
	"exit_code" integer,
	"duration_ms" integer,
	"stdout" text,
	"stderr" text,
	"output_truncated" integer DEFAULT 0 NOT NULL,
	"error_code" text,
	"error_message" text,
	"created_at" timestamp with time zone NOT NULL,
	"queued_at" timestamp with time zone,
	"dispatched_at" timestamp with time zone,
	"started_at" timestamp with time zone,
	"finished_at" timestamp with time zone,
	"updated_at" timestamp with time zone NOT NULL,
	CONSTRAINT "invocations_status_check" CHECK ("invocations"."status" in ('pending_approval', 'queued', 'dispatched', 'running', 'completed', 'failed', 'cancelled'))
);
--> statement-breakpoint
CREATE TABLE "join_keys" (
	"id" uuid PRIMARY KEY NOT NULL,
	"external_id" text NOT NULL,
	"project_id" uuid NOT NULL,
	"name" text DEFAULT '' NOT NULL,
	"secret_hash" text NOT NULL,
	"prefix" text NOT NULL,
	"registration_name" text,
	"expires_at" timestamp with time zone,
	"max_uses" integer,
	"use_count" integer DEFAULT 0 NOT NULL,
	"revoked_at" timestamp with time zone,
	"created_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
CREATE TABLE "project_members" (
	"project_id" uuid NOT NULL,
	"user_id" uuid NOT NULL,
	"role" text NOT NULL,
	"created_at" timestamp with time zone NOT NULL,
	CONSTRAINT "project_members_project_id_user_id_pk" PRIMARY KEY("project_id","user_id"),
	CONSTRAINT "project_members_role_check" CHECK ("project_members"."role" in ('owner', 'admin', 'approver', 'viewer'))
);
--> statement-breakpoint
CREATE TABLE "users" (
	"id" uuid PRIMARY KEY NOT NULL,
	"external_id" text NOT NULL,
	"name" text NOT NULL,
	"email" text NOT NULL,
	"token_hash" text NOT NULL,
	"created_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
CREATE TABLE "workspaces" (
	"id" uuid PRIMARY KEY NOT NULL,
	"external_id" text NOT NULL,
	"project_id" uuid NOT NULL,
	"name" text DEFAULT '' NOT NULL,
	"metadata" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"created_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
ALTER TABLE "agents" ADD CONSTRAINT "agents_project_id_projects_id_fk" FOREIGN KEY ("project_id") REFERENCES "public"."projects"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "agents" ADD CONSTRAINT "agents_join_key_id_join_keys_id_fk" FOREIGN KEY ("join_key_id") REFERENCES "public"."join_keys"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "approvals" ADD CONSTRAINT "approvals_project_id_projects_id_fk" FOREIGN KEY ("project_id") REFERENCES "public"."projects"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "approvals" ADD CONSTRAINT "approvals_invocation_id_invocations_id_fk" FOREIGN KEY ("invocation_id") REFERENCES "public"."invocations"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "approvals" ADD CONSTRAINT "approvals_decided_by_users_id_fk" FOREIGN KEY ("decided_by") REFERENCES "public"."users"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "invocations" ADD CONSTRAINT "invocations_project_id_projects_id_fk" FOREIGN KEY ("project_id") REFERENCES "public"."projects"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "invocations" ADD CONSTRAINT "invocations_workspace_id_workspaces_id_fk" FOREIGN KEY ("workspace_id") REFERENCES "public"."workspaces"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "invocations" ADD CONSTRAINT "invocations_agent_id_agents_id_fk" FOREIGN KEY ("agent_id") REFERENCES "public"."agents"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "join_keys" ADD CONSTRAINT "join_keys_project_id_projects_id_fk" FOREIGN KEY ("project_id") REFERENCES "public"."projects"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "project_members" ADD CONSTRAINT "project_members_project_id_projects_id_fk" FOREIGN KEY ("project_id") REFERENCES "public"."projects"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "project_members" ADD CONSTRAINT "project_members_user_id_users_id_fk" FOREIGN KEY ("user_id") REFERENCES "public"."users"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "workspaces" ADD CONSTRAINT "workspaces_project_id_projects_id_fk" FOREIGN KEY ("project_id") REFERENCES "public"."projects"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "agents_external_id_key" ON "agents" USING btree ("external_id");--> statement-breakpoint
CREATE UNIQUE INDEX "agents_project_name_key" ON "agents" USING btree ("project_id","registration_name") WHERE "agents"."deleted_at" is null;--> statement-breakpoint
CREATE UNIQUE INDEX "agents_curve_key_key" ON "agents" USING btree ("curve_public_key") WHERE "agents"."deleted_at" is null;--> statement-breakpoint
CREATE INDEX "agents_lease_idx" ON "agents" USING btree ("lease_expires_at") WHERE "agents"."status" = 'enrolled';--> statement-breakpoint
CREATE UNIQUE INDEX "approvals_external_id_key" ON "approvals" USING btree ("external_id");--> statement-breakpoint
CREATE UNIQUE INDEX "approvals_invocation_key" ON "approvals" USING btree ("invocation_id");--> statement-breakpoint
CREATE INDEX "approvals_project_created_idx" ON "approvals" USING btree ("project_id","created_at");--> statement-breakpoint
CREATE INDEX "approvals_deadline_idx" ON "approvals" USING btree ("stage_deadline") WHERE "approvals"."status" = 'pending';--> statement-breakpoint
CREATE UNIQUE INDEX "invocations_external_id_key" ON "invocations" USING btree ("external_id");--> statement-breakpoint
CREATE UNIQUE INDEX "invocations_idempotency_key" ON "invocations" USING btree ("project_id","idempotency_key") WHERE "invocations"."idempotency_key" is not null;--> statement-breakpoint
CREATE INDEX "invocations_project_created_idx" ON "invocations" USING btree ("project_id","created_at");--> statement-breakpoint
CREATE INDEX "invocations_active_idx" ON "invocations" USING btree ("status") WHERE "invocations"."status" in ('queued', 'dispatched', 'running');--> statement-breakpoint
CREATE UNIQUE INDEX "join_keys_external_id_key" ON "join_keys" USING btree ("external_id");--> statement-breakpoint
CREATE UNIQUE INDEX "join_keys_secret_hash_key" ON "join_keys" USING btree ("secret_hash");--> statement-breakpoint
CREATE INDEX "join_keys_project_idx" ON "join_keys" USING btree ("project_id","created_at");--> statement-breakpoint
CREATE UNIQUE INDEX "users_external_id_key" ON "users" USING btree ("external_id");--> statement-breakpoint
CREATE UNIQUE INDEX "users_email_key" ON "users" USING btree ("email");--> statement-breakpoint
CREATE UNIQUE INDEX "users_token_hash_key" ON "users" USING btree ("token_hash");--> statement-breakpoint
CREATE UNIQUE INDEX "workspaces_external_id_key" ON "workspaces" USING btree ("external_id");--> statement-breakpoint
CREATE INDEX "workspaces_project_idx" ON "workspaces" USING btree ("project_id","created_at");