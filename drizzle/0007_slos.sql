CREATE TABLE "slos" (
	"id" uuid PRIMARY KEY NOT NULL,
	"external_id" text NOT NULL,
	"project_id" uuid NOT NULL,
	"endpoint_id" uuid NOT NULL,
	"name" text DEFAULT '' NOT NULL,
	"ttft_ms" double precision,
	"tpot_ms" double precision,
	"objective" double precision NOT NULL,
	"window_seconds" integer NOT NULL,
	"created_at" timestamp with time zone NOT NULL,
	"updated_at" timestamp with time zone NOT NULL,
	CONSTRAINT "slos_target_check" CHECK ("slos"."ttft_ms" is not null or "slos"."tpot_ms" is not null),
	CONSTRAINT "slos_objective_check" CHECK ("slos"."objective" > 0 and "slos"."objective" < 1)
);
--> statement-breakpoint
ALTER TABLE "slos" ADD CONSTRAINT "slos_project_id_projects_id_fk" FOREIGN KEY ("project_id") REFERENCES "public"."projects"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "slos" ADD CONSTRAINT "slos_endpoint_id_endpoints_id_fk" FOREIGN KEY ("endpoint_id") REFERENCES "public"."endpoints"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "slos_external_id_key" ON "slos" USING btree ("external_id");--> statement-breakpoint
CREATE INDEX "slos_endpoint_idx" ON "slos" USING btree ("endpoint_id");--> statement-breakpoint
CREATE INDEX "slos_project_created_idx" ON "slos" USING btree ("project_id","created_at");