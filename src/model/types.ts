// Desired state: what the datapath should hold, in lbctl's own terms. Pure
// data; no byte layouts (those live in datapath/abi.gen.ts).

export type Protocol = 'TCP' | 'UDP';
export type Family = 4 | 6;
export type ServiceType = 'ClusterIP' | 'NodePort' | 'ExternalIP' | 'LoadBalancer';
export type BackendState = 'active' | 'terminating' | 'quarantined';

/** "10.96.0.10:53/UDP" or "[fd00::a]:80/TCP": the identity of a frontend. */
export type FrontendKey = string & { readonly __brand: 'FrontendKey' };
/** Same shape as FrontendKey, for a backend address. */
export type BackendKey = string & { readonly __brand: 'BackendKey' };

export interface L3n4Addr {
  /** Canonical text form (RFC 5952 for IPv6). */
  readonly address: string;
  readonly family: Family;
  readonly port: number;
  readonly protocol: Protocol;
}

export interface Backend extends L3n4Addr {
  readonly state: BackendState;
}

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

export function formatAddr(address: string, family: Family, port: number): string {
  return family === 6 ? `[${address}]:${port}` : `${address}:${port}`;
}

export function l3n4Key(a: L3n4Addr): string {
  return `${formatAddr(a.address, a.family, a.port)}/${a.protocol}`;
}

export function frontendKey(a: L3n4Addr): FrontendKey {
  return l3n4Key(a) as FrontendKey;
}

export function backendKey(a: L3n4Addr): BackendKey {
  return l3n4Key(a) as BackendKey;
}
