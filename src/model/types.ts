// Desired state: what the datapath should hold, in lbctl's own terms. Pure
// data; no byte layouts (those live in datapath/abi.gen.ts).

import type { Backend, FrontendKey, L3n4Addr, ServiceType } from '../lb/types.js';

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
}

export type DesiredState = ReadonlyMap<FrontendKey, Frontend>;
