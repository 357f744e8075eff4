// Kubernetes objects → desired frontends. Pure and deterministic: the same
// objects give the same state, in any order. Endpoint selection follows
// kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go): ready endpoints,
// filtered by node or zone hints or internalTrafficPolicy Local, falling
// back to serving-and-terminating ones when none is left.
import { HEADLESS_LABEL, type Endpoint, type EndpointSlice, type Node, type Service } from './k8s.js';
import { backendKey, frontendKey, Interner, type Backend, type Protocol, type BackendKey, type FrontendKey, type Scope, type ServiceType } from '../lb/types.js';
import { DEFAULT_NODEPORT_RANGE, nodePortOutside, type PortRange, type SourceRange } from './north-south.js';
import type { Frontend, ServiceRef } from './types.js';

/** A service lbctl deliberately does not program, and why. */
export interface Skipped {
  readonly service: string;
  readonly reason:
    | 'headless'
    | 'external-name'
    | 'no-ports'
    /** A north-south field's value lbctl cannot serve (north-south.ts): left out, the rest served. */
    | 'ignored-field'
    | 'conflict'
    | 'other-proxy'
    /** Beyond a limit of the model's (EndpointSlices per Service): what fits is used. */
    | 'limit'
    /** Its computation threw: its last frontends stay in force. */
    | 'error';
  readonly detail?: string;
}

interface Candidate {
  readonly backend: Omit<Backend, 'state'>;
  readonly key: BackendKey;
  readonly ep: Endpoint;
  /** The endpoint's nodeName is this node (kube-proxy's IsLocal). */
  readonly local: boolean;
}

const byKey = (a: Candidate, b: Candidate): number => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0);
const bySliceName = (a: EndpointSlice, b: EndpointSlice): number => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);

/**
 * Whether `x` replaces `have`, two entries for one address:port (slices
 * overlap while the controller moves an endpoint, and a pod IP can be reused
 * while the old pod is still terminating). kube-proxy's endpointslicecache
 * (addEndpoints) keeps the non-terminating entry, whatever the order. Where
 * its result depends on the order (both entries terminating, or neither:
 * "undefined", its comment says), lbctl decides by content: the more usable
 * entry (ready, then serving), then the one on this node (older kube-proxy
 * always kept the local one), then the first (slices go in name order).
 */
function replaces(x: Candidate, have: Candidate): boolean {
  if (x.ep.terminating !== have.ep.terminating) return !x.ep.terminating;
  const usable = (e: Endpoint): number => (e.ready ? 2 : e.serving ? 1 : 0);
  const ux = usable(x.ep);
  const uh = usable(have.ep);
  if (ux !== uh) return ux > uh;
  return x.local && !have.local;
}

/**
 * Every endpoint of one service port in one family, merged over the
 * service's slices (given in name order). A slice port matches by name and
 * protocol: that is how the EndpointSlice controller resolves named
 * targetPorts (per pod) into numbers.
 */
function candidates(slices: readonly EndpointSlice[], family: 4 | 6, portName: string, protocol: Protocol, nodeName: string | undefined): Candidate[] {
  const seen = new Map<BackendKey, Candidate>();
  for (const slice of slices) {
    if (slice.family !== family) continue;
    const port = slice.ports.find((p) => p.name === portName && p.protocol === protocol);
    if (!port) continue;
    for (const ep of slice.endpoints) {
      const backend = { address: ep.address, family, port: port.port, protocol };
      const k = backendKey(backend);
      const c: Candidate = { backend, key: k, ep, local: nodeName !== undefined && ep.nodeName === nodeName };
      const have = seen.get(k);
      if (!have || replaces(c, have)) seen.set(k, c);
    }
  }
  return [...seen.values()].sort(byKey);
}

type TopologyMode = '' | 'PreferSameNode' | 'PreferSameZone';

/**
 * kube-proxy's topologyModeFromHints, over ready endpoints only: node hints
 * when every ready endpoint has one and some endpoint is hinted for this
 * node; otherwise zone hints when every ready endpoint has one and some is
 * hinted for this node's zone; otherwise none (cluster-wide).
 */
function topologyMode(eps: readonly Candidate[], node: Node | undefined): TopologyMode {
  let allNodeHints = true;
  let forNode = false;
  let allZoneHints = true;
  let forZone = false;
  for (const { ep } of eps) {
    if (!ep.ready) continue;
    if (!ep.nodeHints) allNodeHints = false;
    else if (node && ep.nodeHints.includes(node.name)) forNode = true;
    if (!ep.zoneHints) allZoneHints = false;
    else if (node?.zone !== undefined && ep.zoneHints.includes(node.zone)) forZone = true;
  }
  // With no ready endpoint, forNode and forZone stay false: no topology.
  if (allNodeHints && forNode) return 'PreferSameNode';
  if (allZoneHints && forZone) return 'PreferSameZone';
  return '';
}

/** kube-proxy's availableForTopology: no fallback here, it happened when the mode was chosen. */
function availableForTopology(ep: Endpoint, mode: TopologyMode, node: Node | undefined): boolean {
  if (mode === 'PreferSameNode') return ep.nodeHints!.includes(node!.name);
  if (mode === 'PreferSameZone') return ep.zoneHints!.includes(node!.zone!);
  return true;
}

const servingTerminating = (c: Candidate): boolean => c.ep.serving && c.ep.terminating;

function asBackend(c: Candidate): Backend {
  const b = c.backend;
  return { address: b.address, family: b.family, port: b.port, protocol: b.protocol, state: c.ep.terminating ? 'terminating' : 'active' };
}

/** Selectable and non-selectable (terminating) backends of one frontend. */
export function selectBackends(
  eps: readonly Candidate[],
  svc: Pick<Service, 'internalTrafficPolicy'>,
  node: Node | undefined,
): { backends: Backend[]; terminating: readonly Backend[] } {
  let chosen: Candidate[];
  if (svc.internalTrafficPolicy === 'Local') {
    // Topology is ignored for Local; its terminating fallback is local too.
    chosen = eps.filter((c) => c.local && c.ep.ready);
    if (chosen.length === 0) chosen = eps.filter((c) => c.local && servingTerminating(c));
  } else {
    const mode = topologyMode(eps, node);
    chosen = eps.filter((c) => c.ep.ready && availableForTopology(c.ep, mode, node));
    // A topology mode is chosen only with a ready endpoint for it, so an
    // empty list means no ready endpoint anywhere: the fallback ignores topology.
    if (chosen.length === 0) chosen = eps.filter(servingTerminating);
  }
  const backends = chosen.map(asBackend);
  // Terminating endpoints not chosen stay as non-selectable slots (most services have none).
  if (!eps.some((c) => c.ep.terminating)) return { backends, terminating: NO_BACKENDS };
  const selected = new Set(chosen);
  return { backends, terminating: eps.filter((c) => c.ep.terminating && !selected.has(c)).map(asBackend) };
}

/**
 * Readiness probes' verdicts for one service (standalone mode, issue 17):
 * the addresses of its endpoints their probe quarantined, and what to do
 * when that is every backend (the agent's --probe-all-failed).
 */
export interface Quarantine {
  readonly addresses: ReadonlySet<string>;
  readonly allFailed: 'open' | 'closed';
}

/**
 * A frontend's backends with the quarantined ones moved to the
 * non-selectable slots (state 'quarantined'), as terminating endpoints are:
 * new connections avoid them, established ones keep them. When that would
 * leave no selectable backend of some, fail open keeps the selection as it
 * was (a probe that fails everywhere does not take the service down), fail
 * closed leaves none selectable. `allFailed`: every selectable backend was
 * quarantined (either way). Pure.
 */
export function applyQuarantine(chosen: { backends: Backend[]; terminating: readonly Backend[] }, q: Quarantine): { backends: Backend[]; terminating: readonly Backend[]; allFailed: boolean } {
  if (q.addresses.size === 0 || !chosen.backends.some((b) => q.addresses.has(b.address))) return { ...chosen, allFailed: false };
  const kept = chosen.backends.filter((b) => !q.addresses.has(b.address));
  if (kept.length === 0 && q.allFailed === 'open') return { ...chosen, allFailed: true };
  const out = chosen.backends.filter((b) => q.addresses.has(b.address)).map((b): Backend => ({ ...b, state: 'quarantined' }));
  const terminating = [...out, ...chosen.terminating].sort((a, b) => {
    const x = backendKey(a);
    const y = backendKey(b);
    return x < y ? -1 : x > y ? 1 : 0;
  });
  return { backends: kept, terminating, allFailed: kept.length === 0 };
}

const NO_RANGES: readonly SourceRange[] = Object.freeze([]);

/**
 * What a frontend asks of the datapath beyond its address and backends:
 * the same for most frontends (a plain ClusterIP one has the defaults), so
 * one object serves all the frontends that ask alike.
 */
interface FrontendOptions {
  readonly type: ServiceType;
  readonly affinityTimeout: number;
  readonly localOnly: boolean;
  readonly scope: Scope | undefined;
  readonly externalLocal: boolean;
  readonly sourceRanges: readonly SourceRange[];
  readonly maglev: boolean;
  readonly healthCheckNodePort: number | undefined;
}

/**
 * Options without source ranges, shared by value (bounded: Interner).
 * Options with source ranges (LoadBalancer frontends that set them) are
 * each frontend's own.
 */
const sharedOptions = new Interner<FrontendOptions>(4096);

function frontendOptions(
  type: ServiceType,
  affinityTimeout: number,
  localOnly: boolean,
  scope: Scope | undefined,
  externalLocal: boolean,
  sourceRanges: readonly SourceRange[],
  maglev: boolean,
  healthCheckNodePort: number | undefined,
): FrontendOptions {
  const make = (): FrontendOptions => Object.freeze({ type, affinityTimeout, localOnly, scope, externalLocal, sourceRanges, maglev, healthCheckNodePort });
  if (sourceRanges.length > 0) return make();
  return sharedOptions.of(`${type}|${affinityTimeout}|${localOnly ? 1 : 0}|${scope ?? ''}|${externalLocal ? 1 : 0}|${maglev ? 1 : 0}|${healthCheckNodePort ?? ''}`, make);
}

/**
 * A frontend as kept: its address, key, origin and backends, and its
 * options in a shared object read through getters (9 fields instead of
 * 16: 96 bytes instead of 152 per frontend).
 *
 * Holds `make bench`'s steady RSS at 100,000 services near its 300 MiB
 * target: 5.3 MiB of heap at 100,000 against plain frontend objects
 * (bench/profile/sync.ts: 50.0 against 55.3 MiB of frontends).
 * Measured on Node 24 (bench/run.ts --sizes 100000 --modes lbctl, alternated
 * in one session, 2026-12-06, 2 vCPUs): steady RSS at 100,000 services 301
 * and 304 MiB with this and the other model structures of its kind
 * (ValidFrontend's and ValidService's shared options, the node-name and
 * zone interners), 317 MiB with all of them plain objects and plain
 * strings (branch issue35-ds), against `make bench`'s 300 MiB target.
 */
class ValidFrontend implements Frontend {
  constructor(
    readonly address: string,
    readonly family: 4 | 6,
    readonly port: number,
    readonly protocol: Protocol,
    readonly key: FrontendKey,
    readonly service: ServiceRef,
    readonly backends: readonly Backend[],
    readonly terminating: readonly Backend[],
    private readonly o: FrontendOptions,
  ) {}

  get type(): ServiceType {
    return this.o.type;
  }

  get affinityTimeout(): number {
    return this.o.affinityTimeout;
  }

  get localOnly(): boolean {
    return this.o.localOnly;
  }

  get scope(): Scope | undefined {
    return this.o.scope;
  }

  get externalLocal(): boolean {
    return this.o.externalLocal;
  }

  get sourceRanges(): readonly SourceRange[] {
    return this.o.sourceRanges;
  }

  get maglev(): boolean {
    return this.o.maglev;
  }

  get healthCheckNodePort(): number | undefined {
    return this.o.healthCheckNodePort;
  }
}

/** No terminating backends: one shared empty list, not one per frontend. */
const NO_BACKENDS: readonly Backend[] = Object.freeze([]);
type Chosen = ReturnType<typeof selectBackends>;
/** Selection for the external entries: externalTrafficPolicy Local or Cluster, through selectBackends. */
const LOCAL_POLICY = { internalTrafficPolicy: 'Local' } as const;
const CLUSTER_POLICY = { internalTrafficPolicy: 'Cluster' } as const;

/**
 * The frontends one service asks for (before conflicts with other services
 * are settled). Per family of its cluster IPs and per port:
 * - the ClusterIP frontend, backends chosen by internalTrafficPolicy;
 * - NodePort and LoadBalancer services, with a nodePort in `nodePortRange`:
 *   a NodePort frontend at 0.0.0.0 or :: (the surrogate the tc datapath
 *   matches on every node address), port = the nodePort;
 * - one ExternalIP frontend per external IP of the family, and one
 *   LoadBalancer frontend per ingress IP (ipMode VIP; none when the source
 *   ranges fail closed), port = the service port.
 * Those external frontends follow externalTrafficPolicy: Cluster picks as
 * a ClusterIP frontend without internalTrafficPolicy would; Local picks
 * only this node's endpoints (as internalTrafficPolicy Local does: ready
 * ones, else serving terminating ones) and adds an internal-scope twin at
 * the same address, port and protocol, chosen by internalTrafficPolicy,
 * so a client on this node still reaches every backend (Cilium's two
 * scopes; kube-proxy sends such clients to its cluster endpoints, which
 * differs only under internalTrafficPolicy Local).
 * Bad north-south values are skipped with the field named; the rest of the
 * service is served.
 */
export function serviceFrontends(
  svc: Service,
  svcSlices: readonly EndpointSlice[],
  node: Node | undefined,
  nodePortRange: PortRange = DEFAULT_NODEPORT_RANGE,
  quarantine?: Quarantine,
): { frontends: Frontend[]; skipped: Skipped[]; allFailed?: boolean } {
  const id = `${svc.namespace}/${svc.name}`;
  const frontends: Frontend[] = [];
  const skipped: Skipped[] = [];
  if (svc.proxyName !== undefined) return { frontends, skipped: [{ service: id, reason: 'other-proxy', detail: svc.proxyName }] };
  if (svc.headlessLabel) return { frontends, skipped: [{ service: id, reason: 'headless', detail: `it carries the label ${HEADLESS_LABEL}` }] };
  if (svc.type === 'ExternalName') return { frontends, skipped: [{ service: id, reason: 'external-name' }] };
  if (svc.clusterIPs.length === 0) return { frontends, skipped: [{ service: id, reason: 'headless' }] };
  if (svc.ports.length === 0) return { frontends, skipped: [{ service: id, reason: 'no-ports' }] };
  const ns = svc.northSouth;
  for (const problem of ns.problems) skipped.push({ service: id, reason: 'ignored-field', detail: problem });
  let nodePorts = ns.nodePorts;
  if (nodePorts.length > 0) {
    nodePorts = nodePorts.filter((np) => {
      const outside = nodePortOutside(np, `Service ${id}`, nodePortRange);
      if (outside) skipped.push({ service: id, reason: 'ignored-field', detail: outside });
      return outside === undefined;
    });
  }
  const lbIPs = ns.sourceRangesFailClosed ? [] : ns.loadBalancerIPs.filter((l) => l.ipMode === 'VIP');
  const external = nodePorts.length > 0 || ns.externalIPs.length > 0 || lbIPs.length > 0;
  const externalLocal = external && ns.externalTrafficPolicy === 'Local';
  const affinityTimeout = svc.affinityTimeout ?? 0;
  const localOnly = svc.internalTrafficPolicy === 'Local';
  // Name order, so an address in two slices resolves the same whatever order they arrived in.
  const slices = svcSlices.length > 1 ? [...svcSlices].sort(bySliceName) : svcSlices;
  const hc = ns.healthCheckNodePort;
  const lbRanges = ns.sourceRanges.length > 0 ? ns.sourceRanges : NO_RANGES;
  let allFailed = false;
  // Per port: where it came from, and its nodePort in the range.
  const perPort = svc.ports.map((p) => ({
    p,
    service: { namespace: svc.namespace, name: svc.name, portName: p.name },
    np: nodePorts.find((n) => n.port === p.port && n.protocol === p.protocol),
  }));
  for (const ip of svc.clusterIPs) {
    for (const { p, service, np } of perPort) {
      // Every frontend made by one constructor: one hidden class for all.
      const make = (address: string, port: number, type: ServiceType, chosen: Chosen, scope: Scope | undefined, extLocal: boolean, sourceRanges: readonly SourceRange[]): Frontend =>
        new ValidFrontend(
          address,
          ip.family,
          port,
          p.protocol,
          frontendKey({ address, family: ip.family, port, protocol: p.protocol, scope }),
          service,
          chosen.backends,
          chosen.terminating,
          frontendOptions(
            type,
            affinityTimeout,
            localOnly,
            scope,
            extLocal,
            sourceRanges,
            type !== 'ClusterIP' && scope === undefined && svc.lbAlgorithm === 'maglev',
            type === 'ClusterIP' ? undefined : hc,
          ),
        );
      const eps = candidates(slices, ip.family, p.name, p.protocol, node?.name);
      const pick = (policy: Pick<Service, 'internalTrafficPolicy'>): Chosen => {
        const chosen = selectBackends(eps, policy, node);
        if (!quarantine) return chosen;
        const q = applyQuarantine(chosen, quarantine);
        if (q.allFailed) allFailed = true;
        return { backends: q.backends, terminating: q.terminating };
      };
      const internal = pick(svc);
      frontends.push(make(ip.address, p.port, 'ClusterIP', internal, undefined, false, NO_RANGES));
      if (!external) continue;
      const outside = pick(externalLocal ? LOCAL_POLICY : CLUSTER_POLICY);
      const add = (address: string, port: number, type: ServiceType, ranges: readonly SourceRange[]): void => {
        frontends.push(make(address, port, type, outside, undefined, externalLocal, ranges));
        if (externalLocal) frontends.push(make(address, port, type, internal, 'internal', true, ranges));
      };
      if (np) add(ip.family === 4 ? '0.0.0.0' : '::', np.nodePort, 'NodePort', NO_RANGES);
      for (const e of ns.externalIPs) if (e.family === ip.family) add(e.address, p.port, 'ExternalIP', NO_RANGES);
      for (const l of lbIPs) if (l.family === ip.family) add(l.address, p.port, 'LoadBalancer', lbRanges);
    }
  }
  if (!external) return allFailed ? { frontends, skipped, allFailed } : { frontends, skipped };
  // An external or ingress IP may repeat the service's own cluster IP, or
  // each other: the first frontend of a key stays, in kube-proxy's rule
  // order (cluster IP, external IPs, LoadBalancer IPs).
  const seen = new Set<string>();
  const unique = frontends.filter((f) => !seen.has(f.key) && seen.add(f.key));
  return allFailed ? { frontends: unique, skipped, allFailed } : { frontends: unique, skipped };
}
