/**
 * Which network devices of this namespace the tc datapath serves, the node
 * addresses NodePorts answer on (issue 14), and the source address a flow
 * SNATed out of each device takes. Pure: links, addresses and routes come
 * from rtnetlink (src/native/rtnl.ts), so the same rules hold under
 * `nsenter --net`, where /sys/class/net shows the host's devices.
 *
 * Two roles. Front doors ('nodeport') carry clients' traffic and the node
 * addresses NodePorts answer on: detected (no --devices) they are up, not
 * loopback, with at least one global address, and neither a veth (unless it
 * carries the default route: kind's nodes), a bridge or bond port, nor a
 * tunnel; named (--devices IF1,IF2) exactly those, each
 * once it exists and is up (a name that is missing is reported, and
 * attached when it appears). Tunnels ('tunnel': vxlan, geneve, ipip,
 * wireguard, ...) that are up are attached too, whatever --devices says: a
 * remote backend behind an overlay is reached through one, and only a
 * program there sees its replies come back to be translated (kube-proxy's
 * conntrack sees every device; lbctl sees those it is attached to).
 */
import ipaddr from 'ipaddr.js';
import type { RtnlAddr, RtnlLink, RtnlRoute } from '../native/native.js';

const IFF_UP = 0x1;
const IFF_LOOPBACK = 0x8;
const RT_SCOPE_UNIVERSE = 0;
/** IPv4: a secondary address (another in the same subnet came first); IPv6: a temporary one (the same bit). */
const IFA_F_SECONDARY = 0x01;
const IFA_F_DADFAILED = 0x08;
const IFA_F_DEPRECATED = 0x20;
const IFA_F_TENTATIVE = 0x40;
const RT_TABLE_MAIN = 254;
const RTN_UNICAST = 1;

/** Link kinds that carry other traffic inside theirs: never a node's front door. */
const TUNNEL_KINDS = new Set(['vxlan', 'geneve', 'gre', 'gretap', 'ip6gre', 'ip6gretap', 'ipip', 'sit', 'ip6tnl', 'erspan', 'ip6erspan', 'vti', 'vti6', 'wireguard', 'tun', 'bareudp', 'gtp']);

export interface DeviceAddress {
  readonly family: 4 | 6;
  readonly address: string;
  readonly prefixLen: number;
}

export type DeviceRole = 'nodeport' | 'tunnel';

export interface Device {
  readonly index: number;
  readonly name: string;
  readonly mtu: number;
  readonly role: DeviceRole;
  /** Global, usable addresses (not tentative, not DAD-failed), sorted by family then text. */
  readonly addresses: readonly DeviceAddress[];
  /** The source address of flows SNATed out of this device, per family (see snatSource()); absent: none to SNAT to. */
  readonly snat: { readonly 4?: string; readonly 6?: string };
  /** A layer-3 device (ipip, sit, ip6tnl, wireguard): its packets start with their IP header (nodeport_l3.bpf.o's programs). */
  readonly l3: boolean;
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

/** The main table has a default route (either family) out of device `index`. */
function hasDefaultRoute(index: number, routes: readonly RtnlRoute[]): boolean {
  return routes.some((r) => r.table === RT_TABLE_MAIN && r.type === RTN_UNICAST && r.dstLen === 0 && r.oif === index);
}

/**
 * Why a link is not a detected device (undefined: it is one). A veth is a
 * pod's or a container's end, except where it carries the default route:
 * the node's own uplink in kind and other nodes-in-containers (a container
 * runtime's eth0 is a veth), as Cilium's detection takes it.
 */
export function notViable(link: RtnlLink, addrs: readonly RtnlAddr[], routes: readonly RtnlRoute[] = []): string | undefined {
  if (link.flags & IFF_LOOPBACK) return 'loopback';
  if (!(link.flags & IFF_UP)) return 'down';
  if (link.kind === 'veth' && !hasDefaultRoute(link.index, routes)) return 'a veth without the default route';
  if (link.slaveKind !== '' || link.master !== 0) return `a ${link.slaveKind || 'master\'s'} port`;
  if (TUNNEL_KINDS.has(link.kind)) return `a tunnel (${link.kind})`;
  if (globalAddresses(addrs, link.index).length === 0) return 'no global address';
  return undefined;
}

/** An address a flow may leave with: global, and neither tentative, DAD-failed, deprecated, nor secondary (IPv4) or temporary (IPv6). */
function snatUsable(a: RtnlAddr): boolean {
  return a.scope === RT_SCOPE_UNIVERSE && (a.flags & (IFA_F_SECONDARY | IFA_F_TENTATIVE | IFA_F_DADFAILED | IFA_F_DEPRECATED)) === 0;
}

/**
 * The source address the kernel gives a flow of `family` routed out of
 * device `index`, as lbctl's SNAT takes it (computed per device, not per
 * destination): the preferred source (`src`) of the main table's routes
 * through the device to other networks (scope global: the kernel's own
 * routes to the device's subnets name its primary address anyway), the
 * default route's first, then the shortest prefix's
 * (any address of the node's the kernel would use: secondary ones too, since
 * a route that names one is obeyed); else the device's first usable address
 * in the kernel's own order (IPv4: its primary address, what
 * inet_select_addr() falls back to; never a secondary, such as a keepalived
 * VIP in the same subnet, whatever its text sorts as; never deprecated,
 * tentative or, IPv6, temporary); else, for a device without one (an
 * unnumbered tunnel), the first usable address of the lowest-numbered device
 * that has one, as the kernel borrows one. Undefined: no address of that
 * family at all.
 */
export function snatSource(index: number, family: 4 | 6, addrs: readonly RtnlAddr[], routes: readonly RtnlRoute[] = []): string | undefined {
  const mine = addrs.filter((a) => a.family === family && a.scope === RT_SCOPE_UNIVERSE);
  const assigned = new Set(mine.filter((a) => (a.flags & (IFA_F_TENTATIVE | IFA_F_DADFAILED)) === 0).map((a) => a.address));
  const preferred = routes
    .filter((r) => r.family === family && r.table === RT_TABLE_MAIN && r.type === RTN_UNICAST && r.scope === RT_SCOPE_UNIVERSE && r.oif === index && r.prefsrc !== '' && assigned.has(r.prefsrc))
    .sort((x, y) => x.dstLen - y.dstLen || x.priority - y.priority)[0];
  if (preferred) return preferred.prefsrc;
  const usable = mine.filter(snatUsable);
  const own = usable.find((a) => a.index === index);
  if (own) return own.address;
  return [...usable].sort((x, y) => x.index - y.index)[0]?.address;
}

export function selectDevices(links: readonly RtnlLink[], addrs: readonly RtnlAddr[], named?: readonly string[], routes: readonly RtnlRoute[] = []): DeviceSelection {
  const device = (l: RtnlLink, role: DeviceRole): Device => {
    const snat4 = snatSource(l.index, 4, addrs, routes);
    const snat6 = snatSource(l.index, 6, addrs, routes);
    return {
      index: l.index,
      name: l.name,
      mtu: l.mtu,
      role,
      addresses: globalAddresses(addrs, l.index),
      snat: { ...(snat4 ? { 4: snat4 } : {}), ...(snat6 ? { 6: snat6 } : {}) },
      l3: ARPHRD_L3.has(l.type),
    };
  };
  const devices: Device[] = [];
  const waiting: string[] = [];
  if (named && named.length > 0) {
    const byName = new Map(links.map((l) => [l.name, l]));
    for (const name of named) {
      const l = byName.get(name);
      if (!l) waiting.push(`${name}: no such device in this network namespace`);
      else if (!(l.flags & IFF_UP)) waiting.push(`${name}: down`);
      else devices.push(device(l, 'nodeport'));
    }
  } else {
    devices.push(...links.filter((l) => notViable(l, addrs, routes) === undefined).map((l) => device(l, 'nodeport')));
  }
  const taken = new Set(devices.map((d) => d.index));
  for (const l of links) if (!taken.has(l.index) && isTunnel(l)) devices.push(device(l, 'tunnel'));
  return { devices: devices.sort((a, b) => a.index - b.index), waiting };
}

const ARPHRD_ETHER = 1;
/**
 * Link types whose packets start with their IP header (include/uapi/linux/
 * if_arp.h): ipip and vti (TUNNEL), ip6tnl (TUNNEL6), sit, and NONE
 * (wireguard, tun). Served by nodeport_l3.bpf.o.
 */
const ARPHRD_L3 = new Set([768, 769, 776, 65534]);
/**
 * Layer-3 tunnels attached: those overlays are made of (Calico's and
 * Flannel's ipip, sit for IPv6 over IPv4, ip6tnl, WireGuard in Calico,
 * Cilium and Flannel). Not gre: one without a fixed remote end builds its
 * outer header as a link-layer header, which its tc egress would see first.
 */
const L3_TUNNEL_KINDS = new Set(['ipip', 'sit', 'ip6tnl', 'wireguard']);

/**
 * An overlay's device, up: attached for the flows SNATed through it (see
 * the file's comment): one that carries Ethernet frames (vxlan, geneve,
 * gretap), or a layer-3 tunnel (L3_TUNNEL_KINDS).
 */
export function isTunnel(link: RtnlLink): boolean {
  if (!(link.flags & IFF_UP) || link.flags & IFF_LOOPBACK) return false;
  return TUNNEL_KINDS.has(link.kind) && (link.type === ARPHRD_ETHER || (L3_TUNNEL_KINDS.has(link.kind) && ARPHRD_L3.has(link.type)));
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
 * front doors (not of tunnels), or with --nodeport-addresses (kube-proxy's
 * semantics) only those inside one of its CIDRs. Sorted, without
 * duplicates.
 */
export function nodePortAddresses(devices: readonly Device[], cidrs: ReadonlyArray<[ipaddr.IPv4 | ipaddr.IPv6, number]> = []): DeviceAddress[] {
  const seen = new Map<string, DeviceAddress>();
  for (const d of devices) {
    if (d.role !== 'nodeport') continue;
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
