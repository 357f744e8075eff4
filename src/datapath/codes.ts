// The numbers the maps hold for lbctl's names (protocols, service types,
// backend states, key scopes), from the BTF-generated enums: one table each, read by the
// codecs' callers (maps.ts) and by the entry digests (digest.ts).
import { LbBackendState, LbScope, LbSvcType } from './abi.gen.js';
import type { BackendState, Protocol, ServiceAddr } from '../lb/types.js';
import type { MasterType } from './lbmaps.js';

export const PROTO_NUM: Record<Protocol | 'ANY', number> = { ANY: 0, TCP: 6, UDP: 17, SCTP: 132 };
export const PROTO_NAME = new Map<number, Protocol | 'ANY'>([
  [0, 'ANY'],
  [6, 'TCP'],
  [17, 'UDP'],
  [132, 'SCTP'],
]);

export const TYPE_NUM: Record<MasterType, number> = {
  ClusterIP: LbSvcType.LB_SVC_CLUSTER_IP,
  NodePort: LbSvcType.LB_SVC_NODEPORT,
  LoadBalancer: LbSvcType.LB_SVC_LOADBALANCER,
  ExternalIP: LbSvcType.LB_SVC_EXTERNAL_IP,
  Wildcard: LbSvcType.LB_SVC_WILDCARD,
};
export const TYPE_NAME = new Map<number, MasterType>(Object.entries(TYPE_NUM).map(([k, v]) => [v, k as MasterType]));

export const STATE_NUM: Record<BackendState, number> = {
  active: LbBackendState.LB_BACKEND_ACTIVE,
  terminating: LbBackendState.LB_BACKEND_TERMINATING,
  quarantined: LbBackendState.LB_BACKEND_QUARANTINED,
};
export const STATE_NAME = new Map<number, BackendState>(Object.entries(STATE_NUM).map(([k, v]) => [v, k as BackendState]));

/** The key's scope byte (enum lb_scope): absent is the external scope, so old entries (pad 0) read as before. */
export const scopeNum = (fe: Pick<ServiceAddr, 'scope'>): number => (fe.scope === 'internal' ? LbScope.LB_SCOPE_INT : LbScope.LB_SCOPE_EXT);
