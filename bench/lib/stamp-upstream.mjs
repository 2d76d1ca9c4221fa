/**
 * An OpenAI-compatible upstream for bench/tail.mjs that stamps every chat
 * completion on the machine's monotonic clock (process.hrtime, CLOCK_MONOTONIC,
 * the same in every process): when its body had arrived and when the answer was
 * written, keyed by the request's `seed` (the client numbers its requests there;
 * the router forwards it). It answers like the sim with zero delays: 16 tokens.
 *
 * CLI: node bench/lib/stamp-upstream.mjs → prints `stamp upstream on http://127.0.0.1:<port>/v1`.
 * GET /stamps returns [[seed, arrivedNs, answeredNs], …] as JSON and clears them.
 */
import { Buffer } from 'node:buffer';
import { createServer } from 'node:http';

const now = () => process.hrtime.bigint();
let stamps = [];

const MODELS = JSON.stringify({
  object: 'list',
  data: [{ id: 'bench-sim', object: 'model', created: 0, owned_by: 'bench' }],
});

function completion(model) {
  return JSON.stringify({
    id: 'chatcmpl-stamp',
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model,
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: 'Hello there, this is a short sentence of text.' },
        finish_reason: 'length',
        logprobs: null,
      },
    ],
    usage: {
      prompt_tokens: 12,
      completion_tokens: 16,
      total_tokens: 28,
      prompt_tokens_details: { cached_tokens: 0 },
    },
    system_fingerprint: null,
  });
}

const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const arrived = now();
    if (req.method === 'GET' && req.url === '/v1/models') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(MODELS);
      return;
    }
    if (req.method === 'GET' && req.url === '/stamps') {
      const out = JSON.stringify(stamps.map(([s, a, b]) => [s, String(a), String(b)]));
      stamps = [];
      res.writeHead(200, { 'content-type': 'application/json' }).end(out);
      return;
    }
    if (req.method === 'POST' && req.url === '/v1/chat/completions') {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      res.writeHead(200, { 'content-type': 'application/json' }).end(completion(body.model));
      if (body.seed >= 0) stamps.push([body.seed, arrived, now()]);
      return;
    }
    res.writeHead(404).end();
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`stamp upstream on http://127.0.0.1:${server.address().port}/v1\n`);
});
process.on('SIGTERM', () => process.exit(0));
