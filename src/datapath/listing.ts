// Frontends with their backends as the maps hold them: the shape of
// `lbctl bpf lb list -o json`, shared by the CLI and the agent's drift check.
import type { MapsDump } from './lbmaps.js';
import { serviceAddrKey, type ServiceAddr } from '../lb/types.js';
import { formatAddr } from '../lb/types.js';

export interface LbListBackend {
  address: string;
  id: number;
  slot: number;
  state: string;
}

export interface LbListEntry {
  frontend: string;
  revNatId: number;
  type: string;
  backends: LbListBackend[];
}

function cmpAddr(a: ServiceAddr, b: ServiceAddr): number {
  if (a.family !== b.family) return a.family - b.family;
  if (a.address !== b.address) {
    const pa = a.family === 4 ? a.address.split('.').map(Number) : [a.address];
    const pb = b.family === 4 ? b.address.split('.').map(Number) : [b.address];
    for (let i = 0; i < pa.length; i++) if (pa[i] !== pb[i]) return pa[i]! < pb[i]! ? -1 : 1;
  }
  if (a.port !== b.port) return a.port - b.port;
  return a.protocol < b.protocol ? -1 : a.protocol > b.protocol ? 1 : 0;
}

/** Pure: a dump → one entry per frontend (wildcard entries are internal and left out). */
export function lbList(dump: MapsDump): LbListEntry[] {
  const backends = new Map(dump.backends.map((b) => [b.id, b.backend]));
  const byFe = new Map<string, { fe: ServiceAddr; master?: NonNullable<MapsDump['services'][number]['master']>; slots: Array<[number, number]> }>();
  for (const e of dump.services) {
    if (e.fe.protocol === 'ANY') continue;
    const k = serviceAddrKey(e.fe);
    let g = byFe.get(k);
    if (!g) byFe.set(k, (g = { fe: e.fe, slots: [] }));
    if (e.slot === 0 && e.master) g.master = e.master;
    else if (e.backendId !== undefined) g.slots.push([e.slot, e.backendId]);
  }
  return [...byFe.values()]
    .sort((a, b) => cmpAddr(a.fe, b.fe))
    .map(({ fe, master, slots }) => ({
      frontend: serviceAddrKey(fe),
      revNatId: master?.revNatId ?? 0,
      type: master?.type ?? 'unknown',
      backends: slots
        .sort((a, b) => a[0] - b[0])
        .map(([slot, id]) => {
          const b = backends.get(id);
          const beyond = master && slot > master.count + master.qcount;
          return {
            address: b ? formatAddr(b.address, b.family, b.port) : '<missing>',
            id,
            slot,
            state: beyond ? 'orphaned' : (b?.state ?? 'missing'),
          };
        }),
    }));
}

