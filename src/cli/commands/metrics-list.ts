// `lbctl bpf metrics list`: the datapath's per-CPU counters, summed.
import { LbMetric } from '../../datapath/abi.gen.js';
import { openPinnedMaps } from '../../datapath/loader.js';

export function readMetrics(bpfRoot: string): Record<string, bigint> {
  const pinned = openPinnedMaps(bpfRoot);
  try {
    const m = pinned.get('lb_metrics');
    const stride = Math.ceil(m.valueSize / 8) * 8; // per-CPU values are 8-byte aligned
    const out: Record<string, bigint> = {};
    for (const [name, index] of Object.entries(LbMetric)) {
      if (name === 'LB_MTR_MAX') continue;
      const key = Buffer.alloc(4);
      key.writeUInt32LE(index);
      const v = m.lookup(key);
      let sum = 0n;
      if (v) for (let o = 0; o + 8 <= v.length; o += stride) sum += v.readBigUInt64LE(o);
      out[name.replace(/^LB_MTR_/, '').toLowerCase()] = sum;
    }
    return out;
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
