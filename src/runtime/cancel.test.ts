import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Cancellation } from './cancel.js';

describe('Cancellation', () => {
  it('calls each listener once on the first abort, with an AbortError reason', () => {
    const c = new Cancellation();
    const calls: string[] = [];
    const a = () => calls.push('a');
    const b = () => calls.push('b');
    c.signal.addEventListener('abort', a);
    c.addEventListener('abort', b);
    c.removeEventListener('abort', a);
    assert.equal(c.aborted, false);
    c.abort();
    c.abort();
    assert.deepEqual(calls, ['b']);
    assert.equal(c.aborted, true);
    assert.equal((c.reason as Error).name, 'AbortError');
    c.addEventListener('abort', a); // after the abort: never called, as with AbortSignal
    c.abort();
    assert.deepEqual(calls, ['b']);
  });

  it('keeps a reason given to abort', () => {
    const c = new Cancellation();
    const why = new Error('deadline');
    c.abort(why);
    assert.equal(c.reason, why);
  });
});
