// The tc datapath's per-frontend maps: Maglev tables and source ranges.
//
// Maglev tables in the kernel: lb_maglev (HASH_OF_MAPS) maps a frontend's
// rev-NAT id (| LB_MAGLEV_V6) to an ARRAY of M backend ids. A table is
// written whole into a new inner map, then swapped in by one update of the
// outer entry (a packet sees the old table or the new one), and the old inner
// map is freed by the kernel once nothing holds it. Tables are derived data:
// the loader never copies them; a restarted agent reads them back by id to
// know what is there (restart keeps them as they are).
import { BPF_ANY, isErrno, mapById, mapCreate, type BpfMap } from '../native/bpf.js';
import { ipFromBytes, ipv4ToUint, ipv6Bytes, uintToIpv4 } from '../lb/addr.js';
import { lb4_src_range_key, lb6_src_range_key, mapSpecs, u32 } from './abi.gen.js';
import type { Family } from '../lb/types.js';
import type { NorthSouthMaps, SrcRangeEntry } from './lbmaps.js';

export const LB_MAGLEV_V6 = 0x80000000;

export const maglevKey = (revNatId: number, family: Family): number => (family === 6 ? (revNatId | LB_MAGLEV_V6) >>> 0 : revNatId);

/** What the reconciler needs of the tables (a fake in tests). */
export interface MaglevMaps {
  /** Writes `table` (M backend ids) as the frontend's table, replacing any. */
  put(key: number, table: Uint32Array): void;
  delete(key: number): void;
  /** The tables the map holds now: key -> its backend ids. */
  read(): Map<number, Uint32Array>;
  keys(): number[];
  /** Bytes one table takes in the kernel (M * 4, plus the array's own overhead not counted). */
  readonly tableBytes: number;
}

export class KernelMaglevMaps implements MaglevMaps {
  private readonly slotKeys: Buffer;
  private readonly inner = mapSpecs.lb_maglev.inner!;

  constructor(
    private readonly outer: BpfMap,
    readonly m: number,
  ) {
    // Keys 0..M-1, made once: every table write sends all M slots in one batch.
    this.slotKeys = Buffer.alloc(4 * m);
    for (let i = 0; i < m; i++) this.slotKeys.writeUInt32LE(i, 4 * i);
  }

  get tableBytes(): number {
    return this.m * 4;
  }

  put(key: number, table: Uint32Array): void {
    if (table.length !== this.m) throw new RangeError(`a Maglev table has ${this.m} slots, not ${table.length}`);
    const map = mapCreate({ type: this.inner.type, keySize: this.inner.keySize, valueSize: this.inner.valueSize, maxEntries: this.m, flags: this.inner.flags, name: 'lb_maglev_inner' });
    try {
      const values = Buffer.from(table.buffer, table.byteOffset, table.byteLength);
      map.batchUpdate(this.slotKeys, values, this.m, BPF_ANY);
      this.outer.update(u32.encode(key), u32.encode(map.fd), BPF_ANY);
    } finally {
      map.close(); // the outer map holds it now
    }
  }

  /** Tables into new inner maps, then all of them into the outer map in one batch (one RCU wait, not one each). */
  putMany(tables: ReadonlyArray<{ readonly table: number; readonly ids: Uint32Array }>): void {
    const inner: BpfMap[] = [];
    try {
      for (const t of tables) {
        if (t.ids.length !== this.m) throw new RangeError(`a Maglev table has ${this.m} slots, not ${t.ids.length}`);
        const map = mapCreate({ type: this.inner.type, keySize: this.inner.keySize, valueSize: this.inner.valueSize, maxEntries: this.m, flags: this.inner.flags, name: 'lb_maglev_inner' });
        inner.push(map);
        map.batchUpdate(this.slotKeys, Buffer.from(t.ids.buffer, t.ids.byteOffset, t.ids.byteLength), this.m, BPF_ANY);
      }
      const keys = Buffer.alloc(4 * tables.length);
      const fds = Buffer.alloc(4 * tables.length);
      tables.forEach((t, i) => {
        keys.writeUInt32LE(t.table, 4 * i);
        fds.writeUInt32LE(inner[i]!.fd, 4 * i);
      });
      this.outer.batchUpdate(keys, fds, tables.length, BPF_ANY);
    } finally {
      for (const map of inner) map.close(); // the outer map holds its own references
    }
  }

  delete(key: number): void {
    this.outer.delete(u32.encode(key));
  }

  keys(): number[] {
    return this.outer.entries().map(([k]) => k.readUInt32LE(0));
  }

  read(): Map<number, Uint32Array> {
    const out = new Map<number, Uint32Array>();
    for (const [k, v] of this.outer.entries()) {
      const map = mapById(v.readUInt32LE(0));
      if (!map) continue;
      try {
        const ids = new Uint32Array(map.maxEntries);
        for (const [slot, id] of map.entries()) {
          const i = slot.readUInt32LE(0);
          if (i < ids.length) ids[i] = id.readUInt32LE(0);
        }
        out.set(k.readUInt32LE(0), ids);
      } finally {
        map.close();
      }
    }
    return out;
  }
}

/** Each backend's share of a table: id -> slots, for `lbctl bpf lb list --maglev`. */
export function tableShares(table: Uint32Array): Map<number, number> {
  const out = new Map<number, number>();
  for (const id of table) out.set(id, (out.get(id) ?? 0) + 1);
  return out;
}

/**
 * Source ranges: an LPM trie per family keyed by (rev-NAT id, client
 * prefix); prefixlen counts the id's 32 bits too, so one trie serves every
 * frontend.
 */
export class KernelNorthSouthMaps implements NorthSouthMaps {
  private readonly one = Buffer.from([1]);

  constructor(
    readonly maglev: KernelMaglevMaps,
    private readonly src: Record<Family, BpfMap>,
  ) {}

  putMaglev(table: number, ids: Uint32Array): void {
    this.maglev.put(table, ids);
  }

  putMaglevMany(tables: ReadonlyArray<{ readonly table: number; readonly ids: Uint32Array }>): void {
    this.maglev.putMany(tables);
  }

  deleteMaglev(table: number): void {
    try {
      this.maglev.delete(table);
    } catch (err) {
      if (!isErrno(err, 'ENOENT')) throw err;
    }
  }

  maglevKeys(): number[] {
    return this.maglev.keys();
  }

  private key(e: SrcRangeEntry): Buffer {
    return e.family === 4
      ? lb4_src_range_key.encode({ prefixlen: 32 + e.prefixLen, revNatIndex: e.revNatId, address: ipv4ToUint(e.address) })
      : lb6_src_range_key.encode({ prefixlen: 32 + e.prefixLen, revNatIndex: e.revNatId, address: ipv6Bytes(e.address) });
  }

  putSrcRange(e: SrcRangeEntry): void {
    this.src[e.family].update(this.key(e), this.one, BPF_ANY);
  }

  deleteSrcRange(e: SrcRangeEntry): void {
    this.src[e.family].delete(this.key(e));
  }

  srcRanges(): SrcRangeEntry[] {
    const out: SrcRangeEntry[] = [];
    for (const [k] of this.src[4].entries()) {
      const d = lb4_src_range_key.decode(k);
      out.push({ family: 4, revNatId: d.revNatIndex, address: uintToIpv4(d.address), prefixLen: d.prefixlen - 32 });
    }
    for (const [k] of this.src[6].entries()) {
      const d = lb6_src_range_key.decode(k);
      out.push({ family: 6, revNatId: d.revNatIndex, address: ipFromBytes(d.address), prefixLen: d.prefixlen - 32 });
    }
    return out;
  }
}
