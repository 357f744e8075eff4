// The tc object's load beside the socket object: it shares the socket
// object's maps by fd, pins its own next to them, adopts them at a second
// load, and makes anew a pinned tc map whose layout is not the object's
// (rather than reading old bytes in a new layout); a traffic map of another
// size is made beside the pinned one, its entries carried over, and takes
// the pin once committed; SNAT translations a datapath from before lb*_nat
// left in lb*_ct are moved out. No device is attached. Its programs are
// told from others' by their BTF function names (isOurs).
import { execFileSync } from 'node:child_process';
import { mkdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import t from 'tap';
import { hasSetRetval } from '../../src/datapath/features.js';
import { ROOT } from '../helpers/sandbox.js';
import { COMPAT_OBJECT, DEFAULT_OBJECT, ensureBpffs } from '../../src/datapath/loader.js';
import { isOurs, MIGRATION_HOLD_S, NodePortDatapath, PROGRAMS, type NodePortSettings } from '../../src/datapath/nodeport.js';
import { BpfObject, openPinnedMap } from '../../src/native/bpf.js';
import { lb4_ct_entry, lb4_ct_key, lb_device, lb_np_config, LbNpConfigFlags, u32 } from '../../src/datapath/abi.gen.js';
import { monotonicSeconds } from '../../src/datapath/ct.js';

if (process.getuid?.() !== 0) t.bailout('the native suites need root (BPF): run `make test` as root');

const pinRoot = `/sys/fs/bpf/lbctl-test-${process.pid}-npload`;
const mapsDir = path.join(pinRoot, 'maps');
const linksDir = path.join(pinRoot, 'links');
ensureBpffs(pinRoot);
mkdirSync(mapsDir, { recursive: true });
mkdirSync(linksDir, { recursive: true });
const open: Array<{ close(): void }> = [];
t.teardown(() => {
  for (const o of open.reverse()) o.close();
  rmSync(pinRoot, { recursive: true, force: true });
});

// The socket object this kernel loads (the agent's choice): before 5.18 the compat one.
const sock = await BpfObject.openLoaded((await hasSetRetval()) ? DEFAULT_OBJECT : COMPAT_OBJECT, { pinRoot: mapsDir });
open.push(sock);
const stagingDir = path.join(pinRoot, 'tc-maps-next');
const load = (sizes?: { ct?: number; nat?: number }): Promise<NodePortDatapath> =>
  NodePortDatapath.load({ bpfRoot: pinRoot, sockObject: sock, mapsDir, linksDir, stagingDir, mode: 'clsact', maglevM: 251, ...(sizes ? { sizes } : {}) });

t.test('first load: shared maps are the socket object\'s, its own are pinned', async (t) => {
  const dp = await load();
  open.push(dp);
  t.equal(dp.object.map('lb4_services').id, sock.map('lb4_services').id, 'lb4_services is the socket object\'s map');
  t.equal(dp.object.map('lb_node_addrs').id, sock.map('lb_node_addrs').id, 'and so is lb_node_addrs');
  const ct = openPinnedMap(path.join(mapsDir, 'lb4_ct'));
  t.equal(ct.id, dp.object.map('lb4_ct').id, 'lb4_ct is pinned under maps/');
  ct.close();
  t.same(dp.replacedMaps, [], 'nothing replaced');
});

t.test('second load adopts the pins; a pin of another layout is made anew', async (t) => {
  const before = openPinnedMap(path.join(mapsDir, 'lb4_ct'));
  const ctId = before.id;
  before.close();
  // lb_devices pinned with a wrong value size, as an older build might have left it.
  rmSync(path.join(mapsDir, 'lb_devices'));
  execFileSync('bpftool', ['map', 'create', path.join(mapsDir, 'lb_devices'), 'type', 'hash', 'key', '4', 'value', '16', 'entries', '256', 'name', 'lb_devices', 'flags', '1']);
  const dp = await load();
  open.push(dp);
  t.equal(dp.object.map('lb4_ct').id, ctId, 'lb4_ct adopted: the flows survive a restart');
  t.same(dp.replacedMaps, ['lb_devices'], 'the lb_devices of another layout was replaced');
  t.equal(dp.object.map('lb_devices').valueSize, lb_device.size, 'by one of the object\'s layout');
});

const key = (dport: number, dir: number): Buffer => lb4_ct_key.encode({ saddr: 0x0a000001, daddr: 0x0a000002, sport: 8080, dport, proto: 6, dir });
const entry = (flags: number): Buffer =>
  lb4_ct_entry.encode({ expires: 1n << 40n, addr1: 0x0a000003, addr2: 0x0a000004, port1: 80, port2: 40000, revNatIndex: 7, backendId: 9, flags });

t.test('--ct-max changed: the flows are carried into a map of the new size, which takes the pin at commit', async (t) => {
  const before = openPinnedMap(path.join(mapsDir, 'lb4_ct'));
  before.update(key(1, 0), entry(1 | 4));
  const oldId = before.id;
  before.close();
  const dp = await load({ ct: 1024 });
  open.push(dp);
  t.not(dp.object.map('lb4_ct').id, oldId, 'a new lb4_ct');
  t.equal(dp.object.map('lb4_ct').maxEntries, 1024, 'of 1024 entries');
  t.match(dp.migrated.find((m) => m.map === 'lb4_ct'), { from: 262144, to: 1024, entries: 1, converted: false }, 'its entry carried over');
  t.ok(dp.object.map('lb4_ct').lookup(key(1, 0)), 'the flow is in the new map');
  t.equal(openPinnedMap(path.join(mapsDir, 'lb4_ct')).id, oldId, 'the old map keeps the pin until the switch');
  // The layer-3 tunnels' programs, loaded now, share every map, the staged ones included.
  await dp.loadL3();
  const l3 = dp.layer3;
  t.ok(l3, `${path.basename(l3?.path ?? 'nodeport_l3.bpf.o')} loaded beside it`);
  const differ = dp.object.mapNames().filter((n) => !n.includes('.') && l3?.map(n).id !== dp.object.map(n).id);
  t.same(differ, [], 'every map of it is the tc object\'s own (the staged lb4_ct, the socket object\'s services, the pinned rest)');
  // what the old programs write before the switch is carried too
  const old = openPinnedMap(path.join(mapsDir, 'lb4_ct'));
  old.update(key(2, 0), entry(1 | 4));
  old.close();
  const after = dp.commitMigration();
  t.equal(after['lb4_ct'], 1, 'the entry written meanwhile is carried at commit');
  const pinned = openPinnedMap(path.join(mapsDir, 'lb4_ct'));
  t.equal(pinned.id, dp.object.map('lb4_ct').id, 'the new map has the pin');
  t.ok(pinned.lookup(key(2, 0)), 'with both flows');
  pinned.close();
  t.notOk(dp.migrating, 'nothing pending');
});

t.test('a datapath from before lb4_nat: its SNAT translations move out of lb4_ct', async (t) => {
  const ct = openPinnedMap(path.join(mapsDir, 'lb4_ct'));
  ct.update(key(61000, 1), entry(1)); // a SNAT translation (REPLY, LB_CT_F_SNAT) where the old datapath kept it
  ct.update(key(41000, 1), entry(8)); // a local flow's reply entry (LB_CT_F_LOCAL): stays
  ct.close();
  rmSync(path.join(mapsDir, 'lb4_nat'));
  const dp = await load({ ct: 1024 });
  open.push(dp);
  t.ok(dp.object.map('lb4_nat').lookup(key(61000, 1)), 'the translation is in lb4_nat before the switch');
  t.ok(dp.object.map('lb4_ct').lookup(key(61000, 1)), 'and still in lb4_ct, where the old programs look until then');
  dp.commitMigration();
  t.notOk(dp.object.map('lb4_ct').lookup(key(61000, 1)), 'gone from lb4_ct after the switch');
  t.ok(dp.object.map('lb4_ct').lookup(key(41000, 1)), 'the local flow\'s entry stays');
  t.ok(dp.object.map('lb4_nat').lookup(key(61000, 1)), 'the translation stays in lb4_nat');
  t.equal(openPinnedMap(path.join(mapsDir, 'lb4_nat')).id, dp.object.map('lb4_nat').id, 'lb4_nat pinned');
});

t.test("isOurs: lbctl's tc programs by their BTF function names, not by the 15 characters the kernel keeps", async (t) => {
  const dp = await load({ ct: 1024 }); // the size the tests above left pinned: nothing to carry over
  open.push(dp);
  for (const name of Object.values(PROGRAMS)) {
    const info = dp.object.progInfo(name);
    t.equal(info.name, name.slice(0, 15), `${name}: the kernel keeps ${info.name}`);
    t.equal(info.funcName, name, 'its BTF names it whole');
    t.ok(isOurs(info.id), `${name} (id ${info.id}) is ours`);
  }
  // Someone else's lb_nodeport_ingest: lb_nodeport_ing to the kernel, as ours is.
  const foreign = await BpfObject.openLoaded(path.join(ROOT, 'bpf/.output/tests/tc_count_test.bpf.o'));
  open.push(foreign);
  t.equal(foreign.progInfo('lb_nodeport_ingest').name, 'lb_nodeport_ing', "a foreign program with our program's kernel name");
  t.notOk(isOurs(foreign.progInfo('lb_nodeport_ingest').id), 'is not ours');
  t.notOk(isOurs(foreign.progInfo('count_packets').id), 'nor is any other');
  // Named lb_nodeport_ingress but loaded without BTF: nothing whole says it is ours.
  const bare = await BpfObject.openLoaded(path.join(ROOT, 'bpf/.output/tests/tc_nobtf_test.bpf.o'));
  open.push(bare);
  t.notOk(isOurs(bare.progInfo('lb_nodeport_ingress').id), 'a program without BTF is not ours, whatever its name');
  t.notOk(isOurs(0), 'no program (id 0) is not ours');
});

// While the programs switch (a migration's switch round), they hold back a flow's packets that find no
// entry yet (LB_NP_F_MIGRATING) until a deadline MIGRATION_HOLD_S on, so an agent killed in the window
// does not leave the hold for good. A long commit copy must not outlive it: the agent writes it again
// every 4,096 entries it copies (a review found a copy of millions of flows would have lost the hold
// half way); the flag is off once committed.
t.test('a commit inside a switch round renews the hold as it copies; the flag is off after', async (t) => {
  const settings: NodePortSettings = {
    nodePortRange: { first: 30000, last: 32767 }, snatRange: { first: 61000, last: 65535 }, snatRetries: 16, externalClusterIP: false,
    maglev: { m: 251, seed4: 1, seed6: 2 }, conntrack: { tcpEstablished: 0, tcpCloseWait: 0, udp: 0 },
  };
  const first = await load({ ct: 16384 });
  open.push(first);
  first.commitMigration();
  const pinned = openPinnedMap(path.join(mapsDir, 'lb4_ct'));
  for (let i = 0; i < 10_000; i++) pinned.update(key(10 + i, 0), entry(1 | 4));
  pinned.close();
  const dp = await load({ ct: 32768 });
  open.push(dp);
  t.ok(dp.migrating, 'a --ct-max change: 10,000 flows to carry');
  const writes: Array<{ flags: number; until: number; at: number }> = [];
  const configure = dp.configure.bind(dp);
  dp.configure = (s: NodePortSettings): void => {
    configure(s);
    const c = lb_np_config.decode(dp.object.map('lb_np_config').lookup(u32.encode(0))!);
    writes.push({ flags: c.flags, until: c.migratingUntil, at: monotonicSeconds() });
  };
  const inRound = dp as unknown as { switching: boolean };
  inRound.switching = true; // as switchRound() has it from the first attach to the commit
  dp.configure(settings);
  const carried = dp.commitMigration();
  inRound.switching = false;
  const MIGRATING = LbNpConfigFlags.LB_NP_F_MIGRATING;
  t.equal(carried['lb4_ct'] ?? 0, 0, 'every flow was in the new map already (the load copied them): none carried again');
  const held = writes.filter((w) => w.flags & MIGRATING);
  t.ok(held.length >= 3, `the hold written at the round's start and again as the copy went: ${held.length} times for 10,000 entries`);
  // each deadline counted from its own write (a slow machine's copy takes seconds: later writes reach further)
  t.ok(held.every((w) => w.until >= w.at + MIGRATION_HOLD_S - 1 && w.until <= w.at + MIGRATION_HOLD_S), `each with a deadline ${MIGRATION_HOLD_S} s past its write (${held.map((w) => w.until - w.at).join(', ')})`);
  t.ok(held.every((w, i) => i === 0 || w.until >= held[i - 1]!.until), 'never earlier than the one before');
  t.match(writes.at(-1), { flags: 0, until: 0 }, 'committed: the flag off, no deadline');
});
