// tc attachment through the addon, on a veth in a network namespace of the
// test's own: a clsact filter attached, found, refused a second time unless
// replacing (atomically, to another program), detached; and where the kernel
// has tcx (6.6+), a pinned tcx link at the head. A counting program proves
// each attachment runs on real packets. A filter's program is told by its
// BTF function name, which the kernel keeps whole (its program name keeps 15
// characters).
import { execFileSync } from 'node:child_process';
import { closeSync, mkdirSync, openSync, rmdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import t from 'tap';
import { has, probeFeatures } from '../../src/datapath/features.js';
import { cgroup2Root, ensureBpffs } from '../../src/datapath/loader.js';
import { BpfObject, pinnedLinkInfo, progInfoById, unpin } from '../../src/native/bpf.js';
import { links } from '../../src/native/rtnl.js';
import { tcAttach, tcDetach, tcQuery, tcxAttach, type TcFilter } from '../../src/native/tc.js';
import { ROOT } from '../helpers/sandbox.js';

if (process.getuid?.() !== 0) t.bailout('the native suites need root (network namespaces, BPF): run `make test` as root');

const OBJ = path.join(ROOT, 'bpf/.output/tests/tc_count_test.bpf.o');
const NO_BTF_OBJ = path.join(ROOT, 'bpf/.output/tests/tc_nobtf_test.bpf.o');
const ns = `lbctl-tc-${process.pid}`;
const peer = `lbctl-tcp-${process.pid}`;
const pinRoot = `/sys/fs/bpf/lbctl-tc-${process.pid}`;
const ip = (...args: string[]): string => execFileSync('ip', ['-n', ns, ...args], { encoding: 'utf8' });
execFileSync('ip', ['netns', 'add', ns]);
execFileSync('ip', ['netns', 'add', peer]);
const fd = openSync(`/run/netns/${ns}`, 'r');
ensureBpffs(pinRoot);
mkdirSync(pinRoot, { recursive: true });
const objects: BpfObject[] = [];
t.teardown(() => {
  for (const o of objects) o.close();
  rmSync(pinRoot, { recursive: true, force: true });
  closeSync(fd);
  execFileSync('ip', ['netns', 'del', ns]);
  execFileSync('ip', ['netns', 'del', peer]);
});
// tc1 (under test) here, its peer tc0 in a namespace of its own: pings from there cross tc1's ingress.
ip('link', 'add', 'tc0', 'netns', peer, 'type', 'veth', 'peer', 'name', 'tc1');
execFileSync('ip', ['-n', peer, 'addr', 'add', '192.0.2.1/24', 'dev', 'tc0']);
execFileSync('ip', ['-n', peer, 'link', 'set', 'tc0', 'up']);
ip('addr', 'add', '192.0.2.2/24', 'dev', 'tc1');
ip('link', 'set', 'tc1', 'up');
const ifindex = links(fd).find((l) => l.name === 'tc1')!.index;

async function counter(): Promise<{ obj: BpfObject; progFd: number; progId: number; count: () => bigint }> {
  const obj = BpfObject.open(OBJ);
  objects.push(obj);
  await obj.load();
  const m = obj.map('tc_packets');
  return { obj, progFd: obj.progFd('count_packets'), progId: obj.progInfo('count_packets').id, count: () => m.lookup(Buffer.alloc(4))?.readBigUInt64LE(0) ?? 0n };
}

/** Packets into tc1 (its ingress): UDP datagrams (and the ARP before them) from the peer namespace. */
const SEND = "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); [s.sendto(b'x', ('192.0.2.2', 9)) for _ in range(3)]";
const traffic = (): void => void execFileSync('ip', ['netns', 'exec', peer, 'python3', '-c', SEND], { stdio: 'ignore' });

t.test('clsact: attach, find, refuse a second attach, replace atomically, detach', async (t) => {
  const a = await counter();
  const b = await counter();
  const f: TcFilter = { ifindex, direction: 'ingress', handle: 0x1b1, priority: 1 };
  t.equal(tcQuery(f, fd), 0, 'nothing there before');
  t.same(tcAttach(a.progFd, f, false, fd), { progId: a.progId });
  t.equal(tcQuery(f, fd), a.progId, 'found by handle and priority');
  traffic();
  t.ok(a.count() > 0n, `the filter runs on packets (${a.count()})`);
  t.throws(() => tcAttach(b.progFd, f, false, fd), { code: 'EEXIST' }, 'a second attach without replace is refused');
  t.same(tcAttach(b.progFd, f, true, fd), { progId: b.progId }, 'replace swaps the program');
  const before = a.count();
  traffic();
  t.ok(b.count() > 0n, 'the new program runs');
  t.equal(a.count(), before, 'the old one no longer does');
  tcDetach(f, fd);
  t.equal(tcQuery(f, fd), 0, 'detached');
  t.throws(() => tcDetach(f, fd), { code: 'ENOENT' });
});

t.test("a filter's program by id: the kernel keeps 15 characters of its name, its BTF the whole function name", async (t) => {
  const { obj } = await counter();
  const long = obj.progInfo('lb_nodeport_ingest');
  t.match(long, { name: 'lb_nodeport_ing', funcName: 'lb_nodeport_ingest', type: 3 }, 'a long name: cut by the kernel, whole in the BTF');
  t.match(obj.progInfo('count_packets'), { name: 'count_packets', funcName: 'count_packets' }, 'a short one: the same in both');
  const f: TcFilter = { ifindex, direction: 'egress', handle: 0x1b2, priority: 1 };
  tcAttach(obj.progFd('lb_nodeport_ingest'), f, false, fd);
  t.teardown(() => tcDetach(f, fd));
  t.same(progInfoById(tcQuery(f, fd)), long, "the filter's program by its id: the same, function name included");

  const bare = BpfObject.open(NO_BTF_OBJ);
  objects.push(bare);
  await bare.load();
  const info = bare.progInfo('lb_nodeport_ingress');
  t.equal(info.name, 'lb_nodeport_ing', 'a program loaded without BTF has only the cut name');
  t.notOk('funcName' in info, `and no function name (${JSON.stringify(info)})`);
  t.same(progInfoById(info.id), info, 'by id too');
  t.equal(progInfoById(0x7fffffff), null, 'no program with that id: null');
});

t.test('tcx: a pinned link at the head, detached by unpinning', async (t) => {
  const cg = path.join(cgroup2Root(), `lbctl-tc-${process.pid}`);
  mkdirSync(cg, { recursive: true });
  const features = await probeFeatures({ cgroup: cg, bpfRoot: pinRoot });
  // rmdir, as cgroupfs removes a cgroup: Node 24's recursive rmSync unlinks
  // the entries first, and cgroupfs refuses that for its files (EPERM).
  rmdirSync(cg);
  if (!has(features, 'tcx')) {
    t.throws(() => tcxAttach(0, ifindex, 'ingress', path.join(pinRoot, 'x'), { netnsFd: fd }), 'this kernel has no tcx: the attach fails');
    return;
  }
  const a = await counter();
  const pin = path.join(pinRoot, 'links', 'tcx_ingress');
  const { linkId } = tcxAttach(a.progFd, ifindex, 'ingress', pin, { head: true, netnsFd: fd });
  t.ok(linkId > 0, `link ${linkId}`);
  t.match(pinnedLinkInfo(pin), { id: linkId, progId: a.progId });
  traffic();
  t.ok(a.count() > 0n, `the tcx program runs on packets (${a.count()})`);
  unpin(pin);
  const before = a.count();
  traffic();
  t.equal(a.count(), before, 'unpinned: detached');
});
