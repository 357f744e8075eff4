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
import { FrontendTable, NO_ROW } from './frontend-table.js';

export { FrontendTable, NO_ROW, type RealizedFrontend } from './frontend-table.js';

/** The maps the reconciler writes (lb4_services … lb6_reverse_nat). */
export type LbMapName = (typeof LB_MAP_NAMES)[number];

/** The master of every wildcard entry a plan writes. */
export const WILDCARD_MASTER: MasterEntry = Object.freeze({
  count: 0,
  qcount: 0,
  revNatId: 0,
  type: 'Wildcard',
  flags: 0,
  affinityTimeout: 0,
});

/**
 * The key of an address's wildcard entry, the one a plan writes (port 0,
 * the external scope): only it may be held as the plain bit. Other keys
 * with protocol ANY (read back from maps written otherwise) are rows.
 */
const isWildcardKey = (fe: ServiceAddr): boolean => fe.protocol === 'ANY' && fe.port === 0 && fe.scope !== 'internal';

const isPlainWildcard = (m: MasterEntry): boolean =>
  m.type === 'Wildcard' && m.count === 0 && m.qcount === 0 && m.revNatId === 0 && m.flags === 0 && m.affinityTimeout === 0;

/** The entry hash every digest update reuses (one per process: no object per write, and none in the state itself). */
const h = new EntryHash();

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
  /**
   * Keyed by serviceAddrKey(): frontends, a row each, and wildcard entries
   * of any other shape than a plan writes (the usual ones are a bit of
   * `addrs`, below).
   */
  readonly frontends = new FrontendTable();
  readonly backends = new IdMap<Backend>();
  /** Rev-NAT entries by family, then id (written through setRevNat/deleteRevNat, which keep the digest). */
  readonly revNat: Record<Family, ReadonlyMap<number, RevNatEntry>> = { 4: new IdMap(), 6: new IdMap() };
  /** backend id → how many slots name it. */
  readonly slotRefs = new IdMap<number>();
  /**
   * By address: how many ClusterIP masters sit there, times two, plus one
   * while the address's wildcard entry is held as a plan writes it
   * (WILDCARD_MASTER, no slot). Every cluster IP has such an entry; as a bit
   * here it costs no row, no key string and no second Map entry
   * (docs/architecture.md, "Why the agent is built for 100,000 services").
   * The bit holds `make bench`'s steady RSS at 100,000 services under its 300 MiB target:
   * 270-286 MiB with it, 297-308 MiB with every wildcard entry a row of
   * `frontends` (14 MiB more heap in bench/profile/sync.ts). bench/run.ts
   * --sizes 100000 --modes lbctl, alternated in one session, 2 repetitions
   * each, 2026-12-06 (2 vCPUs, node 20.20).
   */
  private readonly addrs = new Map<string, number>();
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


  /**
   * How many ClusterIP masters sit at `address`: its wildcard entry is
   * needed while one does (NodePort, LoadBalancer and ExternalIP frontends
   * have none).
   */
  clusterMasters(address: string): number {
    return (this.addrs.get(address) ?? 0) >>> 1;
  }

  /** Whether `address`'s wildcard entry is held as a plan writes it (WILDCARD_MASTER, no slot; not a row of `frontends`). */
  hasPlainWildcard(address: string): boolean {
    return ((this.addrs.get(address) ?? 0) & 1) === 1;
  }

  /** The addresses whose wildcard entry hasPlainWildcard. */
  *plainWildcards(): Generator<string> {
    for (const [address, v] of this.addrs) if (v & 1) yield address;
  }

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
    const f = this.frontends;
    if (isWildcardKey(fe)) this.promote(key, fe);
    const row = this.row(key, fe);
    const old = f.slot(row, slot);
    if (old === backendId) return;
    const d = this.digests[`lb${fe.family}_services`];
    if (old !== undefined) {
      bump(this.slotRefs, old, -1);
      d.sub(h.resume(f.k1(row), f.k2(row)).slot(slot, old));
    } else this.serviceEntries[fe.family]++;
    f.setSlot(row, slot, backendId);
    bump(this.slotRefs, backendId, 1);
    d.add(h.resume(f.k1(row), f.k2(row)).slot(slot, backendId));
  }

  deleteSlot(key: string, slot: number): void {
    const f = this.frontends;
    const row = f.row(key);
    if (row === NO_ROW) return;
    const old = f.slot(row, slot);
    if (old === undefined) return;
    f.clearSlot(row, slot);
    const family = f.family(row);
    this.serviceEntries[family]--;
    this.digests[`lb${family}_services`].sub(h.resume(f.k1(row), f.k2(row)).slot(slot, old));
    bump(this.slotRefs, old, -1);
    this.dropIfEmpty(key, row);
  }

  putMaster(key: string, fe: ServiceAddr, master: MasterEntry): void {
    const f = this.frontends;
    const d = this.digests[`lb${fe.family}_services`];
    if (isWildcardKey(fe) && isPlainWildcard(master) && f.row(key) === NO_ROW) {
      if (this.hasPlainWildcard(fe.address)) return;
      bump(this.addrs, fe.address, 1);
      this.serviceEntries[fe.family]++;
      d.add(h.serviceKey(fe).master(master));
      return;
    }
    if (isWildcardKey(fe)) this.promote(key, fe);
    const row = this.row(key, fe);
    const was = f.masterType(row);
    if (was === undefined) this.serviceEntries[fe.family]++;
    else d.sub(h.resume(f.k1(row), f.k2(row)).master(f.master(row)!));
    d.add(h.resume(f.k1(row), f.k2(row)).master(master));
    const wasCluster = was === 'ClusterIP';
    const isCluster = master.type === 'ClusterIP';
    if (wasCluster !== isCluster) bump(this.addrs, fe.address, isCluster ? 2 : -2);
    f.setMaster(row, master);
  }

  /** `fe`: the entry's key fields, which a plain wildcard entry (a bit, not a row) is found by. */
  deleteMaster(key: string, fe?: ServiceAddr): void {
    const f = this.frontends;
    const row = f.row(key);
    if (row === NO_ROW && fe !== undefined && isWildcardKey(fe) && this.hasPlainWildcard(fe.address)) {
      bump(this.addrs, fe.address, -1);
      this.serviceEntries[fe.family]--;
      this.digests[`lb${fe.family}_services`].sub(h.serviceKey(fe).master(WILDCARD_MASTER));
      return;
    }
    if (row === NO_ROW || !f.hasMaster(row)) return;
    const family = f.family(row);
    const master = f.master(row)!;
    this.serviceEntries[family]--;
    this.digests[`lb${family}_services`].sub(h.resume(f.k1(row), f.k2(row)).master(master));
    if (master.type === 'ClusterIP') bump(this.addrs, f.address(row), -2);
    f.clearMaster(row);
    this.dropIfEmpty(key, row);
  }

  /**
   * A plain wildcard entry at `fe`'s address becomes a row (a write that
   * gives it another shape follows): the same entry, so the digest and the
   * counts stay.
   */
  private promote(key: string, fe: ServiceAddr): void {
    if (!this.hasPlainWildcard(fe.address) || this.frontends.row(key) !== NO_ROW) return;
    bump(this.addrs, fe.address, -1);
    this.row(key, fe);
    this.frontends.setMaster(this.frontends.row(key), WILDCARD_MASTER);
  }

  /** The row of `key`, added (with the key's fields and their hash) when missing. */
  private row(key: string, fe: ServiceAddr): number {
    const row = this.frontends.row(key);
    if (row !== NO_ROW) return row;
    h.serviceKey(fe);
    return this.frontends.add(key, fe, h.h1, h.h2);
  }

  private dropIfEmpty(key: string, row: number): void {
    if (this.frontends.hasMaster(row) || this.frontends.slotEnd(row) > 1) return;
    this.frontends.remove(key);
  }
}
