// Maglev tables in the kernel: lb_maglev (HASH_OF_MAPS) maps a frontend's
// rev-NAT id (| LB_MAGLEV_V6) to an ARRAY of M backend ids. A table is
// written whole into a new inner map, then swapped in by one update of the
// outer entry (a packet sees the old table or the new one), and the old inner
// map is freed by the kernel once nothing holds it. Tables are derived data:
// the loader never copies them; a restarted agent reads them back by id to
// know what is there (restart keeps them as they are).
import { BPF_ANY, mapById, mapCreate, type BpfMap } from '../native/bpf.js';
import { mapSpecs, u32 } from './abi.gen.js';
import type { Family } from '../lb/types.js';

export const LB_MAGLEV_V6 = 0x80000000;

export const maglevKey = (revNatId: number, family: Family): number => (family === 6 ? (revNatId | LB_MAGLEV_V6) >>> 0 : revNatId);

/** What the reconciler needs of the tables (a fake in tests). */
export interface MaglevMaps {
  /** Writes `table` (M backend ids) as the frontend's table, replacing any. */
  put(key: number, table: Uint32Array): void;
  delete(key: number): void;
  /** The tables the map holds now: key -> its backend ids. */
  read(): Map<number, Uint32Array>;
  /** Bytes one table takes in the kernel (M * 4, plus the array's own overhead not counted). */
  readonly tableBytes: number;
}

export class KernelMaglevMaps implements MaglevMaps {
  private readonly keys: Buffer;
  private readonly inner = mapSpecs.lb_maglev.inner!;

  constructor(
    private readonly outer: BpfMap,
    readonly m: number,
  ) {
    // Keys 0..M-1, made once: every table write sends all M slots in one batch.
    this.keys = Buffer.alloc(4 * m);
    for (let i = 0; i < m; i++) this.keys.writeUInt32LE(i, 4 * i);
  }

  get tableBytes(): number {
    return this.m * 4;
  }

  put(key: number, table: Uint32Array): void {
    if (table.length !== this.m) throw new RangeError(`a Maglev table has ${this.m} slots, not ${table.length}`);
    const map = mapCreate({ type: this.inner.type, keySize: this.inner.keySize, valueSize: this.inner.valueSize, maxEntries: this.m, flags: this.inner.flags, name: 'lb_maglev_inner' });
    try {
      const values = Buffer.from(table.buffer, table.byteOffset, table.byteLength);
      map.batchUpdate(this.keys, values, this.m, BPF_ANY);
      this.outer.update(u32.encode(key), u32.encode(map.fd), BPF_ANY);
    } finally {
      map.close(); // the outer map holds it now
    }
  }

  delete(key: number): void {
    this.outer.delete(u32.encode(key));
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
