// The datapath's per-CPU counters (lb_metrics), summed over CPUs.
import { LbMetric } from './abi.gen.js';

export interface CounterMap {
  readonly valueSize: number;
  lookup(key: Buffer): Buffer | null;
}

/** counter name (lower case, e.g. "xlate_fwd") -> sum over every CPU */
export function sumCounters(map: CounterMap): Record<string, bigint> {
  const stride = Math.ceil(map.valueSize / 8) * 8; // per-CPU values are 8-byte aligned
  const out: Record<string, bigint> = {};
  const key = Buffer.alloc(4);
  for (const [name, index] of Object.entries(LbMetric)) {
    if (name === 'LB_MTR_MAX') continue;
    key.writeUInt32LE(index);
    const v = map.lookup(key);
    let sum = 0n;
    if (v) for (let o = 0; o + 8 <= v.length; o += stride) sum += v.readBigUInt64LE(o);
    out[name.replace(/^LB_MTR_/, '').toLowerCase()] = sum;
  }
  return out;
}
