// The health mesh as the agent runs it: the /hello listener (its own worker
// thread), the ICMP sockets and HTTP probes, the prober (mesh.ts), its logs
// and metrics. Nothing of the agent's start, syncs, API or readiness waits
// for any of it. A port that cannot be bound refuses the start (the CLI names
// --health-mesh-port): peers would otherwise see this node as unreachable.
import type { Logger } from 'pino';
import type { Node } from '../model/k8s.js';
import { IcmpProber } from './mesh-icmp.js';
import { HealthMesh, type MeshStatus, type Outcome, type Path } from './mesh.js';
import { httpProbe, startHelloServer, type HelloServer } from './mesh-net.js';

/**
 * Where the mesh's results go: the agent's metrics (AgentMetrics, which
 * imports the mesh's types to export them), named here so that the mesh
 * imports nothing of the servers.
 */
export interface MeshMetrics {
  /** The mesh whose state the gauges read at scrape time. */
  setMesh(status: () => MeshStatus, peerSeries: number): void;
  /** Every probe's result. */
  meshProbe(path: Path, outcome: Outcome, peer?: string): void;
}

export interface MeshAgentOptions {
  readonly self: string;
  readonly port: number;
  readonly periodMs?: number;
  readonly timeoutMs: number;
  readonly peerMetrics: number;
  readonly log: Logger;
  readonly metrics?: MeshMetrics;
}

export class MeshAgent {
  readonly mesh: HealthMesh;
  private readonly icmp = new IcmpProber();
  private hello: HelloServer | undefined;
  /** The last state logged per node, so that a change is logged once. */
  private readonly reported = new Map<string, boolean>();

  constructor(private readonly opts: MeshAgentOptions) {
    this.mesh = new HealthMesh({
      self: opts.self,
      port: opts.port,
      timeoutMs: opts.timeoutMs,
      ...(opts.periodMs !== undefined ? { periodMs: opts.periodMs } : {}),
      probers: { icmp: (a, t) => this.icmp.ping(a, t), http: httpProbe },
      onResult: (r) => this.result(r),
    });
    opts.metrics?.setMesh(() => this.mesh.status(), opts.peerMetrics);
  }

  /** A Node the source sent (undefined: gone). */
  setNode(name: string, node: Node | undefined): void {
    this.mesh.setNode(name, node);
    if (!node) this.reported.delete(name);
  }

  /** Listens for /hello (rejects with the listen error: a port taken), then probes. */
  async start(): Promise<void> {
    this.hello = await startHelloServer({ port: this.opts.port, node: this.opts.self });
    this.opts.log.info({ port: this.hello.port, icmp: this.icmp.kind() }, 'health mesh: serving /hello and probing every node');
    this.mesh.start();
  }

  async close(): Promise<void> {
    this.mesh.stop();
    this.icmp.close();
    await this.hello?.close();
  }

  private result(r: { node: string; address: string; path: Path; outcome: Outcome }): void {
    this.opts.metrics?.meshProbe(r.path, r.outcome, r.node);
    // A node's reachability is logged when it changes, not every probe.
    const st = this.mesh.node(r.node);
    if (!st || st.state === 'pending') return;
    const up = st.state === 'reachable';
    if (this.reported.get(r.node) === up) return;
    const first = !this.reported.has(r.node);
    this.reported.set(r.node, up);
    if (up && first) return;
    const failing = st.addresses.flatMap((a) => (['icmp', 'http'] as const).filter((p) => a[p].status !== 'ok').map((p) => `${a.address} ${p}: ${a[p].status}`));
    if (up) this.opts.log.info({ node: r.node }, 'health mesh: node reachable again');
    else this.opts.log.warn({ node: r.node, failing }, 'health mesh: node unreachable');
  }
}
