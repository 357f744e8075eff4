// LbMaps over the kernel's maps: encodes with the BTF-generated codecs and
// moves bytes through the native addon. Nothing here knows a byte offset.
import { ConfigError } from '../errors.js';
import { BPF_ANY, BPF_EXIST, type FlatEntries } from '../native/bpf.js';
import { ipFromBytes, ipv4ToUint, ipv6Bytes, uintToIpv4 } from '../lb/addr.js';
import type { Backend, BackendState, Family, Protocol } from '../lb/types.js';
import {
  LbBackendState,
  LbScope,
  LbSvcType,
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
  type MapName,
  type MapSpec,
} from './abi.gen.js';
import { PartialWriteError, type ExpectedFrontend, type ExpectedMaps, type LbMaps, type LbWrite, type MapsDump, type MasterEntry, type MasterType, type RevNatEntry, type ServiceEntry } from './lbmaps.js';
import { serviceAddr4Id, serviceAddrKey, type ServiceAddr } from '../lb/types.js';

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

/** The maps LbMaps writes; lb_metrics and the socket rev-NAT maps are read elsewhere. */
export const LB_MAP_NAMES = [
  'lb4_services',
  'lb6_services',
  'lb4_backends',
  'lb6_backends',
  'lb4_reverse_nat',
  'lb6_reverse_nat',
] as const satisfies readonly MapName[];

export type LbMapSet = Record<(typeof LB_MAP_NAMES)[number], ByteMap>;

const PROTO_NUM: Record<Protocol | 'ANY', number> = { ANY: 0, TCP: 6, UDP: 17 };
const PROTO_NAME = new Map<number, Protocol | 'ANY'>([
  [0, 'ANY'],
  [6, 'TCP'],
  [17, 'UDP'],
]);

const TYPE_NUM: Record<MasterType, number> = {
  ClusterIP: LbSvcType.LB_SVC_CLUSTER_IP,
  NodePort: LbSvcType.LB_SVC_NODEPORT,
  LoadBalancer: LbSvcType.LB_SVC_LOADBALANCER,
  ExternalIP: LbSvcType.LB_SVC_EXTERNAL_IP,
  Wildcard: LbSvcType.LB_SVC_WILDCARD,
};
const TYPE_NAME = new Map<number, MasterType>(Object.entries(TYPE_NUM).map(([k, v]) => [v, k as MasterType]));

const STATE_NUM: Record<BackendState, number> = {
  active: LbBackendState.LB_BACKEND_ACTIVE,
  terminating: LbBackendState.LB_BACKEND_TERMINATING,
  quarantined: LbBackendState.LB_BACKEND_QUARANTINED,
};
const STATE_NAME = new Map<number, BackendState>(Object.entries(STATE_NUM).map(([k, v]) => [v, k as BackendState]));
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


/** The key's scope byte (enum lb_scope): absent is the external scope, so old entries (pad 0) read as before. */
const scopeNum = (fe: ServiceAddr): number => (fe.scope === 'internal' ? LbScope.LB_SCOPE_INT : LbScope.LB_SCOPE_EXT);

/** A service key read back; undefined for a protocol or scope no lbctl build writes. */
function serviceAddr(address: string, family: Family, port: number, proto: number, scope: number): ServiceAddr | undefined {
  const protocol = PROTO_NAME.get(proto);
  if (!protocol) return undefined;
  if (scope === LbScope.LB_SCOPE_EXT) return { address, family, port, protocol };
  if (scope === LbScope.LB_SCOPE_INT) return { address, family, port, protocol, scope: 'internal' };
  return undefined;
}

function serviceKey(fe: ServiceAddr, slot: number, b?: Buffer, o?: number): Buffer {
  const proto = PROTO_NUM[fe.protocol];
  const scope = scopeNum(fe);
  return fe.family === 4
    ? lb4_key.encode({ address: ipv4ToUint(fe.address), dport: fe.port, backendSlot: slot, proto, scope }, b, o)
    : lb6_key.encode({ address: ipv6Bytes(fe.address), dport: fe.port, backendSlot: slot, proto, scope }, b, o);
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
const protocolName = (n: number): Protocol | 'ANY' | undefined => (n === 6 ? 'TCP' : n === 17 ? 'UDP' : n === 0 ? 'ANY' : undefined);

/** An address field as decoded (IPv4: a number; IPv6: 16 bytes) against its text. */
const sameAddress = (got: number | Buffer, address: string): boolean => (typeof got === 'number' ? got === ipv4ToUint(address) : got.equals(ipv6Bytes(address)));

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

/** Whether a master's value, decoded, is `m` (every field lb_service has). */
const sameMasterValue = (v: LbService, m: MasterEntry): boolean =>
  v.backendId === 0 && v.count === m.count && v.qcount === m.qcount && v.revNatIndex === m.revNatId && v.type === TYPE_NUM[m.type] && v.flags === m.flags && v.affinityTimeout === m.affinityTimeout;

/** Whether a slot's value, decoded, names backend `id` (and nothing else). */
const sameSlotValue = (v: LbService, id: number): boolean =>
  v.backendId === id && v.count === 0 && v.qcount === 0 && v.revNatIndex === 0 && v.type === 0 && v.flags === 0 && v.affinityTimeout === 0;

const EMPTY_SLOT = { count: 0, qcount: 0, revNatIndex: 0, type: 0, flags: 0, affinityTimeout: 0 };

export class KernelLbMaps implements LbMaps {
  constructor(private readonly m: LbMapSet) {
    for (const name of LB_MAP_NAMES) verifyMapLayout(m[name], mapSpecs[name]);
  }

  /** The map a write goes to. */
  private target(w: LbWrite): ByteMap {
    switch (w.kind) {
      case 'put-backend':
        return w.backend.family === 4 ? this.m.lb4_backends : this.m.lb6_backends;
      case 'put-revnat':
        return w.family === 4 ? this.m.lb4_reverse_nat : this.m.lb6_reverse_nat;
      case 'put-slot':
      case 'put-master':
        return this.services(w.fe.family);
    }
  }

  /**
   * The key and value of one write, encoded into `k` at `ko` and `v` at `vo`
   * (fresh buffers when omitted): the one place that encodes them.
   */
  private encode(w: LbWrite, k?: Buffer, ko?: number, v?: Buffer, vo?: number): [Buffer, Buffer] {
    switch (w.kind) {
      case 'put-backend': {
        const b = w.backend;
        const proto = PROTO_NUM[b.protocol];
        const state = STATE_NUM[b.state];
        return b.family === 4
          ? [u32.encode(w.id, k, ko), lb4_backend.encode({ address: ipv4ToUint(b.address), port: b.port, proto, state }, v, vo)]
          : [u32.encode(w.id, k, ko), lb6_backend.encode({ address: ipv6Bytes(b.address), port: b.port, proto, state }, v, vo)];
      }
      case 'put-revnat':
        return w.family === 4
          ? [u32.encode(w.id, k, ko), lb4_reverse_nat.encode({ address: ipv4ToUint(w.entry.address), port: w.entry.port }, v, vo)]
          : [u32.encode(w.id, k, ko), lb6_reverse_nat.encode({ address: ipv6Bytes(w.entry.address), port: w.entry.port }, v, vo)];
      case 'put-slot':
        return [serviceKey(w.fe, w.slot, k, ko), lb_service.encode({ ...EMPTY_SLOT, backendId: w.backendId }, v, vo)];
      case 'put-master':
        return [serviceKey(w.fe, 0, k, ko), masterValue(w.master, v, vo)];
    }
  }

  private put(w: LbWrite, flags = BPF_ANY): void {
    const [k, v] = this.encode(w);
    this.target(w).update(k, v, flags);
  }

  /** Encodes the whole batch into one key and one value buffer (no buffer per entry). */
  putMany(writes: readonly LbWrite[]): void {
    if (writes.length === 0) return;
    const map = this.target(writes[0]!);
    if (writes.some((w) => this.target(w) !== map)) throw new RangeError('putMany: every write of a batch must go to the same map');
    if (!map.batchUpdate) {
      writes.forEach((w, i) => {
        try {
          this.put(w);
        } catch (err) {
          throw new PartialWriteError((err as Error).message, i, { cause: err });
        }
      });
      return;
    }
    const ks = map.keySize;
    const vs = map.valueSize;
    const keys = Buffer.alloc(writes.length * ks);
    const values = Buffer.alloc(writes.length * vs);
    writes.forEach((w, i) => this.encode(w, keys, i * ks, values, i * vs));
    try {
      map.batchUpdate(keys, values, writes.length);
    } catch (err) {
      const written = (err as { count?: unknown }).count;
      throw new PartialWriteError((err as Error).message, typeof written === 'number' ? written : 0, { cause: err });
    }
  }

  putBackend(id: number, backend: Backend): void {
    this.put({ kind: 'put-backend', id, backend });
  }

  deleteBackend(id: number, family: Family): void {
    (family === 4 ? this.m.lb4_backends : this.m.lb6_backends).delete(u32.encode(id));
  }

  putMaster(fe: ServiceAddr, master: MasterEntry): void {
    this.put({ kind: 'put-master', fe, master });
  }

  deleteMaster(fe: ServiceAddr): void {
    this.services(fe.family).delete(serviceKey(fe, 0));
  }

  putSlot(fe: ServiceAddr, slot: number, backendId: number): void {
    this.put({ kind: 'put-slot', fe, slot, backendId });
  }

  deleteSlot(fe: ServiceAddr, slot: number): void {
    this.services(fe.family).delete(serviceKey(fe, slot));
  }

  putRevNat(id: number, family: Family, entry: RevNatEntry): void {
    this.put({ kind: 'put-revnat', id, family, entry });
  }

  rewriteRevNat(id: number, family: Family, entry: RevNatEntry): void {
    this.put({ kind: 'put-revnat', id, family, entry }, BPF_EXIST);
  }

  deleteRevNat(id: number, family: Family): void {
    (family === 4 ? this.m.lb4_reverse_nat : this.m.lb6_reverse_nat).delete(u32.encode(id));
  }

  dump(): MapsDump {
    return dumpMaps(this.m);
  }

  matches(x: ExpectedMaps): boolean {
    // Each entry is read in place from the packed buffers with the codecs
    // and its fields compared with what `x` holds: every field the codecs
    // know (padding is not compared, as dump() does not read it either).
    for (const family of [4, 6] as const) {
      const map = this.services(family);
      const { keys, values, count } = packed(map);
      const ks = map.keySize;
      const vs = map.valueSize;
      let seen = 0;
      for (let i = 0; i < count; i++) {
        let fe: ExpectedFrontend | undefined;
        let slot: number;
        if (family === 4) {
          const key = lb4_key.decode(keys, i * ks);
          const protocol = protocolName(key.proto);
          const scope = key.scope === LbScope.LB_SCOPE_EXT ? undefined : key.scope === LbScope.LB_SCOPE_INT ? 'internal' : null;
          if (protocol === undefined || scope === null) continue; // dump() skips it too
          fe = x.frontendAt4(serviceAddr4Id(key.address, key.dport, protocol, scope));
          slot = key.backendSlot;
        } else {
          const key = lb6_key.decode(keys, i * ks);
          const a = serviceAddr(ipFromBytes(key.address), 6, key.dport, key.proto, key.scope);
          if (!a) continue; // dump() skips it too
          fe = x.frontendAt(serviceAddrKey(a));
          slot = key.backendSlot;
        }
        if (!fe) return false;
        const got = lb_service.decode(values, i * vs);
        if (slot === 0) {
          const m = fe.master;
          if (!m || !sameMasterValue(got, m)) return false;
        } else {
          const id = fe.slots[slot];
          if (id === undefined || !sameSlotValue(got, id)) return false;
        }
        seen++;
      }
      if (seen !== x.entries(`lb${family}_services`)) return false;
    }
    for (const family of [4, 6] as const) {
      const map = family === 4 ? this.m.lb4_backends : this.m.lb6_backends;
      const codec = family === 4 ? lb4_backend : lb6_backend;
      const { keys, values, count } = packed(map);
      const ks = map.keySize;
      const vs = map.valueSize;
      let seen = 0;
      for (let i = 0; i < count; i++) {
        const got = codec.decode(values, i * vs);
        if (got.proto !== PROTO_NUM.TCP && got.proto !== PROTO_NUM.UDP) continue; // dump() skips it too
        const id = u32.decode(keys, i * ks);
        const backend = x.backendAt(id);
        if (backend?.family !== family) return false;
        if (!sameAddress(got.address, backend.address) || got.port !== backend.port || got.proto !== PROTO_NUM[backend.protocol] || got.state !== STATE_NUM[backend.state]) return false;
        seen++;
      }
      if (seen !== x.entries(`lb${family}_backends`)) return false;
    }
    for (const family of [4, 6] as const) {
      const map = family === 4 ? this.m.lb4_reverse_nat : this.m.lb6_reverse_nat;
      const { keys, values, count } = packed(map);
      const ks = map.keySize;
      const vs = map.valueSize;
      for (let i = 0; i < count; i++) {
        const id = u32.decode(keys, i * ks);
        const entry = x.revNatAt(family, id);
        if (!entry) return false;
        const got = family === 4 ? lb4_reverse_nat.decode(values, i * vs) : lb6_reverse_nat.decode(values, i * vs);
        if (!sameAddress(got.address, entry.address) || got.port !== entry.port) return false;
      }
      if (count !== x.entries(`lb${family}_reverse_nat`)) return false;
    }
    return true;
  }

  private services(family: Family): ByteMap {
    return family === 4 ? this.m.lb4_services : this.m.lb6_services;
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
