/**
 * The spec's "Execution-surface codes" table, row by row, against the error
 * catalogue: status and retryability (and the type where the spec names one).
 * Each code's HTTP path is exercised in the other exec tests; this pins the one
 * place that defines the numbers. `exec_tool_not_found` is 404 in the
 * catalogue and 400 where it names an invocation target (invocations.test.ts).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { catalogue, type ErrorCode } from '../../src/errors/catalogue.js';
import type { EnrollResult } from '../../src/exec/contracts.js';

// [code, status, retryable, type?] as the spec's table gives them.
const TABLE: Array<[ErrorCode, number, boolean, string?]> = [
  ['invalid_body', 400, false],
  ['exec_tool_not_found', 404, false],
  ['tool_not_mcp_visible', 400, false],
  ['tool_executor_unavailable', 503, true],
  ['invocation_not_found', 404, false],
  ['invocation_terminal', 409, false],
  ['unavailable', 503, true],
  ['cancelled', 499, false],
  ['exec_idempotency_conflict', 409, false],
  ['approval_not_found', 404, false],
  ['approval_not_pending', 409, false],
  ['missing_workspace_id', 400, false],
  ['invalid_workspace_id', 400, false],
  ['workspace_not_found', 404, false],
  ['workspace_lookup_failed', 500, true],
  ['project_mismatch', 403, false],
  ['authentication_required', 401, false],
  ['retriever_failed', 502, true],
  ['payload_too_large', 413, false],
  ['model_capability_missing', 400, false],
  ['scope_insufficient', 403, false, 'authentication_error'],
  ['cross_project_access', 403, false],
  // "after top-up": not retryable as is.
  ['insufficient_quota', 402, false, 'insufficient_quota'],
  ['billing_delinquent', 402, false],
  ['rate_limit_exceeded', 429, true],
  ['capacity_exceeded', 429, true],
  ['endpoint_restricted', 403, false],
  ['already_terminal', 400, false],
  ['invalid_state', 409, false],
];

describe('execution-surface codes (spec table)', () => {
  for (const [code, status, retryable, type] of TABLE) {
    it(`${code}: ${status}, retryable ${retryable}`, () => {
      const spec = catalogue[code];
      assert.equal(spec.status, status);
      assert.equal(spec.retryable, retryable);
      if (type) assert.equal(spec.type, type);
    });
  }

  it('enrollment protocol codes are the contract’s refusal codes (none retryable)', () => {
    const codes: Array<Extract<EnrollResult, { ok: false }>['code']> = [
      'exec_manifest_invalid',
      'agent_name_in_use',
      'agent_name_conflict',
      'join_key_invalid',
    ];
    assert.equal(new Set(codes).size, 4);
  });
});
