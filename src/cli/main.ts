/**
 * The `switchyard` binary: `serve` (the router), `worker` (an inference worker),
 * `agent` (an execution agent) and `admin` (the operator/management CLI).
 */
const USAGE = `usage: switchyard <command> [options]

commands:
  serve     run the router (inference API, management and operator APIs)
  worker    run an inference worker (--engine sim|llama --port N)
  agent     run an execution agent
  admin     operator and management CLI (switchyard admin --help)
`;

export async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case 'serve': {
      const { serve } = await import('./serve.js');
      return serve(rest);
    }
    case 'worker': {
      const { worker } = await import('./worker.js');
      return worker(rest);
    }
    case 'agent': {
      const { agent } = await import('./agent.js');
      return agent(rest);
    }
    case 'admin': {
      const { admin } = await import('./admin.js');
      return admin(rest);
    }
    case undefined:
    case '-h':
    case '--help':
    case 'help':
      process.stdout.write(USAGE);
      return cmd === undefined ? 2 : 0;
    default:
      process.stderr.write(`switchyard: unknown command '${cmd}'\n\n${USAGE}`);
      return 2;
  }
}
