// Desired versus realized, per frontend: what `lbctl service list` shows and
// what makes it exit 1. Pure: the desired frontends, their rev-NAT ids and a
// dump of the maps in; one status per frontend out. Everything the socket
// programs read is compared: the master entry (count, qcount, rev-NAT id,
// type, flags, affinity timeout), every slot up to count + qcount and the
// backend it names, the rev-NAT entry, and the address's wildcard entry.
// Realized slots are split by the realized count (what the programs select
// from), never by the intended one, so a wrong count is seen; slots beyond
// count + qcount (orphans the programs never read, and a sign of a write
// that went wrong) are drift too.
import type { MapsDump, MasterEntry } from '../datapath/lbmaps.js';
import { formatAddr, serviceAddrKey, type Backend, type ServiceAddr } from '../lb/types.js';
import type { Frontend } from '../model/types.js';
import { masterFlags } from '../reconcile/plan.js';
import type { FrontendStatus } from '../http/view.js';

interface Grouped {
  fe: ServiceAddr;
  master?: MasterEntry;
  /** backend id by slot */
  slots: Map<number, number>;
}

const text = (b: { address: string; family: 4 | 6; port: number }): string => formatAddr(b.address, b.family, b.port);

export function frontendStatuses(desired: Iterable<Frontend>, revNatIdOf: (fe: Frontend) => number, dump: MapsDump, northSouth = false): FrontendStatus[] {
  const backends = new Map(dump.backends.map((b) => [b.id, b.backend]));
  const revNat = { 4: new Map<number, { address: string; port: number }>(), 6: new Map<number, { address: string; port: number }>() };
  for (const e of dump.revNat) revNat[e.family].set(e.id, e);
  const groups = new Map<string, Grouped>();
  for (const e of dump.services) {
    const k = serviceAddrKey(e.fe);
    let g = groups.get(k);
    if (!g) groups.set(k, (g = { fe: e.fe, slots: new Map() }));
    if (e.slot === 0) {
      if (e.master) g.master = e.master;
    } else if (e.backendId !== undefined) g.slots.set(e.slot, e.backendId);
  }
  const slotText = (id: number): string => {
    const b = backends.get(id);
    return b ? text(b) : '<missing>';
  };

  const out: FrontendStatus[] = [];
  const addresses = new Set<string>();
  for (const fe of desired) {
    // Only cluster IPs have wildcard entries (refusing their other ports).
    if (fe.type === 'ClusterIP') addresses.add(fe.address);
    const quarantined = fe.terminating.filter((b) => b.state === 'quarantined').map(text);
    const want = {
      backends: fe.backends.map(text),
      terminating: fe.terminating.map(text),
      revNatId: revNatIdOf(fe),
      ...(quarantined.length > 0 ? { quarantined } : {}),
    };
    const have = groups.get(fe.key);
    groups.delete(fe.key);
    const details: string[] = [];
    let got: FrontendStatus['realized'];
    if (!have) details.push('missing from the maps');
    else {
      const m = have.master;
      const count = m?.count ?? 0;
      const qcount = m?.qcount ?? 0;
      const held = [...have.slots].sort((a, b) => a[0] - b[0]);
      got = {
        backends: held.filter(([s]) => s <= count).map(([, id]) => slotText(id)),
        terminating: held.filter(([s]) => s > count && s <= count + qcount).map(([, id]) => slotText(id)),
        revNatId: m?.revNatId ?? 0,
      };
      if (!m) details.push('no master entry (slot 0): nothing is selectable');
      else {
        if (m.count !== fe.backends.length) details.push(`count ${m.count}, intended ${fe.backends.length}`);
        if (m.qcount !== fe.terminating.length) details.push(`qcount ${m.qcount}, intended ${fe.terminating.length}`);
        if (m.revNatId !== want.revNatId) details.push(`rev-NAT id ${m.revNatId}, intended ${want.revNatId}`);
        if (m.type !== fe.type) details.push(`type ${m.type}, intended ${fe.type}`);
        const flags = masterFlags(fe, northSouth);
        if (m.flags !== flags) details.push(`flags 0x${m.flags.toString(16)}, intended 0x${flags.toString(16)}`);
        if (m.affinityTimeout !== fe.affinityTimeout) details.push(`affinity timeout ${m.affinityTimeout} s, intended ${fe.affinityTimeout} s`);
      }
      const intended: Backend[] = [...fe.backends, ...fe.terminating];
      const last = Math.max(count + qcount, intended.length);
      for (let s = 1; s <= last; s++) {
        const id = have.slots.get(s);
        const b = intended[s - 1];
        if (id === undefined) {
          details.push(b ? `slot ${s} is missing, intended ${text(b)}` : `slot ${s} is counted but missing`);
          continue;
        }
        const hb = backends.get(id);
        if (!hb) details.push(`slot ${s} names missing backend ${id}`);
        else if (!b) details.push(`slot ${s} is ${text(hb)}, intended none`);
        else if (hb.address !== b.address || hb.port !== b.port || hb.protocol !== b.protocol) details.push(`slot ${s} is ${text(hb)}, intended ${text(b)}`);
      }
      for (const [s] of held) if (s > last) details.push(`slot ${s} is beyond count + qcount (orphaned)`);
      if (m) {
        const rn = revNat[fe.family].get(m.revNatId);
        if (!rn) details.push(`rev-NAT entry ${m.revNatId} is missing`);
        else if (rn.address !== fe.address || rn.port !== fe.port) details.push(`rev-NAT entry ${m.revNatId} is ${formatAddr(rn.address, fe.family, rn.port)}, intended ${formatAddr(fe.address, fe.family, fe.port)}`);
      }
      const wild = serviceAddrKey({ address: fe.address, family: fe.family, port: 0, protocol: 'ANY' });
      if (fe.type === 'ClusterIP' && !groups.get(wild)?.master) {
        details.push(`no wildcard entry for ${fe.address}: its other ports are not refused`);
      }
    }
    out.push({
      frontend: fe.key,
      service: `${fe.service.namespace}/${fe.service.name}:${fe.service.portName}`,
      desired: want,
      ...(got ? { realized: got } : {}),
      drift: details.length > 0,
      details,
    });
  }
  for (const [frontend, have] of groups) {
    if (have.fe.protocol === 'ANY') {
      // A wildcard refuses every port of its address: one no service uses is drift.
      if (!addresses.has(have.fe.address)) out.push({ frontend, drift: true, details: [`wildcard entry for ${have.fe.address}, which no service uses: its ports are refused`] });
      continue;
    }
    const count = have.master?.count ?? 0;
    const held = [...have.slots].sort((a, b) => a[0] - b[0]);
    out.push({
      frontend,
      realized: {
        backends: held.filter(([s]) => s <= count).map(([, id]) => slotText(id)),
        terminating: held.filter(([s]) => s > count).map(([, id]) => slotText(id)),
        revNatId: have.master?.revNatId ?? 0,
      },
      drift: true,
      details: ['in the maps but not intended'],
    });
  }
  return out.sort((a, b) => (a.frontend < b.frontend ? -1 : 1));
}
