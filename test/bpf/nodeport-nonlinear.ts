// The tc datapath (bpf/nodeport.c) on packets whose headers are not in the
// skb's linear part, as a GRO'd or header-split skb may come: the parse
// pulls them in (np_pull, np6_l4_pull) before it reads them in place, and
// the translation writes them in place. BPF_PROG_TEST_RUN always builds a
// linear skb, so here the packets come through a device: a tap whose
// frames are written with a virtio-net header saying the headers are 14
// bytes long (hdr_len), which tun honours for a frame over a page: the
// Ethernet header in the skb's head, everything after it in page
// fragments. A filter before the datapath records how much was linear
// (np_test_record_headlen). The datapath DNATs a 5,000-byte UDP datagram
// (IPv4; IPv6 with a destination options header before UDP) to a backend
// on this node, and a socket there must receive it whole: the stack checks
// its checksum over all of it, so a wrong incremental update loses it.
//
// Everything happens in a network namespace of the test's own (the tap,
// its addresses and routes, the socket); the programs are attached there
// with clsact filters, and the maps are the test object's own, unpinned.
import { execFileSync } from 'node:child_process';
import { closeSync, existsSync, openSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import {
  lb4_backend, lb4_key, lb6_backend, lb6_key, lb_device, lb_node_addr, lb_node_addr_key, lb_np_config, lb_service, LbMetric, LbSvcType, u32,
} from '../../src/datapath/abi.gen.js';
import { BpfObject } from '../../src/native/bpf.js';
import { links } from '../../src/native/rtnl.js';
import { tcAttach, type TcFilter } from '../../src/native/tc.js';
import { frame, ip4, ip6, IPPROTO_UDP, NEXTHDR_DEST } from '../helpers/packet.js';

if (process.getuid?.() !== 0) t.bailout('the BPF suites need root (CAP_BPF, CAP_NET_ADMIN): run `make test` as root');

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const OBJECT = path.join(ROOT, 'bpf/.output/tests/nodeport_test.bpf.o');
const ns = `lbctl-nl-${process.pid}`;
const TAP_MAC = '02:00:00:00:01:01';
const CLIENT_MAC = '02:00:00:00:00:fe';
const NODE4 = '192.168.50.1';
const NODE6 = 'fd00:50::1';
const CLIENT4 = '10.0.0.5';
const CLIENT6 = 'fd00:c::5';
const BACKEND4 = '10.244.1.2';
const BACKEND6 = 'fd00:244:1::2';
const NODEPORT = 30080;
const BACKEND_PORT = 8080;
const PAYLOAD = 5000;

/**
 * Writes a frame into the tap with a virtio-net header (no checksum offload, no GSO, hdr_len 14) and
 * waits for the datagram at the backend socket: prints what arrived, as JSON.
 */
const TAP_SEND = `
import fcntl, json, os, socket, struct, sys
family, addr, port, frame = sys.argv[1], sys.argv[2], int(sys.argv[3]), bytes.fromhex(sys.argv[4])
s = socket.socket(socket.AF_INET6 if family == '6' else socket.AF_INET, socket.SOCK_DGRAM)
s.bind((addr, port))
s.settimeout(3)
fd = os.open('/dev/net/tun', os.O_RDWR)
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
fcntl.ioctl(fd, 0x400454ca, struct.pack('16sH', b'tap0', IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
os.write(fd, struct.pack('<BBHHHH', 0, 0, 14, 0, 0, 0) + frame)
try:
    data, src = s.recvfrom(65536)
    print(json.dumps({'len': len(data), 'ok': data == bytes(range(256)) * (len(data) // 256) + bytes(range(len(data) % 256)), 'src': src[0], 'sport': src[1]}))
except socket.timeout:
    print(json.dumps({'len': 0}))
`;

// The tap driver's device node, made where /dev lacks it (a vmtest guest's devtmpfs has the nodes of the
// drivers loaded only): its first open loads the driver (char-major-10-200) through the kernel's modprobe.
if (!existsSync('/dev/net/tun')) execFileSync('sh', ['-c', 'mkdir -p /dev/net && mknod /dev/net/tun c 10 200']);

const nsIp = (...args: string[]): string => execFileSync('ip', ['-n', ns, ...args], { encoding: 'utf8' });
execFileSync('ip', ['netns', 'add', ns]);
const netnsFd = openSync(`/run/netns/${ns}`, 'r');
const objects: BpfObject[] = [];
t.teardown(() => {
  for (const o of objects) o.close();
  closeSync(netnsFd);
  execFileSync('ip', ['netns', 'del', ns]);
});

nsIp('link', 'set', 'lo', 'up');
// a node forwards (bpf_fib_lookup answers only then): the namespace's own settings
execFileSync('ip', ['netns', 'exec', ns, 'sh', '-c', 'echo 1 > /proc/sys/net/ipv4/conf/all/forwarding && echo 1 > /proc/sys/net/ipv6/conf/all/forwarding']);
nsIp('tuntap', 'add', 'dev', 'tap0', 'mode', 'tap', 'vnet_hdr');
nsIp('link', 'set', 'tap0', 'address', TAP_MAC);
nsIp('link', 'set', 'tap0', 'up');
nsIp('addr', 'add', `${NODE4}/24`, 'dev', 'tap0');
nsIp('-6', 'addr', 'add', `${NODE6}/64`, 'dev', 'tap0', 'nodad');
// the backend: an address of this node (the FIB says local: DNAT only, up the stack)
nsIp('addr', 'add', `${BACKEND4}/32`, 'dev', 'lo');
nsIp('-6', 'addr', 'add', `${BACKEND6}/128`, 'dev', 'lo', 'nodad');
// the clients behind the tap (a reverse path for them)
nsIp('route', 'add', '10.0.0.0/24', 'dev', 'tap0');
nsIp('-6', 'route', 'add', 'fd00:c::/64', 'dev', 'tap0');
const tap = links(netnsFd).find((l) => l.name === 'tap0')!.index;

/** A destination option the receiver skips (type 0x1e: action bits 00), 18 bytes of data: no run of padding over 7 bytes, which Linux refuses. */
const DEST_OPTION = { type: NEXTHDR_DEST, body: Buffer.concat([Buffer.from([0x1e, 18]), Buffer.alloc(18, 0xab)]) };
const payload = Buffer.from(Array.from({ length: PAYLOAD }, (_, i) => i % 256));

t.test('headers in page fragments: pulled in, translated in place, the datagram delivered whole', async (t) => {
  const obj = BpfObject.open(OBJECT);
  objects.push(obj);
  await obj.load();
  const config = lb_np_config.decode(Buffer.alloc(lb_np_config.size));
  obj.map('lb_np_config').update(u32.encode(0), lb_np_config.encode({ ...config, nodeportMin: 30000, nodeportMax: 32767, snatMin: 61000, snatMax: 65535, snatRetries: 16 }));
  for (const [family, a] of [[4, NODE4], [6, NODE6]] as const) {
    const address = Buffer.alloc(16);
    if (family === 4) address.writeUInt32BE(ip4(a));
    else ip6(a).copy(address);
    obj.map('lb_node_addrs').update(lb_node_addr_key.encode({ address, family }), lb_node_addr.encode({ ifindex: tap, flags: 0 }));
  }
  obj.map('lb_devices').update(u32.encode(tap), lb_device.encode({ addr4: ip4(NODE4), addr6: ip6(NODE6), mtu: 1500, flags: 0 }));
  // NodePort surrogates (0.0.0.0 and ::), UDP, one backend each
  const master = (revNat: number): Buffer => lb_service.encode({ backendId: 0, revNatIndex: revNat, affinityTimeout: 0, count: 1, qcount: 0, type: LbSvcType.LB_SVC_NODEPORT, flags: 0 });
  const slot = (id: number): Buffer => lb_service.encode({ backendId: id, revNatIndex: 0, affinityTimeout: 0, count: 0, qcount: 0, type: LbSvcType.LB_SVC_NONE, flags: 0 });
  obj.map('lb4_backends').update(u32.encode(1), lb4_backend.encode({ address: ip4(BACKEND4), port: BACKEND_PORT, proto: IPPROTO_UDP, state: 0 }));
  obj.map('lb4_services').update(lb4_key.encode({ address: 0, dport: NODEPORT, backendSlot: 1, proto: IPPROTO_UDP, scope: 0 }), slot(1));
  obj.map('lb4_services').update(lb4_key.encode({ address: 0, dport: NODEPORT, backendSlot: 0, proto: IPPROTO_UDP, scope: 0 }), master(1));
  obj.map('lb6_backends').update(u32.encode(2), lb6_backend.encode({ address: ip6(BACKEND6), port: BACKEND_PORT, proto: IPPROTO_UDP, state: 0 }));
  obj.map('lb6_services').update(lb6_key.encode({ address: Buffer.alloc(16), dport: NODEPORT, backendSlot: 1, proto: IPPROTO_UDP, scope: 0 }), slot(2));
  obj.map('lb6_services').update(lb6_key.encode({ address: Buffer.alloc(16), dport: NODEPORT, backendSlot: 0, proto: IPPROTO_UDP, scope: 0 }), master(2));

  const filter = (priority: number): TcFilter => ({ ifindex: tap, direction: 'ingress', handle: 1, priority });
  tcAttach(obj.progFd('np_test_record_headlen'), filter(1), false, netnsFd);
  tcAttach(obj.progFd('lb_nodeport_ingress'), filter(2), false, netnsFd);
  const headlen = (): number => obj.map('np_test_headlen').lookup(u32.encode(0))!.readUInt32LE(0);
  const fwd = (): bigint => {
    const v = obj.map('lb_metrics').lookup(u32.encode(LbMetric.LB_MTR_NP_FWD));
    let sum = 0n;
    for (let o = 0; v && o + 8 <= v.length; o += 8) sum += v.readBigUInt64LE(o);
    return sum;
  };

  const cases = [
    ['IPv4', '4', BACKEND4, frame({ src: CLIENT4, dst: NODE4, proto: 'udp', sport: 40000, dport: NODEPORT, payload, srcMac: CLIENT_MAC, dstMac: TAP_MAC }), CLIENT4],
    ['IPv6, a destination options header before UDP', '6', BACKEND6, frame({ src: CLIENT6, dst: NODE6, proto: 'udp', sport: 40000, dport: NODEPORT, payload, srcMac: CLIENT_MAC, dstMac: TAP_MAC, ext: [DEST_OPTION] }), CLIENT6],
  ] as const;
  for (const [what, family, backend, input, client] of cases) {
    const before = fwd();
    const out = execFileSync('ip', ['netns', 'exec', ns, 'python3', '-c', TAP_SEND, family, backend, String(BACKEND_PORT), input.toString('hex')], { encoding: 'utf8' });
    const got = JSON.parse(out) as { len: number; ok?: boolean; src?: string; sport?: number };
    t.equal(headlen(), 14, `${what}: the skb held only the Ethernet header in its linear part`);
    t.equal(fwd() - before, 1n, `${what}: translated (NP_FWD)`);
    t.match(got, { len: PAYLOAD, ok: true, src: client, sport: 40000 }, `${what}: the backend received all ${PAYLOAD} bytes from the client (checksum verified by its stack)`);
  }
});
