// `lbctl agent`: runs until SIGTERM/SIGINT; the datapath outlives it.
import os from 'node:os';
import path from 'node:path';
import v8 from 'node:v8';
import { pino, type Logger } from 'pino';
import { Agent } from '../../agent/agent.js';
import { MeshAgent } from '../../mesh/mesh-agent.js';
import type { Node } from '../../model/k8s.js';
import { startApiServer } from '../../http/api.js';
import { Health, startHealthServer } from '../../http/health.js';
import { AgentMetrics, startMetricsServer } from '../../http/metrics.js';
import { ConfigError } from '../../base/errors.js';
import { cgroup2Root } from '../../datapath/loader.js';
import { FileSource } from '../../sources/file.js';
import { defaultExecutors } from '../../probes/probe-exec.js';
import { GrpcJsHealthClient } from '../../probes/grpc-health.js';
import type { Problem, Source } from '../../sources/source.js';

import { DEFAULT_HEALTH_PORT, DEFAULT_METRICS_PORT, PROBE_CONCURRENCY, VERSION } from '../../base/defaults.js';
import { parseCidrs } from '../../datapath/devices.js';
import { DEFAULT_CONNTRACK, DEFAULT_SNAT_RETRIES, type PortRange } from '../../datapath/nodeport.js';
import type { NodePortOptions } from '../../agent/nodeport.js';
import { checkDisjoint, parsePortRange } from '../flags.js';
import { checkTableSize, DEFAULT_MAGLEV_SEED, DEFAULT_MAGLEV_TABLE_SIZE, parseMaglevSeed } from '../../lb/maglev.js';
import { libbpfVersion } from '../../native/bpf.js';
import { collectVersions } from '../../base/version.js';
import { runtimeObjects } from './version.js';

export interface AgentCommandOptions {
  /** Applied by the CLI before this runs (src/cli/config.ts). */
  config?: string;
  source?: string;
  kubeconfig?: string;
  master?: string;
  /** Where the host's /proc is mounted (its sys/net is written: ip_local_reserved_ports). */
  procfs?: string;
  nodeName?: string;
  /** Kubernetes source: how long the first sync waits for this node's Node (ms). */
  nodeSyncTimeout?: number;
  /** Kubernetes source: lists, or watch-lists where the server supports them (auto), or only watch-lists (on). */
  watchList?: 'off' | 'auto' | 'on';
  /** Kubernetes source: ask for answers uncompressed. */
  disableCompression?: boolean;
  cgroup?: string;
  bpfRoot: string;
  /** A datapath object other than the built one (an upgrade, a test). */
  bpfObject?: string;
  /** A tc datapath object other than the built one (an upgrade, a test). */
  tcObject?: string;
  maxServices?: number;
  maxBackends?: number;
  maxSockRevnat?: number;
  minSyncPeriod: number;
  syncPeriod: number;
  healthPort: number;
  healthBindAddress: string;
  metricsPort: number;
  metricsBindAddress: string;
  apiSocket: string;
  logLevel: string;
  /** --no-nodeport sets false. */
  nodeport?: boolean;
  devices?: string;
  /** How the tc programs attach: auto (tcx where the kernel has it), tcx or clsact. */
  tcAttach?: 'auto' | 'tcx' | 'clsact';
  nodeportMode?: 'snat' | 'dsr' | 'hybrid';
  /** --nodeport-acceleration: the ingress path at XDP too (native: a device that refuses it is a problem; best-effort: served at tc). */
  nodeportAcceleration?: 'disabled' | 'native' | 'best-effort';
  nodeportAddresses?: string;
  nodeportRange?: string;
  snatPortRange?: string;
  externalClusterip?: boolean;
  maglevTableSize?: number;
  maglevHashSeed?: string;
  ctMax?: number;
  natMax?: number;
  /** Milliseconds, as the duration flags parse. */
  conntrackTcpTimeoutEstablished?: number;
  conntrackTcpTimeoutCloseWait?: number;
  conntrackUdpTimeout?: number;
  healthMeshPort?: number;
  healthMeshPeriod?: number;
  healthMeshTimeout?: number;
  healthMeshPeerMetrics?: number;
  /** Standalone mode: what a service whose backends all fail their readiness probe does. */
  probeAllFailed?: 'open' | 'closed';
}

/**
 * The default --snat-port-range: from above the NodePort range to 65535
 * (32768-65535 with the default NodePort range: Cilium's), which holds the
 * ephemeral ports Linux clients connect from (32768-60999), so that a
 * client's own port is kept when it is free, as conntrack keeps it. The
 * node's own flows in the range are tracked by the datapath (LB_CT_F_HOST),
 * never given to a SNATed flow.
 */
export function defaultSnatRange(nodePortRange: PortRange): PortRange {
  const first = Math.max(nodePortRange.last + 1, 1024);
  if (65535 - first + 1 < 1024) {
    throw new ConfigError(`--nodeport-range ${nodePortRange.first}-${nodePortRange.last} leaves fewer than 1024 ports above it for SNAT: give --snat-port-range`);
  }
  return { first, last: 65535 };
}

/** The tc datapath's options from the flags; a bad value refuses the start, naming the flag. */
export function nodePortOptions(opts: AgentCommandOptions): NodePortOptions | undefined {
  if (opts.nodeport === false) return undefined;
  const nodePortRange = parsePortRange('--nodeport-range', opts.nodeportRange ?? '30000-32767');
  const snatRange = opts.snatPortRange ? parsePortRange('--snat-port-range', opts.snatPortRange) : defaultSnatRange(nodePortRange);
  checkDisjoint({ flag: '--snat-port-range', range: snatRange }, { flag: '--nodeport-range', range: nodePortRange });
  const devices = opts.devices?.split(',').map((d) => d.trim()).filter(Boolean);
  if (opts.devices !== undefined && devices!.length === 0) throw new ConfigError('--devices: no device named (use --no-nodeport to serve no device)');
  const m = checkTableSize(opts.maglevTableSize ?? DEFAULT_MAGLEV_TABLE_SIZE);
  const seeds = parseMaglevSeed(opts.maglevHashSeed ?? DEFAULT_MAGLEV_SEED);
  return {
    settings: {
      nodePortRange,
      snatRange,
      snatRetries: DEFAULT_SNAT_RETRIES,
      externalClusterIP: opts.externalClusterip === true,
      mode: opts.nodeportMode ?? 'snat',
      maglev: { m, seed4: seeds.flow4, seed6: seeds.flow6 },
      conntrack: {
        tcpEstablished: timeoutSeconds('--conntrack-tcp-timeout-established', opts.conntrackTcpTimeoutEstablished, DEFAULT_CONNTRACK.tcpEstablished),
        tcpCloseWait: timeoutSeconds('--conntrack-tcp-timeout-close-wait', opts.conntrackTcpTimeoutCloseWait, DEFAULT_CONNTRACK.tcpCloseWait),
        udp: timeoutSeconds('--conntrack-udp-timeout', opts.conntrackUdpTimeout, DEFAULT_CONNTRACK.udp),
      },
    },
    sizes: { ...(opts.ctMax !== undefined ? { ct: opts.ctMax } : {}), ...(opts.natMax !== undefined ? { nat: opts.natMax } : {}) },
    ...(opts.tcObject ? { object: path.resolve(opts.tcObject) } : {}),
    ...tcAttachFailpoint(process.env),
    maglevTableSeed: seeds.table,
    procfs: opts.procfs ?? '/proc',
    tcAttach: opts.tcAttach ?? 'auto',
    acceleration: opts.nodeportAcceleration ?? 'disabled',
    ...(devices ? { devices } : {}),
    ...(opts.nodeportAddresses ? { addressCidrs: parseCidrs('--nodeport-addresses', opts.nodeportAddresses) } : {}),
  };
}

/**
 * LBCTL_FAILPOINT_TC_ATTACH=N[:R], for tests: the N-th attach of each of the
 * tc datapath's first R switch rounds (default: every round) is refused by
 * the kernel, to prove a switch rolls back whole and is retried. Not a flag:
 * no user wants it.
 */
export function tcAttachFailpoint(env: NodeJS.ProcessEnv): { failAttach?: { at: number; rounds: number } } {
  const v = env.LBCTL_FAILPOINT_TC_ATTACH;
  if (v === undefined || v === '') return {};
  const m = /^([1-9]\d*)(?::([1-9]\d*))?$/.exec(v);
  if (!m) throw new ConfigError(`LBCTL_FAILPOINT_TC_ATTACH=${v}: not N or N:R (positive integers)`);
  return { failAttach: { at: Number(m[1]), rounds: m[2] ? Number(m[2]) : Number.MAX_SAFE_INTEGER } };
}

/** A conntrack timeout flag (ms) in whole seconds, as the datapath's clock counts: at least 1 s, at most 2^32-1 s. */
function timeoutSeconds(flag: string, ms: number | undefined, fallback: number): number {
  if (ms === undefined) return fallback;
  const s = Math.ceil(ms / 1000);
  if (!Number.isFinite(s) || s < 1 || s > 0xffffffff) throw new ConfigError(`${flag}: ${ms} ms is not a timeout of 1s to 136 years`);
  return s;
}

async function makeSource(opts: AgentCommandOptions, nodeName: string, log: pino.Logger, metrics: AgentMetrics): Promise<Source> {
  const onProblem = (p: Problem): void => {
    // Fixed label values (the category): the reason text goes to the log, not into metric cardinality.
    metrics.skipped(p.kind ?? 'File', p.category, p.count ?? 1);
    log.warn({ where: p.where, ...(p.object ? { object: p.object } : {}), category: p.category, ...(p.count !== undefined ? { count: p.count } : {}), reason: p.reason }, 'bad input skipped');
  };
  const file = opts.source ? /^file:(.+)$/.exec(opts.source) : null;
  if (opts.source && !file) throw new ConfigError(`--source ${opts.source}: expected file:DIR (or use --kubeconfig)`);
  if (file) {
    if (opts.kubeconfig || opts.master) throw new ConfigError(`--source file:DIR and ${opts.kubeconfig ? '--kubeconfig' : '--master'} exclude each other`);
    return new FileSource({ dir: path.resolve(file[1]!), onProblem });
  }
  if (!opts.kubeconfig && !opts.master && !process.env.KUBERNETES_SERVICE_HOST) {
    throw new ConfigError('no source: give --source file:DIR, --kubeconfig FILE or --master URL, or run in a pod (in-cluster config)');
  }
  // Loaded only for this source: the client is large.
  const { KubernetesSource } = await import('../../sources/kubernetes.js');
  return new KubernetesSource({
    ...(opts.kubeconfig ? { kubeconfig: opts.kubeconfig } : {}),
    ...(opts.master ? { master: opts.master } : {}),
    nodeName,
    // The health mesh probes every node: watch them all, not only this one.
    allNodes: (opts.healthMeshPort ?? 0) !== 0,
    ...(opts.nodeSyncTimeout !== undefined ? { nodeSyncTimeoutMs: opts.nodeSyncTimeout } : {}),
    ...(opts.watchList !== undefined ? { watchList: opts.watchList } : {}),
    ...(opts.disableCompression ? { disableCompression: true } : {}),
    onProblem,
    onWatchError: (kind, err, retryInMs) => log.warn({ kind, err: (err as Error)?.message ?? String(err), retryInMs }, 'list or watch failed; retrying after backoff'),
    onWatchListRefused: (kind, reason) =>
      log.info({ kind, reason }, 'the API server does not stream lists (watch-list, sendInitialEvents): listing instead from now on (--watch-list auto)'),
    onNodeMissing: (reason) =>
      log.warn({ node: nodeName, reason }, "going on without this node's Node: its zone is unknown, so zone hints are ignored until it arrives"),
    onNodeArrived: (node) => log.info({ node: node.name, zone: node.zone ?? null }, "this node's Node arrived: services are recomputed with its zone"),
  });
}

/**
 * Who holds these ports on a node lbctl is brought to: kube-proxy's healthz
 * and metrics ports while it still runs during a migration, and the port of
 * Cilium's health checks.
 */
const LIKELY_HOLDERS: ReadonlyMap<number, string> = new Map([
  [DEFAULT_HEALTH_PORT, 'kube-proxy'],
  [DEFAULT_METRICS_PORT, 'kube-proxy'],
  [4240, "Cilium's health checks"],
]);

/** Something the agent listens on, as its flags set it. */
export interface Listener {
  /** The flag that sets the port or the path (--metrics-port). */
  readonly flag: string;
  readonly value: string | number;
  /** The flag that sets the address it binds (--metrics-bind-address), and that address. */
  readonly bind?: { readonly flag: string; readonly host: string };
  /** Every node must use the same (the mesh port, which peers probe). */
  readonly sameOnEveryNode?: boolean;
}

/**
 * A listener the start could not open, as one line that names the flag to
 * change: a port another process holds, an address this host lacks, an API
 * socket path in use.
 */
export function listenError(l: Listener, err: unknown): ConfigError {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  const message = err instanceof Error ? err.message : String(err);
  const where = `${l.flag} ${l.value}`;
  if (l.flag === '--api-socket') {
    if (code === 'EADDRINUSE') return new ConfigError(`${where}: another process listens there (another lbctl agent?); stop it or pick another path`, { cause: err });
    if (code === 'EEXIST') return new ConfigError(`${where}: the path exists and is not a socket; remove it or pick another path`, { cause: err });
    return new ConfigError(`${where}: ${message}`, { cause: err });
  }
  const on = l.bind ? ` on ${l.bind.host}` : '';
  if (code === 'EADDRINUSE') {
    const holder = LIKELY_HOLDERS.get(Number(l.value));
    const another = pick(l.sameOnEveryNode === true);
    return new ConfigError(`${where}: address already in use${on} (another process${holder ? `, maybe ${holder},` : ''} holds it); ${another} or stop it`, { cause: err });
  }
  if (code === 'EACCES') return new ConfigError(`${where}: permission denied${on} (ports below 1024 need CAP_NET_BIND_SERVICE); ${pick(l.sameOnEveryNode === true)}`, { cause: err });
  if (code === 'EADDRNOTAVAIL' && l.bind) return new ConfigError(`${l.bind.flag} ${l.bind.host}: not an address of this host; pick one it has, or 0.0.0.0 for all`, { cause: err });
  return new ConfigError(`${where}: cannot listen${on}: ${message}`, { cause: err });
}

const pick = (sameOnEveryNode: boolean): string => `pick another port${sameOnEveryNode ? ' (the same on every node)' : ''}`;

/** Runs `start`; its failure becomes listenError's line. */
async function opening<T>(l: Listener, start: () => Promise<T>): Promise<T> {
  try {
    return await start();
  } catch (err) {
    throw listenError(l, err);
  }
}

/**
 * How long a stop may take before the process exits anyway: a close that
 * hangs, or a handle left open, must not keep a stopped agent running (the
 * DaemonSet gives SIGTERM 10 s before SIGKILL).
 */
const STOP_DEADLINE_MS = 5_000;

export async function agentCommand(opts: AgentCommandOptions): Promise<void> {
  // Handlers first: run as a container's PID 1 (not in our image, where
  // tini is PID 1 and forwards signals), the agent would otherwise ignore a
  // SIGTERM that arrives while it starts (the kernel drops signals PID 1
  // has no handler for), and the kubelet would wait out the grace period.
  // The first signal stops the agent at whatever stage of its start it is;
  // one that comes while it stops (or while a failed start cleans up) ends
  // the process at once.
  let stopping = false;
  let signalled!: (signal: NodeJS.Signals) => void;
  const stopSignal = new Promise<NodeJS.Signals>((resolve) => (signalled = resolve));
  const onSignal = (signal: NodeJS.Signals): void => {
    if (stopping) {
      process.stderr.write(`lbctl: ${signal} while stopping: exiting now\n`);
      process.exit(1);
    }
    stopping = true;
    signalled(signal);
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  const log = pino({ level: opts.logLevel, base: { pid: process.pid } }, pino.destination(2));
  const nodePort = nodePortOptions(opts);
  const sizes = {
    ...(opts.maxServices !== undefined ? { services: opts.maxServices } : {}),
    ...(opts.maxBackends !== undefined ? { backends: opts.maxBackends } : {}),
    ...(opts.maxSockRevnat !== undefined ? { sockRevNat: opts.maxSockRevnat } : {}),
  };
  // The metrics read the datapath's counters through the agent, which
  // reports into the metrics (a scrape comes once the agent exists).
  const metrics = new AgentMetrics({ view: { datapathCounters: (): Record<string, bigint> => agent.datapathCounters() } });
  const nodeName = opts.nodeName ?? process.env.NODE_NAME ?? os.hostname();
  // The health mesh: built before the agent, which hands it every Node.
  const mesh = (opts.healthMeshPort ?? 0) !== 0
    ? new MeshAgent({
        self: nodeName,
        port: opts.healthMeshPort!,
        timeoutMs: opts.healthMeshTimeout ?? 1000,
        ...(opts.healthMeshPeriod !== undefined ? { periodMs: opts.healthMeshPeriod } : {}),
        peerMetrics: opts.healthMeshPeerMetrics ?? 16,
        log,
        metrics,
      })
    : undefined;
  const source = await makeSource(opts, nodeName, log, metrics);
  // Readiness probes in standalone mode only: in a cluster, kubelet's probes
  // decide which endpoints are ready, and lbctl follows their conditions.
  const probes = source instanceof FileSource ? { allFailed: opts.probeAllFailed ?? 'open', executors: defaultExecutors(new GrpcJsHealthClient()), concurrency: PROBE_CONCURRENCY } : undefined;
  const agent: Agent = new Agent({
    source,
    ...(probes ? { probes } : {}),
    nodeName,
    datapath: {
      bpfRoot: opts.bpfRoot,
      cgroup: opts.cgroup ?? cgroup2Root(),
      sizes,
      ...(opts.bpfObject !== undefined ? { object: path.resolve(opts.bpfObject) } : {}),
    },
    log,
    metrics,
    ...(nodePort ? { nodePort } : {}),
    // healthCheckNodePort answers follow /healthz (they are served after the first sync).
    healthy: (): boolean => health.healthz().healthy,
    minSyncPeriodMs: opts.minSyncPeriod,
    syncPeriodMs: opts.syncPeriod,
    ...(mesh ? { onNode: (name: string, node: Node | undefined) => mesh.setNode(name, node) } : {}),
  });
  const health: Health = new Health({
    view: agent,
    healthTimeoutMs: 2 * opts.syncPeriod,
    // Every stall is logged and counted; /livez fails only for a loop that keeps stalling (src/http/health.ts, EventLoopMonitor).
    onEventLoopStall: (lagMs, recent) => {
      metrics.eventLoopStall(lagMs);
      log.warn({ stalledMs: Math.round(lagMs), stallsInWindow: recent }, 'event loop stalled');
    },
  });

  // `lbctl version`'s AGENT column: read now, before the start loads the
  // objects, so it names the bytes this agent runs even after a newer build
  // replaces the files.
  const versions = collectVersions({ libbpf: libbpfVersion(), objects: runtimeObjects({ bpfObject: opts.bpfObject, tcObject: opts.tcObject, nodeport: nodePort !== undefined }) });

  // What is open, closed in reverse order when the agent stops or its start fails.
  const open: Array<{ close(): Promise<void> | void }> = [health];
  let starting: Promise<void> | undefined;
  const stopAll = async (): Promise<void> => {
    if (starting) await agent.stop();
    for (const o of open.reverse()) await o.close();
  };
  // Armed when a stop begins; unref'd, so it fires only if something still holds the process then.
  const exitIfStuck = (code: number): void => {
    setTimeout(() => {
      log.error({ handles: process.getActiveResourcesInfo() }, `still running ${STOP_DEADLINE_MS / 1000} s after the stop began: exiting`);
      process.exit(code);
    }, STOP_DEADLINE_MS).unref();
  };
  try {
    // Servers first: /livez answers and /readyz says "not yet" while the
    // agent starts. Nothing is logged before they listen, so a port another
    // process holds fails the start with one line (listenError).
    const healthServer = await opening({ flag: '--health-port', value: opts.healthPort, bind: { flag: '--health-bind-address', host: opts.healthBindAddress } }, () =>
      startHealthServer({ health, metrics, port: opts.healthPort, host: opts.healthBindAddress }),
    );
    open.push(healthServer);
    const metricsServer = await opening({ flag: '--metrics-port', value: opts.metricsPort, bind: { flag: '--metrics-bind-address', host: opts.metricsBindAddress } }, () =>
      startMetricsServer({ metrics, port: opts.metricsPort, host: opts.metricsBindAddress }),
    );
    open.push(metricsServer);
    open.push(await opening({ flag: '--api-socket', value: opts.apiSocket }, () =>
      startApiServer({ view: agent, health, socketPath: opts.apiSocket, version: VERSION, versions, ...(mesh ? { mesh: mesh.mesh } : {}) }),
    ));
    if (mesh) {
      // Probing starts now and runs beside everything else: nothing waits for it.
      await opening({ flag: '--health-mesh-port', value: opts.healthMeshPort!, sameOnEveryNode: true }, () => mesh.start());
      open.push(mesh);
    }
    log.info({ health: healthServer.port, metrics: metricsServer.port, api: opts.apiSocket }, 'serving health, metrics and the local API');
    logMemoryBudget(log);
    starting = agent.start();
    // A signal during the start stops the agent at the start's next step.
    await Promise.race([starting, stopSignal]);
  } catch (err) {
    // Nothing may keep the process alive after a failed start: the caller reports the error and exits 1.
    stopping = true;
    exitIfStuck(1);
    await stopAll().catch((e: unknown) => log.warn({ err: (e as Error)?.message ?? String(e) }, 'cleaning up after the failed start failed'));
    throw err;
  }
  const signal = await stopSignal;
  log.info({ signal }, 'stopping');
  exitIfStuck(1);
  await stopAll();
}

/**
 * The memory the agent may use, as the kernel will enforce it (the cgroup's
 * limit: a container's limits.memory) and as V8 will (its heap cap, which
 * bin/lbctl derives from that limit). A heap cap at or above the limit means
 * V8 would grow into an OOM kill rather than collect: said once, at start.
 */
export function logMemoryBudget(log: Pick<Logger, 'info' | 'warn'>): void {
  const limit = process.constrainedMemory?.() ?? 0;
  const heapLimit = v8.getHeapStatistics().heap_size_limit;
  const mib = (b: number): number => Math.round(b / 2 ** 20);
  // libuv answers 0, or 2^64 under cgroup v1 (Node 20 and 24 alike), when no limit is set.
  if (!limit || limit >= 2 ** 60) {
    log.info({ heapLimitMiB: mib(heapLimit) }, 'no memory limit (cgroup); V8 heap capped at its default');
    return;
  }
  const budget = { memoryLimitMiB: mib(limit), heapLimitMiB: mib(heapLimit) };
  if (heapLimit >= limit) log.warn(budget, "V8's heap cap is not below the memory limit: the agent may be OOM-killed before it collects (run it through bin/lbctl, or set --max-old-space-size)");
  else log.info(budget, 'memory limit (cgroup) and V8 heap cap');
}
