// `lbctl bpf lb list`: every frontend with its backends, read straight from
// the pinned maps (the agent need not run), in `cilium bpf lb list` columns.
import { dumpMaps } from '../../datapath/maps.js';
import { openPinnedMaps } from '../../datapath/loader.js';
import { lbList, type LbListEntry } from '../../datapath/listing.js';

export { lbList, type LbListEntry };

export function formatLbList(entries: readonly LbListEntry[]): string {
  const rows: Array<[string, string]> = [['SERVICE ADDRESS', 'BACKEND ADDRESS (REVNAT_ID) (SLOT)']];
  for (const e of entries) {
    const nullAddr = e.frontend.startsWith('[') ? '[::]:0' : '0.0.0.0:0';
    rows.push([e.frontend, `${nullAddr} (${e.revNatId}) (0) [${e.type}]`]);
    for (const b of e.backends) {
      const state = b.state === 'active' ? '' : ` [${b.state}]`;
      rows.push(['', `${b.address} (${e.revNatId}) (${b.slot})${state}`]);
    }
  }
  const width = Math.max(...rows.map(([a]) => a.length)) + 3;
  return rows.map(([a, b]) => `${a.padEnd(width)}${b}`.trimEnd()).join('\n') + '\n';
}

export function lbListCommand(opts: { bpfRoot: string; output?: string }): void {
  const pinned = openPinnedMaps(opts.bpfRoot);
  try {
    const entries = lbList(dumpMaps(pinned.maps));
    process.stdout.write(opts.output === 'json' ? JSON.stringify(entries, null, 2) + '\n' : formatLbList(entries));
  } finally {
    pinned.close();
  }
}
