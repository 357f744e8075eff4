// An in-memory LbMaps that records every write and can be told to fail one,
// for reconciler tests that check order and failure handling. With
// `maxEntries`, a map behaves as a full BPF hash map does: a put of a new
// key beyond max_entries fails with E2BIG, a put of an existing key (and a
// delete) still works (test/native/maps.ts checks this of the kernel).
import type { LbMaps, MapsDump, MasterEntry, NorthSouthMaps, RevNatEntry, ServiceEntry, SrcRangeEntry } from '../../src/datapath/lbmaps.js';
import { serviceAddrKey, type ServiceAddr } from '../../src/lb/types.js';
import type { Backend, Family } from '../../src/lb/types.js';
import type { LbMapName } from '../../src/reconcile/realized.js';

export interface Call {
  readonly method: string;
  readonly what: string;
}

/** The kernel's error for a put of a new key into a full hash map. */
export function e2big(map: string): Error {
  return Object.assign(new Error(`${map}: bpf_map_update_elem: Argument list too long (E2BIG)`), { code: 'E2BIG', errno: 7 });
}

/**
 * The service key as the kernel's map keeps it: address, family, port,
 * protocol and scope, nothing of the caller's object (a Frontend), the
 * external scope as no field at all (what dumpMaps decodes).
 */
function keyOf(fe: ServiceAddr): ServiceAddr {
  const { address, family, port, protocol } = fe;
  return fe.scope === 'internal' ? { address, family, port, protocol, scope: 'internal' } : { address, family, port, protocol };
}

export class FakeLbMaps implements LbMaps {
  readonly services = new Map<string, ServiceEntry>();
  readonly backends = new Map<number, Backend>();
  readonly revNat = new Map<string, { id: number; family: Family } & RevNatEntry>();
  readonly calls: Call[] = [];
  /**
   * Throws on the first call for which this returns true: EPERM, a write
   * error that is not "no room" (the sync stops).
   */
  failWhen: ((c: Call) => boolean) | undefined;
  /** max_entries per map; a map not named has no limit. */
  maxEntries: Partial<Record<LbMapName, number>> = {};

  constructor(maxEntries: Partial<Record<LbMapName, number>> = {}) {
    this.maxEntries = maxEntries;
  }

  /** Entries one map holds now. */
  entries(map: LbMapName): number {
    const family = map.startsWith('lb6') ? 6 : 4;
    if (map.endsWith('_services')) return [...this.services.values()].filter((e) => e.fe.family === family).length;
    if (map.endsWith('_backends')) return [...this.backends.values()].filter((b) => b.family === family).length;
    return [...this.revNat.values()].filter((e) => e.family === family).length;
  }

  private record(method: string, what: string): void {
    const c = { method, what };
    if (this.failWhen?.(c)) {
      this.failWhen = undefined;
      throw Object.assign(new Error(`${method} ${what}: bpf_map_update_elem: Operation not permitted (EPERM)`), { code: 'EPERM', errno: 1 });
    }
    this.calls.push(c);
  }

  /** E2BIG when `exists` is false and the map is at its max_entries. */
  private room(map: LbMapName, exists: boolean): void {
    const max = this.maxEntries[map];
    if (!exists && max !== undefined && this.entries(map) >= max) throw e2big(map);
  }

  putBackend(id: number, backend: Backend): void {
    this.room(`lb${backend.family}_backends`, this.backends.get(id)?.family === backend.family);
    this.record('putBackend', String(id));
    this.backends.set(id, backend);
  }
  deleteBackend(id: number): void {
    this.record('deleteBackend', String(id));
    this.backends.delete(id);
  }
  putMaster(fe: ServiceAddr, master: MasterEntry): void {
    this.room(`lb${fe.family}_services`, this.services.has(`${serviceAddrKey(fe)}#0`));
    this.record('putMaster', serviceAddrKey(fe));
    this.services.set(`${serviceAddrKey(fe)}#0`, { fe: keyOf(fe), slot: 0, master });
  }
  deleteMaster(fe: ServiceAddr): void {
    this.record('deleteMaster', serviceAddrKey(fe));
    this.services.delete(`${serviceAddrKey(fe)}#0`);
  }
  putSlot(fe: ServiceAddr, slot: number, backendId: number): void {
    this.room(`lb${fe.family}_services`, this.services.has(`${serviceAddrKey(fe)}#${slot}`));
    this.record('putSlot', `${serviceAddrKey(fe)}#${slot}`);
    this.services.set(`${serviceAddrKey(fe)}#${slot}`, { fe: keyOf(fe), slot, backendId });
  }
  deleteSlot(fe: ServiceAddr, slot: number): void {
    this.record('deleteSlot', `${serviceAddrKey(fe)}#${slot}`);
    this.services.delete(`${serviceAddrKey(fe)}#${slot}`);
  }
  putRevNat(id: number, family: Family, entry: RevNatEntry): void {
    this.room(`lb${family}_reverse_nat`, this.revNat.has(`${family}/${id}`));
    this.record('putRevNat', `${family}/${id}`);
    this.revNat.set(`${family}/${id}`, { id, family, address: entry.address, port: entry.port });
  }
  rewriteRevNat(id: number, family: Family, entry: RevNatEntry): void {
    this.record('rewriteRevNat', `${family}/${id}`);
    if (!this.revNat.has(`${family}/${id}`)) throw Object.assign(new Error(`rev-NAT ${family}/${id}: ENOENT`), { code: 'ENOENT' });
    this.revNat.set(`${family}/${id}`, { id, family, address: entry.address, port: entry.port });
  }
  deleteRevNat(id: number, family: Family): void {
    this.record('deleteRevNat', `${family}/${id}`);
    this.revNat.delete(`${family}/${id}`);
  }
  dump(): MapsDump {
    return {
      services: [...this.services.values()],
      backends: [...this.backends.entries()].map(([id, backend]) => ({ id, backend })),
      revNat: [...this.revNat.values()],
    };
  }
}

/**
 * What a connecting socket may see at any moment: every master's slots up to
 * count + qcount exist and name existing backends, and its rev-NAT entry
 * exists. Undefined when so, else what is wrong.
 */
export function consistent(m: FakeLbMaps): string | undefined {
  for (const e of m.services.values()) {
    if (e.slot !== 0 || !e.master || e.master.type === 'Wildcard') continue;
    const key = serviceAddrKey(e.fe);
    for (let s = 1; s <= e.master.count + e.master.qcount; s++) {
      const slot = m.services.get(`${key}#${s}`);
      if (!slot) return `${key} counts slot ${s}, which is missing`;
      if (!m.backends.has(slot.backendId!)) return `${key} slot ${s} names missing backend ${slot.backendId}`;
    }
    if (!m.revNat.has(`${e.fe.family}/${e.master.revNatId}`)) return `${key} names missing rev-NAT ${e.master.revNatId}`;
  }
  return undefined;
}

/** The tc datapath's per-frontend maps in memory: Maglev tables by key, source ranges as text. */
export class FakeNorthSouthMaps implements NorthSouthMaps {
  readonly tables = new Map<number, Uint32Array>();
  readonly ranges = new Set<string>();
  /** Every write, in order ("put-maglev 7", "delete-range 4/7/10.0.0.0/8"). */
  readonly log: string[] = [];

  putMaglev(table: number, ids: Uint32Array): void {
    this.tables.set(table, ids);
    this.log.push(`put-maglev ${table}`);
  }

  deleteMaglev(table: number): void {
    this.tables.delete(table);
    this.log.push(`delete-maglev ${table}`);
  }

  maglevKeys(): number[] {
    return [...this.tables.keys()];
  }

  putSrcRange(e: SrcRangeEntry): void {
    const k = `${e.family}/${e.revNatId}/${e.address}/${e.prefixLen}`;
    this.ranges.add(k);
    this.log.push(`put-range ${k}`);
  }

  deleteSrcRange(e: SrcRangeEntry): void {
    const k = `${e.family}/${e.revNatId}/${e.address}/${e.prefixLen}`;
    this.ranges.delete(k);
    this.log.push(`delete-range ${k}`);
  }

  srcRanges(): SrcRangeEntry[] {
    return [...this.ranges].map((k) => {
      const [family, revNatId, address, prefixLen] = k.split('/');
      return { family: Number(family) as 4 | 6, revNatId: Number(revNatId), address: address!, prefixLen: Number(prefixLen) };
    });
  }
}
