// Stable ids for backends and rev-NAT entries. An id belongs to a key (a
// backend address, a frontend) until released; ids are handed out round-robin
// rather than lowest-free, so a freed id is not reused at once (a socket's
// rev-NAT entry that names an old id is then detected as stale, not
// mistaken for a new service). On start, ids are adopted from the maps.
//
// The range is the room of the maps the ids index (Reconciler: rev-NAT ids
// 1..max_entries of the family's rev-NAT map; backend ids 1..the room of
// both backend maps), so there are never more ids out than entries fit, and
// freed ids come round again. An allocator out of ids is "no room", the same
// as a full map: the caller leaves that frontend out and reports it.
//
// An id beyond the range (the maps were shrunk, or an older lbctl handed it
// out) is still adopted on restore and kept while its key lives: renumbering
// it would need a free entry in a map that may be exactly full (a deadlock:
// the old entry is named by live slots or sockets until the new one exists),
// and would make every socket's rev-NAT entry that names it stale. Such ids
// are never handed out again once released, so they die out.
import { LbError } from '../base/errors.js';
import { IdMap, NumberIdMap } from './id-map.js';
import { NumberKeyMap } from './number-map.js';

/**
 * An allocator's two directions, key → id and id → key. Iterating must not
 * overlap a change (NumberKeys' table moves entries on delete).
 */
export interface KeyIds<K> {
  readonly size: number;
  idOf(key: K): number | undefined;
  keyOf(id: number): K | undefined;
  set(key: K, id: number): void;
  delete(key: K, id: number): void;
  entries(): IterableIterator<[K, number]>;
}

/** Any keys: a Map one way, an IdMap the other. */
export class MapKeyIds<K> implements KeyIds<K> {
  private readonly byKey = new Map<K, number>();
  private readonly byId = new IdMap<K>();

  get size(): number {
    return this.byKey.size;
  }

  idOf(key: K): number | undefined {
    return this.byKey.get(key);
  }

  keyOf(id: number): K | undefined {
    return this.byId.get(id);
  }

  set(key: K, id: number): void {
    this.byKey.set(key, id);
    this.byId.set(id, key);
  }

  delete(key: K, id: number): void {
    this.byKey.delete(key);
    this.byId.delete(id);
  }

  entries(): IterableIterator<[K, number]> {
    return this.byKey.entries();
  }
}

/**
 * Whole-number keys below 2^53 (the IPv4 backends' keys) in typed tables,
 * with no heap number per key (src/reconcile/number-map.ts, which says what
 * bench target they hold up); any other key (the IPv6 backends' strings)
 * as MapKeyIds.
 */
export class NumberKeyIds<K> implements KeyIds<number | K> {
  private readonly byKey = new NumberKeyMap();
  private readonly byId = new NumberIdMap();
  private readonly others = new MapKeyIds<K>();

  get size(): number {
    return this.byKey.size + this.others.size;
  }

  idOf(key: number | K): number | undefined {
    return typeof key === 'number' ? this.byKey.get(key) : this.others.idOf(key);
  }

  keyOf(id: number): number | K | undefined {
    return this.byId.get(id) ?? this.others.keyOf(id);
  }

  set(key: number | K, id: number): void {
    if (typeof key !== 'number') return this.others.set(key, id);
    this.byKey.set(key, id);
    this.byId.set(id, key);
  }

  delete(key: number | K, id: number): void {
    if (typeof key !== 'number') return this.others.delete(key, id);
    this.byKey.delete(key);
    this.byId.delete(id);
  }

  *entries(): IterableIterator<[number | K, number]> {
    yield* this.byKey.entries();
    yield* this.others.entries();
  }
}

export class IdAllocator<K> {
  /** Ids in use within min..max (adopted ones beyond it do not take room there). */
  private used = 0;
  private next: number;

  constructor(
    readonly what: string,
    readonly min: number,
    readonly max: number,
    /** How keys and ids are kept (NumberKeyIds for numeric keys). */
    private readonly ids: KeyIds<K> = new MapKeyIds<K>(),
  ) {
    if (!Number.isInteger(min) || !Number.isInteger(max) || min < 0 || max < min) throw new RangeError(`${what} ids: bad range ${min}..${max}`);
    this.next = min;
  }

  get size(): number {
    return this.ids.size;
  }

  get(key: K): number | undefined {
    return this.ids.idOf(key);
  }

  /** Every key and its id (the allocator must not change while this is iterated). */
  entries(): IterableIterator<[K, number]> {
    return this.ids.entries();
  }

  /**
   * Claims `id` for `key` (restore): any id from min on, including one
   * beyond max (see the header). False when either is already taken.
   */
  adopt(key: K, id: number): boolean {
    if (!Number.isInteger(id) || id < this.min || this.ids.keyOf(id) !== undefined || this.ids.idOf(key) !== undefined) return false;
    this.ids.set(key, id);
    if (this.inRange(id)) {
      this.used++;
      if (id >= this.next) this.next = id === this.max ? this.min : id + 1;
    }
    return true;
  }

  /** How many ids the range holds. */
  get span(): number {
    return this.max - this.min + 1;
  }

  /** True when `id` is one this allocator could hand out. */
  inRange(id: number): boolean {
    return Number.isInteger(id) && id >= this.min && id <= this.max;
  }

  /** The id of `key`, or a new one; throws LbError ENOSPC when every id is in use. */
  acquire(key: K): number {
    const id = this.tryAcquire(key);
    if (id === undefined) throw new LbError(`out of ${this.what} ids: all ${this.span} are in use`, 'ENOSPC');
    return id;
  }

  /** As acquire, but undefined when every id is in use. */
  tryAcquire(key: K): number | undefined {
    const have = this.ids.idOf(key);
    if (have !== undefined) return have;
    if (this.used >= this.span) return undefined;
    let id = this.next;
    while (this.ids.keyOf(id) !== undefined) id = id === this.max ? this.min : id + 1;
    this.next = id === this.max ? this.min : id + 1;
    this.ids.set(key, id);
    this.used++;
    return id;
  }

  /** Frees `id`, whatever key holds it. */
  releaseId(id: number): void {
    const key = this.ids.keyOf(id);
    if (key === undefined) return;
    this.ids.delete(key, id);
    if (this.inRange(id)) this.used--;
  }

  release(key: K): void {
    const id = this.ids.idOf(key);
    if (id === undefined) return;
    this.ids.delete(key, id);
    if (this.inRange(id)) this.used--;
  }

}
