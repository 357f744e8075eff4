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
import { frontendKey, joinFlat, packed, type Backend, type FrontendKey } from '../lb/types.js';
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

/**
 * Everything the model keeps for one service id, in one record: the
 * Service (when there is one), its EndpointSlices, and the frontends and
 * skips computed from them. One record instead of a Map per kind (services,
 * slices by service, computed) and a Map per service (its slices, its
 * frontends): at 100,000 services those Maps cost about 500 bytes a service
 * (docs/architecture.md, "Why the agent is built for 100,000 services"). A
 * record lives while any of its parts
 * does.
 */
interface ServiceEntry {
  svc: Service | undefined;
  /**
   * Its EndpointSlices: none, the one it has (nearly every service: one
   * slice holds 100 endpoints), or, from the second on, a Set. The objects
   * are the ones `slices` holds by id, so identity finds one.
   */
  slices: EndpointSlice | Set<EndpointSlice> | undefined;
  /**
   * What the last flush computed: the frontends it asks for (no two with
   * one key), the one itself when it asks for one (most services: no
   * array), and its skips.
   */
  frontends: Frontend | readonly Frontend[];
  /** The frontends by key, when there are more than INDEX_FROM (below that, a scan is cheaper than a Map). */
  index: ReadonlyMap<FrontendKey, Frontend> | undefined;
  skipped: readonly Skipped[];
  /** Every selectable backend of some frontend is quarantined by its probe (issue 17). */
  allFailed: boolean;
}

/** A service with more frontends than this keeps a Map of them by key. */
const INDEX_FROM = 8;

const NO_FRONTENDS: readonly Frontend[] = Object.freeze([]);
const NO_SKIPS: readonly Skipped[] = Object.freeze([]);

/** The frontend of `e` at `key`, if it asks for one. */
function frontendAt(e: ServiceEntry | undefined, key: FrontendKey): Frontend | undefined {
  if (!e) return undefined;
  if (e.index) return e.index.get(key);
  const f = e.frontends;
  if (!isList(f)) return f.key === key ? f : undefined;
  for (const fe of f) if (fe.key === key) return fe;
  return undefined;
}

const isList = (f: Frontend | readonly Frontend[]): f is readonly Frontend[] => Array.isArray(f);
/** A record's frontends as a list (a new one-element array for a single frontend). */
const listOf = (f: Frontend | readonly Frontend[]): readonly Frontend[] => (isList(f) ? f : [f]);
/** Whether a record asks for any frontend. */
const asksAny = (f: Frontend | readonly Frontend[]): boolean => !isList(f) || f.length > 0;

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
  /** One record per service id (ServiceEntry). */
  private readonly entries = new Map<ServiceId, ServiceEntry>();
  /** Slices by their own namespace/name (a slice may move to another service). */
  private readonly slices = new Map<string, EndpointSlice>();
  private node: Node | undefined;
  private readonly dirty = new Set<ServiceId>();
  /**
   * Who asks for each frontend key: the one service (nearly always), or, in
   * a conflict, all of them in an array.
   */
  private readonly claims = new Map<FrontendKey, ServiceId | ServiceId[]>();
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
      if (this.entries.get(id)?.svc) this.dirty.add(id);
      changed = true;
    }
    const kept = new Map<ServiceId, ReadonlySet<string>>();
    for (const [id, set] of next) {
      if (set.size === 0) continue;
      kept.set(id, set);
      if (this.quarantined.has(id)) continue;
      if (this.entries.get(id)?.svc) this.dirty.add(id);
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
      const e = this.entries.get(id);
      const spec = e?.svc?.probe;
      if (!spec) continue;
      const slices = slicesOf(e).sort(byName).slice(0, MAX_SLICES_PER_SERVICE);
      const seen = new Set<string>();
      for (const slice of slices) {
        // Read once: a validated slice makes its endpoint objects when read.
        const endpoints = slice.endpoints;
        const port = resolvePort(spec.handler.port, slice.ports);
        if (port === undefined) {
          if (endpoints.length > 0) unresolved.push({ service: id, detail: `readiness probe port ${JSON.stringify(spec.handler.port)} names no port of EndpointSlice ${slice.namespace}/${slice.name}: its ${endpoints.length} endpoints are not probed` });
          continue;
        }
        for (const ep of endpoints) {
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
    let e = this.entries.get(id);
    if (svc) {
      if (!e) this.entries.set(id, (e = newEntry()));
      e.svc = svc;
    } else if (!e?.svc) return;
    else e.svc = undefined;
    if (svc?.probe) this.probed.add(id);
    else this.probed.delete(id);
    this.dirty.add(id);
  }

  setSlice(id: string, slice: EndpointSlice | undefined): void {
    const old = this.slices.get(id);
    if (old) {
      const owner = serviceId(old.namespace, old.serviceName);
      const e = this.entries.get(owner);
      if (e) {
        if (e.slices === old) e.slices = undefined;
        else if (e.slices instanceof Set) {
          e.slices.delete(old);
          // Back to the one slice left, held as itself.
          if (e.slices.size === 1) e.slices = e.slices.values().next().value!;
        }
      }
      this.dirty.add(owner);
    }
    if (!slice) {
      this.slices.delete(id);
      return;
    }
    this.slices.set(id, slice);
    const owner = serviceId(slice.namespace, slice.serviceName);
    let e = this.entries.get(owner);
    if (!e) this.entries.set(owner, (e = newEntry()));
    if (e.slices === undefined) e.slices = slice;
    else if (e.slices instanceof Set) e.slices.add(slice);
    else e.slices = new Set([e.slices, slice]);
    this.dirty.add(owner);
  }

  /** This node. Only what selection reads (name, zone) makes every service dirty. */
  setNode(node: Node | undefined): void {
    const before = this.node;
    this.node = node;
    if (before?.name === node?.name && before?.zone === node?.zone) return;
    for (const [id, e] of this.entries) if (e.svc) this.dirty.add(id);
  }

  /** Recomputes the dirty services and settles the frontends they touch. */
  flush(): Flushed {
    const changed = new Set<FrontendKey>();
    const newSkips: Skipped[] = [];
    if (this.dirty.size === 0) return { changed, newSkips };
    const touched = new Set<FrontendKey>();
    for (const id of this.dirty) {
      const e = this.entries.get(id);
      if (!e) continue;
      const before = e.frontends;
      const skippedBefore = e.skipped;
      if (e.svc) this.compute(e, e.svc, id);
      else {
        e.frontends = NO_FRONTENDS;
        e.index = undefined;
        e.skipped = NO_SKIPS;
        e.allFailed = false;
      }
      if (e.allFailed) this.allFailed.add(id);
      else this.allFailed.delete(id);
      this.servicesWithFrontends += (asksAny(e.frontends) ? 1 : 0) - (asksAny(before) ? 1 : 0);

      if (e.skipped.length > 0) {
        const had = new Set(skippedBefore.map(skipKey));
        for (const s of e.skipped) if (!had.has(skipKey(s))) newSkips.push(s);
      }
      for (const fe of listOf(before)) {
        if (frontendAt(e, fe.key)) continue;
        this.unclaim(fe.key, id);
        touched.add(fe.key);
      }
      for (const fe of listOf(e.frontends)) {
        this.claim(fe.key, id);
        touched.add(fe.key);
      }
      if (!e.svc && e.slices === undefined) this.entries.delete(id);
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
    const fe = winner === undefined ? undefined : frontendAt(this.entries.get(winner), key);
    const have = this.current.get(key);
    if (fe === have) return false;
    if (fe) this.current.set(key, fe);
    else this.current.delete(key);
    return true;
  }

  /** The services that claim `key` (a copy when there are several). */
  private claimants(key: FrontendKey): readonly ServiceId[] {
    const c = this.claims.get(key);
    return c === undefined ? [] : typeof c === 'string' ? [c] : c;
  }

  private claim(key: FrontendKey, id: ServiceId): void {
    const c = this.claims.get(key);
    if (c === undefined) this.claims.set(key, id);
    else if (typeof c === 'string') {
      if (c !== id) this.claims.set(key, [c, id]);
    } else if (!c.includes(id)) c.push(id);
  }

  private unclaim(key: FrontendKey, id: ServiceId): void {
    const c = this.claims.get(key);
    if (c === undefined) return;
    if (typeof c === 'string') {
      if (c === id) this.claims.delete(key);
      return;
    }
    const i = c.indexOf(id);
    if (i >= 0) c.splice(i, 1);
    // Back to the one claimant left, held as itself.
    if (c.length === 1) this.claims.set(key, c[0]!);
    else if (c.length === 0) this.claims.delete(key);
  }

  /** A claimed internal-scope frontend at `key` (any claimant's), else undefined. */
  private claimedTwin(key: FrontendKey): Frontend | undefined {
    const c = this.claims.get(key);
    const first = c === undefined ? undefined : typeof c === 'string' ? c : c[0];
    const fe = first === undefined ? undefined : frontendAt(this.entries.get(first), key);
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
    const fe = this.claimedTwin(key);
    if (!fe) return undefined;
    const held = this.current.get(externalKeyOf(fe));
    const holder = held && serviceId(held.service.namespace, held.service.name);
    return holder !== undefined && this.claimants(key).includes(holder) ? holder : undefined;
  }

  /** Every current skip: the services' own, then lost conflicts. */
  skipped(): Skipped[] {
    const out: Skipped[] = [];
    for (const e of this.entries.values()) for (const s of e.skipped) out.push(s);
    for (const list of this.conflicts.values()) out.push(...list);
    return out;
  }

  /**
   * Recomputes one service's frontends into its record; one equal to its
   * previous version keeps the previous object.
   */
  private compute(e: ServiceEntry, svc: Service, id: ServiceId): void {
    let slices = slicesOf(e);
    const extra: Skipped[] = [];
    if (slices.length > MAX_SLICES_PER_SERVICE) {
      const all = slices.length;
      slices = slices.sort(byName).slice(0, MAX_SLICES_PER_SERVICE);
      extra.push({ service: id, reason: 'limit', detail: `${all} EndpointSlices, more than ${MAX_SLICES_PER_SERVICE}: the first ${MAX_SLICES_PER_SERVICE} by name are used` });
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
      e.skipped = [{ service: id, reason: 'error', detail }];
      return;
    }
    // Keyed as a Map would be: a key that repeats keeps its last frontend.
    const frontends: Frontend[] = [];
    const index = out.frontends.length > INDEX_FROM ? new Map<FrontendKey, Frontend>() : undefined;
    for (const fe of out.frontends) {
      const prev = frontendAt(e, fe.key);
      const kept = prev && sameFrontend(prev, fe) ? prev : fe;
      const repeated = index ? index.has(fe.key) : frontends.some((x) => x.key === fe.key);
      if (repeated) frontends[frontends.findIndex((x) => x.key === fe.key)] = kept;
      else frontends.push(kept);
      index?.set(fe.key, kept);
    }
    e.frontends = frontends.length === 1 ? frontends[0]! : packed(frontends);
    e.index = index;
    e.skipped = extra.length > 0 ? [...extra, ...out.skipped] : out.skipped.length > 0 ? out.skipped : NO_SKIPS;
    e.allFailed = out.allFailed === true;
  }

  /**
   * The claimant that holds `key`: the one holding it now while it still
   * claims it, else the first by namespace, then name; the others'
   * conflicts recorded.
   */
  private settle(key: FrontendKey, newSkips: Skipped[]): ServiceId | undefined {
    const c = this.claims.get(key);
    const previous = this.conflicts.get(key);
    if (previous) this.conflicts.delete(key);
    if (c === undefined) return undefined;
    if (typeof c === 'string') return c;
    const list = c;
    const held = this.current.get(key);
    const holder = held && serviceId(held.service.namespace, held.service.name);
    const svc = (id: ServiceId): Service => this.entries.get(id)!.svc!;
    const before = (a: ServiceId, b: ServiceId): number => {
      const x = svc(a);
      const y = svc(b);
      return x.namespace === y.namespace ? (x.name < y.name ? -1 : x.name > y.name ? 1 : 0) : x.namespace < y.namespace ? -1 : 1;
    };
    list.sort(before);
    if (holder !== undefined && list.includes(holder)) list.splice(0, 0, ...list.splice(list.indexOf(holder), 1));
    const [winner, ...losers] = list;
    const had = new Set((previous ?? []).map(skipKey));
    const fe = frontendAt(this.entries.get(winner!), key);
    const what = fe?.type === 'NodePort' ? `nodePort ${fe.port}/${fe.protocol} (${key})` : key;
    const skips = losers.map((id): Skipped => ({ service: id, reason: 'conflict', detail: `${what} is already served for ${winner}` }));
    for (const s of skips) if (!had.has(skipKey(s))) newSkips.push(s);
    this.conflicts.set(key, skips);
    return winner;
  }
}

function newEntry(): ServiceEntry {
  return { svc: undefined, slices: undefined, frontends: NO_FRONTENDS, index: undefined, skipped: NO_SKIPS, allFailed: false };
}

/** A record's slices, as a new array. */
function slicesOf(e: ServiceEntry): EndpointSlice[] {
  const s = e.slices;
  return s === undefined ? [] : s instanceof Set ? [...s] : [s];
}

const byName = (a: EndpointSlice, b: EndpointSlice): number => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);

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
