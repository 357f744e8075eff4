// Realized state: what the maps hold, as the reconciler last wrote or read
// it. Built from a dump at start (restore), then kept in step with every
// successful write.
import type { Backend, Family } from '../model/types.js';
import { serviceAddrKey, type MapsDump, type MasterEntry, type RevNatEntry, type ServiceAddr } from '../datapath/lbmaps.js';

export interface RealizedFrontend {
  readonly fe: ServiceAddr;
  master?: MasterEntry;
  /** slot → backend id */
  readonly slots: Map<number, number>;
}

export interface RealizedState {
  /** Keyed by serviceAddrKey(): frontends and wildcard entries alike. */
  readonly frontends: Map<string, RealizedFrontend>;
  readonly backends: Map<number, Backend>;
  /** Keyed by revNatKey(). */
  readonly revNat: Map<string, RevNatEntry & { id: number; family: Family }>;
}

export const revNatKey = (family: Family, id: number): string => `${family}/${id}`;

export function emptyRealized(): RealizedState {
  return { frontends: new Map(), backends: new Map(), revNat: new Map() };
}

export function realizedFrom(dump: MapsDump): RealizedState {
  const r = emptyRealized();
  for (const e of dump.services) {
    const k = serviceAddrKey(e.fe);
    let fe = r.frontends.get(k);
    if (!fe) r.frontends.set(k, (fe = { fe: e.fe, slots: new Map() }));
    if (e.slot === 0) fe.master = e.master;
    else if (e.backendId !== undefined) fe.slots.set(e.slot, e.backendId);
  }
  for (const { id, backend } of dump.backends) r.backends.set(id, backend);
  for (const e of dump.revNat) r.revNat.set(revNatKey(e.family, e.id), { ...e });
  return r;
}
