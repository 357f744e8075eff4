// Runs every `test_*` program of bpf/tests/sock_test.c through
// BPF_PROG_TEST_RUN on the real kernel: each returns 0, or the line of its
// first failed check. The object's maps are unpinned (nothing left behind).
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { hasSetRetval } from '../../src/datapath/features.js';
import { BpfObject, progTestRun } from '../../src/native/bpf.js';

// Privileged: as root (make test, CI) these always run; elsewhere they stop loudly.
if (process.getuid?.() !== 0) t.bailout('the BPF suites need root (CAP_BPF, CAP_NET_ADMIN): run `make test` as root');

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
// Kernels without bpf_set_retval (before 5.18) get the tests built as the compat datapath is.
const object = (await hasSetRetval()) ? 'sock_test.bpf.o' : 'sock_compat_test.bpf.o';
t.comment(`object: ${object}`);
const obj = BpfObject.open(path.join(root, 'bpf/.output/tests', object));
t.teardown(() => obj.close());
await obj.load();

// An Ethernet + IPv4 header's worth of bytes: the vehicle needs a packet, not its contents.
const packet = Buffer.alloc(64);
packet.writeUInt16BE(0x0800, 12);

const tests = obj.programNames().filter((n) => n.startsWith('test_'));
// 17 ClusterIP cases, 11 for NodePorts from the node (scopes, surrogate, rev-NAT, post_bind): none may go missing.
t.ok(tests.length >= 28, `found ${tests.length} BPF unit tests`);
// The object includes bpf/sock.c whole: its post_bind programs passed this kernel's verifier with the rest.
t.ok(['lb_post_bind4', 'lb_post_bind6'].every((p) => obj.programNames().includes(p)), 'cgroup/post_bind4 and post_bind6 load');
for (const name of tests) {
  t.test(name.replace(/^test_/, '').replace(/_/g, ' '), async (t) => {
    const r = progTestRun(obj.progFd(name), { data: packet });
    t.equal(r.retval, 0, r.retval === 0 ? 'passed' : `failed at bpf/tests/sock_test.c:${r.retval}`);
  });
}

t.test('random selection reaches every active slot', async (t) => {
  const seen = new Map<number, number>();
  for (let i = 0; i < 40; i++) {
    const { retval } = progTestRun(obj.progFd('pick_one_of_two'), { data: packet });
    seen.set(retval, (seen.get(retval) ?? 0) + 1);
  }
  t.same([...seen.keys()].sort(), [1, 2], `picks: ${JSON.stringify([...seen])}`);
});
