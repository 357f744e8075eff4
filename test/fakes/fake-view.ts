// An AgentView whose every answer is a field the test sets; counts calls to
// the checks that touch the datapath.
import type { AgentView, CheckOutcome, FrontendStatus, KernelStatus, SyncStats } from '../../src/http/view.js';

export class FakeView implements AgentView {
  startedAt = Date.now();
  synced = true;
  applied = true;
  attached: CheckOutcome = { ok: true };
  canary: CheckOutcome = { ok: true };
  stats: SyncStats = { count: 1, lastAttempt: Date.now(), lastSuccess: Date.now(), inProgress: false };
  deleting = false;
  fes: FrontendStatus[] = [];
  counters: Record<string, bigint> = {};
  programmed = { services: 0, frontends: 0, backends: 0 };
  /** When set, every method throws it (the maps are gone, say). */
  throws: Error | undefined;
  canaryWrites = 0;

  private guard(): void {
    if (this.throws) throw this.throws;
  }
  sourceSynced(): boolean {
    this.guard();
    return this.synced;
  }
  desiredApplied(): boolean {
    this.guard();
    return this.applied;
  }
  datapathAttached(): CheckOutcome {
    this.guard();
    return this.attached;
  }
  canaryWrite(): CheckOutcome {
    this.guard();
    this.canaryWrites++;
    return this.canary;
  }
  sync(): SyncStats {
    return this.stats;
  }
  nodeDeleting(): boolean {
    this.guard();
    return this.deleting;
  }
  frontends(): FrontendStatus[] {
    this.guard();
    return this.fes;
  }
  datapathCounters(): Record<string, bigint> {
    this.guard();
    return this.counters;
  }
  maps: Array<{ map: string; entries: number; maxEntries: number }> = [];
  mapPressure(): Array<{ map: string; entries: number; maxEntries: number }> {
    return this.maps;
  }
  counts(): { services: number; frontends: number; backends: number } {
    return this.programmed;
  }
  kernelState: KernelStatus | undefined = undefined;
  kernel(): KernelStatus | undefined {
    return this.kernelState;
  }
  sourceState = { name: 'file:/etc/lbctl/manifests', notes: [] as string[] };
  source(): { name: string; notes: readonly string[] } {
    return this.sourceState;
  }
}
