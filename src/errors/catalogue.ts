/**
 * The error catalogue: every `error.code` the service can return, with its HTTP
 * status, its `error.type` and whether a client may retry. Handlers never build
 * error bodies by hand; they throw `ServiceError`s created from this table, and
 * the HTTP layer renders the spec's envelope `{error: {message, type, code, param}}`.
 *
 * Codes are stable across releases (clients key on them); types are informational.
 */

export type ErrorType =
  | 'invalid_request_error'
  | 'authentication_error'
  | 'permission_error'
  | 'not_found_error'
  | 'rate_limit_error'
  | 'timeout_error'
  | 'insufficient_quota'
  | 'server_error'
  | 'conflict_error';

export interface ErrorSpec {
  readonly status: number;
  readonly type: ErrorType;
  readonly retryable: boolean;
  readonly message: string;
}

function e(status: number, type: ErrorType, retryable: boolean, message: string): ErrorSpec {
  return { status, type, retryable, message };
}

export const catalogue = {
  // Generic request errors.
  invalid_body: e(400, 'invalid_request_error', false, 'The request body is invalid.'),
  invalid_value: e(400, 'invalid_request_error', false, 'A request field has an invalid value.'),
  missing_required_parameter: e(
    400,
    'invalid_request_error',
    false,
    'A required field is missing.',
  ),
  invalid_type: e(400, 'invalid_request_error', false, 'A request field has the wrong type.'),
  unsupported_value: e(400, 'invalid_request_error', false, 'The value is not supported.'),
  invalid_json: e(400, 'invalid_request_error', false, 'The request body is not valid JSON.'),
  malformed_request: e(400, 'invalid_request_error', false, 'The HTTP request is malformed.'),
  headers_too_large: e(431, 'invalid_request_error', false, 'The request headers are too large.'),
  expectation_failed: e(
    417,
    'invalid_request_error',
    false,
    "The request's Expect header cannot be met.",
  ),
  unsupported_media_type: e(
    415,
    'invalid_request_error',
    false,
    'Content-Type must be application/json.',
  ),
  not_found: e(404, 'not_found_error', false, 'The requested resource does not exist.'),
  webhook_endpoint_limit: e(
    400,
    'invalid_request_error',
    false,
    'The project already has the maximum number of webhook endpoints.',
  ),
  webhook_not_found: e(404, 'invalid_request_error', false, 'No such webhook endpoint.'),
  delivery_not_found: e(404, 'invalid_request_error', false, 'No such webhook delivery.'),
  slo_limit: e(
    400,
    'invalid_request_error',
    false,
    'The endpoint already has the maximum number of SLOs.',
  ),
  slo_not_found: e(404, 'invalid_request_error', false, 'No such SLO.'),
  file_not_found: e(404, 'invalid_request_error', false, 'No such file.'),
  upload_not_found: e(404, 'invalid_request_error', false, 'No such upload.'),
  batch_not_found: e(404, 'invalid_request_error', false, 'No such batch.'),
  conversation_not_found: e(404, 'invalid_request_error', false, 'No such conversation.'),
  item_not_found: e(404, 'invalid_request_error', false, 'No such item in this conversation.'),
  response_not_found: e(404, 'invalid_request_error', false, 'No such response.'),
  chat_completion_not_found: e(
    404,
    'invalid_request_error',
    false,
    'No such stored chat completion.',
  ),
  budget_alert_limit: e(
    400,
    'invalid_request_error',
    false,
    'The project already has the maximum number of budget alerts.',
  ),
  budget_alert_not_found: e(404, 'invalid_request_error', false, 'No such budget alert.'),
  route_not_found: e(404, 'invalid_request_error', false, 'Unknown route.'),
  method_not_allowed: e(405, 'invalid_request_error', false, 'Method not allowed.'),
  conflict: e(409, 'invalid_request_error', false, 'The resource already exists.'),
  model_not_found: e(404, 'invalid_request_error', false, 'The model does not exist.'),
  model_in_use: e(409, 'invalid_request_error', false, 'An endpoint uses the model.'),
  model_not_owned: e(
    403,
    'permission_error',
    false,
    'Only the project that created the model may change it.',
  ),
  endpoint_not_found: e(404, 'invalid_request_error', false, 'The endpoint does not exist.'),
  project_not_found: e(404, 'invalid_request_error', false, 'The project does not exist.'),
  key_not_found: e(404, 'invalid_request_error', false, 'The API key does not exist.'),
  worker_not_found: e(404, 'invalid_request_error', false, 'The worker does not exist.'),

  // Authentication and authorization.
  missing_api_key: e(
    401,
    'authentication_error',
    false,
    'No API key was provided. Send Authorization: Bearer <API_KEY>.',
  ),
  invalid_api_key: e(
    401,
    'authentication_error',
    false,
    'The API key is invalid, expired or revoked.',
  ),
  invalid_admin_token: e(
    401,
    'authentication_error',
    false,
    'The operator token is missing or invalid.',
  ),
  authentication_required: e(
    401,
    'authentication_error',
    false,
    'This route needs an identity and none was presented.',
  ),
  // Dashboard sign-in (the account boundary; never the API-key surface).
  invalid_credentials: e(
    401,
    'authentication_error',
    false,
    'The e-mail address or password is wrong.',
  ),
  invalid_code: e(
    401,
    'authentication_error',
    false,
    'The two-factor code is wrong, expired or already used.',
  ),
  login_expired: e(
    401,
    'authentication_error',
    false,
    'The login took longer than 5 minutes; sign in again.',
  ),
  csrf_token_invalid: e(
    403,
    'permission_error',
    false,
    'The X-CSRF-Token header is missing or does not match the page.',
  ),
  identity_login_failed: e(
    401,
    'authentication_error',
    false,
    'The identity provider did not sign you in.',
  ),
  scope_insufficient: e(
    403,
    'authentication_error',
    false,
    'The API key lacks the scope this route requires.',
  ),
  cross_project_access: e(
    403,
    'permission_error',
    false,
    'The API key belongs to another project.',
  ),
  endpoint_restricted: e(
    403,
    'permission_error',
    false,
    'The API key is not entitled to this endpoint.',
  ),
  ip_not_allowed: e(
    403,
    'permission_error',
    false,
    'Requests from this address are not allowed for this API key.',
  ),
  project_mismatch: e(403, 'permission_error', false, 'The resource belongs to another project.'),
  https_required: e(403, 'invalid_request_error', false, 'HTTPS is required.'),

  // Limits and billing.
  rate_limit_exceeded: e(429, 'rate_limit_error', true, 'Rate limit exceeded.'),
  capacity_exceeded: e(
    429,
    'rate_limit_error',
    true,
    'Inference capacity is saturated; retry later.',
  ),
  insufficient_quota: e(402, 'insufficient_quota', false, 'The project has no remaining credit.'),
  billing_delinquent: e(402, 'insufficient_quota', false, 'The project has an unpaid balance.'),
  payload_too_large: e(
    413,
    'invalid_request_error',
    false,
    'The request body exceeds the size limit.',
  ),

  // Inference.
  request_timeout: e(408, 'timeout_error', true, 'The request exceeded its tier deadline.'),
  model_capability_missing: e(
    400,
    'invalid_request_error',
    false,
    'The model lacks a required capability.',
  ),
  context_length_exceeded: e(
    400,
    'invalid_request_error',
    false,
    'The prompt does not fit the context window.',
  ),
  upstream_rejected: e(
    400,
    'invalid_request_error',
    false,
    'The inference worker rejected the request.',
  ),
  endpoint_suspended: e(403, 'permission_error', false, 'The endpoint is suspended.'),
  upstream_error: e(502, 'server_error', true, 'The inference worker failed.'),
  unavailable: e(
    503,
    'server_error',
    true,
    'The service is temporarily unable to accept the request.',
  ),
  cancelled: e(499, 'invalid_request_error', false, 'The request was cancelled.'),

  // Execution surface.
  exec_tool_not_found: e(404, 'invalid_request_error', false, 'No online agent offers this tool.'),
  tool_not_mcp_visible: e(
    400,
    'invalid_request_error',
    false,
    'The tool is not exposed on this surface.',
  ),
  tool_executor_unavailable: e(503, 'server_error', true, 'No agent is online for the tool.'),
  invocation_not_found: e(404, 'invalid_request_error', false, 'No such invocation.'),
  invocation_terminal: e(
    409,
    'invalid_request_error',
    false,
    'The invocation is already terminal.',
  ),
  exec_idempotency_conflict: e(
    409,
    'invalid_request_error',
    false,
    'Idempotency-Key reused with a different body.',
  ),
  approval_not_found: e(404, 'invalid_request_error', false, 'No such approval.'),
  approval_not_pending: e(409, 'invalid_request_error', false, 'The approval is not pending.'),
  missing_workspace_id: e(400, 'invalid_request_error', false, 'workspace_id is required.'),
  invalid_workspace_id: e(
    400,
    'invalid_request_error',
    false,
    'workspace_id must have the form ws_<hex>.',
  ),
  workspace_not_found: e(404, 'invalid_request_error', false, 'No such workspace.'),
  workspace_lookup_failed: e(500, 'server_error', true, 'Workspace lookup failed; retry.'),
  retriever_failed: e(502, 'server_error', true, 'The retrieval backend failed.'),
  already_terminal: e(400, 'invalid_request_error', false, 'The record is already terminal.'),
  invalid_state: e(
    409,
    'invalid_request_error',
    false,
    'The transition is not allowed from the current state.',
  ),
  // Execution surface, Switchyard's own (management API and approval deciders).
  join_key_not_found: e(404, 'invalid_request_error', false, 'No such join key.'),
  agent_not_found: e(404, 'invalid_request_error', false, 'No such agent.'),
  user_not_found: e(404, 'invalid_request_error', false, 'No such user.'),
  invalid_user_token: e(401, 'authentication_error', false, 'The user token is invalid.'),
  insufficient_role: e(
    403,
    'permission_error',
    false,
    "The user's project role does not allow this decision.",
  ),

  internal_error: e(500, 'server_error', true, 'Internal server error.'),
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof catalogue;
