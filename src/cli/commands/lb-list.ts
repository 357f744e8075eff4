// `lbctl bpf lb list`: every frontend with its backends, read straight from
// the pinned maps (the agent need not run), in `cilium bpf lb list` columns.
import { dumpMaps } from '../../datapath/maps.js';
import { openPinnedMaps } from '../../datapath/loader.js';
import { lbList, type LbListEntry, type NodeAddress } from '../../datapath/listing.js';

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

/** `nodeAddresses`: where NodePort surrogates are listed besides 0.0.0.0 and :: (none by default). */
export function lbListCommand(opts: { bpfRoot: string; output?: string; nodeAddresses?: readonly NodeAddress[] }): void {
  const pinned = openPinnedMaps(opts.bpfRoot);
  try {
    const entries = lbList(dumpMaps(pinned.maps), opts.nodeAddresses ?? []);
    process.stdout.write(opts.output === 'json' ? JSON.stringify(entries, null, 2) + '\n' : formatLbList(entries));
  } finally {
    pinned.close();
  }
}
