-- The surface an invocation was created on: an MCP one runs only on an agent whose own
-- declaration of the tool is mcp_visible, also when dispatched after its approval (invocations.ts).
ALTER TABLE "invocations" ADD COLUMN "surface" text DEFAULT 'http' NOT NULL;