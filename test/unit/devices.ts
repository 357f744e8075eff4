// Device detection and NodePort addresses (src/datapath/devices.ts), from
// links and addresses as rtnetlink reports them.
import t from 'tap';
import { nodePortAddresses, notViable, parseCidrs, selectDevices, snatSource } from '../../src/datapath/devices.js';
import type { RtnlAddr, RtnlLink, RtnlRoute } from '../../src/native/native.js';

const UP = 0x1 | 0x40; // IFF_UP | IFF_RUNNING
const link = (index: number, name: string, o: Partial<RtnlLink> = {}): RtnlLink => ({ index, name, flags: UP, mtu: 1500, type: 1, kind: '', slaveKind: '', master: 0, operstate: 'up', address: '02:00:00:00:00:01', ...o });
const addr = (index: number, address: string, o: Partial<RtnlAddr> = {}): RtnlAddr => ({ index, family: address.includes(':') ? 6 : 4, address, prefixLen: address.includes(':') ? 64 : 24, scope: 0, flags: 0, ...o });

const links = [
  link(1, 'lo', { flags: UP | 0x8, type: 772 }),
  link(2, 'eth0'),
  link(3, 'eth1', { flags: 0 }),
  link(4, 'veth1', { kind: 'veth' }),
  link(5, 'br0', { kind: 'bridge' }),
  link(6, 'brport', { slaveKind: 'bridge', master: 5 }),
  link(7, 'vxlan0', { kind: 'vxlan' }),
  link(8, 'eth2'),
  link(9, 'bond0', { kind: 'bond' }),
];
const addrs = [
  addr(1, '127.0.0.1', { scope: 254 }),
  addr(2, '192.168.61.1'),
  addr(2, 'fd00:61::1'),
  addr(2, 'fe80::1', { scope: 253 }),
  addr(3, '10.0.3.1'),
  addr(4, '10.0.4.1'),
  addr(5, '10.0.5.1'),
  addr(6, '10.0.6.1'),
  addr(7, '10.0.7.1'),
  addr(8, 'fe80::8', { scope: 253 }),
  addr(8, 'fd00:8::1', { flags: 0x40 }),
  addr(9, '10.0.9.1'),
];

t.test('detected: up, a global address, not loopback, veth, bridge port or tunnel; tunnels beside them', async (t) => {
  const { devices, waiting } = selectDevices(links, addrs);
  t.same(devices.map((d) => [d.name, d.role]), [['eth0', 'nodeport'], ['br0', 'nodeport'], ['vxlan0', 'tunnel'], ['bond0', 'nodeport']],
    'the front doors, and the overlay device for the flows SNATed through it');
  t.same(waiting, []);
  t.same(devices[0]!.addresses, [
    { family: 4, address: '192.168.61.1', prefixLen: 24 },
    { family: 6, address: 'fd00:61::1', prefixLen: 64 },
  ], 'global addresses only: no link-local');
  const why = Object.fromEntries(links.map((l) => [l.name, notViable(l, addrs)]));
  t.same(why, { lo: 'loopback', eth0: undefined, eth1: 'down', veth1: 'a veth without the default route', br0: undefined, brport: 'a bridge port', vxlan0: 'a tunnel (vxlan)', eth2: 'no global address', bond0: undefined });
});

t.test('a veth that carries the default route is the node\'s uplink (kind\'s nodes, as Cilium detects them); other veths are not', async (t) => {
  const route = (oif: number, o: Partial<RtnlRoute> = {}): RtnlRoute => ({ family: 4, table: 254, type: 1, scope: 0, dst: '', dstLen: 0, oif, gateway: '10.0.4.254', prefsrc: '', priority: 0, ...o });
  const def = [route(4)];
  t.same(selectDevices(links, addrs, undefined, def).devices.map((d) => [d.name, d.role]), [['eth0', 'nodeport'], ['veth1', 'nodeport'], ['br0', 'nodeport'], ['vxlan0', 'tunnel'], ['bond0', 'nodeport']]);
  t.equal(notViable(links[3]!, addrs, def), undefined);
  t.equal(notViable(links[3]!, addrs, [route(4, { family: 6, gateway: 'fe80::1' })]), undefined, 'an IPv6 default route counts too');
  t.equal(notViable(links[3]!, addrs, [route(2)]), 'a veth without the default route', 'the default route out of another device does not');
  t.equal(notViable(links[3]!, addrs, [route(4, { dst: '10.9.0.0', dstLen: 16 })]), 'a veth without the default route', 'nor another route');
  t.equal(notViable(links[3]!, addrs, [route(4, { table: 100 })]), 'a veth without the default route', 'nor a default route of another table');
});

t.test('layer-3 tunnels (ipip, sit, ip6tnl, wireguard) are attached as tunnels, marked layer 3; gre and down ones are not', async (t) => {
  const more = [
    ...links,
    link(10, 'tunl0', { kind: 'ipip', type: 768 }),
    link(11, 'wg0', { kind: 'wireguard', type: 65534 }),
    link(12, 'sit1', { kind: 'sit', type: 776 }),
    link(13, 'ip6tnl1', { kind: 'ip6tnl', type: 769 }),
    link(14, 'gre1', { kind: 'gre', type: 778 }),
    link(15, 'tunl1', { kind: 'ipip', type: 768, flags: 0 }),
    link(16, 'gretap1', { kind: 'gretap' }),
  ];
  const { devices } = selectDevices(more, [...addrs, addr(10, '10.244.1.0', { prefixLen: 32 }), addr(11, '10.99.0.1')]);
  t.same(
    devices.filter((d) => d.role === 'tunnel').map((d) => [d.name, d.l3]),
    [['vxlan0', false], ['tunl0', true], ['wg0', true], ['sit1', true], ['ip6tnl1', true], ['gretap1', false]],
    'Ethernet overlays and layer-3 tunnels that are up; not gre (its outer header is built as a link-layer one) nor a tunnel that is down',
  );
  t.equal(devices.find((d) => d.name === 'tunl0')?.snat[4], '10.244.1.0', 'tunl0 SNATs to its own address (Calico\'s IPIP mode gives it one)');
  t.ok(devices.filter((d) => d.role === 'nodeport').every((d) => !d.l3), 'the Ethernet front doors are layer 2');
  t.same(selectDevices(more, addrs, ['wg0']).devices.find((d) => d.name === 'wg0'), { index: 11, name: 'wg0', mtu: 1500, role: 'nodeport', addresses: [], snat: { 4: '192.168.61.1', 6: 'fd00:61::1' }, l3: true },
    'a layer-3 device named by --devices is a front door served by the layer-3 programs');
});

t.test('named: exactly those, whatever their kind; missing or down ones wait, by name; tunnels all the same', async (t) => {
  const { devices, waiting } = selectDevices(links, addrs, ['veth1', 'eth1', 'nope']);
  t.same(devices.map((d) => [d.name, d.role]), [['veth1', 'nodeport'], ['vxlan0', 'tunnel']]);
  t.same(waiting, ['eth1: down', 'nope: no such device in this network namespace']);
});

t.test('NodePort addresses: every global address of the front doors (not tunnels), or those inside --nodeport-addresses', async (t) => {
  const { devices } = selectDevices(links, addrs);
  t.same(nodePortAddresses(devices).map((a) => a.address), ['10.0.5.1', '10.0.9.1', '192.168.61.1', 'fd00:61::1']);
  t.same(nodePortAddresses(devices, parseCidrs('--nodeport-addresses', '192.168.0.0/16, fd00::/8')).map((a) => a.address), ['192.168.61.1', 'fd00:61::1']);
  t.same(nodePortAddresses(devices, parseCidrs('--nodeport-addresses', '172.16.0.0/12')), [], 'nothing matches: no NodePort addresses');
  t.throws(() => parseCidrs('--nodeport-addresses', '10.0.0.0/8,10.1.2.3'), { message: "--nodeport-addresses: '10.1.2.3' is not a CIDR (such as 10.0.0.0/8 or fd00::/64)" });
});

const route = (o: Partial<RtnlRoute>): RtnlRoute => ({ family: 4, table: 254, type: 1, scope: 0, dst: '', dstLen: 0, oif: 2, gateway: '', prefsrc: '', priority: 0, ...o });

t.test('SNAT source: what the kernel would pick, never a secondary, deprecated, tentative or temporary address', async (t) => {
  // eth0 got 10.0.0.5/24 first, then keepalived's 10.0.0.100/24 (a secondary: the kernel lists it
  // after its primary and flags it) and a /32 VIP (a primary of its own subnet, listed after): text order would pick .100.
  const a = [
    addr(2, '10.0.0.5'),
    addr(2, '10.0.0.100', { flags: 0x01 }),
    addr(2, '10.0.0.200', { prefixLen: 32 }),
    addr(2, 'fd00:1::100', { flags: 0x20 }), // deprecated (preferred_lft 0)
    addr(2, 'fd00:1::50', { flags: 0x40 }), // tentative
    addr(2, 'fd00:1::7', { flags: 0x01 }), // temporary (privacy extensions)
    addr(2, 'fd00:1::5'),
    addr(2, 'fe80::5', { scope: 253 }),
  ];
  t.equal(snatSource(2, 4, a), '10.0.0.5', 'IPv4: the primary address, in the kernel\'s order');
  t.equal(snatSource(2, 6, a), 'fd00:1::5', 'IPv6: the first that is neither deprecated, tentative nor temporary');
  t.equal(snatSource(2, 4, a, [route({ dst: '', dstLen: 0, prefsrc: '10.0.0.200' }), route({ dst: '10.9.0.0', dstLen: 16, prefsrc: '10.0.0.5' })]), '10.0.0.200',
    'a route through the device that names its preferred source (src): the default route\'s first');
  t.equal(snatSource(2, 4, a, [route({ dst: '10.9.0.0', dstLen: 16, prefsrc: '10.0.0.200' })]), '10.0.0.200', 'else another route\'s');
  t.equal(snatSource(2, 4, a, [route({ prefsrc: '10.0.0.100' })]), '10.0.0.100', 'a route that names a secondary address as its src is obeyed, as the kernel does');
  t.equal(snatSource(2, 4, a, [route({ prefsrc: '192.0.2.1' })]), '10.0.0.5', 'a src that is no address of the node\'s is not taken');
  t.equal(snatSource(2, 6, a, [route({ family: 6, prefsrc: 'fd00:1::50' })]), 'fd00:1::5', 'nor a tentative one');
  t.equal(snatSource(2, 4, a, [route({ prefsrc: '10.0.0.200', oif: 3 }), route({ prefsrc: '10.0.0.200', table: 100 })]), '10.0.0.5',
    'only the main table\'s routes through this device count');
  t.equal(snatSource(2, 4, a, [route({ dst: '10.0.0.0', dstLen: 24, scope: 253, prefsrc: '10.0.0.200' })]), '10.0.0.5',
    'a route to the device\'s own subnet (scope link) does not count: the kernel names the primary address there');
  const tunnel = [...a, addr(7, '10.244.1.0', { prefixLen: 32 })];
  t.equal(snatSource(7, 4, tunnel), '10.244.1.0', 'a tunnel with an address of its own: that one');
  t.equal(snatSource(9, 4, a), '10.0.0.5', 'a device without one: the lowest-numbered device\'s, as the kernel borrows one');
  t.equal(snatSource(2, 6, [addr(2, '10.0.0.5')]), undefined, 'no address of the family at all: none');
});

t.test('devices carry their SNAT sources; a change of address or route changes them', async (t) => {
  const base = [addr(2, '192.168.61.5'), addr(2, '192.168.61.1', { flags: 0x01 }), addr(2, 'fd00:61::5'), addr(7, '10.0.7.1')];
  const { devices } = selectDevices(links, base);
  t.same(devices.find((d) => d.name === 'eth0')?.snat, { 4: '192.168.61.5', 6: 'fd00:61::5' });
  t.same(devices.find((d) => d.name === 'vxlan0')?.snat, { 4: '10.0.7.1', 6: 'fd00:61::5' }, 'a tunnel without an IPv6 address borrows one');
  const moved = selectDevices(links, base, undefined, [route({ oif: 2, prefsrc: '10.0.7.1' })]).devices;
  t.same(moved.find((d) => d.name === 'eth0')?.snat[4], '10.0.7.1', 'a default route\'s src names another of the node\'s addresses: taken');
});
