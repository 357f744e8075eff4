// The pure parts of src/datapath/terminate.ts: which backends a sync
// removed, the inet_diag filter, iterator output, cgroup walking, how a
// kernel without the kfunc is recognised, and how terminations queue. The kernel side is in
// test/bpf/sock-destroy.ts and test/e2e/udp-destroy.ts.
import t from 'tap';
import { cgroupPids, diagMatch, lacksSockDestroy, parseCookies, removedUdpBackends, TerminationQueue } from '../../src/datapath/terminate.js';
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
  const all = await cgroupPids(dir);
  t.same(all.pids.sort((a, b) => a - b), [10, 11, 20, 30]);
  t.equal(all.more, false);
  t.same(await cgroupPids(`${dir}/gone`), { pids: [], more: false }, 'a cgroup removed meanwhile has none');
  const some = await cgroupPids(dir, 3);
  t.equal(some.pids.length, 3, 'at most max pids');
  t.equal(some.more, true, 'and it says there were more');
});

t.test('lacksSockDestroy: libbpf refusing the object for want of the kfunc', async (t) => {
  const log = "libbpf: extern (func ksym) 'bpf_sock_destroy': not found in kernel or module BTFs\nlibbpf: failed to load object";
  t.ok(lacksSockDestroy({ message: 'bpf_object__load: Invalid argument', log }));
  t.notOk(lacksSockDestroy({ message: 'bpf_object__load: Permission denied', log: 'libbpf: prog: -EACCES' }));
  t.notOk(lacksSockDestroy(undefined));
});

/** A run the test finishes by hand: what each run was given, and a way to end it. */
function fakeRuns() {
  const runs: Array<{ wanted: Map<string, L3n4Addr>; keys: string[]; finish: (n: number) => void }> = [];
  const queue = new TerminationQueue<number>(
    (wanted) =>
      new Promise<number>((finish) => {
        runs.push({ wanted, keys: [...wanted.values()].map((b) => b.address).sort(), finish });
      }),
  );
  return { queue, runs };
}
const tick = (): Promise<void> => new Promise((r) => setImmediate(r));

t.test('TerminationQueue: one run at a time; what is removed meanwhile waits and joins the next run', async (t) => {
  const { queue, runs } = fakeRuns();
  const [a, b, c, d] = ['10.244.1.1', '10.244.1.2', '10.244.1.3', '10.244.1.4'].map((x) => be(x, 53));
  const first = queue.add([a!, be('10.244.1.9', 53, 'TCP')], []);
  t.ok(first, 'the first removal starts a run and gets its result');
  await tick();
  t.equal(runs.length, 1);
  t.same(runs[0]!.keys, ['10.244.1.1'], 'UDP backends only');
  t.ok(queue.busy);

  const second = queue.add([b!], []);
  t.ok(second, 'a removal while a run is in progress queues the next run');
  t.equal(queue.add([c!], []), undefined, 'a further one joins that queued run (reported once, by the run)');
  await tick();
  t.equal(runs.length, 1, 'the next run waits for the one in progress');

  runs[0]!.finish(1);
  t.equal(await first, 1, 'the first caller gets the first run');
  await tick();
  t.equal(runs.length, 2);
  t.same(runs[1]!.keys, ['10.244.1.2', '10.244.1.3'], 'the backends removed meanwhile, in one run');
  const third = queue.add([d!], [b!]);
  t.ok(third, 'a removal during the second run queues a third');
  t.same([...runs[1]!.wanted.values()].map((x) => x.address), ['10.244.1.3'], 'a backend back in the maps leaves the run in progress');
  runs[1]!.finish(2);
  t.equal(await second, 2);
  await tick();
  t.same(runs[2]!.keys, ['10.244.1.4']);
  runs[2]!.finish(3);
  t.equal(await third, 3);
  await queue.idle();
  t.notOk(queue.busy, 'idle again');
  t.equal(queue.add([], [a!, b!]), undefined, 'nothing removed, nothing waiting: no run');
  t.equal(runs.length, 3);
});

t.test('TerminationQueue: a backend that comes back before its run starts is not terminated', async (t) => {
  const { queue, runs } = fakeRuns();
  const [a, b] = ['10.244.1.1', '10.244.1.2'].map((x) => be(x, 53));
  const first = queue.add([a!], []);
  await tick();
  const second = queue.add([b!], []);
  queue.add([], [be(b!.address, 53, 'UDP', 'terminating')]); // b is in the maps again
  runs[0]!.finish(1);
  await first;
  t.equal(await second, undefined, 'the queued run had nothing left: it does not run');
  t.equal(runs.length, 1);
});

t.test('TerminationQueue: stop() starts no further run', async (t) => {
  const { queue, runs } = fakeRuns();
  const first = queue.add([be('10.244.1.1', 53)], []);
  await tick();
  const second = queue.add([be('10.244.1.2', 53)], []);
  queue.stop();
  t.equal(queue.add([be('10.244.1.3', 53)], []), undefined, 'nothing is queued after stop()');
  runs[0]!.finish(1);
  t.equal(await first, 1, 'the run in progress finishes');
  t.equal(await second, undefined, 'the queued one does not run');
  await queue.idle();
  t.equal(runs.length, 1);
});
