/**
 * The worker's drain: `InFlight` counts a real HTTP server's open requests until
 * their responses close, and `waitForDrain` ends when none is left, at the deadline
 * (on a fake clock, to the millisecond), or on a second signal.
 */
import assert from 'node:assert/strict';
import { createServer, request, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { FakeClock } from '../runtime/clock.js';
import { InFlight, waitForDrain, type DrainOutcome } from './drain.js';

describe('worker drain', () => {
  let server: Server;
  let url: string;
  const inFlight = new InFlight();
  /** Responses the server holds open until the test ends them. */
  const held: ServerResponse[] = [];

  before(async () => {
    server = createServer((req, res) => {
      if (req.url === '/hold') {
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.write('started\n');
        held.push(res);
      } else res.end('ok');
    });
    inFlight.track(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  /** Starts a request; resolves once its first bytes arrived, with its end. */
  const open = (path: string) =>
    new Promise<{ ended: Promise<string> }>((resolve, reject) => {
      const req = request(`${url}${path}`, (res) => {
        let body = '';
        const ended = new Promise<string>((done) => {
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => done(body));
          res.on('error', () => done(body));
        });
        res.once('data', () => resolve({ ended }));
      });
      req.on('error', reject);
      req.end();
    });

  /** Lets pending promise callbacks run. */
  const settle = () => new Promise((r) => setImmediate(r));

  it('counts a request from its arrival until its response closes', async () => {
    assert.equal(inFlight.count, 0);
    const r = await open('/hold');
    assert.equal(inFlight.count, 1);
    held.shift()!.end('done\n');
    assert.equal(await r.ended, 'started\ndone\n');
    await settle();
    assert.equal(inFlight.count, 0);
    const quick = await open('/quick');
    await quick.ended;
    await settle();
    assert.equal(inFlight.count, 0);
  });

  it('ends when the last open request finishes, before the deadline', async () => {
    const clock = new FakeClock();
    const r1 = await open('/hold');
    const r2 = await open('/hold');
    let outcome: DrainOutcome | undefined;
    void waitForDrain({ inFlight, clock, deadlineMs: 30_000 }).then((o) => (outcome = o));
    clock.advance(10_000);
    held.shift()!.end();
    await r1.ended;
    await settle();
    assert.equal(outcome, undefined, 'one request is still open');
    held.shift()!.end();
    await r2.ended;
    await settle();
    assert.equal(outcome, 'idle');
  });

  it('ends at the deadline, not a millisecond before, with the request still open', async () => {
    const clock = new FakeClock();
    const r = await open('/hold');
    let outcome: DrainOutcome | undefined;
    void waitForDrain({ inFlight, clock, deadlineMs: 5000 }).then((o) => (outcome = o));
    clock.advance(4999);
    await settle();
    assert.equal(outcome, undefined);
    clock.advance(1);
    await settle();
    assert.equal(outcome, 'deadline');
    assert.equal(inFlight.count, 1);
    held.shift()!.end();
    await r.ended;
  });

  it('a second signal cuts the wait short; with nothing open it ends at once', async () => {
    const clock = new FakeClock();
    const r = await open('/hold');
    let interrupt!: () => void;
    const interrupted = new Promise<void>((res) => (interrupt = res));
    let outcome: DrainOutcome | undefined;
    void waitForDrain({ inFlight, clock, deadlineMs: 5000, interrupt: interrupted }).then(
      (o) => (outcome = o),
    );
    await settle();
    assert.equal(outcome, undefined);
    interrupt();
    await settle();
    assert.equal(outcome, 'interrupted');
    held.shift()!.end();
    await r.ended;
    await settle();
    assert.equal(
      await waitForDrain({ inFlight, clock: new FakeClock(), deadlineMs: 5000 }),
      'idle',
    );
  });
});
