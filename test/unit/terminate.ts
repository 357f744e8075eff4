// The pure parts of src/datapath/terminate.ts: which backends a sync
// removed, the inet_diag filter, iterator output, cgroup walking, and how a
// kernel without the kfunc is recognised. The kernel side is in
// test/bpf/sock-destroy.ts and test/e2e/udp-destroy.ts.
import t from 'tap';
import { cgroupPids, diagMatch, lacksSockDestroy, parseCookies, removedUdpBackends } from '../../src/datapath/terminate.js';
import { backendKey, type Backend, type L3n4Addr } from '../../src/lb/types.js';

const be = (address: string, port: number, protocol: 'TCP' | 'UDP' = 'UDP', state: Backend['state'] = 'active'): Backend => ({
  address,
  family: address.includes(':') ? 6 : 4,
  port,
  protocol,
  state,
});

t.test('removedUdpBackends: UDP backends that are gone, by address, port and protocol', async (t) => {
  const a = be('10.244.1.1', 53);
  const b = be('10.244.1.2', 53);
  const c = be('10.244.1.3', 53, 'TCP');
  const d = be('fd00::1', 53);
  t.same(removedUdpBackends([a, b, c, d], [b]), [a, d], 'a and d are gone; c is TCP');
  t.same(removedUdpBackends([a, b], [a, b]), [], 'nothing removed');
  t.same(removedUdpBackends([a], [be(a.address, a.port, 'UDP', 'terminating')]), [], 'a terminating backend keeps its sockets');
  t.same(removedUdpBackends([a, a], []), [a], 'each backend once');
  t.same(removedUdpBackends([be('10.244.1.1', 53)], [be('10.244.1.1', 54)]), [a], 'another port is another backend');
});

t.test('parseCookies: one little-endian u64 per destroyed socket', async (t) => {
  const b = Buffer.alloc(16);
  b.writeBigUInt64LE(42n, 0);
  b.writeBigUInt64LE(2n ** 63n + 1n, 8);
  t.same(parseCookies(b), [42n, 2n ** 63n + 1n]);
  t.same(parseCookies(Buffer.alloc(0)), []);
});

t.test('diagMatch: IPv4, IPv6 and IPv4-mapped destinations', async (t) => {
  const wanted = new Map<string, L3n4Addr>([
    [backendKey(be('10.244.1.2', 9000)), be('10.244.1.2', 9000)],
    [backendKey(be('fd00:244::1:2', 9000)), be('fd00:244::1:2', 9000)],
  ]);
  const dst = (bytes: number[]): Buffer => Buffer.concat([Buffer.from(bytes), Buffer.alloc(16 - bytes.length)]);
  const v4 = dst([10, 244, 1, 2]);
  const mapped = dst([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 244, 1, 2]);
  const v6 = Buffer.from('fd000244000000000000000000010002', 'hex');
  t.equal(diagMatch({ family: 2, dst: v4, dport: 9000 }, wanted)?.address, '10.244.1.2', 'AF_INET');
  t.equal(diagMatch({ family: 10, dst: mapped, dport: 9000 }, wanted)?.address, '10.244.1.2', 'AF_INET6, ::ffff:10.244.1.2');
  t.equal(diagMatch({ family: 10, dst: v6, dport: 9000 }, wanted)?.address, 'fd00:244::1:2', 'AF_INET6');
  t.equal(diagMatch({ family: 2, dst: v4, dport: 9001 }, wanted), undefined, 'another port');
  t.equal(diagMatch({ family: 2, dst: dst([10, 244, 1, 3]), dport: 9000 }, wanted), undefined, 'another address');
  t.equal(diagMatch({ family: 10, dst: v4, dport: 9000 }, wanted), undefined, 'the v4 bytes read as IPv6 are another address');
  t.equal(diagMatch({ family: 1, dst: v4, dport: 9000 }, wanted), undefined, 'not inet');
});

t.test('cgroupPids: the cgroup and every cgroup below it', async (t) => {
  const dir = t.testdir({
    'cgroup.procs': '10\n11\n',
    pod1: { 'cgroup.procs': '20\n', c1: { 'cgroup.procs': '30\n' } },
    pod2: { 'cgroup.procs': '' },
  });
  t.same(cgroupPids(dir).sort((a, b) => a - b), [10, 11, 20, 30]);
  t.same(cgroupPids(`${dir}/gone`), [], 'a cgroup removed meanwhile has none');
});

t.test('lacksSockDestroy: libbpf refusing the object for want of the kfunc', async (t) => {
  const log = "libbpf: extern (func ksym) 'bpf_sock_destroy': not found in kernel or module BTFs\nlibbpf: failed to load object";
  t.ok(lacksSockDestroy({ message: 'bpf_object__load: Invalid argument', log }));
  t.notOk(lacksSockDestroy({ message: 'bpf_object__load: Permission denied', log: 'libbpf: prog: -EACCES' }));
  t.notOk(lacksSockDestroy(undefined));
});
