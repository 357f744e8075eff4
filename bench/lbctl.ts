// lbctl under the benchmark: the agent as users run it, watching a cluster
// through a kubeconfig. The cluster is the e2e tests' local API server
// (real list/watch wire protocol), holding N Services with an EndpointSlice
// of 3 endpoints each. Times come from the agent's own sync report and
// from polling the pinned map until a change is in the kernel.
import type { ChildProcess } from 'node:child_process';
import { appendFileSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { Worker } from 'node:worker_threads';
import { FakeApiServer } from '../test/helpers/fake-apiserver.js';
import { LbScope, lb4_key } from '../src/datapath/abi.gen.js';
import type { PollerAnswer, PollerAsk, PollerData } from './map-poller.js';
import { ipv4ToUint } from '../src/lb/addr.js';
import { LBCTL, type BenchRun, type MemoryCgroup, type World } from './world.js';
import type { BenchService } from './kube-proxy.js';

/** What the local API server stores: a Kubernetes object as plain JSON. */
export type K8sObject = Record<string, unknown> & { metadata: { name: string; namespace?: string; labels?: Record<string, string> } };
const NODE = 'bench-node';

export function serviceObject(s: BenchService): K8sObject {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: s.name, namespace: s.namespace },
    spec: {
      type: 'ClusterIP',
      clusterIP: s.clusterIP,
      clusterIPs: [s.clusterIP],
      ipFamilies: ['IPv4'],
      ports: [{ name: s.portName, port: s.port, protocol: 'TCP', targetPort: s.endpoints[0]?.port ?? 8080 }],
      selector: { app: s.name },
    },
  };
}

/** The name of a bench service's one EndpointSlice. */
export const sliceName = (s: BenchService): string => `${s.name}-x7k2p`;

export function sliceObject(s: BenchService): K8sObject {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name: sliceName(s),
      namespace: s.namespace,
      labels: { 'kubernetes.io/service-name': s.name, 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io' },
    },
    addressType: 'IPv4',
    ports: [{ name: s.portName, port: s.endpoints[0]?.port ?? 8080, protocol: 'TCP' }],
    endpoints: s.endpoints.map((e, i) => ({
      addresses: [e.ip],
      conditions: { ready: true, serving: true, terminating: false },
      nodeName: `node-${i}`,
      targetRef: { kind: 'Pod', namespace: s.namespace, name: `${s.name}-${i}` },
    })),
  };
}

/** The map sizes the bench gives the agent for N services (--max-services, --max-backends); bench/cold-floor.ts's maps are the same. */
export const agentSizes = (n: number): { services: number; backends: number } => ({
  services: Math.max(1024, Math.ceil(n * 1.25)),
  backends: Math.max(4096, Math.ceil(n * 3.75)),
});

/** The local API server holding the benchmark's services. */
export async function startCluster(): Promise<FakeApiServer> {
  const api = new FakeApiServer();
  await api.start();
  api.put({ apiVersion: 'v1', kind: 'Node', metadata: { name: NODE, labels: { 'kubernetes.io/hostname': NODE } } });
  return api;
}

export function putServices(api: FakeApiServer, services: readonly BenchService[]): void {
  for (const s of services) {
    // The slice first: a Service's first sync then already has its endpoints.
    api.put(sliceObject(s) as never);
    api.put(serviceObject(s) as never);
  }
}

export function deleteServices(api: FakeApiServer, services: readonly BenchService[]): void {
  for (const s of services) {
    api.delete('Service', s.name, s.namespace);
    api.delete('EndpointSlice', sliceName(s), s.namespace);
  }
}

export interface SyncLine {
  readonly reason: string;
  readonly planned: number;
  readonly durationMs: number;
  readonly frontends: number;
  /** The agent's own split of durationMs (SyncReport.phasesMs). */
  readonly phasesMs?: Record<string, number>;
  /** When this process read the line (performance.now()). */
  readonly seenAt: number;
}

/** The agent, pinned to `cpu`, attached to the run's cgroup, with its own bpf root. */
export class BenchAgent {
  readonly syncs: SyncLine[] = [];
  private readonly waiters: Array<() => void> = [];
  private readonly output: string[] = [];
  readonly exited: Promise<number | null>;
  private metricsPort: number | undefined;
  /** When /readyz first answered 200 (performance.now()). */
  readyAt: number | undefined;
  private readyPoll: NodeJS.Timeout | undefined;

  private constructor(
    readonly proc: ChildProcess,
    readonly startedAt: number,
  ) {
    this.exited = new Promise((resolve) => proc.once('exit', (code) => resolve(code)));
    this.trace(process.env.BENCH_AGENT_TRACE);
    // The agent logs (pino, JSON lines) to stderr.
    createInterface({ input: proc.stderr! }).on('line', (line) => {
      const seenAt = performance.now();
      this.output.push(line);
      if (this.output.length > 50) this.output.shift();
      let l: Record<string, unknown>;
      try {
        l = JSON.parse(line) as Record<string, unknown>;
      } catch {
        return;
      }
      if (l.msg === 'serving health, metrics and the local API') {
        this.metricsPort = Number(l.metrics);
        this.pollReady(Number(l.health));
      }
      if (l.msg === 'sync done') {
        this.syncs.push({
          reason: String(l.reason),
          planned: Number(l.planned),
          durationMs: Number(l.durationMs),
          frontends: Number(l.frontends),
          ...(l.phasesMs && typeof l.phasesMs === 'object' ? { phasesMs: l.phasesMs as Record<string, number> } : {}),
          seenAt,
        });
        for (const w of this.waiters.splice(0)) w();
      }
    });
    proc.stdout!.resume();
  }

  /**
   * Asks /readyz every 5 ms until it answers 200 (readyAt): start → ready as
   * the DaemonSet's readiness probe sees it, at a finer grain. Each ask is one
   * small HTTP request on the agent's CPU.
   */
  private pollReady(port: number): void {
    const ask = (): void => {
      if (this.proc.exitCode !== null) return;
      fetch(`http://127.0.0.1:${port}/readyz`)
        .then(async (r) => {
          await r.arrayBuffer();
          if (r.status === 200) this.readyAt ??= performance.now();
        })
        .catch(() => undefined)
        .finally(() => {
          if (this.readyAt === undefined && this.proc.exitCode === null) this.readyPoll = setTimeout(ask, 5);
        });
    };
    ask();
  }

  /**
   * BENCH_AGENT_TRACE=FILE (a diagnostic, not part of any result): the
   * agent's stdout and stderr lines (with LBCTL_NODE_FLAGS=--trace-gc, V8's
   * collections) and its VmRSS every 50 ms, each line stamped with the ms
   * since the agent was spawned, appended to FILE.
   */
  private trace(file: string | undefined): void {
    if (!file) return;
    const stamp = (line: string): void => appendFileSync(file, `${(performance.now() - this.startedAt).toFixed(0)} ${line}\n`);
    for (const s of [this.proc.stdout!, this.proc.stderr!]) createInterface({ input: s }).on('line', stamp);
    const sample = setInterval(() => {
      try {
        stamp(/^VmRSS:.*$/m.exec(readFileSync(`/proc/${this.proc.pid}/status`, 'utf8'))?.[0] ?? '');
      } catch {
        clearInterval(sample);
      }
    }, 50);
    sample.unref();
    void this.exited.then(() => clearInterval(sample));
  }

  /** The agent's CPU time so far, every thread (V8's helpers included), in ms (/proc/PID/task/*\/schedstat). */
  cpuMs(): number {
    let ns = 0;
    for (const t of readdirSync(`/proc/${this.proc.pid}/task`)) {
      try {
        ns += Number(readFileSync(`/proc/${this.proc.pid}/task/${t}/schedstat`, 'utf8').split(' ')[0]);
      } catch {
        /* the thread ended */
      }
    }
    return ns / 1e6;
  }

  static start(
    run: BenchRun,
    world: World,
    api: FakeApiServer,
    n: number,
    cpu: number,
    opts: { memory?: MemoryCgroup; syncPeriodMs?: number; logLevel?: string } = {},
  ): BenchAgent {
    const args = [
      'agent',
      '--kubeconfig', api.kubeconfig,
      '--node-name', NODE,
      '--cgroup', run.cgroup,
      '--bpf-root', world.bpfRoot,
      '--health-port', '0',
      '--metrics-port', '0',
      '--api-socket', path.join('/tmp', `${world.client}.sock`),
      '--no-nodeport', // the machine's own network namespace: never on its devices
      '--health-mesh-port', '0', // nor on a fixed port of it
      '--sync-period', String(opts.syncPeriodMs ?? 3_600_000),
      ...(opts.logLevel ? ['--log-level', opts.logLevel] : []),
      '--max-services', String(agentSizes(n).services),
      '--max-backends', String(agentSizes(n).backends),
      // BENCH_AGENT_ARGS="--disable-compression ...": more flags for the agent (a diagnostic, not part of any result).
      ...(process.env.BENCH_AGENT_ARGS?.split(' ').filter(Boolean) ?? []),
    ];
    // BENCH_PROFILE_DIR=DIR: the agent writes a V8 CPU profile there when it
    // stops, sampled every BENCH_PROFILE_INTERVAL_US (default 50 µs; the
    // profiler's own cost grows as the interval shrinks). It is still
    // bin/lbctl, with its node and malloc settings; node refuses --cpu-prof
    // in NODE_OPTIONS, so it goes in LBCTL_NODE_FLAGS.
    const prof = process.env.BENCH_PROFILE_DIR;
    const entry = prof ? ['env', `LBCTL_NODE_FLAGS=--cpu-prof --cpu-prof-interval=${process.env.BENCH_PROFILE_INTERVAL_US ?? 50} --cpu-prof-dir=${prof}`, LBCTL] : [LBCTL];
    const cmd = ['taskset', '-c', String(cpu), ...entry, ...args];
    const [exe, argv] = opts.memory ? opts.memory.wrap(cmd[0]!, cmd.slice(1)) : [cmd[0]!, cmd.slice(1)];
    const t0 = performance.now();
    return new BenchAgent(run.spawn(exe, argv), t0);
  }

  /** The next sync report after `from` (an index into syncs) that matches. */
  async waitForSync(from: number, match: (s: SyncLine) => boolean = () => true, timeoutMs = 600_000): Promise<SyncLine> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const s = this.syncs.slice(from).find(match);
      if (s) return s;
      if (this.proc.exitCode !== null) throw new Error(`lbctl agent exited ${this.proc.exitCode}:\n${this.output.join('\n')}`);
      if (performance.now() > deadline) throw new Error(`no matching sync within ${timeoutMs} ms:\n${this.output.slice(-10).join('\n')}`);
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 200);
      });
    }
  }

  /**
   * Resident and peak resident memory, in MiB (/proc/PID/status), and where
   * it is: the V8 heap in use and reserved, and memory outside it (Buffers),
   * from the agent's own /metrics (prom-client's process metrics).
   */
  async memory(): Promise<{ rssMiB: number; hwmMiB: number; rssAnonMiB?: number; rssFileMiB?: number; heapUsedMiB?: number; heapTotalMiB?: number; externalMiB?: number }> {
    const status = readFileSync(`/proc/${this.proc.pid}/status`, 'utf8');
    const kb = (field: string): number => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
    // RssFile: pages of files mapped (the node binary's code and data, the addon, libraries): shared and reclaimable; RssAnon: the process's own.
    const out = { rssMiB: kb('VmRSS') / 1024, hwmMiB: kb('VmHWM') / 1024, rssAnonMiB: kb('RssAnon') / 1024, rssFileMiB: kb('RssFile') / 1024 };
    if (this.metricsPort === undefined) return out;
    try {
      const text = await (await fetch(`http://127.0.0.1:${this.metricsPort}/metrics`)).text();
      const mib = (name: string): number | undefined => {
        const m = new RegExp(`^${name} ([0-9.e+]+)$`, 'm').exec(text);
        return m ? Number(m[1]) / 2 ** 20 : undefined;
      };
      return { ...out, heapUsedMiB: mib('nodejs_heap_size_used_bytes'), heapTotalMiB: mib('nodejs_heap_size_total_bytes'), externalMiB: mib('nodejs_external_memory_bytes') };
    } catch {
      return out;
    }
  }

  async stop(): Promise<void> {
    clearTimeout(this.readyPoll);
    if (this.proc.exitCode === null) this.proc.kill('SIGTERM');
    await this.exited;
  }
}

/** The lb4_services key of a TCP ClusterIP frontend's master entry (slot 0). */
export const masterKey = (clusterIP: string, port: number): Buffer =>
  lb4_key.encode({ address: ipv4ToUint(clusterIP), dport: port, backendSlot: 0, proto: 6, scope: LbScope.LB_SCOPE_EXT });

/**
 * Watches a frontend's master entry in the pinned map from a worker thread
 * (bench/map-poller.ts): when the kernel holds a given count of selectable
 * backends, as an absolute time (performance.timeOrigin + performance.now()).
 */
export class MasterProbe {
  private readonly worker: Worker;
  private readonly errors: Error[] = [];

  constructor(bpfRoot: string, clusterIP: string, port: number) {
    const data: PollerData = { mapPath: path.join(bpfRoot, 'maps', 'lb4_services'), key: masterKey(clusterIP, port) };
    this.worker = new Worker(new URL('./map-poller.ts', import.meta.url), { workerData: data });
    this.worker.on('error', (err) => this.errors.push(err));
  }

  /**
   * Starts watching for count `want` (undefined: the entry absent) and
   * resolves once the worker is reading the map, so a change made after
   * this is never missed; `seen` is then when the kernel showed it.
   */
  async arm(want: number | undefined, timeoutMs = 60_000): Promise<{ seen: Promise<number> }> {
    if (this.errors.length) throw this.errors[0]!;
    let armed!: () => void;
    const ready = new Promise<void>((resolve) => (armed = resolve));
    const seen = new Promise<number>((resolve, reject) => {
      const onMessage = (m: 'armed' | PollerAnswer): void => {
        if (m === 'armed') return armed();
        this.worker.off('message', onMessage);
        this.worker.off('error', reject);
        if ('at' in m) resolve(m.at);
        else reject(new Error(m.error));
      };
      this.worker.on('message', onMessage);
      this.worker.once('error', reject);
      this.worker.postMessage({ want: want ?? null, timeoutMs } satisfies PollerAsk);
    });
    seen.catch(() => armed()); // a worker that fails before arming must not leave arm() waiting
    await ready;
    return { seen };
  }

  /** When the count is `want`: arm() and wait for it. */
  async until(want: number | undefined, timeoutMs = 60_000): Promise<number> {
    return (await this.arm(want, timeoutMs)).seen;
  }

  /** Ends the worker after it has closed its map fd (terminated if it does not within a second). */
  async close(): Promise<void> {
    const exited = new Promise<void>((resolve) => this.worker.once('exit', () => resolve()));
    this.worker.postMessage('close');
    const timer = setTimeout(() => void this.worker.terminate(), 1000);
    await exited;
    clearTimeout(timer);
  }
}
