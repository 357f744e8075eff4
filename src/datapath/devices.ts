/**
 * Which network devices of this namespace the tc datapath serves, and the
 * node addresses NodePorts answer on (issue 14). Pure: links and addresses
 * come from rtnetlink (src/native/rtnl.ts), so the same rules hold under
 * `nsenter --net`, where /sys/class/net shows the host's devices.
 *
 * Detected (no --devices): up, not loopback, with at least one global
 * address, and neither a veth, a bridge or bond port, nor a tunnel. Named
 * (--devices IF1,IF2): exactly those, each once it exists and is up; a name
 * that is missing is reported, and attached when it appears.
 */
import ipaddr from 'ipaddr.js';
import type { RtnlAddr, RtnlLink } from '../native/native.js';

const IFF_UP = 0x1;
const IFF_LOOPBACK = 0x8;
const RT_SCOPE_UNIVERSE = 0;
const IFA_F_DADFAILED = 0x08;
const IFA_F_TENTATIVE = 0x40;

/** Link kinds that carry other traffic inside theirs: never a node's front door. */
const TUNNEL_KINDS = new Set(['vxlan', 'geneve', 'gre', 'gretap', 'ip6gre', 'ip6gretap', 'ipip', 'sit', 'ip6tnl', 'erspan', 'ip6erspan', 'vti', 'vti6', 'wireguard', 'tun', 'bareudp', 'gtp']);

export interface DeviceAddress {
  readonly family: 4 | 6;
  readonly address: string;
  readonly prefixLen: number;
}

export interface Device {
  readonly index: number;
  readonly name: string;
  readonly mtu: number;
  /** Global, usable addresses (not tentative, not DAD-failed), sorted by family then text. */
  readonly addresses: readonly DeviceAddress[];
}

export interface DeviceSelection {
  readonly devices: readonly Device[];
  /** Named devices that are missing or down, and why: the caller reports them and waits. */
  readonly waiting: readonly string[];
}

function globalAddresses(addrs: readonly RtnlAddr[], index: number): DeviceAddress[] {
  return addrs
    .filter((a) => a.index === index && a.scope === RT_SCOPE_UNIVERSE && (a.flags & (IFA_F_TENTATIVE | IFA_F_DADFAILED)) === 0)
    .map((a) => ({ family: a.family, address: a.address, prefixLen: a.prefixLen }))
    .sort((x, y) => x.family - y.family || x.address.localeCompare(y.address));
}

/** Why a link is not a detected device (undefined: it is one). */
export function notViable(link: RtnlLink, addrs: readonly RtnlAddr[]): string | undefined {
  if (link.flags & IFF_LOOPBACK) return 'loopback';
  if (!(link.flags & IFF_UP)) return 'down';
  if (link.kind === 'veth') return 'a veth';
  if (link.slaveKind !== '' || link.master !== 0) return `a ${link.slaveKind || 'master\'s'} port`;
  if (TUNNEL_KINDS.has(link.kind)) return `a tunnel (${link.kind})`;
  if (globalAddresses(addrs, link.index).length === 0) return 'no global address';
  return undefined;
}

export function selectDevices(links: readonly RtnlLink[], addrs: readonly RtnlAddr[], named?: readonly string[]): DeviceSelection {
  const device = (l: RtnlLink): Device => ({ index: l.index, name: l.name, mtu: l.mtu, addresses: globalAddresses(addrs, l.index) });
  if (named && named.length > 0) {
    const byName = new Map(links.map((l) => [l.name, l]));
    const devices: Device[] = [];
    const waiting: string[] = [];
    for (const name of named) {
      const l = byName.get(name);
      if (!l) waiting.push(`${name}: no such device in this network namespace`);
      else if (!(l.flags & IFF_UP)) waiting.push(`${name}: down`);
      else devices.push(device(l));
    }
    return { devices, waiting };
  }
  const devices = links.filter((l) => notViable(l, addrs) === undefined).map(device).sort((a, b) => a.index - b.index);
  return { devices, waiting: [] };
}

/** A --nodeport-addresses CIDR list, parsed; throws naming the bad entry. */
export function parseCidrs(flag: string, text: string): Array<[ipaddr.IPv4 | ipaddr.IPv6, number]> {
  const out: Array<[ipaddr.IPv4 | ipaddr.IPv6, number]> = [];
  for (const part of text.split(',').map((s) => s.trim()).filter(Boolean)) {
    try {
      out.push(ipaddr.parseCIDR(part));
    } catch {
      throw new Error(`${flag}: '${part}' is not a CIDR (such as 10.0.0.0/8 or fd00::/64)`);
    }
  }
  return out;
}

/**
 * The addresses NodePorts are served on: every global address of the
 * devices, or with --nodeport-addresses (kube-proxy's semantics) only those
 * inside one of its CIDRs. Sorted, without duplicates.
 */
export function nodePortAddresses(devices: readonly Device[], cidrs: ReadonlyArray<[ipaddr.IPv4 | ipaddr.IPv6, number]> = []): DeviceAddress[] {
  const seen = new Map<string, DeviceAddress>();
  for (const d of devices) {
    for (const a of d.addresses) {
      if (cidrs.length > 0) {
        const ip = ipaddr.parse(a.address);
        if (!cidrs.some(([net, bits]) => net.kind() === ip.kind() && ip.match(net, bits))) continue;
      }
      seen.set(`${a.family}/${a.address}`, a);
    }
  }
  return [...seen.values()].sort((x, y) => x.family - y.family || x.address.localeCompare(y.address));
}
