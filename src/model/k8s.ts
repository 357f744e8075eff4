// The Kubernetes objects lbctl reads (Service, discovery.k8s.io/v1
// EndpointSlice), as they arrive in JSON or YAML, and their validation into
// normalized forms. Pure: no I/O. Field names follow the API, so objects
// from @kubernetes/client-node and from manifests fit alike.
import { parseIp, type ParsedIp } from '../lb/addr.js';
import { Interner, packed, type Family, type Protocol } from '../lb/types.js';
import { ALL_PORTS, northSouth, type NorthSouth, type RawNorthSouth } from './north-south.js';
import { parseProbeAnnotation, READINESS_PROBE_ANNOTATION, type ProbeSpec } from './probe.js';
import { show, type Validated } from './validated.js';

export { show, type Validated };

export interface ObjectMeta {
  name?: string;
  namespace?: string;
  labels?: Record<string, string>;
}

export interface RawService {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMeta;
  spec?: {
    type?: string;
    clusterIP?: string;
    clusterIPs?: string[];
    ports?: Array<{ name?: string; port?: number; protocol?: string; targetPort?: number | string; nodePort?: number }>;
    externalName?: string;
    sessionAffinity?: string;
    sessionAffinityConfig?: { clientIP?: { timeoutSeconds?: number } };
    internalTrafficPolicy?: string;
    externalIPs?: string[];
    externalTrafficPolicy?: string;
    healthCheckNodePort?: number;
    loadBalancerSourceRanges?: string[];
  };
  status?: { loadBalancer?: { ingress?: Array<{ ip?: string; hostname?: string; ipMode?: string }> } };
}

export interface RawNode {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMeta & { deletionTimestamp?: string | Date | null };
  status?: { addresses?: Array<{ type?: unknown; address?: unknown }> };
}

export interface RawEndpointSlice {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMeta;
  addressType?: string;
  endpoints?: Array<{
    addresses?: string[];
    conditions?: { ready?: boolean | null; serving?: boolean | null; terminating?: boolean | null };
    nodeName?: string;
    zone?: string;
    hints?: { forZones?: Array<{ name?: string }> | null; forNodes?: Array<{ name?: string }> | null } | null;
  }> | null;
  ports?: Array<{ name?: string; port?: number; protocol?: string }> | null;
}

export const SERVICE_NAME_LABEL = 'kubernetes.io/service-name';
/** A Service with this label belongs to another proxy; kube-proxy skips it too. */
export const SERVICE_PROXY_NAME_LABEL = 'service.kubernetes.io/service-proxy-name';
export const LB_ALGORITHM_ANNOTATIONS = ['lbctl.io/lb-algorithm', 'service.cilium.io/lb-algorithm'] as const;
/** A Service with this label is not proxied: kube-proxy's informers select `!service.kubernetes.io/headless`. */
export const HEADLESS_LABEL = 'service.kubernetes.io/headless';
export const ZONE_LABEL = 'topology.kubernetes.io/zone';
/** sessionAffinityConfig.clientIP.timeoutSeconds: the API's default and bounds. */
export const AFFINITY_TIMEOUT_DEFAULT = 10800;
export const AFFINITY_TIMEOUT_MAX = 86400;
/** More ports than this in one Service is refused as absurd (the API sets no limit). */
export const MAX_SERVICE_PORTS = 1024;
/** The EndpointSlice API allows at most 1000 endpoints and 100 ports per slice. */
export const MAX_SLICE_ENDPOINTS = 1000;
export const MAX_SLICE_PORTS = 100;

export interface ServicePort {
  readonly name: string;
  readonly port: number;
  readonly protocol: Protocol;
}

export interface Service {
  readonly namespace: string;
  readonly name: string;
  readonly type: 'ClusterIP' | 'NodePort' | 'LoadBalancer' | 'ExternalName';
  /** Empty for headless and ExternalName services. */
  readonly clusterIPs: readonly ParsedIp[];
  readonly ports: readonly ServicePort[];
  /** sessionAffinity ClientIP: its timeout in seconds; undefined for None. */
  readonly affinityTimeout?: number;
  readonly internalTrafficPolicy: 'Cluster' | 'Local';
  /** Value of the service-proxy-name label, when another proxy owns the service. */
  readonly proxyName?: string;
  /** Carries the service.kubernetes.io/headless label (any value): not proxied. */
  readonly headlessLabel: boolean;
  /**
   * NodePorts (every valid one: the model applies --nodeport-range),
   * external IPs, LoadBalancer ingress IPs, externalTrafficPolicy, source
   * ranges, and the problems of their values (north-south.ts). NO_NORTH_SOUTH
   * when the service asks for none of it, as most do.
   */
  readonly northSouth: NorthSouth;
  /**
   * How the tc datapath picks a backend for a new flow to this service's
   * NodePort, LoadBalancer and external IPs: 'maglev' (the default: every
   * node picks the same backend for a flow) or 'random', from the
   * lbctl.io/lb-algorithm annotation (Cilium's service.cilium.io/lb-algorithm
   * is read too).
   */
  readonly lbAlgorithm: 'maglev' | 'random';
  /**
   * The lbctl.io/readiness-probe annotation, validated with kubelet's
   * defaults (probe.ts): standalone mode probes the service's backends with
   * it (issue 17). Undefined without the annotation, or when it is invalid.
   */
  readonly probe: ProbeSpec | undefined;
  /**
   * Why the annotation could not be used, naming the annotation and the
   * field: bad input the source reports. The service is still served, from
   * its endpoint conditions alone, as without the annotation.
   */
  readonly probeProblem: string | undefined;
}

/** The north-south half of a service that has none: one shared object. */
export const NO_NORTH_SOUTH: NorthSouth = Object.freeze({
  nodePorts: Object.freeze([]),
  externalIPs: Object.freeze([]),
  loadBalancerIPs: Object.freeze([]),
  externalTrafficPolicy: 'Cluster',
  healthCheckNodePort: undefined,
  sourceRanges: Object.freeze([]),
  sourceRangesFailClosed: false,
  problems: Object.freeze([]),
});

/** NO_NORTH_SOUTH when `ns` holds nothing, so a plain ClusterIP service keeps no object of its own. */
function orNone(ns: NorthSouth): NorthSouth {
  const none =
    ns.nodePorts.length === 0 &&
    ns.externalIPs.length === 0 &&
    ns.loadBalancerIPs.length === 0 &&
    ns.externalTrafficPolicy === 'Cluster' &&
    ns.healthCheckNodePort === undefined &&
    ns.sourceRanges.length === 0 &&
    !ns.sourceRangesFailClosed &&
    ns.problems.length === 0;
  return none ? NO_NORTH_SOUTH : ns;
}

export interface Node {
  readonly name: string;
  readonly zone?: string;
  /** deletionTimestamp is set: the node is going away. */
  readonly deleting: boolean;
  /**
   * status.addresses that are IP addresses (InternalIP, ExternalIP), canonical,
   * in the Node's order, without repeats: the health mesh probes them.
   */
  readonly addresses?: readonly NodeAddress[];
}

export interface NodeAddress {
  readonly type: 'InternalIP' | 'ExternalIP';
  readonly address: string;
}

/** The most addresses a Node's status is read for (a real node has a handful). */
export const MAX_NODE_ADDRESSES = 16;

export interface Endpoint {
  /**
   * The endpoint's first address, canonical; its family is the slice's. The
   * API calls an endpoint's addresses fungible, and kube-proxy uses only
   * the first (endpointslicecache.go, addEndpoints): so does lbctl.
   */
  readonly address: string;
  readonly ready: boolean;
  readonly serving: boolean;
  readonly terminating: boolean;
  readonly nodeName?: string;
  readonly zone?: string;
  /** hints.forZones names; undefined when there are none. */
  readonly zoneHints?: readonly string[];
  /** hints.forNodes names (trafficDistribution PreferSameNode); undefined when there are none. */
  readonly nodeHints?: readonly string[];
}

/** What a Service asks beyond its addresses and ports; PLAIN_EXTRAS for most. */
interface ServiceExtras {
  readonly internalTrafficPolicy: 'Cluster' | 'Local';
  readonly affinityTimeout: number | undefined;
  readonly proxyName: string | undefined;
  readonly headlessLabel: boolean;
  readonly northSouth: NorthSouth;
  readonly lbAlgorithm: 'maglev' | 'random';
  readonly probe: ProbeSpec | undefined;
  readonly probeProblem: string | undefined;
}

/**
 * The extras of a Service that sets none of them: one shared object. Its
 * empty list is packed()'s, so a Service's extras are plain exactly when
 * every field is identical to this object's.
 */
const PLAIN_EXTRAS: ServiceExtras = Object.freeze({
  internalTrafficPolicy: 'Cluster',
  affinityTimeout: undefined,
  proxyName: undefined,
  headlessLabel: false,
  northSouth: NO_NORTH_SOUTH,
  lbAlgorithm: 'maglev',
  probe: undefined,
  probeProblem: undefined,
});
const EXTRAS_FIELDS = Object.keys(PLAIN_EXTRAS) as ReadonlyArray<keyof ServiceExtras>;

const plainExtras = (x: ServiceExtras): boolean => EXTRAS_FIELDS.every((k) => x[k] === PLAIN_EXTRAS[k]);

/**
 * A validated Service as kept: its name, type, cluster IPs and ports, and
 * the rest in an extras object read through getters, one shared object
 * for every Service that sets none of it (6 fields instead of 14: 72 bytes
 * instead of 136). Every one is made by this constructor: one hidden
 * class.
 *
 * Holds `make bench`'s steady RSS at 100,000 services near its 300 MiB
 * target: 5.3 MiB of heap at 100,000 against plain Service objects
 * (bench/profile/sync.ts: 70.4 against 75.7 MiB of validated objects).
 * Measured on Node 24 (bench/run.ts --sizes 100000 --modes lbctl, alternated
 * in one session, 2026-12-06, 2 vCPUs): steady RSS at 100,000 services 301
 * and 304 MiB with this and the other model structures of its kind
 * (ValidFrontend's and ValidService's shared options, the node-name and
 * zone interners), 317 MiB with all of them plain objects and plain
 * strings (branch issue35-ds), against `make bench`'s 300 MiB target.
 */
class ValidService implements Service {
  constructor(
    readonly namespace: string,
    readonly name: string,
    readonly type: Service['type'],
    readonly clusterIPs: readonly ParsedIp[],
    readonly ports: readonly ServicePort[],
    private readonly x: ServiceExtras,
  ) {}

  get internalTrafficPolicy(): 'Cluster' | 'Local' {
    return this.x.internalTrafficPolicy;
  }

  get affinityTimeout(): number | undefined {
    return this.x.affinityTimeout;
  }

  get proxyName(): string | undefined {
    return this.x.proxyName;
  }

  get headlessLabel(): boolean {
    return this.x.headlessLabel;
  }

  get northSouth(): NorthSouth {
    return this.x.northSouth;
  }

  get lbAlgorithm(): 'maglev' | 'random' {
    return this.x.lbAlgorithm;
  }

  get probe(): ProbeSpec | undefined {
    return this.x.probe;
  }

  get probeProblem(): string | undefined {
    return this.x.probeProblem;
  }
}

const READY = 1;
const SERVING = 2;
const TERMINATING = 4;

/** An endpoint's hints (rare: topology-aware routing). */
interface EndpointHints {
  readonly zoneHints: readonly string[] | undefined;
  readonly nodeHints: readonly string[] | undefined;
}

/**
 * What an endpoint has beyond its address and node name: its conditions
 * (READY, SERVING, TERMINATING), its zone and hints. An endpoint with
 * neither zone nor hints keeps the conditions as a small integer; one with
 * a zone keeps one of these objects, shared by every endpoint with the same
 * zone and conditions (a cluster has a few zones), and one with hints an
 * object of its own.
 */
interface EndpointRest {
  readonly conditions: number;
  readonly zone: string | undefined;
  readonly hints: EndpointHints | undefined;
}

/** Slots per endpoint in a ValidEndpointSlice's packed array: address, node name, conditions or EndpointRest. */
const EP_SLOTS = 3;
type EndpointSlot = string | undefined | number | EndpointRest;

/**
 * One endpoint of a ValidEndpointSlice, made when the slice's endpoints are
 * read (the model reads them while it computes the frontends, then lets
 * them go): the kept form is the slice's packed array. Every one is made
 * by this constructor: one hidden class.
 */
class ValidEndpoint implements Endpoint {
  constructor(
    readonly address: string,
    readonly nodeName: string | undefined,
    private readonly rest: number | EndpointRest,
  ) {}

  private get conditions(): number {
    return typeof this.rest === 'number' ? this.rest : this.rest.conditions;
  }

  get ready(): boolean {
    return (this.conditions & READY) !== 0;
  }

  get serving(): boolean {
    return (this.conditions & SERVING) !== 0;
  }

  get terminating(): boolean {
    return (this.conditions & TERMINATING) !== 0;
  }

  get zone(): string | undefined {
    return typeof this.rest === 'number' ? undefined : this.rest.zone;
  }

  get zoneHints(): readonly string[] | undefined {
    return typeof this.rest === 'number' ? undefined : this.rest.hints?.zoneHints;
  }

  get nodeHints(): readonly string[] | undefined {
    return typeof this.rest === 'number' ? undefined : this.rest.hints?.nodeHints;
  }
}

/**
 * Holds `make bench`'s steady RSS at 100,000 services under its 300 MiB
 * target: 270-286 MiB with the packed endpoints, 291-306 MiB with an array
 * of plain endpoint objects (21 MiB more heap in bench/profile/sync.ts),
 * and the peak of the cold sync 358 against 379-381 MiB (target 400).
 * bench/run.ts --sizes 100000 --modes lbctl, alternated in one session, 2
 * repetitions each, 2026-12-06 (2 vCPUs, node 20.20).
 *
 * A validated EndpointSlice as kept: its endpoints in one flat array of
 * EP_SLOTS slots each, instead of an array of endpoint objects (an object
 * and a slot per endpoint: 72 bytes, where three slots are 24). Nearly
 * every Service has a slice, and most slices several endpoints: at 100,000
 * services of 3 endpoints this keeps about 14 MiB less (docs/architecture.md,
 * "Why the agent is built for 100,000 services"). `endpoints` makes the
 * objects when read. Every
 * one is made by this constructor: one hidden class.
 */
class ValidEndpointSlice implements EndpointSlice {
  constructor(
    readonly namespace: string,
    readonly name: string,
    readonly serviceName: string,
    readonly family: Family,
    readonly ports: readonly ServicePort[],
    private readonly eps: readonly EndpointSlot[],
  ) {}

  get endpoints(): readonly Endpoint[] {
    const eps = this.eps;
    const out = new Array<Endpoint>(eps.length / EP_SLOTS);
    for (let i = 0, j = 0; j < eps.length; i++, j += EP_SLOTS) {
      out[i] = new ValidEndpoint(eps[j] as string, eps[j + 1] as string | undefined, eps[j + 2] as number | EndpointRest);
    }
    return out;
  }
}

export interface EndpointSlice {
  readonly namespace: string;
  readonly name: string;
  readonly serviceName: string;
  readonly family: Family;
  readonly ports: readonly ServicePort[];
  readonly endpoints: readonly Endpoint[];
}


/**
 * Keeps `make bench`'s steady RSS at 100,000 services clear of its 300
 * MiB target: 270-286 MiB with it, 296 MiB without (a port object per
 * Service and EndpointSlice; 9 MiB more heap in bench/profile/sync.ts),
 * and the peak of the cold sync 358 against 372 MiB (target 400).
 * bench/run.ts --sizes 100000 --modes lbctl, alternated in one session, 2
 * repetitions each, 2026-12-06 (2 vCPUs, node 20.20).
 *
 * One frozen object per distinct port (name, number, protocol), shared by
 * every Service and EndpointSlice that lists it: a cluster repeats a few
 * ports (http/80/TCP, https/443/TCP, dns/53/UDP) over thousands of
 * objects, and each copy cost 48 bytes and a name string (about 96 bytes a
 * service with its slice, docs/architecture.md "Why the agent is built for
 * 100,000 services"). The table is
 * bounded (Interner): past 4,096 distinct ports (input built to grow it),
 * ports are made per object again.
 */
const sharedPorts = new Interner<ServicePort>(4096);

/**
 * Node names and zones, one string each, shared by every endpoint that
 * names them. V8 shares a parsed string across parses only when it has 10
 * characters or fewer (node 20, measured): a cloud node's name
 * (ip-10-0-1-23.ec2.internal) is parsed into a string of its own for every
 * endpoint. Bounded as sharedPorts is:
 * past 8,192 distinct names (Kubernetes supports clusters of 5,000 nodes),
 * or for a name longer than a DNS subdomain (253 characters: no node's name
 * is), each endpoint keeps its own. Input built to grow the table holds
 * at most about 4.5 MiB in it (8,192 strings of 253 two-byte characters).
 * It holds `make bench`'s steady RSS at 100,000 services (300 MiB target)
 * as ValidService's extras do: see there.
 */
const sharedNames = new Interner<string>(8192);
const MAX_SHARED_NAME = 253;
const sharedName = (s: string): string => (s.length > MAX_SHARED_NAME ? s : sharedNames.of(s, () => s));

/**
 * The endpoints' zone-and-conditions objects (EndpointRest without hints),
 * shared: a cluster has a few zones and endpoints a few combinations of
 * conditions. Bounded at 1,024 (about 0.6 MiB at most, as sharedNames).
 */
const sharedRests = new Interner<EndpointRest>(1024);

function servicePort(name: string, port: number, protocol: Protocol): ServicePort {
  return sharedPorts.of(`${protocol}/${port}/${name}`, () => Object.freeze({ name, port, protocol }));
}

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;

function fail<T>(reason: string): Validated<T> {
  return { ok: false, reason };
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function checkMeta(meta: unknown, what: string): Validated<{ namespace: string; name: string }> {
  if (!isObject(meta)) return fail(`${what}: metadata is missing`);
  const { name, namespace = 'default' } = meta as ObjectMeta;
  if (typeof name !== 'string' || name.length === 0) return fail(`${what}: metadata.name is missing`);
  if (name.length > 253 || !DNS_SUBDOMAIN.test(name)) return fail(`${what}: metadata.name ${show(name)} is not a valid name`);
  if (typeof namespace !== 'string' || namespace.length > 63 || !DNS_LABEL.test(namespace)) {
    return fail(`${what}: metadata.namespace ${show(namespace)} is not a valid namespace`);
  }
  return { ok: true, value: { namespace, name } };
}

function checkPort(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v) && v >= 1 && v <= 65535;
}

function checkProtocol(v: unknown): Protocol | undefined {
  if (v === undefined || v === null) return 'TCP';
  return v === 'TCP' || v === 'UDP' || v === 'SCTP' ? v : undefined;
}

/** Service → normalized form, or the first reason it cannot be used. */
export function validateService(obj: unknown): Validated<Service> {
  if (!isObject(obj)) return fail('Service: not an object');
  const raw = obj as RawService;
  const meta = checkMeta(raw.metadata, 'Service');
  if (!meta.ok) return meta;
  const id = `Service ${meta.value.namespace}/${meta.value.name}`;
  const spec = raw.spec;
  if (!isObject(spec)) return fail(`${id}: spec is missing`);

  const type = spec.type ?? 'ClusterIP';
  if (type !== 'ClusterIP' && type !== 'NodePort' && type !== 'LoadBalancer' && type !== 'ExternalName') {
    return fail(`${id}: spec.type ${show(type)} is not a Service type`);
  }

  const ports: ServicePort[] = [];
  const rawPorts = spec.ports ?? [];
  if (!Array.isArray(rawPorts)) return fail(`${id}: spec.ports is not a list`);
  if (rawPorts.length > MAX_SERVICE_PORTS) {
    return fail(`${id}: spec.ports has ${rawPorts.length} entries, more than the ${MAX_SERVICE_PORTS} lbctl accepts`);
  }
  const seen = new Set<string>();
  for (const [i, p] of rawPorts.entries()) {
    if (!isObject(p)) return fail(`${id}: spec.ports[${i}] is not an object`);
    const name = p.name ?? '';
    if (typeof name !== 'string') return fail(`${id}: spec.ports[${i}].name is not a string`);
    if (!checkPort(p.port)) return fail(`${id}: spec.ports[${i}].port ${show(p.port)} is not a port (1-65535)`);
    const protocol = checkProtocol(p.protocol);
    if (!protocol) return fail(`${id}: spec.ports[${i}].protocol ${show(p.protocol)} is not TCP, UDP or SCTP`);
    const dup = `${p.port}/${protocol}`;
    if (seen.has(dup)) return fail(`${id}: spec.ports[${i}] repeats port ${dup}`);
    seen.add(dup);
    ports.push(servicePort(name, p.port, protocol));
  }

  const clusterIPs: ParsedIp[] = [];
  if (type !== 'ExternalName') {
    const ips = spec.clusterIPs ?? (spec.clusterIP !== undefined ? [spec.clusterIP] : []);
    if (!Array.isArray(ips)) return fail(`${id}: spec.clusterIPs is not a list`);
    if (ips.length > 2) return fail(`${id}: spec.clusterIPs has ${ips.length} entries (at most one per family)`);
    const headless = ips.length === 0 || ips[0] === 'None' || ips[0] === '';
    if (!headless) {
      for (const [i, text] of ips.entries()) {
        const ip = parseIp(text);
        if (!ip) return fail(`${id}: spec.clusterIPs[${i}] ${show(text)} is not an IP address`);
        if (clusterIPs.some((c) => c.family === ip.family)) return fail(`${id}: spec.clusterIPs has two IPv${ip.family} addresses`);
        clusterIPs.push(ip);
      }
      if (spec.clusterIP !== undefined && spec.clusterIPs !== undefined) {
        const first = parseIp(spec.clusterIP);
        if (!first || first.address !== clusterIPs[0]?.address) {
          return fail(`${id}: spec.clusterIP ${show(spec.clusterIP)} differs from spec.clusterIPs[0]`);
        }
      }
    }
  }

  let affinityTimeout: number | undefined;
  const affinity = spec.sessionAffinity ?? 'None';
  if (affinity === 'ClientIP') {
    const timeout = spec.sessionAffinityConfig?.clientIP?.timeoutSeconds ?? AFFINITY_TIMEOUT_DEFAULT;
    if (!Number.isInteger(timeout) || timeout < 1 || timeout > AFFINITY_TIMEOUT_MAX) {
      return fail(`${id}: sessionAffinityConfig.clientIP.timeoutSeconds ${show(timeout)} is not in 1..${AFFINITY_TIMEOUT_MAX}`);
    }
    affinityTimeout = timeout;
  } else if (affinity !== 'None') {
    return fail(`${id}: spec.sessionAffinity ${show(affinity)} is not None or ClientIP`);
  }
  const itp = spec.internalTrafficPolicy ?? 'Cluster';
  if (itp !== 'Cluster' && itp !== 'Local') return fail(`${id}: spec.internalTrafficPolicy ${show(itp)} is not Cluster or Local`);
  const proxyName = raw.metadata?.labels?.[SERVICE_PROXY_NAME_LABEL];
  const headlessLabel = raw.metadata?.labels?.[HEADLESS_LABEL] !== undefined;
  const annotations = (raw.metadata as { annotations?: Record<string, unknown> } | undefined)?.annotations;
  let lbAlgorithm: 'maglev' | 'random' = 'maglev';
  for (const a of LB_ALGORITHM_ANNOTATIONS) {
    const v = annotations?.[a];
    if (v === undefined) continue;
    if (v === 'random' || v === 'maglev') lbAlgorithm = v;
    else return fail(`${id}: annotation ${a} ${show(v)} is not maglev or random`);
    break;
  }
  let probe: ProbeSpec | undefined;
  let probeProblem: string | undefined;
  const probeText = annotations?.[READINESS_PROBE_ANNOTATION];
  if (probeText !== undefined && probeText !== null) {
    const p = parseProbeAnnotation(probeText);
    if (p.ok) probe = p.value;
    else probeProblem = `${id}: metadata.annotations[${READINESS_PROBE_ANNOTATION}]: ${p.reason.replace(/^readiness-probe: /, '')}; the service is served from its endpoint conditions, unprobed`;
  }
  // Headless and ExternalName services are not proxied at all: their
  // north-south fields are not read (nor reported).
  const ns = clusterIPs.length === 0 ? NO_NORTH_SOUTH : orNone(northSouth(raw as RawNorthSouth, id, clusterIPs.map((c) => c.family), ALL_PORTS));

  const extras: ServiceExtras = {
    internalTrafficPolicy: itp,
    affinityTimeout,
    proxyName: typeof proxyName === 'string' ? proxyName : undefined,
    headlessLabel,
    northSouth: ns,
    lbAlgorithm,
    probe,
    probeProblem,
  };
  // Exact copies of the lists built by push (packed(): no spare room kept per service).
  const value: Service = new ValidService(meta.value.namespace, meta.value.name, type, packed(clusterIPs), packed(ports), plainExtras(extras) ? PLAIN_EXTRAS : extras);
  return { ok: true, value };
}

/** The names of hints.forZones or hints.forNodes; undefined when none is given. */
function hintNames(list: unknown): readonly string[] | undefined {
  if (!Array.isArray(list)) return undefined;
  const names: string[] = [];
  for (const h of list) if (isObject(h) && typeof h.name === 'string' && h.name !== '') names.push(h.name);
  return names.length > 0 ? packed(names) : undefined;
}

/** EndpointSlice → normalized form. FQDN slices are valid but carry no family: reported as unusable. */
export function validateEndpointSlice(obj: unknown): Validated<EndpointSlice> {
  if (!isObject(obj)) return fail('EndpointSlice: not an object');
  const raw = obj as RawEndpointSlice;
  const meta = checkMeta(raw.metadata, 'EndpointSlice');
  if (!meta.ok) return meta;
  const id = `EndpointSlice ${meta.value.namespace}/${meta.value.name}`;
  const serviceName = raw.metadata?.labels?.[SERVICE_NAME_LABEL];
  if (typeof serviceName !== 'string' || serviceName.length === 0) {
    return fail(`${id}: label ${SERVICE_NAME_LABEL} is missing`);
  }
  const family = raw.addressType === 'IPv4' ? 4 : raw.addressType === 'IPv6' ? 6 : undefined;
  if (!family) return fail(`${id}: addressType ${show(raw.addressType)} is not IPv4 or IPv6`);

  const rawPorts = raw.ports ?? [];
  if (!Array.isArray(rawPorts)) return fail(`${id}: ports is not a list`);
  if (rawPorts.length > MAX_SLICE_PORTS) return fail(`${id}: ${rawPorts.length} ports, more than the API's ${MAX_SLICE_PORTS}`);
  const ports: ServicePort[] = [];
  for (const [i, p] of rawPorts.entries()) {
    if (!isObject(p)) return fail(`${id}: ports[${i}] is not an object`);
    const name = p.name ?? '';
    if (typeof name !== 'string') return fail(`${id}: ports[${i}].name is not a string`);
    // A nil port means "all ports" in the API; kube-proxy ignores such entries.
    if (p.port === undefined || p.port === null) continue;
    if (!checkPort(p.port)) return fail(`${id}: ports[${i}].port ${show(p.port)} is not a port (1-65535)`);
    const protocol = checkProtocol(p.protocol);
    if (!protocol) return fail(`${id}: ports[${i}].protocol ${show(p.protocol)} is not TCP, UDP or SCTP`);
    ports.push(servicePort(name, p.port, protocol));
  }

  const rawEndpoints = raw.endpoints ?? [];
  if (!Array.isArray(rawEndpoints)) return fail(`${id}: endpoints is not a list`);
  if (rawEndpoints.length > MAX_SLICE_ENDPOINTS) {
    return fail(`${id}: ${rawEndpoints.length} endpoints, more than the API's ${MAX_SLICE_ENDPOINTS}`);
  }
  const eps: EndpointSlot[] = [];
  for (const [i, e] of rawEndpoints.entries()) {
    if (!isObject(e)) return fail(`${id}: endpoints[${i}] is not an object`);
    if (!Array.isArray(e.addresses) || e.addresses.length === 0 || e.addresses.length > 100) {
      return fail(`${id}: endpoints[${i}].addresses must list 1 to 100 addresses`);
    }
    // Every address is checked; only the first is kept (see Endpoint.address).
    let address = '';
    for (const [j, text] of e.addresses.entries()) {
      const ip = parseIp(text);
      if (!ip) return fail(`${id}: endpoints[${i}].addresses[${j}] ${show(text)} is not an IP address`);
      if (ip.family !== family) return fail(`${id}: endpoints[${i}].addresses[${j}] ${text} is not ${raw.addressType}`);
      if (j === 0) address = ip.address;
    }
    const c = isObject(e.conditions) ? e.conditions : {};
    // As kube-proxy reads them: nil ready and nil serving mean true, nil terminating false.
    const ready = c.ready !== false;
    const serving = c.serving !== false;
    const terminating = c.terminating === true;
    const hints = isObject(e.hints) ? e.hints : undefined;
    const zoneHints = hintNames(hints?.forZones);
    const nodeHints = hintNames(hints?.forNodes);
    const conditions = (ready ? READY : 0) | (serving ? SERVING : 0) | (terminating ? TERMINATING : 0);
    const zone = typeof e.zone === 'string' ? sharedName(e.zone) : undefined;
    let rest: number | EndpointRest = conditions;
    if (zoneHints || nodeHints) rest = { conditions, zone, hints: { zoneHints, nodeHints } };
    else if (zone !== undefined && zone.length <= MAX_SHARED_NAME) rest = sharedRests.of(`${conditions}/${zone}`, () => Object.freeze({ conditions, zone, hints: undefined }));
    else if (zone !== undefined) rest = { conditions, zone, hints: undefined };
    eps.push(address, typeof e.nodeName === 'string' ? sharedName(e.nodeName) : undefined, rest);
  }
  const value: EndpointSlice = new ValidEndpointSlice(meta.value.namespace, meta.value.name, serviceName, family, packed(ports), packed(eps));
  return { ok: true, value };
}

/** Node → the facts lbctl uses: its name, zone and whether it is being deleted. */
export function validateNode(obj: unknown): Validated<Node> {
  if (!isObject(obj)) return fail('Node: not an object');
  const raw = obj as RawNode;
  const name = raw.metadata?.name;
  if (typeof name !== 'string' || name.length === 0) return fail('Node: metadata.name is missing');
  const zone = raw.metadata?.labels?.[ZONE_LABEL];
  const addresses: NodeAddress[] = [];
  const listed = raw.status?.addresses;
  if (listed !== undefined && !Array.isArray(listed)) return fail(`Node ${name}: status.addresses is not a list`);
  for (const [i, a] of (listed ?? []).entries()) {
    if (!isObject(a)) return fail(`Node ${name}: status.addresses[${i}] is not an object`);
    // Hostname, InternalDNS and ExternalDNS name the node; only IPs are probed.
    if (a.type !== 'InternalIP' && a.type !== 'ExternalIP') continue;
    const ip = parseIp(a.address);
    if (!ip) return fail(`Node ${name}: status.addresses[${i}].address ${show(a.address)} is not an IP address`);
    if (addresses.some((x) => x.address === ip.address)) continue;
    if (addresses.length === MAX_NODE_ADDRESSES) return fail(`Node ${name}: more than ${MAX_NODE_ADDRESSES} IP addresses in status.addresses`);
    addresses.push({ type: a.type, address: ip.address });
  }
  return {
    ok: true,
    // deletionTimestamp: a string in JSON, a Date in client-node's typed objects.
    value: {
      name,
      zone: typeof zone === 'string' && zone !== '' ? zone : undefined,
      deleting: raw.metadata?.deletionTimestamp != null,
      ...(addresses.length > 0 ? { addresses } : {}),
    },
  };
}
