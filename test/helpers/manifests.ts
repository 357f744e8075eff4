// Service and discovery.k8s.io/v1 EndpointSlice manifests for the e2e tests,
// as YAML text (what a person would write in the watched directory).
import { stringify } from 'yaml';

export type Protocol = 'TCP' | 'UDP' | 'SCTP';

export interface PortSpec {
  readonly name?: string;
  readonly port: number;
  readonly protocol?: Protocol;
}

export interface ServiceSpec {
  readonly name: string;
  readonly namespace?: string;
  /** One address per family; the first is spec.clusterIP. */
  readonly clusterIPs: readonly string[];
  readonly ports: readonly PortSpec[];
}

export interface SliceSpec {
  readonly name: string;
  readonly namespace?: string;
  readonly service: string;
  readonly family: 4 | 6;
  /** The port the backends listen on, per service port name. */
  readonly ports: readonly PortSpec[];
  readonly addresses: readonly string[];
  /** Addresses listed with ready: false. */
  readonly notReady?: readonly string[];
}

export function serviceObject(s: ServiceSpec): object {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: s.name, namespace: s.namespace ?? 'default' },
    spec: {
      type: 'ClusterIP',
      clusterIP: s.clusterIPs[0],
      clusterIPs: [...s.clusterIPs],
      ipFamilies: s.clusterIPs.map((ip) => (ip.includes(':') ? 'IPv6' : 'IPv4')),
      ports: s.ports.map((p) => ({ name: p.name ?? '', port: p.port, protocol: p.protocol ?? 'TCP' })),
    },
  };
}

export function sliceObject(s: SliceSpec): object {
  const endpoint = (ip: string, ready: boolean): object => ({ addresses: [ip], conditions: { ready } });
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name: s.name,
      namespace: s.namespace ?? 'default',
      labels: { 'kubernetes.io/service-name': s.service },
    },
    addressType: s.family === 4 ? 'IPv4' : 'IPv6',
    ports: s.ports.map((p) => ({ name: p.name ?? '', port: p.port, protocol: p.protocol ?? 'TCP' })),
    endpoints: [...s.addresses.map((a) => endpoint(a, true)), ...(s.notReady ?? []).map((a) => endpoint(a, false))],
  };
}

/** Several objects as one multi-document YAML file. */
export function yamlDocs(objects: readonly object[]): string {
  return objects.map((o) => stringify(o)).join('---\n');
}

/** A service and its one slice, in one file. */
export function serviceWithBackends(svc: ServiceSpec, slices: ReadonlyArray<Omit<SliceSpec, 'service'>>): string {
  return yamlDocs([serviceObject(svc), ...slices.map((s) => sliceObject({ ...s, service: svc.name, namespace: svc.namespace }))]);
}
