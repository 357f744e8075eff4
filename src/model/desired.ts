// The desired state, kept up to date object by object: kube-proxy's change
// trackers in lbctl's terms. Each Service, EndpointSlice or Node change marks
// the services it touches; flush() recomputes those services only and
// reports which frontends changed, so a sync costs what changed, not what
// exists. A recomputed frontend equal to the one in force keeps its object
// (and is not reported), so an update that changes nothing lbctl programs
// writes nothing.
//
// Pure: no I/O. Conflicts (two services claiming one address:port/proto; the
// API server prevents it, files do not) leave the frontend with the service
// that holds it while it still claims it, so a newcomer cannot take over a
// served address; a frontend nobody holds yet goes to the first claimant by
// namespace, then name, whatever the order the objects arrived in (so at
// start, when nothing is held, the same objects give the same state).
//
// One service's computation is a boundary: if it throws (it should not: the
// objects are validated), that service keeps the frontends it had and the
// failure is reported as a skip; the others are computed as usual.
import type { EndpointSlice, Node, Service } from './k8s.js';
import { serviceFrontends, type Quarantine, type Skipped } from './from-k8s.js';
import { resolvePort, type ProbeTarget } from './probe.js';
import { DEFAULT_NODEPORT_RANGE, type PortRange, type SourceRange } from './north-south.js';
import { frontendKey, joinFlat, type Backend, type FrontendKey } from '../lb/types.js';
import type { DesiredState, Frontend } from './types.js';

/**
 * EndpointSlices read per Service: the first ones by name. The EndpointSlice
 * controller makes one per 100 endpoints, so this is 100,000 endpoints; more
 * is a runaway controller or a hostile source, not a service.
 */
export const MAX_SLICES_PER_SERVICE = 1000;

/** namespace/name of a Service, or the service an EndpointSlice belongs to. */
export type ServiceId = string;

export const serviceId = (namespace: string, name: string): ServiceId => joinFlat(namespace, '/', name);

export interface Flushed {
  /** Frontends added, changed or removed since the last flush. */
  readonly changed: ReadonlySet<FrontendKey>;
  /** Skips that appeared since the last flush (each reported once). */
  readonly newSkips: readonly Skipped[];
}

interface Computed {
  readonly frontends: ReadonlyMap<FrontendKey, Frontend>;
  readonly skipped: readonly Skipped[];
  /** Every selectable backend of some frontend is quarantined by its probe (issue 17). */
  readonly allFailed?: boolean;
}

const NONE: Computed = { frontends: new Map(), skipped: [] };

/** One backend address of a service with a readiness probe, and the probe aimed at it. */
export interface ServiceProbeTarget {
  readonly service: ServiceId;
  readonly target: ProbeTarget;
}

function sameBackends(a: readonly Backend[], b: readonly Backend[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) {
    const x = a[i]!;
    const y = b[i]!;
    if (x.address !== y.address || x.port !== y.port || x.protocol !== y.protocol || x.family !== y.family || x.state !== y.state) return false;
  }
  return true;
}

function sameRanges(a: readonly SourceRange[], b: readonly SourceRange[]): boolean {
  if (a === b) return true;
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) {
    const x = a[i]!;
    const y = b[i]!;
    if (x.address !== y.address || x.prefixLen !== y.prefixLen || x.family !== y.family) return false;
  }
  return true;
}

/** Same frontend, field by field: what the maps would hold, and where it came from. */
export function sameFrontend(a: Frontend, b: Frontend): boolean {
  return (
    a.key === b.key &&
    a.type === b.type &&
    a.affinityTimeout === b.affinityTimeout &&
    a.localOnly === b.localOnly &&
    a.scope === b.scope &&
    a.externalLocal === b.externalLocal &&
    a.healthCheckNodePort === b.healthCheckNodePort &&
    sameRanges(a.sourceRanges, b.sourceRanges) &&
    a.maglev === b.maglev &&
    a.service.namespace === b.service.namespace &&
    a.service.name === b.service.name &&
    a.service.portName === b.service.portName &&
    sameBackends(a.backends, b.backends) &&
    sameBackends(a.terminating, b.terminating)
  );
}

const skipKey = (s: Skipped): string => `${s.service}|${s.reason}|${s.detail ?? ''}`;

export interface DesiredModelOptions {
  /** --nodeport-range: nodePorts outside it are reported and not served. Default 30000-32767. */
  readonly nodePortRange?: PortRange;
  /** --probe-all-failed: when a probe quarantines every backend of a service, serve them all (open, the default) or none (closed). */
  readonly probeAllFailed?: 'open' | 'closed';
}

/** The external key of an internal-scope frontend's twin. */
const externalKeyOf = (fe: Frontend): FrontendKey => frontendKey({ address: fe.address, family: fe.family, port: fe.port, protocol: fe.protocol });

export class DesiredModel {
  private readonly nodePortRange: PortRange;
  private readonly services = new Map<ServiceId, Service>();
  /** Slices by their own namespace/name (a slice may move to another service). */
  private readonly slices = new Map<string, EndpointSlice>();
  private readonly slicesBySvc = new Map<ServiceId, Map<string, EndpointSlice>>();
  private node: Node | undefined;
  private readonly dirty = new Set<ServiceId>();
  private readonly computed = new Map<ServiceId, Computed>();
  /** Who asks for each frontend key; more than one only in a conflict. */
  private readonly claims = new Map<FrontendKey, ServiceId[]>();
  private readonly current = new Map<FrontendKey, Frontend>();
  private readonly conflicts = new Map<FrontendKey, Skipped[]>();
  private servicesWithFrontends = 0;
  private readonly probeAllFailed: 'open' | 'closed';
  /** Services whose Service carries a valid readiness probe. */
  private readonly probed = new Set<ServiceId>();
  /** Addresses each service's probe quarantined (only non-empty sets are kept). */
  private quarantined = new Map<ServiceId, ReadonlySet<string>>();
  /** Services with every selectable backend of some frontend quarantined, as of the last flush. */
  private readonly allFailed = new Set<ServiceId>();

  constructor(opts: DesiredModelOptions = {}) {
    this.nodePortRange = opts.nodePortRange ?? DEFAULT_NODEPORT_RANGE;
    this.probeAllFailed = opts.probeAllFailed ?? 'open';
  }

  /** The policy when every backend of a service is quarantined. */
  get allFailedPolicy(): 'open' | 'closed' {
    return this.probeAllFailed;
  }

  /**
   * The backends each service's readiness probe quarantined, by address
   * (all of them: a service not named has none). A quarantined backend
   * goes to the non-selectable slots, as a terminating one (applyQuarantine).
   * Only the services whose set changed are recomputed at the next flush.
   */
  setQuarantined(next: ReadonlyMap<ServiceId, ReadonlySet<string>>): boolean {
    let changed = false;
    const same = (a: ReadonlySet<string> | undefined, b: ReadonlySet<string> | undefined): boolean =>
      (a?.size ?? 0) === (b?.size ?? 0) && [...(a ?? [])].every((x) => b!.has(x));
    for (const [id, set] of this.quarantined) {
      if (same(set, next.get(id))) continue;
      if (this.services.has(id)) this.dirty.add(id);
      changed = true;
    }
    const kept = new Map<ServiceId, ReadonlySet<string>>();
    for (const [id, set] of next) {
      if (set.size === 0) continue;
      kept.set(id, set);
      if (this.quarantined.has(id)) continue;
      if (this.services.has(id)) this.dirty.add(id);
      changed = true;
    }
    this.quarantined = kept;
    return changed;
  }

  /** Services that have every selectable backend of a frontend quarantined (under either policy). */
  get allFailedServices(): ReadonlySet<ServiceId> {
    return this.allFailed;
  }

  /** Whether the service carries a valid readiness probe. */
  hasProbe(id: ServiceId): boolean {
    return this.probed.has(id);
  }

  /**
   * What to probe: every endpoint address of every service with a
   * readiness probe, with the probe's port resolved against the port names
   * of the endpoint's own slice (a named port, as kubelet resolves it
   * against the container's). Endpoints whose slice has no port of that
   * name are not probed and listed in `unresolved` (they stay as their
   * conditions say). Pure; ordered by service, then slice name.
   */
  probeTargets(): { targets: ServiceProbeTarget[]; unresolved: Array<{ service: ServiceId; detail: string }> } {
    const targets: ServiceProbeTarget[] = [];
    const unresolved: Array<{ service: ServiceId; detail: string }> = [];
    for (const id of [...this.probed].sort()) {
      const spec = this.services.get(id)?.probe;
      if (!spec) continue;
      const slices = [...(this.slicesBySvc.get(id)?.values() ?? [])].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)).slice(0, MAX_SLICES_PER_SERVICE);
      const seen = new Set<string>();
      for (const slice of slices) {
        const port = resolvePort(spec.handler.port, slice.ports);
        if (port === undefined) {
          if (slice.endpoints.length > 0) unresolved.push({ service: id, detail: `readiness probe port ${JSON.stringify(spec.handler.port)} names no port of EndpointSlice ${slice.namespace}/${slice.name}: its ${slice.endpoints.length} endpoints are not probed` });
          continue;
        }
        for (const ep of slice.endpoints) {
          const k = `${ep.address}|${port}`;
          if (seen.has(k)) continue;
          seen.add(k);
          targets.push({ service: id, target: { address: ep.address, port, spec } });
        }
      }
    }
    return { targets, unresolved };
  }

  /** Every frontend in force, by key. */
  get frontends(): ReadonlyMap<FrontendKey, Frontend> {
    return this.current;
  }

  /** Services that ask for at least one frontend. */
  get serviceCount(): number {
    return this.servicesWithFrontends;
  }

  setService(id: ServiceId, svc: Service | undefined): void {
    if (svc) this.services.set(id, svc);
    else if (!this.services.delete(id)) return;
    if (svc?.probe) this.probed.add(id);
    else this.probed.delete(id);
    this.dirty.add(id);
  }

  setSlice(id: string, slice: EndpointSlice | undefined): void {
    const old = this.slices.get(id);
    if (old) {
      const owner = serviceId(old.namespace, old.serviceName);
      const list = this.slicesBySvc.get(owner);
      list?.delete(id);
      if (list?.size === 0) this.slicesBySvc.delete(owner);
      this.dirty.add(owner);
    }
    if (!slice) {
      this.slices.delete(id);
      return;
    }
    this.slices.set(id, slice);
    const owner = serviceId(slice.namespace, slice.serviceName);
    let list = this.slicesBySvc.get(owner);
    if (!list) this.slicesBySvc.set(owner, (list = new Map()));
    list.set(id, slice);
    this.dirty.add(owner);
  }

  /** This node. Only what selection reads (name, zone) makes every service dirty. */
  setNode(node: Node | undefined): void {
    const before = this.node;
    this.node = node;
    if (before?.name === node?.name && before?.zone === node?.zone) return;
    for (const id of this.services.keys()) this.dirty.add(id);
  }

  /** Recomputes the dirty services and settles the frontends they touch. */
  flush(): Flushed {
    const changed = new Set<FrontendKey>();
    const newSkips: Skipped[] = [];
    if (this.dirty.size === 0) return { changed, newSkips };
    const touched = new Set<FrontendKey>();
    for (const id of this.dirty) {
      const before = this.computed.get(id) ?? NONE;
      const svc = this.services.get(id);
      const after = svc ? this.compute(svc, id, before) : NONE;
      if (after.frontends.size === 0 && after.skipped.length === 0) this.computed.delete(id);
      else this.computed.set(id, after);
      if (after.allFailed) this.allFailed.add(id);
      else this.allFailed.delete(id);
      this.servicesWithFrontends += (after.frontends.size > 0 ? 1 : 0) - (before.frontends.size > 0 ? 1 : 0);

      if (after.skipped.length > 0) {
        const had = new Set(before.skipped.map(skipKey));
        for (const s of after.skipped) if (!had.has(skipKey(s))) newSkips.push(s);
      }
      for (const key of before.frontends.keys()) {
        if (after.frontends.has(key)) continue;
        this.unclaim(key, id);
        touched.add(key);
      }
      for (const key of after.frontends.keys()) {
        const list = this.claims.get(key);
        if (!list) this.claims.set(key, [id]);
        else if (!list.includes(id)) list.push(id);
        touched.add(key);
      }
    }
    this.dirty.clear();

    // External keys first: an internal-scope twin goes with its external
    // key (settleTwin), so a key whose holder changed touches its twin too.
    const twins: FrontendKey[] = [];
    for (const key of touched) {
      if (this.claimedTwin(key) !== undefined) {
        twins.push(key);
        continue;
      }
      const was = this.current.get(key);
      if (!this.apply(key, this.settle(key, newSkips))) continue;
      changed.add(key);
      const fe = this.current.get(key) ?? was!;
      const twin = frontendKey({ address: fe.address, family: fe.family, port: fe.port, protocol: fe.protocol, scope: 'internal' });
      if (this.claims.has(twin) && !touched.has(twin)) twins.push(twin);
    }
    for (const key of twins) if (this.apply(key, this.settleTwin(key))) changed.add(key);
    return { changed, newSkips };
  }

  /** Puts the winner's frontend for `key` in force; true when that changed what is in force. */
  private apply(key: FrontendKey, winner: ServiceId | undefined): boolean {
    const fe = winner === undefined ? undefined : this.computed.get(winner)!.frontends.get(key);
    const have = this.current.get(key);
    if (fe === have) return false;
    if (fe) this.current.set(key, fe);
    else this.current.delete(key);
    return true;
  }

  /** A claimed internal-scope frontend at `key` (any claimant's), else undefined. */
  private claimedTwin(key: FrontendKey): Frontend | undefined {
    const list = this.claims.get(key);
    const fe = list && list.length > 0 ? this.computed.get(list[0]!)?.frontends.get(key) : undefined;
    return fe?.scope === 'internal' ? fe : undefined;
  }

  /**
   * The holder of an internal-scope key: the service that holds its external
   * key, when it claims the twin too; otherwise nobody (a claimant that lost
   * the external key was reported there). The datapath reads the internal
   * entry only through the external one's two-scopes flag, so the two must
   * belong to one service.
   */
  private settleTwin(key: FrontendKey): ServiceId | undefined {
    const list = this.claims.get(key);
    const fe = this.claimedTwin(key);
    if (!list || !fe) return undefined;
    const held = this.current.get(externalKeyOf(fe));
    const holder = held && serviceId(held.service.namespace, held.service.name);
    return holder !== undefined && list.includes(holder) ? holder : undefined;
  }

  /** Every current skip: the services' own, then lost conflicts. */
  skipped(): Skipped[] {
    const out: Skipped[] = [];
    for (const c of this.computed.values()) for (const s of c.skipped) out.push(s);
    for (const list of this.conflicts.values()) out.push(...list);
    return out;
  }

  /** One service's frontends; one equal to its previous version keeps the previous object. */
  private compute(svc: Service, id: ServiceId, before: Computed): Computed {
    const m = this.slicesBySvc.get(id);
    let slices = m ? [...m.values()] : [];
    const extra: Skipped[] = [];
    if (slices.length > MAX_SLICES_PER_SERVICE) {
      slices = slices.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)).slice(0, MAX_SLICES_PER_SERVICE);
      extra.push({ service: id, reason: 'limit', detail: `${m!.size} EndpointSlices, more than ${MAX_SLICES_PER_SERVICE}: the first ${MAX_SLICES_PER_SERVICE} by name are used` });
    }
    let out: ReturnType<typeof serviceFrontends>;
    // Probe verdicts count only while the service still has its probe.
    const addresses = svc.probe ? this.quarantined.get(id) : undefined;
    const quarantine: Quarantine | undefined = addresses ? { addresses, allFailed: this.probeAllFailed } : undefined;
    try {
      out = serviceFrontends(svc, slices, this.node, this.nodePortRange, quarantine);
    } catch (err) {
      // The boundary: this service keeps what it had; the failure is reported.
      const detail = `its frontends could not be computed (${(err as Error)?.message ?? String(err)}); the last ones stay`;
      return { frontends: before.frontends, skipped: [{ service: id, reason: 'error', detail }], ...(before.allFailed ? { allFailed: true } : {}) };
    }
    if (extra.length > 0) out = { ...out, frontends: out.frontends, skipped: [...extra, ...out.skipped] };
    const frontends = new Map<FrontendKey, Frontend>();
    for (const fe of out.frontends) {
      const prev = before.frontends.get(fe.key);
      frontends.set(fe.key, prev && sameFrontend(prev, fe) ? prev : fe);
    }
    return out.allFailed ? { frontends, skipped: out.skipped, allFailed: true } : { frontends, skipped: out.skipped };
  }

  private unclaim(key: FrontendKey, id: ServiceId): void {
    const list = this.claims.get(key);
    if (!list) return;
    const i = list.indexOf(id);
    if (i >= 0) list.splice(i, 1);
    if (list.length === 0) this.claims.delete(key);
  }

  /**
   * The claimant that holds `key`: the one holding it now while it still
   * claims it, else the first by namespace, then name; the others'
   * conflicts recorded.
   */
  private settle(key: FrontendKey, newSkips: Skipped[]): ServiceId | undefined {
    const list = this.claims.get(key);
    const previous = this.conflicts.get(key);
    if (previous) this.conflicts.delete(key);
    if (!list || list.length === 0) return undefined;
    if (list.length === 1) return list[0];
    const held = this.current.get(key);
    const holder = held && serviceId(held.service.namespace, held.service.name);
    const svc = (id: ServiceId): Service => this.services.get(id)!;
    const before = (a: ServiceId, b: ServiceId): number => {
      const x = svc(a);
      const y = svc(b);
      return x.namespace === y.namespace ? (x.name < y.name ? -1 : x.name > y.name ? 1 : 0) : x.namespace < y.namespace ? -1 : 1;
    };
    list.sort(before);
    if (holder !== undefined && list.includes(holder)) list.splice(0, 0, ...list.splice(list.indexOf(holder), 1));
    const [winner, ...losers] = list;
    const had = new Set((previous ?? []).map(skipKey));
    const fe = this.computed.get(winner!)?.frontends.get(key);
    const what = fe?.type === 'NodePort' ? `nodePort ${fe.port}/${fe.protocol} (${key})` : key;
    const skips = losers.map((id): Skipped => ({ service: id, reason: 'conflict', detail: `${what} is already served for ${winner}` }));
    for (const s of skips) if (!had.has(skipKey(s))) newSkips.push(s);
    this.conflicts.set(key, skips);
    return winner;
  }
}

export interface ModelInput {
  readonly services: Iterable<Service>;
  readonly slices: Iterable<EndpointSlice>;
  /** This node: for internalTrafficPolicy Local and topology hints. */
  readonly node?: Node;
  /** --nodeport-range; default 30000-32767. */
  readonly nodePortRange?: PortRange;
}

export interface ModelOutput {
  readonly frontends: DesiredState;
  readonly skipped: readonly Skipped[];
}

/** The desired state of a whole set of objects at once. */
export function desiredState(input: ModelInput): ModelOutput {
  const m = new DesiredModel(input.nodePortRange ? { nodePortRange: input.nodePortRange } : {});
  m.setNode(input.node);
  for (const s of input.services) m.setService(serviceId(s.namespace, s.name), s);
  for (const s of input.slices) m.setSlice(serviceId(s.namespace, s.name), s);
  m.flush();
  return { frontends: m.frontends, skipped: m.skipped() };
}
