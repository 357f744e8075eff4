// The floor of "CPU of one periodic full resync": the least any agent must
// spend to read the maps a resync compares, run by the bench beside lbctl's
// resync figures on the same machine and CPU, against the maps the resync's
// agent left pinned. Each read is every entry of the six maps lbctl writes,
// through the same batch lookup (BpfMap.entriesFlat) and nothing else: no
// decoding, no digest, no comparison, no sync after it. What is left is the
// kernel's walk of the hash tables and the copy out.
//   node --import=@tapjs/typescript/import bench/resync-floor.ts MAPS_DIR READS
// Prints "done {cpuMs: [...], wallMs: [...], entries}" (CPU: user + system of
// this process, each read) and exits.
import path from 'node:path';
import { openPinnedMap } from '../src/native/bpf.js';
import { LB_MAP_NAMES } from '../src/datapath/maps.js';

const [dir, reads] = process.argv.slice(2) as [string, string];
const maps = LB_MAP_NAMES.map((name) => openPinnedMap(path.join(dir, name)));
try {
  const cpuMs: number[] = [];
  const wallMs: number[] = [];
  let entries = 0;
  const round = (x: number): number => Math.round(x * 100) / 100;
  for (let i = 0; i < Number(reads); i++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    entries = 0;
    for (const m of maps) entries += m.entriesFlat().count;
    wallMs.push(round(performance.now() - t0));
    const c = process.cpuUsage(c0);
    cpuMs.push(round((c.user + c.system) / 1000));
  }
  process.stdout.write(`done ${JSON.stringify({ cpuMs, wallMs, entries })}\n`);
} finally {
  for (const m of maps) m.close();
}
