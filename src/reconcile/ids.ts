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
import { LbError } from '../errors.js';
import { IdMap } from './id-map.js';

export class IdAllocator<K> {
  private readonly byKey = new Map<K, number>();
  private readonly byId = new IdMap<K>();
  /** Ids in use within min..max (adopted ones beyond it do not take room there). */
  private used = 0;
  private next: number;

  constructor(
    readonly what: string,
    readonly min: number,
    readonly max: number,
  ) {
    if (!Number.isInteger(min) || !Number.isInteger(max) || min < 0 || max < min) throw new RangeError(`${what} ids: bad range ${min}..${max}`);
    this.next = min;
  }

  get size(): number {
    return this.byKey.size;
  }

  get(key: K): number | undefined {
    return this.byKey.get(key);
  }

  entries(): IterableIterator<[K, number]> {
    return this.byKey.entries();
  }

  /**
   * Claims `id` for `key` (restore): any id from min on, including one
   * beyond max (see the header). False when either is already taken.
   */
  adopt(key: K, id: number): boolean {
    if (!Number.isInteger(id) || id < this.min || this.byId.has(id) || this.byKey.has(key)) return false;
    this.byKey.set(key, id);
    this.byId.set(id, key);
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
    const have = this.byKey.get(key);
    if (have !== undefined) return have;
    if (this.used >= this.span) return undefined;
    let id = this.next;
    while (this.byId.has(id)) id = id === this.max ? this.min : id + 1;
    this.next = id === this.max ? this.min : id + 1;
    this.byKey.set(key, id);
    this.byId.set(id, key);
    this.used++;
    return id;
  }

  /** Frees `id`, whatever key holds it. */
  releaseId(id: number): void {
    const key = this.byId.get(id);
    if (key === undefined) return;
    this.byKey.delete(key);
    this.byId.delete(id);
    if (this.inRange(id)) this.used--;
  }

  release(key: K): void {
    const id = this.byKey.get(key);
    if (id === undefined) return;
    this.byKey.delete(key);
    this.byId.delete(id);
    if (this.inRange(id)) this.used--;
  }

}
