/**
 * Maglev consistent hashing (Eisenbud et al., NSDI '16), as Cilium's
 * pkg/maglev builds its tables: every node builds the same table from the
 * same backends and seed, whatever their order or local ids, and removing
 * one of N backends moves about 1/N of the flows, those of the removed one.
 *
 * A backend is named by backendKey() ("10.0.0.1:8080/TCP", "[fd00::a]:80/TCP"):
 * the name, the sort and the hash decide every slot, so none of them may
 * change (test/unit/maglev.ts holds a golden digest of a table).
 */
import { ConfigError } from '../base/errors.js';

const M64 = (1n << 64n) - 1n;
const C1 = 0x87c37b91114253d5n;
const C2 = 0x4cf5ad432745937fn;
const rotl = (x: bigint, r: bigint): bigint => ((x << r) | (x >> (64n - r))) & M64;
const mul = (a: bigint, b: bigint): bigint => (a * b) & M64;
const fmix = (k: bigint): bigint => {
  k ^= k >> 33n;
  k = mul(k, 0xff51afd7ed558ccdn);
  k ^= k >> 33n;
  k = mul(k, 0xc4ceb9fe1a85ec53n);
  return k ^ (k >> 33n);
};

/** MurmurHash3_x64_128 (the reference, little endian), as Cilium's pkg/murmur3 Hash128: [h1, h2]. */
export function murmur3x64_128(data: Uint8Array, seed: number): [bigint, bigint] {
  const buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  let h1 = BigInt(seed >>> 0);
  let h2 = h1;
  const blocks = buf.length >> 4;
  for (let i = 0; i < blocks; i++) {
    let k1 = buf.readBigUInt64LE(16 * i);
    let k2 = buf.readBigUInt64LE(16 * i + 8);
    k1 = mul(rotl(mul(k1, C1), 31n), C2);
    h1 ^= k1;
    h1 = rotl(h1, 27n);
    h1 = (h1 + h2) & M64;
    h1 = (mul(h1, 5n) + 0x52dce729n) & M64;
    k2 = mul(rotl(mul(k2, C2), 33n), C1);
    h2 ^= k2;
    h2 = rotl(h2, 31n);
    h2 = (h2 + h1) & M64;
    h2 = (mul(h2, 5n) + 0x38495ab5n) & M64;
  }
  const tail = buf.subarray(blocks * 16);
  let k1 = 0n;
  let k2 = 0n;
  for (let i = tail.length - 1; i >= 8; i--) k2 ^= BigInt(tail[i]!) << BigInt(8 * (i - 8));
  if (tail.length > 8) {
    k2 = mul(rotl(mul(k2, C2), 33n), C1);
    h2 ^= k2;
  }
  for (let i = Math.min(tail.length, 8) - 1; i >= 0; i--) k1 ^= BigInt(tail[i]!) << BigInt(8 * i);
  if (tail.length > 0) {
    k1 = mul(rotl(mul(k1, C1), 31n), C2);
    h1 ^= k1;
  }
  const len = BigInt(buf.length);
  h1 ^= len;
  h2 ^= len;
  h1 = (h1 + h2) & M64;
  h2 = (h2 + h1) & M64;
  h1 = fmix(h1);
  h2 = fmix(h2);
  h1 = (h1 + h2) & M64;
  h2 = (h2 + h1) & M64;
  return [h1, h2];
}

/** Cilium's default --bpf-lb-maglev-hash-seed, so a mixed fleet can agree on one. */
export const DEFAULT_MAGLEV_SEED = 'JLfvgnHc2kaSUFaI';
export const DEFAULT_MAGLEV_TABLE_SIZE = 16381;
/** The table sizes accepted: primes, as Cilium's (251 .. 131071). */
export const MAGLEV_MIN = 251;
export const MAGLEV_MAX = 131071;

export interface MaglevSeeds {
  /** Seeds the table (the backend permutations). */
  readonly table: number;
  /** Seed the datapath's flow hashes (IPv4, IPv6). */
  readonly flow4: number;
  readonly flow6: number;
}

/** --maglev-hash-seed: base64 of 12 bytes, as Cilium's; throws naming the flag. */
export function parseMaglevSeed(text: string, flag = '--maglev-hash-seed'): MaglevSeeds {
  const bytes = /^[A-Za-z0-9+/]{16}$/.test(text) ? Buffer.from(text, 'base64') : Buffer.alloc(0);
  if (bytes.length !== 12) throw new ConfigError(`${flag} ${JSON.stringify(text)}: expected 16 base64 characters (12 bytes), such as ${DEFAULT_MAGLEV_SEED}`);
  return { table: bytes.readUInt32BE(0), flow4: bytes.readUInt32BE(4), flow6: bytes.readUInt32BE(8) };
}

export function isPrime(n: number): boolean {
  if (!Number.isInteger(n) || n < 2) return false;
  for (let d = 2; d * d <= n; d++) if (n % d === 0) return false;
  return true;
}

/** --maglev-table-size: a prime in [251, 131071]; throws naming the flag. */
export function checkTableSize(m: number, flag = '--maglev-table-size'): number {
  if (!isPrime(m) || m < MAGLEV_MIN || m > MAGLEV_MAX) {
    throw new ConfigError(`${flag} ${m}: must be a prime between ${MAGLEV_MIN} and ${MAGLEV_MAX} (such as 16381, the default, or 65521), at least 100 times a service's backends for an even spread`);
  }
  return m;
}

export interface MaglevBackend {
  /** backendKey(): the name every node hashes. */
  readonly key: string;
  /** The id written into the table (lbctl's backend ids start at 1; 0 is never one). */
  readonly id: number;
}

/**
 * The lookup table: M backend ids. Each backend takes ⌊M/N⌋ or ⌈M/N⌉ slots
 * (they take turns), and the permutation of each is (offset + j·skip) mod M
 * from its name's hash, so the order of `backends` does not matter.
 *
 * The fill walks each permutation by adding `skip` (mod M) rather than
 * computing (offset + j·skip) mod M afresh, in int32 typed arrays: the same
 * slots, about 5× faster (bench/nodeport-tc.ts's Maglev builds; 10,000
 * tables must be programmed in under 3 s).
 */
export function maglevTable(backends: readonly MaglevBackend[], m: number, seed: number): Uint32Array {
  const table = new Uint32Array(m);
  const p = maglevPermutations(backends, m, seed);
  if (p.ids.length > 0) fillMaglev(table, p.offset, p.skip, p.ids, m, TAIL_SLOTS);
  return table;
}

/** Each backend's permutation (offset + j·skip mod M) and id, in the order of their names. */
export interface MaglevPermutations {
  readonly offset: Int32Array;
  readonly skip: Int32Array;
  readonly ids: Uint32Array;
}

/** The permutations of `backends` in a table of `m`: what fillMaglev needs, and all that is hashed. */
export function maglevPermutations(backends: readonly MaglevBackend[], m: number, seed: number): MaglevPermutations {
  const bs = [...backends].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  const n = bs.length;
  if (n > m) throw new RangeError(`${n} backends do not fit a Maglev table of ${m} slots`);
  const offset = new Int32Array(n);
  const skip = new Int32Array(n);
  const ids = new Uint32Array(n);
  const bm = BigInt(m);
  for (let i = 0; i < n; i++) {
    const [h1, h2] = murmur3x64_128(Buffer.from(bs[i]!.key), seed);
    offset[i] = Number(h1 % bm);
    skip[i] = Number(h2 % (bm - 1n)) + 1;
    ids[i] = bs[i]!.id;
    if (ids[i] === 0) throw new RangeError(`backend ${bs[i]!.key}: id 0 marks an empty slot`);
  }
  return { offset, skip, ids };
}

/**
 * Fills `table` (M zeroed slots) from the permutations: backends take turns,
 * each its next empty slot. Self-contained (no names from outside it, not
 * even helpers): src/lb/maglev-pool.ts runs its source in worker threads.
 */
export function fillMaglev(table: Uint32Array, offset: Int32Array, skip: Int32Array, ids: Uint32Array, m: number, tailSlots: number): void {
  const n = ids.length;
  // Backend ids are never 0, so a 0 slot is an empty one. Turns go round
  // until few slots are left, where a walk would mostly step over full ones.
  // The walk adds skip − M (negative) and M back when below 0: (c + skip)
  // mod M without a branch, for a branch the CPU cannot predict here (about
  // 25% faster). The table is walked as int32 (the same bits). Three turns
  // are written out in a row: three copies of the test that leaves a walk,
  // each predicted on its own history (another 15%).
  const slots = new Int32Array(table.buffer, table.byteOffset, m);
  const pos = offset.slice(); // each backend's next candidate slot
  const back = new Int32Array(n); // skip − M
  for (let b = 0; b < n; b++) back[b] = skip[b]! - m;
  const tail = Math.min(m, Math.max(n, tailSlots));
  let left = m;
  let i = 0;
  while (left > tail) {
    let step = back[i]!;
    let c = pos[i]!;
    while (slots[c] !== 0) {
      c += step;
      c += (c >> 31) & m;
    }
    slots[c] = ids[i]!;
    c += step;
    pos[i] = c + ((c >> 31) & m);
    if (++i === n) i = 0;
    if (--left === tail) break;
    step = back[i]!;
    c = pos[i]!;
    while (slots[c] !== 0) {
      c += step;
      c += (c >> 31) & m;
    }
    slots[c] = ids[i]!;
    c += step;
    pos[i] = c + ((c >> 31) & m);
    if (++i === n) i = 0;
    if (--left === tail) break;
    step = back[i]!;
    c = pos[i]!;
    while (slots[c] !== 0) {
      c += step;
      c += (c >> 31) & m;
    }
    slots[c] = ids[i]!;
    c += step;
    pos[i] = c + ((c >> 31) & m);
    if (++i === n) i = 0;
    left--;
  }
  // The last slots: a backend's walk reaches empty slot e at step
  // j = (e − offset)·skip⁻¹ mod M, and no empty slot lies behind it (it
  // would have taken it), so its next slot is the empty one of least j:
  // the same pick, without stepping over the full ones.
  const empty = new Int32Array(left);
  for (let c = 0, k = 0; c < m; c++) if (table[c] === 0) empty[k++] = c;
  const steps = new Float64Array(n * left); // backend i's step to empty[k]: steps[i * left + k]
  for (let b = 0; b < n; b++) {
    // skip⁻¹ mod M (M prime) by the extended Euclid algorithm; every value stays below M.
    let r0 = m;
    let r1 = skip[b]!;
    let t0 = 0;
    let t1 = 1;
    while (r1 !== 0) {
      const q = Math.floor(r0 / r1);
      const r = r0 - q * r1;
      r0 = r1;
      r1 = r;
      const t = t0 - q * t1;
      t0 = t1;
      t1 = t;
    }
    const inv = t0 < 0 ? t0 + m : t0;
    for (let k = 0; k < left; k++) {
      let d = empty[k]! - offset[b]!;
      d += (d >> 31) & m;
      const x = d * inv; // below M², exact in a double: x mod M without `%` (fmod, a call)
      steps[b * left + k] = x - Math.floor(x / m) * m;
    }
  }
  let live = left; // empty[0..live) are still empty
  const stride = left;
  while (live > 0) {
    const row = i * stride;
    let best = 0;
    for (let k = 1; k < live; k++) if (steps[row + k]! < steps[row + best]!) best = k;
    table[empty[best]!] = ids[i]!;
    // Drop slot `best`: the last live one takes its place in every row.
    live--;
    empty[best] = empty[live]!;
    for (let b = 0; b < n; b++) steps[b * stride + best] = steps[b * stride + live]!;
    if (++i === n) i = 0;
  }
}

/** Below this many empty slots the fill switches from walking to choosing (see maglevTable). */
export const TAIL_SLOTS = 128;

const rol32 = (w: number, s: number): number => ((w << s) | (w >>> (32 - s))) >>> 0;

/** The Linux kernel's jhash_3words (include/linux/jhash.h), which the tc datapath computes too. */
export function jhash3words(a: number, b: number, c: number, initval: number): number {
  const iv = (initval + 0xdeadbeef + (3 << 2)) >>> 0;
  a = (a + iv) >>> 0;
  b = (b + iv) >>> 0;
  c = (c + iv) >>> 0;
  c = ((c ^ b) - rol32(b, 14)) >>> 0;
  a = ((a ^ c) - rol32(c, 11)) >>> 0;
  b = ((b ^ a) - rol32(a, 25)) >>> 0;
  c = ((c ^ b) - rol32(b, 16)) >>> 0;
  a = ((a ^ c) - rol32(c, 4)) >>> 0;
  b = ((b ^ a) - rol32(a, 14)) >>> 0;
  c = ((c ^ b) - rol32(b, 24)) >>> 0;
  return c;
}

/**
 * The slot an IPv4 flow takes in a table of `m`: its client address and
 * port, the service port and the protocol, not the destination address, so
 * a client reaching one service through two node addresses lands on the
 * same backend (as Cilium's hash does). `saddr` is the address as a
 * big-endian uint32 (what the packet carries), ports in host order.
 */
export function flowSlot4(saddr: number, sport: number, dport: number, proto: number, seed: number, m: number): number {
  return jhash3words(saddr >>> 0, ((dport << 16) | sport) >>> 0, proto, seed) % m;
}
