// Holds `make bench`'s steady RSS at 100,000 services under its 300 MiB
// target: 270-286 MiB with this table, 302-319 MiB with a Map of plain row
// objects (a master object and a slots array per entry; 27 MiB more heap in
// bench/profile/sync.ts). bench/run.ts --sizes 100000 --modes lbctl, the
// two alternated in one session, 2 repetitions each, 2026-12-06 (2 vCPUs,
// node 20.20); the time rows (cold sync, resync, add one) moved within the
// run's noise.
//
// The realized entries of lb{4,6}_services (frontends and wildcard entries),
// kept as the maps keep them: a row of numbers per entry in typed columns,
// found by key through one Map of row numbers, and each entry's slots in
// one shared pool. At 100,000 services the realized state held two objects
// per entry (the entry and its master, 72-88 bytes each without pointer
// compression) and a slots array per frontend (about 80 bytes with three
// slots); a row here is 44 bytes of columns, 8 for its address, 8 per slot
// (docs/architecture.md, "Why the agent is built for 100,000 services").
//
// Rows freed by a removal are reused. Slot blocks come in sizes of powers of
// two (block i holds slots 1..2^i) from one Float64Array, with a free list
// per size; a block grows by moving to the next size. A missing slot is -1
// (any uint32 backend id, 0 included, can be held). The pool never shrinks:
// its high-water mark is what the largest state needed.
import type { Family, Protocol, ServiceAddr } from '../lb/types.js';
import { PROTO_NAME, PROTO_NUM, TYPE_NAME, TYPE_NUM } from '../datapath/codes.js';
import type { MasterEntry, MasterType } from '../datapath/lbmaps.js';

/** row() of a key the table does not hold. */
export const NO_ROW = -1;
/** A slot not held, in the pool. */
const EMPTY = -1;

/** One entry as a plain object (tests and messages; the reconciler reads rows). */
export interface RealizedFrontend extends ServiceAddr {
  readonly master: MasterEntry | undefined;
  /** Backend id by slot number, index 0 unused, undefined where missing; `length - 1` is the highest slot held. */
  readonly slots: ReadonlyArray<number | undefined>;
}

export class FrontendTable {
  private readonly index = new Map<string, number>();
  /** Rows removed, for reuse. */
  private readonly freeRows: number[] = [];
  /** Rows handed out (the high-water mark; freed ones included). */
  private rows = 0;
  private capacity = 0;
  private addresses: string[] = [];
  private family_ = new Uint8Array(0);
  private proto = new Uint8Array(0);
  /** 1: the internal scope. */
  private internal = new Uint8Array(0);
  private port_ = new Uint16Array(0);
  /** The digest's hash lanes of the key's fields (EntryHash.serviceKey): each entry's hash resumes from them. */
  private k1_ = new Int32Array(0);
  private k2_ = new Int32Array(0);
  /** 1: slot 0 (the master) is held. */
  private hasMaster_ = new Uint8Array(0);
  private type = new Uint8Array(0);
  private count = new Uint32Array(0);
  private qcount = new Uint32Array(0);
  private revNat = new Uint32Array(0);
  private flags = new Uint32Array(0);
  private affinity = new Uint32Array(0);
  /** The slot block: its start in the pool and its size class (-1: none). */
  private slotStart = new Uint32Array(0);
  private slotClass = new Int8Array(0);
  /** The highest slot held, plus one (1 when none is). */
  private slotEnd_ = new Uint32Array(0);

  private pool = new Float64Array(256);
  private poolTop = 0;
  private readonly freeBlocks: number[][] = [];

  get size(): number {
    return this.index.size;
  }

  /** The row of `key`, or NO_ROW. */
  row(key: string): number {
    return this.index.get(key) ?? NO_ROW;
  }

  has(key: string): boolean {
    return this.index.has(key);
  }

  keys(): IterableIterator<string> {
    return this.index.keys();
  }

  /** [key, row] of every entry. */
  entries(): IterableIterator<[string, number]> {
    return this.index.entries();
  }

  /** A new row for `key` (not held yet), with neither master nor slots. */
  add(key: string, fe: ServiceAddr, k1: number, k2: number): number {
    let row = this.freeRows.pop();
    if (row === undefined) {
      if (this.rows === this.capacity) this.grow();
      row = this.rows++;
    }
    this.index.set(key, row);
    this.addresses[row] = fe.address;
    this.family_[row] = fe.family;
    this.proto[row] = PROTO_NUM[fe.protocol];
    this.internal[row] = fe.scope === 'internal' ? 1 : 0;
    this.port_[row] = fe.port;
    this.k1_[row] = k1;
    this.k2_[row] = k2;
    this.hasMaster_[row] = 0;
    this.slotClass[row] = -1;
    this.slotEnd_[row] = 1;
    return row;
  }

  /** Drops `key`'s row (its slots with it). */
  remove(key: string): void {
    const row = this.index.get(key);
    if (row === undefined) return;
    this.index.delete(key);
    this.freeBlock(row);
    this.addresses[row] = '';
    this.freeRows.push(row);
  }

  address(row: number): string {
    return this.addresses[row]!;
  }

  family(row: number): Family {
    return this.family_[row] as Family;
  }

  port(row: number): number {
    return this.port_[row]!;
  }

  protocol(row: number): Protocol | 'ANY' {
    return PROTO_NAME.get(this.proto[row]!)!;
  }

  /** An address-only entry (protocol ANY). */
  isWildcard(row: number): boolean {
    return this.proto[row] === PROTO_NUM.ANY;
  }

  /** The key's fields, as a new object (it keeps nothing of the table alive). */
  addr(row: number): ServiceAddr {
    const a = { address: this.addresses[row]!, family: this.family(row), port: this.port(row), protocol: this.protocol(row) };
    return this.internal[row] ? { ...a, scope: 'internal' } : a;
  }

  k1(row: number): number {
    return this.k1_[row]!;
  }

  k2(row: number): number {
    return this.k2_[row]!;
  }

  /** hasMaster, masterType and revNatId read NO_ROW as an entry without a master. */
  hasMaster(row: number): boolean {
    return row >= 0 && this.hasMaster_[row] === 1;
  }

  /** The master's type, undefined without a master. */
  masterType(row: number): MasterType | undefined {
    return this.hasMaster(row) ? TYPE_NAME.get(this.type[row]!) : undefined;
  }

  /** The master's rev-NAT id, undefined without a master. */
  revNatId(row: number): number | undefined {
    return this.hasMaster(row) ? this.revNat[row] : undefined;
  }

  /** The master as a new object, undefined without one. */
  master(row: number): MasterEntry | undefined {
    if (!this.hasMaster_[row]) return undefined;
    return {
      count: this.count[row]!,
      qcount: this.qcount[row]!,
      revNatId: this.revNat[row]!,
      type: TYPE_NAME.get(this.type[row]!)!,
      flags: this.flags[row]!,
      affinityTimeout: this.affinity[row]!,
    };
  }

  /** Whether the row holds exactly master `m`. */
  sameMaster(row: number, m: MasterEntry): boolean {
    return (
      this.hasMaster_[row] === 1 &&
      this.count[row] === m.count &&
      this.qcount[row] === m.qcount &&
      this.revNat[row] === m.revNatId &&
      this.type[row] === TYPE_NUM[m.type] &&
      this.flags[row] === m.flags &&
      this.affinity[row] === m.affinityTimeout
    );
  }

  setMaster(row: number, m: MasterEntry): void {
    this.hasMaster_[row] = 1;
    this.count[row] = m.count;
    this.qcount[row] = m.qcount;
    this.revNat[row] = m.revNatId;
    this.type[row] = TYPE_NUM[m.type];
    this.flags[row] = m.flags;
    this.affinity[row] = m.affinityTimeout;
  }

  clearMaster(row: number): void {
    this.hasMaster_[row] = 0;
  }

  /** The highest slot held plus one; 1 when none is. */
  slotEnd(row: number): number {
    return this.slotEnd_[row]!;
  }

  /** The backend id in slot `s` (s ≥ 1), undefined where missing. */
  slot(row: number, s: number): number | undefined {
    if (s < 1 || s >= this.slotEnd_[row]!) return undefined;
    const id = this.pool[this.slotStart[row]! + s - 1]!;
    return id === EMPTY ? undefined : id;
  }

  setSlot(row: number, s: number, backendId: number): void {
    let cls = this.slotClass[row]!;
    if (cls < 0 || s > 1 << cls) {
      let want = Math.max(0, cls + 1);
      while (1 << want < s) want++;
      const at = this.allocBlock(want);
      if (cls >= 0) {
        const from = this.slotStart[row]!;
        this.pool.copyWithin(at, from, from + (1 << cls));
        this.freeBlock(row);
      }
      this.slotStart[row] = at;
      this.slotClass[row] = cls = want;
    }
    this.pool[this.slotStart[row]! + s - 1] = backendId;
    if (s >= this.slotEnd_[row]!) this.slotEnd_[row] = s + 1;
  }

  /** Empties slot `s`; the end moves down past the empty slots on top, and a row left with none gives its block back. */
  clearSlot(row: number, s: number): void {
    let end = this.slotEnd_[row]!;
    if (s < 1 || s >= end) return;
    const start = this.slotStart[row]!;
    this.pool[start + s - 1] = EMPTY;
    while (end > 1 && this.pool[start + end - 2] === EMPTY) end--;
    this.slotEnd_[row] = end;
    if (end === 1) this.freeBlock(row);
  }

  /** [slot, backend id] of every slot held, ascending. */
  *heldSlots(row: number): Generator<[slot: number, backendId: number]> {
    for (let s = 1; s < this.slotEnd_[row]!; s++) {
      const id = this.slot(row, s);
      if (id !== undefined) yield [s, id];
    }
  }

  /** `key`'s entry as a plain object, undefined when not held (tests and messages). */
  view(key: string): RealizedFrontend | undefined {
    const row = this.row(key);
    if (row === NO_ROW) return undefined;
    const slots: Array<number | undefined> = [undefined];
    for (let s = 1; s < this.slotEnd_[row]!; s++) slots.push(this.slot(row, s));
    return { ...this.addr(row), master: this.master(row), slots };
  }

  private allocBlock(cls: number): number {
    const size = 1 << cls;
    let at = this.freeBlocks[cls]?.pop();
    if (at === undefined) {
      if (this.poolTop + size > this.pool.length) {
        const grown = new Float64Array(Math.max(this.pool.length * 2, this.poolTop + size));
        grown.set(this.pool.subarray(0, this.poolTop));
        this.pool = grown;
      }
      at = this.poolTop;
      this.poolTop += size;
    }
    this.pool.fill(EMPTY, at, at + size);
    return at;
  }

  /** Gives the row's slot block back, if it has one (the row then holds none). */
  private freeBlock(row: number): void {
    const cls = this.slotClass[row]!;
    if (cls < 0) return;
    (this.freeBlocks[cls] ??= []).push(this.slotStart[row]!);
    this.slotClass[row] = -1;
    this.slotEnd_[row] = 1;
  }

  private grow(): void {
    const n = Math.max(64, this.capacity * 2);
    const g = <T extends Uint8Array | Int8Array | Uint16Array | Int32Array | Uint32Array>(a: T, make: new (n: number) => T): T => {
      const b = new make(n);
      b.set(a);
      return b;
    };
    this.family_ = g(this.family_, Uint8Array);
    this.proto = g(this.proto, Uint8Array);
    this.internal = g(this.internal, Uint8Array);
    this.port_ = g(this.port_, Uint16Array);
    this.k1_ = g(this.k1_, Int32Array);
    this.k2_ = g(this.k2_, Int32Array);
    this.hasMaster_ = g(this.hasMaster_, Uint8Array);
    this.type = g(this.type, Uint8Array);
    this.count = g(this.count, Uint32Array);
    this.qcount = g(this.qcount, Uint32Array);
    this.revNat = g(this.revNat, Uint32Array);
    this.flags = g(this.flags, Uint32Array);
    this.affinity = g(this.affinity, Uint32Array);
    this.slotStart = g(this.slotStart, Uint32Array);
    this.slotClass = g(this.slotClass, Int8Array);
    this.slotEnd_ = g(this.slotEnd_, Uint32Array);
    this.capacity = n;
  }
}
