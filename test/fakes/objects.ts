// Builders for Service and EndpointSlice objects as they appear in manifests.
import type { RawEndpointSlice, RawService } from '../../src/model/k8s.js';

export function service(
  name: string,
  clusterIPs: string[],
  ports: Array<{ name?: string; port: number; protocol?: string; targetPort?: number | string; nodePort?: number }>,
  extra: Partial<NonNullable<RawService['spec']>> = {},
  namespace = 'default',
): RawService {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace },
    spec: { clusterIP: clusterIPs[0] ?? 'None', clusterIPs, ports, ...extra },
  };
}

export function slice(
  name: string,
  serviceName: string,
  addressType: 'IPv4' | 'IPv6',
  ports: Array<{ name?: string; port: number; protocol?: string }>,
  endpoints: Array<{ addresses: string[]; ready?: boolean; serving?: boolean; terminating?: boolean }>,
  namespace = 'default',
): RawEndpointSlice {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name, namespace, labels: { 'kubernetes.io/service-name': serviceName } },
    addressType,
    ports,
    endpoints: endpoints.map((e) => ({
      addresses: e.addresses,
      conditions: { ready: e.ready ?? true, serving: e.serving ?? e.ready ?? true, terminating: e.terminating ?? false },
    })),
  };
}
