// The tc datapath's per-frontend maps: Maglev tables and source ranges.
//
// Maglev tables in the kernel (bpf/include/lb_types.h enum lb_maglev_layout,
// Katran's flat layout in chunks): lb_maglev_index maps a frontend's
// rev-NAT id (| LB_MAGLEV_V6) to where its table is (chunk, first slot, M);
// a chunk is an inner array of lb_maglev holding tables back to back in
// blocks of 1,024 ids (4 KiB). A table is written in place (its blocks in one batch; a
// block it shares with a neighbour is read and written back whole); a new
// frontend's table is written before its index entry; a freed place is
// reused only after QUARANTINE_MS, so no packet still reading it for its old
// frontend sees another's. Every chunk made is one map-of-maps update, which
// waits for an RCU grace period (about 10 ms): reserve() makes the chunks a
// sync needs at once, and chunks are sized to what is needed. Tables are
// derived data: the loader never copies them; a restarted agent adopts the
// places the index names and rewrites what changed.
import { readFileSync } from 'node:fs';
import { BPF_ANY, isErrno, mapById, mapCreate, type BpfMap } from '../native/bpf.js';
import { ipFromBytes, ipv4ToUint, ipv6Bytes, uintToIpv4 } from '../lb/addr.js';
import { lb4_src_range_key, lb6_src_range_key, lb_maglev_row, LbMaglevLayout, mapSpecs, u32 } from './abi.gen.js';
import type { Family } from '../lb/types.js';
import type { NorthSouthMaps, SrcRangeEntry } from './lbmaps.js';

const BLOCK = LbMaglevLayout.LB_MAGLEV_BLOCK_SLOTS;
/** How long a freed table's place (or a dropped chunk's number) waits before it is used again. */
const QUARANTINE_MS = 2000;
/** Slots of the largest chunk made (64 MiB): one vmalloc each. */
const CHUNK_SLOTS_MAX = 1 << 24;
/** A chunk made for tables one at a time holds at least this many, or an eighth of those there are. */
const CHUNK_TABLES_MIN = 16;

/** Where a table is: lb_maglev_index's value. */
interface Place {
  readonly chunk: number;
  readonly first: number;
  readonly m: number;
}

interface Chunk {
  readonly map: BpfMap;
  /** Tables in it that a frontend has. */
  used: number;
}

export class KernelMaglevMaps {
  private readonly rows = new Map<number, Place>();
  private readonly chunkMaps = new Map<number, Chunk>();
  /** Places of M slots no frontend has, ready for one. */
  private free: Place[] = [];
  /** Places freed lately, with when. */
  private cooling: Array<{ readonly place: Place; readonly at: number }> = [];
  /** Chunk numbers dropped lately, with when. */
  private readonly retired = new Map<number, number>();
  private readonly inner = mapSpecs.lb_maglev.inner!;
  /** What write() hands the kernel, kept from one write to the next. */
  private scratch = Buffer.alloc(0);

  /**
   * Adopts the tables lb_maglev_index names (an entry naming no chunk is
   * deleted); the gaps between them in their chunks are free places. Tables
   * of another size (--maglev-table-size changed) stay until rewritten.
   */
  constructor(
    private readonly chunks: BpfMap,
    private readonly index: BpfMap,
    readonly m: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    const rows = index.entries().map(([k, v]) => [k, lb_maglev_row.decode(v)] as const);
    for (const [c, id] of namedChunks(chunks, rows.map(([, place]) => place.chunk))) {
      const map = mapById(id);
      if (map) this.chunkMaps.set(c, { map, used: 0 });
    }
    const taken = new Map<number, Place[]>();
    for (const [k, place] of rows) {
      const chunk = this.chunkMaps.get(place.chunk);
      if (!chunk || place.m === 0 || place.first + place.m > chunk.map.maxEntries * BLOCK) {
        index.delete(k); // names no table: new flows pick at random until it is rewritten
        continue;
      }
      this.rows.set(k.readUInt32LE(0), place);
      chunk.used++;
      const inChunk = taken.get(place.chunk);
      if (inChunk) inChunk.push(place);
      else taken.set(place.chunk, [place]);
    }
    for (const [c, chunk] of this.chunkMaps) {
      const places = (taken.get(c) ?? []).sort((a, b) => a.first - b.first);
      let at = 0;
      for (const p of [...places, { first: chunk.map.maxEntries * BLOCK, m: 0 }]) {
        for (; at + m <= p.first; at += m) this.free.push({ chunk: c, first: at, m });
        at = Math.max(at, p.first + p.m);
      }
    }
  }

  /** The chunks' kernel memory, as the kernel accounts it (fdinfo's memlock), their slots and the tables in them. */
  kernelMemory(): { bytes: number; chunks: number; slots: number; tables: number } {
    let bytes = 0;
    let slots = 0;
    for (const { map } of this.chunkMaps.values()) {
      const m = /^memlock:\s*(\d+)/m.exec(readFileSync(`/proc/self/fdinfo/${map.fd}`, 'utf8'));
      bytes += m ? Number(m[1]) : 0;
      slots += map.maxEntries * BLOCK;
    }
    return { bytes, chunks: this.chunkMaps.size, slots, tables: this.rows.size };
  }

  /**
   * Room for the tables of `keys` that have none of this size yet, made at
   * once: the chunks they need, added to lb_maglev in one batch (one RCU
   * grace period for them all).
   */
  reserve(keys: readonly number[]): void {
    this.cool();
    const need = keys.filter((k) => this.rows.get(k)?.m !== this.m).length - this.free.length;
    if (need <= 0) return;
    const perChunk = Math.max(1, Math.floor(CHUNK_SLOTS_MAX / this.m));
    const made: Array<[number, BpfMap, number]> = [];
    try {
      for (let left = need; left > 0; left -= perChunk) made.push(this.makeChunk(Math.min(left, perChunk), made.map(([c]) => c)));
      const ks = Buffer.alloc(4 * made.length);
      const fds = Buffer.alloc(4 * made.length);
      made.forEach(([c, map], i) => {
        ks.writeUInt32LE(c, 4 * i);
        fds.writeUInt32LE(map.fd, 4 * i);
      });
      this.chunks.batchUpdate(ks, fds, made.length, BPF_ANY);
    } catch (err) {
      for (const [, map] of made) map.close();
      throw err;
    }
    for (const [c, map, tables] of made) this.adoptChunk(c, map, tables);
  }

  /** A chunk map for `tables` tables under the lowest number free (not in `also`); not yet in lb_maglev. */
  private makeChunk(tables: number, also: readonly number[] = []): [number, BpfMap, number] {
    const now = this.now();
    let c = 0;
    while (this.chunkMaps.has(c) || also.includes(c) || now - (this.retired.get(c) ?? -Infinity) < QUARANTINE_MS) c++;
    if (c >= this.chunks.maxEntries) {
      throw Object.assign(new Error(`lb_maglev: all ${this.chunks.maxEntries} chunks in use: no room for another Maglev table`), { code: 'E2BIG' });
    }
    const map = mapCreate({ type: this.inner.type, keySize: this.inner.keySize, valueSize: this.inner.valueSize, maxEntries: Math.ceil((tables * this.m) / BLOCK), flags: this.inner.flags, name: 'lb_maglev_chunk' });
    return [c, map, tables];
  }

  private adoptChunk(c: number, map: BpfMap, tables: number): void {
    this.chunkMaps.set(c, { map, used: 0 });
    this.retired.delete(c);
    for (let i = tables - 1; i >= 0; i--) this.free.push({ chunk: c, first: i * this.m, m: this.m });
  }

  private cool(): void {
    const now = this.now();
    let i = 0;
    while (i < this.cooling.length && now - this.cooling[i]!.at >= QUARANTINE_MS) this.free.push(this.cooling[i++]!.place);
    if (i > 0) this.cooling = this.cooling.slice(i);
  }

  /** A place for a new table: a free one, else a new chunk's (for an eighth of the tables there are, at least 16). */
  private allocPlace(): Place {
    this.cool();
    const place = this.free.pop();
    if (place) return place;
    const tables = Math.min(Math.max(CHUNK_TABLES_MIN, Math.ceil(this.rows.size / 8)), Math.max(1, Math.floor(CHUNK_SLOTS_MAX / this.m)));
    const [c, map] = this.makeChunk(tables);
    try {
      this.chunks.update(u32.encode(c), u32.encode(map.fd), BPF_ANY);
    } catch (err) {
      map.close();
      throw err;
    }
    this.adoptChunk(c, map, tables);
    return this.free.pop()!;
  }

  /** A place no frontend has any more: reused after the quarantine; a chunk left empty is dropped. */
  private release(place: Place): void {
    const chunk = this.chunkMaps.get(place.chunk);
    if (!chunk) return;
    if (--chunk.used > 0) {
      if (place.m === this.m) this.cooling.push({ place, at: this.now() });
      return;
    }
    this.chunks.delete(u32.encode(place.chunk));
    chunk.map.close();
    this.chunkMaps.delete(place.chunk);
    this.retired.set(place.chunk, this.now());
    this.free = this.free.filter((p) => p.chunk !== place.chunk);
    this.cooling = this.cooling.filter((p) => p.place.chunk !== place.chunk);
  }

  /** Writes `table` at `place`: its blocks in one batch, a block shared with a neighbour read first. */
  private write(place: Place, table: Uint32Array): void {
    const map = this.chunkMaps.get(place.chunk)!.map;
    const fb = Math.floor(place.first / BLOCK);
    const lb = Math.floor((place.first + place.m - 1) / BLOCK);
    const n = lb - fb + 1;
    // One buffer for every write, not one allocated per table (10,000 of 64 KiB at a cold start: garbage the GC runs after).
    if (this.scratch.length < n * BLOCK * 4) this.scratch = Buffer.allocUnsafe(n * BLOCK * 4);
    const values = this.scratch.subarray(0, n * BLOCK * 4);
    if (place.first % BLOCK !== 0) edge(map, fb, values, 0);
    if ((place.first + place.m) % BLOCK !== 0) edge(map, lb, values, (n - 1) * BLOCK * 4);
    values.set(new Uint8Array(table.buffer, table.byteOffset, table.byteLength), (place.first % BLOCK) * 4);
    const keys = Buffer.alloc(4 * n);
    for (let b = 0; b < n; b++) keys.writeUInt32LE(fb + b, 4 * b);
    map.batchUpdate(keys, values, n, BPF_ANY);
  }

  put(key: number, table: Uint32Array): void {
    if (table.length !== this.m) throw new RangeError(`a Maglev table has ${this.m} slots, not ${table.length}`);
    const had = this.rows.get(key);
    if (had?.m === this.m) {
      this.write(had, table);
      return;
    }
    const place = this.allocPlace();
    try {
      this.write(place, table);
      this.index.update(u32.encode(key), lb_maglev_row.encode(place), BPF_ANY);
    } catch (err) {
      this.free.push(place);
      throw err;
    }
    this.rows.set(key, place);
    this.chunkMaps.get(place.chunk)!.used++;
    if (had) this.release(had);
  }

  delete(key: number): void {
    const gone = this.index.delete(u32.encode(key));
    const place = this.rows.get(key);
    if (!place) {
      if (!gone) throw Object.assign(new Error(`lb_maglev_index: no table ${key}`), { code: 'ENOENT' });
      return;
    }
    this.rows.delete(key);
    this.release(place);
  }

  keys(): number[] {
    return this.index.keys().map((k) => k.readUInt32LE(0));
  }

  read(): Map<number, Uint32Array> {
    return readMaglevTables(this.chunks, this.index);
  }
}

/** Block `key` of `map` (a neighbour's slots with the table's) into `into` at `at`; zeros if it has none. */
function edge(map: BpfMap, key: number, into: Buffer, at: number): void {
  const block = map.lookup(u32.encode(key));
  if (block) block.copy(into, at, 0, BLOCK * 4);
  else into.fill(0, at, at + BLOCK * 4);
}

/**
 * The inner map ids of the chunks `named` (lb_maglev_index's rows name them),
 * by chunk number; a number lb_maglev has no map under is left out.
 *
 * lb_maglev is looked up only where the index points, never walked: before
 * Linux 6.8 every lookup of a map-of-maps from user space waits for an RCU
 * grace period (bpf_map_copy_value ends in maybe_wait_bpf_programs), about
 * 10 ms on a 5.10 or 6.1 node and 16 ms under emulation, so a walk of its
 * 4,096 entries took over a minute at every start and every `lbctl bpf lb
 * list`. A chunk no row names (the agent stopped between making it and
 * writing a table there) is not found this way; it holds memory until its
 * number is made again, which replaces it, and the lowest free number is
 * always made first.
 */
function namedChunks(chunks: BpfMap, named: Iterable<number>): Map<number, number> {
  const out = new Map<number, number>();
  for (const c of new Set(named)) {
    if (c >= chunks.maxEntries) continue;
    const v = chunks.lookup(u32.encode(c));
    if (v) out.set(c, v.readUInt32LE(0));
  }
  return out;
}

/** The tables lb_maglev and lb_maglev_index hold: key -> its backend ids. */
export function readMaglevTables(chunks: BpfMap, index: BpfMap): Map<number, Uint32Array> {
  const out = new Map<number, Uint32Array>();
  const blocks = new Map<number, Buffer>(); // a chunk's blocks, read once
  const rows = index.entries().map(([k, v]) => [k, lb_maglev_row.decode(v)] as const);
  const chunkIds = namedChunks(chunks, rows.map(([, place]) => place.chunk));
  for (const [k, place] of rows) {
    let all = blocks.get(place.chunk);
    if (!all) {
      const id = chunkIds.get(place.chunk);
      const map = id === undefined ? null : mapById(id);
      if (!map) continue;
      try {
        all = Buffer.alloc(map.maxEntries * BLOCK * 4);
        const { keys, values, count } = map.entriesFlat();
        for (let i = 0; i < count; i++) values.copy(all, keys.readUInt32LE(4 * i) * BLOCK * 4, i * BLOCK * 4, (i + 1) * BLOCK * 4);
      } finally {
        map.close();
      }
      blocks.set(place.chunk, all);
    }
    if ((place.first + place.m) * 4 > all.length) continue;
    // A copy (the ids are little-endian, as this host's Uint32Array).
    out.set(k.readUInt32LE(0), new Uint32Array(all.buffer.slice(all.byteOffset + place.first * 4, all.byteOffset + (place.first + place.m) * 4)));
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

  reserveMaglev(tables: readonly number[]): void {
    this.maglev.reserve(tables);
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
