// Stale connected UDP sockets (bpf/sock_destroy.c, src/datapath/terminate.ts)
// on the real kernel, without the agent:
//   - the filter's helpers through BPF_PROG_TEST_RUN (bpf/tests/sock_destroy_test.c);
//   - which mechanism this kernel gets, and why;
//   - each mechanism against real sockets held by a process in a child
//     cgroup and a network namespace of this test: exactly the connected UDP
//     sockets with a rev-NAT entry for a removed backend are destroyed
//     (ECONNABORTED), nothing else;
//   - each bound of a run stops it and is reported;
//   - a sock_diag socket (every kernel) and a socket iterator (6.5+; before
//     that, its object must be refused) reach only the namespace they were
//     made in;
//   - the iterator's context struct has the running kernel's layout.
// Every test proves something on each kernel it runs on: where the kernel
// lacks bpf_sock_destroy (6.1), what runs instead (inet_diag) is exercised.
// Everything runs in namespaces and a cgroup this file creates and removes.
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, rmdirSync } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';
import { cgroup2Root } from '../../src/datapath/loader.js';
import { lb4_sock_key, lb4_sock_revnat, lb6_sock_key, lb6_sock_revnat } from '../../src/datapath/abi.gen.js';
import { ipv4ToUint, ipv6Bytes } from '../../src/lb/addr.js';
import { lacksSockDestroy, parseCookies, SOCK_DESTROY_OBJECT, UdpTerminator, type UdpTerminationMechanism } from '../../src/datapath/terminate.js';
import { BpfObject, inetDiagDestroy, inetDiagDump, iterRun, progTestRun, type BpfMap } from '../../src/native/bpf.js';
import type { L3n4Addr } from '../../src/lb/types.js';

// Privileged: as root (make test, CI) these always run; elsewhere they stop loudly.
if (process.getuid?.() !== 0) t.bailout('the BPF suites need root (CAP_BPF, CAP_NET_ADMIN): run `make test` as root');

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const unit = BpfObject.open(path.join(root, 'bpf/.output/tests/sock_destroy_test.bpf.o'));
t.teardown(() => unit.close());
await unit.load();
const detected = await UdpTerminator.detect();

const packet = Buffer.alloc(64);
packet.writeUInt16BE(0x0800, 12);

t.test('filter helpers (BPF_PROG_TEST_RUN)', async (t) => {
  const tests = unit.programNames().filter((n) => n.startsWith('test_'));
  t.ok(tests.length >= 7, `found ${tests.length} BPF unit tests`);
  for (const name of tests) {
    const r = progTestRun(unit.progFd(name), { data: packet });
    t.equal(r.retval, 0, r.retval === 0 ? name : `${name} failed at bpf/tests/sock_destroy_test.c:${r.retval}`);
  }
});

// ------------------------------------------------------------ the world

const run = `lbctl-test-sd-${process.pid}`;
const cgroup = path.join(cgroup2Root(), run);
const nsA = `${run}-a`;
const nsB = `${run}-b`;
const holders = new Set<ChildProcess>();

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

let tornDown = false;
function teardown(): void {
  if (tornDown) return;
  tornDown = true;
  for (const h of holders) {
    try {
      if (h.exitCode === null && h.pid) process.kill(h.pid, 'SIGKILL');
    } catch {
      /* already gone */
    }
  }
  for (const ns of [nsA, nsB]) if (existsSync(`/run/netns/${ns}`)) ip('netns', 'del', ns);
  for (let i = 0; i < 50 && existsSync(cgroup); i++) {
    try {
      rmdirSync(cgroup);
    } catch {
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50); // the holders are still exiting
    }
  }
}
t.teardown(teardown);
process.on('exit', teardown);

mkdirSync(cgroup);
for (const ns of [nsA, nsB]) {
  ip('netns', 'add', ns);
  ip('-n', ns, 'link', 'set', 'lo', 'up');
  ip('-n', ns, 'link', 'add', 'sd0', 'type', 'veth', 'peer', 'name', 'sd1');
  ip('-n', ns, 'addr', 'add', '10.244.0.1/16', 'dev', 'sd0');
  ip('-n', ns, 'addr', 'add', 'fd00:244::1/64', 'dev', 'sd0', 'nodad');
  ip('-n', ns, 'link', 'set', 'sd0', 'up');
  ip('-n', ns, 'link', 'set', 'sd1', 'up');
}

// Holds named UDP sockets; prints their cookies, then on "check" how a
// recv() on each ends without waiting (ECONNABORTED once destroyed, EAGAIN
// otherwise: nothing pending). A destroy is done when the call that made it
// returns, so there is nothing to wait for before looking.
const HOLDER = String.raw`
import errno, json, socket, sys
SPEC = json.loads(sys.argv[1])
socks = {}
for name, (fam, host, port) in SPEC.items():
    s = socket.socket(socket.AF_INET6 if fam == 6 else socket.AF_INET, socket.SOCK_DGRAM)
    if host is None:
        s.bind(("::" if fam == 6 else "0.0.0.0", 0))
    else:
        s.connect((host, port))
    socks[name] = s
cookies = {n: str(int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 57, 8), "little")) for n, s in socks.items()}
print(json.dumps(cookies), flush=True)
for line in sys.stdin:
    out = {}
    for n, s in socks.items():
        s.setblocking(False)
        try:
            s.recv(100)
            out[n] = "data"
        except OSError as e:
            out[n] = errno.errorcode.get(e.errno, "?") if e.errno else type(e).__name__
    print(json.dumps(out), flush=True)
`;

type Spec = Record<string, [4 | 6, string | null, number]>;

interface Holder {
  readonly cookies: Record<string, bigint>;
  check(): Promise<Record<string, string>>;
}

/** A socket holder in `ns`, inside the test cgroup or not. */
async function holder(ns: string, inCgroup: boolean, spec: Spec): Promise<Holder> {
  const script = `${inCgroup ? 'echo $$ > "$1/cgroup.procs" && ' : ''}exec ip netns exec "$2" python3 -c "$3" "$4"`;
  const proc = spawn('sh', ['-c', script, 'sh', cgroup, ns, HOLDER, JSON.stringify(spec)], { stdio: ['pipe', 'pipe', 'inherit'] });
  holders.add(proc);
  const lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
  const next = async (): Promise<Record<string, string>> => {
    const r = await lines.next();
    if (r.done) throw new Error('the socket holder exited');
    return JSON.parse(r.value) as Record<string, string>;
  };
  const cookies = Object.fromEntries(Object.entries(await next()).map(([k, v]) => [k, BigInt(v)]));
  return {
    cookies,
    check: async () => {
      proc.stdin!.write('check\n');
      return next();
    },
  };
}

const REMOVED4 = '10.244.1.2';
const STAYING4 = '10.244.1.3';
const REMOVED6 = 'fd00:244::1:2';
const PORT = 9000;

const SPEC: Spec = {
  balanced: [4, REMOVED4, PORT], // lbctl sent it there: destroyed
  direct: [4, REMOVED4, PORT], // dialled the address itself (no rev-NAT entry): kept
  otherPort: [4, REMOVED4, PORT + 1], // a port that stays: kept
  staying: [4, STAYING4, PORT], // a backend that stays: kept
  mapped: [6, `::ffff:${REMOVED4}`, PORT], // IPv4-mapped on an AF_INET6 socket: destroyed
  v6: [6, REMOVED6, PORT], // destroyed
  unconnected: [4, null, 0], // kept
};
const DESTROYED = ['balanced', 'mapped', 'v6'];

const revNat = { 4: unit.map('lb4_sock_revnat'), 6: unit.map('lb6_sock_revnat') };

function v4Key(cookie: bigint, address: string, port: number): Buffer {
  return lb4_sock_key.encode({ cookie, address: ipv4ToUint(address), port });
}
function v6Key(cookie: bigint, address: string, port: number): Buffer {
  return lb6_sock_key.encode({ cookie, address: ipv6Bytes(address), port });
}

/** What connect4/6 would have recorded for the sockets lbctl balanced. */
function recordRevNat(h: Holder): Array<[BpfMap, Buffer, string]> {
  const v4 = lb4_sock_revnat.encode({ address: ipv4ToUint('10.96.0.20'), port: 53, revNatIndex: 1 });
  const v6 = lb6_sock_revnat.encode({ address: ipv6Bytes('fd00:96::20'), port: 53, revNatIndex: 1 });
  const c = h.cookies;
  const entries: Array<[BpfMap, Buffer, string]> = [
    [revNat[4], v4Key(c.balanced!, REMOVED4, PORT), 'balanced'],
    [revNat[4], v4Key(c.otherPort!, REMOVED4, PORT + 1), 'otherPort'],
    [revNat[4], v4Key(c.staying!, STAYING4, PORT), 'staying'],
    [revNat[4], v4Key(c.mapped!, REMOVED4, PORT), 'mapped'],
    [revNat[6], v6Key(c.v6!, REMOVED6, PORT), 'v6'],
  ];
  for (const [map, key] of entries) map.update(key, map === revNat[4] ? v4 : v6);
  return entries;
}

const removed: L3n4Addr[] = [
  { address: REMOVED4, family: 4, port: PORT, protocol: 'UDP' },
  { address: REMOVED6, family: 6, port: PORT, protocol: 'UDP' },
  { address: STAYING4, family: 4, port: PORT, protocol: 'TCP' }, // not UDP: ignored
];

async function exercise(t: Test, mechanism: UdpTerminationMechanism): Promise<void> {
  const inCgroup = await holder(nsA, true, SPEC);
  // Same sockets in a namespace no process of the cgroup lives in, with
  // rev-NAT entries too: out of scope, kept.
  const outside = await holder(nsB, false, { balanced: [4, REMOVED4, PORT] });
  const entries = recordRevNat(inCgroup);
  revNat[4].update(v4Key(outside.cookies.balanced!, REMOVED4, PORT), Buffer.alloc(lb4_sock_revnat.size));

  const term = await UdpTerminator.open({ revNat, cgroup, mechanism });
  t.teardown(() => term.close());
  t.equal(term.mechanism, mechanism, `mechanism ${term.mechanism}: ${term.detection.reason}`);

  const r = await term.destroyConnectedTo(removed);
  t.comment(`mechanism ${r.mechanism}: ${r.destroyed} destroyed in ${r.netns} netns, ${r.ms} ms`);
  t.same(r.errors, [], 'no errors');
  t.equal(r.limit, undefined, 'no bound hit');
  t.equal(r.backends, 2, 'the two UDP backends were looked for (the TCP one is ignored)');
  t.equal(r.netns, 1, "one network namespace searched: the cgroup's process's");
  const want = DESTROYED.map((n) => String(inCgroup.cookies[n])).sort();
  t.same([...r.cookies].sort(), want, `destroyed exactly ${DESTROYED.join(', ')}`);

  const seen = await inCgroup.check();
  for (const [name, outcome] of Object.entries(seen)) {
    if (DESTROYED.includes(name)) t.equal(outcome, 'ECONNABORTED', `${name}: recv() fails with ECONNABORTED`);
    else t.equal(outcome, 'EAGAIN', `${name}: untouched (recv() would wait)`);
  }
  t.equal((await outside.check()).balanced, 'EAGAIN', 'the socket in a namespace outside the cgroup is untouched');

  for (const [map, key, name] of entries) {
    const present = map.lookup(key) !== null;
    t.equal(present, !DESTROYED.includes(name), `${name}: rev-NAT entry ${DESTROYED.includes(name) ? 'removed with the socket' : 'kept'}`);
  }
  const again = await term.destroyConnectedTo(removed);
  t.equal(again.destroyed, 0, 'a second run finds nothing left to destroy');
  for (const m of [revNat[4], revNat[6]]) for (const k of m.keys()) m.delete(k);
}

t.test('addon argument and lookup errors', async (t) => {
  await t.rejects(inetDiagDestroy(2, 17, [Buffer.alloc(3)]), { code: 'EINVAL', op: 'argument' }, 'an inet_diag_sockid is 48 bytes');
  t.same(await inetDiagDestroy(2, 17, [Buffer.alloc(48), Buffer.alloc(48)]), [2, 2], 'an id that names no socket: ENOENT, one errno per id');
  t.throws(() => BpfObject.open(SOCK_DESTROY_OBJECT, { reuseMaps: { no_such_map: revNat[4].fd } }), { code: 'ENOENT', op: 'bpf_map__reuse_fd' }, 'reuseMaps names a map of the object');
  t.throws(() => unit.runIter('test_connected_udp_to_removed_backend_matches'), /bpf_program__attach_iter/, 'runIter needs an iterator program');
  await t.rejects(iterRun(unit.progFd('test_connected_udp_to_removed_backend_matches')), { message: /bpf_link_create\(BPF_TRACE_ITER\)/ }, 'iterRun needs an iterator program too');
  await t.rejects(iterRun(-1), { code: 'EINVAL', op: 'argument' }, 'iterRun needs a program fd');
});

const btfText = (file: string): string => execFileSync('bpftool', ['btf', 'dump', 'file', file], { encoding: 'utf8', maxBuffer: 1 << 30 });

/**
 * A struct's size and members (name@bits_offset) as `bpftool btf dump`
 * prints them; undefined when absent. The kernel's pointer members are
 * anonymous unions (__bpf_md_ptr): their names print as "(anon)" and are
 * compared by offset only.
 */
function structLayout(btf: string, name: string, namesLike?: string): string | undefined {
  const m = new RegExp(`STRUCT '${name}' size=(\\d+) vlen=\\d+\n((?:\t.*\n?)*)`).exec(btf);
  if (!m) return undefined;
  const like = namesLike?.split(' ').slice(2);
  const members = [...m[2]!.matchAll(/'([^']*)' type_id=\d+ bits_offset=(\d+)/g)].map((x, i) =>
    like?.[i]?.startsWith('(anon)@') ? `(anon)@${x[2]}` : `${x[1]}@${x[2]}`,
  );
  return `size ${m[1]}: ${members.join(' ')}`;
}

t.test("the iterator's context struct has the kernel's layout", async (t) => {
  const kernel = btfText('/sys/kernel/btf/vmlinux');
  const ours = btfText(SOCK_DESTROY_OBJECT);
  // (bpf_iter_meta is only a forward declaration in the object's BTF: the
  // program reads just its first member, seq, at offset 0.)
  const want = structLayout(kernel, 'bpf_iter__udp');
  t.ok(want, `the kernel's BTF has struct bpf_iter__udp (${want})`);
  t.equal(structLayout(ours, 'bpf_iter__udp', want), want, "bpf/sock_destroy.c's struct bpf_iter__udp has the same size and member offsets");
});

t.test('this kernel: bpf_sock_destroy if present, else inet_diag', async (t) => {
  t.comment(`detected ${detected.mechanism}: ${detected.reason}`);
  const btf = btfText('/sys/kernel/btf/vmlinux');
  const hasKfunc = /FUNC 'bpf_sock_destroy'/.test(btf);
  t.equal(detected.mechanism, hasKfunc ? 'bpf-sock-destroy' : 'inet-diag', `vmlinux BTF ${hasKfunc ? 'has' : 'lacks'} bpf_sock_destroy`);
  if (!hasKfunc) {
    const obj = BpfObject.open(SOCK_DESTROY_OBJECT);
    await t.rejects(obj.load().catch((err) => Promise.reject(lacksSockDestroy(err) ? new Error('kfunc missing') : err)), { message: 'kfunc missing' }, 'libbpf refuses the object for want of the kfunc');
    obj.close();
  }
});

t.test('bpf_sock_destroy iterator destroys exactly the stale sockets', async (t) => {
  if (detected.mechanism !== 'bpf-sock-destroy') {
    await t.rejects(UdpTerminator.open({ revNat, cgroup, mechanism: 'bpf-sock-destroy' }), /no bpf_sock_destroy kfunc/, 'forcing it fails, naming why');
    return;
  }
  await exercise(t, 'bpf-sock-destroy');
});

t.test('inet_diag SOCK_DESTROY fallback destroys exactly the stale sockets', async (t) => {
  await exercise(t, 'inet-diag');
});

t.test('each bound stops a run and is reported', async (t) => {
  const spec: Spec = { one: [4, REMOVED4, PORT], two: [4, REMOVED4, PORT] };
  const hs = [await holder(nsA, true, spec), await holder(nsB, true, spec)];
  const keys = hs.flatMap((h) => [v4Key(h.cookies.one!, REMOVED4, PORT), v4Key(h.cookies.two!, REMOVED4, PORT)]);
  for (const k of keys) revNat[4].update(k, Buffer.alloc(lb4_sock_revnat.size));
  t.teardown(() => {
    for (const k of keys) revNat[4].delete(k);
  });
  const gone = [removed[0]!];
  // A destroyed socket's recv() reports ECONNABORTED once (then it just
  // waits, disconnected): count every report so far, per holder.
  const seen = hs.map(() => new Set<string>());
  const aborted = async (): Promise<number[]> => {
    for (const [i, h] of hs.entries()) for (const [n, o] of Object.entries(await h.check())) if (o === 'ECONNABORTED') seen[i]!.add(n);
    return seen.map((s) => s.size);
  };

  const late = await UdpTerminator.open({ revNat, cgroup, limits: { ms: 0 } });
  t.teardown(() => late.close());
  const r0 = await late.destroyConnectedTo(gone);
  t.match(r0.limit, /^wall time 0 ms: /, `wall time: ${r0.limit}`);
  t.equal(r0.destroyed, 0, 'nothing destroyed');

  const few = await UdpTerminator.open({ revNat, cgroup, mechanism: 'inet-diag', limits: { sockets: 1 } });
  t.teardown(() => few.close());
  const r1 = await few.destroyConnectedTo(gone);
  t.match(r1.limit, /^1 sockets examined: netns \d+ .* had more/, `sockets: ${r1.limit}`);
  t.equal(r1.examined, 1, 'one socket examined');
  t.ok(r1.destroyed <= 1, `at most that one destroyed (${r1.destroyed})`);
  t.ok((await aborted()).reduce((a, b) => a + b) <= 1, 'the other sockets are untouched');

  const narrow = await UdpTerminator.open({ revNat, cgroup, limits: { netns: 1 } });
  t.teardown(() => narrow.close());
  const r2 = await narrow.destroyConnectedTo(gone);
  t.match(r2.limit, /^1 network namespaces: those of \d+ more processes were not searched$/, `netns: ${r2.limit}`);
  t.equal(r2.netns, 1, 'one namespace searched');
  t.same(r2.errors, []);
  const counts = await aborted();
  t.equal(r1.destroyed + r2.destroyed, counts.reduce((a, b) => a + b), 'each run destroyed what it reported');
  t.ok(counts.includes(2) && counts.some((c) => c <= 1), `one namespace's sockets destroyed, not the other's (${counts.join(', ')})`);

  const closing = await UdpTerminator.open({ revNat, cgroup });
  const running = closing.destroyConnectedTo(gone);
  closing.close();
  const r3 = await running;
  t.match(r3.limit, /^the terminator closed: /, `close() stops a run at its next step: ${r3.limit}`);
  t.same(r3.errors, [], 'without errors');
});

// A socket iterator and a sock_diag socket each reach only the namespace
// they were made in. inet_diag runs on every kernel; the iterator where the
// kernel has bpf_sock_destroy, and elsewhere its object must be refused.
t.test('each mechanism reaches only the namespace it was made in', async (t) => {
  const h = await holder(nsA, true, { inet: [4, REMOVED4, PORT], iter: [4, REMOVED4, PORT] });
  const fdA = openSync(`/run/netns/${nsA}`, 'r');
  const fdB = openSync(`/run/netns/${nsB}`, 'r');
  t.teardown(() => {
    closeSync(fdA);
    closeSync(fdB);
  });
  const connected = 1 << 1; // TCP_ESTABLISHED
  const find = async (fd?: number) => (await inetDiagDump(2, 17, connected, fd)).sockets.find((s) => s.cookie === h.cookies.inet);

  t.equal(await find(fdB), undefined, 'inet_diag: a dump made in the other namespace does not list the socket');
  t.equal(await find(), undefined, "nor does one made in the test's own");
  const sock = await find(fdA);
  t.ok(sock, "a dump made in the socket's namespace lists it");
  t.same(await inetDiagDestroy(2, 17, [sock!.id], fdB), [2], 'SOCK_DESTROY of its exact id, made in the other namespace: ENOENT');
  t.same(await h.check(), { inet: 'EAGAIN', iter: 'EAGAIN' }, 'both sockets untouched');
  t.same(await inetDiagDestroy(2, 17, [sock!.id], fdA), [0], "made in the socket's namespace: destroyed");
  t.same(await h.check(), { inet: 'ECONNABORTED', iter: 'EAGAIN' }, 'that socket, and only it, is aborted');

  const obj = BpfObject.open(SOCK_DESTROY_OBJECT, { reuseMaps: { lb4_sock_revnat: revNat[4].fd, lb6_sock_revnat: revNat[6].fd } });
  t.teardown(() => obj.close());
  if (detected.mechanism !== 'bpf-sock-destroy') {
    await t.rejects(
      obj.load().catch((err) => Promise.reject(lacksSockDestroy(err) ? new Error('kfunc missing') : err)),
      { message: 'kfunc missing' },
      'no iterator on this kernel: its object is refused for want of bpf_sock_destroy, so inet_diag (above) is what runs here',
    );
    return;
  }
  await obj.load();
  const key = v4Key(h.cookies.iter!, REMOVED4, PORT);
  revNat[4].update(key, Buffer.alloc(lb4_sock_revnat.size));
  t.teardown(() => revNat[4].delete(key));
  const termKey = Buffer.alloc(8);
  termKey.writeUInt32BE(ipv4ToUint(REMOVED4), 0);
  termKey.writeUInt16BE(PORT, 4);
  termKey.writeUInt8(17, 6);
  obj.map('lb4_sock_term').update(termKey, Buffer.from([1, 0, 0, 0]));
  const prog = obj.progFd('lb_udp_destroy');
  t.equal((await iterRun(prog, fdB)).length, 0, 'iterator: created in the other namespace, it never sees the socket');
  t.equal((await h.check()).iter, 'EAGAIN', 'the socket is untouched');
  t.same(parseCookies(await iterRun(prog, fdA)), [h.cookies.iter], "created in the socket's namespace: its cookie out");
  t.equal((await h.check()).iter, 'ECONNABORTED', 'and the socket is destroyed');
});
