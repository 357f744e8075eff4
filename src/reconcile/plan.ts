// desired vs realized → the ordered writes that turn one into the other.
// Pure: no I/O, no id allocation (ids are assigned before planning).
//
// Invariant (make before break): at every point between two writes, a
// connecting socket sees either the old service or the new one, never a
// half-written one, and never a slot pointing at a missing backend:
//   1. backends are written before any slot names them;
//   2. a frontend's rev-NAT entry and slots are written before its master
//      entry, whose count makes them selectable; slots beyond a shrunk count
//      are deleted only after the master stops counting them;
//   3. wildcard (address-only) entries follow their frontends (ClusterIP
//      frontends only: a wildcard refuses every other port of a service
//      address, which is right for a cluster IP and wrong for 0.0.0.0, ::,
//      an external IP or a LoadBalancer IP, addresses of real hosts);
//   4. a removal runs in reverse: master first (no new selection), then its
//      slots and rev-NAT entry, then unused wildcards, then unused backends.
// Removals of what is no longer desired come first, before any put: nothing
// replaces them, and when a map is full the room they free is what lets the
// puts in. A backend delete is planned on the assumption that the plan's
// slot writes succeed, so the reconciler checks at apply time that no
// realized slot still names it (and retries it after the puts); a rev-NAT
// entry that a live master still names (it moves to a new id) is deleted
// after the puts, only once that master no longer names it. Puts may fail
// for want of room: the reconciler then skips the rest of that frontend
// (its master stays as it was), so the order above holds per frontend.
// Only differences are written, so a plan over unchanged state is empty. A
// change sync plans only the frontends that changed; the realized state's
// reference counts tell which backends and wildcards that left unused, so
// its cost follows the change, not the number of services.
import { backendKey, serviceAddrKey, type Backend, type Family, type FrontendKey, type ServiceAddr } from '../lb/types.js';
import type { SourceRange } from '../model/north-south.js';
import type { DesiredState, Frontend } from '../model/types.js';
import { LbSvcFlags } from '../datapath/abi.gen.js';
import type { MasterEntry, PutBatch, PutKind, RevNatEntry } from '../datapath/lbmaps.js';
import { NO_ROW, WILDCARD_MASTER, type LbMapName, type RealizedState } from './realized.js';
import { IdSet } from './id-map.js';

export type MapOp =
  | { readonly kind: 'put-backend'; readonly id: number; readonly backend: Backend }
  | { readonly kind: 'delete-backend'; readonly id: number; readonly family: Family }
  | { readonly kind: 'put-revnat'; readonly id: number; readonly family: Family; readonly entry: RevNatEntry; readonly key: FrontendKey }
  /** namedBy: a live frontend whose realized master names this id (it moves to another): delete only once it no longer does. */
  | { readonly kind: 'delete-revnat'; readonly id: number; readonly family: Family; readonly namedBy?: string }
  | { readonly kind: 'put-slot'; readonly key: string; readonly fe: ServiceAddr; readonly slot: number; readonly backendId: number }
  | { readonly kind: 'delete-slot'; readonly key: string; readonly fe: ServiceAddr; readonly slot: number }
  | { readonly kind: 'put-master'; readonly key: string; readonly fe: ServiceAddr; readonly master: MasterEntry }
  | { readonly kind: 'delete-master'; readonly key: string; readonly fe: ServiceAddr }
  /** A frontend's Maglev table (lb_maglev, keyed `table`), built from `backends` when written; swapped in whole. */
  | { readonly kind: 'put-maglev'; readonly key: string; readonly fe: ServiceAddr; readonly table: number; readonly backends: readonly MaglevEntry[]; readonly fingerprint: string }
  | { readonly kind: 'delete-maglev'; readonly key: string; readonly fe: ServiceAddr; readonly table: number }
  /** A frontend's loadBalancerSourceRanges (lb*_src_range, keyed by rev-NAT id): `add` written, `remove` deleted. */
  | { readonly kind: 'put-srcranges'; readonly key: string; readonly fe: ServiceAddr; readonly revNatId: number; readonly add: readonly SourceRange[]; readonly remove: readonly SourceRange[]; readonly fingerprint: string; readonly oldRevNatId?: number }
  | { readonly kind: 'delete-srcranges'; readonly key: string; readonly fe: ServiceAddr; readonly revNatId: number; readonly remove: readonly SourceRange[] };

/** A backend in a Maglev table: the name every node hashes, and the id written. */
export interface MaglevEntry {
  readonly key: string;
  readonly id: number;
}

/** lb_maglev_index's key of a frontend: its rev-NAT id, the top bit set for IPv6 (bpf/include/lb_types.h LB_MAGLEV_V6). */
export const maglevTableKey = (revNatId: number, family: Family): number => (family === 6 ? (revNatId | 0x80000000) >>> 0 : revNatId);

const rangeText = (r: SourceRange): string => `${r.address}/${r.prefixLen}`;

export interface IdAssignment {
  backendId(b: Backend): number;
  revNatId(fe: Frontend): number;
}

export function wildcardOf(address: string, family: Family): ServiceAddr {
  return { address, family, port: 0, protocol: 'ANY' };
}

export { WILDCARD_MASTER } from './realized.js';

function sameBackend(a: Backend, b: Backend): boolean {
  return a.address === b.address && a.port === b.port && a.protocol === b.protocol && a.state === b.state && a.family === b.family;
}

/**
 * The flags of a frontend's master entry. externalTrafficPolicy Local marks
 * the external entry only (LOCAL_EXTERNAL: its slots hold only this node's
 * backends; TWO_SCOPES: the internal twin exists, which the model emits for
 * every such frontend); the twin's backends follow the internal policy.
 */
/** The master entry's flags; `maglev`: the datapath has Maglev tables (the tc object is loaded). */
export function masterFlags(fe: Frontend, maglev = false): number {
  const external = fe.externalLocal && fe.scope !== 'internal';
  return (
    (maglev && fe.maglev ? LbSvcFlags.LB_SVC_F_MAGLEV : 0) |
    (fe.affinityTimeout > 0 ? LbSvcFlags.LB_SVC_F_AFFINITY : 0) |
    (fe.localOnly ? LbSvcFlags.LB_SVC_F_LOCAL_INTERNAL : 0) |
    (external ? LbSvcFlags.LB_SVC_F_LOCAL_EXTERNAL | LbSvcFlags.LB_SVC_F_TWO_SCOPES : 0) |
    (fe.sourceRanges.length > 0 ? LbSvcFlags.LB_SVC_F_SRC_RANGE : 0)
  );
}

/** Whether a frontend of this type has a wildcard entry at its address. */
const hasWildcard = (type: MasterEntry['type']): boolean => type === 'ClusterIP';

/** The address family an op writes (each family has its own maps). */
export function opFamily(op: MapOp): Family {
  switch (op.kind) {
    case 'put-backend':
      return op.backend.family;
    case 'delete-backend':
    case 'put-revnat':
    case 'delete-revnat':
      return op.family;
    default:
      return op.fe.family;
  }
}

/** ops.push(...more) without a spread: a full plan's removals can reach hundreds of thousands, past the call stack's argument limit. */
function append<T>(ops: T[], more: readonly T[]): void {
  for (const op of more) ops.push(op);
}

/**
 * The puts of one kind to one map, in plan order, as columns (LbMaps.putBatch
 * writes them from there): a cold sync of 100,000 services plans about
 * 900,000 puts, and this keeps them as a few numbers and references each,
 * not an object each. `keys` names each entry's frontend (put-revnat,
 * put-slot, put-master), for refusals and the realized state's bookkeeping.
 */
export class PutRun implements PutBatch {
  readonly keys: string[] = [];
  readonly ids: number[] = [];
  readonly backends: Backend[] = [];
  readonly entries: RevNatEntry[] = [];
  readonly fes: ServiceAddr[] = [];
  readonly slots: number[] = [];
  readonly masters: MasterEntry[] = [];
  private n = 0;

  constructor(
    readonly kind: PutKind,
    readonly family: Family,
  ) {}

  get length(): number {
    return this.n;
  }

  /** The map the run writes. */
  get map(): LbMapName {
    const k = this.kind;
    return k === 'put-backend' ? `lb${this.family}_backends` : k === 'put-revnat' ? `lb${this.family}_reverse_nat` : `lb${this.family}_services`;
  }

  backend(id: number, b: Backend): void {
    this.ids.push(id);
    this.backends.push(b);
    this.n++;
  }

  /** `entry`: the frontend itself will do (its address and port); the realized state copies what it keeps. */
  revNat(id: number, key: string, entry: RevNatEntry): void {
    this.ids.push(id);
    this.keys.push(key);
    this.entries.push(entry);
    this.n++;
  }

  slot(key: string, fe: ServiceAddr, slot: number, backendId: number): void {
    this.keys.push(key);
    this.fes.push(fe);
    this.slots.push(slot);
    this.ids.push(backendId);
    this.n++;
  }

  master(key: string, fe: ServiceAddr, master: MasterEntry): void {
    this.keys.push(key);
    this.fes.push(fe);
    this.masters.push(master);
    this.n++;
  }

  /** Drops the entries from `n` on (a frontend that does not fit is planned whole or not at all). */
  truncate(n: number): void {
    if (n >= this.n) return;
    for (const col of [this.keys, this.ids, this.backends, this.entries, this.fes, this.slots, this.masters] as unknown[][]) if (col.length > n) col.length = n;
    this.n = n;
  }

  /** Entry i as a MapOp: for messages and tests, never on the write path. */
  op(i: number): MapOp {
    switch (this.kind) {
      case 'put-backend':
        return { kind: 'put-backend', id: this.ids[i]!, backend: this.backends[i]! };
      case 'put-revnat': {
        const e = this.entries[i]!;
        return { kind: 'put-revnat', id: this.ids[i]!, family: this.family, entry: { address: e.address, port: e.port }, key: this.keys[i]! as FrontendKey };
      }
      case 'put-slot':
        return { kind: 'put-slot', key: this.keys[i]!, fe: this.fes[i]!, slot: this.slots[i]!, backendId: this.ids[i]! };
      case 'put-master':
        return { kind: 'put-master', key: this.keys[i]!, fe: this.fes[i]!, master: this.masters[i]! };
    }
  }
}

/** The ops a plan keeps one by one: everything but the four kinds of put a PutRun holds. */
export type SingleOp = Exclude<MapOp, { readonly kind: PutKind }>;

/** A plan's steps, in order: runs of puts (written in batches) and lists of single ops. */
export type PlanStep = PutRun | readonly SingleOp[];

/** What a plan looks at. */
export interface PlanScope {
  /**
   * The frontend keys whose desired entry may differ from what the maps
   * hold (added, changed or removed); everything else is known to match.
   * Undefined: every frontend, desired or realized, and every backend,
   * rev-NAT and wildcard entry is checked (a full plan: it also finds
   * entries nothing names any more, and repairs drift).
   */
  readonly changed?: Iterable<FrontendKey>;
  /** Remove what the desired state does not hold. False: add and update only. */
  readonly prune: boolean;
  /**
   * Desired frontends to leave exactly as the maps hold them (they could not
   * get their ids): neither written nor removed, and nothing they use in
   * the maps (backends, rev-NAT entry, wildcard) is deleted.
   */
  readonly hold?: ReadonlySet<string>;
  /**
   * max_entries of the maps: a frontend whose new entries do not fit in the
   * room left (after the removals this plan makes first, and the frontends
   * planned before it) is held as the maps have it and listed in
   * Plan.refused, rather than written in part. Maps not named: no limit
   * (the kernel's E2BIG is then the reconciler's matter).
   */
  readonly maxEntries?: Partial<Record<LbMapName, number>>;
  /** The tc datapath is loaded: north-south frontends get Maglev tables and source ranges. */
  readonly northSouth?: boolean;
  /** Frontends per chunk of a full plan's puts (Plan.stream); default PLAN_CHUNK. */
  readonly chunk?: number;
}

function bump<K>(m: Map<K, number> | undefined, k: K, by: number): void {
  m?.set(k, (m.get(k) ?? 0) + by);
}

const runs = (kind: PutKind): Record<Family, PutRun> => ({ 4: new PutRun(kind, 4), 6: new PutRun(kind, 6) });

/** Ids listed once, then read back in the same order (a growing Uint32Array). */
class IdList {
  private ids = new Uint32Array(1024);
  private n = 0;
  private at = 0;

  get length(): number {
    return this.n;
  }

  /** Every id listed was read. */
  get done(): boolean {
    return this.at === this.n;
  }

  push(id: number): number {
    if (this.n === this.ids.length) {
      const grown = new Uint32Array(this.ids.length * 2);
      grown.set(this.ids);
      this.ids = grown;
    }
    this.ids[this.n++] = id;
    return id;
  }

  next(): number {
    if (this.at >= this.n) throw new Error(`plan: backend id ${this.at + 1} asked for, ${this.n} listed`);
    return this.ids[this.at++]!;
  }
}

/** A frontend the plan left as the maps hold it: its new entries do not fit in `map`. */
export interface Refusal {
  readonly map: LbMapName;
  readonly reason: string;
}

/**
 * Desired frontends a full plan plans before it hands their writes over
 * (Plan.stream): the caller applies them before the plan goes on, so a cold
 * sync never holds more than this many frontends' writes at once.
 */
export const PLAN_CHUNK = 8192;

export class Plan {
  private cache: PlanStep[] | undefined;
  private taken = false;
  private n = 0;
  private ms = 0;

  constructor(
    private readonly source: Iterator<PlanStep>,
    private readonly refusedMap: Map<string, Refusal>,
  ) {}

  /**
   * The steps as they are planned, in order: a full plan hands over the
   * writes of each PLAN_CHUNK frontends, then goes on once the caller asks
   * for the next step (having applied this one). Once; refused and size are
   * complete when it ends.
   */
  *stream(): Generator<PlanStep> {
    if (this.taken) throw new Error('a plan is streamed once');
    this.taken = true;
    for (;;) {
      const t0 = performance.now();
      const next = this.source.next();
      this.ms += performance.now() - t0;
      if (next.done) return;
      this.n += next.value.length;
      yield next.value;
    }
  }

  /** Every step, all planned before any is applied (tests and messages; the reconciler streams). */
  get steps(): readonly PlanStep[] {
    this.cache ??= [...this.stream()];
    return this.cache;
  }

  /** By frontend key: frontends left out because their new entries do not fit (PlanScope.maxEntries). */
  get refused(): ReadonlyMap<string, Refusal> {
    if (!this.taken) void this.steps;
    return this.refusedMap;
  }

  /** How many writes. */
  get size(): number {
    if (!this.taken) void this.steps;
    return this.n;
  }

  /** Time spent planning so far, ms (streamed: between the writes). */
  get planMs(): number {
    return this.ms;
  }

  /** Every write as a MapOp, in order: an object each, for tests and messages (the reconciler writes the steps). */
  get ops(): MapOp[] {
    const out: MapOp[] = [];
    for (const s of this.steps) {
      if (s instanceof PutRun) for (let i = 0; i < s.length; i++) out.push(s.op(i));
      else append(out, s);
    }
    return out;
  }
}

/** The map an op writes. */
export function opMapName(op: MapOp): LbMapName {
  const f = opFamily(op);
  switch (op.kind) {
    case 'put-backend':
    case 'delete-backend':
      return `lb${f}_backends`;
    case 'put-revnat':
    case 'delete-revnat':
      return `lb${f}_reverse_nat`;
    default:
      return `lb${f}_services`;
  }
}

export function plan(r: RealizedState, desired: DesiredState, ids: IdAssignment, scope: PlanScope): Plan {
  const refused = new Map<string, Refusal>();
  return new Plan(planSteps(r, desired, ids, scope, refused), refused);
}

function* planSteps(r: RealizedState, desired: DesiredState, ids: IdAssignment, scope: PlanScope, refused: Map<string, Refusal>): Generator<PlanStep> {
  const full = scope.changed === undefined;
  // A frontend's puts, by stage; handed over (and started afresh) every PLAN_CHUNK frontends of a full plan.
  let backendPuts = runs('put-backend');
  let revNatPuts = runs('put-revnat');
  let slotPuts = runs('put-slot');
  let masterPuts = runs('put-master');
  let shrinks: SingleOp[] = [];
  let wildcardPuts = runs('put-master');
  let maglevPuts: SingleOp[] = [];
  /** The puts planned so far as steps, in the invariant's order; the stages start afresh. */
  const putSteps = (): PlanStep[] => {
    const out = [backendPuts[4], backendPuts[6], revNatPuts[4], revNatPuts[6], slotPuts[4], slotPuts[6], maglevPuts, masterPuts[4], masterPuts[6], shrinks, wildcardPuts[4], wildcardPuts[6]].filter((x) => x.length > 0);
    backendPuts = runs('put-backend');
    revNatPuts = runs('put-revnat');
    slotPuts = runs('put-slot');
    masterPuts = runs('put-master');
    shrinks = [];
    wildcardPuts = runs('put-master');
    maglevPuts = [];
    return out;
  };
  const removals: SingleOp[] = [];
  const revNatDeletes: SingleOp[] = [];
  const planned = new IdSet();
  const wildcardsSeen = new Set<string>();
  /**
   * Slots naming each backend, and ClusterIP masters at each address (what
   * its wildcard serves), after this plan minus before: what a change sync removed may leave them unused. A
   * full plan visits every desired frontend, so what it did not plan is
   * unused (no counting needed).
   */
  const slotDelta = full ? undefined : new Map<number, number>();
  const addrDelta = full ? undefined : new Map<string, number>();

  const hold = scope.hold;
  /** Addresses of held frontends: their wildcards stay (but are not written for them). */
  const wildcardsKept = new Set<string>();
  /** Maglev tables and source ranges desired (or kept with a held frontend): a full plan deletes the others. */
  const maglevWanted = new Set<number>();
  const rangesWanted = new Set<string>();
  const lateNorthSouth: SingleOp[] = [];
  const F = r.frontends;
  const keep = (fe: Frontend): void => {
    if (hasWildcard(fe.type)) wildcardsKept.add(fe.address);
    const row = F.row(fe.key);
    rangesWanted.add(fe.key);
    if (row === NO_ROW) return;
    for (let s = 1; s < F.slotEnd(row); s++) {
      const id = F.slot(row, s);
      if (id !== undefined) planned.add(id);
    }
    const revNatId = F.revNatId(row);
    if (revNatId !== undefined) maglevWanted.add(maglevTableKey(revNatId, fe.family));
  };

  const remove = (key: string, row: number): void => {
    const fe = F.addr(row);
    const revNatId = F.revNatId(row);
    if (revNatId !== undefined) removals.push({ kind: 'delete-master', key, fe });
    for (let s = 1; s < F.slotEnd(row); s++) {
      const old = F.slot(row, s);
      if (old === undefined) continue;
      removals.push({ kind: 'delete-slot', key, fe, slot: s });
      bump(slotDelta, old, -1);
    }
    if (revNatId === undefined) return removeRanges(key, fe);
    if (hasWildcard(F.masterType(row)!)) bump(addrDelta, fe.address, -1);
    // Its Maglev table and source ranges go after its master (no new flow reads them then).
    const table = maglevTableKey(revNatId, fe.family);
    if (r.maglev.has(table)) removals.push({ kind: 'delete-maglev', key, fe, table });
    removeRanges(key, fe);
    // A full plan deletes every rev-NAT entry no desired frontend uses, below.
    if (!full && r.revNat[fe.family].has(revNatId)) revNatDeletes.push({ kind: 'delete-revnat', id: revNatId, family: fe.family });
  };
  const removeRanges = (key: string, fe: ServiceAddr): void => {
    const ranges = r.srcRanges.get(key);
    if (ranges) removals.push({ kind: 'delete-srcranges', key, fe, revNatId: ranges.revNatId, remove: ranges.ranges });
  };

  // Removals first: the room they free counts for the puts.
  if (scope.prune) {
    if (full) {
      for (const [key, row] of F.entries()) if (!F.isWildcard(row) && !desired.has(key as FrontendKey)) remove(key, row);
    } else {
      for (const key of scope.changed!) {
        const row = desired.has(key) ? NO_ROW : F.row(key);
        if (row !== NO_ROW) remove(key, row);
      }
    }
  }

  /**
   * Free entries per map of known size: max_entries minus what the maps
   * hold, plus what the removals above delete (the rest of what this plan
   * deletes is not counted: a frontend that fits only then waits for the
   * next sync).
   */
  const room = new Map<LbMapName, number>();
  for (const [map, max] of Object.entries(scope.maxEntries ?? {}) as Array<[LbMapName, number]>) room.set(map, max - r.entries(map));
  for (const op of removals) room.set(opMapName(op), (room.get(opMapName(op)) ?? Number.POSITIVE_INFINITY) + 1);
  for (const op of revNatDeletes) room.set(opMapName(op), (room.get(opMapName(op)) ?? Number.POSITIVE_INFINITY) + 1);
  /** The refusal when `n` new entries do not fit in `map`'s room. */
  const overflow = (map: LbMapName, n: number, fe: Frontend): Refusal | undefined => {
    const free = n > 0 ? room.get(map) : undefined;
    if (free === undefined || n <= free) return undefined;
    return { map, reason: `${map} is full: ${Math.max(0, free)} free of ${scope.maxEntries![map]} entries, ${fe.key} needs ${n} more` };
  };
  const take = (map: LbMapName, n: number): void => {
    const free = n > 0 ? room.get(map) : undefined;
    if (free !== undefined) room.set(map, free - n);
  };

  /** A full plan's backend ids in the order update() asks for them (its pass over the desired frontends lists them). */
  let backendIds: IdList | undefined;
  /** A full plan's: where in the desired frontends each cluster IP's last frontend is, and where the chunk being planned ends. */
  let lastAt: Map<string, number> | undefined;
  let chunkEnd = Number.POSITIVE_INFINITY;
  /** Wildcards whose address has frontends in a chunk after the one that needs them first: written after the last chunk. */
  const lastWildcardPuts = runs('put-master');
  /** Backend ids this frontend adds to `planned`: taken out again if it does not fit. */
  const plannedHere: number[] = [];
  const update = (fe: Frontend): void => {
    if (hold?.has(fe.key)) return keep(fe);
    const revNatId = ids.revNatId(fe);
    const row = F.row(fe.key);
    const f = fe.family;
    // This frontend's writes go straight into the stage lists, and the new
    // keys they add are counted per map. If they do not all fit, the lists
    // are cut back to where they were: a frontend is written whole or not
    // at all. (No list or map per frontend: a cold sync plans every one.)
    const marks = { b4: backendPuts[4].length, b6: backendPuts[6].length, revNat: revNatPuts[f].length, slot: slotPuts[f].length, master: masterPuts[f].length, shrink: shrinks.length, wildcard: wildcardPuts[f].length, lastWildcard: lastWildcardPuts[f].length };
    let needServices = 0;
    let needRevNat = 0;
    const needBackends = { 4: 0, 6: 0 };
    /** (backend id, by) pairs, flat: only a change plan counts slot references. */
    const slotBumps: number[] | undefined = slotDelta ? [] : undefined;
    plannedHere.length = 0;

    const rn = r.revNat[f].get(revNatId);
    if (!rn || rn.address !== fe.address || rn.port !== fe.port) {
      revNatPuts[f].revNat(revNatId, fe.key, fe);
      if (!rn) needRevNat++;
    }
    // Slots: selectable backends, then terminating ones.
    let slot = 0;
    const put = (b: Backend): void => {
      const id = backendIds ? backendIds.next() : ids.backendId(b);
      if (!planned.has(id)) {
        const hb = r.backends.get(id);
        if (!hb || !sameBackend(hb, b)) {
          backendPuts[b.family].backend(id, b);
          if (!hb) needBackends[b.family]++;
        }
        planned.add(id);
        plannedHere.push(id);
      }
      slot++;
      const old = row === NO_ROW ? undefined : F.slot(row, slot);
      if (old === id) return;
      slotPuts[f].slot(fe.key, fe, slot, id);
      if (old === undefined) needServices++;
      slotBumps?.push(id, 1);
      if (old !== undefined) slotBumps?.push(old, -1);
    };
    for (const b of fe.backends) put(b);
    for (const b of fe.terminating) put(b);
    const master: MasterEntry = {
      count: fe.backends.length,
      qcount: fe.terminating.length,
      revNatId,
      type: fe.type,
      flags: masterFlags(fe, scope.northSouth === true),
      affinityTimeout: fe.affinityTimeout,
    };
    const hadMaster = row !== NO_ROW && F.hasMaster(row);
    if (!hadMaster || !F.sameMaster(row, master)) {
      masterPuts[f].master(fe.key, fe, master);
      if (!hadMaster) needServices++;
    }
    if (row !== NO_ROW && F.slotEnd(row) > slot + 1) {
      const have = F.addr(row);
      for (let s = slot + 1; s < F.slotEnd(row); s++) {
        const old = F.slot(row, s);
        if (old === undefined) continue;
        shrinks.push({ kind: 'delete-slot', key: fe.key, fe: have, slot: s });
        slotBumps?.push(old, -1);
      }
    }
    // North-south: the Maglev table and source ranges, written before the
    // master whose flags send the datapath to them (without a table the
    // datapath picks at random, so a table written late is never a drop).
    let northSouth: SingleOp[] | undefined;
    let late: SingleOp[] | undefined;
    if (scope.northSouth === true) {
      northSouth = [];
      late = [];
      const table = maglevTableKey(revNatId, f);
      if (fe.maglev) {
        const backends = fe.backends.map((b) => ({ key: backendKey(b), id: ids.backendId(b) }));
        const fingerprint = backends.map((e) => `${e.key}=${e.id}`).sort().join(',');
        if (r.maglev.get(table) !== fingerprint) northSouth.push({ kind: 'put-maglev', key: fe.key, fe, table, backends, fingerprint });
      } else if (r.maglev.has(table)) {
        late.push({ kind: 'delete-maglev', key: fe.key, fe, table });
      }
      const haveRanges = r.srcRanges.get(fe.key);
      if (fe.sourceRanges.length > 0) {
        const fingerprint = `${revNatId}|${fe.sourceRanges.map(rangeText).sort().join(',')}`;
        if (haveRanges?.fingerprint !== fingerprint) {
          const keepOld = haveRanges?.revNatId === revNatId ? new Set(fe.sourceRanges.map(rangeText)) : new Set<string>();
          const remove = haveRanges ? haveRanges.ranges.filter((x) => !keepOld.has(rangeText(x))) : [];
          northSouth.push({ kind: 'put-srcranges', key: fe.key, fe, revNatId, add: fe.sourceRanges, remove, fingerprint, ...(haveRanges && haveRanges.revNatId !== revNatId ? { oldRevNatId: haveRanges.revNatId } : {}) } as SingleOp);
        }
      } else if (haveRanges) {
        late.push({ kind: 'delete-srcranges', key: fe.key, fe, revNatId: haveRanges.revNatId, remove: haveRanges.ranges });
      }
    }
    const wildcardNew = hasWildcard(fe.type) && !wildcardsSeen.has(fe.address);
    if (wildcardNew && !r.hasPlainWildcard(fe.address)) {
      const wild = wildcardOf(fe.address, f);
      const wkey = serviceAddrKey(wild);
      const hw = F.row(wkey);
      const held = hw !== NO_ROW && F.hasMaster(hw);
      if (!held || !F.sameMaster(hw, WILDCARD_MASTER)) {
        // After every frontend at the address: a wildcard refuses the
        // address's other ports, so one whose frontends reach into a later
        // chunk waits for the last chunk.
        const later = (lastAt?.get(fe.address) ?? 0) >= chunkEnd;
        (later ? lastWildcardPuts : wildcardPuts)[f].master(wkey, wild, WILDCARD_MASTER);
        if (!held) needServices++;
      }
    }

    // The first map that overflows names the reason: rev-NAT, backends, services (the order a new frontend needs them in).
    const tooBig =
      overflow(`lb${f}_reverse_nat`, needRevNat, fe) ??
      overflow('lb4_backends', needBackends[4], fe) ??
      overflow('lb6_backends', needBackends[6], fe) ??
      overflow(`lb${f}_services`, needServices, fe);
    if (tooBig) {
      refused.set(fe.key, tooBig);
      backendPuts[4].truncate(marks.b4);
      backendPuts[6].truncate(marks.b6);
      revNatPuts[f].truncate(marks.revNat);
      slotPuts[f].truncate(marks.slot);
      masterPuts[f].truncate(marks.master);
      shrinks.length = marks.shrink;
      wildcardPuts[f].truncate(marks.wildcard);
      lastWildcardPuts[f].truncate(marks.lastWildcard);
      for (const id of plannedHere) planned.delete(id);
      return keep(fe);
    }
    take(`lb${f}_services`, needServices);
    take(`lb${f}_reverse_nat`, needRevNat);
    take('lb4_backends', needBackends[4]);
    take('lb6_backends', needBackends[6]);
    if (slotBumps) for (let i = 0; i < slotBumps.length; i += 2) bump(slotDelta, slotBumps[i]!, slotBumps[i + 1]!);
    if (fe.maglev) maglevWanted.add(maglevTableKey(revNatId, f));
    if (fe.sourceRanges.length > 0) rangesWanted.add(fe.key);
    if (northSouth) append(maglevPuts, northSouth);
    if (late) append(lateNorthSouth, late);
    const wasType = row === NO_ROW ? undefined : F.masterType(row);
    const wasCounted = wasType !== undefined && hasWildcard(wasType);
    if (wasCounted !== hasWildcard(fe.type)) bump(addrDelta, fe.address, wasCounted ? -1 : 1);
    if (wildcardNew) wildcardsSeen.add(fe.address);
  };

  // The deletes, before any put: removals of what is no longer desired,
  // with the rev-NAT entries they free, then rev-NAT entries no frontend
  // names, wildcards of addresses left with no frontend, backends no slot
  // names any more. A full plan knows what its frontends will use before it
  // plans a put (one pass over them: the backends they name, the addresses
  // their wildcards need, their rev-NAT ids), so it can then stream its puts;
  // a change plan counts references after planning its few frontends.
  const ops: SingleOp[] = [];
  const lateRevNatDeletes: SingleOp[] = [];
  const deletes = (backendUsed: (id: number) => boolean, wildcardUsed: (addr: string) => boolean, usedRevNat?: Record<Family, Set<number>>): void => {
    if (!scope.prune) return;
    append(ops, removals);
    if (usedRevNat) {
      /** Rev-NAT ids that live masters name now, by the frontend naming them. */
      const named: Record<Family, Map<number, string>> = { 4: new Map(), 6: new Map() };
      for (const fe of desired.values()) {
        if (hold?.has(fe.key)) continue;
        const row = F.row(fe.key);
        const id = row === NO_ROW ? undefined : F.revNatId(row);
        if (id !== undefined) named[fe.family].set(id, fe.key);
      }
      for (const family of [4, 6] as const) {
        for (const id of r.revNat[family].keys()) {
          if (usedRevNat[family].has(id)) continue;
          const namedBy = named[family].get(id);
          if (namedBy === undefined) revNatDeletes.push({ kind: 'delete-revnat', id, family });
          else lateRevNatDeletes.push({ kind: 'delete-revnat', id, family, namedBy });
        }
      }
    }
    append(ops, revNatDeletes);
    const unused = (addr: string): boolean => !wildcardUsed(addr) && (full || r.clusterMasters(addr) + (addrDelta!.get(addr) ?? 0) <= 0);
    const dropWildcard = (key: string, row: number): void => {
      const fe = F.addr(row);
      if (F.hasMaster(row)) ops.push({ kind: 'delete-master', key, fe });
      for (let s = 1; s < F.slotEnd(row); s++) {
        const old = F.slot(row, s);
        if (old === undefined) continue;
        ops.push({ kind: 'delete-slot', key, fe, slot: s });
        bump(slotDelta, old, -1);
      }
    };
    const dropPlain = (addr: string): void => {
      const wild = wildcardOf(addr, addr.includes(':') ? 6 : 4);
      ops.push({ kind: 'delete-master', key: serviceAddrKey(wild), fe: wild });
    };
    if (full) {
      for (const [key, row] of F.entries()) if (F.isWildcard(row) && unused(F.address(row))) dropWildcard(key, row);
      for (const addr of r.plainWildcards()) if (unused(addr)) dropPlain(addr);
    } else {
      for (const [addr, d] of addrDelta!) {
        if (d >= 0 || !unused(addr)) continue;
        const family: Family = addr.includes(':') ? 6 : 4;
        const wild = wildcardOf(addr, family);
        const key = serviceAddrKey(wild);
        const row = F.row(key);
        if (row !== NO_ROW) dropWildcard(key, row);
        else if (r.hasPlainWildcard(addr)) dropPlain(addr);
      }
    }
    // Backends: a full plan looks at every one, a change sync at those it unlinked.
    // (Unused once this plan's slot writes are done: the reconciler checks
    // at apply time that no slot still names one.)
    const unlinked = (id: number): boolean => !backendUsed(id) && (full || (r.slotRefs.get(id) ?? 0) + (slotDelta!.get(id) ?? 0) <= 0);
    if (full) {
      for (const [id, b] of r.backends) if (unlinked(id)) ops.push({ kind: 'delete-backend', id, family: b.family });
    } else {
      for (const [id, d] of slotDelta!) {
        const b = r.backends.get(id);
        if (d < 0 && b && unlinked(id)) ops.push({ kind: 'delete-backend', id, family: b.family });
      }
    }
  };

  if (full) {
    // What the desired frontends will use; held ones, what the maps hold
    // for them (keep()). The backend ids, in the order update() asks for
    // them, are kept for it: one lookup per backend, not two.
    const order = new IdList();
    const backends = new IdSet();
    const last = new Map<string, number>();
    const revNat: Record<Family, Set<number>> = { 4: new Set(), 6: new Set() };
    let at = 0;
    for (const fe of desired.values()) {
      if (hasWildcard(fe.type)) last.set(fe.address, at);
      at++;
      if (hold?.has(fe.key)) {
        if (scope.prune) {
          const row = F.row(fe.key);
          if (row === NO_ROW) continue;
          for (let s = 1; s < F.slotEnd(row); s++) {
            const id = F.slot(row, s);
            if (id !== undefined) backends.add(id);
          }
          const id = F.revNatId(row);
          if (id !== undefined) revNat[fe.family].add(id);
        }
        continue;
      }
      for (const b of fe.backends) backends.add(order.push(ids.backendId(b)));
      for (const b of fe.terminating) backends.add(order.push(ids.backendId(b)));
      revNat[fe.family].add(ids.revNatId(fe));
    }
    if (scope.prune) deletes((id) => backends.has(id), (addr) => last.has(addr), revNat);
    lastAt = last;
    backendIds = order;
    if (ops.length > 0) yield ops;
    // The puts, a chunk of frontends at a time: what it plans next reads
    // only its own frontend's entries and the backends and wildcards this
    // plan marked planned, so the writes of the chunks before (applied
    // meanwhile, when streamed) do not change it.
    const chunk = Math.max(1, scope.chunk ?? PLAN_CHUNK);
    let n = 0;
    chunkEnd = chunk;
    for (const fe of desired.values()) {
      update(fe);
      if (++n % chunk === 0) {
        yield* putSteps();
        chunkEnd += chunk;
      }
    }
    if (!order.done) throw new Error(`plan: ${order.length} backend ids listed, not all asked for`);
  } else {
    for (const key of scope.changed!) {
      const fe = desired.get(key);
      if (fe) update(fe);
    }
    deletes((id) => planned.has(id), (addr) => wildcardsSeen.has(addr) || wildcardsKept.has(addr));
    if (ops.length > 0) yield ops;
  }
  // Then backends, rev-NAT entries and slots, Maglev tables and source
  // ranges, masters, shrinks, wildcards, and the deletes that wait for them.
  yield* putSteps();
  for (const run of [lastWildcardPuts[4], lastWildcardPuts[6]]) if (run.length > 0) yield run;
  const late: SingleOp[] = [];
  append(late, lateRevNatDeletes);
  append(late, lateNorthSouth);
  if (full && scope.prune) {
    // Tables and ranges no desired frontend has (a frontend gone while the agent was down).
    const removedHere = new Set<number>();
    const rangesRemoved = new Set<string>();
    for (const list of [ops, late]) {
      for (const o of list) {
        if (o.kind === 'delete-maglev') removedHere.add(o.table);
        else if (o.kind === 'delete-srcranges') rangesRemoved.add(o.key);
      }
    }
    for (const table of r.maglev.keys()) {
      if (!maglevWanted.has(table) && !removedHere.has(table)) late.push({ kind: 'delete-maglev', key: `maglev:${table}`, fe: { address: '', family: table & 0x80000000 ? 6 : 4, port: 0, protocol: 'ANY' }, table });
    }
    for (const [key, have] of r.srcRanges) {
      if (!rangesWanted.has(key) && !rangesRemoved.has(key)) late.push({ kind: 'delete-srcranges', key, fe: have.fe, revNatId: have.revNatId, remove: have.ranges });
    }
  }
  if (late.length > 0) yield late;
}
