/**
 * The per-request logger made on first use (src/runtime/logger.ts): the same lines
 * as a pino child, no child for a request that logs nothing, and the access log
 * line carries the request id over HTTP.
 */
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { createLogger, LazyRequestLogger, type Logger } from '../../src/runtime/logger.js';
import { seedProject, startTestServer, type TestServer } from '../support/harness.js';

function sinkLogger(level: string): { logger: Logger; lines: () => Record<string, unknown>[] } {
  const out: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      out.push(chunk.toString('utf8'));
      cb();
    },
  });
  const logger = createLogger(level, sink);
  return {
    logger,
    lines: () =>
      out
        .join('')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Record<string, unknown>),
  };
}

describe('LazyRequestLogger', () => {
  it('makes no child while nothing is written at an enabled level', () => {
    const { logger, lines } = sinkLogger('warn');
    let children = 0;
    const child = logger.child.bind(logger);
    logger.child = ((...a: Parameters<Logger['child']>) => {
      children++;
      return child(...a);
    }) as Logger['child'];
    const log = new LazyRequestLogger(logger, { request_id: 'r1' }, {});
    log.info({ a: 1 }, 'not written');
    log.debug('not written');
    assert.equal(children, 0);
    assert.equal(log.level, 'warn');
    assert.equal(log.isLevelEnabled('info'), false);
    assert.equal(log.isLevelEnabled('error'), true);
    log.error({ code: 'x' }, 'written');
    log.warn('again');
    assert.equal(children, 1, 'one child, made on the first written line');
    const got = lines();
    assert.equal(got.length, 2);
    assert.equal(got[0]!.request_id, 'r1');
    assert.equal(got[0]!.code, 'x');
    assert.equal(got[0]!.msg, 'written');
    assert.equal(got[1]!.request_id, 'r1');
  });

  it('honours a level given to the child and still redacts secrets', () => {
    const { logger, lines } = sinkLogger('info');
    const log = new LazyRequestLogger(logger, { request_id: 'r2' }, { level: 'error' });
    assert.equal(log.level, 'error');
    log.warn('dropped');
    log.error({ authorization: 'Bearer sk-secret', nested: { token: 't0ken' } }, 'kept');
    const got = lines();
    assert.equal(got.length, 1);
    assert.equal(got[0]!.authorization, '[REDACTED]');
    assert.deepEqual(got[0]!.nested, { token: '[REDACTED]' });
    log.level = 'warn';
    log.warn('now kept');
    assert.equal(lines().length, 2);
    assert.equal(log.child({ sub: 1 }).level, 'warn');
  });
});

describe('request logging over HTTP', () => {
  let s: TestServer;
  let a: Awaited<ReturnType<typeof seedProject>>;
  before(async () => {
    s = await startTestServer();
    a = await seedProject(s, { slug: 'logs' });
  });
  after(() => s.close());

  it('writes one access line per request with its request id', async () => {
    const r = await s.call('GET', `/${a.projectId}/v1/models`, { key: a.key });
    assert.equal(r.status, 200);
    const id = String(r.headers['x-request-id']);
    const mine = s.logs
      .join('')
      .split('\n')
      .filter((l) => l.includes(id))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.equal(mine.length, 1, mine.map((l) => l.msg).join(','));
    assert.equal(mine[0]!.msg, 'request');
    assert.equal(mine[0]!.request_id, id);
    assert.equal(mine[0]!.status, 200);
  });
});
