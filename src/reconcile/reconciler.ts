// Applies plans to the maps. Realized state changes only after a write
// succeeds, so a failed sync leaves an exact record of what the kernel
// holds, and the next sync (a full re-plan) finishes the job. Writes are
// idempotent: re-running any prefix of a plan is harmless.
//
// "No room" fails one frontend, not the sync. With the maps' sizes known, a
// frontend whose ids run out, or whose new entries do not fit in the room
// left, is not written at all (the plan holds it as the maps have it). A put
// the kernel still refuses (E2BIG/ENOSPC: entries written behind the agent's
// back, sizes unknown) skips the rest of that frontend (its master is not
// written, so it stays unselectable or keeps its previous version). Either
// way the sync goes on with the others, and the result names what was not
// programmed and why. Any other write error stops the sync.
import { LbError } from '../base/errors.js';
import type { LbMaps, NorthSouthMaps } from '../datapath/lbmaps.js';
import { maglevTable } from '../lb/maglev.js';
import type { MaglevBuilds, MaglevPool } from '../lb/maglev-pool.js';
import type { SourceRange } from '../model/north-south.js';
import { PartialWriteError, putOne } from '../datapath/lbmaps.js';
import { backendKey, serviceAddrKey, type Backend, type BackendKey, type Family, type FrontendKey, type L3n4Addr, type ServiceAddr } from '../lb/types.js';
import { type DesiredState, type Frontend } from '../model/types.js';
import { ipv4ToUint } from '../lb/addr.js';
import { IdAllocator, NumberKeyIds } from './ids.js';
import { IdSet } from './id-map.js';
import { opMapName, plan, PutRun, type MaglevEntry, type MapOp, type PlanStep, type SingleOp } from './plan.js';
import { NO_ROW, RealizedState, type LbMapName } from './realized.js';

export interface SyncOptions {
  /**
   * Remove what the desired state no longer holds. False while the source
   * is incomplete (e.g. a manifest could not be parsed at all): then a sync
   * only adds and updates, and nothing already programmed is lost.
   */
  readonly prune: boolean;
  /**
   * The frontend keys added, changed or removed since the previous sync
   * (DesiredModel.flush). Only these are planned, when the maps are known to
   * match the previous sync; otherwise (first sync, after restore, resync,
   * a failed or a non-pruning sync) every frontend is.
   */
  readonly changed?: ReadonlySet<FrontendKey>;
}

export interface SyncResult {
  readonly planned: number;
  readonly applied: number;
  readonly byKind: Readonly<Record<string, number>>;
  /** Backends this sync deleted from the maps. */
  readonly removedBackends: readonly Backend[];
  /** Where the sync's time went, in ms: assigning ids, planning, writing (with the bookkeeping). */
  readonly phasesMs: { readonly ids: number; readonly plan: number; readonly apply: number };
  /**
   * Frontends (and wildcard entries) this sync could not program for want of
   * room, one each: those out of ids, those a write found no room for, then
   * those the plan found no room for. Empty when everything desired is in the
   * maps. They stay as the maps held them (absent, or their previous version).
   */
  readonly notProgrammed: readonly NotProgrammed[];
}

/** A frontend left out of the maps for want of room. */
export interface NotProgrammed {
  /** "10.96.0.10:80/TCP" (a wildcard entry: "10.96.0.10:0/ANY"). */
  readonly frontend: string;
  /** The map that had no room, or whose ids ran out. */
  readonly map: LbMapName;
  /** What failed, in words: the write or the allocator, and the kernel's error. */
  readonly reason: string;
}

/** A map's fill: entries the realized state holds / its max_entries. */
export interface MapPressure {
  readonly map: LbMapName;
  readonly entries: number;
  readonly maxEntries: number;
}

export interface ReconcilerOptions {
  /**
   * max_entries of the maps (BpfMap.maxEntries of the loaded maps). The id
   * ranges follow them: rev-NAT ids 1..max_entries of the family's rev-NAT
   * map, backend ids 1..the room of both backend maps (one id space serves
   * both families). Unknown: ids span 32 bits and pressure() omits the map.
   */
  readonly maxEntries?: Partial<Record<LbMapName, number>>;
  /**
   * The tc datapath is loaded: north-south frontends get Maglev tables of
   * `maglevM` slots (permutations seeded by `maglevSeed`, the same on every
   * node) and source ranges, written through `maps`.
   */
  readonly northSouth?: {
    readonly maps: NorthSouthMaps;
    readonly maglevM: number;
    readonly maglevSeed: number;
    /** Builds runs of tables on several threads (without it, each is built as it is written, on this one). */
    readonly maglevPool?: MaglevPool;
  };
}

/** The kernel's (or an allocator's) answer when a map has no room for a new key. */
export function isNoRoom(err: unknown): boolean {
  const code = (err as { code?: unknown } | undefined)?.code;
  return code === 'E2BIG' || code === 'ENOSPC';
}

const MAP_NAMES: readonly LbMapName[] = ['lb4_services', 'lb6_services', 'lb4_backends', 'lb6_backends', 'lb4_reverse_nat', 'lb6_reverse_nat'];

/** Per-sync record of what failed for want of room. */
interface Refusals {
  /** By frontend key. */
  readonly frontends: Map<string, NotProgrammed>;
  /** Backends whose put found no room: a slot naming one fails its frontend. */
  readonly backends: Map<number, { map: LbMapName; reason: string }>;
  /** Maps that answered "no room" this sync: their remaining puts go one by one. */
  readonly full: Set<LbMapName>;
}

export class SyncError extends LbError {
  constructor(
    message: string,
    readonly op: MapOp,
    readonly applied: number,
    options?: ErrorOptions,
  ) {
    super(message, 'ESYNC', options);
  }
}

export function describeOp(op: MapOp): string {
  switch (op.kind) {
    case 'put-backend':
      return `put backend ${op.id} (${backendKey(op.backend)})`;
    case 'delete-backend':
      return `delete backend ${op.id}`;
    case 'put-revnat':
      return `put rev-NAT ${op.id} (IPv${op.family})`;
    case 'delete-revnat':
      return `delete rev-NAT ${op.id} (IPv${op.family})`;
    case 'put-slot':
      return `put ${serviceAddrKey(op.fe)} slot ${op.slot} → backend ${op.backendId}`;
    case 'delete-slot':
      return `delete ${serviceAddrKey(op.fe)} slot ${op.slot}`;
    case 'put-master':
      return `put ${serviceAddrKey(op.fe)} master (count ${op.master.count})`;
    case 'delete-master':
      return `delete ${serviceAddrKey(op.fe)} master`;
    case 'put-maglev':
      return `put ${op.key} Maglev table ${op.table} (${op.backends.length} backends)`;
    case 'delete-maglev':
      return `delete Maglev table ${op.table}`;
    case 'put-srcranges':
      return `put ${op.key} source ranges (${op.add.length}, ${op.remove.length} removed)`;
    case 'delete-srcranges':
      return `delete ${op.key} source ranges (${op.remove.length})`;
  }
}

/** Writes per batch syscall: bounds the buffers (a cold sync of 100,000 services is ~800,000 writes). */
const MAX_BATCH = 8192;

/**
 * A backend's identity in the id allocator: address, port and protocol.
 * IPv4 packs into one number below 2^53 (2^32 addresses x 2^16 ports x 4
 * protocols: no key string per backend: at 10,000 services that is 30,000
 * strings built, hashed and kept); IPv6 uses the key string.
 */
export type BackendIdKey = number | BackendKey;
const PROTO_BITS: Record<L3n4Addr['protocol'], number> = { TCP: 0, UDP: 1, SCTP: 2 };
export function backendIdKey(b: L3n4Addr): BackendIdKey {
  if (b.family === 6) return backendKey(b);
  return (ipv4ToUint(b.address) * 65536 + b.port) * 4 + PROTO_BITS[b.protocol];
}

export class Reconciler {
  private realizedState = new RealizedState();
  /** The last Maglev table built, by its backends' fingerprint (the same backends and ids: the same table). */
  private lastTable?: { readonly fingerprint: string; readonly ids: Uint32Array };
  /** Tables the pool builds ahead for the put-maglev ops that follow: which job each fingerprint is. */
  private prebuilt?: { readonly jobs: Map<string, number>; readonly builds: MaglevBuilds };
  /**
   * The maps hold exactly the desired state of the last sync (it wrote
   * everything and pruned, and they were not re-read since): the next sync
   * may plan only what changed.
   */
  private clean = false;
  /** Backends deleted by the sync in progress. */
  private readonly removed: Backend[] = [];
  readonly backendIds: IdAllocator<BackendIdKey>;
  readonly revNatIds: Record<Family, IdAllocator<FrontendKey>>;
  private readonly maxEntries: Partial<Record<LbMapName, number>>;
  private readonly northSouth: ReconcilerOptions['northSouth'];

  constructor(
    private readonly maps: LbMaps,
    opts: ReconcilerOptions = {},
  ) {
    this.maxEntries = opts.maxEntries ?? {};
    this.northSouth = opts.northSouth;
    const cap = (name: LbMapName): number => {
      const n = this.maxEntries[name];
      return n !== undefined && Number.isInteger(n) && n > 0 ? Math.min(n, 0xffffffff) : 0xffffffff;
    };
    const backends = this.maxEntries.lb4_backends !== undefined && this.maxEntries.lb6_backends !== undefined ? cap('lb4_backends') + cap('lb6_backends') : 0xffffffff;
    this.backendIds = new IdAllocator<BackendIdKey>('backend', 1, Math.min(backends, 0xffffffff), new NumberKeyIds<BackendKey>());
    this.revNatIds = {
      4: new IdAllocator<FrontendKey>('IPv4 rev-NAT', 1, cap('lb4_reverse_nat')),
      6: new IdAllocator<FrontendKey>('IPv6 rev-NAT', 1, cap('lb6_reverse_nat')),
    };
  }

  /** Each map of known size: entries the realized state holds, and max_entries. */
  pressure(): MapPressure[] {
    const out: MapPressure[] = [];
    for (const map of MAP_NAMES) {
      const maxEntries = this.maxEntries[map];
      if (maxEntries !== undefined) out.push({ map, entries: this.realizedState.entries(map), maxEntries });
    }
    return out;
  }

  get realized(): RealizedState {
    return this.realizedState;
  }

  /**
   * Reads the maps back and adopts their ids, so unchanged state is not
   * rewritten. An id beyond its allocator's range (the maps were larger,
   * or written by an older lbctl) is adopted too and kept while its frontend
   * or backend lives (src/reconcile/ids.ts says why); new ids are in range.
   */
  restore(): { frontends: number; backends: number } {
    this.realizedState = RealizedState.from(this.maps.dump());
    this.readNorthSouth(new Map());
    this.clean = false;
    let frontends = 0;
    const f = this.realizedState.frontends;
    for (const [key, row] of f.entries()) {
      const revNatId = f.revNatId(row);
      if (f.isWildcard(row) || revNatId === undefined) continue;
      frontends++;
      this.revNatIds[f.family(row)].adopt(key as FrontendKey, revNatId);
    }
    for (const [id, b] of this.realizedState.backends) this.backendIds.adopt(backendIdKey(b), id);
    return { frontends, backends: this.realizedState.backends.size };
  }

  /**
   * The tc datapath's Maglev tables and source ranges as the maps hold them.
   * A table keeps the fingerprint `known` gives it (a resync: the agent
   * wrote it), else '' (found at restart: rewritten once by the first sync,
   * an atomic swap of the same content). Ranges are grouped under the
   * frontend whose master has their rev-NAT id; ranges of no frontend are
   * kept under a key of their own, and the next full plan deletes them.
   */
  private readNorthSouth(known: ReadonlyMap<number, string>): void {
    const ns = this.northSouth;
    if (!ns) return;
    const r = this.realizedState;
    for (const table of ns.maps.maglevKeys()) r.maglev.set(table, known.get(table) ?? '');
    const byId = new Map<string, string>();
    const f = r.frontends;
    for (const [key, row] of f.entries()) {
      const revNatId = f.revNatId(row);
      if (revNatId !== undefined && !f.isWildcard(row)) byId.set(`${f.family(row)}/${revNatId}`, key);
    }
    const groups = new Map<string, { fe: ServiceAddr; revNatId: number; ranges: SourceRange[] }>();
    for (const e of ns.maps.srcRanges()) {
      const key = byId.get(`${e.family}/${e.revNatId}`) ?? `src-range:${e.family}/${e.revNatId}`;
      let g = groups.get(key);
      if (!g) {
        const row = f.row(key);
        groups.set(key, (g = { fe: row === NO_ROW ? { address: '', family: e.family, port: 0, protocol: 'ANY' } : f.addr(row), revNatId: e.revNatId, ranges: [] }));
      }
      g.ranges.push({ family: e.family, address: e.address, prefixLen: e.prefixLen });
    }
    for (const [key, g] of groups) r.srcRanges.set(key, { ...g, fingerprint: '' });
  }

  /**
   * Liveness' write probe (src/http/health.ts, "canary"), inside the
   * reconciler's accounting rather than beside it: it rewrites one IPv4
   * rev-NAT entry the realized state holds with exactly the bytes it holds
   * (BPF_EXIST): a write the datapath cannot tell from no write, that needs
   * no free room, so a full map does not fail liveness (a restart would not
   * give it room). With no such entry (or one that drifted away) it writes
   * and deletes id 0, which the allocators never hand out; should that find
   * the map full (entries written behind the agent's back), the kernel
   * answered, and that is all liveness asks: no room is a matter for
   * readiness and the pressure metric, never a reason to restart. Runs
   * between syncs (a sync is synchronous), so no sync's write is ever
   * interleaved with it. Throws the kernel's other errors.
   */
  probeWrite(): void {
    for (const [id, entry] of this.realizedState.revNat[4]) {
      try {
        this.maps.rewriteRevNat(id, 4, entry);
        return;
      } catch (err) {
        if ((err as { code?: string }).code !== 'ENOENT') throw err;
        break; // drifted away: the next resync repairs it
      }
    }
    const none = { address: '0.0.0.0', port: 0 };
    try {
      this.maps.putRevNat(0, 4, none);
    } catch (err) {
      if (isNoRoom(err)) return;
      throw err;
    }
    this.maps.deleteRevNat(0, 4);
  }

  /**
   * Re-reads the maps as the realized state, keeping the ids in use: the
   * next plan then repairs whatever changed behind the agent's back (drift).
   * First the maps' bytes are compared in place with the realized state's
   * (LbMaps.matches: batch lookups, no object per entry); when they are the
   * same, the realized state already is what a re-read would give, so it
   * stays, and so does what the next sync may skip. Only a difference (or
   * maps without that comparison) re-reads and decodes every entry and
   * makes the next sync a full plan.
   */
  resync(): void {
    // The maps hold exactly what the realized state says (the usual case):
    // nothing to repair, and the next sync may still plan only what changed.
    if (this.maps.matches?.(this.realizedState) && this.northSouthMatches()) return;
    const before = this.realizedState;
    this.realizedState = RealizedState.from(this.maps.dump());
    this.readNorthSouth(before.maglev);
    this.clean = false;
    for (const [id, b] of this.realizedState.backends) this.backendIds.adopt(backendIdKey(b), id);
  }

  /**
   * Whether the tc datapath's Maglev tables and source ranges are the ones
   * the realized state holds (no tc datapath: true).
   */
  private northSouthMatches(): boolean {
    const ns = this.northSouth;
    if (!ns) return true;
    const r = this.realizedState;
    const tables = ns.maps.maglevKeys();
    if (tables.length !== r.maglev.size || tables.some((t) => !r.maglev.has(t))) return false;
    const want = new Set<string>();
    for (const g of r.srcRanges.values()) for (const x of g.ranges) want.add(`${g.fe.family}/${g.revNatId}/${x.address}/${x.prefixLen}`);
    const have = ns.maps.srcRanges();
    return have.length === want.size && have.every((e) => want.has(`${e.family}/${e.revNatId}/${e.address}/${e.prefixLen}`));
  }

  /**
   * Plans desired vs realized and applies the plan in order. A frontend that
   * finds no room (its ids, or a put the kernel refuses with E2BIG/ENOSPC)
   * is left out and listed in the result; any other failed write throws
   * SyncError. A change sync (options.changed, maps clean) plans the changed
   * frontends only: it costs what changed, not what exists. A full plan runs
   * otherwise.
   */
  sync(desired: DesiredState, options: SyncOptions): SyncResult {
    const t0 = performance.now();
    const changed = this.clean ? options.changed : undefined;
    this.clean = false;
    this.removed.length = 0;
    const refused: Refusals = { frontends: new Map(), backends: new Map(), full: new Set() };
    // Frontends that could not get their ids: the plan leaves them as they are.
    const hold = new Set<string>();
    // The backend ids this sync acquired (releaseUnused keeps them), and the
    // IPv6 ones by Backend object (one key string per backend, not one per
    // lookup); an IPv4 backend's key is a number, looked up again for free.
    const acquired = new IdSet();
    const v6Ids = new Map<Backend, number>();
    const outOfIds = (fe: Frontend, map: LbMapName, alloc: IdAllocator<unknown>): void => {
      hold.add(fe.key);
      refused.frontends.set(fe.key, { frontend: fe.key, map, reason: `no free ${alloc.what} id: all ${alloc.span} are in use` });
    };
    const acquireBackends = (fe: Frontend, list: readonly Backend[]): boolean => {
      for (const b of list) {
        const id = this.backendIds.tryAcquire(backendIdKey(b));
        if (id === undefined) {
          outOfIds(fe, `lb${b.family}_backends`, this.backendIds);
          return false;
        }
        acquired.add(id);
        if (b.family === 6) v6Ids.set(b, id);
      }
      return true;
    };
    const acquire = (fe: Frontend): void => {
      const revNat = this.revNatIds[fe.family];
      if (revNat.tryAcquire(fe.key) === undefined) return outOfIds(fe, `lb${fe.family}_reverse_nat`, revNat);
      if (acquireBackends(fe, fe.backends)) acquireBackends(fe, fe.terminating);
    };
    if (changed) {
      for (const key of changed) {
        const fe = desired.get(key);
        if (fe) acquire(fe);
      }
    } else {
      for (const fe of desired.values()) acquire(fe);
    }
    const t1 = performance.now();
    const northSouth = this.northSouth !== undefined;
    const p = plan(
      this.realizedState,
      desired,
      {
        backendId: (b) => (b.family === 4 ? this.backendIds.get(backendIdKey(b))! : v6Ids.get(b)!),
        revNatId: (fe) => this.revNatIds[fe.family].get(fe.key)!,
      },
      { prune: options.prune, ...(changed ? { changed } : {}), ...(hold.size > 0 ? { hold } : {}), maxEntries: this.maxEntries, northSouth },
    );
    // Planned and applied in turn (Plan.stream): a full plan hands over
    // each chunk of frontends' writes, and plans the next once they are in.
    const t2 = performance.now();
    const byKind: Record<string, number> = {};
    let applied_ = 0;
    const count = (kind: MapOp['kind'], n = 1): void => {
      byKind[kind] = (byKind[kind] ?? 0) + n;
      applied_ += n;
    };
    const applied = (): number => applied_;
    /** Backend deletes that a realized slot still named: tried again after the puts. */
    const deferred: SingleOp[] = [];
    /** Deletes left undone because something still names what they would delete. */
    let heldBack = 0;
    /** A change sync's deletes, whose ids it frees if it completes. */
    const deletes: Array<readonly SingleOp[]> = [];
    let ok = false;
    try {
      for (const step of p.stream()) {
        if (step instanceof PutRun) this.applyRun(step, refused, count, applied);
        else {
          if (changed) deletes.push(step);
          this.applyOps(step, refused, deferred, count, applied);
        }
      }
      // Backend deletes whose slots were rewritten meanwhile; what a slot
      // still names (its frontend's put failed) stays for the next sync.
      for (const op of deferred) {
        if (this.admit(op, refused) !== 'write') {
          heldBack++;
          continue;
        }
        try {
          this.apply(op);
        } catch (err) {
          throw new SyncError(`${describeOp(op)}: ${(err as Error).message}`, op, applied_, { cause: err });
        }
        count(op.kind);
      }
      ok = true;
    } finally {
      // Frontends the plan left out for want of room (complete once the plan has run).
      for (const [frontend, { map, reason }] of p.refused) refused.frontends.set(frontend, { frontend, map, reason });
      // A complete change sync frees exactly the ids of what it deleted.
      // Otherwise every id is looked at (the realized state says what the
      // maps still hold); a change sync that failed outright frees nothing:
      // the full sync after it does.
      const complete = ok && refused.frontends.size === 0 && refused.backends.size === 0 && heldBack === 0;
      if (complete && changed) this.releaseDeleted(deletes, changed, desired);
      else if (!changed || ok) this.releaseUnused(desired, acquired);
      this.clean = complete && options.prune;
    }
    const ms = (x: number): number => Math.round(x * 1000) / 1000;
    return {
      planned: p.size,
      applied: applied_,
      byKind,
      removedBackends: this.removed.splice(0),
      phasesMs: { ids: ms(t1 - t0), plan: ms(t2 - t1 + p.planMs), apply: ms(performance.now() - t2 - p.planMs) },
      notProgrammed: [...refused.frontends.values()],
    };
  }

  /**
   * Whether to write single op `op` now: 'skip' when its frontend already
   * failed for want of room, 'defer' for a backend delete that a realized
   * slot still names (it is retried after the puts), 'write' otherwise.
   * (admitAt does the same for the entries of a run of puts.)
   */
  private admit(op: SingleOp, refused: Refusals): 'write' | 'skip' | 'defer' {
    const r = this.realizedState;
    switch (op.kind) {
      case 'delete-backend':
        return (r.slotRefs.get(op.id) ?? 0) > 0 ? 'defer' : 'write';
      case 'delete-revnat':
        // Only once the live master that named it has moved to its new id.
        return op.namedBy !== undefined && r.frontends.revNatId(r.frontends.row(op.namedBy)) === op.id ? 'skip' : 'write';
      default:
        return refused.frontends.has(op.key) ? 'skip' : 'write';
    }
  }

  /** Records a single put (a Maglev table, source ranges) the kernel refused for want of room: its frontend is not programmed. */
  private refuse(op: SingleOp, err: unknown, refused: Refusals): void {
    const map = opMapName(op);
    refused.full.add(map);
    const reason = `${describeOp(op)}: ${(err as Error).message}`;
    if ('key' in op && !refused.frontends.has(op.key)) refused.frontends.set(op.key, { frontend: op.key, map, reason });
  }

  /**
   * A list of single writes (removals, shrinks, Maglev tables, source
   * ranges), in order: runs of Maglev tables go out together.
   */
  private applyOps(ops: readonly SingleOp[], refused: Refusals, deferred: SingleOp[], count: (kind: MapOp['kind'], n?: number) => void, applied: () => number): void {
    const tables = ops.flatMap((op) => (op.kind === 'put-maglev' ? [op.table] : []));
    try {
      // The pool's workers start on the tables first: they build while the room is made (new chunks: their memory zeroed, in the kernel).
      const first = ops.findIndex((op) => op.kind === 'put-maglev');
      if (first >= 0) this.prebuild(ops, first);
      if (tables.length > 0 && this.northSouth?.maps.reserveMaglev) {
        try {
          this.northSouth.maps.reserveMaglev(tables);
        } catch {
          // Room made at once is a saving, not a need: each put makes what it needs, and one refused says why.
        }
      }
      for (let i = 0; i < ops.length; ) {
        const op = ops[i]!;
        if (op.kind === 'put-maglev' && op.fingerprint !== this.lastTable?.fingerprint && !this.prebuilt?.jobs.has(op.fingerprint)) this.prebuild(ops, i);
        i++;
        const verdict = this.admit(op, refused);
        if (verdict === 'defer') deferred.push(op);
        if (verdict !== 'write') continue;
        try {
          this.apply(op);
        } catch (err) {
          if (isNoRoom(err) && op.kind.startsWith('put-')) {
            this.refuse(op, err, refused);
            continue;
          }
          throw new SyncError(`${describeOp(op)}: ${(err as Error).message}`, op, applied(), { cause: err });
        }
        count(op.kind);
      }
    } finally {
      this.prebuilt?.builds.close();
      this.prebuilt = undefined;
    }
  }

  /**
   * With a pool: the tables of the put-maglev ops from `from` on, one job
   * per backend set, built on its threads ahead of the writes (run by run,
   * as the writes ask for them).
   */
  private prebuild(ops: readonly SingleOp[], from: number): void {
    const ns = this.northSouth;
    if (!ns?.maglevPool) return;
    this.prebuilt?.builds.close();
    this.prebuilt = undefined;
    const jobs = new Map<string, number>();
    const sets: Array<{ backends: readonly MaglevEntry[] }> = [];
    for (let k = from; k < ops.length; k++) {
      const op = ops[k]!;
      if (op.kind !== 'put-maglev' || jobs.has(op.fingerprint)) continue;
      jobs.set(op.fingerprint, sets.length);
      sets.push({ backends: op.backends });
    }
    if (sets.length < 2) return;
    this.prebuilt = { jobs, builds: ns.maglevPool.builds(sets, ns.maglevM, ns.maglevSeed) };
  }

  /** The pool's table for `fingerprint`, if it built one (undefined: build it here; a set no table holds fails here, naming its frontend). */
  private prebuiltTable(fingerprint: string): Uint32Array | undefined {
    const k = this.prebuilt?.jobs.get(fingerprint);
    return k === undefined ? undefined : this.prebuilt!.builds.table(k);
  }

  /**
   * A run of puts, in batches of up to MAX_BATCH consecutive entries it
   * admits, each encoded straight from the run's columns and written in one
   * syscall (LbMaps.putBatch). Once its map has answered "no room" this
   * sync, or without putBatch, one by one: a batch that fails at its first
   * entry would be encoded again for every entry. A put refused for want of
   * room fails its frontend (a backend: each frontend whose slot names it);
   * any other error stops the sync.
   */
  private applyRun(run: PutRun, refused: Refusals, count: (kind: MapOp['kind'], n?: number) => void, applied: () => number): void {
    const map = run.map;
    const n = run.length;
    for (let i = 0; i < n; ) {
      if (!this.admitAt(run, i, refused)) {
        i++;
        continue;
      }
      const batched = this.maps.putBatch !== undefined && !refused.full.has(map);
      let end = i + 1;
      if (batched) while (end < n && end - i < MAX_BATCH && this.admitAt(run, end, refused)) end++;
      try {
        if (batched) this.maps.putBatch!(run, i, end);
        else putOne(this.maps, run, i);
      } catch (err) {
        const written = err instanceof PartialWriteError ? Math.min(err.written, end - i) : 0;
        for (let k = i; k < i + written; k++) this.noteAt(run, k);
        if (written > 0) count(run.kind, written);
        const failed = i + written < end ? i + written : i;
        const cause = err instanceof PartialWriteError && err.cause ? err.cause : err;
        if (i + written < end && isNoRoom(cause)) {
          this.refuseAt(run, failed, cause, refused);
          i = failed + 1;
          continue;
        }
        const op = run.op(failed);
        throw new SyncError(`${describeOp(op)}: ${(err as Error).message}`, op, applied(), { cause });
      }
      for (let k = i; k < end; k++) this.noteAt(run, k);
      count(run.kind, end - i);
      i = end;
    }
  }

  /** admit() for entry i of a run, without making its op. */
  private admitAt(run: PutRun, i: number, refused: Refusals): boolean {
    if (run.kind === 'put-backend') return true;
    const key = run.keys[i]!;
    if (refused.frontends.has(key)) return false;
    if (run.kind !== 'put-slot') return true;
    const b = refused.backends.get(run.ids[i]!);
    if (!b) return true;
    refused.frontends.set(key, { frontend: key, map: b.map, reason: b.reason });
    return false;
  }

  /** refuse() for entry i of a run. */
  private refuseAt(run: PutRun, i: number, err: unknown, refused: Refusals): void {
    const map = run.map;
    refused.full.add(map);
    const reason = `${describeOp(run.op(i))}: ${(err as Error).message}`;
    if (run.kind === 'put-backend') refused.backends.set(run.ids[i]!, { map, reason });
    else if (!refused.frontends.has(run.keys[i]!)) refused.frontends.set(run.keys[i]!, { frontend: run.keys[i]!, map, reason });
  }

  /** note() for entry i of a run: the realized state's bookkeeping of a write the map accepted. */
  private noteAt(run: PutRun, i: number): void {
    const r = this.realizedState;
    switch (run.kind) {
      case 'put-backend':
        return r.setBackend(run.ids[i]!, run.backends[i]!);
      case 'put-revnat': {
        const e = run.entries[i]!;
        // A copy: the entry is often the Frontend itself, which must not stay alive here.
        return r.setRevNat(run.ids[i]!, run.family, { address: e.address, port: e.port });
      }
      case 'put-slot':
        return r.putSlot(run.keys[i]!, run.fes[i]!, run.slots[i]!, run.ids[i]!);
      case 'put-master':
        return r.putMaster(run.keys[i]!, run.fes[i]!, run.masters[i]!);
    }
  }

  private releaseDeleted(steps: ReadonlyArray<readonly SingleOp[]>, changed: ReadonlySet<FrontendKey>, desired: DesiredState): void {
    for (const step of steps) {
      for (const op of step) {
        if (op.kind === 'delete-backend') this.backendIds.releaseId(op.id);
        else if (op.kind === 'delete-revnat') this.revNatIds[op.family].releaseId(op.id);
      }
    }
    for (const key of changed) {
      if (desired.has(key)) continue;
      this.revNatIds[4].release(key);
      this.revNatIds[6].release(key);
    }
  }

  private apply(op: SingleOp): void {
    this.write(op);
    this.note(op);
  }

  /** The map write of one op. */
  private write(op: SingleOp): void {
    const m = this.maps;
    switch (op.kind) {
      case 'delete-backend':
        return m.deleteBackend(op.id, op.family);
      case 'delete-revnat':
        return m.deleteRevNat(op.id, op.family);
      case 'delete-slot':
        return m.deleteSlot(op.fe, op.slot);
      case 'delete-master':
        return m.deleteMaster(op.fe);
      case 'put-maglev': {
        const ns = this.northSouth!;
        // A service's frontends (NodePorts, LoadBalancer and external IPs) share one backend set, and come in a row.
        if (this.lastTable?.fingerprint !== op.fingerprint) {
          this.lastTable = { fingerprint: op.fingerprint, ids: this.prebuiltTable(op.fingerprint) ?? maglevTable(op.backends, ns.maglevM, ns.maglevSeed) };
        }
        return ns.maps.putMaglev(op.table, this.lastTable.ids);
      }
      case 'delete-maglev':
        return this.northSouth!.maps.deleteMaglev(op.table);
      case 'put-srcranges': {
        const ns = this.northSouth!.maps;
        const family = op.fe.family;
        for (const r of op.add) ns.putSrcRange({ family, revNatId: op.revNatId, address: r.address, prefixLen: r.prefixLen });
        for (const r of op.remove) ns.deleteSrcRange({ family, revNatId: op.oldRevNatId ?? op.revNatId, address: r.address, prefixLen: r.prefixLen });
        return;
      }
      case 'delete-srcranges': {
        const ns = this.northSouth!.maps;
        for (const r of op.remove) ns.deleteSrcRange({ family: op.fe.family, revNatId: op.revNatId, address: r.address, prefixLen: r.prefixLen });
        return;
      }
    }
  }

  /** Realized-state bookkeeping of a write the maps accepted. */
  private note(op: SingleOp): void {
    const r = this.realizedState;
    switch (op.kind) {
      case 'delete-backend': {
        const gone = r.deleteBackend(op.id);
        if (gone) this.removed.push(gone);
        break;
      }
      case 'delete-revnat':
        r.deleteRevNat(op.id, op.family);
        break;
      case 'delete-slot':
        r.deleteSlot(op.key, op.slot);
        break;
      case 'delete-master':
        r.deleteMaster(op.key, op.fe);
        break;
      case 'put-maglev':
        r.maglev.set(op.table, op.fingerprint);
        break;
      case 'delete-maglev':
        r.maglev.delete(op.table);
        break;
      case 'put-srcranges':
        r.srcRanges.set(op.key, { fe: op.fe, revNatId: op.revNatId, ranges: op.add, fingerprint: op.fingerprint });
        break;
      case 'delete-srcranges':
        r.srcRanges.delete(op.key);
        break;
    }
  }

  /** Frees ids that neither the desired state nor the maps use any more. */
  private releaseUnused(desired: DesiredState, needed: IdSet): void {
    const r = this.realizedState;
    for (const family of [4, 6] as const) {
      const alloc = this.revNatIds[family];
      const unused: FrontendKey[] = [];
      for (const [key, id] of alloc.entries()) {
        if (!desired.has(key) && !r.revNat[family].has(id) && r.frontends.revNatId(r.frontends.row(key)) === undefined) unused.push(key);
      }
      for (const key of unused) alloc.release(key);
    }
    // Collected first: an allocator must not change while it is iterated.
    const unused: BackendIdKey[] = [];
    for (const [key, id] of this.backendIds.entries()) {
      if (!needed.has(id) && !r.backends.has(id)) unused.push(key);
    }
    for (const key of unused) this.backendIds.release(key);
  }
}
