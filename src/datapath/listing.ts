// Frontends with their backends as the maps hold them: the shape of
// `lbctl bpf lb list -o json`, shared by the CLI and the tests.
//
// As `cilium bpf lb list`: a NodePort surrogate (address 0.0.0.0 or ::,
// which the tc datapath matches on every node address) is listed as it is
// and once per node address of its family, given those addresses; each
// entry names its type, its scope and its flags.
import type { MapsDump, MasterEntry } from './lbmaps.js';
import { LbSvcFlags } from './abi.gen.js';
import { serviceAddrKey, type Family, type ServiceAddr } from '../lb/types.js';
import { formatAddr } from '../lb/types.js';

export interface LbListBackend {
  address: string;
  id: number;
  slot: number;
  state: string;
}

export interface LbListEntry {
  /** The frontend's key text: "10.96.0.10:80/TCP", "0.0.0.0:30080/TCP/internal". */
  frontend: string;
  revNatId: number;
  /** ClusterIP, NodePort, LoadBalancer or ExternalIP ("unknown" without a master entry). */
  type: string;
  scope: 'external' | 'internal';
  /** The master's flags by name (FLAG_NAMES), in that order; a bit lbctl does not know as hex. */
  flags: string[];
  backends: LbListBackend[];
}

/** A node address a NodePort surrogate is listed at. */
export interface NodeAddress {
  readonly address: string;
  readonly family: Family;
}

/** Flag names as `cilium bpf lb list` writes them. */
export const FLAG_NAMES: ReadonlyArray<readonly [bit: number, name: string]> = [
  [LbSvcFlags.LB_SVC_F_LOCAL_EXTERNAL, 'Local'],
  [LbSvcFlags.LB_SVC_F_LOCAL_INTERNAL, 'InternalLocal'],
  [LbSvcFlags.LB_SVC_F_TWO_SCOPES, 'two-scopes'],
  [LbSvcFlags.LB_SVC_F_AFFINITY, 'sessionAffinity'],
  [LbSvcFlags.LB_SVC_F_SRC_RANGE, 'sourceRanges'],
  [LbSvcFlags.LB_SVC_F_MAGLEV, 'Maglev'],
];

export function flagNames(flags: number): string[] {
  const names: string[] = [];
  let rest = flags;
  for (const [bit, name] of FLAG_NAMES) {
    if ((flags & bit) === 0) continue;
    names.push(name);
    rest &= ~bit;
  }
  for (let bit = 1; rest !== 0 && bit <= 0x80; bit <<= 1) {
    if ((rest & bit) === 0) continue;
    names.push(`0x${bit.toString(16)}`);
    rest &= ~bit;
  }
  return names;
}

function cmpAddr(a: ServiceAddr, b: ServiceAddr): number {
  if (a.family !== b.family) return a.family - b.family;
  if (a.address !== b.address) {
    const pa = a.family === 4 ? a.address.split('.').map(Number) : [a.address];
    const pb = b.family === 4 ? b.address.split('.').map(Number) : [b.address];
    for (let i = 0; i < pa.length; i++) if (pa[i] !== pb[i]) return pa[i]! < pb[i]! ? -1 : 1;
  }
  if (a.port !== b.port) return a.port - b.port;
  if (a.protocol !== b.protocol) return a.protocol < b.protocol ? -1 : 1;
  return (a.scope === 'internal' ? 1 : 0) - (b.scope === 'internal' ? 1 : 0);
}

const isSurrogate = (fe: ServiceAddr, master: MasterEntry | undefined): boolean =>
  master?.type === 'NodePort' && (fe.address === '0.0.0.0' || fe.address === '::');

/**
 * Pure: a dump → one entry per frontend (wildcard entries are internal and
 * left out), plus one per node address of its family for each NodePort
 * surrogate.
 */
export function lbList(dump: MapsDump, nodeAddresses: readonly NodeAddress[] = []): LbListEntry[] {
  const backends = new Map(dump.backends.map((b) => [b.id, b.backend]));
  const byFe = new Map<string, { fe: ServiceAddr; master?: MasterEntry; slots: Array<[number, number]> }>();
  for (const e of dump.services) {
    if (e.fe.protocol === 'ANY') continue;
    const k = serviceAddrKey(e.fe);
    let g = byFe.get(k);
    if (!g) byFe.set(k, (g = { fe: e.fe, slots: [] }));
    if (e.slot === 0 && e.master) g.master = e.master;
    else if (e.backendId !== undefined) g.slots.push([e.slot, e.backendId]);
  }
  const groups = [...byFe.values()];
  for (const g of [...groups]) {
    if (!isSurrogate(g.fe, g.master)) continue;
    for (const n of nodeAddresses) if (n.family === g.fe.family) groups.push({ ...g, fe: { ...g.fe, address: n.address } });
  }
  return groups
    .sort((a, b) => cmpAddr(a.fe, b.fe))
    .map(({ fe, master, slots }) => ({
      frontend: serviceAddrKey(fe),
      revNatId: master?.revNatId ?? 0,
      type: master?.type ?? 'unknown',
      scope: fe.scope === 'internal' ? 'internal' : 'external',
      flags: flagNames(master?.flags ?? 0),
      backends: [...slots]
        .sort((a, b) => a[0] - b[0])
        .map(([slot, id]) => {
          const b = backends.get(id);
          const beyond = master && slot > master.count + master.qcount;
          // The maps keep one state per backend, and a backend can serve
          // several frontends: one quarantined by a service's probe may sit
          // in another's selectable slots, where it is picked.
          const selectable = master && slot <= master.count;
          const state = b?.state === 'quarantined' && selectable ? 'active' : (b?.state ?? 'missing');
          return {
            address: b ? formatAddr(b.address, b.family, b.port) : '<missing>',
            id,
            slot,
            state: beyond ? 'orphaned' : state,
          };
        }),
    }));
}
