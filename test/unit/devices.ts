// Device detection and NodePort addresses (src/datapath/devices.ts), from
// links and addresses as rtnetlink reports them.
import t from 'tap';
import { nodePortAddresses, notViable, parseCidrs, selectDevices } from '../../src/datapath/devices.js';
import type { RtnlAddr, RtnlLink } from '../../src/native/native.js';

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

t.test('detected: up, a global address, not loopback, veth, bridge port or tunnel', async (t) => {
  const { devices, waiting } = selectDevices(links, addrs);
  t.same(devices.map((d) => d.name), ['eth0', 'br0', 'bond0']);
  t.same(waiting, []);
  t.same(devices[0]!.addresses, [
    { family: 4, address: '192.168.61.1', prefixLen: 24 },
    { family: 6, address: 'fd00:61::1', prefixLen: 64 },
  ], 'global addresses only: no link-local');
  const why = Object.fromEntries(links.map((l) => [l.name, notViable(l, addrs)]));
  t.same(why, { lo: 'loopback', eth0: undefined, eth1: 'down', veth1: 'a veth', br0: undefined, brport: 'a bridge port', vxlan0: 'a tunnel (vxlan)', eth2: 'no global address', bond0: undefined });
});

t.test('named: exactly those, whatever their kind; missing or down ones wait, by name', async (t) => {
  const { devices, waiting } = selectDevices(links, addrs, ['veth1', 'eth1', 'nope']);
  t.same(devices.map((d) => d.name), ['veth1']);
  t.same(waiting, ['eth1: down', 'nope: no such device in this network namespace']);
});

t.test('NodePort addresses: every global address, or those inside --nodeport-addresses', async (t) => {
  const { devices } = selectDevices(links, addrs);
  t.same(nodePortAddresses(devices).map((a) => a.address), ['10.0.5.1', '10.0.9.1', '192.168.61.1', 'fd00:61::1']);
  t.same(nodePortAddresses(devices, parseCidrs('--nodeport-addresses', '192.168.0.0/16, fd00::/8')).map((a) => a.address), ['192.168.61.1', 'fd00:61::1']);
  t.same(nodePortAddresses(devices, parseCidrs('--nodeport-addresses', '172.16.0.0/12')), [], 'nothing matches: no NodePort addresses');
  t.throws(() => parseCidrs('--nodeport-addresses', '10.0.0.0/8,10.1.2.3'), { message: "--nodeport-addresses: '10.1.2.3' is not a CIDR (such as 10.0.0.0/8 or fd00::/64)" });
});
