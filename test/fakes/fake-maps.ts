// An in-memory LbMaps that records every write and can be told to fail one,
// for reconciler tests that check order and failure handling.
import type { LbMaps, MapsDump, MasterEntry, RevNatEntry, ServiceEntry } from '../../src/datapath/lbmaps.js';
import { serviceAddrKey, type ServiceAddr } from '../../src/lb/types.js';
import type { Backend, Family } from '../../src/lb/types.js';

export interface Call {
  readonly method: string;
  readonly what: string;
}

export class FakeLbMaps implements LbMaps {
  readonly services = new Map<string, ServiceEntry>();
  readonly backends = new Map<number, Backend>();
  readonly revNat = new Map<string, { id: number; family: Family } & RevNatEntry>();
  readonly calls: Call[] = [];
  /** Throws (like a full map would) on the first call for which this returns true. */
  failWhen: ((c: Call) => boolean) | undefined;

  private record(method: string, what: string): void {
    const c = { method, what };
    if (this.failWhen?.(c)) {
      this.failWhen = undefined;
      const err = Object.assign(new Error(`bpf_map_update_elem: Argument list too long (E2BIG)`), { code: 'E2BIG' });
      throw err;
    }
    this.calls.push(c);
  }

  putBackend(id: number, backend: Backend): void {
    this.record('putBackend', String(id));
    this.backends.set(id, backend);
  }
  deleteBackend(id: number): void {
    this.record('deleteBackend', String(id));
    this.backends.delete(id);
  }
  putMaster(fe: ServiceAddr, master: MasterEntry): void {
    this.record('putMaster', serviceAddrKey(fe));
    this.services.set(`${serviceAddrKey(fe)}#0`, { fe, slot: 0, master });
  }
  deleteMaster(fe: ServiceAddr): void {
    this.record('deleteMaster', serviceAddrKey(fe));
    this.services.delete(`${serviceAddrKey(fe)}#0`);
  }
  putSlot(fe: ServiceAddr, slot: number, backendId: number): void {
    this.record('putSlot', `${serviceAddrKey(fe)}#${slot}`);
    this.services.set(`${serviceAddrKey(fe)}#${slot}`, { fe, slot, backendId });
  }
  deleteSlot(fe: ServiceAddr, slot: number): void {
    this.record('deleteSlot', `${serviceAddrKey(fe)}#${slot}`);
    this.services.delete(`${serviceAddrKey(fe)}#${slot}`);
  }
  putRevNat(id: number, family: Family, entry: RevNatEntry): void {
    this.record('putRevNat', `${family}/${id}`);
    this.revNat.set(`${family}/${id}`, { id, family, ...entry });
  }
  rewriteRevNat(id: number, family: Family, entry: RevNatEntry): void {
    this.record('rewriteRevNat', `${family}/${id}`);
    if (!this.revNat.has(`${family}/${id}`)) throw Object.assign(new Error(`rev-NAT ${family}/${id}: ENOENT`), { code: 'ENOENT' });
    this.revNat.set(`${family}/${id}`, { id, family, ...entry });
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
