// The tc datapath's per-frontend maps: Maglev tables and source ranges.
//
// Maglev tables in the kernel (bpf/include/lb_types.h enum lb_maglev_layout,
// Katran's flat layout in chunks): lb_maglev_index maps a frontend's
// rev-NAT id (| LB_MAGLEV_V6) to a row; row r is the blocks of 256 ids from
// (r % 16) * blocks in chunk r / 16, an inner array of lb_maglev. A table is
// written in place, one batch of its blocks; a new frontend's row is written
// before its index entry, and a freed row is reused only after
// ROW_QUARANTINE_MS (no packet still reads it for its old frontend). Tables
// are derived data: the loader never copies them; a restarted agent adopts
// the rows the index names and rewrites what changed.
import { readFileSync } from 'node:fs';
import { BPF_ANY, isErrno, mapById, mapCreate, type BpfMap } from '../native/bpf.js';
import { ipFromBytes, ipv4ToUint, ipv6Bytes, uintToIpv4 } from '../lb/addr.js';
import { lb4_src_range_key, lb6_src_range_key, LbMaglevLayout, mapSpecs, u32 } from './abi.gen.js';
import type { Family } from '../lb/types.js';
import type { NorthSouthMaps, SrcRangeEntry } from './lbmaps.js';

export const LB_MAGLEV_V6 = 0x80000000;
const BLOCK = LbMaglevLayout.LB_MAGLEV_BLOCK_SLOTS;
const CHUNK_TABLES = LbMaglevLayout.LB_MAGLEV_CHUNK_TABLES;
/** How long a freed row waits before another frontend's table is written into it. */
const ROW_QUARANTINE_MS = 2000;

export const maglevKey = (revNatId: number, family: Family): number => (family === 6 ? (revNatId | LB_MAGLEV_V6) >>> 0 : revNatId);

/** Blocks of a table of `m` slots. */
export const maglevBlocks = (m: number): number => Math.ceil(m / BLOCK);

/** What the reconciler needs of the tables (a fake in tests). */
export interface MaglevMaps {
  /** Writes `table` (M backend ids) as the frontend's table, replacing any. */
  put(key: number, table: Uint32Array): void;
  delete(key: number): void;
  /** The tables the map holds now: key -> its backend ids. */
  read(): Map<number, Uint32Array>;
  keys(): number[];
  /** Bytes one table takes in the kernel. */
  readonly tableBytes: number;
}

export class KernelMaglevMaps implements MaglevMaps {
  readonly blocks: number;
  /** frontend key -> row, as lb_maglev_index holds it. */
  private readonly rows = new Map<number, number>();
  /** Rows of the chunks made that no frontend has, ready for one. */
  private readonly free: number[] = [];
  /** Rows freed lately, with when: reused after ROW_QUARANTINE_MS. */
  private readonly cooling: Array<{ readonly row: number; readonly at: number }> = [];
  private readonly chunkMaps = new Map<number, BpfMap>();
  private readonly inner = mapSpecs.lb_maglev.inner!;

  /**
   * Adopts the tables lb_maglev_index names. Chunks of another table size
   * (--maglev-table-size changed) are dropped with the index: every table is
   * written anew.
   */
  constructor(
    private readonly chunks: BpfMap,
    private readonly index: BpfMap,
    readonly m: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.blocks = maglevBlocks(m);
    const kept = new Map<number, BpfMap>();
    let mismatch = false;
    for (const [k, v] of chunks.entries()) {
      const map = mapById(v.readUInt32LE(0));
      if (!map) continue;
      kept.set(k.readUInt32LE(0), map);
      if (map.maxEntries !== CHUNK_TABLES * this.blocks || map.valueSize !== this.inner.valueSize) mismatch = true;
    }
    if (mismatch) {
      for (const [k] of index.entries()) index.delete(k);
      for (const [c, map] of kept) {
        chunks.delete(u32.encode(c));
        map.close();
      }
      return;
    }
    for (const [c, map] of kept) this.chunkMaps.set(c, map);
    const used = new Set<number>();
    for (const [k, v] of index.entries()) {
      const row = v.readUInt32LE(0);
      if (!this.chunkMaps.has(Math.floor(row / CHUNK_TABLES))) {
        index.delete(k); // names a row of no chunk: not a table
        continue;
      }
      this.rows.set(k.readUInt32LE(0), row);
      used.add(row);
    }
    for (const c of [...this.chunkMaps.keys()].sort((a, b) => b - a)) {
      for (let r = c * CHUNK_TABLES + CHUNK_TABLES - 1; r >= c * CHUNK_TABLES; r--) if (!used.has(r)) this.free.push(r);
    }
  }

  /** Bytes of kernel memory one table takes: its blocks (a multiple of 8, so arrays pad nothing). */
  get tableBytes(): number {
    return this.blocks * BLOCK * 4;
  }

  /** The chunks' kernel memory, as the kernel accounts it (fdinfo's memlock), and the rows they hold. */
  kernelMemory(): { bytes: number; rows: number; tables: number } {
    let bytes = 0;
    for (const map of this.chunkMaps.values()) {
      const m = /^memlock:\s*(\d+)/m.exec(readFileSync(`/proc/self/fdinfo/${map.fd}`, 'utf8'));
      bytes += m ? Number(m[1]) : 0;
    }
    return { bytes, rows: this.chunkMaps.size * CHUNK_TABLES, tables: this.rows.size };
  }

  /** A row for a new table: a free one, a cooled one, else a new chunk's. */
  private allocRow(): number {
    const now = this.now();
    while (this.cooling.length > 0 && now - this.cooling[0]!.at >= ROW_QUARANTINE_MS) this.free.push(this.cooling.shift()!.row);
    const row = this.free.pop();
    if (row !== undefined) return row;
    let c = 0;
    while (this.chunkMaps.has(c)) c++;
    if (c >= this.chunks.maxEntries) {
      throw Object.assign(new Error(`lb_maglev: no room for another chunk of ${CHUNK_TABLES} Maglev tables (${this.chunks.maxEntries} chunks)`), { code: 'E2BIG' });
    }
    const map = mapCreate({ type: this.inner.type, keySize: this.inner.keySize, valueSize: this.inner.valueSize, maxEntries: CHUNK_TABLES * this.blocks, flags: this.inner.flags, name: 'lb_maglev_chunk' });
    try {
      this.chunks.update(u32.encode(c), u32.encode(map.fd), BPF_ANY);
    } catch (err) {
      map.close();
      throw err;
    }
    this.chunkMaps.set(c, map);
    for (let r = c * CHUNK_TABLES + CHUNK_TABLES - 1; r > c * CHUNK_TABLES; r--) this.free.push(r);
    return c * CHUNK_TABLES;
  }

  /** Writes `table` into `row`'s blocks (one batch; the slots past M are 0). */
  private writeRow(row: number, table: Uint32Array): void {
    if (table.length !== this.m) throw new RangeError(`a Maglev table has ${this.m} slots, not ${table.length}`);
    const map = this.chunkMaps.get(Math.floor(row / CHUNK_TABLES))!;
    const first = (row % CHUNK_TABLES) * this.blocks;
    const keys = Buffer.alloc(4 * this.blocks);
    for (let b = 0; b < this.blocks; b++) keys.writeUInt32LE(first + b, 4 * b);
    const values = Buffer.alloc(this.tableBytes);
    values.set(new Uint8Array(table.buffer, table.byteOffset, table.byteLength));
    map.batchUpdate(keys, values, this.blocks, BPF_ANY);
  }

  put(key: number, table: Uint32Array): void {
    const had = this.rows.get(key);
    const row = had ?? this.allocRow();
    try {
      this.writeRow(row, table);
      if (had === undefined) this.index.update(u32.encode(key), u32.encode(row), BPF_ANY);
    } catch (err) {
      if (had === undefined) this.free.push(row);
      throw err;
    }
    this.rows.set(key, row);
  }

  delete(key: number): void {
    const row = this.rows.get(key);
    const gone = this.index.delete(u32.encode(key));
    if (row === undefined) {
      if (!gone) throw Object.assign(new Error(`lb_maglev_index: no table ${key}`), { code: 'ENOENT' });
      return;
    }
    this.rows.delete(key);
    this.cooling.push({ row, at: this.now() });
  }

  keys(): number[] {
    return this.index.keys().map((k) => k.readUInt32LE(0));
  }

  read(): Map<number, Uint32Array> {
    return readMaglevTables(this.chunks, this.index, this.m);
  }
}

/** The tables lb_maglev/lb_maglev_index hold, tables of `m` slots: key -> its backend ids. */
export function readMaglevTables(chunks: BpfMap, index: BpfMap, m: number): Map<number, Uint32Array> {
  const out = new Map<number, Uint32Array>();
  const blocks = maglevBlocks(m);
  const chunkMaps = new Map<number, BpfMap>();
  try {
    for (const [k, v] of chunks.entries()) {
      const map = mapById(v.readUInt32LE(0));
      if (map) chunkMaps.set(k.readUInt32LE(0), map);
    }
    for (const [k, v] of index.entries()) {
      const row = v.readUInt32LE(0);
      const map = chunkMaps.get(Math.floor(row / CHUNK_TABLES));
      if (!map) continue;
      const ids = new Uint32Array(blocks * BLOCK);
      const first = (row % CHUNK_TABLES) * blocks;
      for (let b = 0; b < blocks; b++) {
        const value = map.lookup(u32.encode(first + b));
        if (value) ids.set(new Uint32Array(value.buffer.slice(value.byteOffset, value.byteOffset + value.byteLength)), b * BLOCK);
      }
      out.set(k.readUInt32LE(0), ids.slice(0, m));
    }
  } finally {
    for (const map of chunkMaps.values()) map.close();
  }
  return out;
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

  /** The Maglev tables' kernel memory (see KernelMaglevMaps.kernelMemory). */
  maglevMemory(): { bytes: number; rows: number; tables: number } {
    return this.maglev.kernelMemory();
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
