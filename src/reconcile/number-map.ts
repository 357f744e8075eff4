// With NumberIdMap (id-map.ts) and NumberKeyIds (ids.ts), holds `make
// bench`'s steady RSS at 100,000 services under its 300 MiB target: 270-286
// MiB with them, 300-301 MiB with the backend ids in plain Maps (MapKeyIds;
// 12 MiB more heap in bench/profile/sync.ts). bench/run.ts --sizes 100000
// --modes lbctl, alternated in one session, 2 repetitions each, 2026-12-06
// (2 vCPUs, node 20.20); the time rows moved within the run's noise.
//
// A Map from whole numbers (0 ≤ key < 2^53) to uint32 values, in one typed
// array: open addressing with linear probing, deletes by backward shift
// (no tombstones). The backend id allocator keys every IPv4 backend by a
// 49-bit number (address, port, protocol), and V8 keeps such a number in a
// Map as a heap number of its own: 65 bytes an entry with the Map's (node
// without pointer compression, measured). Here a slot is three words (the
// key's high and low halves, the value), side by side so a probe reads one
// cache line, at a load of at most 3/4 (docs/architecture.md, "Why the
// agent is built for 100,000 services"). An empty slot's high half is EMPTY, which no key has.
//
// Iteration order is the table's, not insertion order, and the table must
// not change while it is iterated (a delete moves later entries back).

const MIN_CAPACITY = 16;
const TWO_32 = 2 ** 32;
const EMPTY = 0xffffffff;

export class NumberKeyMap {
  /** Slot i: [3i] the key's high half (EMPTY: no entry), [3i + 1] its low half, [3i + 2] the value. */
  private slots = new Uint32Array(3 * MIN_CAPACITY).fill(EMPTY);
  private mask = MIN_CAPACITY - 1;
  private n = 0;

  get size(): number {
    return this.n;
  }

  get(key: number): number | undefined {
    const i = this.find(key);
    return i < 0 ? undefined : this.slots[3 * i + 2];
  }

  has(key: number): boolean {
    return this.find(key) >= 0;
  }

  set(key: number, value: number): this {
    if (!(Number.isSafeInteger(key) && key >= 0)) throw new RangeError(`NumberKeyMap: key ${key} is not a whole number in 0..2^53`);
    const i = this.find(key);
    if (i >= 0) {
      this.slots[3 * i + 2] = value;
      return this;
    }
    if ((this.n + 1) * 4 > (this.mask + 1) * 3) this.resize((this.mask + 1) * 2);
    this.insert(Math.floor(key / TWO_32), key >>> 0, value);
    this.n++;
    return this;
  }

  delete(key: number): boolean {
    let i = this.find(key);
    if (i < 0) return false;
    // Backward shift: move each later entry of the run into the hole when
    // its home slot does not lie cyclically in (hole, its slot].
    const { slots, mask } = this;
    slots[3 * i] = EMPTY;
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      const hi = slots[3 * j]!;
      if (hi === EMPTY) break;
      const home = hash(hi, slots[3 * j + 1]!) & mask;
      const stays = i <= j ? i < home && home <= j : i < home || home <= j;
      if (stays) continue;
      slots.copyWithin(3 * i, 3 * j, 3 * j + 3);
      slots[3 * j] = EMPTY;
      i = j;
    }
    this.n--;
    return true;
  }

  *entries(): Generator<[number, number]> {
    const { slots } = this;
    for (let i = 0; i <= this.mask; i++) {
      const hi = slots[3 * i]!;
      if (hi !== EMPTY) yield [hi * TWO_32 + slots[3 * i + 1]!, slots[3 * i + 2]!];
    }
  }

  /** The slot holding `key`, or -1. */
  private find(key: number): number {
    if (!(Number.isSafeInteger(key) && key >= 0)) return -1;
    const h = Math.floor(key / TWO_32);
    const l = key >>> 0;
    const { slots, mask } = this;
    for (let i = hash(h, l) & mask; ; i = (i + 1) & mask) {
      const hi = slots[3 * i]!;
      if (hi === EMPTY) return -1;
      if (hi === h && slots[3 * i + 1] === l) return i;
    }
  }

  private insert(h: number, l: number, value: number): void {
    const { slots, mask } = this;
    let i = hash(h, l) & mask;
    while (slots[3 * i] !== EMPTY) i = (i + 1) & mask;
    slots[3 * i] = h;
    slots[3 * i + 1] = l;
    slots[3 * i + 2] = value;
  }

  private resize(capacity: number): void {
    const old = this.slots;
    this.slots = new Uint32Array(3 * capacity).fill(EMPTY);
    this.mask = capacity - 1;
    for (let i = 0; i < old.length; i += 3) if (old[i] !== EMPTY) this.insert(old[i]!, old[i + 1]!, old[i + 2]!);
  }
}

/** murmur3's finalizer over both halves. */
function hash(h: number, l: number): number {
  let x = Math.imul(l ^ Math.imul(h, 0x9e3779b1), 0x85ebca6b);
  x ^= x >>> 13;
  x = Math.imul(x, 0xc2b2ae35);
  return (x ^ (x >>> 16)) >>> 0;
}
