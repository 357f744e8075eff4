// What the agent shows of itself to its health checks, metrics and local
// API (health.ts, metrics.ts, api.ts). The agent implements it; the servers
// only read it, so each can be tested against a fake.
import type { SctpStatus } from '../datapath/sctp.js';

export interface SyncStats {
  /** Syncs completed (successful or not). */
  readonly count: number;
  /** Epoch ms of the last sync start / successful end; undefined before the first. */
  readonly lastAttempt?: number;
  readonly lastSuccess?: number;
  /** The last failure's message, cleared by a success. */
  readonly lastError?: string;
  /** Epoch ms of the oldest change not yet in the maps; undefined when none waits. */
  readonly oldestPending?: number;
  readonly inProgress: boolean;
  /**
   * Frontends the last sync could not program for want of room (a full map,
   * or ids out): how many, and the first few by name. Undefined when none.
   */
  readonly notProgrammed?: {
    readonly count: number;
    readonly first: ReadonlyArray<{ readonly frontend: string; readonly map: string; readonly reason: string }>;
  };
}

/** One frontend: what the agent intends versus what the maps hold. */
export interface FrontendStatus {
  /** "10.96.0.10:53/UDP" */
  readonly frontend: string;
  /** "namespace/name:portName" of the owning service; undefined for entries the agent does not intend. */
  readonly service?: string;
  readonly desired?: {
    readonly backends: readonly string[];
    readonly terminating: readonly string[];
    readonly revNatId: number;
    /** Those of `terminating` that a readiness probe quarantined (absent when none). */
    readonly quarantined?: readonly string[];
  };
  /** What the maps hold, split by the maps' own master count (what the programs select from). */
  readonly realized?: { readonly backends: readonly string[]; readonly terminating: readonly string[]; readonly revNatId: number };
  /** True when the maps disagree with the intent in anything the programs read (src/agent/drift.ts). */
  readonly drift: boolean;
  /** What differs, in words; empty when in sync. */
  readonly details: readonly string[];
  /**
   * The service's readiness probe per backend (standalone mode, issue 17):
   * absent when the service has none. `address` is the backend's IP (a
   * probe judges the endpoint, every port of it).
   */
  readonly probes?: ReadonlyArray<{
    readonly address: string;
    readonly state: 'unknown' | 'healthy' | 'quarantined';
    /** Results in a row equal to the last one (kubelet's resultRun). */
    readonly consecutive: number;
    readonly last?: { readonly ok: boolean; readonly reason?: string; readonly at: string; readonly latencyMs: number };
  }>;
  /** Every backend of the service is quarantined, and what --probe-all-failed did: open (all served) or closed (none). */
  readonly probeAllFailed?: 'open' | 'closed';
}

/** The kernel as the agent found it at start (src/datapath/features.ts). */
export interface KernelStatus {
  /** uname -r */
  readonly release: string;
  readonly features: ReadonlyArray<{ readonly name: string; readonly required: boolean; readonly available: boolean; readonly since: string; readonly detail: string }>;
  /** The datapath object loaded: standard (sock.bpf.o), compat (sock_compat.bpf.o) or custom (--object). */
  readonly object: string;
  /** How stale connected UDP sockets are destroyed: bpf-sock-destroy, inet-diag or none. */
  readonly udpTermination: string;
  /** The tc datapath (NodePort, LoadBalancer, external IPs): off, its error, or what it serves. */
  readonly nodePort?: {
    readonly state: 'off' | 'failed' | 'serving';
    readonly error?: string;
    /** tcx or clsact, and why (--tc-attach, and with auto what the kernel has). */
    readonly mode?: string;
    readonly modeReason?: string;
    /** --nodeport-mode: snat, dsr or hybrid. */
    readonly forwarding?: string;
    /** role: a front door ('nodeport') or an overlay's device ('tunnel'); snat: the source SNATed flows leave it with, per family. */
    readonly devices?: ReadonlyArray<{ readonly name: string; readonly index: number; readonly role?: string; readonly addresses: readonly string[]; readonly snat?: readonly string[]; readonly l3?: boolean; readonly xdp?: boolean }>;
    /** --nodeport-acceleration (native or best-effort); absent: disabled. */
    readonly acceleration?: string;
    readonly nodeAddresses?: readonly string[];
    readonly waiting?: readonly string[];
    readonly problems?: readonly string[];
    /** The flows' and SNAT maps' fill: live entries against max_entries. */
    readonly traffic?: ReadonlyArray<{ readonly map: string; readonly entries: number; readonly maxEntries: number }>;
    /** Maglev tables in the kernel: slots each, how many, and the kernel memory of the chunks that hold them. */
    readonly maglev?: { readonly m: number; readonly tables: number; readonly bytes: number };
  };
  /** What SCTP frontends get on this node, and why not (src/datapath/sctp.ts). */
  readonly sctp?: SctpStatus;
}

export interface CheckOutcome {
  readonly ok: boolean;
  /** Why it failed (or a short fact when it passed). */
  readonly message?: string;
}

export interface AgentView {
  /** Epoch ms the agent started. */
  readonly startedAt: number;
  /** The source has delivered a complete initial state (informers synced / files read). */
  sourceSynced(): boolean;
  /** Every change seen so far is in the maps, the last sync succeeded and left no frontend out for want of room. */
  desiredApplied(): boolean;
  /** Every program is attached through its pinned link. */
  datapathAttached(): CheckOutcome;
  /**
   * A write to a pinned map that changes nothing the datapath reads
   * (Reconciler.probeWrite): proves the kernel takes the agent's map writes.
   * Never fails for want of room: a full map is readiness' and the
   * pressure metric's matter, not a reason to restart.
   */
  canaryWrite(): CheckOutcome;
  sync(): SyncStats;
  /** This node's Node object has a deletionTimestamp. */
  nodeDeleting(): boolean;
  /** Desired versus realized, per frontend (reads the maps: not for hot paths). */
  frontends(): FrontendStatus[];
  /** The datapath's per-CPU counters, summed (lb_metrics). */
  datapathCounters(): Record<string, bigint>;
  /** Each map the agent writes: entries in use (its realized state) and max_entries. */
  mapPressure(): ReadonlyArray<{ readonly map: string; readonly entries: number; readonly maxEntries: number }>;
  /** Counts of what is programmed now. */
  counts(): { readonly services: number; readonly frontends: number; readonly backends: number };
  /** What the start's probe found this kernel can do, and which object and mechanisms that chose. */
  kernel(): KernelStatus | undefined;
  /** The source's name and what it says of its state (SourceStatus.notes). */
  source(): { readonly name: string; readonly notes: readonly string[] };
}
