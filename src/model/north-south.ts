// What a Service asks of the tc datapath (issue 14): its NodePorts, external
// IPs, LoadBalancer ingress IPs, externalTrafficPolicy, healthCheckNodePort
// and loadBalancerSourceRanges, read as kube-proxy reads them. Pure.
// validateService (k8s.ts) reads them once per object with every port
// allowed (ALL_PORTS), since the Service keeps only its validated form; the
// model applies --nodeport-range when it computes frontends (from-k8s.ts),
// with the same message as northSouth() gives.
//
// Bad values are bad input in the sense of docs/standalone.md: each is a
// problem naming the service and the field, and the rest of the service is
// still served (a NodePort outside the range is left out, an ingress entry
// with only a hostname is skipped). Source ranges fail closed: when some are
// given and none is valid, the LoadBalancer frontends are not programmed,
// rather than opened to everyone. The port range flags are parsed in
// src/cli/flags.ts.
import ipaddr from 'ipaddr.js';
import { parseIp, type ParsedIp } from '../lb/addr.js';
import { packed, type Family, type Protocol } from '../lb/types.js';

/** The fields of a Service this module reads (RawService is the rest). */
export interface RawNorthSouth {
  spec?: {
    type?: string;
    ports?: Array<{ nodePort?: unknown; port?: unknown; protocol?: unknown } | null>;
    externalIPs?: unknown;
    externalTrafficPolicy?: unknown;
    healthCheckNodePort?: unknown;
    loadBalancerSourceRanges?: unknown;
  };
  status?: { loadBalancer?: { ingress?: unknown } };
}

export interface PortRange {
  readonly first: number;
  readonly last: number;
}

export const DEFAULT_NODEPORT_RANGE: PortRange = { first: 30000, last: 32767 };
/** Every port: northSouth() keeps every valid nodePort, for a range applied later (nodePortInRange). */
export const ALL_PORTS: PortRange = { first: 1, last: 65535 };

export interface SourceRange {
  readonly family: Family;
  readonly address: string;
  readonly prefixLen: number;
}

export interface NodePort {
  readonly port: number;
  readonly protocol: Protocol;
  readonly nodePort: number;
  /** Its entry in spec.ports, for messages. */
  readonly index: number;
}

export interface NorthSouth {
  /** Service ports with a valid nodePort in the range (NodePort and LoadBalancer services). */
  readonly nodePorts: readonly NodePort[];
  readonly externalIPs: readonly ParsedIp[];
  /** status.loadBalancer.ingress[].ip; ipMode Proxy: the load balancer proxies, so in-node traffic is not short-cut to it. */
  readonly loadBalancerIPs: ReadonlyArray<ParsedIp & { readonly ipMode: 'VIP' | 'Proxy' }>;
  readonly externalTrafficPolicy: 'Cluster' | 'Local';
  /** LoadBalancer with externalTrafficPolicy Local: the port kube-proxy's health check server listens on. */
  readonly healthCheckNodePort?: number;
  readonly sourceRanges: readonly SourceRange[];
  /** Ranges were given and none is valid: the LoadBalancer frontends must not be programmed. */
  readonly sourceRangesFailClosed: boolean;
  /** Each names the field; the service is still served without the bad value. */
  readonly problems: readonly string[];
}

/** Entries read from each list field; the rest is one problem (the API allows few; a manifest may hold millions). */
export const MAX_LIST_ENTRIES = 1024;

/** The first MAX_LIST_ENTRIES of a list field, with a problem when there were more. */
function bounded(list: unknown, field: string, id: string, problems: string[]): unknown[] {
  if (!Array.isArray(list)) return [];
  if (list.length > MAX_LIST_ENTRIES) problems.push(`${id}: ${field} has ${list.length} entries; the first ${MAX_LIST_ENTRIES} are read`);
  return list.length > MAX_LIST_ENTRIES ? list.slice(0, MAX_LIST_ENTRIES) : list;
}

const show = (v: unknown): string => (typeof v === 'string' ? JSON.stringify(v.length > 64 ? `${v.slice(0, 64)}…` : v) : String(v));
const isPort = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v >= 1 && v <= 65535;

/**
 * The north-south half of a Service. `families`: the service's IP families
 * (from its clusterIPs); an external IP of another family is reported and
 * left out, as kube-proxy's per-family proxiers leave it.
 */
export function northSouth(obj: RawNorthSouth, id: string, families: readonly Family[], nodePortRange: PortRange = DEFAULT_NODEPORT_RANGE): NorthSouth {
  const spec = obj.spec ?? {};
  const type = spec.type ?? 'ClusterIP';
  const problems: string[] = [];
  const nodePorts: NodePort[] = [];
  if (type === 'NodePort' || type === 'LoadBalancer') {
    for (const [i, p] of (bounded(spec.ports, 'spec.ports', id, problems) as Array<{ nodePort?: unknown; port?: unknown; protocol?: unknown } | null>).entries()) {
      if (p?.nodePort === undefined || p.nodePort === 0) continue; // LoadBalancer with allocateLoadBalancerNodePorts: false
      const protocol = p.protocol ?? 'TCP';
      if (!isPort(p.port) || (protocol !== 'TCP' && protocol !== 'UDP' && protocol !== 'SCTP')) continue; // validateService reports those
      if (!isPort(p.nodePort)) {
        problems.push(`${id}: spec.ports[${i}].nodePort ${show(p.nodePort)} is not a port`);
      } else {
        const np: NodePort = { port: p.port, protocol, nodePort: p.nodePort, index: i };
        const outside = nodePortOutside(np, id, nodePortRange);
        if (outside) problems.push(outside);
        else nodePorts.push(np);
      }
    }
  }

  const externalIPs: ParsedIp[] = [];
  if (spec.externalIPs !== undefined && !Array.isArray(spec.externalIPs)) problems.push(`${id}: spec.externalIPs is not a list`);
  for (const [i, text] of bounded(spec.externalIPs, 'spec.externalIPs', id, problems).entries()) {
    const ip = parseIp(text);
    if (!ip) problems.push(`${id}: spec.externalIPs[${i}] ${show(text)} is not an IP address`);
    else if (!families.includes(ip.family)) problems.push(`${id}: spec.externalIPs[${i}] ${ip.address} is IPv${ip.family}, a family the service does not have: not served`);
    else if (!externalIPs.some((e) => e.address === ip.address)) externalIPs.push(ip);
  }

  const loadBalancerIPs: Array<ParsedIp & { ipMode: 'VIP' | 'Proxy' }> = [];
  const ingress = obj.status?.loadBalancer?.ingress;
  if (type === 'LoadBalancer' && Array.isArray(ingress)) {
    for (const [i, e] of bounded(ingress, 'status.loadBalancer.ingress', id, problems).entries()) {
      const entry = (typeof e === 'object' && e !== null ? e : {}) as { ip?: unknown; hostname?: unknown; ipMode?: unknown };
      if (entry.ip === undefined || entry.ip === '') {
        if (typeof entry.hostname === 'string' && entry.hostname !== '') problems.push(`${id}: status.loadBalancer.ingress[${i}] has only a hostname (${show(entry.hostname)}): not served (kube-proxy serves IPs only)`);
        continue;
      }
      const ip = parseIp(entry.ip);
      if (!ip) problems.push(`${id}: status.loadBalancer.ingress[${i}].ip ${show(entry.ip)} is not an IP address`);
      else if (!families.includes(ip.family)) problems.push(`${id}: status.loadBalancer.ingress[${i}].ip ${ip.address} is IPv${ip.family}, a family the service does not have: not served`);
      else if (!loadBalancerIPs.some((l) => l.address === ip.address)) loadBalancerIPs.push({ ...ip, ipMode: entry.ipMode === 'Proxy' ? 'Proxy' : 'VIP' });
    }
  }

  let externalTrafficPolicy: 'Cluster' | 'Local' = 'Cluster';
  const etp = spec.externalTrafficPolicy;
  if (etp === 'Local') externalTrafficPolicy = 'Local';
  else if (etp !== undefined && etp !== 'Cluster' && etp !== '') problems.push(`${id}: spec.externalTrafficPolicy ${show(etp)} is not Cluster or Local: Cluster used`);

  let healthCheckNodePort: number | undefined;
  if (type === 'LoadBalancer' && externalTrafficPolicy === 'Local' && spec.healthCheckNodePort !== undefined && spec.healthCheckNodePort !== 0) {
    if (isPort(spec.healthCheckNodePort)) healthCheckNodePort = spec.healthCheckNodePort;
    else problems.push(`${id}: spec.healthCheckNodePort ${show(spec.healthCheckNodePort)} is not a port: no health check server`);
  }

  const sourceRanges: SourceRange[] = [];
  let given = 0;
  if (type === 'LoadBalancer' && spec.loadBalancerSourceRanges !== undefined) {
    const list = Array.isArray(spec.loadBalancerSourceRanges) ? bounded(spec.loadBalancerSourceRanges, 'spec.loadBalancerSourceRanges', id, problems) : [spec.loadBalancerSourceRanges];
    for (const [i, text] of list.entries()) {
      given++;
      const range = parseCidr(text);
      if (!range) problems.push(`${id}: spec.loadBalancerSourceRanges[${i}] ${show(text)} is not a CIDR`);
      else if (!sourceRanges.some((r) => r.address === range.address && r.prefixLen === range.prefixLen)) sourceRanges.push(range);
    }
  }
  const sourceRangesFailClosed = given > 0 && sourceRanges.length === 0;
  if (sourceRangesFailClosed) problems.push(`${id}: no valid spec.loadBalancerSourceRanges: its LoadBalancer addresses are not served (closed rather than open to all)`);

  // Exact copies of the lists built by push (packed(): no spare room kept per service).
  return {
    nodePorts: packed(nodePorts),
    externalIPs: packed(externalIPs),
    loadBalancerIPs: packed(loadBalancerIPs),
    externalTrafficPolicy,
    healthCheckNodePort,
    sourceRanges: packed(sourceRanges),
    sourceRangesFailClosed,
    problems: packed(problems),
  };
}

/** The problem of a nodePort outside `range`, or undefined when it is inside. */
export function nodePortOutside(np: NodePort, id: string, range: PortRange): string | undefined {
  if (np.nodePort >= range.first && np.nodePort <= range.last) return undefined;
  return `${id}: spec.ports[${np.index}].nodePort ${np.nodePort} is outside --nodeport-range ${range.first}-${range.last}: not served`;
}

/** A CIDR as the API writes it ("10.0.0.0/8", " 192.168.1.0/24 " trimmed), network address canonical. */
export function parseCidr(text: unknown): SourceRange | undefined {
  if (typeof text !== 'string' || text.length > 64) return undefined;
  try {
    const [addr, bits] = ipaddr.parseCIDR(text.trim());
    const family: Family = addr.kind() === 'ipv4' ? 4 : 6;
    const network = family === 4 ? ipaddr.IPv4.networkAddressFromCIDR(text.trim()) : ipaddr.IPv6.networkAddressFromCIDR(text.trim());
    const address = family === 4 ? network.toString() : (network as ipaddr.IPv6).toRFC5952String();
    return { family, address, prefixLen: bits };
  } catch {
    return undefined;
  }
}

/**
 * Services that claim a nodePort another service already has (the API
 * allocator prevents it in a cluster; a directory of manifests cannot): the
 * first by namespace/name keeps it, the others are reported and left out.
 */
export function nodePortConflicts(services: ReadonlyArray<{ readonly id: string; readonly nodePorts: ReadonlyArray<Pick<NodePort, 'port' | 'protocol' | 'nodePort'>> }>): Map<string, string[]> {
  const owner = new Map<string, string>();
  const problems = new Map<string, string[]>();
  for (const s of [...services].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))) {
    for (const p of s.nodePorts) {
      const key = `${p.nodePort}/${p.protocol}`;
      const first = owner.get(key);
      if (first === undefined) owner.set(key, s.id);
      else if (first !== s.id) problems.set(s.id, [...(problems.get(s.id) ?? []), `${s.id}: nodePort ${key} is already ${first}'s: not served`]);
    }
  }
  return problems;
}
