// The agent's lifecycle: load or adopt the datapath, restore ids and state
// from the pinned maps, read the source, and apply each change as one sync:
// snapshot → model → plan → ordered map writes. Stopping leaves the datapath
// running from its pinned links and maps; only `lbctl cleanup` removes it.
import type { Logger } from 'pino';
import { loadDatapath, type Datapath, type DatapathOptions } from '../datapath/loader.js';
import { desiredState } from '../model/from-k8s.js';
import { Reconciler, SyncError, type SyncResult } from '../reconcile/reconciler.js';
import type { Source } from '../sources/source.js';
import { CoalescingRunner } from './runner.js';

export interface AgentOptions {
  readonly source: Source;
  readonly datapath: DatapathOptions;
  readonly log: Logger;
}

export interface SyncReport extends SyncResult {
  readonly frontends: number;
  readonly pruned: boolean;
  readonly durationMs: number;
}

export class Agent {
  private datapath: Datapath | undefined;
  private reconciler: Reconciler | undefined;
  private readonly runner: CoalescingRunner;
  private syncs = 0;

  constructor(private readonly opts: AgentOptions) {
    this.runner = new CoalescingRunner(() => this.syncOnce(), {
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
    for (const p of this.datapath.programs) {
      log.info({ program: p.name, linkId: p.linkId, updated: p.updated }, p.updated ? 'program replaced on pinned link' : 'program attached');
    }
    this.reconciler = new Reconciler(this.datapath.maps);
    const restored = this.reconciler.restore();
    log.info({ ...restored, bpfRoot: this.opts.datapath.bpfRoot, cgroup: this.opts.datapath.cgroup }, 'datapath ready; state restored from pinned maps');

    await this.opts.source.start(() => this.runner.run());
    this.runner.run();
    await this.runner.idle();
  }

  /** Resolves once every change seen so far is in the maps (or has failed and awaits retry). */
  settled(): Promise<void> {
    return this.runner.idle();
  }

  async stop(): Promise<void> {
    this.runner.stop();
    await this.opts.source.stop();
    await this.runner.idle();
    this.datapath?.close();
    this.opts.log.info('agent stopped; the datapath stays attached (lbctl cleanup removes it)');
  }

  private syncOnce(): void {
    const t0 = performance.now();
    const snap = this.opts.source.snapshot();
    const model = desiredState(snap);
    for (const s of model.skipped) {
      if (this.syncs === 0 || s.reason === 'conflict') this.opts.log.info({ service: s.service, reason: s.reason, detail: s.detail }, 'service skipped');
    }
    const result = this.reconciler!.sync(model.frontends, { prune: snap.complete });
    this.syncs++;
    const report: SyncReport = {
      ...result,
      frontends: model.frontends.size,
      pruned: snap.complete,
      durationMs: Math.round((performance.now() - t0) * 100) / 100,
    };
    if (!snap.complete) this.opts.log.warn('some manifests could not be read: nothing is removed until they parse');
    this.opts.log.info(report, 'sync done');
  }
}
