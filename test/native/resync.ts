// Reconciler.resync() over the real kernel's maps: the periodic resync
// compares the maps' bytes with the realized state in place
// (KernelLbMaps.matches over BPF_MAP_LOOKUP_BATCH). Maps as written are left
// alone, and the next sync may stay a change sync; every kind of damage made
// behind the agent's back is found, and the sync after the resync puts the
// maps back exactly as they were written (the drift repair of a full re-read).
// The datapath object is loaded (not attached) into a fresh pin directory
// under bpffs, removed at teardown even on failure. Root only.
import t, { type Test } from 'tap';
import { lb4_backend, lb4_key, lb_service, u32 } from '../../src/datapath/abi.gen.js';
import { KernelLbMaps, LB_MAP_NAMES, type ByteMap, type LbMapSet } from '../../src/datapath/maps.js';
import { Reconciler } from '../../src/reconcile/reconciler.js';
import { frontend, state } from '../fakes/frontends.js';
import { loadDatapathMaps } from '../helpers/datapath-maps.js';

if (process.getuid?.() !== 0) {
  t.bailout('test/native/resync.ts needs root: it loads the real datapath object');
}

/** The datapath object loaded into a fresh pin dir; removed at teardown, even on failure. */
async function load(t: Test): Promise<LbMapSet> {
  return (await loadDatapathMaps(t, 'resync', 256)).set;
}

// A cluster IP with terminating backends (and its wildcard), an address
// above 2^31, an internal-scope NodePort twin, an IPv6 frontend, and SCTP
// frontends of both families whose backends share their TCP twins'
// addresses and ports (one backend id per protocol).
const WEB = frontend('10.96.0.1', 80, ['10.0.0.2', '10.0.0.3'], ['10.0.0.4']);
const HIGH = frontend('192.168.1.10', 443, ['10.0.0.5']);
const TWIN = frontend('0.0.0.0', 30080, ['10.0.0.6'], [], { type: 'NodePort', scope: 'internal' });
const V6 = frontend('fd00::1', 80, ['fd00::2', 'fd00::3']);
const SCTP = frontend('10.96.0.2', 3868, ['10.0.0.2', '10.0.0.7'], [], { protocol: 'SCTP' });
const SCTP6 = frontend('fd00::4', 3868, ['fd00::2'], [], { protocol: 'SCTP' });
const DESIRED = state(WEB, HIGH, TWIN, V6, SCTP, SCTP6);

/** Every entry of the six maps as text, sorted: what "exactly as written" compares. */
function contents(set: LbMapSet): string[] {
  const out: string[] = [];
  for (const name of LB_MAP_NAMES) for (const [k, v] of set[name].entries()) out.push(`${name} ${k.toString('hex')}=${v.toString('hex')}`);
  return out.sort();
}

/** Maps holding DESIRED as one sync wrote them, the reconciler, and the contents written. */
async function programmed(t: Test): Promise<{ set: LbMapSet; maps: KernelLbMaps; r: Reconciler; written: string[] }> {
  const set = await load(t);
  const maps = new KernelLbMaps(set);
  const r = new Reconciler(maps);
  t.same(r.sync(DESIRED, { prune: true }).notProgrammed, [], 'written');
  return { set, maps, r, written: contents(set) };
}

t.test('maps as written: the resync keeps the realized state, and the next sync stays a change sync', async (t) => {
  const { maps, r } = await programmed(t);
  t.ok(maps.matches(r.realized), 'the kernel holds exactly the realized state');
  const before = r.realized;
  r.resync();
  t.equal(r.realized, before, 'nothing re-read');
  const res = r.sync(DESIRED, { prune: true, changed: new Set() });
  t.equal(res.planned, 0, 'nothing to repair');
  // A change after it is planned alone (the maps are still known to match).
  const web2 = frontend('10.96.0.1', 80, ['10.0.0.2'], ['10.0.0.4']);
  const next = r.sync(state(web2, HIGH, TWIN, V6), { prune: true, changed: new Set([web2.key]) });
  t.ok(next.planned > 0 && next.planned <= 4, `the change alone is planned (${next.planned} writes)`);
});

t.test('an entry lbctl cannot decode (dump() skips it) is not drift', async (t) => {
  const { set, maps, r } = await programmed(t);
  const key = lb4_key.encode({ address: 0x01020304, dport: 9, backendSlot: 0, proto: 47 /* GRE: no lbctl build writes it */, scope: 0 });
  set.lb4_services.update(key, lb_service.encode({ backendId: 0, revNatIndex: 0, affinityTimeout: 0, count: 0, qcount: 0, type: 0, flags: 0 }));
  t.ok(maps.matches(r.realized), 'skipped, as the full re-read skips it');
});

interface Damage {
  readonly name: string;
  damage(m: KernelLbMaps, set: LbMapSet, r: Reconciler): void;
}

const web = (r: Reconciler): number => r.revNatIds[4].get(WEB.key)!;
const firstBackend = (r: Reconciler, address: string): number => [...r.realized.backends].find(([, b]) => b.address === address && b.protocol === 'TCP')![0];
const sctpBackend = (r: Reconciler, address: string): number => [...r.realized.backends].find(([, b]) => b.address === address && b.protocol === 'SCTP')![0];

const DAMAGES: readonly Damage[] = [
  { name: 'a master deleted', damage: (m) => m.deleteMaster(WEB) },
  { name: 'a master with another count', damage: (m, _s, r) => m.putMaster(WEB, { count: 1, qcount: 1, revNatId: web(r), type: 'ClusterIP', flags: 0, affinityTimeout: 0 }) },
  { name: 'a master above 2^31 with other flags', damage: (m, _s, r) => m.putMaster(HIGH, { count: 1, qcount: 0, revNatId: r.revNatIds[4].get(HIGH.key)!, type: 'ClusterIP', flags: 4, affinityTimeout: 0 }) },
  { name: 'a wildcard deleted', damage: (m) => m.deleteMaster({ address: '10.96.0.1', family: 4, port: 0, protocol: 'ANY' }) },
  { name: 'the internal-scope twin deleted', damage: (m) => m.deleteMaster(TWIN) },
  { name: 'a slot deleted', damage: (m) => m.deleteSlot(WEB, 2) },
  { name: 'a slot naming another backend', damage: (m, _s, r) => m.putSlot(WEB, 1, firstBackend(r, '10.0.0.5')) },
  { name: 'an orphan slot beyond the count', damage: (m, _s, r) => m.putSlot(WEB, 7, firstBackend(r, '10.0.0.2')) },
  { name: 'an IPv6 slot deleted', damage: (m) => m.deleteSlot(V6, 1) },
  { name: 'a backend deleted', damage: (m, _s, r) => m.deleteBackend(firstBackend(r, '10.0.0.3'), 4) },
  { name: 'a backend in another state', damage: (m, _s, r) => m.putBackend(firstBackend(r, '10.0.0.3'), { address: '10.0.0.3', family: 4, port: 8080, protocol: 'TCP', state: 'terminating' }) },
  { name: 'a backend nothing names', damage: (m) => m.putBackend(200, { address: '10.9.9.9', family: 4, port: 1, protocol: 'UDP', state: 'active' }) },
  { name: 'a backend with a byte lbctl does not decode', damage: (_m, set, r) => set.lb4_backends.update(u32.encode(firstBackend(r, '10.0.0.2')), lb4_backend.encode({ address: 0x0a000002, port: 8080, proto: 6, state: 9 })) },
  { name: 'an IPv6 backend deleted', damage: (m, _s, r) => m.deleteBackend(firstBackend(r, 'fd00::3'), 6) },
  { name: 'a rev-NAT entry deleted', damage: (m, _s, r) => m.deleteRevNat(web(r), 4) },
  { name: 'a rev-NAT entry rewritten', damage: (m, _s, r) => m.putRevNat(web(r), 4, { address: '10.96.0.99', port: 80 }) },
  { name: 'a rev-NAT entry nothing names', damage: (m) => m.putRevNat(99, 4, { address: '10.96.0.99', port: 80 }) },
  { name: 'an IPv6 rev-NAT entry deleted', damage: (m, _s, r) => m.deleteRevNat(r.revNatIds[6].get(V6.key)!, 6) },
  { name: 'an SCTP slot deleted', damage: (m) => m.deleteSlot(SCTP, 2) },
  { name: 'an SCTP backend deleted', damage: (m, _s, r) => m.deleteBackend(sctpBackend(r, '10.0.0.7'), 4) },
  { name: 'an SCTP backend turned TCP', damage: (m, _s, r) => m.putBackend(sctpBackend(r, '10.0.0.7'), { address: '10.0.0.7', family: 4, port: 8080, protocol: 'TCP', state: 'active' }) },
  { name: 'an IPv6 SCTP master deleted', damage: (m) => m.deleteMaster(SCTP6) },
];

for (const d of DAMAGES) {
  t.test(`drift: ${d.name} is found, and the sync after the resync repairs it`, async (t) => {
    const { set, maps, r, written } = await programmed(t);
    d.damage(maps, set, r);
    t.notSame(contents(set), written, 'damaged');
    t.notOk(maps.matches(r.realized), 'the comparison finds the difference');
    r.resync();
    const res = r.sync(DESIRED, { prune: true, changed: new Set() });
    t.ok(res.applied > 0, `repaired with ${res.applied} writes`);
    t.same(contents(set), written, 'the maps are exactly as written');
    t.ok(maps.matches(r.realized), 'and match the realized state again');
  });
}

t.test('maps without entriesFlat (entries() only) are compared the same way', async (t) => {
  const { set, r } = await programmed(t);
  const plain = {} as LbMapSet;
  for (const name of LB_MAP_NAMES) {
    const m = set[name];
    const wrapped: ByteMap = {
      name: m.name,
      keySize: m.keySize,
      valueSize: m.valueSize,
      maxEntries: m.maxEntries,
      lookup: (k) => m.lookup(k),
      update: (k, v, f) => m.update(k, v, f),
      delete: (k) => m.delete(k),
      entries: () => m.entries(),
    };
    plain[name] = wrapped;
  }
  const maps = new KernelLbMaps(plain);
  t.ok(maps.matches(r.realized), 'as written: the same');
  maps.deleteSlot(WEB, 1);
  t.notOk(maps.matches(r.realized), 'a slot deleted: found');
});
