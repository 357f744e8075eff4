// What every source (a directory of manifests, the Kubernetes API) hands the
// agent: the current objects, already validated, and whether that set is
// complete enough to remove what it no longer names.
import type { EndpointSlice, Node, Service } from '../model/k8s.js';

export interface SourceSnapshot {
  readonly services: readonly Service[];
  readonly slices: readonly EndpointSlice[];
  /** This node, when the source knows it (the Kubernetes source). */
  readonly node?: Node;
  /**
   * The initial state has arrived (every informer listed, the files read).
   * Until then the agent writes nothing: the maps keep serving what they hold.
   */
  readonly synced: boolean;
  /** False while some input could not be read at all: the agent then adds and updates but removes nothing. */
  readonly complete: boolean;
}

/** One object event, for metrics; the file source reports whole re-reads without one. */
export interface SourceEvent {
  readonly kind: 'Service' | 'EndpointSlice' | 'Node';
  readonly type: 'add' | 'update' | 'delete';
}

/** A bad input, named precisely enough to find and fix. */
export interface Problem {
  readonly where: string;
  readonly reason: string;
}

export interface Source {
  readonly name: string;
  /** Reads the initial state; `onChange` fires (coalescing is the caller's job) whenever it changes. */
  start(onChange: (event?: SourceEvent) => void): Promise<void>;
  snapshot(): SourceSnapshot;
  /** Problems in the current input, replaced on every re-read. */
  problems(): readonly Problem[];
  stop(): Promise<void>;
}
