// The NodePort benchmarks' services (bench/nodeport-tc.ts, bench/nodeport-e2e.ts),
// as Kubernetes objects and as kube-proxy's emulation (kube-proxy.ts) takes them.
import type { RawEndpointSlice, RawService } from '../src/model/k8s.js';
import type { BenchService } from './kube-proxy.js';

export const ipv4 = (n: number): string => [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');

/** One north-south service: what both the agent's objects and kube-proxy's rules are made from. */
export interface NpService extends BenchService {
  readonly type: 'NodePort' | 'LoadBalancer';
  /** 0: none (a LoadBalancer with allocateLoadBalancerNodePorts false). */
  readonly nodePort: number;
  readonly loadBalancerIP?: string;
  /** lbctl.io/lb-algorithm: the agent's default is maglev. */
  readonly algorithm?: 'maglev' | 'random';
}

export function serviceObject(s: NpService): RawService {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: s.name, namespace: s.namespace, ...(s.algorithm ? { annotations: { 'lbctl.io/lb-algorithm': s.algorithm } } : {}) },
    spec: {
      type: s.type,
      clusterIP: s.clusterIP,
      clusterIPs: [s.clusterIP],
      ipFamilies: ['IPv4'],
      ports: [{ name: s.portName, port: s.port, protocol: 'TCP', targetPort: s.endpoints[0]?.port ?? 8080, ...(s.nodePort ? { nodePort: s.nodePort } : {}) }],
      selector: { app: s.name },
      externalTrafficPolicy: 'Cluster',
    },
    ...(s.loadBalancerIP ? { status: { loadBalancer: { ingress: [{ ip: s.loadBalancerIP }] } } } : {}),
  } as RawService;
}

export function sliceObject(s: NpService, nodeOf: (ip: string) => string = () => 'node-x'): RawEndpointSlice {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name: `${s.name}-x7k2p`, namespace: s.namespace, labels: { 'kubernetes.io/service-name': s.name } },
    addressType: 'IPv4',
    ports: [{ name: s.portName, port: s.endpoints[0]?.port ?? 8080, protocol: 'TCP' }],
    endpoints: s.endpoints.map((e) => ({ addresses: [e.ip], conditions: { ready: true, serving: true, terminating: false }, nodeName: nodeOf(e.ip) })),
  } as RawEndpointSlice;
}

/**
 * `n` services: the first `measured.length` are the measured ones (their
 * endpoints given), the rest have 3 endpoints each at addresses in
 * 10.128.0.0/9 that nothing answers (only their entries or rules matter).
 * ClusterIPs from 10.96.0.10 on; a NodePort from `nodePorts.first` on while
 * the range lasts; LoadBalancer services get an ingress IP from 172.16.0.10 on.
 */
export function npServices(
  n: number,
  opts: {
    type: 'NodePort' | 'LoadBalancer';
    nodePorts: { first: number; last: number };
    measured: ReadonlyArray<ReadonlyArray<{ ip: string; port: number }>>;
    /** The fillers' algorithm (the measured ones keep the default). */
    fillerAlgorithm?: 'maglev' | 'random';
  },
): NpService[] {
  const out: NpService[] = [];
  for (let i = 0; i < n; i++) {
    const m = opts.measured[i];
    const nodePort = opts.nodePorts.first + i <= opts.nodePorts.last ? opts.nodePorts.first + i : 0;
    if (opts.type === 'NodePort' && !nodePort) throw new Error(`${n} NodePort services do not fit in ${opts.nodePorts.first}-${opts.nodePorts.last}`);
    out.push({
      namespace: 'bench',
      name: `np-${i}`,
      portName: 'http',
      clusterIP: ipv4(0x0a60000a + i),
      port: 80,
      endpoints: m ? [...m] : [0, 1, 2].map((k) => ({ ip: ipv4(0x0a800000 + 3 * i + k + 1), port: 8080 })),
      type: opts.type,
      nodePort,
      ...(opts.type === 'LoadBalancer' ? { loadBalancerIP: ipv4(0xac10000a + i) } : {}),
      ...(!m && opts.fillerAlgorithm ? { algorithm: opts.fillerAlgorithm } : {}),
    });
  }
  return out;
}
