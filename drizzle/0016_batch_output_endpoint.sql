ALTER TABLE "files" ADD COLUMN "endpoint_id" uuid;--> statement-breakpoint
ALTER TABLE "files" ADD CONSTRAINT "files_endpoint_id_endpoints_id_fk" FOREIGN KEY ("endpoint_id") REFERENCES "public"."endpoints"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
-- Result files written before this column: their batch's endpoint.
UPDATE "files" AS f SET "endpoint_id" = b."endpoint_id"
FROM "batches" AS b
WHERE f."purpose" = 'batch_output' AND (b."output_file_id" = f."id" OR b."error_file_id" = f."id");
