/**
 * Max throughput with wrk (closed loop: each connection sends its next request
 * as soon as the previous answer arrives). The POST body and the Authorization
 * header come from bench/wrk/post.lua through the environment.
 */
import { fileURLToPath } from 'node:url';
import { runProcess, hasCommand } from './procs.mjs';

const SCRIPT = fileURLToPath(new URL('../wrk/post.lua', import.meta.url));

export const WRK_MISSING = `wrk is not installed. On Debian/Ubuntu:
  sudo apt-get install wrk
(or build it from its source repository, wg/wrk on GitHub)`;

export function checkWrk() {
  if (!hasCommand('wrk', ['-v'])) throw new Error(WRK_MISSING);
}

function ms(value, unit) {
  const v = Number(value);
  return unit === 'us' ? v / 1000 : unit === 's' ? v * 1000 : unit === 'm' ? v * 60_000 : v;
}

/** Parses wrk's text report (with --latency). */
export function parseWrk(text) {
  const num = (re) => {
    const m = re.exec(text);
    return m ? Number(m[1]) : 0;
  };
  const latency = {};
  for (const m of text.matchAll(/^\s+(50|75|90|99)%\s+([\d.]+)(us|ms|s|m)\s*$/gm)) {
    latency[`p${m[1]}`] = Math.round(ms(m[2], m[3]) * 1000) / 1000;
  }
  const sock = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(text);
  return {
    requestsPerSec: Math.round(num(/Requests\/sec:\s+([\d.]+)/)),
    requests: num(/(\d+) requests in/),
    non2xx: num(/Non-2xx or 3xx responses: (\d+)/),
    socketErrors: sock ? sock.slice(1).reduce((a, b) => a + Number(b), 0) : 0,
    latencyMs: latency,
  };
}

/** Runs wrk pinned to `cpu` against `url` for `durationS` seconds. */
export async function runWrk({
  cpu,
  url,
  body,
  authorization,
  headers = {},
  connections,
  durationS,
  threads = 1,
}) {
  const { stdout } = await runProcess({
    cpu,
    cmd: 'wrk',
    args: [
      `-t${threads}`,
      `-c${connections}`,
      `-d${durationS}s`,
      '--timeout',
      '5s',
      '--latency',
      '-s',
      SCRIPT,
      url,
    ],
    env: {
      ...process.env,
      BENCH_BODY: body,
      BENCH_AUTHORIZATION: authorization ?? '',
      // Any other request headers except the two set above.
      BENCH_HEADERS: Object.entries(headers)
        .filter(([k]) => !['authorization', 'content-type'].includes(k.toLowerCase()))
        .map(([k, v]) => `${k}: ${v}`)
        .join('\n'),
    },
    timeoutMs: (durationS + 15) * 1000,
  });
  return { ...parseWrk(stdout), connections, durationS, threads };
}
