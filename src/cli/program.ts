// lbctl's command line: the commands and their flags; each command's work
// lives in commands/ (main.ts runs it).
import { Command, InvalidArgumentError } from 'commander';
import { parseDuration } from './config.js';
import type { AgentCommandOptions } from './commands/agent.js';
// Commands load their modules when they run: `lbctl bpf lb list` should not
// pay for the Kubernetes client or prom-client.
import {
  DEFAULT_API_SOCKET,
  DEFAULT_BPF_ROOT,
  DEFAULT_HEALTH_PORT,
  DEFAULT_METRICS_HOST,
  DEFAULT_METRICS_PORT,
  DEFAULT_NODE_SYNC_TIMEOUT_MS,
} from '../base/defaults.js';

function positiveInt(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError('expected a positive integer');
  return n;
}

function port(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0 || n > 65535) throw new InvalidArgumentError('expected a port (0-65535)');
  return n;
}

function nonNegativeInt(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError('expected an integer ≥ 0');
  return n;
}

function duration(v: string): number {
  return parseDuration(v);
}

function positiveDuration(v: string): number {
  const ms = parseDuration(v);
  if (ms < 1) throw new InvalidArgumentError('expected a duration of at least 1ms');
  return ms;
}

function logLevel(v: string): string {
  if (!['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'].includes(v)) throw new InvalidArgumentError('expected trace, debug, info, warn or error');
  return v;
}

function allFailedPolicy(v: string): string {
  if (v !== 'open' && v !== 'closed') throw new InvalidArgumentError('expected open or closed');
  return v;
}

function watchListMode(v: string): string {
  if (v !== 'off' && v !== 'auto' && v !== 'on') throw new InvalidArgumentError('expected off, auto or on');
  return v;
}

function tcAttach(v: string): string {
  if (v !== 'auto' && v !== 'tcx' && v !== 'clsact') throw new InvalidArgumentError('expected auto, tcx or clsact');
  return v;
}

function nodePortMode(v: string): string {
  if (v !== 'snat' && v !== 'dsr' && v !== 'hybrid') throw new InvalidArgumentError('expected snat, dsr or hybrid');
  return v;
}

function acceleration(v: string): string {
  if (v !== 'disabled' && v !== 'native' && v !== 'best-effort') throw new InvalidArgumentError('expected disabled, native or best-effort');
  return v;
}

function output(v: string): string {
  if (v !== 'json' && v !== 'text') throw new InvalidArgumentError('expected json or text');
  return v;
}

/**
 * The agent's options: the command line, then --config's file for what the
 * command line left at its default (src/cli/config.ts), then the defaults.
 */
export async function resolveAgentOptions(cmd: Command): Promise<AgentCommandOptions> {
  const opts = cmd.opts<AgentCommandOptions>();
  if (opts.config) (await import('./config.js')).applyConfigFile(cmd, opts.config);
  return cmd.opts<AgentCommandOptions>();
}

export function buildProgram(): Command {
  const program = new Command('lbctl')
    .description('eBPF service load balancer: a kube-proxy replacement')
    .showHelpAfterError();

  program
    .command('agent')
    .description('program the datapath from Services and EndpointSlices (a directory of manifests, or the cluster)')
    .option('--config <file>', 'read settings from this file (the ConfigMap\'s agent.yaml): keys are these flags in camelCase; flags on the command line override it (kube-proxy\'s --config)')
    .option('--source <spec>', 'file:DIR, a directory of Kubernetes manifests (standalone mode)')
    .option('--kubeconfig <file>', 'watch the cluster this kubeconfig names (default in a pod: in-cluster config)')
    .option('--master <url>', "the API server's URL, replacing the kubeconfig's or the in-cluster one: for nodes that bootstrap a cluster whose kubernetes Service is not served yet (kube-proxy's --master)")
    .option('--node-name <name>', 'this node, for internalTrafficPolicy Local and topology hints (default: $NODE_NAME or the hostname)')
    .option('--node-sync-timeout <duration>', "Kubernetes: how long the first sync waits for this node's Node once Services and EndpointSlices are listed, then goes on without its zone (0: no wait)", duration, DEFAULT_NODE_SYNC_TIMEOUT_MS)
    .option('--watch-list <off|auto|on>', "Kubernetes: stream the initial state with a watch-list (sendInitialEvents) instead of listing it: auto where the API server supports it, falling back to lists; on: only (a refusal is retried as an error)", watchListMode, 'off')
    .option('--disable-compression', "Kubernetes: ask the API server for uncompressed answers (client-go's DisableCompression; a kubeconfig's disable-compression: true does the same). Default: gzip, as client-go asks, which a server applies to lists over 128 KiB: less traffic, more CPU on both ends")
    .option('--cgroup <path>', 'cgroup v2 path to attach to (default: the cgroup v2 root, from /proc/mounts)')
    .option('--bpf-root <path>', 'bpffs directory for pinned maps and links', DEFAULT_BPF_ROOT)
    .option('--bpf-object <path>', 'the datapath object to load (default: the one built with lbctl); for upgrades and tests')
    .option('--tc-object <path>', 'the tc datapath object to load (default: the one built with lbctl); for upgrades and tests')
    .option('--max-services <n>', 'frontends per address family (map size)', positiveInt)
    .option('--max-backends <n>', 'backends per address family (map size)', positiveInt)
    .option('--max-sock-revnat <n>', 'sockets remembered for reverse translation (map size)', positiveInt)
    .option('--min-sync-period <duration>', 'changes within this interval coalesce into one sync (kube-proxy minSyncPeriod; 1s, 500ms; a bare number is ms)', duration, 0)
    .option('--sync-period <duration>', 'full resync (repairs drift) at least this often (kube-proxy syncPeriod; 30s; a bare number is ms)', positiveDuration, 30_000)
    .option('--health-port <port>', 'port of /livez, /readyz, /healthz (0: any free port)', port, DEFAULT_HEALTH_PORT)
    .option('--health-bind-address <addr>', 'address the health server listens on', '0.0.0.0')
    .option('--metrics-port <port>', 'port of /metrics (0: any free port)', port, DEFAULT_METRICS_PORT)
    .option('--metrics-bind-address <addr>', 'address the metrics server listens on', DEFAULT_METRICS_HOST)
    .option('--api-socket <path>', 'unix socket of the local API (lbctl status, lbctl service list)', DEFAULT_API_SOCKET)
    .option('--log-level <level>', 'trace, debug, info, warn or error', logLevel, 'info')
    .option('--procfs <path>', "where the host's /proc/sys/net is reachable as <path>/sys/net (in a pod: /host/proc, a hostPath mount; the container's own is read-only)", '/proc')
    .option('--no-nodeport', 'do not serve NodePorts, LoadBalancer and external IPs at tc (the socket programs only)')
    .option('--devices <list>', 'devices the tc datapath attaches to, comma-separated (default: detected: up, a global address, not a veth (unless it carries the default route), bridge port or tunnel)')
    .option('--tc-attach <auto|tcx|clsact>', 'how the tc programs attach to the devices: tcx links (Linux 6.6+) or clsact filters; auto: tcx where the kernel has it', tcAttach, 'auto')
    .option('--nodeport-mode <snat|dsr|hybrid>', "how flows to a backend on another node go: snat (replies come back through this node), dsr (direct server return: the backend's node answers the client from the frontend; every node must run it), hybrid (dsr for TCP, snat for UDP)", nodePortMode, 'snat')
    .option('--nodeport-acceleration <disabled|native|best-effort>', "run the NodePort/LoadBalancer/external IP ingress at XDP too, in the driver, on the maps tc uses (what XDP cannot finish goes on to tc): native (a device whose driver refuses native XDP is a problem, served at tc), best-effort (such a device is served at tc quietly), disabled", acceleration, 'disabled')
    .option('--nodeport-addresses <cidrs>', "serve NodePorts only on node addresses inside these CIDRs (kube-proxy's --nodeport-addresses)")
    .option('--nodeport-range <first-last>', 'the NodePort range (reserved in ip_local_reserved_ports)', '30000-32767')
    .option('--snat-port-range <first-last>', "source ports of SNATed flows to remote backends (a client's own port kept when free; the node's own flows in it are tracked); not overlapping the NodePort range (default: from above the NodePort range to 65535)")
    .option('--maglev-table-size <m>', 'entries of each Maglev table (a prime; 64 KiB per north-south frontend at the default)', positiveInt, 16381)
    .option('--maglev-hash-seed <seed>', 'Maglev hash seed, 16 base64 characters; the same on every node', 'JLfvgnHc2kaSUFaI')
    .option('--health-mesh-port <port>', "port of this node's /hello for the health mesh, and the port probed on every other node (0: no mesh)", port, 4240)
    .option('--health-mesh-period <duration>', 'how often each node address is probed (default: max(10s, probes per round / 166 per second): 10 s up to 830 nodes, about 60 s at 5,000)', positiveDuration)
    .option('--health-mesh-timeout <duration>', 'how long one ICMP or HTTP probe waits', positiveDuration, 1000)
    .option('--health-mesh-peer-metrics <n>', 'peers (the first by name) with RTT series of their own in /metrics; every peer counts in the aggregate histograms', nonNegativeInt, 16)
    .option('--probe-all-failed <open|closed>', "standalone mode: when a service's readiness probe (lbctl.io/readiness-probe) quarantines every backend, keep serving them all (open) or refuse new connections (closed)", allFailedPolicy, 'open')
    .option('--external-clusterip', 'serve ClusterIPs to packets from outside the node too (default: only the node and its pods reach them)')
    .option('--ct-max <n>', 'NodePort flows tracked at tc per address family (map size; LRU)', positiveInt, 262144)
    .option('--nat-max <n>', 'SNAT translations of flows to remote backends per address family (map size; LRU)', positiveInt, 131072)
    .option('--conntrack-tcp-timeout-established <duration>', 'idle timeout of an established TCP flow at tc (kube-proxy\'s flag; 6h, 90m)', positiveDuration, 21600_000)
    .option('--conntrack-tcp-timeout-close-wait <duration>', 'how long a TCP flow lives once one side has closed it, until the other side closes too (kube-proxy\'s flag)', positiveDuration, 3600_000)
    .option('--conntrack-udp-timeout <duration>', 'idle timeout of a UDP flow at tc (kube-proxy\'s flag)', positiveDuration, 60_000)
    .action(async (_opts, cmd: Command) => (await import('./commands/agent.js')).agentCommand(await resolveAgentOptions(cmd)));

  const bpf = program.command('bpf').description('inspect the datapath maps directly');
  const listCommand = (parent: Command, what: string, description: string): Command =>
    parent
      .command(what)
      .description(`${what} maps`)
      .command('list')
      .description(description)
      .option('--bpf-root <path>', 'bpffs directory of the pinned maps', DEFAULT_BPF_ROOT)
      .option('-o, --output <format>', 'text or json', output, 'text');
  listCommand(bpf, 'lb', 'list frontends and their backends')
    .option('--maglev', "each north-south frontend's Maglev table: its backends' shares")
    .action(async (opts) => (await import('./commands/lb-list.js')).lbListCommand(opts));
  listCommand(bpf, 'metrics', 'list the per-CPU datapath counters, summed').action(async (opts) => (await import('./commands/metrics-list.js')).metricsListCommand(opts));
  listCommand(bpf, 'ct', "list the tc datapath's tracked flows (both directions)").action(async (opts) => (await import('./commands/ct-list.js')).ctListCommand(opts));
  listCommand(bpf, 'nat', "list the tc datapath's SNAT translations").action(async (opts) => (await import('./commands/ct-list.js')).natListCommand(opts));

  program
    .command('cleanup')
    .description("detach every lbctl program and remove every pinned map; with --kube-proxy, remove kube-proxy's rules instead (docs/cleanup.md)")
    .option('--bpf-root <path>', 'bpffs directory of the pinned objects', DEFAULT_BPF_ROOT)
    .option('--kube-proxy', "only remove kube-proxy's iptables chains (legacy and nft, IPv4 and IPv6) and its nftables tables; lbctl's datapath is left alone")
    .action(async (opts: { bpfRoot: string; kubeProxy?: boolean }) => {
      if (opts.kubeProxy) return (await import('./commands/cleanup.js')).cleanupKubeProxyCommand();
      const { cleanupDatapath } = await import('../datapath/loader.js');
      const r = cleanupDatapath(opts.bpfRoot);
      process.stdout.write(`removed ${r.links.length} links and ${r.maps.length} maps from ${opts.bpfRoot}${r.tc.length > 0 ? `; tc attachments: ${r.tc.join(', ')}` : ''}\n`);
    });

  program
    .command('status')
    .description("the agent's health: liveness and readiness checks, syncs, counts")
    .option('--brief', 'print OK or the failing checks, one per line')
    .option('--api-socket <path>', "the agent's API socket", DEFAULT_API_SOCKET)
    .action(async (opts: { brief?: boolean; apiSocket: string }) => (await import('./commands/status.js')).statusCommand(opts));

  program
    .command('health')
    .description('the node health mesh: every node probed by ICMP and HTTP from this one')
    .command('status')
    .description("per node and address: ICMP to the node's stack and HTTP to its agent, with RTTs (cilium-health status); exits 1 when a node is unreachable")
    .option('-o, --output <format>', 'text or json', output, 'text')
    .option('--verbose', 'every node, with the errors in full and the last probe times')
    .option('--brief', 'only the summary and the unreachable nodes')
    .option('--api-socket <path>', "the agent's API socket", DEFAULT_API_SOCKET)
    .action(async (opts: { output: string; verbose?: boolean; brief?: boolean; apiSocket: string }) => (await import('./commands/health.js')).healthStatusCommand(opts));

  program
    .command('service')
    .description('services as the agent sees them')
    .command('list')
    .description('desired versus realized backends per frontend; flags drift')
    .option('-o, --output <format>', 'text or json', output, 'text')
    .option('--api-socket <path>', "the agent's API socket", DEFAULT_API_SOCKET)
    .action(async (opts: { output: string; apiSocket: string }) => (await import('./commands/service-list.js')).serviceListCommand(opts));

  program
    .command('version')
    .description("this lbctl's versions (node, V8, libbpf, kernel, commit, BPF objects' build ids) beside the running agent's")
    .option('-o, --output <format>', 'text or json', output, 'text')
    .option('--client', 'only this lbctl\'s: do not ask the agent')
    .option('--api-socket <path>', "the agent's API socket", DEFAULT_API_SOCKET)
    .action(async (opts: { output: string; client?: boolean; apiSocket: string }) => (await import('./commands/version.js')).versionCommand(opts));
  return program;
}

