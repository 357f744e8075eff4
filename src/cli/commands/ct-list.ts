// `lbctl bpf ct list` and `lbctl bpf nat list`: the tc datapath's flows and
// SNAT translations, read straight from the pinned CT and NAT maps (the
// agent need not run), one line per entry in Cilium's format, or a JSON array.
import { ConfigError } from '../../base/errors.js';
import { openPinnedMaps } from '../../datapath/loader.js';
import { ctLine, decodeCt, natLine, natRecords, type CtRecord } from '../../datapath/ct.js';

export function readCt(bpfRoot: string): CtRecord[] {
  const pinned = openPinnedMaps(bpfRoot);
  try {
    const out: CtRecord[] = [];
    // A SNATed flow's reply entry is in lb*_nat, every other entry in lb*_ct.
    for (const [family, name] of [[4, 'lb4_ct'], [4, 'lb4_nat'], [6, 'lb6_ct'], [6, 'lb6_nat']] as const) {
      let map;
      try {
        map = pinned.get(name);
      } catch (err) {
        if (err instanceof ConfigError) continue; // no tc datapath pinned (--no-nodeport)
        throw err;
      }
      out.push(...decodeCt(family, map.entries()));
    }
    return out;
  } finally {
    pinned.close();
  }
}

export function ctListCommand(opts: { bpfRoot: string; output?: string }): void {
  const records = readCt(opts.bpfRoot);
  process.stdout.write(opts.output === 'json' ? JSON.stringify(records, null, 2) + '\n' : records.map((r) => ctLine(r) + '\n').join(''));
}

export function natListCommand(opts: { bpfRoot: string; output?: string }): void {
  const records = natRecords(readCt(opts.bpfRoot));
  process.stdout.write(opts.output === 'json' ? JSON.stringify(records, null, 2) + '\n' : records.map((r) => natLine(r) + '\n').join(''));
}
