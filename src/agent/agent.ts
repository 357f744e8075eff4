// The agent's lifecycle: load or adopt the datapath, restore ids and state
// from the pinned maps, read the source, and apply changes as syncs:
// snapshot → model → plan → ordered map writes, batched by a
// bounded-frequency runner. Stopping leaves the datapath running from its
// pinned links and maps; only `lbctl cleanup` removes it.
//
// The agent is also the AgentView its health checks, metrics and local API
// read (src/http/view.ts).
import path from 'node:path';
import type { Logger } from 'pino';
import { sumCounters } from '../datapath/counters.js';
import { featureLine, has, missingRequired, probeFeatures, requireFeatures, type DatapathFeatures } from '../datapath/features.js';
import { linksDir, loadDatapath, mapsDir, tcStagingDir, type Datapath, type DatapathOptions } from '../datapath/loader.js';
import { chooseAttachMode, NodePortDatapath, type AttachChoice } from '../datapath/nodeport.js';
import { sctpStatus } from '../datapath/sctp.js';
import { NodePortAgent, type NodePortOptions } from './nodeport.js';
import { ServiceHealthServers } from '../http/service-health.js';
import { UdpTerminator } from '../datapath/terminate.js';
import { BpfError, pinnedLinkInfo } from '../native/bpf.js';
import { pinnedFrontendPorts } from '../datapath/frontend-ports.js';
import { DesiredModel, type ServiceId } from '../model/desired.js';
import { Prober, type Executors, type LastResult, type ProbeState } from '../probes/prober.js';
import type { Skipped } from '../model/from-k8s.js';
import type { Node } from '../model/k8s.js';
import type { FrontendKey } from '../lb/types.js';
import { frontendStatuses } from './drift.js';
import { LB_MAP_NAMES } from '../datapath/maps.js';
import { LbError } from '../base/errors.js';
import { Reconciler, SyncError, type NotProgrammed, type SyncResult } from '../reconcile/reconciler.js';
import { MaglevPool } from '../lb/maglev-pool.js';
import type { Source, SourceEvent } from '../sources/source.js';
import type { AgentMetrics } from '../http/metrics.js';
import { BoundedFrequencyRunner, type RunReason } from './runner.js';
import type { AgentView, CheckOutcome, FrontendStatus, KernelStatus, SyncStats } from '../http/view.js';

export interface AgentOptions {
  readonly source: Source;
  readonly datapath: DatapathOptions;
  readonly log: Logger;
  readonly metrics?: AgentMetrics;
  /** kube-proxy's minSyncPeriod: bursts within it coalesce (default 0: every change at once). */
  readonly minSyncPeriodMs?: number;
  /** kube-proxy's syncPeriod: a full resync at least this often repairs drift (default 30 s). */
  readonly syncPeriodMs?: number;
  /**
   * This node's name (--node-name), as kube-proxy's hostname: what
   * internalTrafficPolicy Local and node hints compare with, whether or not
   * the source has this node's Node object (only its zone comes from there).
   */
  readonly nodeName?: string;
  /** Serve NodePorts, LoadBalancer and external IPs at tc (absent: the socket programs only). */
  readonly nodePort?: NodePortOptions;
  /** The agent's /healthz verdict, for healthCheckNodePort answers (kube-proxy's serviceProxyHealthy). */
  readonly healthy?: () => boolean;
  /**
   * Told of every Node the source sends (this node's and its peers'): the
   * health mesh. Peers' Nodes change nothing in the datapath, so they never
   * cause a sync.
   */
  readonly onNode?: (name: string, node: Node | undefined) => void;
  /**
   * Readiness probes of the backends of Services that carry the
   * lbctl.io/readiness-probe annotation (standalone mode, issue 17). Absent:
   * nothing is probed (in a cluster, kubelet's probes decide readiness).
   */
  readonly probes?: {
    /** --probe-all-failed: when every backend of a service is quarantined, serve them all (open) or none (closed). */
    readonly allFailed: 'open' | 'closed';
    readonly executors: Executors;
    /** Probes in flight at most (default: the prober's). */
    readonly concurrency?: number;
  };
}

/** One backend's probe, as `lbctl service list` shows it. */
export interface BackendProbe {
  readonly state: ProbeState;
  readonly consecutive: number;
  readonly last?: LastResult;
}

export interface SyncReport extends Omit<SyncResult, 'phasesMs' | 'notProgrammed'> {
  /** How many frontends the sync left out for want of room (each is logged by name once, when it first is). */
  readonly notProgrammed: number;
  /** Where the time went, in ms: re-reading the maps (full resyncs), the model's flush, then the reconciler's phases. */
  readonly phasesMs: SyncResult['phasesMs'] & { readonly resync: number; readonly model: number };
  readonly reason: RunReason;
  readonly frontends: number;
  readonly pruned: boolean;
  readonly durationMs: number;
}

/**
 * A sync that wrote this much (a cold start, a relist after a long outage)
 * leaves its garbage in a heap V8 grew for it, and V8 gives that memory back
 * to the system only slowly: the agent collects once after such a sync.
 */
const BIG_SYNC_OPS = 20_000;

/** Skips a sync logs one by one; the rest are summed up by reason. */
const SKIPS_LISTED_PER_SYNC = 20;
const DELETES = ['delete-master', 'delete-slot', 'delete-revnat', 'delete-backend'];
/** Frontends not programmed that a sync logs one by one; the rest are summed up by map. */
const NOT_PROGRAMMED_LISTED_PER_SYNC = 20;
/** Frontends not programmed that readiness and the status name (the count is always complete). */
const NOT_PROGRAMMED_SHOWN = 5;

/**
 * A sync that wrote what fits but left frontends out for want of room: the
 * runner retries it with backoff (a full resync), so they are programmed
 * once room appears. Not a failed sync: what it wrote stands.
 */
export class NotProgrammedError extends LbError {
  constructor(readonly frontends: readonly NotProgrammed[]) {
    const maps = [...new Set(frontends.map((f) => f.map))].join(', ');
    super(`${frontends.length} frontend${frontends.length === 1 ? '' : 's'} not programmed: no room in ${maps}`, 'ENOSPC');
  }
}

export class Agent implements AgentView {
  readonly startedAt = Date.now();
  private datapath: Datapath | undefined;
  private reconciler: Reconciler | undefined;
  /** Maglev tables of a sync built on several cores (the workers start with the tc datapath, to be up by the first sync). */
  private readonly maglevPool = new MaglevPool();
  private terminator: UdpTerminator | undefined;
  private features: DatapathFeatures | undefined;
  private nodePort: NodePortAgent | undefined;
  private nodePortError: string | undefined;
  /** healthCheckNodePort servers (with the tc datapath only: they serve its LoadBalancer frontends). */
  private serviceHealth: ServiceHealthServers | undefined;
  /** Ports that could not be bound, by service: reported once each. */
  private serviceHealthProblems = new Map<string, string>();
  /**
   * The frontends a healthCheckNodePort server counts (external scope,
   * externalTrafficPolicy Local, a health check port), kept up to date from
   * each flush's changes; healthStale when one of them changed since the
   * servers were last told.
   */
  private readonly healthFrontends = new Set<FrontendKey>();
  private healthStale = true;
  private readonly runner: BoundedFrequencyRunner;
  /** The desired state, kept up to date event by event (kube-proxy's change trackers). */
  private readonly model: DesiredModel;
  private stats: { -readonly [K in keyof SyncStats]: SyncStats[K] } = { count: 0, inProgress: false };
  private synced = false;
  /** Frontends the last sync could not program, by key (logged once when they first appear). */
  private notProgrammed = new Map<string, NotProgrammed>();
  private nodeGoing = false;
  private runQueued = false;
  /** The start in progress or done (start() runs once). */
  private starting: Promise<void> | undefined;
  /** stop() was called: a start in progress ends at its next step. */
  private stopping = false;
  /** Resolves when the first sync that found the source synced has ended, whatever its outcome. */
  private attempted!: () => void;
  private readonly firstAttempted = new Promise<void>((resolve) => (this.attempted = resolve));
  /** The readiness prober (standalone mode with probes): runs beside the syncs, never waited for. */
  private readonly prober: Prober | undefined;
  /** A Service or EndpointSlice changed since the probe targets were last computed. */
  private probeTargetsStale = true;
  /** Probe workers of each service's backend address ("ns/name|address"), and the services each worker serves. */
  private probeKeys = new Map<string, string[]>();
  private servicesOfKey = new Map<string, ServiceId[]>();
  /** Unresolvable probe ports, logged once each. */
  private probeUnresolved = new Set<string>();
  /** Services with every backend quarantined, as last logged. */
  private allFailedLogged = new Set<ServiceId>();

  constructor(private readonly opts: AgentOptions) {
    this.model = new DesiredModel({
      ...(opts.nodePort ? { nodePortRange: opts.nodePort.settings.nodePortRange } : {}),
      ...(opts.probes ? { probeAllFailed: opts.probes.allFailed } : {}),
    });
    if (opts.probes) {
      this.prober = new Prober({
        executors: opts.probes.executors,
        ...(opts.probes.concurrency !== undefined ? { concurrency: opts.probes.concurrency } : {}),
        onChange: (target, state, previous) => this.probeChanged(target, state, previous),
        onResult: (target, result) => this.opts.metrics?.probeResult(this.servicesOfKey.get(target.key) ?? [], result.ok, target.spec.handler.kind, result.latencyMs),
      });
    }
    this.model.setNode(this.nodeWithout());
    this.runner = new BoundedFrequencyRunner((reason) => this.syncOnce(reason), {
      minIntervalMs: opts.minSyncPeriodMs ?? 0,
      maxIntervalMs: opts.syncPeriodMs ?? 30_000,
      onError: (err, retryInMs) => {
        if (err instanceof NotProgrammedError) opts.log.warn({ notProgrammed: err.frontends.length, retryInMs }, `${err.message}; retrying`);
        else opts.log.error({ err: err instanceof SyncError ? err.message : err, retryInMs }, 'sync failed; the maps keep their last good state');
      },
    });
  }

  /**
   * Loads or adopts the datapath, restores state, starts the source and
   * runs the first sync (or defers it while the source lists). A stop()
   * meanwhile ends the start at its next step: a step is never cut short (a
   * map migration finishes), and nothing after it begins.
   */
  start(): Promise<void> {
    this.starting ??= this.startSteps();
    return this.starting;
  }

  private async startSteps(): Promise<void> {
    const { log } = this.opts;
    // What this kernel can do, asked by loading (not by version): one line,
    // a metric per feature, and no start without the required ones.
    const features = await probeFeatures({ cgroup: this.opts.datapath.cgroup, bpfRoot: this.opts.datapath.bpfRoot });
    if (this.stopping) return;
    this.features = features;
    this.opts.metrics?.setFeatures(features.results);
    const line = featureLine(features);
    if (missingRequired(features).length > 0) log.error({ features: features.results }, `datapath features: ${line}`);
    else log.info({ kernel: features.kernel, absent: features.results.filter((r) => !r.available).map((r) => `${r.name}: ${r.detail}`) }, `datapath features: ${line}`);
    requireFeatures(features);
    // Before anything is loaded: --tc-attach tcx on a kernel without tcx refuses the start.
    const attach = this.opts.nodePort ? chooseAttachMode(this.opts.nodePort.tcAttach ?? 'auto', features) : undefined;
    this.datapath = await loadDatapath({ ...this.opts.datapath, setRetval: has(features, 'set_retval') });
    if (this.stopping) return;
    if (this.datapath.variant === 'compat') {
      log.warn('this kernel has no bpf_set_retval (before 5.18): sock_compat.bpf.o loaded; refused connections fail with EPERM instead of ECONNREFUSED');
    }
    for (const m of this.datapath.migrated) {
      if (m.converted) log.info(m, 'map layout changed: entries converted field by field, links switched');
      else if (m.from !== m.to) log.info(m, 'map resized: entries carried over, links switched');
    }
    for (const p of this.datapath.programs) {
      log.info({ program: p.name, linkId: p.linkId, updated: p.updated }, p.updated ? 'program replaced on pinned link' : 'program attached');
    }
    // The ids' ranges follow the loaded maps' sizes (--max-services, --max-backends).
    const maxEntries = Object.fromEntries(LB_MAP_NAMES.map((name) => [name, this.datapath!.object.map(name).maxEntries]));
    // The tc datapath first: the reconciler writes its tables and ranges too.
    if (this.opts.nodePort) {
      this.maglevPool.start();
      await this.startNodePort(this.opts.nodePort, attach!);
    }
    if (this.stopping) return;
    const np = this.nodePort;
    this.reconciler = new Reconciler(this.datapath.maps, {
      maxEntries,
      ...(np && this.opts.nodePort
        ? { northSouth: { maps: np.datapath.northSouthMaps, maglevM: this.opts.nodePort.settings.maglev.m, maglevSeed: this.opts.nodePort.maglevTableSeed, maglevPool: this.maglevPool } }
        : {}),
    });
    const restored = this.reconciler.restore();
    log.info({ ...restored, bpfRoot: this.opts.datapath.bpfRoot, cgroup: this.opts.datapath.cgroup }, 'datapath ready; state restored from pinned maps');
    const revNat = { 4: this.datapath.object.map('lb4_sock_revnat'), 6: this.datapath.object.map('lb6_sock_revnat') };
    this.terminator = await UdpTerminator.open({ revNat, cgroup: this.opts.datapath.cgroup });
    log.info(this.terminator.detection, `stale connected UDP sockets of removed backends: ${this.terminator.mechanism}`);
    if (this.stopping) return;

    // The prober runs beside everything: its workers come with the first
    // sync's targets, jittered within their period (a restart does not probe
    // everything at once), and nothing waits for a probe.
    this.prober?.start();
    await this.opts.source.start((e) => this.changed(e));
    if (this.stopping) return;
    // The first sync: the one the source's first events asked for, or one
    // now (a source still listing defers it; the maps keep serving).
    if (this.stats.count === 0) this.requestSync();
    await new Promise((resolve) => setImmediate(resolve));
    // Until that sync has run (or nothing is left to run), not until it
    // succeeded: a sync retried with backoff (a failure, or frontends left
    // out for want of room) must not hold start(), and with it the CLI's
    // SIGTERM handling, for as long as the retries go on.
    await Promise.race([this.runner.idle(), this.firstAttempted]);
  }


  /**
   * The tc datapath. A flag that names a device this namespace lacks refuses
   * the start; a kernel that cannot load or attach it leaves the socket
   * programs serving, with the error in the log and the status.
   */
  private async startNodePort(opts: NodePortOptions, attach: AttachChoice): Promise<void> {
    const { log } = this.opts;
    const bpfRoot = this.opts.datapath.bpfRoot;
    let dp: NodePortDatapath;
    try {
      dp = await NodePortDatapath.load({
        bpfRoot,
        sockObject: this.datapath!.object,
        mapsDir: mapsDir(bpfRoot),
        linksDir: linksDir(bpfRoot),
        mode: attach.mode,
        maglevM: opts.settings.maglev.m,
        stagingDir: tcStagingDir(bpfRoot),
        ...(opts.sizes ? { sizes: opts.sizes } : {}),
        ...(opts.object ? { object: opts.object } : {}),
        ...(opts.failAttach ? { failAttach: opts.failAttach } : {}),
        ...(opts.acceleration ? { acceleration: opts.acceleration } : {}),
      });
    } catch (err) {
      this.nodePortError = `nodeport.bpf.o not loaded: ${(err as Error).message}`;
      log.error({ err: (err as Error).message }, 'tc datapath not loaded: NodePort, LoadBalancer and external IPs are not served; ClusterIPs are');
      this.keepPinnedPorts(bpfRoot);
      return;
    }
    if (dp.replacedMaps.length > 0) log.warn({ maps: dp.replacedMaps }, 'tc datapath maps of another size or layout were made anew (the agent writes them again)');
    for (const m of dp.migrated) log.info(m, m.converted ? 'tc flows carried into a map of another layout, converted field by field' : 'tc flows carried into a map of another size');
    log.info({ mode: attach.mode, why: attach.why }, `tc programs attach with ${attach.mode}`);
    // The ports frontends have, from the services maps as they are: before configure() tells the programs to trust them.
    if (dp.frontendPorts) {
      try {
        this.datapath!.maps.useFrontendPorts(dp.frontendPorts);
      } catch (err) {
        log.error({ err: (err as Error).message }, 'lb_np_ports not written: every packet\'s frontend is looked up');
      }
    }
    const metrics = this.opts.metrics;
    const agent = new NodePortAgent(dp, { ...opts, ...(metrics ? { onTrafficPressure: (p) => metrics.setMapPressure(p) } : {}) }, log, attach);
    try {
      await agent.prepare();
      agent.start();
    } catch (err) {
      agent.stop();
      throw err;
    }
    this.nodePort = agent;
    this.serviceHealth = new ServiceHealthServers({ healthy: () => this.opts.healthy?.() ?? true });
  }

  /**
   * An earlier agent's tc programs may still run (this one could not load
   * its own) and trust lb_np_ports (LB_NP_F_PORTS in their pinned
   * settings): the frontends this agent writes get their ports marked
   * there all the same, or those programs would pass their packets by.
   */
  private keepPinnedPorts(bpfRoot: string): void {
    try {
      const ports = pinnedFrontendPorts(mapsDir(bpfRoot));
      if (ports) this.datapath!.maps.useFrontendPorts(ports);
    } catch (err) {
      this.opts.log.error({ err: (err as Error).message, bpfRoot }, 'lb_np_ports not written: an earlier agent\'s tc programs may pass new frontends\' packets by');
    }
  }

  /**
   * The healthCheckNodePort servers after a sync: one per LoadBalancer
   * service with externalTrafficPolicy Local, counting this node's ready
   * endpoints (the IPs its external entries hold, per family: a dual-stack
   * pod is one endpoint, as each of kube-proxy's per-family proxiers counts
   * it). In the background: a sync never waits for a socket.
   */
  private syncServiceHealth(): void {
    const sh = this.serviceHealth;
    if (!sh) return;
    // Nothing they count changed and every server is up: nothing to do (a
    // change sync must not walk every frontend). Problems are retried at every sync.
    if (!this.healthStale && this.serviceHealthProblems.size === 0) return;
    this.healthStale = false;
    const targets = new Map<string, { namespace: string; name: string; port: number; ips: Record<4 | 6, Set<string>> }>();
    for (const k of this.healthFrontends) {
      const fe = this.model.frontends.get(k);
      if (fe?.healthCheckNodePort === undefined) continue;
      const key = `${fe.service.namespace}/${fe.service.name}`;
      let t = targets.get(key);
      if (!t) targets.set(key, (t = { namespace: fe.service.namespace, name: fe.service.name, port: fe.healthCheckNodePort, ips: { 4: new Set(), 6: new Set() } }));
      for (const b of fe.backends) t.ips[b.family].add(b.address);
    }
    const list = [...targets.values()].map((t) => ({ namespace: t.namespace, name: t.name, port: t.port, localEndpoints: Math.max(t.ips[4].size, t.ips[6].size) }));
    void sh.sync(list).then((problems) => {
      const now = new Map(problems.map((p) => [p.service, `${p.port}: ${p.reason}`]));
      for (const [service, what] of now) {
        if (this.serviceHealthProblems.get(service) !== what) this.opts.log.warn({ service, healthCheckNodePort: what }, 'healthCheckNodePort cannot be served (retried at the next sync)');
      }
      this.serviceHealthProblems = now;
    }).catch((err: unknown) => {
      this.healthStale = true;
      // A boundary: a server that fails to close must not become an unhandled rejection (it would end the agent).
      this.opts.log.error({ err: (err as Error)?.message ?? String(err) }, 'healthCheckNodePort servers could not be updated; retried at the next sync');
    });
  }

  /** Keeps healthFrontends from a flush's changes (a frontend added, changed or removed). */
  private trackHealthFrontends(changed: ReadonlySet<FrontendKey>): void {
    for (const k of changed) {
      const fe = this.model.frontends.get(k);
      if (fe && fe.healthCheckNodePort !== undefined && fe.externalLocal && fe.scope !== 'internal') {
        this.healthFrontends.add(k);
        this.healthStale = true;
      } else if (this.healthFrontends.delete(k)) {
        this.healthStale = true;
      }
    }
  }

  /** Stops everything the start began, during the start too (it ends at its next step first). */
  async stop(): Promise<void> {
    this.stopping = true;
    // First: a start waiting for its first sync stops waiting.
    this.runner.stop();
    await this.starting?.catch(() => undefined);
    this.prober?.stop();
    await this.serviceHealth?.close();
    this.nodePort?.stop();
    await this.opts.source.stop();
    await this.runner.idle();
    // A termination in progress stops at its next step; the maps it reads
    // stay open until it has.
    this.terminator?.close();
    await this.maglevPool.close();
    await this.terminator?.idle();
    this.datapath?.close();
    this.opts.log.info('agent stopped; the datapath stays attached (lbctl cleanup removes it)');
  }

  private changed(e?: SourceEvent): void {
    const now = Date.now();
    if (e) {
      this.opts.metrics?.event(e.kind, e.type);
      if (e.kind === 'Service') this.model.setService(e.id, e.object);
      else if (e.kind === 'EndpointSlice') this.model.setSlice(e.id, e.object);
      if (e.kind !== 'Node') this.probeTargetsStale = true;
      else {
        this.opts.onNode?.(e.id, e.object);
        // Only this node's Node feeds the model (a source may send every node's).
        if (this.opts.nodeName !== undefined && e.id !== this.opts.nodeName) return;
        // A Node that is gone (or never came) takes its zone along, not the node's name.
        this.model.setNode(e.object ?? this.nodeWithout());
        this.nodeGoing = e.object?.deleting ?? false;
      }
    }
    this.opts.metrics?.queued(now);
    this.stats.oldestPending ??= now;
    this.requestSync();
  }

  /** This node as known without its Node object: the name alone, no zone. */
  private nodeWithout(): Node | undefined {
    return this.opts.nodeName !== undefined ? { name: this.opts.nodeName, deleting: false } : undefined;
  }

  /**
   * Sources send a burst of events in one go (a list, a re-read directory,
   * a watch chunk): the sync is asked for once they are all in, so it sees
   * them together rather than running on the first alone.
   */
  private requestSync(): void {
    if (this.runQueued) return;
    this.runQueued = true;
    queueMicrotask(() => {
      this.runQueued = false;
      this.runner.run();
    });
  }

  private syncOnce(reason: RunReason): void {
    const snap = this.opts.source.status();
    if (!snap.synced) {
      // Like kube-proxy before its informers sync: write nothing, keep serving what the maps hold.
      this.opts.log.debug('source not synced yet: sync deferred');
      return;
    }
    const t0 = performance.now();
    const started = Date.now();
    const pendingSince = this.stats.oldestPending;
    this.stats.oldestPending = undefined;
    this.stats.inProgress = true;
    this.stats.lastAttempt = started;
    let ok = false;
    let left: readonly NotProgrammed[] = [];
    let freed = false;
    try {
      // Periodic and retry runs re-read the maps first, repairing drift.
      if (reason !== 'change') this.reconciler!.resync();
      const t1 = performance.now();
      const { changed, newSkips } = this.model.flush();
      this.trackHealthFrontends(changed);
      const t2 = performance.now();
      this.reportSkipped(newSkips);
      this.reportAllFailed();
      const desired = this.model.frontends;
      const result = this.reconciler!.sync(desired, { prune: snap.complete, changed });
      left = result.notProgrammed;
      freed = DELETES.some((kind) => (result.byKind[kind] ?? 0) > 0);
      this.reportNotProgrammed(left);
      // In the background, one termination at a time: this sync and the next do not wait for it.
      void this.terminator?.destroyRemoved(result.removedBackends, this.reconciler!.realized.backends.values())?.then((closed) => {
        if (closed) this.opts.log[closed.errors.length || closed.limit ? 'warn' : 'info'](closed, 'connected UDP sockets of removed backends destroyed');
      });
      ok = true;
      this.synced = true;
      this.syncServiceHealth();
      this.syncProbeTargets();
      this.stats.lastSuccess = Date.now();
      this.stats.lastError = undefined;
      if (pendingSince !== undefined) this.opts.metrics?.networkProgramming((Date.now() - pendingSince) / 1000);
      this.opts.metrics?.setCounts(this.counts());
      const { notProgrammed: _listed, ...counts } = result;
      const report: SyncReport = {
        ...counts,
        notProgrammed: left.length,
        reason,
        frontends: desired.size,
        pruned: snap.complete,
        durationMs: Math.round((performance.now() - t0) * 100) / 100,
        phasesMs: { resync: Math.round((t1 - t0) * 1000) / 1000, model: Math.round((t2 - t1) * 1000) / 1000, ...result.phasesMs },
      };
      if (!snap.complete) this.opts.log.warn('some input could not be read: nothing is removed until it can');
      // A periodic resync that found nothing to repair is routine: debug only.
      if (reason === 'periodic' && result.planned === 0) this.opts.log.debug(report, 'sync done');
      else this.opts.log.info(report, 'sync done');
      if (result.planned >= BIG_SYNC_OPS) this.compactHeap();
    } catch (err) {
      this.stats.lastError = (err as Error).message;
      this.stats.oldestPending ??= pendingSince ?? started;
      const map = err instanceof SyncError && err.cause instanceof BpfError ? err.cause.map : undefined;
      if (map) this.opts.metrics?.mapError(map);
      throw err;
    } finally {
      this.stats.count++;
      this.stats.inProgress = false;
      this.attempted();
      this.opts.metrics?.observeSync((performance.now() - t0) / 1000, { full: reason !== 'change', ok });
      if (this.reconciler) this.opts.metrics?.setMapPressure(this.reconciler.pressure());
    }
    if (left.length === 0) return;
    // What this sync deleted (and the ids it freed) is room the next one can
    // use at once: run it now. Otherwise retry with the runner's backoff
    // (each retry a full resync) until room appears.
    if (freed) this.requestSync();
    else throw new NotProgrammedError(left);
  }

  /**
   * Logs each frontend left out for want of room once, when it first is
   * (the first few by name, the rest summed up by map), and when the last of
   * them is programmed; counts them by map in a gauge; keeps the first few
   * for readiness and the status.
   */
  private reportNotProgrammed(list: readonly NotProgrammed[]): void {
    const { log, metrics } = this.opts;
    const before = this.notProgrammed;
    this.notProgrammed = new Map(list.map((n) => [n.frontend, n]));
    const fresh = list.filter((n) => !before.has(n.frontend));
    const more = new Map<string, number>();
    for (const [i, n] of fresh.entries()) {
      if (i < NOT_PROGRAMMED_LISTED_PER_SYNC) log.warn({ frontend: n.frontend, map: n.map, reason: n.reason }, 'frontend not programmed: no room');
      else more.set(n.map, (more.get(n.map) ?? 0) + 1);
    }
    for (const [map, count] of more) log.warn({ map, count }, `${count} more frontends not programmed for want of room in ${map} (not listed one by one)`);
    if (before.size > 0 && list.length === 0) log.info({ frontends: before.size }, 'every frontend left out for want of room is programmed now');
    const byMap: Record<string, number> = {};
    for (const n of list) byMap[n.map] = (byMap[n.map] ?? 0) + 1;
    metrics?.setNotProgrammed(byMap);
    this.stats.notProgrammed = list.length > 0 ? { count: list.length, first: list.slice(0, NOT_PROGRAMMED_SHOWN) } : undefined;
  }

  /**
   * A full collection after a big sync, so the node gets the memory back
   * (bin/lbctl runs node with --expose-gc; without it this does nothing).
   * A second later, not at once: a collection right after the first sync at
   * 10,000 services left ~18 MiB of Buffers (external memory) that one a
   * second later freed, and RSS at the bench's sample fell from 161 to 143
   * MiB (docs/benchmarks.md, "Memory").
   */
  private compactHeap(): void {
    const gc = (globalThis as { gc?: () => void }).gc;
    if (gc) setTimeout(gc, 1000).unref();
  }

  /**
   * Logs and counts a skip once, when it first appears. A sync that finds
   * many (a file of a thousand services on one address) logs the first few
   * and sums up the rest by reason: every one is counted.
   */
  private reportSkipped(skipped: readonly Skipped[]): void {
    const more = new Map<Skipped['reason'], number>();
    for (const [i, s] of skipped.entries()) {
      this.opts.metrics?.skipped('Service', s.reason);
      if (i < SKIPS_LISTED_PER_SYNC) this.opts.log.info({ service: s.service, reason: s.reason, detail: s.detail }, 'service skipped');
      else more.set(s.reason, (more.get(s.reason) ?? 0) + 1);
    }
    for (const [reason, count] of more) this.opts.log.info({ reason, count }, `${count} more services skipped for the same reason (not listed one by one)`);
  }

  // ------------------------------------------------------- readiness probes

  /**
   * After a sync that followed a Service or EndpointSlice change: the
   * prober's targets (every endpoint address of every service with a probe;
   * a backend several services probe alike is one worker). A backend gone
   * stops its worker, a changed probe replaces it (back to unknown).
   */
  private syncProbeTargets(): void {
    const prober = this.prober;
    if (!prober || !this.probeTargetsStale) return;
    this.probeTargetsStale = false;
    const { targets, unresolved } = this.model.probeTargets();
    const keys = prober.setTargets(targets.map((x) => x.target));
    const probeKeys = new Map<string, string[]>();
    const servicesOfKey = new Map<string, ServiceId[]>();
    const services = new Set<string>();
    for (const [i, x] of targets.entries()) {
      const key = keys[i]!;
      const id = `${x.service}|${x.target.address}`;
      const list = probeKeys.get(id);
      if (list) list.push(key);
      else probeKeys.set(id, [key]);
      const svcs = servicesOfKey.get(key);
      if (!svcs) servicesOfKey.set(key, [x.service]);
      else if (!svcs.includes(x.service)) svcs.push(x.service);
      services.add(x.service);
    }
    this.probeKeys = probeKeys;
    this.servicesOfKey = servicesOfKey;
    this.opts.metrics?.setProbedServices(services);
    const now = new Set(unresolved.map((u) => `${u.service}|${u.detail}`));
    for (const u of unresolved) {
      if (!this.probeUnresolved.has(`${u.service}|${u.detail}`)) this.opts.log.warn({ service: u.service, detail: u.detail }, 'readiness probe cannot be aimed: those endpoints are served as their conditions say');
    }
    this.probeUnresolved = now;
    this.applyProbeStates();
  }

  /** A worker's state changed: one log line, and the model gets the new quarantine. */
  private probeChanged(target: { readonly key: string; readonly address: string; readonly port: number }, state: ProbeState, previous: ProbeState): void {
    const services = this.servicesOfKey.get(target.key) ?? [];
    const last = this.prober?.worker(target.key)?.last;
    const fields = { services, backend: target.address, port: target.port, state, previous, ...(last?.reason !== undefined ? { last: last.reason } : {}) };
    if (state === 'quarantined') this.opts.log.warn(fields, 'backend quarantined: its readiness probe failed (new connections avoid it; established ones keep it)');
    else this.opts.log.info(fields, previous === 'quarantined' ? 'backend passes its readiness probe again: selectable' : 'backend passes its readiness probe');
    this.applyProbeStates();
  }

  /** The quarantined addresses of each service, from the workers' states, into the model; a sync when that changed. */
  private applyProbeStates(): void {
    const prober = this.prober;
    if (!prober) return;
    const quarantined = new Map<ServiceId, Set<string>>();
    for (const [id, keys] of this.probeKeys) {
      if (!keys.some((k) => prober.state(k) === 'quarantined')) continue;
      const bar = id.lastIndexOf('|');
      const service = id.slice(0, bar);
      let set = quarantined.get(service);
      if (!set) quarantined.set(service, (set = new Set()));
      set.add(id.slice(bar + 1));
    }
    const counts = { unknown: 0, healthy: 0, quarantined: 0 };
    for (const key of this.servicesOfKey.keys()) {
      const st = prober.state(key);
      if (st) counts[st]++;
    }
    this.opts.metrics?.setProbeBackends(counts);
    if (this.model.setQuarantined(quarantined)) {
      this.opts.metrics?.queued(Date.now());
      this.stats.oldestPending ??= Date.now();
      this.requestSync();
    }
  }

  /** One log line and a count each time a service gets every backend quarantined, and when it no longer has. */
  private reportAllFailed(): void {
    if (!this.prober) return;
    const policy = this.model.allFailedPolicy;
    const now = this.model.allFailedServices;
    for (const service of now) {
      if (this.allFailedLogged.has(service)) continue;
      this.opts.metrics?.probeAllFailedEvent(policy);
      if (policy === 'open') this.opts.log.warn({ service, policy }, 'every backend of the service failed its readiness probe: serving them all (--probe-all-failed open)');
      else this.opts.log.error({ service, policy }, 'every backend of the service failed its readiness probe: refusing new connections (--probe-all-failed closed)');
    }
    for (const service of this.allFailedLogged) {
      if (!now.has(service)) this.opts.log.info({ service, policy }, 'a backend of the service passes its readiness probe again (or the service changed): no longer all failed');
    }
    this.allFailedLogged = new Set(now);
    this.opts.metrics?.setProbeAllFailed(policy, now.size);
  }

  /** Each backend address's probe for one service (undefined: the service has no probe). */
  backendProbes(service: ServiceId): Map<string, BackendProbe> | undefined {
    const prober = this.prober;
    if (!prober || !this.model.hasProbe(service)) return undefined;
    const out = new Map<string, BackendProbe>();
    const prefix = `${service}|`;
    for (const [id, keys] of this.probeKeys) {
      if (!id.startsWith(prefix)) continue;
      // Several probes of one address (a named port that differs by slice): the worst state shows.
      const rank = { quarantined: 2, unknown: 1, healthy: 0 } as const;
      let best: BackendProbe | undefined;
      for (const k of keys) {
        const w = prober.worker(k);
        if (!w) continue;
        if (!best || rank[w.state] > rank[best.state]) best = { state: w.state, consecutive: w.consecutive, ...(w.last ? { last: w.last } : {}) };
      }
      if (best) out.set(id.slice(prefix.length), best);
    }
    return out;
  }

  /** The prober's pool: probes in flight and queued, and workers (for status and tests). */
  probeStatus(): { readonly inFlight: number; readonly queued: number; readonly workers: number } | undefined {
    if (!this.prober) return undefined;
    const st = this.prober.status();
    return { inFlight: st.inFlight, queued: st.queued, workers: st.workers.length };
  }

  // ---------------------------------------------------------------- AgentView

  sourceSynced(): boolean {
    return this.opts.source.status().synced;
  }

  desiredApplied(): boolean {
    return (
      this.synced &&
      this.stats.lastError === undefined &&
      this.stats.oldestPending === undefined &&
      this.stats.notProgrammed === undefined &&
      !this.stats.inProgress
    );
  }

  datapathAttached(): CheckOutcome {
    if (!this.datapath) return { ok: false, message: 'datapath not loaded yet' };
    const missing: string[] = [];
    for (const p of this.datapath.programs) {
      try {
        const link = pinnedLinkInfo(path.join(linksDir(this.opts.datapath.bpfRoot), p.name));
        if (link.progId !== this.datapath.object.progInfo(p.name).id) missing.push(`${p.name} (link runs another program)`);
      } catch (err) {
        missing.push(`${p.name} (${(err as Error).message})`);
      }
    }
    return missing.length === 0 ? { ok: true, message: `${this.datapath.programs.length} programs attached` } : { ok: false, message: missing.join('; ') };
  }

  canaryWrite(): CheckOutcome {
    if (!this.reconciler) return { ok: false, message: 'datapath not loaded yet' };
    try {
      this.reconciler.probeWrite();
      return { ok: true };
    } catch (err) {
      return { ok: false, message: (err as Error).message };
    }
  }

  sync(): SyncStats {
    return { ...this.stats };
  }

  nodeDeleting(): boolean {
    return this.nodeGoing;
  }

  frontends(): FrontendStatus[] {
    if (!this.datapath) return [];
    const out = frontendStatuses(this.model.frontends.values(), (fe) => this.reconciler?.revNatIds[fe.family].get(fe.key) ?? 0, this.datapath.maps.dump(), this.nodePort !== undefined);
    if (!this.prober) return out;
    const byService = new Map<ServiceId, Map<string, BackendProbe> | undefined>();
    const allFailed = this.model.allFailedServices;
    return out.map((st) => {
      const fe = this.model.frontends.get(st.frontend as never);
      if (!fe) return st;
      const id = `${fe.service.namespace}/${fe.service.name}`;
      if (!byService.has(id)) byService.set(id, this.backendProbes(id));
      const probes = byService.get(id);
      if (!probes) return st;
      const addresses = [...new Set([...fe.backends, ...fe.terminating].map((b) => b.address))];
      return {
        ...st,
        probes: addresses.map((address) => {
          const p = probes.get(address);
          const last = p?.last && { ok: p.last.ok, ...(p.last.reason !== undefined ? { reason: p.last.reason } : {}), at: new Date(p.last.at).toISOString(), latencyMs: p.last.latencyMs };
          return { address, state: p?.state ?? 'unknown', consecutive: p?.consecutive ?? 0, ...(last ? { last } : {}) };
        }),
        ...(allFailed.has(id) ? { probeAllFailed: this.model.allFailedPolicy } : {}),
      };
    });
  }

  datapathCounters(): Record<string, bigint> {
    return this.datapath ? sumCounters(this.datapath.object.map('lb_metrics')) : {};
  }

  mapPressure(): ReadonlyArray<{ readonly map: string; readonly entries: number; readonly maxEntries: number }> {
    return this.reconciler?.pressure() ?? [];
  }

  counts(): { services: number; frontends: number; backends: number } {
    // Every sync sets these gauges: each is kept as a count, nothing is walked.
    // Backends are unique per address, port and protocol in the maps (one id each).
    return { services: this.model.serviceCount, frontends: this.model.frontends.size, backends: this.reconciler?.realized.backends.size ?? 0 };
  }

  kernel(): KernelStatus | undefined {
    if (!this.features) return undefined;
    const nodePort: KernelStatus['nodePort'] = !this.opts.nodePort
      ? { state: 'off' }
      : this.nodePortError !== undefined || !this.nodePort
        ? { state: 'failed', error: this.nodePortError ?? 'not started' }
        : {
            state: 'serving',
            ...this.nodePort.view(),
            forwarding: this.opts.nodePort.settings.mode ?? 'snat',
            maglev: {
              m: this.opts.nodePort.settings.maglev.m,
              tables: this.reconciler?.realized.maglev.size ?? 0,
              bytes: this.nodePort.datapath.northSouthMaps.maglev.kernelMemory().bytes,
            },
          };
    return {
      release: this.features.kernel,
      features: this.features.results.map(({ name, required, available, since, detail }) => ({ name, required, available, since, detail })),
      object: this.datapath?.variant ?? 'not loaded',
      udpTermination: this.terminator?.mechanism ?? 'not probed',
      nodePort,
      sctp: sctpStatus(nodePort.state),
    };
  }

  source(): { name: string; notes: readonly string[] } {
    return { name: this.opts.source.name, notes: this.opts.source.status().notes ?? [] };
  }

}
