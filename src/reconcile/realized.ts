// Realized state: what the maps hold, as the reconciler last wrote or read
// it. Built from a dump at start (restore), then kept in step with every
// successful write. Two reference counts ride along, so a change sync can
// tell whether a backend or an address is still in use without walking
// every frontend: how many slots name each backend, and how many ClusterIP
// masters (the frontends a wildcard entry serves) sit at each address. It also counts the entries of each
// map it mirrors, so the map pressure (entries in use / max_entries) costs
// nothing to report, and keeps each map's digest (src/datapath/digest.ts)
// in step with every write, so the periodic resync compares the kernel's
// entries with one sum per map instead of looking each one up here.
import type { Backend, Family } from '../lb/types.js';
import type { SourceRange } from '../model/north-south.js';
import type { ExpectedMaps, MapsDump, MasterEntry, RevNatEntry } from '../datapath/lbmaps.js';
import { serviceAddrKey, type ServiceAddr } from '../lb/types.js';
import type { LB_MAP_NAMES } from '../datapath/maps.js';
import { EntryHash, MapDigest } from '../datapath/digest.js';
import { IdMap } from './id-map.js';

/** The maps the reconciler writes (lb4_services … lb6_reverse_nat). */
export type LbMapName = (typeof LB_MAP_NAMES)[number];

/**
 * One entry of lb{4,6}_services as held: its key's fields themselves (the
 * entry is the ServiceAddr: no copy of the key per entry), the digest's
 * hash of them, its master and its slots.
 */
export interface RealizedFrontend extends ServiceAddr {
  /** The digest's hash of the key's fields (EntryHash.serviceKey), both lanes: each entry's hash resumes from it. */
  readonly k1: number;
  readonly k2: number;
  master: MasterEntry | undefined;
  /**
   * Backend id by slot number (index 0, the master, is never set; a slot
   * missing from the maps is undefined). No trailing undefined: `length - 1`
   * is the highest slot held. Grown to exactly its length while short (see
   * putSlot).
   */
  slots: Array<number | undefined>;
}

/** A realized entry's key fields alone (a new object: it keeps nothing else of the entry alive). */
export function addrOf(e: RealizedFrontend | undefined): ServiceAddr | undefined {
  if (!e) return undefined;
  return e.scope === 'internal'
    ? { address: e.address, family: e.family, port: e.port, protocol: e.protocol, scope: e.scope }
    : { address: e.address, family: e.family, port: e.port, protocol: e.protocol };
}

/** Frontends with fewer slots than this keep their slots array exactly as long as it is (putSlot). */
const EXACT_SLOTS = 64;
/**
 * The slots of an entry that holds none (every wildcard entry, and a
 * master without backends): one shared, frozen array, replaced by the
 * entry's own at its first slot (putSlot only writes below the length of
 * an array it made, and deleteSlot only where a slot is held).
 */
const NO_SLOTS = Object.freeze([undefined]) as unknown as Array<number | undefined>;

/** Slot numbers held, ascending. */
export function* heldSlots(e: RealizedFrontend): Generator<[slot: number, backendId: number]> {
  for (let s = 1; s < e.slots.length; s++) {
    const id = e.slots[s];
    if (id !== undefined) yield [s, id];
  }
}

/** The entry hash every digest update reuses (one per process: no object per write, and none in the state itself). */
const h = new EntryHash();

export const isWildcard = (fe: ServiceAddr): boolean => fe.protocol === 'ANY';

function bump<K>(m: { get(k: K): number | undefined; set(k: K, v: number): unknown; delete(k: K): unknown }, k: K, by: number): void {
  const n = (m.get(k) ?? 0) + by;
  if (n > 0) m.set(k, n);
  else m.delete(k);
}

/** A frontend's source ranges as written (lb*_src_range). */
export interface RealizedRanges {
  readonly fe: ServiceAddr;
  readonly revNatId: number;
  readonly ranges: readonly SourceRange[];
  /** The plan's fingerprint of what was written ('' when read back after a restart: rewritten once). */
  readonly fingerprint: string;
}

export class RealizedState implements ExpectedMaps {
  /**
   * Maglev tables by lb_maglev key, with the fingerprint of the backends
   * they were built from ('' for a table found at restart: rewritten once,
   * an atomic swap of the same content).
   */
  readonly maglev = new Map<number, string>();
  /** Source ranges by frontend key. */
  readonly srcRanges = new Map<string, RealizedRanges>();
  /** Keyed by serviceAddrKey(): frontends and wildcard entries alike. */
  readonly frontends = new Map<string, RealizedFrontend>();
  readonly backends = new IdMap<Backend>();
  /** Rev-NAT entries by family, then id (written through setRevNat/deleteRevNat, which keep the digest). */
  readonly revNat: Record<Family, ReadonlyMap<number, RevNatEntry>> = { 4: new IdMap(), 6: new IdMap() };
  /** backend id → how many slots name it. */
  readonly slotRefs = new IdMap<number>();
  /**
   * address → how many ClusterIP masters sit there: its wildcard entry is
   * needed while one does (NodePort, LoadBalancer and ExternalIP frontends
   * have none).
   */
  readonly addrRefs = new Map<string, number>();
  /** Entries of lb{4,6}_services (masters, slots and wildcards) and lb{4,6}_backends, by family. */
  readonly serviceEntries: Record<Family, number> = { 4: 0, 6: 0 };
  readonly backendEntries: Record<Family, number> = { 4: 0, 6: 0 };
  private readonly digests: Record<LbMapName, MapDigest> = {
    lb4_services: new MapDigest(),
    lb6_services: new MapDigest(),
    lb4_backends: new MapDigest(),
    lb6_backends: new MapDigest(),
    lb4_reverse_nat: new MapDigest(),
    lb6_reverse_nat: new MapDigest(),
  };


  static from(dump: MapsDump): RealizedState {
    const r = new RealizedState();
    for (const e of dump.services) {
      const key = serviceAddrKey(e.fe);
      if (e.slot === 0) r.putMaster(key, e.fe, e.master!);
      else if (e.backendId !== undefined) r.putSlot(key, e.fe, e.slot, e.backendId);
    }
    for (const { id, backend } of dump.backends) r.setBackend(id, backend);
    for (const e of dump.revNat) r.setRevNat(e.id, e.family, { address: e.address, port: e.port });
    return r;
  }

  digest(map: LbMapName): MapDigest {
    return this.digests[map];
  }

  /** Entries of one map, as the realized state holds them. */
  entries(map: LbMapName): number {
    const family: Family = map.startsWith('lb6') ? 6 : 4;
    if (map.endsWith('_services')) return this.serviceEntries[family];
    if (map.endsWith('_backends')) return this.backendEntries[family];
    return this.revNat[family].size;
  }

  setBackend(id: number, b: Backend): void {
    const old = this.backends.get(id);
    if (old) {
      this.backendEntries[old.family]--;
      this.digests[`lb${old.family}_backends`].sub(h.backend(id, old));
    }
    this.backends.set(id, b);
    this.backendEntries[b.family]++;
    this.digests[`lb${b.family}_backends`].add(h.backend(id, b));
  }

  deleteBackend(id: number): Backend | undefined {
    const old = this.backends.get(id);
    if (!old) return undefined;
    this.backends.delete(id);
    this.backendEntries[old.family]--;
    this.digests[`lb${old.family}_backends`].sub(h.backend(id, old));
    return old;
  }

  setRevNat(id: number, family: Family, e: RevNatEntry): void {
    const m = this.revNat[family] as IdMap<RevNatEntry>;
    const d = this.digests[`lb${family}_reverse_nat`];
    const old = m.get(id);
    if (old) d.sub(h.revNat(id, family, old));
    m.set(id, e);
    d.add(h.revNat(id, family, e));
  }

  deleteRevNat(id: number, family: Family): void {
    const m = this.revNat[family] as IdMap<RevNatEntry>;
    const old = m.get(id);
    if (!old) return;
    m.delete(id);
    this.digests[`lb${family}_reverse_nat`].sub(h.revNat(id, family, old));
  }

  putSlot(key: string, fe: ServiceAddr, slot: number, backendId: number): void {
    const e = this.entry(key, fe);
    let slots = e.slots;
    const old = slots[slot];
    if (old === backendId) return;
    const d = this.digests[`lb${fe.family}_services`];
    if (old !== undefined) {
      bump(this.slotRefs, old, -1);
      d.sub(h.resume(e.k1, e.k2).slot(slot, old));
    } else this.serviceEntries[fe.family]++;
    if (slot < slots.length) slots[slot] = backendId;
    else if (slot < EXACT_SLOTS) {
      // A copy of exactly the new length: an array grown in place keeps
      // room for 16 more (packed() in src/lb/types.ts), about 130 bytes
      // per frontend with a few backends. Past EXACT_SLOTS it grows in
      // place, so filling a big frontend stays linear.
      const grown = slots.concat(new Array<undefined>(slot - slots.length), [backendId]);
      e.slots = grown;
      slots = grown;
    } else {
      if (slots === NO_SLOTS) e.slots = slots = [undefined];
      while (slots.length < slot) slots.push(undefined);
      slots[slot] = backendId;
    }
    bump(this.slotRefs, backendId, 1);
    d.add(h.resume(e.k1, e.k2).slot(slot, backendId));
  }

  deleteSlot(key: string, slot: number): void {
    const e = this.frontends.get(key);
    const old = e?.slots[slot];
    if (!e || old === undefined) return;
    e.slots[slot] = undefined;
    this.serviceEntries[e.family]--;
    this.digests[`lb${e.family}_services`].sub(h.resume(e.k1, e.k2).slot(slot, old));
    while (e.slots.length > 1 && e.slots[e.slots.length - 1] === undefined) e.slots.pop();
    bump(this.slotRefs, old, -1);
    this.dropIfEmpty(key, e);
  }

  putMaster(key: string, fe: ServiceAddr, master: MasterEntry): void {
    const e = this.entry(key, fe);
    const d = this.digests[`lb${fe.family}_services`];
    if (!e.master) this.serviceEntries[fe.family]++;
    else d.sub(h.resume(e.k1, e.k2).master(e.master));
    d.add(h.resume(e.k1, e.k2).master(master));
    const was = e.master?.type === 'ClusterIP';
    const is = master.type === 'ClusterIP';
    if (was !== is) bump(this.addrRefs, fe.address, is ? 1 : -1);
    e.master = master;
  }

  deleteMaster(key: string): void {
    const e = this.frontends.get(key);
    if (!e?.master) return;
    this.serviceEntries[e.family]--;
    this.digests[`lb${e.family}_services`].sub(h.resume(e.k1, e.k2).master(e.master));
    if (e.master.type === 'ClusterIP') bump(this.addrRefs, e.address, -1);
    e.master = undefined;
    this.dropIfEmpty(key, e);
  }

  private entry(key: string, fe: ServiceAddr): RealizedFrontend {
    let e = this.frontends.get(key);
    if (!e) {
      // The key's fields, not the caller's object: the entry must not keep
      // a larger one (a Frontend) alive. Every field in one literal, in one
      // order: two hidden classes in all (with and without a scope).
      h.serviceKey(fe);
      e =
        fe.scope === 'internal'
          ? { address: fe.address, family: fe.family, port: fe.port, protocol: fe.protocol, scope: fe.scope, k1: h.h1, k2: h.h2, master: undefined, slots: NO_SLOTS }
          : { address: fe.address, family: fe.family, port: fe.port, protocol: fe.protocol, k1: h.h1, k2: h.h2, master: undefined, slots: NO_SLOTS };
      this.frontends.set(key, e);
    }
    return e;
  }

  private dropIfEmpty(key: string, e: RealizedFrontend): void {
    if (e.master || e.slots.length > 1) return;
    this.frontends.delete(key);
  }
}
