// `lbctl bpf lb list`: every frontend with its backends, read straight from
// the pinned maps (the agent need not run), in `cilium bpf lb list` columns.
import { dumpMaps } from '../../datapath/maps.js';
import { openPinnedMaps, type PinnedMaps } from '../../datapath/loader.js';
import { lbList, type LbListEntry, type NodeAddress } from '../../datapath/listing.js';
import { lb_node_addr_key } from '../../datapath/abi.gen.js';
import { readMaglevTables, tableShares } from '../../datapath/maglev-maps.js';
import { maglevTableKey } from '../../reconcile/plan.js';
import { ipFromBytes, uintToIpv4 } from '../../lb/addr.js';
import { ConfigError } from '../../base/errors.js';

export { lbList, type LbListEntry, type NodeAddress };

/**
 * The text form: the master's line carries the type and the flags in
 * brackets, as Cilium's ("[NodePort, Local, two-scopes]"); an internal-scope
 * entry's address ends in "/internal".
 */
export function formatLbList(entries: readonly LbListEntry[]): string {
  const rows: Array<[string, string]> = [['SERVICE ADDRESS', 'BACKEND ADDRESS (REVNAT_ID) (SLOT)']];
  for (const e of entries) {
    const nullAddr = e.frontend.startsWith('[') ? '[::]:0' : '0.0.0.0:0';
    rows.push([e.frontend, `${nullAddr} (${e.revNatId}) (0) [${[e.type, ...e.flags].join(', ')}]`]);
    for (const b of e.backends) {
      const state = b.state === 'active' ? '' : ` [${b.state}]`;
      rows.push(['', `${b.address} (${e.revNatId}) (${b.slot})${state}`]);
    }
  }
  const width = Math.max(...rows.map(([a]) => a.length)) + 3;
  return rows.map(([a, b]) => `${a.padEnd(width)}${b}`.trimEnd()).join('\n') + '\n';
}

/** The node addresses the agent wrote (lb_node_addrs); none when the tc datapath never ran. */
export function pinnedNodeAddresses(pinned: PinnedMaps): NodeAddress[] {
  let map;
  try {
    map = pinned.get('lb_node_addrs');
  } catch (err) {
    if (err instanceof ConfigError) return [];
    throw err;
  }
  return map.entries().map(([k]) => {
    const d = lb_node_addr_key.decode(k);
    return d.family === 4 ? { address: uintToIpv4(d.address.readUInt32BE(0)), family: 4 as const } : { address: ipFromBytes(d.address), family: 6 as const };
  });
}

/** Each table's share per backend id (slots it names), by lb_maglev key. */
function maglevShares(pinned: PinnedMaps): Map<number, Map<number, number>> | undefined {
  let chunks, index;
  try {
    chunks = pinned.get('lb_maglev');
    index = pinned.get('lb_maglev_index');
  } catch (err) {
    if (err instanceof ConfigError) return undefined;
    throw err;
  }
  const out = new Map<number, Map<number, number>>();
  for (const [key, table] of readMaglevTables(chunks, index)) out.set(key, tableShares(table));
  return out;
}

/**
 * `nodeAddresses`: where NodePort surrogates are listed besides 0.0.0.0 and
 * :: (default: the node addresses the agent wrote). `maglev`: each
 * frontend's Maglev table, as its backends' shares.
 */
export function lbListCommand(opts: { bpfRoot: string; output?: string; nodeAddresses?: readonly NodeAddress[]; maglev?: boolean }): void {
  const pinned = openPinnedMaps(opts.bpfRoot);
  try {
    const entries: Array<LbListEntry & { maglev?: Array<{ backendId: number; slots: number; share: number }> }> = lbList(dumpMaps(pinned.maps), opts.nodeAddresses ?? pinnedNodeAddresses(pinned));
    const shares = opts.maglev ? maglevShares(pinned) : undefined;
    if (shares) {
      for (const e of entries) {
        const family = e.frontend.startsWith('[') ? 6 : 4;
        const table = shares.get(maglevTableKey(e.revNatId, family));
        if (!table || e.scope !== 'external') continue;
        const total = [...table.values()].reduce((a, b) => a + b, 0);
        e.maglev = [...table].sort((a, b) => a[0] - b[0]).map(([backendId, slots]) => ({ backendId, slots, share: Math.round((10000 * slots) / total) / 100 }));
      }
    }
    if (opts.output === 'json') {
      process.stdout.write(JSON.stringify(entries, null, 2) + '\n');
      return;
    }
    let text = formatLbList(entries);
    if (opts.maglev) {
      const lines = entries.filter((e) => e.maglev).map((e) => `${e.frontend}: ${e.maglev!.map((m) => `backend ${m.backendId} ${m.slots} slots (${m.share}%)`).join(', ')}`);
      text += `\nMAGLEV TABLES (${lines.length})\n${lines.join('\n')}${lines.length ? '\n' : ''}`;
    }
    process.stdout.write(text);
  } finally {
    pinned.close();
  }
}
