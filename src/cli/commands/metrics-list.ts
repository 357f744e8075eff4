// `lbctl bpf metrics list`: the datapath's per-CPU counters, summed.
import { sumCounters } from '../../datapath/counters.js';
import { openPinnedMaps } from '../../datapath/loader.js';

export function readMetrics(bpfRoot: string): Record<string, bigint> {
  const pinned = openPinnedMaps(bpfRoot);
  try {
    return sumCounters(pinned.get('lb_metrics'));
  } finally {
    pinned.close();
  }
}

export function metricsListCommand(opts: { bpfRoot: string; output?: string }): void {
  const counters = readMetrics(opts.bpfRoot);
  if (opts.output === 'json') {
    process.stdout.write(JSON.stringify(Object.fromEntries(Object.entries(counters).map(([k, v]) => [k, Number(v)])), null, 2) + '\n');
    return;
  }
  const width = Math.max(...Object.keys(counters).map((k) => k.length)) + 3;
  let out = `${'REASON'.padEnd(width)}COUNT\n`;
  for (const [k, v] of Object.entries(counters)) out += `${k.padEnd(width)}${v}\n`;
  process.stdout.write(out);
}
