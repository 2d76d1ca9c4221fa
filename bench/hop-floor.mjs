#!/usr/bin/env node
/**
 * What one extra HTTP hop costs on this machine, with no gateway logic at all:
 * the open-loop client at a fixed rate against the `sim` worker directly, through
 * nginx (C, one worker process, keep-alive upstream) and through the Node floor
 * (bench/lib/floor-proxy.mjs), in alternating rounds. Both proxies are pinned to
 * CPU 0 as the router is in `npm run bench`; the sim and the client run on CPU 1.
 *
 * It answers one question: is "added p99 < 1 ms at 1,000 req/s" a target any
 * proxy meets on this machine, or below what the machine's loopback hop allows?
 *
 *   node bench/hop-floor.mjs [--rate=1000] [--rounds=3] [--seconds=10]
 *
 * Needs nginx on the PATH (Debian: apt-get install nginx-light) and taskset.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { fetch } from 'undici';
import { installCleanup, hasCommand, runProcess, startService, stopAll } from './lib/procs.mjs';
import { startFloor, startSim } from './lib/services.mjs';
import { CHAT_BODY } from './lib/setup.mjs';
import { freePort } from './lib/peer.mjs';

const ROUTER_CPU = 0;
const LOAD_CPU = 1;
const { values: opts } = parseArgs({
  options: {
    rate: { type: 'string', default: '1000' },
    rounds: { type: 'string', default: '3' },
    seconds: { type: 'string', default: '10' },
  },
  strict: true,
});
const RATE = Number(opts.rate);
const ROUNDS = Number(opts.rounds);
const SECONDS = Number(opts.seconds);

function log(msg) {
  process.stderr.write(`hop-floor: ${msg}\n`);
}

if (!hasCommand('nginx', ['-v'])) {
  log('nginx is not installed (Debian: apt-get install nginx-light)');
  process.exit(2);
}
installCleanup();

async function openLoop(url) {
  const { stdout } = await runProcess({
    cpu: LOAD_CPU,
    cmd: process.execPath,
    args: [
      fileURLToPath(new URL('./lib/open-loop.mjs', import.meta.url)),
      JSON.stringify({
        url,
        body: CHAT_BODY,
        rate: RATE,
        durationS: SECONDS,
        warmupS: 3,
        connections: 256,
        drainTimeoutS: 10,
      }),
    ],
    env: process.env,
    timeoutMs: (SECONDS + 45) * 1000,
  });
  return JSON.parse(stdout.trim().split('\n').pop());
}

async function startNginx(simUrl, dir) {
  const port = await freePort();
  const sim = new URL(simUrl);
  const conf = join(dir, 'nginx.conf');
  writeFileSync(
    conf,
    `worker_processes 1;
daemon off;
master_process off;
pid ${join(dir, 'nginx.pid')};
error_log ${join(dir, 'error.log')} warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir};
  proxy_temp_path ${dir};
  upstream sim { server ${sim.host}; keepalive 256; }
  server {
    listen 127.0.0.1:${port};
    keepalive_requests 1000000;
    location /v1/ {
      proxy_pass http://sim${sim.pathname.replace(/\/$/, '')}/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`,
  );
  await startService({
    name: 'nginx',
    cpu: ROUTER_CPU,
    // nginx prints nothing when it starts: the shell says it is about to, then the port is polled.
    cmd: 'sh',
    args: ['-c', 'echo starting; exec nginx -c "$0" -e "$1"', conf, join(dir, 'error.log')],
    env: process.env,
    ready: /starting/,
  });
  for (let i = 0; i < 100; i++) {
    try {
      await fetch(`http://127.0.0.1:${port}/v1/models`);
      return `http://127.0.0.1:${port}/v1/chat/completions`;
    } catch {
      await sleep(50);
    }
  }
  throw new Error('nginx did not start');
}

const dir = mkdtempSync(join(tmpdir(), 'swy-hop-'));
try {
  const sim = await startSim({ cpu: LOAD_CPU });
  const direct = `${sim.url}/chat/completions`;
  const nginx = await startNginx(sim.url, dir);
  const floor = await startFloor({ cpu: ROUTER_CPU, simUrl: sim.url });
  const targets = { direct, nginx, node: `${floor.url}/v1/chat/completions` };
  const rows = [];
  for (let round = 1; round <= ROUNDS; round++) {
    const r = {};
    for (const [name, url] of Object.entries(targets)) {
      const res = await openLoop(url);
      r[name] = res.latencyMs;
      log(
        `round ${round} ${name}: p50 ${res.latencyMs.p50} p99 ${res.latencyMs.p99} ms, errors ${res.errors}, incomplete ${res.incomplete}`,
      );
    }
    rows.push(r);
  }
  const f = (x) => x.toFixed(3);
  const sign = (x) => (x >= 0 ? '+' : '') + f(x);
  process.stdout.write(
    `\n${RATE} req/s, ${SECONDS} s per phase, open loop; latency from the scheduled send time (ms)\n\n`,
  );
  process.stdout.write(
    '| round | direct p50 / p99 | nginx added p50 / p99 | Node floor added p50 / p99 |\n| ---: | ---: | ---: | ---: |\n',
  );
  rows.forEach((r, i) => {
    process.stdout.write(
      `| ${i + 1} | ${f(r.direct.p50)} / ${f(r.direct.p99)} | ${sign(r.nginx.p50 - r.direct.p50)} / ${sign(r.nginx.p99 - r.direct.p99)} | ${sign(r.node.p50 - r.direct.p50)} / ${sign(r.node.p99 - r.direct.p99)} |\n`,
    );
  });
} finally {
  await stopAll();
  rmSync(dir, { recursive: true, force: true });
}
