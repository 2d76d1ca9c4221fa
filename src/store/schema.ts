/**
 * The one PostgreSQL schema, shared by PGlite (embedded default) and PostgreSQL
 * (scale-out). Migrations in `drizzle/` are generated from this file with
 * `npm run db:generate` and applied at start.
 *
 * Invariants:
 * - Secrets are never stored: API keys keep only a SHA-256 hash and a display prefix.
 * - Records are soft-deleted (`deleted_at`) where the spec lists "non-deleted" records.
 * - Tier limits and timeouts are data (the `tiers` table), not literals in code.
 */
import { sql } from 'drizzle-orm';
import {
  bigint,
  bigserial,
  check,
  customType,
  doublePrecision,
  index,
  integer,
  jsonb,
  pgTable,
  primaryKey,
  real,
  text,
  timestamp,
  uniqueIndex,
  uuid,
} from 'drizzle-orm/pg-core';

const createdAt = () => timestamp('created_at', { withTimezone: true, mode: 'date' }).notNull();

export const projects = pgTable(
  'projects',
  {
    id: uuid('id').primaryKey(),
    externalId: text('external_id').notNull(),
    slug: text('slug').notNull(),
    name: text('name').notNull(),
    creditCents: bigint('credit_cents', { mode: 'number' }).notNull().default(0),
    /** Spend so far in micro-cents (1e-6 cent); remaining = credit_cents·1e6 − spent. */
    spentMicrocents: bigint('spent_microcents', { mode: 'number' }).notNull().default(0),
    /** `active` or `delinquent` (dunning). */
    billingStatus: text('billing_status').notNull().default('active'),
    createdAt: createdAt(),
    deletedAt: timestamp('deleted_at', { withTimezone: true, mode: 'date' }),
  },
  (t) => [
    uniqueIndex('projects_external_id_key').on(t.externalId),
    uniqueIndex('projects_slug_key').on(t.slug),
    check('projects_billing_status_check', sql`${t.billingStatus} in ('active', 'delinquent')`),
  ],
);

export const models = pgTable(
  'models',
  {
    id: uuid('id').primaryKey(),
    name: text('name').notNull(),
    contextWindow: integer('context_window').notNull(),
    capabilities: jsonb('capabilities').$type<string[]>().notNull().default([]),
    ownedBy: text('owned_by').notNull(),
    /** Prices in cents per million tokens; tokens × price = cost in micro-cents. */
    promptPriceCentsPerMtok: integer('prompt_price_cents_per_mtok').notNull().default(0),
    completionPriceCentsPerMtok: integer('completion_price_cents_per_mtok').notNull().default(0),
    /**
     * The project that created the model through the Models API (scope `inference`);
     * null for the platform's models, which every project sees.
     */
    projectId: uuid('project_id').references(() => projects.id),
    /** Deleted through the Models API: hidden, its name free again; endpoints and workers keep the row. */
    deletedAt: timestamp('deleted_at', { withTimezone: true, mode: 'date' }),
    createdAt: createdAt(),
  },
  // Names are unique among the platform's live models and within each project's:
  // two projects may both name a model `team/embedder` without learning of each
  // other (a service-wide index answered one of them 409, telling it the other's
  // name). A project model may not take a platform model's name (checked where
  // it is created); a platform model created later under a project's name is
  // hidden from that project, whose own keeps the name (ModelRepository).
  (t) => [
    uniqueIndex('models_platform_name_key')
      .on(t.name)
      .where(sql`${t.projectId} is null and ${t.deletedAt} is null`),
    uniqueIndex('models_project_name_key')
      .on(t.projectId, t.name)
      .where(sql`${t.projectId} is not null and ${t.deletedAt} is null`),
  ],
);

export const tiers = pgTable('tiers', {
  /** Tier slug: free, cpu, gpu, self_hosted. */
  id: text('id').primaryKey(),
  /** Null means unlimited. */
  requestsPerMinute: integer('requests_per_minute'),
  burst: integer('burst'),
  requestDeadlineMs: integer('request_deadline_ms').notNull(),
  idleTimeoutMs: integer('idle_timeout_ms').notNull(),
  /** Price multiplier applied to usage on this tier. */
  priceMultiplier: real('price_multiplier').notNull().default(1),
});

export const workers = pgTable(
  'workers',
  {
    id: text('id').primaryKey(),
    modelId: uuid('model_id')
      .notNull()
      .references(() => models.id),
    tierId: text('tier_id')
      .notNull()
      .references(() => tiers.id),
    /** OpenAI base URL including /v1, e.g. http://10.0.0.5:8000/v1. */
    url: text('url').notNull(),
    /** `static` (operator), `registered` (self-registration), `embedded` (started by the router). */
    source: text('source').notNull().default('static'),
    status: text('status').notNull().default('healthy'),
    lastHeartbeatAt: timestamp('last_heartbeat_at', { withTimezone: true, mode: 'date' }),
    /** Requests the worker accepts at once (self-registration); null: the router's default. */
    capacity: integer('capacity'),
    /**
     * How the worker orders its waiting queue: `fcfs`, or `priority` (vLLM's
     * `--scheduling-policy priority`): the router then sends each request a
     * `priority` (routing/prefill-order.ts).
     */
    schedulingPolicy: text('scheduling_policy')
      .$type<'fcfs' | 'priority'>()
      .notNull()
      .default('fcfs'),
    createdAt: createdAt(),
  },
  (t) => [
    index('workers_model_tier_idx').on(t.modelId, t.tierId),
    // One row per worker process: the operator API's duplicate check and a
    // registration's lookup by URL hold under concurrent requests too.
    uniqueIndex('workers_source_model_tier_url_key')
      .on(t.source, t.modelId, t.tierId, t.url)
      .where(sql`${t.source} in ('static', 'registered')`),
    check('workers_scheduling_policy_check', sql`${t.schedulingPolicy} in ('fcfs', 'priority')`),
    check('workers_status_check', sql`${t.status} in ('healthy', 'unhealthy', 'draining')`),
    check('workers_source_check', sql`${t.source} in ('static', 'registered', 'embedded')`),
  ],
);

export const endpoints = pgTable(
  'endpoints',
  {
    id: uuid('id').primaryKey(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    slug: text('slug').notNull(),
    name: text('name').notNull(),
    modelId: uuid('model_id')
      .notNull()
      .references(() => models.id),
    tierId: text('tier_id')
      .notNull()
      .references(() => tiers.id),
    status: text('status').notNull().default('active'),
    customDomain: text('custom_domain'),
    maxRequestsPerMinute: integer('max_requests_per_minute').notNull(),
    maxTokensPerMinute: integer('max_tokens_per_minute').notNull(),
    provisioningState: text('provisioning_state'),
    provisionedWorkerId: text('provisioned_worker_id'),
    createdAt: createdAt(),
    deletedAt: timestamp('deleted_at', { withTimezone: true, mode: 'date' }),
  },
  (t) => [
    uniqueIndex('endpoints_project_slug_key')
      .on(t.projectId, t.slug)
      .where(sql`${t.deletedAt} is null`),
    // A custom domain names one live endpoint, compared without case.
    uniqueIndex('endpoints_custom_domain_key')
      .on(sql`lower(${t.customDomain})`)
      .where(sql`${t.deletedAt} is null and ${t.customDomain} is not null`),
    check(
      'endpoints_status_check',
      sql`${t.status} in ('active', 'provisioning', 'suspended', 'error')`,
    ),
  ],
);

/**
 * An API key record. Its secret values live in `api_key_secrets` (one row per
 * value: the current one, plus values rotated out that are still inside their
 * 24-hour grace period).
 */
export const apiKeys = pgTable(
  'api_keys',
  {
    id: uuid('id').primaryKey(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    name: text('name').notNull().default(''),
    /** Display prefix of the current value, e.g. `swy_demo_Ab3d`; reset by rotation. */
    prefix: text('prefix').notNull(),
    scopes: jsonb('scopes').$type<string[]>().notNull(),
    expiresAt: timestamp('expires_at', { withTimezone: true, mode: 'date' }),
    allowedIps: jsonb('allowed_ips').$type<string[]>().notNull().default([]),
    blockedIps: jsonb('blocked_ips').$type<string[]>().notNull().default([]),
    quotaRequests: integer('quota_requests').notNull().default(60),
    quotaWindow: integer('quota_window').notNull().default(60),
    endpointId: uuid('endpoint_id').references(() => endpoints.id),
    revokedAt: timestamp('revoked_at', { withTimezone: true, mode: 'date' }),
    rotatedAt: timestamp('rotated_at', { withTimezone: true, mode: 'date' }),
    lastUsedAt: timestamp('last_used_at', { withTimezone: true, mode: 'date' }),
    createdAt: createdAt(),
  },
  (t) => [index('api_keys_project_idx').on(t.projectId)],
);

export const apiKeySecrets = pgTable(
  'api_key_secrets',
  {
    /** Hex SHA-256 of the full key value. */
    hash: text('hash').primaryKey(),
    keyId: uuid('key_id')
      .notNull()
      .references(() => apiKeys.id, { onDelete: 'cascade' }),
    /** Null for the current value; the end of the grace period for a rotated-out one. */
    validUntil: timestamp('valid_until', { withTimezone: true, mode: 'date' }),
    /**
     * A rotated-out value's scopes: the key's when the value was rotated out, less
     * any scope a later rotation removed from the key (keys/repository.ts `rotate`).
     * Null for the current value (the key's scopes apply).
     */
    scopes: jsonb('scopes').$type<string[]>(),
    createdAt: createdAt(),
  },
  (t) => [index('api_key_secrets_key_idx').on(t.keyId)],
);

/** Key/value facts about this installation (e.g. the demo bootstrap marker). */
export const settings = pgTable('settings', {
  key: text('key').primaryKey(),
  value: jsonb('value').notNull(),
});

/**
 * One row per chat completion, written in batches off the hot path, whatever
 * the client asked for `include_usage`. The basis of billing and SLO reports.
 */
export const usageRecords = pgTable(
  'usage_records',
  {
    requestId: text('request_id').primaryKey(),
    projectId: uuid('project_id').notNull(),
    endpointId: uuid('endpoint_id').notNull(),
    keyId: uuid('key_id'),
    workerId: text('worker_id'),
    model: text('model').notNull(),
    tierId: text('tier_id').notNull(),
    /** The request's `service_tier` hint, if any. */
    serviceTierHint: text('service_tier_hint'),
    /** Billing multiplier: 1.25 for `service_tier: priority`, else 1. */
    priceMultiplier: real('price_multiplier').notNull().default(1),
    /** `completed`, `error`, `timeout`, `cancelled` (client gone or server ended the stream). */
    status: text('status').notNull(),
    stream: integer('stream').notNull().default(0),
    promptTokens: integer('prompt_tokens').notNull().default(0),
    completionTokens: integer('completion_tokens').notNull().default(0),
    cachedTokens: integer('cached_tokens').notNull().default(0),
    reasoningTokens: integer('reasoning_tokens'),
    acceptedPredictionTokens: integer('accepted_prediction_tokens'),
    rejectedPredictionTokens: integer('rejected_prediction_tokens'),
    ttftMs: integer('ttft_ms'),
    durationMs: integer('duration_ms').notNull(),
    /** What the request cost the project, in micro-cents (tier and priority multipliers applied). */
    costMicrocents: bigint('cost_microcents', { mode: 'number' }).notNull().default(0),
    user: text('user'),
    metadata: jsonb('metadata').$type<Record<string, string>>(),
    createdAt: createdAt(),
  },
  (t) => [
    index('usage_project_created_idx').on(t.projectId, t.createdAt),
    index('usage_endpoint_created_idx').on(t.endpointId, t.createdAt),
  ],
);

/**
 * Webhook endpoints of a project (spec: Webhook endpoint). The secret is kept
 * to sign deliveries and returned only in the creation response.
 */
export const webhookEndpoints = pgTable(
  'webhook_endpoints',
  {
    id: uuid('id').primaryKey(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    url: text('url').notNull(),
    description: text('description').notNull().default(''),
    secret: text('secret').notNull(),
    events: jsonb('events').$type<string[]>().notNull(),
    isActive: integer('is_active').notNull().default(1),
    metadata: jsonb('metadata').$type<Record<string, string>>().notNull().default({}),
    createdAt: createdAt(),
    updatedAt: timestamp('updated_at', { withTimezone: true, mode: 'date' }).notNull(),
  },
  (t) => [index('webhook_endpoints_project_idx').on(t.projectId, t.createdAt)],
);

/**
 * The outbox: one row per emitted event, written in the same transaction as
 * the state change that caused it. `body` holds the exact bytes every delivery
 * of it sends (and signs).
 */
export const events = pgTable(
  'events',
  {
    id: text('id').primaryKey(),
    projectId: uuid('project_id').notNull(),
    type: text('type').notNull(),
    body: text('body').notNull(),
    createdAt: createdAt(),
  },
  (t) => [index('events_project_created_idx').on(t.projectId, t.createdAt)],
);

/**
 * One delivery of one event to one webhook endpoint. Claimed by dispatchers
 * with a lease and a fencing token (`lease_token`, incremented by every claim;
 * a completion whose token no longer matches is discarded).
 */
export const webhookDeliveries = pgTable(
  'webhook_deliveries',
  {
    id: text('id').primaryKey(),
    endpointId: uuid('endpoint_id')
      .notNull()
      .references(() => webhookEndpoints.id, { onDelete: 'cascade' }),
    eventId: text('event_id')
      .notNull()
      .references(() => events.id),
    projectId: uuid('project_id').notNull(),
    eventType: text('event_type').notNull(),
    /** `pending`, `delivered` or `failed` (permanently). */
    status: text('status').notNull().default('pending'),
    attemptCount: integer('attempt_count').notNull().default(0),
    nextAttemptAt: timestamp('next_attempt_at', { withTimezone: true, mode: 'date' }).notNull(),
    leaseUntil: timestamp('lease_until', { withTimezone: true, mode: 'date' }),
    leaseToken: bigint('lease_token', { mode: 'number' }).notNull().default(0),
    httpStatus: integer('http_status'),
    responseBody: text('response_body'),
    lastError: text('last_error'),
    createdAt: createdAt(),
    updatedAt: timestamp('updated_at', { withTimezone: true, mode: 'date' }).notNull(),
  },
  (t) => [
    index('webhook_deliveries_due_idx')
      .on(t.nextAttemptAt)
      .where(sql`${t.status} = 'pending'`),
    index('webhook_deliveries_endpoint_idx').on(t.endpointId, t.createdAt),
    check(
      'webhook_deliveries_status_check',
      sql`${t.status} in ('pending', 'delivered', 'failed')`,
    ),
  ],
);

/** Every delivery attempt: status, first 1 KiB of the body, error, duration. */
export const webhookAttempts = pgTable(
  'webhook_attempts',
  {
    deliveryId: text('delivery_id')
      .notNull()
      .references(() => webhookDeliveries.id, { onDelete: 'cascade' }),
    attemptNo: integer('attempt_no').notNull(),
    /** `in_progress` until recorded; `succeeded`, `failed`, or `lost` (dispatcher died). */
    outcome: text('outcome').notNull(),
    httpStatus: integer('http_status'),
    responseBody: text('response_body'),
    error: text('error'),
    durationMs: integer('duration_ms'),
    startedAt: timestamp('started_at', { withTimezone: true, mode: 'date' }).notNull(),
  },
  (t) => [primaryKey({ columns: [t.deliveryId, t.attemptNo] })],
);

/** Budget alerts: thresholds (percent of a monthly budget) that trigger legacy deliveries. */
export const budgetAlerts = pgTable(
  'budget_alerts',
  {
    id: uuid('id').primaryKey(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    name: text('name').notNull(),
    budgetAmountCents: bigint('budget_amount_cents', { mode: 'number' }).notNull(),
    thresholds: jsonb('thresholds').$type<number[]>().notNull(),
    /** Thresholds already fired, per month: `{"2026-11": [50, 80]}`. */
    fired: jsonb('fired').$type<Record<string, number[]>>().notNull().default({}),
    createdAt: createdAt(),
  },
  (t) => [index('budget_alerts_project_idx').on(t.projectId)],
);

/*
 * The execution surface (src/exec/). External ids are `<prefix>_<hex>`; the
 * rows keep a UUID primary key like every other table. Secrets (join keys,
 * user tokens) are stored only as SHA-256 hex.
 */

/** People who decide approvals (dashboard sign-in comes later). */
export const users = pgTable(
  'users',
  {
    id: uuid('id').primaryKey(),
    /** `usr_<hex>` */
    externalId: text('external_id').notNull(),
    name: text('name').notNull(),
    email: text('email').notNull(),
    /** SHA-256 hex of the personal token `swyu_…` (shown once). */
    tokenHash: text('token_hash').notNull(),
    /** Dashboard password (scrypt, dashboard/passwords.ts); null: identity-provider sign-in only. */
    passwordHash: text('password_hash'),
    /** The TOTP seed, sealed (dashboard/at-rest.ts); null while 2FA is off. */
    totpSecret: text('totp_secret'),
    /** A seed being set up, sealed, until a code from it is verified. */
    totpPending: text('totp_pending'),
    /** The last TOTP time step accepted: a code is usable once. */
    totpLastStep: integer('totp_last_step'),
    createdAt: createdAt(),
  },
  (t) => [
    uniqueIndex('users_external_id_key').on(t.externalId),
    uniqueIndex('users_email_key').on(t.email),
    uniqueIndex('users_token_hash_key').on(t.tokenHash),
  ],
);

/** One-time backup codes (SHA-256 of the normalised code); regeneration replaces them all. */
export const userBackupCodes = pgTable(
  'user_backup_codes',
  {
    userId: uuid('user_id')
      .notNull()
      .references(() => users.id, { onDelete: 'cascade' }),
    codeHash: text('code_hash').notNull(),
    usedAt: timestamp('used_at', { withTimezone: true, mode: 'date' }),
    createdAt: createdAt(),
  },
  (t) => [primaryKey({ columns: [t.userId, t.codeHash] })],
);

/**
 * Dashboard sessions, shared by every instance: the cookie holds a random token,
 * the row its SHA-256. Each request moves `expiresAt` to min(last activity + 480
 * min, created + 1440 min) (spec, Dashboard sessions).
 */
export const dashboardSessions = pgTable(
  'dashboard_sessions',
  {
    tokenHash: text('token_hash').primaryKey(),
    userId: uuid('user_id')
      .notNull()
      .references(() => users.id, { onDelete: 'cascade' }),
    /** The page's `csrf-token` value; state-changing requests send it as X-CSRF-Token. */
    csrfToken: text('csrf_token').notNull(),
    lastSeenAt: timestamp('last_seen_at', { withTimezone: true, mode: 'date' }).notNull(),
    expiresAt: timestamp('expires_at', { withTimezone: true, mode: 'date' }).notNull(),
    createdAt: createdAt(),
  },
  (t) => [index('dashboard_sessions_user_idx').on(t.userId)],
);

/** A password (or identity-provider) login waiting for its TOTP code: 5 minutes, then restart. */
export const loginChallenges = pgTable('login_challenges', {
  tokenHash: text('token_hash').primaryKey(),
  userId: uuid('user_id')
    .notNull()
    .references(() => users.id, { onDelete: 'cascade' }),
  csrfToken: text('csrf_token').notNull(),
  expiresAt: timestamp('expires_at', { withTimezone: true, mode: 'date' }).notNull(),
  createdAt: createdAt(),
});

/** An identity-provider login in flight, keyed by its OAuth `state` (10 minutes). */
export const idpLogins = pgTable('idp_logins', {
  state: text('state').primaryKey(),
  provider: text('provider').notNull(),
  nonce: text('nonce').notNull(),
  codeVerifier: text('code_verifier').notNull(),
  /** Set when a signed-in user links an identity rather than signing in with it. */
  linkUserId: uuid('link_user_id').references(() => users.id, { onDelete: 'cascade' }),
  expiresAt: timestamp('expires_at', { withTimezone: true, mode: 'date' }).notNull(),
  createdAt: createdAt(),
});

/** Identities at providers linked to a user (dashboard sign-in only, never API access). */
export const userIdentities = pgTable(
  'user_identities',
  {
    provider: text('provider').notNull(),
    subject: text('subject').notNull(),
    userId: uuid('user_id')
      .notNull()
      .references(() => users.id, { onDelete: 'cascade' }),
    email: text('email'),
    createdAt: createdAt(),
  },
  (t) => [
    primaryKey({ columns: [t.provider, t.subject] }),
    index('user_identities_user_idx').on(t.userId),
  ],
);

export const projectMembers = pgTable(
  'project_members',
  {
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    userId: uuid('user_id')
      .notNull()
      .references(() => users.id),
    role: text('role').notNull(),
    createdAt: createdAt(),
  },
  (t) => [
    primaryKey({ columns: [t.projectId, t.userId] }),
    check('project_members_role_check', sql`${t.role} in ('owner', 'admin', 'approver', 'viewer')`),
  ],
);

export const workspaces = pgTable(
  'workspaces',
  {
    id: uuid('id').primaryKey(),
    /** `ws_<hex>` */
    externalId: text('external_id').notNull(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    name: text('name').notNull().default(''),
    metadata: jsonb('metadata').$type<Record<string, string>>().notNull().default({}),
    createdAt: createdAt(),
  },
  (t) => [
    uniqueIndex('workspaces_external_id_key').on(t.externalId),
    index('workspaces_project_idx').on(t.projectId, t.createdAt),
  ],
);

export const joinKeys = pgTable(
  'join_keys',
  {
    id: uuid('id').primaryKey(),
    /** `jk_<hex>` */
    externalId: text('external_id').notNull(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    name: text('name').notNull().default(''),
    /** SHA-256 hex of the secret `swyjk_…` (shown once). */
    secretHash: text('secret_hash').notNull(),
    /** Display prefix, e.g. `swyjk_Ab3d`. */
    prefix: text('prefix').notNull(),
    /** When set, the key enrolls only this registration_name (and may take it over). */
    registrationName: text('registration_name'),
    expiresAt: timestamp('expires_at', { withTimezone: true, mode: 'date' }),
    maxUses: integer('max_uses'),
    useCount: integer('use_count').notNull().default(0),
    revokedAt: timestamp('revoked_at', { withTimezone: true, mode: 'date' }),
    createdAt: createdAt(),
  },
  (t) => [
    uniqueIndex('join_keys_external_id_key').on(t.externalId),
    uniqueIndex('join_keys_secret_hash_key').on(t.secretHash),
    index('join_keys_project_idx').on(t.projectId, t.createdAt),
  ],
);

export const agents = pgTable(
  'agents',
  {
    id: uuid('id').primaryKey(),
    /** `agt_<hex>` */
    externalId: text('external_id').notNull(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    registrationName: text('registration_name').notNull(),
    /** Z85, 40 characters: the agent's identity on the broker. */
    curvePublicKey: text('curve_public_key').notNull(),
    /** `enrolled`, `offline` or `deleted`. */
    status: text('status').notNull(),
    manifest: jsonb('manifest').$type<Record<string, unknown>>().notNull(),
    manifestHash: text('manifest_hash').notNull(),
    description: text('description').notNull().default(''),
    metadata: jsonb('metadata').$type<Record<string, string>>().notNull().default({}),
    joinKeyId: uuid('join_key_id').references(() => joinKeys.id),
    leaseExpiresAt: timestamp('lease_expires_at', { withTimezone: true, mode: 'date' }),
    enrolledAt: timestamp('enrolled_at', { withTimezone: true, mode: 'date' }).notNull(),
    lastSeenAt: timestamp('last_seen_at', { withTimezone: true, mode: 'date' }),
    createdAt: createdAt(),
    updatedAt: timestamp('updated_at', { withTimezone: true, mode: 'date' }).notNull(),
    deletedAt: timestamp('deleted_at', { withTimezone: true, mode: 'date' }),
  },
  (t) => [
    uniqueIndex('agents_external_id_key').on(t.externalId),
    uniqueIndex('agents_project_name_key')
      .on(t.projectId, t.registrationName)
      .where(sql`${t.deletedAt} is null`),
    uniqueIndex('agents_curve_key_key')
      .on(t.curvePublicKey)
      .where(sql`${t.deletedAt} is null`),
    index('agents_lease_idx')
      .on(t.leaseExpiresAt)
      .where(sql`${t.status} = 'enrolled'`),
    check('agents_status_check', sql`${t.status} in ('enrolled', 'offline', 'deleted')`),
  ],
);

export const invocations = pgTable(
  'invocations',
  {
    id: uuid('id').primaryKey(),
    /** `inv_<hex>` */
    externalId: text('external_id').notNull(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    workspaceId: uuid('workspace_id')
      .notNull()
      .references(() => workspaces.id),
    tool: text('tool').notNull(),
    risk: text('risk').notNull(),
    /** The agent chosen at creation; the one dispatched to. */
    agentId: uuid('agent_id').references(() => agents.id),
    arguments: jsonb('arguments').notNull(),
    /**
     * `http` or `mcp`: the surface it was created on. An `mcp` one runs only on an
     * agent whose own declaration of the tool is `mcp_visible`, whenever it is dispatched.
     */
    surface: text('surface').notNull().default('http'),
    status: text('status').notNull(),
    idempotencyKey: text('idempotency_key'),
    /** SHA-256 hex of the canonical JSON of the request body. */
    requestHash: text('request_hash').notNull(),
    timeoutMs: integer('timeout_ms').notNull(),
    exitCode: integer('exit_code'),
    durationMs: integer('duration_ms'),
    stdout: text('stdout'),
    stderr: text('stderr'),
    outputTruncated: integer('output_truncated').notNull().default(0),
    errorCode: text('error_code'),
    errorMessage: text('error_message'),
    createdAt: createdAt(),
    queuedAt: timestamp('queued_at', { withTimezone: true, mode: 'date' }),
    dispatchedAt: timestamp('dispatched_at', { withTimezone: true, mode: 'date' }),
    startedAt: timestamp('started_at', { withTimezone: true, mode: 'date' }),
    finishedAt: timestamp('finished_at', { withTimezone: true, mode: 'date' }),
    updatedAt: timestamp('updated_at', { withTimezone: true, mode: 'date' }).notNull(),
  },
  (t) => [
    uniqueIndex('invocations_external_id_key').on(t.externalId),
    uniqueIndex('invocations_idempotency_key')
      .on(t.projectId, t.idempotencyKey)
      .where(sql`${t.idempotencyKey} is not null`),
    index('invocations_project_created_idx').on(t.projectId, t.createdAt),
    index('invocations_active_idx')
      .on(t.status)
      .where(sql`${t.status} in ('queued', 'dispatched', 'running')`),
    // Ended by the router after a dispatch: the scheduler's CANCEL delivery (scheduler.ts).
    index('invocations_router_ended_idx')
      .on(t.finishedAt)
      .where(
        sql`${t.status} in ('cancelled', 'failed') and ${t.dispatchedAt} is not null and ${t.durationMs} is null`,
      ),
    check(
      'invocations_status_check',
      sql`${t.status} in ('pending_approval', 'queued', 'dispatched', 'running', 'completed', 'failed', 'cancelled')`,
    ),
  ],
);

export const approvals = pgTable(
  'approvals',
  {
    id: uuid('id').primaryKey(),
    /** `app_<hex>` */
    externalId: text('external_id').notNull(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    invocationId: uuid('invocation_id')
      .notNull()
      .references(() => invocations.id),
    status: text('status').notNull(),
    /** Zero-based index into `chain`. */
    stage: integer('stage').notNull().default(0),
    /** The project's escalation chain when the approval was requested. */
    chain: jsonb('chain').$type<Array<{ target: string; timeout_ms: number }>>().notNull(),
    stageDeadline: timestamp('stage_deadline', { withTimezone: true, mode: 'date' }).notNull(),
    decidedBy: uuid('decided_by').references(() => users.id),
    reason: text('reason'),
    createdAt: createdAt(),
    decidedAt: timestamp('decided_at', { withTimezone: true, mode: 'date' }),
    updatedAt: timestamp('updated_at', { withTimezone: true, mode: 'date' }).notNull(),
  },
  (t) => [
    uniqueIndex('approvals_external_id_key').on(t.externalId),
    uniqueIndex('approvals_invocation_key').on(t.invocationId),
    index('approvals_project_created_idx').on(t.projectId, t.createdAt),
    index('approvals_deadline_idx')
      .on(t.stageDeadline)
      .where(sql`${t.status} = 'pending'`),
    check(
      'approvals_status_check',
      sql`${t.status} in ('pending', 'accepted', 'rejected', 'expired')`,
    ),
  ],
);

/**
 * Latency objectives of an inference endpoint (src/slos/): a TTFT and/or TPOT
 * target in ms, the fraction of requests that must meet it, and the rolling
 * window it is judged over. Attainment is computed from `usage_records` when
 * read, never stored.
 */
export const slos = pgTable(
  'slos',
  {
    id: uuid('id').primaryKey(),
    /** `slo_<hex>` */
    externalId: text('external_id').notNull(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    endpointId: uuid('endpoint_id')
      .notNull()
      .references(() => endpoints.id),
    name: text('name').notNull().default(''),
    ttftMs: doublePrecision('ttft_ms'),
    tpotMs: doublePrecision('tpot_ms'),
    objective: doublePrecision('objective').notNull(),
    windowSeconds: integer('window_seconds').notNull(),
    createdAt: createdAt(),
    updatedAt: timestamp('updated_at', { withTimezone: true, mode: 'date' }).notNull(),
  },
  (t) => [
    uniqueIndex('slos_external_id_key').on(t.externalId),
    index('slos_endpoint_idx').on(t.endpointId),
    index('slos_project_created_idx').on(t.projectId, t.createdAt),
    check('slos_target_check', sql`${t.ttftMs} is not null or ${t.tpotMs} is not null`),
    check('slos_objective_check', sql`${t.objective} > 0 and ${t.objective} < 1`),
  ],
);

/** Raw bytes (PGlite hands back a Uint8Array, node-postgres a Buffer). */
const bytea = customType<{ data: Buffer; driverData: Uint8Array }>({
  dataType: () => 'bytea',
  fromDriver: (v) => (Buffer.isBuffer(v) ? v : Buffer.from(v.buffer, v.byteOffset, v.byteLength)),
});

/**
 * Files of a project (src/files/, OpenAI's Files API). The content is in
 * `blob_chunks` under the file's id, never on a router's disk, so any instance
 * serves any file. A row is `uploading` (invisible to the API) while its content
 * is written, `processed` once complete. `seq` orders lists and cursors.
 */
export const files = pgTable(
  'files',
  {
    /** `file-<24 hex>` */
    id: text('id').primaryKey(),
    seq: bigserial('seq', { mode: 'number' }).notNull(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    filename: text('filename').notNull(),
    purpose: text('purpose').notNull(),
    /**
     * The endpoint a `batch_output` file's batch ran on: a key bound to another
     * endpoint does not see it. Null for uploads, which belong to the project.
     */
    endpointId: uuid('endpoint_id').references(() => endpoints.id),
    bytes: bigint('bytes', { mode: 'number' }).notNull().default(0),
    status: text('status').notNull(),
    createdAt: createdAt(),
  },
  (t) => [
    index('files_project_seq_idx').on(t.projectId, t.seq),
    check('files_status_check', sql`${t.status} in ('uploading', 'processed')`),
  ],
);

/**
 * Content of files and of upload parts, in order of `seq` (gaps allowed), at most
 * about 1 MiB a row. `owner` is a file id (`file-…`) or an upload part id (`part_…`).
 */
export const blobChunks = pgTable(
  'blob_chunks',
  {
    owner: text('owner').notNull(),
    seq: integer('seq').notNull(),
    data: bytea('data').notNull(),
  },
  (t) => [primaryKey({ columns: [t.owner, t.seq] })],
);

/** Multipart uploads (OpenAI's Uploads API): parts are collected, then become one file. */
export const uploads = pgTable(
  'uploads',
  {
    /** `upload_<24 hex>` */
    id: text('id').primaryKey(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    filename: text('filename').notNull(),
    purpose: text('purpose').notNull(),
    /** The size the client declared; the parts named at completion must add up to it. */
    bytes: bigint('bytes', { mode: 'number' }).notNull(),
    mimeType: text('mime_type').notNull(),
    status: text('status').notNull(),
    fileId: text('file_id'),
    expiresAt: timestamp('expires_at', { withTimezone: true, mode: 'date' }).notNull(),
    createdAt: createdAt(),
  },
  (t) => [
    index('uploads_project_idx').on(t.projectId),
    check(
      'uploads_status_check',
      sql`${t.status} in ('pending', 'completed', 'cancelled', 'expired')`,
    ),
  ],
);

export const uploadParts = pgTable(
  'upload_parts',
  {
    /** `part_<24 hex>`; its bytes are `blob_chunks` owned by this id. */
    id: text('id').primaryKey(),
    uploadId: text('upload_id')
      .notNull()
      .references(() => uploads.id, { onDelete: 'cascade' }),
    bytes: bigint('bytes', { mode: 'number' }).notNull(),
    /**
     * `streaming` while its bytes arrive (recorded before them, so that the upload's
     * cancel, expiry or completion drops them even when the router died meanwhile),
     * then `stored`; only a stored part is counted or assembled.
     */
    status: text('status').notNull().default('stored'),
    createdAt: createdAt(),
  },
  (t) => [
    index('upload_parts_upload_idx').on(t.uploadId),
    check('upload_parts_status_check', sql`${t.status} in ('streaming', 'stored')`),
  ],
);

/**
 * Batches (OpenAI's Batch API, src/batches/). Run by the batch runner of any
 * `dispatcher` instance: the one holding the lease (`lease_until`, fencing
 * `lease_token`) runs the batch's requests; writes of a runner whose token is no
 * longer current are discarded. `key_id` is the creating key: requests run as it.
 */
export const batches = pgTable(
  'batches',
  {
    /** `batch_<24 hex>` */
    id: text('id').primaryKey(),
    seq: bigserial('seq', { mode: 'number' }).notNull(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    endpointId: uuid('endpoint_id')
      .notNull()
      .references(() => endpoints.id),
    keyId: uuid('key_id')
      .notNull()
      .references(() => apiKeys.id),
    /** The request path every line targets: `/v1/chat/completions` or `/v1/embeddings`. */
    endpoint: text('endpoint').notNull(),
    inputFileId: text('input_file_id').notNull(),
    completionWindow: text('completion_window').notNull(),
    status: text('status').notNull(),
    outputFileId: text('output_file_id'),
    errorFileId: text('error_file_id'),
    errors: jsonb('errors').$type<unknown>(),
    metadata: jsonb('metadata').$type<Record<string, string>>(),
    total: integer('total').notNull(),
    completed: integer('completed').notNull().default(0),
    failed: integer('failed').notNull().default(0),
    expiresAt: timestamp('expires_at', { withTimezone: true, mode: 'date' }).notNull(),
    inProgressAt: timestamp('in_progress_at', { withTimezone: true, mode: 'date' }),
    finalizingAt: timestamp('finalizing_at', { withTimezone: true, mode: 'date' }),
    completedAt: timestamp('completed_at', { withTimezone: true, mode: 'date' }),
    failedAt: timestamp('failed_at', { withTimezone: true, mode: 'date' }),
    expiredAt: timestamp('expired_at', { withTimezone: true, mode: 'date' }),
    cancellingAt: timestamp('cancelling_at', { withTimezone: true, mode: 'date' }),
    cancelledAt: timestamp('cancelled_at', { withTimezone: true, mode: 'date' }),
    leaseUntil: timestamp('lease_until', { withTimezone: true, mode: 'date' }),
    leaseToken: bigint('lease_token', { mode: 'number' }).notNull().default(0),
    createdAt: createdAt(),
  },
  (t) => [
    index('batches_project_seq_idx').on(t.projectId, t.seq),
    index('batches_active_idx')
      .on(t.seq)
      .where(sql`${t.status} in ('validating', 'in_progress', 'finalizing', 'cancelling')`),
    check(
      'batches_status_check',
      sql`${t.status} in ('validating', 'failed', 'in_progress', 'finalizing', 'completed', 'expired', 'cancelling', 'cancelled')`,
    ),
  ],
);

/**
 * The requests of a batch that is not yet terminal, one row per input line:
 * `pending` until run, then `completed` (2xx) or `failed` with `result`, the
 * line of the output or error file. Deleted when the batch is finalised.
 */
export const batchRequests = pgTable(
  'batch_requests',
  {
    batchId: text('batch_id')
      .notNull()
      .references(() => batches.id, { onDelete: 'cascade' }),
    idx: integer('idx').notNull(),
    customId: text('custom_id').notNull(),
    /** The request body as JSON text. */
    body: text('body').notNull(),
    status: text('status').notNull().default('pending'),
    result: text('result'),
  },
  (t) => [
    primaryKey({ columns: [t.batchId, t.idx] }),
    check('batch_requests_status_check', sql`${t.status} in ('pending', 'completed', 'failed')`),
  ],
);

/**
 * Stored Responses API responses (`store` true, the default): the Response object as
 * the client got it, the input items it was given (with their ids, for
 * `/input_items`), and the whole conversation through its output as chat messages,
 * so a later request's `previous_response_id` continues it without walking a chain.
 * Instructions are not part of `messages` (they do not carry over, as in OpenAI's API).
 */
export const responses = pgTable(
  'responses',
  {
    id: text('id').primaryKey(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    endpointId: uuid('endpoint_id')
      .notNull()
      .references(() => endpoints.id),
    body: jsonb('body').$type<Record<string, unknown>>().notNull(),
    inputItems: jsonb('input_items').$type<Record<string, unknown>[]>().notNull(),
    messages: jsonb('messages').$type<Record<string, unknown>[]>().notNull(),
    createdAt: createdAt(),
  },
  (t) => [index('responses_project_created_idx').on(t.projectId, t.createdAt)],
);

/**
 * Stored chat completions (`store: true` on `POST /chat/completions`): the
 * ChatCompletion exactly as the client got it (`body`, without `metadata`), the
 * request's `messages`, and its `metadata` (the one part that may change later).
 * `seq` orders a project's list and is its cursor; `model` is the endpoint's
 * model, for the list's filter. Kept until deleted.
 */
export const chatCompletions = pgTable(
  'chat_completions',
  {
    id: text('id').primaryKey(),
    seq: bigserial('seq', { mode: 'number' }).notNull(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    endpointId: uuid('endpoint_id')
      .notNull()
      .references(() => endpoints.id),
    model: text('model').notNull(),
    metadata: jsonb('metadata').$type<Record<string, string>>().notNull().default({}),
    body: jsonb('body').$type<Record<string, unknown>>().notNull(),
    messages: jsonb('messages').$type<Record<string, unknown>[]>().notNull(),
    createdAt: createdAt(),
  },
  (t) => [index('chat_completions_project_seq_idx').on(t.projectId, t.seq)],
);

/** Conversations API: a project's conversation (soft-deleted, so its items go with it). */
export const conversations = pgTable(
  'conversations',
  {
    id: text('id').primaryKey(),
    projectId: uuid('project_id')
      .notNull()
      .references(() => projects.id),
    /**
     * The endpoint under whose path it was made (null: the project alias); a key
     * bound to an endpoint sees only that endpoint's (conversations/service.ts).
     */
    endpointId: uuid('endpoint_id').references(() => endpoints.id),
    metadata: jsonb('metadata').$type<Record<string, string>>().notNull().default({}),
    createdAt: createdAt(),
    deletedAt: timestamp('deleted_at', { withTimezone: true, mode: 'date' }),
  },
  (t) => [index('conversations_project_idx').on(t.projectId, t.createdAt)],
);

/**
 * A conversation's items in order (`seq`): messages, function calls and their
 * outputs in the Responses API's item shape, with their ids.
 */
export const conversationItems = pgTable(
  'conversation_items',
  {
    conversationId: text('conversation_id')
      .notNull()
      .references(() => conversations.id, { onDelete: 'cascade' }),
    seq: bigserial('seq', { mode: 'number' }).notNull(),
    id: text('id').notNull(),
    item: jsonb('item').$type<Record<string, unknown>>().notNull(),
    createdAt: createdAt(),
  },
  (t) => [
    primaryKey({ columns: [t.conversationId, t.seq] }),
    uniqueIndex('conversation_items_id_key').on(t.conversationId, t.id),
  ],
);
