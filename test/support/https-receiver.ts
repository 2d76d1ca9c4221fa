/**
 * A webhook receiver for tests: a local HTTPS server with a throwaway
 * self-signed certificate (made with openssl; it doubles as the extra CA the
 * router is told to trust), recording every request and answering as told.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { verifyWebhook } from '../../src/webhooks/signing.js';

export interface ReceivedRequest {
  headers: Record<string, string>;
  body: string;
  at: number;
}

/**
 * `ok-unfinished`: 200 and the first bytes of a body that never ends (the
 * receiver keeps the response open); `ok-reset`: 200 and part of the declared
 * body, then the connection is reset.
 */
export type Behaviour =
  | 'ok'
  | 'fail'
  | 'hang'
  | 'reset'
  | 'redirect'
  | 'ok-unfinished'
  | 'ok-reset'
  /** This status and exactly these body bytes. */
  | { status: number; body: Buffer };

export interface Receiver {
  url: string;
  port: number;
  caFile: string;
  received: ReceivedRequest[];
  /** Decides the answer to each request (default: 200); a promise delays the answer. */
  behaviour: (r: ReceivedRequest) => Behaviour | Promise<Behaviour>;
  close(): Promise<void>;
}

/** Every request received carries a valid signature of its body with `secret`. */
export function assertAllSigned(received: readonly ReceivedRequest[], secret: string): void {
  for (const r of received) {
    const v = verifyWebhook({
      secret,
      timestamp: r.headers['x-webhook-timestamp'],
      signature: r.headers['x-webhook-signature'],
      body: r.body,
    });
    assert.ok(v.ok, JSON.stringify(v));
  }
}

let certs: { key: string; cert: string; certFile: string } | undefined;

export function testCertificate(): { key: string; cert: string; certFile: string } {
  if (certs) return certs;
  const dir = mkdtempSync(join(tmpdir(), 'swy-cert-'));
  const key = join(dir, 'key.pem');
  const cert = join(dir, 'cert.pem');
  const r = spawnSync('openssl', [
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:prime256v1',
    '-nodes',
    '-keyout',
    key,
    '-out',
    cert,
    '-days',
    '2',
    '-subj',
    '/CN=127.0.0.1',
    '-addext',
    'subjectAltName=IP:127.0.0.1,DNS:localhost',
  ]);
  if (r.status !== 0) throw new Error(`openssl failed: ${String(r.stderr)}`);
  certs = { key: readFileSync(key, 'utf8'), cert: readFileSync(cert, 'utf8'), certFile: cert };
  return certs;
}

export async function startReceiver(): Promise<Receiver> {
  const { key, cert, certFile } = testCertificate();
  const rec: Receiver = {
    url: '',
    port: 0,
    caFile: certFile,
    received: [],
    behaviour: () => 'ok',
    close: async () => undefined,
  };
  const server: Server = createServer({ key, cert }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const r: ReceivedRequest = {
        headers: Object.fromEntries(
          Object.entries(req.headers).map(([k, v]) => [
            k,
            Array.isArray(v) ? v.join(',') : String(v),
          ]),
        ),
        body: Buffer.concat(chunks).toString('utf8'),
        at: Date.now(),
      };
      rec.received.push(r);
      void Promise.resolve(rec.behaviour(r)).then((b) => answer(b));
    });
    const answer = (b: Behaviour) => {
      // A delayed answer to a sender that went away meanwhile: nobody to answer.
      if (res.destroyed || req.socket.destroyed) return;
      if (typeof b === 'object') {
        res.writeHead(b.status, { 'content-type': 'text/plain; charset=utf-8' }).end(b.body);
        return;
      }
      switch (b) {
        case 'ok':
          res.writeHead(200, { 'content-type': 'text/plain' }).end('thanks');
          break;
        case 'fail':
          res.writeHead(500).end('receiver error');
          break;
        case 'redirect':
          res.writeHead(302, { location: 'https://127.0.0.1:1/elsewhere' }).end();
          break;
        case 'reset':
          req.socket.destroy();
          break;
        case 'hang':
          break;
        case 'ok-unfinished':
          res.writeHead(200, { 'content-type': 'text/plain' }).write('thanks');
          break;
        case 'ok-reset':
          res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '100' });
          res.write('thanks', () => req.socket.destroy());
          break;
      }
    };
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  rec.port = (server.address() as AddressInfo).port;
  rec.url = `https://127.0.0.1:${rec.port}/hook`;
  rec.close = () =>
    new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    });
  return rec;
}
