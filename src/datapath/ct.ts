// The tc datapath's connection tracking (lb*_ct) and SNAT (lb*_nat) as records: what
// `lbctl bpf ct list` and `lbctl bpf nat list` print, in Cilium's line
// format. Pure: decoded entries in, records and lines out.
import { ipFromBytes, uintToIpv4 } from '../lb/addr.js';
import { formatAddr, type Family } from '../lb/types.js';
import { LbCtDir, LbCtFlags, lb4_ct_entry, lb4_ct_key, lb6_ct_entry, lb6_ct_key } from './abi.gen.js';

export interface CtRecord {
  readonly family: Family;
  readonly protocol: string;
  /** ORIG entries are keyed as the client's packet arrives (IN); REPLY as the reply arrives or leaves (OUT). */
  readonly direction: 'IN' | 'OUT';
  readonly source: string;
  readonly destination: string;
  /** Seconds left (negative: expired, waiting for the LRU to reuse it). */
  readonly expiresIn: number;
  readonly revNatId: number;
  readonly backendId: number;
  readonly flags: string[];
  /** ORIG: the backend the flow goes to; REPLY: the frontend replies come from. */
  readonly translatedTo: string;
  /** ORIG: the SNAT source (undefined without SNAT); REPLY: the client replies go to. */
  readonly snat?: string;
}

const PROTO: Record<number, string> = { 6: 'TCP', 17: 'UDP', 132: 'SCTP' };

function flagNames(f: number): string[] {
  const out: string[] = [];
  if (f & LbCtFlags.LB_CT_F_SNAT) out.push('snat');
  if (f & LbCtFlags.LB_CT_F_LOCAL) out.push('local');
  if (f & LbCtFlags.LB_CT_F_SEEN_REPLY) out.push('seen-reply');
  if (f & LbCtFlags.LB_CT_F_FIN_ORIG) out.push('fin-client');
  if (f & LbCtFlags.LB_CT_F_FIN_REPLY) out.push('fin-backend');
  if (f & LbCtFlags.LB_CT_F_CLOSING) out.push('closed');
  if (f & LbCtFlags.LB_CT_F_TIME_WAIT) out.push('time-wait');
  if (f & LbCtFlags.LB_CT_F_HOST) out.push('host');
  if (f & LbCtFlags.LB_CT_F_DSR) out.push('dsr');
  return out;
}

/** The monotonic clock bpf_ktime_get_ns() reads, in seconds. */
export const monotonicSeconds = (): number => Number(process.hrtime.bigint() / 1_000_000_000n);

export function decodeCt(family: Family, entries: Iterable<[Buffer, Buffer]>, now = monotonicSeconds()): CtRecord[] {
  const out: CtRecord[] = [];
  for (const [k, v] of entries) {
    const key = family === 4 ? lb4_ct_key.decode(k) : lb6_ct_key.decode(k);
    const val = family === 4 ? lb4_ct_entry.decode(v) : lb6_ct_entry.decode(v);
    const a = (x: number | Buffer): string => (typeof x === 'number' ? uintToIpv4(x) : ipFromBytes(x));
    const orig = key.dir === LbCtDir.LB_CT_ORIG;
    const snat = orig ? (val.flags & LbCtFlags.LB_CT_F_SNAT ? formatAddr(a(val.addr2), family, val.port2) : undefined) : formatAddr(a(val.addr2), family, val.port2);
    out.push({
      family,
      protocol: PROTO[key.proto] ?? String(key.proto),
      direction: orig ? 'IN' : 'OUT',
      source: formatAddr(a(key.saddr), family, key.sport),
      destination: formatAddr(a(key.daddr), family, key.dport),
      expiresIn: Number(val.expires) - now,
      revNatId: val.revNatIndex,
      backendId: val.backendId,
      flags: flagNames(val.flags),
      translatedTo: formatAddr(a(val.addr1), family, val.port1),
      ...(snat !== undefined ? { snat } : {}),
    });
  }
  return out.sort((x, y) => x.family - y.family || x.source.localeCompare(y.source) || x.destination.localeCompare(y.destination) || x.direction.localeCompare(y.direction));
}

/** `cilium bpf ct list global`'s shape: one line per entry. */
export function ctLine(r: CtRecord): string {
  const xlate = r.direction === 'IN' ? `Backend=${r.translatedTo}` : `Frontend=${r.translatedTo}`;
  const snat = r.snat === undefined ? '' : r.direction === 'IN' ? ` SNAT=${r.snat}` : ` Client=${r.snat}`;
  return `${r.protocol} ${r.direction} ${r.source} -> ${r.destination} expires=${r.expiresIn} RevNAT=${r.revNatId} BackendID=${r.backendId} ${xlate}${snat} Flags=${r.flags.join(',') || '0'}`;
}

export interface NatRecord {
  readonly family: Family;
  readonly protocol: string;
  readonly direction: 'IN' | 'OUT';
  readonly source: string;
  readonly destination: string;
  /** XLATE_SRC for OUT (to the backend's node), XLATE_DST for IN (back to the client). */
  readonly xlate: 'XLATE_SRC' | 'XLATE_DST';
  readonly to: string;
  readonly expiresIn: number;
}

/**
 * The SNAT translations (`cilium bpf nat list`'s shape): for each SNATed
 * flow, its way out (client's source rewritten to ours, towards the backend)
 * and its way in (our port rewritten back to the client).
 */
export function natRecords(ct: readonly CtRecord[]): NatRecord[] {
  const out: NatRecord[] = [];
  for (const r of ct) {
    if (!r.flags.includes('snat') || r.snat === undefined) continue;
    if (r.direction === 'IN') {
      out.push({ family: r.family, protocol: r.protocol, direction: 'OUT', source: r.source, destination: r.translatedTo, xlate: 'XLATE_SRC', to: r.snat, expiresIn: r.expiresIn });
    } else {
      out.push({ family: r.family, protocol: r.protocol, direction: 'IN', source: r.source, destination: r.destination, xlate: 'XLATE_DST', to: r.snat, expiresIn: r.expiresIn });
    }
  }
  return out;
}

export function natLine(r: NatRecord): string {
  return `${r.protocol} ${r.direction} ${r.source} -> ${r.destination} ${r.xlate} ${r.to} expires=${r.expiresIn}`;
}
