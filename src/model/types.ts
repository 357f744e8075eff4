// Desired state: what the datapath should hold, in lbctl's own terms. Pure
// data; no byte layouts (those live in datapath/abi.gen.ts).

import type { Backend, FrontendKey, L3n4Addr, Scope, ServiceType } from '../lb/types.js';
import type { SourceRange } from './north-south.js';

/** Where a frontend came from, for listings and error messages. */
export interface ServiceRef {
  readonly namespace: string;
  readonly name: string;
  readonly portName: string;
}

export interface Frontend extends L3n4Addr {
  readonly key: FrontendKey;
  readonly type: ServiceType;
  readonly service: ServiceRef;
  /** Selectable backends (slots 1..count), deduplicated and sorted. */
  readonly backends: readonly Backend[];
  /**
   * Terminating backends that new connections must not pick (slots after
   * count), kept so established flows keep their backend.
   */
  readonly terminating: readonly Backend[];
  /** sessionAffinity ClientIP timeout in seconds; 0 without affinity. */
  readonly affinityTimeout: number;
  /** internalTrafficPolicy Local: only this node's endpoints. */
  readonly localOnly: boolean;
  /**
   * Absent: the external entry, the one every frontend has. 'internal': the
   * twin of an externalLocal frontend (same address, port and protocol),
   * for clients on this node, with the backends the internal traffic policy
   * picks.
   */
  readonly scope?: Scope;
  /**
   * externalTrafficPolicy Local, on the NodePort, LoadBalancer and
   * ExternalIP frontends of such a service (their external entry holds only
   * this node's backends; each has an internal twin). False for ClusterIP
   * frontends.
   */
  readonly externalLocal: boolean;
  /** loadBalancerSourceRanges, on LoadBalancer frontends; empty: every client. */
  readonly sourceRanges: readonly SourceRange[];
  /**
   * The tc datapath picks this frontend's backends from a Maglev table
   * (NodePort, LoadBalancer and ExternalIP frontends' external entries,
   * unless the service asks for random).
   */
  readonly maglev: boolean;
  /** The service's healthCheckNodePort (LoadBalancer, externalTrafficPolicy Local), on its NodePort, LoadBalancer and ExternalIP frontends. */
  readonly healthCheckNodePort?: number;
}

export type DesiredState = ReadonlyMap<FrontendKey, Frontend>;
