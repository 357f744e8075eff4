// What every source (a directory of manifests, the Kubernetes API) hands the
// agent: each object change, already validated, and whether what it has
// sent is complete enough to remove what it no longer names.
import type { EndpointSlice, Node, Service } from '../model/k8s.js';

export interface SourceStatus {
  /**
   * The initial state has arrived (every informer listed, the files read).
   * Until then the agent writes nothing: the maps keep serving what they hold.
   */
  readonly synced: boolean;
  /** False while some input could not be read at all: the agent then adds and updates but removes nothing. */
  readonly complete: boolean;
  /**
   * What an operator should know about the source's state that no check
   * fails for (e.g. serving without this node's Node): shown by `lbctl status`.
   */
  readonly notes?: readonly string[];
}

/**
 * One object's change, with the object as it now is (validated), or none
 * when it is gone. `id` is namespace/name (a Node: its name). Sources send
 * one event per object that changed, so the agent's model recomputes only
 * what an event touches.
 */
export type SourceEvent =
  | { readonly kind: 'Service'; readonly type: EventType; readonly id: string; readonly object?: Service }
  | { readonly kind: 'EndpointSlice'; readonly type: EventType; readonly id: string; readonly object?: EndpointSlice }
  | { readonly kind: 'Node'; readonly type: EventType; readonly id: string; readonly object?: Node };

export type EventType = 'add' | 'update' | 'delete';

/**
 * What kind of bad input a problem is (the `reason` label of
 * lbctl_skipped_objects_total: a fixed set, the text goes to the log).
 */
export type ProblemCategory =
  /** An object that fails validation. */
  | 'invalid'
  /** Input beyond one of the limits (src/sources/limits.ts). */
  | 'limit'
  /** Text that is not YAML or JSON. */
  | 'parse'
  /** A file or directory that cannot be read, a watch stream that broke. */
  | 'read'
  /** The same object defined twice. */
  | 'duplicate'
  /** An exception while reading the object, turned into a report at the boundary. */
  | 'error';

/** A bad input, named precisely enough to find and fix. */
export interface Problem {
  /** File and document index, or the API resource. */
  readonly where: string;
  readonly reason: string;
  readonly category: ProblemCategory;
  /** The object's kind, when known ("Service", "EndpointSlice", "Node"). */
  readonly kind?: string;
  /** "Kind namespace/name" of the object, when known. */
  readonly object?: string;
  /**
   * How many bad inputs this report stands for (default 1): past the first
   * few of one file, problems are summed up by category in one report
   * rather than logged one by one.
   */
  readonly count?: number;
}

export interface Source {
  readonly name: string;
  /**
   * Reads the initial state. `onChange` gets every object change, and a call
   * without an event when only the status changed; coalescing is the caller's job.
   * Bad input goes to the source's own onProblem option, once, when found:
   * the agent logs and counts it.
   */
  start(onChange: (event?: SourceEvent) => void): Promise<void>;
  status(): SourceStatus;
  stop(): Promise<void>;
}
