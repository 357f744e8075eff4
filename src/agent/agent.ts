// The agent's lifecycle: load or adopt the datapath, restore ids and state
// from the pinned maps, read the source, and apply changes as syncs:
// snapshot → model → plan → ordered map writes, batched by a
// bounded-frequency runner. Stopping leaves the datapath running from its
// pinned links and maps; only `lbctl cleanup` removes it.
//
// The agent is also the AgentView its health checks, metrics and local API
// read (view.ts).
import path from 'node:path';
import type { Logger } from 'pino';
import { sumCounters } from '../datapath/counters.js';
import { linksDir, loadDatapath, type Datapath, type DatapathOptions } from '../datapath/loader.js';
import { UdpTerminator } from '../datapath/terminate.js';
import { BpfError, pinnedLinkInfo } from '../native/bpf.js';
import { DesiredModel } from '../model/desired.js';
import type { Skipped } from '../model/from-k8s.js';
import type { Node } from '../model/k8s.js';
import { frontendStatuses } from './drift.js';
import { Reconciler, SyncError, type SyncResult } from '../reconcile/reconciler.js';
import type { Source, SourceEvent } from '../sources/source.js';
import type { AgentMetrics } from './metrics.js';
import { BoundedFrequencyRunner, type RunReason } from './runner.js';
import type { AgentView, CheckOutcome, FrontendStatus, SyncStats } from './view.js';

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
}

export interface SyncReport extends Omit<SyncResult, 'phasesMs'> {
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

export class Agent implements AgentView {
  readonly startedAt = Date.now();
  private datapath: Datapath | undefined;
  private reconciler: Reconciler | undefined;
  private terminator: UdpTerminator | undefined;
  private readonly runner: BoundedFrequencyRunner;
  /** The desired state, kept up to date event by event (kube-proxy's change trackers). */
  private readonly model = new DesiredModel();
  private stats: { -readonly [K in keyof SyncStats]: SyncStats[K] } = { count: 0, inProgress: false };
  private synced = false;
  private nodeGoing = false;
  private runQueued = false;

  constructor(private readonly opts: AgentOptions) {
    this.model.setNode(this.nodeWithout());
    this.runner = new BoundedFrequencyRunner((reason) => this.syncOnce(reason), {
      minIntervalMs: opts.minSyncPeriodMs ?? 0,
      maxIntervalMs: opts.syncPeriodMs ?? 30_000,
      onError: (err, retryInMs) =>
        opts.log.error({ err: err instanceof SyncError ? err.message : err, retryInMs }, 'sync failed; the maps keep their last good state'),
    });
  }

  async start(): Promise<void> {
    const { log } = this.opts;
    this.datapath = await loadDatapath(this.opts.datapath);
    if (this.datapath.variant === 'compat') {
      log.warn('this kernel has no bpf_set_retval (before 5.18): refused connections fail with EPERM instead of ECONNREFUSED');
    }
    for (const m of this.datapath.migrated) {
      if (m.converted) log.info(m, 'map layout changed: entries converted field by field, links switched');
      else if (m.from !== m.to) log.info(m, 'map resized: entries carried over, links switched');
    }
    for (const p of this.datapath.programs) {
      log.info({ program: p.name, linkId: p.linkId, updated: p.updated }, p.updated ? 'program replaced on pinned link' : 'program attached');
    }
    this.reconciler = new Reconciler(this.datapath.maps);
    const restored = this.reconciler.restore();
    log.info({ ...restored, bpfRoot: this.opts.datapath.bpfRoot, cgroup: this.opts.datapath.cgroup }, 'datapath ready; state restored from pinned maps');
    const revNat = { 4: this.datapath.object.map('lb4_sock_revnat'), 6: this.datapath.object.map('lb6_sock_revnat') };
    this.terminator = await UdpTerminator.open({ revNat, cgroup: this.opts.datapath.cgroup });
    log.info(this.terminator.detection, `stale connected UDP sockets of removed backends: ${this.terminator.mechanism}`);

    await this.opts.source.start((e) => this.changed(e));
    // The first sync: the one the source's first events asked for, or one
    // now (a source still listing defers it; the maps keep serving).
    if (this.stats.count === 0) this.requestSync();
    await new Promise((resolve) => setImmediate(resolve));
    await this.runner.idle();
  }


  async stop(): Promise<void> {
    this.runner.stop();
    await this.opts.source.stop();
    await this.runner.idle();
    this.terminator?.close();
    this.datapath?.close();
    this.opts.log.info('agent stopped; the datapath stays attached (lbctl cleanup removes it)');
  }

  private changed(e?: SourceEvent): void {
    const now = Date.now();
    if (e) {
      this.opts.metrics?.event(e.kind, e.type);
      if (e.kind === 'Service') this.model.setService(e.id, e.object);
      else if (e.kind === 'EndpointSlice') this.model.setSlice(e.id, e.object);
      else {
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
    try {
      // Periodic and retry runs re-read the maps first, repairing drift.
      if (reason !== 'change') this.reconciler!.resync();
      const t1 = performance.now();
      const { changed, newSkips } = this.model.flush();
      const t2 = performance.now();
      this.reportSkipped(newSkips);
      const desired = this.model.frontends;
      const result = this.reconciler!.sync(desired, { prune: snap.complete, changed });
      // In the background, one termination at a time: this sync and the next do not wait for it.
      void this.terminator?.destroyRemoved(result.removedBackends, this.reconciler!.realized.backends.values())?.then((closed) => {
        if (closed) this.opts.log[closed.errors.length || closed.limit ? 'warn' : 'info'](closed, 'connected UDP sockets of removed backends destroyed');
      });
      ok = true;
      this.synced = true;
      this.stats.lastSuccess = Date.now();
      this.stats.lastError = undefined;
      if (pendingSince !== undefined) this.opts.metrics?.networkProgramming((Date.now() - pendingSince) / 1000);
      this.opts.metrics?.setCounts(this.counts());
      const report: SyncReport = {
        ...result,
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
      this.opts.metrics?.observeSync((performance.now() - t0) / 1000, { full: reason !== 'change', ok });
    }
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

  // ---------------------------------------------------------------- AgentView

  sourceSynced(): boolean {
    return this.opts.source.status().synced;
  }

  desiredApplied(): boolean {
    return this.synced && this.stats.lastError === undefined && this.stats.oldestPending === undefined && !this.stats.inProgress;
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
    return frontendStatuses(this.model.frontends.values(), (fe) => this.reconciler?.revNatIds[fe.family].get(fe.key) ?? 0, this.datapath.maps.dump());
  }

  datapathCounters(): Record<string, bigint> {
    return this.datapath ? sumCounters(this.datapath.object.map('lb_metrics')) : {};
  }

  counts(): { services: number; frontends: number; backends: number } {
    // Every sync sets these gauges: each is kept as a count, nothing is walked.
    // Backends are unique per address, port and protocol in the maps (one id each).
    return { services: this.model.serviceCount, frontends: this.model.frontends.size, backends: this.reconciler?.realized.backends.size ?? 0 };
  }

}
