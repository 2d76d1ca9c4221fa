DROP INDEX "models_name_key";--> statement-breakpoint
ALTER TABLE "models" ADD COLUMN "project_id" uuid;--> statement-breakpoint
ALTER TABLE "models" ADD COLUMN "deleted_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "models" ADD CONSTRAINT "models_project_id_projects_id_fk" FOREIGN KEY ("project_id") REFERENCES "public"."projects"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "models_name_key" ON "models" USING btree ("name") WHERE "models"."deleted_at" is null;