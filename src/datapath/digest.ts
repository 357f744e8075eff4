// An order-independent digest of a map's entries, so the periodic resync can
// ask "do the maps hold exactly what the agent wrote?" without looking one
// entry up. Each entry's fields, as the codecs decode them (padding is not a
// field), are hashed into two 32-bit lanes (murmur3's mixing, different
// constants per lane), and a map's digest is the sum of its entries' hashes,
// lane by lane, modulo 2^32. A sum needs no order, so the kernel's side is
// one pass over the buffers a batch lookup returns (KernelLbMaps.matches),
// and the agent's side is kept up to date write by write (RealizedState adds
// an entry's hash when a write succeeds and subtracts the one it replaced),
// with no walk over its objects at all.
//
// Equal digests and entry counts: the maps hold the realized state, barring
// a coincidence of 2^-64 per resync. Drift is a mistake (a tool, an old
// build, a crash between writes), not an adversary: whoever can write the
// maps can do anything to the datapath already.
//
// The word sequence of each entry is defined once here, by the map's fields;
// the realized side and the kernel side call the same methods.
import { ipv4ToUint, ipv6Bytes } from '../lb/addr.js';
import type { Backend, Family, ServiceAddr } from '../lb/types.js';
import { PROTO_NUM, STATE_NUM, TYPE_NUM, scopeNum } from './codes.js';
import type { Digest, MasterEntry, RevNatEntry } from './lbmaps.js';

/** A map's digest: the two lanes' sums (int32). */
export class MapDigest implements Digest {
  a = 0;
  b = 0;

  add(h: EntryHash): void {
    this.a = (this.a + h.final1()) | 0;
    this.b = (this.b + h.final2()) | 0;
  }

  sub(h: EntryHash): void {
    this.a = (this.a - h.final1()) | 0;
    this.b = (this.b - h.final2()) | 0;
  }

  equals(o: Digest): boolean {
    return this.a === o.a && this.b === o.b;
  }
}

const SEED1 = 0x4c42_4354; // "LBCT"
const SEED2 = 0x6c62_6374;

/**
 * The hash of one entry, word by word. One instance is reused for every
 * entry (no object per entry); the methods return it, so a call reads as
 * the entry's fields in order: h.key4(…).service(…).
 */
export class EntryHash {
  h1 = SEED1;
  h2 = SEED2;

  /** Starts an entry. */
  reset(): this {
    this.h1 = SEED1;
    this.h2 = SEED2;
    return this;
  }

  /** Starts an entry from a key's hash saved earlier (keyState1/2 after a key4/key6). */
  resume(k1: number, k2: number): this {
    this.h1 = k1;
    this.h2 = k2;
    return this;
  }

  word(w: number): this {
    let k = Math.imul(w | 0, 0xcc9e2d51);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, 0x1b873593);
    let h = this.h1 ^ k;
    h = (h << 13) | (h >>> 19);
    this.h1 = (Math.imul(h, 5) + 0xe6546b64) | 0;
    let j = Math.imul(w | 0, 0x9e3779b1);
    j = (j << 17) | (j >>> 15);
    j = Math.imul(j, 0x27d4eb2f);
    let g = this.h2 ^ j;
    g = (g << 15) | (g >>> 17);
    this.h2 = (Math.imul(g, 9) + 0x561ccd1b) | 0;
    return this;
  }

  final1(): number {
    let h = this.h1;
    h ^= h >>> 16;
    h = Math.imul(h, 0x85ebca6b);
    h ^= h >>> 13;
    h = Math.imul(h, 0xc2b2ae35);
    return h ^ (h >>> 16);
  }

  final2(): number {
    let h = this.h2;
    h ^= h >>> 16;
    h = Math.imul(h, 0x7feb352d);
    h ^= h >>> 15;
    h = Math.imul(h, 0x846ca68b);
    return h ^ (h >>> 16);
  }

  private address16(a: Uint8Array): this {
    for (let i = 0; i < 16; i += 4) this.word((a[i]! << 24) | (a[i + 1]! << 16) | (a[i + 2]! << 8) | a[i + 3]!);
    return this;
  }

  // The maps' entries, field by field (struct lb4_key/lb6_key + lb_service,
  // lb4_backend/lb6_backend, lb4_reverse_nat/lb6_reverse_nat).

  /** lb4_key without its slot: starts an entry. */
  key4(address: number, dport: number, proto: number, scope: number): this {
    return this.reset().word(address).word(dport).word(proto).word(scope);
  }

  /** lb6_key without its slot: starts an entry. */
  key6(address: Uint8Array, dport: number, proto: number, scope: number): this {
    return this.reset().address16(address).word(dport).word(proto).word(scope);
  }

  /** The key's slot and the lb_service value. */
  service(slot: number, backendId: number, count: number, qcount: number, revNatIndex: number, type: number, flags: number, affinityTimeout: number): this {
    return this.word(slot).word(backendId).word(count).word(qcount).word(revNatIndex).word(type).word(flags).word(affinityTimeout);
  }

  backend4(id: number, address: number, port: number, proto: number, state: number): this {
    return this.reset().word(id).word(address).word(port).word(proto).word(state);
  }

  backend6(id: number, address: Uint8Array, port: number, proto: number, state: number): this {
    return this.reset().word(id).address16(address).word(port).word(proto).word(state);
  }

  revNat4(id: number, address: number, port: number): this {
    return this.reset().word(id).word(address).word(port);
  }

  revNat6(id: number, address: Uint8Array, port: number): this {
    return this.reset().word(id).address16(address).word(port);
  }

  // The same entries from lbctl's names (the realized state's side).

  /** A service address's key fields (no slot): starts an entry; resume() from h1/h2 after it for each of its slots. */
  serviceKey(fe: ServiceAddr): this {
    const scope = scopeNum(fe);
    const proto = PROTO_NUM[fe.protocol];
    return fe.family === 4 ? this.key4(ipv4ToUint(fe.address), fe.port, proto, scope) : this.key6(ipv6Bytes(fe.address), fe.port, proto, scope);
  }

  /** Slot 0's value, after serviceKey/resume. */
  master(m: MasterEntry): this {
    return this.service(0, 0, m.count, m.qcount, m.revNatId, TYPE_NUM[m.type], m.flags, m.affinityTimeout);
  }

  /** A slot's value, after serviceKey/resume. */
  slot(slot: number, backendId: number): this {
    return this.service(slot, backendId, 0, 0, 0, 0, 0, 0);
  }

  backend(id: number, b: Backend): this {
    const proto = PROTO_NUM[b.protocol];
    const state = STATE_NUM[b.state];
    return b.family === 4 ? this.backend4(id, ipv4ToUint(b.address), b.port, proto, state) : this.backend6(id, ipv6Bytes(b.address), b.port, proto, state);
  }

  revNat(id: number, family: Family, e: RevNatEntry): this {
    return family === 4 ? this.revNat4(id, ipv4ToUint(e.address), e.port) : this.revNat6(id, ipv6Bytes(e.address), e.port);
  }
}
