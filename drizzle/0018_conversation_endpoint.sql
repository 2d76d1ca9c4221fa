-- A conversation records the endpoint under whose path it was made; a key bound to
-- an endpoint sees only that endpoint's. Conversations made before this column record
-- none: as if made under the project alias, only unbound keys see them (nothing says
-- which endpoint a bound key made them through, and a guess could show them to the
-- wrong one).
ALTER TABLE "conversations" ADD COLUMN "endpoint_id" uuid;--> statement-breakpoint
ALTER TABLE "conversations" ADD CONSTRAINT "conversations_endpoint_id_endpoints_id_fk" FOREIGN KEY ("endpoint_id") REFERENCES "public"."endpoints"("id") ON DELETE no action ON UPDATE no action;
