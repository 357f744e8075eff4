// Kubernetes objects → desired frontends. Pure and deterministic: the same
// objects give the same state, in any order.
import type { EndpointSlice, Service } from './k8s.js';
import {
  backendKey,
  frontendKey,
  type Backend,
  type BackendKey,
  type DesiredState,
  type Frontend,
  type FrontendKey,
} from './types.js';

export interface ModelInput {
  readonly services: Iterable<Service>;
  readonly slices: Iterable<EndpointSlice>;
}

/** A service lbctl deliberately does not program, and why. */
export interface Skipped {
  readonly service: string;
  readonly reason: 'headless' | 'external-name' | 'no-ports' | 'unsupported-protocol' | 'conflict';
  readonly detail?: string;
}

export interface ModelOutput {
  readonly frontends: DesiredState;
  readonly skipped: readonly Skipped[];
}

function sliceIndex(slices: Iterable<EndpointSlice>): Map<string, EndpointSlice[]> {
  const bySvc = new Map<string, EndpointSlice[]>();
  for (const s of slices) {
    const k = `${s.namespace}/${s.serviceName}`;
    let list = bySvc.get(k);
    if (!list) bySvc.set(k, (list = []));
    list.push(s);
  }
  return bySvc;
}

/**
 * The backends of one service port in one family, merged over every slice of
 * the service. A slice port matches by name and protocol: that is how the
 * EndpointSlice controller resolves named targetPorts (per pod) into numbers.
 * Ready endpoints are selectable.
 */
function backendsFor(
  slices: readonly EndpointSlice[],
  family: 4 | 6,
  portName: string,
  protocol: 'TCP' | 'UDP',
): Backend[] {
  const byKey = new Map<BackendKey, Backend>();
  for (const slice of slices) {
    if (slice.family !== family) continue;
    const port = slice.ports.find((p) => p.name === portName && p.protocol === protocol);
    if (!port) continue;
    for (const ep of slice.endpoints) {
      if (!ep.ready) continue;
      for (const ip of ep.addresses) {
        const b: Backend = { address: ip.address, family, port: port.port, protocol, state: 'active' };
        byKey.set(backendKey(b), b);
      }
    }
  }
  return [...byKey.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, b]) => b);
}

export function desiredState(input: ModelInput): ModelOutput {
  const frontends = new Map<FrontendKey, Frontend>();
  const skipped: Skipped[] = [];
  const slices = sliceIndex(input.slices);

  const services = [...input.services].sort((a, b) =>
    a.namespace === b.namespace ? (a.name < b.name ? -1 : 1) : a.namespace < b.namespace ? -1 : 1,
  );
  for (const svc of services) {
    const id = `${svc.namespace}/${svc.name}`;
    if (svc.type === 'ExternalName') {
      skipped.push({ service: id, reason: 'external-name' });
      continue;
    }
    if (svc.clusterIPs.length === 0) {
      skipped.push({ service: id, reason: 'headless' });
      continue;
    }
    if (svc.unsupportedPorts.length > 0) {
      skipped.push({ service: id, reason: 'unsupported-protocol', detail: svc.unsupportedPorts.join(', ') });
    }
    if (svc.ports.length === 0) {
      skipped.push({ service: id, reason: 'no-ports' });
      continue;
    }
    const svcSlices = slices.get(id) ?? [];
    for (const ip of svc.clusterIPs) {
      for (const p of svc.ports) {
        const addr = { address: ip.address, family: ip.family, port: p.port, protocol: p.protocol };
        const key = frontendKey(addr);
        const fe: Frontend = {
          ...addr,
          key,
          type: 'ClusterIP',
          service: { namespace: svc.namespace, name: svc.name, portName: p.name },
          backends: backendsFor(svcSlices, ip.family, p.name, p.protocol),
        };
        // Two services claiming one address:port/proto: the API server
        // prevents it; from files, the first (by namespace/name) wins.
        const owner = frontends.get(key);
        if (owner) {
          const o = owner.service;
          skipped.push({ service: id, reason: 'conflict', detail: `${key} is already served for ${o.namespace}/${o.name}` });
          continue;
        }
        frontends.set(key, fe);
      }
    }
  }
  return { frontends, skipped };
}
