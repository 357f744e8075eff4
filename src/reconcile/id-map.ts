// IdMap holds `make bench`'s steady RSS at 100,000 services under its 300
// MiB target: 270-286 MiB with it, 313-315 MiB with a Map in its place (the
// realized backends, rev-NAT entries and slot counts; 29 MiB more heap in
// bench/profile/sync.ts), which also takes the peak of the cold sync from
// 358 to 392 MiB against 400. NumberIdMap holds the same row with
// number-map.ts (see there). IdSet holds the peak RSS of the 100,000 cold
// sync under its 400 MiB target: 358 MiB with it, 394 MiB with a Set (the
// steady RSS 289-292 MiB). bench/run.ts --sizes 100000 --modes lbctl, each
// alternated with the code as it is in one session, 2 repetitions each,
// 2026-12-06 (2 vCPUs, node 20.20).
//
// A Map from ids (small non-negative integers: backend and rev-NAT ids) to
// values, kept in pages of PAGE slots allocated when an id in them is first
// set and dropped when their last id goes. A Map entry costs 30-50 bytes;
// a slot here costs 8, so the realized state and the id allocators, which
// hold several entries per service, shrink with it (docs/architecture.md,
// "Why the agent is built for 100,000 services"). Ids are handed out round-robin over their whole range
// (src/reconcile/ids.ts), so live ids can spread over every page: the worst
// case is one page per live id, PAGE * 8 bytes each, which at a few live
// ids is still little, and at many the pages are full.
//
// Ids beyond MAX_PAGED (adopted from maps an older build wrote with a
// bigger range) go to an ordinary Map.

const PAGE_BITS = 10;
const PAGE = 1 << PAGE_BITS;
/** Ids at or above this go to the overflow Map (2^24: 16,384 pages at most). */
const MAX_PAGED = 1 << 24;

/** A page's slots: an Array or a typed array. */
interface Page<S> {
  [i: number]: S;
}

const paged = (id: number): boolean => id >= 0 && id < MAX_PAGED && Number.isInteger(id);

/**
 * What IdMap and NumberIdMap share: pages by id, a count of the ids set in
 * each, and the overflow Map. A page kind says how a page is made and what
 * an empty slot is.
 */
abstract class PagedIdMap<V, S> implements ReadonlyMap<number, V> {
  private readonly pages: Array<Page<S> | undefined> = [];
  /** Ids set in each page (a page with none is dropped). */
  private readonly counts: number[] = [];
  private readonly overflow = new Map<number, V>();
  private n = 0;

  /** A page of PAGE empty slots. */
  protected abstract newPage(): Page<S>;
  /** A slot's value, undefined when it is empty. */
  protected abstract read(slot: S): V | undefined;
  /** `v` as a slot (throws for a value the page cannot hold). */
  protected abstract slotOf(v: V): S;
  /** The empty slot. */
  protected abstract readonly empty: S;

  get size(): number {
    return this.n;
  }

  get(id: number): V | undefined {
    if (!paged(id)) return this.overflow.get(id);
    const page = this.pages[id >>> PAGE_BITS];
    return page === undefined ? undefined : this.read(page[id & (PAGE - 1)]!);
  }

  has(id: number): boolean {
    return this.get(id) !== undefined;
  }

  /** `v` must not be undefined (an absent id reads as undefined). */
  set(id: number, v: V): this {
    const slot = this.slotOf(v);
    if (!paged(id)) {
      if (!this.overflow.has(id)) this.n++;
      this.overflow.set(id, v);
      return this;
    }
    const p = id >>> PAGE_BITS;
    let page = this.pages[p];
    if (!page) {
      while (this.pages.length <= p) {
        this.pages.push(undefined);
        this.counts.push(0);
      }
      page = this.pages[p] = this.newPage();
    }
    const i = id & (PAGE - 1);
    if (this.read(page[i]!) === undefined) {
      this.n++;
      this.counts[p]!++;
    }
    page[i] = slot;
    return this;
  }

  delete(id: number): boolean {
    if (!paged(id)) {
      if (!this.overflow.delete(id)) return false;
      this.n--;
      return true;
    }
    const p = id >>> PAGE_BITS;
    const page = this.pages[p];
    const i = id & (PAGE - 1);
    if (!page || this.read(page[i]!) === undefined) return false;
    page[i] = this.empty;
    this.n--;
    if (--this.counts[p]! === 0) this.pages[p] = undefined;
    return true;
  }

  /** Ascending ids, then the overflow's. */
  *entries(): MapIterator<[number, V]> {
    for (let p = 0; p < this.pages.length; p++) {
      const page = this.pages[p];
      if (!page) continue;
      for (let i = 0; i < PAGE; i++) {
        const v = this.read(page[i]!);
        if (v !== undefined) yield [(p << PAGE_BITS) | i, v];
      }
    }
    yield* this.overflow.entries();
  }

  *keys(): MapIterator<number> {
    for (const [id] of this.entries()) yield id;
  }

  *values(): MapIterator<V> {
    for (const [, v] of this.entries()) yield v;
  }

  [Symbol.iterator](): MapIterator<[number, V]> {
    return this.entries();
  }

  forEach(fn: (value: V, key: number, map: ReadonlyMap<number, V>) => void): void {
    for (const [k, v] of this.entries()) fn(v, k, this);
  }
}

/** Any values, in Array pages (an empty slot is undefined). */
export class IdMap<V> extends PagedIdMap<V, V | undefined> {
  protected readonly empty = undefined;

  protected newPage(): Page<V | undefined> {
    return new Array<V | undefined>(PAGE).fill(undefined);
  }

  protected read(slot: V | undefined): V | undefined {
    return slot;
  }

  protected slotOf(v: V): V | undefined {
    return v;
  }
}

/**
 * Number values in Float64Array pages: a number kept in an ordinary array
 * beyond the small-integer range is a heap number of its own (16 bytes and
 * a pointer); here it is 8 bytes in place. NaN is the empty slot, so it is
 * no value.
 */
export class NumberIdMap extends PagedIdMap<number, number> {
  protected readonly empty = Number.NaN;

  protected newPage(): Page<number> {
    return new Float64Array(PAGE).fill(Number.NaN);
  }

  protected read(slot: number): number | undefined {
    return Number.isNaN(slot) ? undefined : slot;
  }

  protected slotOf(v: number): number {
    if (Number.isNaN(v)) throw new RangeError('NumberIdMap: NaN is not a value');
    return v;
  }
}

/**
 * A set of ids as bits (ids below MAX_PAGED; others in an ordinary Set). A
 * cold sync of 100,000 services marks 300,000 backend ids: a Set of them was
 * about 9 MiB of garbage, the bits for the same ids 37 KiB.
 */
export class IdSet {
  private bits = new Uint32Array(0);
  private readonly overflow = new Set<number>();
  private n = 0;

  get size(): number {
    return this.n;
  }

  has(id: number): boolean {
    if (!paged(id)) return this.overflow.has(id);
    return ((this.bits[id >>> 5] ?? 0) & (1 << (id & 31))) !== 0;
  }

  add(id: number): this {
    if (!paged(id)) {
      if (!this.overflow.has(id)) this.n++;
      this.overflow.add(id);
      return this;
    }
    const w = id >>> 5;
    if (w >= this.bits.length) {
      const grown = new Uint32Array(Math.max(w + 1, this.bits.length * 2, 64));
      grown.set(this.bits);
      this.bits = grown;
    }
    const bit = 1 << (id & 31);
    if ((this.bits[w]! & bit) === 0) {
      this.bits[w]! |= bit;
      this.n++;
    }
    return this;
  }

  delete(id: number): boolean {
    if (!paged(id)) {
      if (!this.overflow.delete(id)) return false;
      this.n--;
      return true;
    }
    if (!this.has(id)) return false;
    this.bits[id >>> 5]! &= ~(1 << (id & 31));
    this.n--;
    return true;
  }
}
