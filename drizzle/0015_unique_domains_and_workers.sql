-- Rows the operator API's checks let through before these indexes (two requests at
-- once): the oldest keeps the custom domain, and the oldest row of a worker process
-- (same source, model, tier and URL) stays while its copies go. Before this a
-- duplicated domain routed to whichever endpoint a query met first, and a duplicated
-- worker was one process counted twice by the scheduler.
UPDATE "endpoints" AS e SET "custom_domain" = NULL
WHERE e."deleted_at" IS NULL AND e."custom_domain" IS NOT NULL AND EXISTS (
  SELECT 1 FROM "endpoints" AS o
  WHERE o."deleted_at" IS NULL AND lower(o."custom_domain") = lower(e."custom_domain")
    AND (o."created_at", o."id") < (e."created_at", e."id")
);--> statement-breakpoint
DELETE FROM "workers" AS w
WHERE w."source" IN ('static', 'registered') AND EXISTS (
  SELECT 1 FROM "workers" AS o
  WHERE o."source" = w."source" AND o."model_id" = w."model_id" AND o."tier_id" = w."tier_id"
    AND o."url" = w."url" AND (o."created_at", o."id") < (w."created_at", w."id")
);--> statement-breakpoint
CREATE UNIQUE INDEX "endpoints_custom_domain_key" ON "endpoints" USING btree (lower("custom_domain")) WHERE "endpoints"."deleted_at" is null and "endpoints"."custom_domain" is not null;--> statement-breakpoint
CREATE UNIQUE INDEX "workers_source_model_tier_url_key" ON "workers" USING btree ("source","model_id","tier_id","url") WHERE "workers"."source" in ('static', 'registered');