// lbctl's command line: a dispatcher only; each command lives in commands/.
import { Command, InvalidArgumentError } from 'commander';
import { LbError } from '../errors.js';
import { DEFAULT_BPF_ROOT, cleanupDatapath } from '../datapath/loader.js';
import { libbpfVersion } from '../native/bpf.js';
import { agentCommand } from './commands/agent.js';
import { lbListCommand } from './commands/lb-list.js';
import { metricsListCommand } from './commands/metrics-list.js';

function positiveInt(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError('expected a positive integer');
  return n;
}

function output(v: string): string {
  if (v !== 'json' && v !== 'text') throw new InvalidArgumentError('expected json or text');
  return v;
}

export function buildProgram(): Command {
  const program = new Command('lbctl')
    .description('eBPF service load balancer: a kube-proxy replacement')
    .showHelpAfterError();

  program
    .command('agent')
    .description('program the datapath from a source of Services and EndpointSlices')
    .requiredOption('--source <spec>', 'where Services and EndpointSlices come from: file:DIR')
    .option('--cgroup <path>', 'cgroup v2 path to attach to (default: the cgroup v2 root, from /proc/mounts)')
    .option('--bpf-root <path>', 'bpffs directory for pinned maps and links', DEFAULT_BPF_ROOT)
    .option('--max-services <n>', 'frontends per address family (map size)', positiveInt)
    .option('--max-backends <n>', 'backends per address family (map size)', positiveInt)
    .option('--max-sock-revnat <n>', 'sockets remembered for reverse translation (map size)', positiveInt)
    .option('--log-level <level>', 'trace, debug, info, warn or error', 'info')
    .action(async (opts) => agentCommand(opts));

  const bpf = program.command('bpf').description('inspect the datapath maps directly');
  const listCommand = (parent: Command, what: string, description: string): Command =>
    parent
      .command(what)
      .description(`${what} maps`)
      .command('list')
      .description(description)
      .option('--bpf-root <path>', 'bpffs directory of the pinned maps', DEFAULT_BPF_ROOT)
      .option('-o, --output <format>', 'text or json', output, 'text');
  listCommand(bpf, 'lb', 'list frontends and their backends').action((opts) => lbListCommand(opts));
  listCommand(bpf, 'metrics', 'list the per-CPU datapath counters, summed').action((opts) => metricsListCommand(opts));

  program
    .command('cleanup')
    .description('detach every lbctl program and remove every pinned map')
    .option('--bpf-root <path>', 'bpffs directory of the pinned objects', DEFAULT_BPF_ROOT)
    .action((opts: { bpfRoot: string }) => {
      const r = cleanupDatapath(opts.bpfRoot);
      process.stdout.write(`removed ${r.links.length} links and ${r.maps.length} maps from ${opts.bpfRoot}\n`);
    });

  program
    .command('version')
    .description('print versions')
    .action(() => {
      process.stdout.write(`lbctl 0.1.0 (libbpf ${libbpfVersion()}, node ${process.version})\n`);
    });
  return program;
}

export async function main(argv: string[]): Promise<number> {
  try {
    await buildProgram().parseAsync(argv);
    return 0;
  } catch (err) {
    const msg = err instanceof LbError ? `${err.message}` : err instanceof Error ? (err.stack ?? err.message) : String(err);
    process.stderr.write(`lbctl: ${msg}\n`);
    return 1;
  }
}

process.exitCode = await main(process.argv);
