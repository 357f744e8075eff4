// Maglev at tc, on the real kernel: tables built by src/lb/maglev.ts and
// written through the agent's own KernelMaglevMaps (a new inner map, one
// outer update), then 2,000 fixed flows through lb_nodeport_ingress under
// BPF_PROG_TEST_RUN. The kernel must pick, for each flow, the backend the
// table names at the slot src/lb/maglev.ts computes (the C and TypeScript
// hashes agree); removing one of 10 backends must move at most 12% of the
// flows, and at most 2% of those whose backend stayed; a table read back
// from the kernel equals the one another node builds from the same
// backends in another order.
//
// bpf_fib_lookup answers from the namespace the run happens in, so the file
// runs itself again under `unshare --net` (nothing is pinned; the host's
// devices are never touched).
import { execFileSync } from 'node:child_process';
import { readlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { lb4_backend, lb4_key, lb_np_config, lb_service, LbSvcFlags, LbSvcType, u32 } from '../../src/datapath/abi.gen.js';
import { KernelMaglevMaps } from '../../src/datapath/maglev-maps.js';
import { flowSlot4, maglevTable, parseMaglevSeed, DEFAULT_MAGLEV_SEED } from '../../src/lb/maglev.js';
import { BpfObject, progTestRun } from '../../src/native/bpf.js';
import { frame, ip4, parseFrame, IPPROTO_TCP } from '../helpers/packet.js';

if (process.getuid?.() !== 0) t.bailout('the BPF suites need root (CAP_BPF, CAP_NET_ADMIN): run `make test` as root');

const OBJECT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../bpf/.output/tests/nodeport_test.bpf.o');
const PARENT_NETNS = 'LBCTL_MAGLEV_PARENT_NETNS';
const M = 16381;
const SEEDS = parseMaglevSeed(DEFAULT_MAGLEV_SEED);
const FRONTEND = { address: '10.96.5.5', port: 80, revNat: 7 };
const FLOWS = 2000;
const backendAddr = (i: number): string => `10.244.1.${10 + i}`;
const flow = (i: number): { src: string; sport: number } => ({ src: `10.0.${(i >> 8) & 0xff}.${i & 0xff}`, sport: 20000 + ((i * 7919) % 40000) });

async function inNamespace(): Promise<void> {
  const ip = (...args: string[]): string => execFileSync('ip', args, { encoding: 'utf8' });
  ip('link', 'set', 'lo', 'up');
  for (const [dev, peer] of [['np0', 'np0p'], ['pod0', 'pod0p']] as const) ip('link', 'add', dev, 'type', 'veth', 'peer', 'name', peer);
  for (const dev of ['np0', 'np0p', 'pod0', 'pod0p']) ip('link', 'set', dev, 'up');
  ip('addr', 'add', '192.168.61.1/24', 'dev', 'np0');
  ip('addr', 'add', '10.244.1.1/24', 'dev', 'pod0');
  writeFileSync('/proc/sys/net/ipv4/conf/all/forwarding', '1');
  const np0 = (JSON.parse(ip('-j', 'link', 'show', 'np0')) as Array<{ ifindex: number }>)[0]!.ifindex;

  const obj = BpfObject.open(OBJECT);
  t.teardown(() => obj.close());
  await obj.load();
  const svc = obj.map('lb4_services');
  const be = obj.map('lb4_backends');
  const ct = obj.map('lb4_ct');
  const tables = new KernelMaglevMaps(obj.map('lb_maglev'), obj.map('lb_maglev_index'), M);
  obj.map('lb_np_config').update(
    u32.encode(0),
    lb_np_config.encode({
      ...lb_np_config.decode(Buffer.alloc(lb_np_config.size)),
      nodeportMin: 30000, nodeportMax: 32767, snatMin: 61000, snatMax: 65535, snatRetries: 8,
      maglevM: M, maglevSeed4: SEEDS.flow4, maglevSeed6: SEEDS.flow6,
    }),
  );

  // 10 backends (ids 1..10); the frontend's slots name them all, so without a table the pick is random.
  const key = (slot: number): Buffer => lb4_key.encode({ address: ip4(FRONTEND.address), dport: FRONTEND.port, backendSlot: slot, proto: IPPROTO_TCP, scope: 0 });
  const ids = Array.from({ length: 10 }, (_, i) => i + 1);
  for (const id of ids) {
    be.update(u32.encode(id), lb4_backend.encode({ address: ip4(backendAddr(id)), port: 8080, proto: IPPROTO_TCP, state: 0 }));
    svc.update(key(id), lb_service.encode({ backendId: id, revNatIndex: 0, affinityTimeout: 0, count: 0, qcount: 0, type: 0, flags: 0 }));
  }
  const master = (count: number): void =>
    svc.update(key(0), lb_service.encode({ backendId: 0, revNatIndex: FRONTEND.revNat, affinityTimeout: 0, count, qcount: 0, type: LbSvcType.LB_SVC_EXTERNAL_IP, flags: LbSvcFlags.LB_SVC_F_MAGLEV }));
  const entries = (live: number[]) => live.map((id) => ({ key: `${backendAddr(id)}:8080/TCP`, id }));

  /** The backend id the kernel sends each flow to (a new flow each: CT emptied first). */
  const picks = (): number[] => {
    for (const [k] of ct.entries()) ct.delete(k);
    const out: number[] = [];
    const ctx = Buffer.alloc(192);
    ctx.writeUInt32LE(np0, 40);
    for (let i = 0; i < FLOWS; i++) {
      const f = flow(i);
      const data = frame({ src: f.src, dst: FRONTEND.address, proto: 'tcp', sport: f.sport, dport: FRONTEND.port });
      const r = progTestRun(obj.progFd('lb_nodeport_ingress'), { data, ctx });
      const p = parseFrame(r.data);
      out.push((r.retval | 0) === 0 ? Number(p.dst.split('.')[3]) - 10 : -1);
    }
    return out;
  };
  const predicted = (table: Uint32Array): number[] =>
    Array.from({ length: FLOWS }, (_, i) => table[flowSlot4(ip4(flow(i).src), flow(i).sport, FRONTEND.port, IPPROTO_TCP, SEEDS.flow4, M)]!);

  const before = maglevTable(entries(ids), M, SEEDS.table);
  tables.put(FRONTEND.revNat, before);
  master(10);
  const got = picks();
  t.same(got.filter((id) => id < 1).length, 0, 'every flow was DNATed to a backend (TC_ACT_OK)');
  t.same(got, predicted(before), 'the kernel picks the backend the table names at the slot src/lb/maglev.ts computes, for all 2,000 flows');

  const read = tables.read().get(FRONTEND.revNat)!;
  const otherNode = maglevTable(entries([...ids].reverse()), M, SEEDS.table);
  t.ok(read && Buffer.compare(Buffer.from(read.buffer), Buffer.from(otherNode.buffer)) === 0, 'the table read back from the kernel is the one another node builds from the backends in another order');

  // Backend 4 goes: a new table swapped in, then the master counts 9.
  const live = ids.filter((id) => id !== 4);
  const after = maglevTable(entries(live), M, SEEDS.table);
  tables.put(FRONTEND.revNat, after);
  svc.update(key(4), lb_service.encode({ backendId: 10, revNatIndex: 0, affinityTimeout: 0, count: 0, qcount: 0, type: 0, flags: 0 }));
  svc.delete(key(10));
  master(9);
  const moved = picks();
  t.same(moved, predicted(after), 'after the swap the kernel follows the new table');
  t.notOk(moved.includes(4), 'no flow goes to the removed backend');
  const changed = moved.filter((id, i) => id !== got[i]).length;
  const stayedOn = got.map((id, i) => [id, moved[i]] as const).filter(([was]) => was !== 4);
  const disturbed = stayedOn.filter(([was, now]) => was !== now).length;
  t.ok(changed / FLOWS <= 0.12, `one of 10 backends removed: ${((100 * changed) / FLOWS).toFixed(1)}% of flows moved (at most 12%)`);
  t.ok(disturbed / stayedOn.length <= 0.02, `${((100 * disturbed) / stayedOn.length).toFixed(2)}% of the flows whose backend stayed moved (at most 2%)`);

  tables.delete(FRONTEND.revNat);
  const fallback = picks();
  t.ok(fallback.every((id) => id >= 1 && id <= 10 && id !== 4), 'without a table the flows still get a live backend (random), never a drop');
  t.ok(fallback.some((id, i) => id !== moved[i]), 'and the choice is no longer the table\'s');
}

const parentNetns = process.env[PARENT_NETNS];
if (parentNetns === undefined) {
  // The script node was started with (argv[1]): this file, or its vmtest bundle (scripts/vmtest/bundle-tests.mjs).
  const self = process.argv[1]!;
  await t.spawn('unshare', ['--net', '--', process.execPath, ...process.execArgv, self], {
    env: { ...process.env, [PARENT_NETNS]: readlinkSync('/proc/self/ns/net') },
  }, 'Maglev tables at tc, in a network namespace of its own');
} else {
  if (readlinkSync('/proc/self/ns/net') === parentNetns) t.bailout('not in a network namespace of its own: refusing to create devices');
  await inNamespace();
}
