// LbMaps over the kernel's maps: encodes with the BTF-generated codecs and
// moves bytes through the native addon. Nothing here knows a byte offset.
import { ConfigError } from '../base/errors.js';
import { BPF_ANY, BPF_EXIST, type FlatEntries } from '../native/bpf.js';
import { ipFromBytes, ipv4ToUint, ipv6Bytes, uintToIpv4 } from '../lb/addr.js';
import type { Backend, BackendState, Family, Protocol } from '../lb/types.js';
import {
  LbScope,
  lb4_backend,
  lb4_key,
  lb4_reverse_nat,
  lb6_backend,
  lb6_key,
  lb6_reverse_nat,
  lb_service,
  mapSpecs,
  u32,
  type LbService,
  type MapSpec,
} from './abi.gen.js';
import { LB_MAP_NAMES, PartialWriteError, putOne, type ExpectedMaps, type LbMaps, type MapsDump, type PutBatch, type LbMapName, type MasterEntry, type MasterType, type RevNatEntry, type ServiceEntry } from './lbmaps.js';
import type { ServiceAddr } from '../lb/types.js';
import { PROTO_NAME, PROTO_NUM, STATE_NAME, STATE_NUM, TYPE_NAME, TYPE_NUM, scopeNum } from './codes.js';
import { EntryHash, MapDigest } from './digest.js';
import type { FrontendPorts } from './frontend-ports.js';

/** What lbctl needs of a kernel map: bytes in, bytes out (src/native's BpfMap fits). */
export interface ByteMap {
  readonly name: string;
  readonly keySize: number;
  readonly valueSize: number;
  readonly maxEntries: number;
  lookup(key: Buffer): Buffer | null;
  update(key: Buffer, value: Buffer, flags?: number): void;
  delete(key: Buffer): boolean;
  entries(): Array<[Buffer, Buffer]>;
  /** Optional: every entry packed into one key and one value buffer (BpfMap.entriesFlat); else entries() is used. */
  entriesFlat?(): FlatEntries;
  /** Optional: `count` concatenated keys and values in one syscall; failures carry `count` written. */
  batchUpdate?(keys: Buffer, values: Buffer, count: number): number;
}

/** The map names, defined with the interface (lbmaps.ts) and exported here beside LbMapSet. */
export { LB_MAP_NAMES };

export type LbMapSet = Record<LbMapName, ByteMap>;

/** A state no lbctl build writes reads as terminating: never shown as active; a sync rewrites it if the backend is. */
const stateName = (n: number): BackendState => STATE_NAME.get(n) ?? 'terminating';

/**
 * Checks that a kernel map has the layout lbctl's codecs expect. A mismatch
 * means the object or the pinned maps come from another build: stop, with a
 * message that says which map and what to do.
 */
export function verifyMapLayout(map: ByteMap, spec: MapSpec<unknown, unknown>): void {
  const problems: string[] = [];
  if (map.keySize !== spec.key.size) problems.push(`key is ${map.keySize} bytes, lbctl expects ${spec.key.size} (${spec.key.name})`);
  if (map.valueSize !== spec.value.size) problems.push(`value is ${map.valueSize} bytes, lbctl expects ${spec.value.size} (${spec.value.name})`);
  if (problems.length > 0) {
    throw new ConfigError(
      `map ${spec.name}: ${problems.join('; ')}. The BPF object or the pinned maps come from a different lbctl build: ` +
        'rebuild (make build), or remove the old datapath with `lbctl cleanup`.',
    );
  }
}



/** A service key read back; undefined for a protocol or scope no lbctl build writes. */
function serviceAddr(address: string, family: Family, port: number, proto: number, scope: number): ServiceAddr | undefined {
  const protocol = PROTO_NAME.get(proto);
  if (!protocol) return undefined;
  if (scope === LbScope.LB_SCOPE_EXT) return { address, family, port, protocol };
  if (scope === LbScope.LB_SCOPE_INT) return { address, family, port, protocol, scope: 'internal' };
  return undefined;
}

/** A service address's address field: IPv4 as a number, IPv6 as its bytes. */
const addressField = (fe: ServiceAddr): number | Buffer => (fe.family === 4 ? ipv4ToUint(fe.address) : ipv6Bytes(fe.address));

/** `address`: addressField(fe), when the caller already has it (a frontend's slots share it). */
function serviceKey(fe: ServiceAddr, slot: number, b?: Buffer, o?: number, address: number | Buffer = addressField(fe)): Buffer {
  const proto = PROTO_NUM[fe.protocol];
  const scope = scopeNum(fe);
  return typeof address === 'number'
    ? lb4_key.encode({ address, dport: fe.port, backendSlot: slot, proto, scope }, b, o)
    : lb6_key.encode({ address, dport: fe.port, backendSlot: slot, proto, scope }, b, o);
}

function slotValue(backendId: number, b?: Buffer, o?: number): Buffer {
  return lb_service.encode({ backendId, count: 0, qcount: 0, revNatIndex: 0, type: 0, flags: 0, affinityTimeout: 0 }, b, o);
}

function backendValue(be: Backend, b?: Buffer, o?: number): Buffer {
  const proto = PROTO_NUM[be.protocol];
  const state = STATE_NUM[be.state];
  return be.family === 4
    ? lb4_backend.encode({ address: ipv4ToUint(be.address), port: be.port, proto, state }, b, o)
    : lb6_backend.encode({ address: ipv6Bytes(be.address), port: be.port, proto, state }, b, o);
}

function revNatValue(family: Family, e: RevNatEntry, b?: Buffer, o?: number): Buffer {
  return family === 4
    ? lb4_reverse_nat.encode({ address: ipv4ToUint(e.address), port: e.port }, b, o)
    : lb6_reverse_nat.encode({ address: ipv6Bytes(e.address), port: e.port }, b, o);
}

function masterValue(m: MasterEntry, b?: Buffer, o?: number): Buffer {
  return lb_service.encode(
    {
    backendId: 0,
    count: m.count,
    qcount: m.qcount,
    revNatIndex: m.revNatId,
    type: TYPE_NUM[m.type],
    flags: m.flags,
    affinityTimeout: m.affinityTimeout,
    },
    b,
    o,
  );
}

function decodeService(fe: ServiceAddr, slot: number, v: LbService): ServiceEntry {
  if (slot > 0) return { fe, slot, backendId: v.backendId };
  return {
    fe,
    slot,
    master: {
      count: v.count,
      qcount: v.qcount,
      revNatId: v.revNatIndex,
      type: TYPE_NAME.get(v.type) ?? 'ClusterIP',
      flags: v.flags,
      affinityTimeout: v.affinityTimeout,
    },
  };
}

/** PROTO_NAME.get(n) without a Map lookup (a resync asks it for every service entry). */
const protocolName = (n: number): Protocol | 'ANY' | undefined => (n === 6 ? 'TCP' : n === 17 ? 'UDP' : n === 0 ? 'ANY' : n === 132 ? 'SCTP' : undefined);

/** A map's entries packed (entriesFlat), or packed here from entries() where the map has no such call. */
function packed(map: ByteMap): FlatEntries {
  if (map.entriesFlat) {
    const flat = map.entriesFlat();
    if (flat.values.length !== flat.count * map.valueSize) throw new RangeError(`${map.name}: entriesFlat gave ${flat.values.length} value bytes for ${flat.count} entries of ${map.valueSize}`);
    return flat;
  }
  const list = map.entries();
  return { keys: Buffer.concat(list.map(([k]) => k)), values: Buffer.concat(list.map(([, v]) => v)), count: list.length };
}


export class KernelLbMaps implements LbMaps {
  /** The entry hash matches() reuses for every entry. */
  private readonly hash = new EntryHash();
  /** The tc datapath's lb_np_ports, once it is loaded: a frontend's port is marked before the frontend is written. */
  private ports: FrontendPorts | undefined;

  constructor(private readonly m: LbMapSet) {
    for (const name of LB_MAP_NAMES) verifyMapLayout(m[name], mapSpecs[name]);
  }

  /**
   * From now on, marks each frontend's port in `ports` before writing the
   * frontend, after filling it from what the services maps hold.
   */
  useFrontendPorts(ports: FrontendPorts): void {
    ports.fill(this.m);
    this.ports = ports;
  }

  /**
   * Entry i of a batch into `keys` at `ko` and `values` at `vo`, with the
   * same key and value encoders as the one-entry writes. `address`: the frontend's
   * address field, when the caller has parsed it already.
   */
  private encodeAt(b: PutBatch, i: number, keys: Buffer, ko: number, values: Buffer, vo: number, address?: number | Buffer): void {
    switch (b.kind) {
      case 'put-backend':
        u32.encode(b.ids[i]!, keys, ko);
        backendValue(b.backends[i]!, values, vo);
        return;
      case 'put-revnat':
        u32.encode(b.ids[i]!, keys, ko);
        revNatValue(b.family, b.entries[i]!, values, vo);
        return;
      case 'put-slot':
        serviceKey(b.fes[i]!, b.slots[i]!, keys, ko, address);
        slotValue(b.ids[i]!, values, vo);
        return;
      case 'put-master':
        serviceKey(b.fes[i]!, 0, keys, ko, address);
        masterValue(b.masters[i]!, values, vo);
        return;
    }
  }

  /** Key and value buffers reused by putBatch (zeroed before each batch: padding is written as zero). */
  private scratch = { keys: Buffer.alloc(0), values: Buffer.alloc(0) };

  /** The map a batch goes to. */
  private batchTarget(b: PutBatch): ByteMap {
    switch (b.kind) {
      case 'put-backend':
        return this.backends(b.family);
      case 'put-revnat':
        return this.revNats(b.family);
      case 'put-slot':
      case 'put-master':
        return this.services(b.family);
    }
  }

  /**
   * Encodes entries [from, to) of a batch straight from its columns into one
   * key and one value buffer, and writes them in one syscall.
   */
  putBatch(b: PutBatch, from: number, to: number): void {
    const count = to - from;
    if (count <= 0) return;
    const map = this.batchTarget(b);
    for (let i = from; i < to; i++) {
      const family = b.kind === 'put-backend' ? b.backends[i]!.family : b.kind === 'put-revnat' ? b.family : b.fes[i]!.family;
      if (family !== b.family) throw new RangeError(`putBatch: entry ${i} is IPv${family}, the batch is IPv${b.family}`);
    }
    if (!map.batchUpdate) {
      for (let i = from; i < to; i++) {
        try {
          putOne(this, b, i);
        } catch (err) {
          throw new PartialWriteError((err as Error).message, i - from, { cause: err });
        }
      }
      return;
    }
    if (b.kind === 'put-master' && this.ports) for (let i = from; i < to; i++) this.ports.add(b.fes[i]!.port);
    const ks = map.keySize;
    const vs = map.valueSize;
    if (this.scratch.keys.length < count * ks) this.scratch.keys = Buffer.alloc(count * ks);
    if (this.scratch.values.length < count * vs) this.scratch.values = Buffer.alloc(count * vs);
    const keys = this.scratch.keys.subarray(0, count * ks).fill(0);
    const values = this.scratch.values.subarray(0, count * vs).fill(0);
    // A frontend's slots are consecutive: its address is parsed once for all of them.
    let lastFe: ServiceAddr | undefined;
    let address: number | Buffer | undefined;
    for (let i = from; i < to; i++) {
      if (b.kind === 'put-slot' || b.kind === 'put-master') {
        const fe = b.fes[i]!;
        if (fe !== lastFe) {
          lastFe = fe;
          address = addressField(fe);
        }
      }
      this.encodeAt(b, i, keys, (i - from) * ks, values, (i - from) * vs, address);
    }
    try {
      map.batchUpdate(keys, values, count);
    } catch (err) {
      const written = (err as { count?: unknown }).count;
      throw new PartialWriteError((err as Error).message, typeof written === 'number' ? written : 0, { cause: err });
    }
  }

  putBackend(id: number, backend: Backend): void {
    this.backends(backend.family).update(u32.encode(id), backendValue(backend));
  }

  deleteBackend(id: number, family: Family): void {
    this.backends(family).delete(u32.encode(id));
  }

  putMaster(fe: ServiceAddr, master: MasterEntry): void {
    this.ports?.add(fe.port);
    this.services(fe.family).update(serviceKey(fe, 0), masterValue(master));
  }

  deleteMaster(fe: ServiceAddr): void {
    this.services(fe.family).delete(serviceKey(fe, 0));
  }

  putSlot(fe: ServiceAddr, slot: number, backendId: number): void {
    this.services(fe.family).update(serviceKey(fe, slot), slotValue(backendId));
  }

  deleteSlot(fe: ServiceAddr, slot: number): void {
    this.services(fe.family).delete(serviceKey(fe, slot));
  }

  putRevNat(id: number, family: Family, entry: RevNatEntry): void {
    this.revNats(family).update(u32.encode(id), revNatValue(family, entry));
  }

  rewriteRevNat(id: number, family: Family, entry: RevNatEntry): void {
    this.revNats(family).update(u32.encode(id), revNatValue(family, entry), BPF_EXIST);
  }

  deleteRevNat(id: number, family: Family): void {
    this.revNats(family).delete(u32.encode(id));
  }

  dump(): MapsDump {
    return dumpMaps(this.m);
  }

  matches(x: ExpectedMaps): boolean {
    // Each entry is read in place from the packed buffers with the codecs,
    // its fields hashed and summed (digest.ts); nothing of `x` is looked at
    // but one count and one digest per map. Entries dump() skips (a
    // protocol, scope or backend protocol no lbctl build writes) are
    // skipped here too, so they are not drift either way.
    const h = this.hash;
    for (const family of [4, 6] as const) {
      const name = `lb${family}_services` as const;
      const map = this.m[name];
      const { keys, values, count } = packed(map);
      const ks = map.keySize;
      const vs = map.valueSize;
      const sum = new MapDigest();
      let seen = 0;
      for (let i = 0; i < count; i++) {
        const key = family === 4 ? lb4_key.decode(keys, i * ks) : lb6_key.decode(keys, i * ks);
        if (protocolName(key.proto) === undefined || (key.scope !== LbScope.LB_SCOPE_EXT && key.scope !== LbScope.LB_SCOPE_INT)) continue;
        if (typeof key.address === 'number') h.key4(key.address, key.dport, key.proto, key.scope);
        else h.key6(key.address, key.dport, key.proto, key.scope);
        const v = lb_service.decode(values, i * vs);
        sum.add(h.service(key.backendSlot, v.backendId, v.count, v.qcount, v.revNatIndex, v.type, v.flags, v.affinityTimeout));
        seen++;
      }
      if (seen !== x.entries(name) || !sum.equals(x.digest(name))) return false;
    }
    for (const family of [4, 6] as const) {
      const name = `lb${family}_backends` as const;
      const map = this.m[name];
      const { keys, values, count } = packed(map);
      const ks = map.keySize;
      const vs = map.valueSize;
      const sum = new MapDigest();
      let seen = 0;
      for (let i = 0; i < count; i++) {
        const b = family === 4 ? lb4_backend.decode(values, i * vs) : lb6_backend.decode(values, i * vs);
        const protocol = protocolName(b.proto);
        if (protocol === undefined || protocol === 'ANY') continue;
        const id = u32.decode(keys, i * ks);
        sum.add(typeof b.address === 'number' ? h.backend4(id, b.address, b.port, b.proto, b.state) : h.backend6(id, b.address, b.port, b.proto, b.state));
        seen++;
      }
      if (seen !== x.entries(name) || !sum.equals(x.digest(name))) return false;
    }
    for (const family of [4, 6] as const) {
      const name = `lb${family}_reverse_nat` as const;
      const map = this.m[name];
      const { keys, values, count } = packed(map);
      const ks = map.keySize;
      const vs = map.valueSize;
      const sum = new MapDigest();
      for (let i = 0; i < count; i++) {
        const id = u32.decode(keys, i * ks);
        const e = family === 4 ? lb4_reverse_nat.decode(values, i * vs) : lb6_reverse_nat.decode(values, i * vs);
        sum.add(typeof e.address === 'number' ? h.revNat4(id, e.address, e.port) : h.revNat6(id, e.address, e.port));
      }
      if (count !== x.entries(name) || !sum.equals(x.digest(name))) return false;
    }
    return true;
  }

  private services(family: Family): ByteMap {
    return family === 4 ? this.m.lb4_services : this.m.lb6_services;
  }

  private backends(family: Family): ByteMap {
    return family === 4 ? this.m.lb4_backends : this.m.lb6_backends;
  }

  private revNats(family: Family): ByteMap {
    return family === 4 ? this.m.lb4_reverse_nat : this.m.lb6_reverse_nat;
  }
}

/** Reads every entry of the service, backend and rev-NAT maps. Entries lbctl cannot decode are skipped. */
export function dumpMaps(m: LbMapSet): MapsDump {
  const services: ServiceEntry[] = [];
  for (const [k, v] of m.lb4_services.entries()) {
    const key = lb4_key.decode(k);
    const fe = serviceAddr(uintToIpv4(key.address), 4, key.dport, key.proto, key.scope);
    if (fe) services.push(decodeService(fe, key.backendSlot, lb_service.decode(v)));
  }
  for (const [k, v] of m.lb6_services.entries()) {
    const key = lb6_key.decode(k);
    const fe = serviceAddr(ipFromBytes(key.address), 6, key.dport, key.proto, key.scope);
    if (fe) services.push(decodeService(fe, key.backendSlot, lb_service.decode(v)));
  }

  const backends: Array<{ id: number; backend: Backend }> = [];
  for (const [k, v] of m.lb4_backends.entries()) {
    const b = lb4_backend.decode(v);
    const protocol = PROTO_NAME.get(b.proto);
    if (protocol === undefined || protocol === 'ANY') continue;
    const state = stateName(b.state);
    backends.push({ id: u32.decode(k), backend: { address: uintToIpv4(b.address), family: 4, port: b.port, protocol, state } });
  }
  for (const [k, v] of m.lb6_backends.entries()) {
    const b = lb6_backend.decode(v);
    const protocol = PROTO_NAME.get(b.proto);
    if (protocol === undefined || protocol === 'ANY') continue;
    const state = stateName(b.state);
    backends.push({ id: u32.decode(k), backend: { address: ipFromBytes(b.address), family: 6, port: b.port, protocol, state } });
  }

  const revNat: Array<{ id: number; family: Family } & RevNatEntry> = [];
  for (const [k, v] of m.lb4_reverse_nat.entries()) {
    const e = lb4_reverse_nat.decode(v);
    revNat.push({ id: u32.decode(k), family: 4, address: uintToIpv4(e.address), port: e.port });
  }
  for (const [k, v] of m.lb6_reverse_nat.entries()) {
    const e = lb6_reverse_nat.decode(v);
    revNat.push({ id: u32.decode(k), family: 6, address: ipFromBytes(e.address), port: e.port });
  }
  return { services, backends, revNat };
}
