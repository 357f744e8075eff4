// The datapath as the reconciler sees it: typed operations on lbctl's maps,
// addresses as text. Byte layouts stay in abi.gen.ts; the implementation over
// pinned kernel maps is in maps.ts, a fake for tests in test/fakes/fake-maps.ts.
//
// The bottom of the datapath's map layer: codes.ts, digest.ts and maps.ts
// import from this file, and it imports none of them.
import type { Backend, Family, ServiceAddr, ServiceType } from '../lb/types.js';
import type { MapName } from './abi.gen.js';

/** The maps LbMaps writes; lb_metrics and the socket rev-NAT maps are read elsewhere. */
export const LB_MAP_NAMES = [
  'lb4_services',
  'lb6_services',
  'lb4_backends',
  'lb6_backends',
  'lb4_reverse_nat',
  'lb6_reverse_nat',
] as const satisfies readonly MapName[];

export type LbMapName = (typeof LB_MAP_NAMES)[number];

export type MasterType = ServiceType | 'Wildcard';

/** Slot 0 of a frontend. */
export interface MasterEntry {
  /** Selectable backends, in slots 1..count. */
  readonly count: number;
  /** Non-selectable (terminating) backends, in slots count+1..count+qcount. */
  readonly qcount: number;
  readonly revNatId: number;
  readonly type: MasterType;
  readonly flags: number;
  readonly affinityTimeout: number;
}

export interface RevNatEntry {
  readonly address: string;
  readonly port: number;
}

export interface ServiceEntry {
  readonly fe: ServiceAddr;
  readonly slot: number;
  /** Slot 0 only. */
  readonly master?: MasterEntry;
  /** Slots > 0 only. */
  readonly backendId?: number;
}

export interface MapsDump {
  readonly services: readonly ServiceEntry[];
  readonly backends: ReadonlyArray<{ readonly id: number; readonly backend: Backend }>;
  readonly revNat: ReadonlyArray<{ readonly id: number; readonly family: Family } & RevNatEntry>;
}

/**
 * What the maps should hold (the reconciler's realized state), for
 * LbMaps.matches to compare the kernel's entries against: per map, how many
 * entries and the digest of their fields (src/datapath/digest.ts).
 */
export interface ExpectedMaps {
  /** How many entries each map should hold. */
  entries(map: LbMapName): number;
  /** The sum of those entries' hashes. */
  digest(map: LbMapName): Digest;
}

/** A map's digest: its entries' hashes summed in two 32-bit lanes (digest.ts's MapDigest). */
export interface Digest {
  readonly a: number;
  readonly b: number;
}

/** The puts that go in batches: one kind, one map, in one syscall. */
export type PutKind = 'put-backend' | 'put-revnat' | 'put-slot' | 'put-master';

/**
 * Puts of one kind to one map, as columns: entry i is the i-th element of
 * the columns its kind uses (no object per write; the reconciler's plan
 * keeps its puts this way, src/reconcile/plan.ts PutRun).
 *   put-backend: ids (backend id), backends
 *   put-revnat:  ids (rev-NAT id), entries
 *   put-slot:    fes, slots, ids (the backend id the slot names)
 *   put-master:  fes, masters
 */
export interface PutBatch {
  readonly kind: PutKind;
  readonly family: Family;
  readonly ids: readonly number[];
  readonly backends: readonly Backend[];
  readonly entries: readonly RevNatEntry[];
  readonly fes: readonly ServiceAddr[];
  readonly slots: readonly number[];
  readonly masters: readonly MasterEntry[];
}

/** Entry i of a batch, written alone through the one-entry calls. */
export function putOne(maps: LbMaps, b: PutBatch, i: number): void {
  switch (b.kind) {
    case 'put-backend':
      return maps.putBackend(b.ids[i]!, b.backends[i]!);
    case 'put-revnat':
      return maps.putRevNat(b.ids[i]!, b.family, b.entries[i]!);
    case 'put-slot':
      return maps.putSlot(b.fes[i]!, b.slots[i]!, b.ids[i]!);
    case 'put-master':
      return maps.putMaster(b.fes[i]!, b.masters[i]!);
  }
}

/** A loadBalancerSourceRanges entry as the datapath holds it. */
export interface SrcRangeEntry {
  readonly family: Family;
  readonly revNatId: number;
  readonly address: string;
  readonly prefixLen: number;
}

/**
 * The tc datapath's per-frontend maps the reconciler writes: Maglev tables
 * (lb_maglev) and source ranges (lb*_src_range). Present only when the tc
 * object is loaded.
 */
export interface NorthSouthMaps {
  /** Writes a whole table (M backend ids) as `table`'s, in place, replacing any. */
  putMaglev(table: number, ids: Uint32Array): void;
  /** Optional: room made at once for the tables about to be written (the kernel's makes its chunks in one update). */
  reserveMaglev?(tables: readonly number[]): void;
  deleteMaglev(table: number): void;
  /** The tables the map holds (keys only: reading M entries each is not needed to adopt them). */
  maglevKeys(): number[];
  putSrcRange(e: SrcRangeEntry): void;
  deleteSrcRange(e: SrcRangeEntry): void;
  srcRanges(): SrcRangeEntry[];
}

/** A batch that failed part way: its first `written` writes are in the map. */
export class PartialWriteError extends Error {
  constructor(
    message: string,
    readonly written: number,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = 'PartialWriteError';
  }
}

/** Every write the reconciler makes. Each call is one map syscall. */
export interface LbMaps {
  /**
   * Optional: entries [from, to) of a batch, in order, in one syscall
   * (BPF_MAP_UPDATE_BATCH), encoded straight from its columns. Throws
   * PartialWriteError naming how many were written before the failure.
   */
  putBatch?(b: PutBatch, from: number, to: number): void;
  putBackend(id: number, backend: Backend): void;
  deleteBackend(id: number, family: Family): void;
  putMaster(fe: ServiceAddr, master: MasterEntry): void;
  deleteMaster(fe: ServiceAddr): void;
  putSlot(fe: ServiceAddr, slot: number, backendId: number): void;
  deleteSlot(fe: ServiceAddr, slot: number): void;
  putRevNat(id: number, family: Family, entry: RevNatEntry): void;
  /**
   * Writes an entry that must already exist (BPF_EXIST): it fails with
   * ENOENT rather than add one, and needs no free room in the map.
   */
  rewriteRevNat(id: number, family: Family, entry: RevNatEntry): void;
  deleteRevNat(id: number, family: Family): void;
  dump(): MapsDump;
  /**
   * Optional: reads every entry of the six maps (batch lookups, one key and
   * one value buffer per map) and sums the digest of each entry's fields in
   * place, without building a dump or looking an entry up. True when every
   * map holds as many entries as `expected` says, with the same digest: the
   * maps hold exactly the expected entries, as dump() would read them
   * (entries it skips are skipped here too).
   */
  matches?(expected: ExpectedMaps): boolean;
}
