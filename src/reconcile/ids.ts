// Stable ids for backends and rev-NAT entries. An id belongs to a key (a
// backend address, a frontend) until released; ids are handed out round-robin
// rather than lowest-free, so a freed id is not reused at once (a socket's
// rev-NAT entry that names an old id is then detected as stale, not
// mistaken for a new service). On start, ids are adopted from the maps.
import { LbError } from '../errors.js';

export class IdAllocator<K> {
  private readonly byKey = new Map<K, number>();
  private readonly byId = new Map<number, K>();
  private next: number;

  constructor(
    readonly what: string,
    private readonly min: number,
    private readonly max: number,
  ) {
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


  /** Claims `id` for `key` (restore). False when either is already taken. */
  adopt(key: K, id: number): boolean {
    if (id < this.min || id > this.max || this.byId.has(id) || this.byKey.has(key)) return false;
    this.byKey.set(key, id);
    this.byId.set(id, key);
    if (id >= this.next) this.next = id === this.max ? this.min : id + 1;
    return true;
  }

  acquire(key: K): number {
    const have = this.byKey.get(key);
    if (have !== undefined) return have;
    const span = this.max - this.min + 1;
    if (this.byId.size >= span) {
      throw new LbError(`out of ${this.what} ids: all ${span} are in use`, 'ENOSPC');
    }
    let id = this.next;
    while (this.byId.has(id)) id = id === this.max ? this.min : id + 1;
    this.next = id === this.max ? this.min : id + 1;
    this.byKey.set(key, id);
    this.byId.set(id, key);
    return id;
  }

  /** Frees `id`, whatever key holds it. */
  releaseId(id: number): void {
    const key = this.byId.get(id);
    if (key === undefined) return;
    this.byKey.delete(key);
    this.byId.delete(id);
  }

  release(key: K): void {
    const id = this.byKey.get(key);
    if (id === undefined) return;
    this.byKey.delete(key);
    this.byId.delete(id);
  }

}
