DROP INDEX "models_name_key";--> statement-breakpoint
CREATE UNIQUE INDEX "models_platform_name_key" ON "models" USING btree ("name") WHERE "models"."project_id" is null and "models"."deleted_at" is null;--> statement-breakpoint
CREATE UNIQUE INDEX "models_project_name_key" ON "models" USING btree ("project_id","name") WHERE "models"."project_id" is not null and "models"."deleted_at" is null;