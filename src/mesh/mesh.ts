// The node health mesh: every agent probes every node (itself included) on
// each of its addresses, by ICMP echo ("ICMP to stack") and by HTTP GET
// /hello to the peer's agent, as cilium-health does. Built so that it
// scales where a sequential loop does not:
//   - every address has its own timer: a probe is never queued behind
//     another node's, and a slow or silent peer costs one slot of the pool
//     for at most the timeout;
//   - the period grows with the cluster so that each node sends a bounded
//     number of probes per second (periodFor), and each address's first
//     probe and every later one are jittered, so a restart of every agent
//     does not synchronize them;
//   - probes run through a pool of bounded concurrency; the pool's size
//     covers the rate times the timeout, so with every peer silent the
//     pool still keeps up;
//   - nothing else waits for it: the agent's start, syncs, API and /readyz
//     never look at the mesh, and a peer being down never makes this agent
//     unready.
// The probes themselves are injected (Probers): the agent gives ICMP sockets
// and HTTP, unit tests give fakes and a fake clock.
import type { Node } from '../model/k8s.js';
import { wallClock, type Clock } from '../base/clock.js';
import { Pool } from '../base/pool.js';

export type Path = 'icmp' | 'http';
export const PATHS: readonly Path[] = ['icmp', 'http'];

/** A probe's outcome: its RTT, or what went wrong (timeout, refused, unreachable, or an errno name). */
export type Outcome = { readonly ok: true; readonly rttMs: number } | { readonly ok: false; readonly error: string; readonly detail?: string };

export interface Probers {
  icmp(address: string, timeoutMs: number): Promise<Outcome>;
  http(address: string, port: number, timeoutMs: number): Promise<Outcome>;
}

/** The shortest default period: what a handful of nodes gets. */
export const MIN_PERIOD_MS = 10_000;
/**
 * Probes a node sends per second at most, by default: with two paths per
 * address, 5,000 single-address nodes take 10,000 / 166 ≈ 60 s a round.
 */
export const PROBES_PER_SECOND = 166;
export const DEFAULT_TIMEOUT_MS = 1000;

/**
 * The default period for `probes` probes a round (addresses × paths):
 * max(10 s, probes / 166 per second). 10 nodes: 10 s; 1,000: 12 s;
 * 5,000: 60 s (one address each).
 */
export function periodFor(probes: number): number {
  return Math.max(MIN_PERIOD_MS, Math.ceil((probes / PROBES_PER_SECOND) * 1000));
}

/** What is known of one path of one address. */
export interface PathState {
  /** The last result: "ok" or the error; "pending" before the first. */
  status: string;
  rttMs?: number;
  detail?: string;
  /** Epoch ms of the last success and failure. */
  lastSuccess?: number;
  lastFailure?: number;
}

interface Target {
  readonly node: string;
  readonly address: string;
  readonly paths: Record<Path, PathState>;
  lastProbe?: number;
  timer?: unknown;
  /** Probes of this target in flight (never more than one round at a time). */
  busy: boolean;
}

export interface MeshOptions {
  /** This node's name: its own entry is marked local. */
  readonly self: string;
  /** The peers' /hello port (--health-mesh-port). */
  readonly port: number;
  readonly timeoutMs?: number;
  /** --health-mesh-period: overrides periodFor. */
  readonly periodMs?: number;
  /** Probes in flight at most (default: enough for the rate times the timeout, at least 64). */
  readonly concurrency?: number;
  readonly probers: Probers;
  readonly clock?: Clock;
  /** Called with every probe's result (metrics). */
  readonly onResult?: (r: { node: string; address: string; path: Path; outcome: Outcome }) => void;
  /** Random in [0, 1): injectable for tests. */
  readonly random?: () => number;
}

export interface MeshAddressStatus {
  readonly address: string;
  readonly icmp: { readonly status: string; readonly rttMs?: number; readonly detail?: string; readonly lastSuccess?: string; readonly lastFailure?: string };
  readonly http: { readonly status: string; readonly rttMs?: number; readonly detail?: string; readonly lastSuccess?: string; readonly lastFailure?: string };
  readonly lastProbe?: string;
}

export interface MeshNodeStatus {
  readonly name: string;
  readonly local: boolean;
  /** reachable: ICMP and HTTP answered at one of its addresses at least; unreachable: a probe failed and none did; pending: not probed yet. */
  readonly state: 'reachable' | 'unreachable' | 'pending';
  readonly addresses: readonly MeshAddressStatus[];
}

export interface MeshStatus {
  /** When this status was taken. */
  readonly probeTime: string;
  readonly periodMs: number;
  readonly timeoutMs: number;
  readonly port: number;
  readonly inFlight: number;
  readonly queued: number;
  readonly nodes: readonly MeshNodeStatus[];
  readonly reachable: number;
  readonly unreachable: number;
  readonly total: number;
}

const iso = (ms: number | undefined): string | undefined => (ms === undefined ? undefined : new Date(ms).toISOString());

export class HealthMesh {
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly timeoutMs: number;
  /** node name → address → target */
  private readonly nodes = new Map<string, Map<string, Target>>();
  private readonly pool: Pool;
  private running = false;

  constructor(private readonly opts: MeshOptions) {
    this.clock = opts.clock ?? wallClock;
    this.random = opts.random ?? Math.random;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.pool = new Pool(opts.concurrency ?? Math.max(64, Math.ceil((PROBES_PER_SECOND * this.timeoutMs) / 1000) * 2));
  }

  /** The period in force: the override, or periodFor the current targets. */
  periodMs(): number {
    if (this.opts.periodMs !== undefined) return this.opts.periodMs;
    let targets = 0;
    for (const t of this.nodes.values()) targets += t.size;
    return periodFor(targets * PATHS.length);
  }

  /** A node added, changed or gone (undefined): its addresses are probed, or no longer. */
  setNode(name: string, node: Node | undefined): void {
    const addresses = node && !node.deleting ? (node.addresses ?? []).map((a) => a.address) : [];
    const targets = this.nodes.get(name) ?? new Map<string, Target>();
    for (const [address, t] of targets) {
      if (!addresses.includes(address)) {
        if (t.timer !== undefined) this.clock.clearTimeout(t.timer);
        targets.delete(address);
      }
    }
    for (const address of addresses) {
      if (targets.has(address)) continue;
      const t: Target = { node: name, address, paths: { icmp: { status: 'pending' }, http: { status: 'pending' } }, busy: false };
      targets.set(address, t);
      if (this.running) this.schedule(t, true);
    }
    if (targets.size === 0) this.nodes.delete(name);
    else this.nodes.set(name, targets);
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    for (const targets of this.nodes.values()) for (const t of targets.values()) this.schedule(t, true);
  }

  stop(): void {
    this.running = false;
    for (const targets of this.nodes.values()) {
      for (const t of targets.values()) {
        if (t.timer !== undefined) this.clock.clearTimeout(t.timer);
        t.timer = undefined;
      }
    }
    // Probes waiting for a slot give up; those in flight end by their timeout.
    this.pool.releaseAll();
  }

  /**
   * The next probe of `t`: the first at a random point of one period (so
   * that agents started together spread out), later ones a period apart
   * with ±10% jitter, counted from one probe's start to the next: how long
   * a probe takes never shifts the next. An address whose probe is still
   * running when its time comes skips that turn. The period is read anew
   * each time, so it follows the cluster's size.
   */
  private schedule(t: Target, first: boolean): void {
    const period = this.periodMs();
    const delay = first ? this.random() * period : period * (0.9 + 0.2 * this.random());
    t.timer = this.clock.setTimeout(() => {
      t.timer = undefined;
      if (!this.running || this.nodes.get(t.node)?.get(t.address) !== t) return;
      this.schedule(t, false);
      void this.probe(t);
    }, delay);
  }

  /** Both paths of one address, each through a slot of the pool. */
  private async probe(t: Target): Promise<void> {
    if (t.busy) return;
    t.busy = true;
    try {
      t.lastProbe = this.clock.now();
      await Promise.all(PATHS.map((p) => this.pool.run(async () => (this.running ? this.probePath(t, p) : undefined))));
    } finally {
      t.busy = false;
    }
  }

  private async probePath(t: Target, path: Path): Promise<void> {
    let outcome: Outcome;
    try {
      outcome = path === 'icmp' ? await this.opts.probers.icmp(t.address, this.timeoutMs) : await this.opts.probers.http(t.address, this.opts.port, this.timeoutMs);
    } catch (err) {
      outcome = { ok: false, error: (err as NodeJS.ErrnoException)?.code ?? 'error', detail: (err as Error)?.message ?? String(err) };
    }
    const s = t.paths[path];
    const now = this.clock.now();
    if (outcome.ok) {
      s.status = 'ok';
      s.rttMs = outcome.rttMs;
      delete s.detail;
      s.lastSuccess = now;
    } else {
      s.status = outcome.error;
      delete s.rttMs;
      if (outcome.detail !== undefined) s.detail = outcome.detail;
      else delete s.detail;
      s.lastFailure = now;
    }
    this.opts.onResult?.({ node: t.node, address: t.address, path, outcome });
  }


  /** One node's status (undefined: not in the mesh). */
  node(name: string): MeshNodeStatus | undefined {
    const targets = this.nodes.get(name);
    if (!targets) return undefined;
    const list = [...targets.values()];
    const addresses = list.map((t) => ({
      address: t.address,
      icmp: pathStatus(t.paths.icmp),
      http: pathStatus(t.paths.http),
      ...(t.lastProbe !== undefined ? { lastProbe: iso(t.lastProbe) } : {}),
    }));
    const ok = list.some((t) => t.paths.icmp.status === 'ok' && t.paths.http.status === 'ok');
    const probed = list.some((t) => PATHS.some((p) => t.paths[p].status !== 'pending'));
    return { name, local: name === this.opts.self, state: ok ? 'reachable' : probed ? 'unreachable' : 'pending', addresses };
  }

  status(): MeshStatus {
    const nodes: MeshNodeStatus[] = [];
    let reachable = 0;
    let unreachable = 0;
    for (const name of [...this.nodes.keys()].sort()) {
      const n = this.node(name)!;
      if (n.state === 'reachable') reachable++;
      if (n.state === 'unreachable') unreachable++;
      nodes.push(n);
    }
    return {
      probeTime: iso(this.clock.now())!,
      periodMs: this.periodMs(),
      timeoutMs: this.timeoutMs,
      port: this.opts.port,
      inFlight: this.pool.inFlight,
      queued: this.pool.queued,
      nodes,
      reachable,
      unreachable,
      total: nodes.length,
    };
  }
}

function pathStatus(s: PathState): MeshAddressStatus['icmp'] {
  return {
    status: s.status,
    ...(s.rttMs !== undefined ? { rttMs: Math.round(s.rttMs * 1000) / 1000 } : {}),
    ...(s.detail !== undefined ? { detail: s.detail } : {}),
    ...(s.lastSuccess !== undefined ? { lastSuccess: iso(s.lastSuccess) } : {}),
    ...(s.lastFailure !== undefined ? { lastFailure: iso(s.lastFailure) } : {}),
  };
}
