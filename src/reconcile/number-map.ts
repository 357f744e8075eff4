// A Map from whole numbers (0 ≤ key < 2^53) to uint32 values, in typed
// arrays: open addressing with linear probing, deletes by backward shift
// (no tombstones). The backend id allocator keys every IPv4 backend by a
// 49-bit number (address, port, protocol), and V8 keeps such a number in a
// Map as a heap number of its own: 65 bytes an entry with the Map's (node
// without pointer compression, measured). Here an entry is 12 bytes of
// slot at a load of at most 3/4 (docs/benchmarks.md, "Issue 18, fifth
// part").
//
// Iteration order is the table's, not insertion order, and the table must
// not change while it is iterated (a delete moves later entries back).

const MIN_CAPACITY = 16;
const TWO_32 = 2 ** 32;

export class NumberKeyMap {
  private hi = new Uint32Array(MIN_CAPACITY);
  private lo = new Uint32Array(MIN_CAPACITY);
  private val = new Uint32Array(MIN_CAPACITY);
  private used = new Uint8Array(MIN_CAPACITY);
  private mask = MIN_CAPACITY - 1;
  private n = 0;

  get size(): number {
    return this.n;
  }

  get(key: number): number | undefined {
    const i = this.find(key);
    return i < 0 ? undefined : this.val[i];
  }

  has(key: number): boolean {
    return this.find(key) >= 0;
  }

  set(key: number, value: number): this {
    if (!(Number.isSafeInteger(key) && key >= 0)) throw new RangeError(`NumberKeyMap: key ${key} is not a whole number in 0..2^53`);
    const i = this.find(key);
    if (i >= 0) {
      this.val[i] = value;
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
    const { hi, lo, val, used, mask } = this;
    used[i] = 0;
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      if (!used[j]) break;
      const home = hash(hi[j]!, lo[j]!) & mask;
      const stays = i <= j ? i < home && home <= j : i < home || home <= j;
      if (stays) continue;
      hi[i] = hi[j]!;
      lo[i] = lo[j]!;
      val[i] = val[j]!;
      used[i] = 1;
      used[j] = 0;
      i = j;
    }
    this.n--;
    return true;
  }

  *entries(): Generator<[number, number]> {
    for (let i = 0; i <= this.mask; i++) if (this.used[i]) yield [this.hi[i]! * TWO_32 + this.lo[i]!, this.val[i]!];
  }

  /** The slot holding `key`, or -1. */
  private find(key: number): number {
    if (!(Number.isSafeInteger(key) && key >= 0)) return -1;
    const h = Math.floor(key / TWO_32);
    const l = key >>> 0;
    const { hi, lo, used, mask } = this;
    for (let i = hash(h, l) & mask; used[i]; i = (i + 1) & mask) if (lo[i] === l && hi[i] === h) return i;
    return -1;
  }

  private insert(h: number, l: number, value: number): void {
    const { used, mask } = this;
    let i = hash(h, l) & mask;
    while (used[i]) i = (i + 1) & mask;
    this.hi[i] = h;
    this.lo[i] = l;
    this.val[i] = value;
    used[i] = 1;
  }

  private resize(capacity: number): void {
    const { hi, lo, val, used } = this;
    this.hi = new Uint32Array(capacity);
    this.lo = new Uint32Array(capacity);
    this.val = new Uint32Array(capacity);
    this.used = new Uint8Array(capacity);
    this.mask = capacity - 1;
    for (let i = 0; i < used.length; i++) if (used[i]) this.insert(hi[i]!, lo[i]!, val[i]!);
  }
}

/** murmur3's finalizer over both halves. */
function hash(h: number, l: number): number {
  let x = Math.imul(l ^ Math.imul(h, 0x9e3779b1), 0x85ebca6b);
  x ^= x >>> 13;
  x = Math.imul(x, 0xc2b2ae35);
  return (x ^ (x >>> 16)) >>> 0;
}
