// RealizedState: the maps as last written or read, with the reference
// counts change syncs rely on and the per-map entry counts of map pressure.
import t from 'tap';
import type { MapsDump } from '../../src/datapath/lbmaps.js';
import type { Backend } from '../../src/lb/types.js';
import { NO_ROW, RealizedState, WILDCARD_MASTER } from '../../src/reconcile/realized.js';

const fe = { address: '10.96.0.1', family: 4, port: 80, protocol: 'TCP' } as const;
const fe6 = { address: 'fd00::1', family: 6, port: 80, protocol: 'TCP' } as const;
const wild = { address: '10.96.0.1', family: 4, port: 0, protocol: 'ANY' } as const;
const master = { count: 2, qcount: 0, revNatId: 1, type: 'ClusterIP', flags: 0, affinityTimeout: 0 } as const;
const b4: Backend = { address: '10.0.0.1', family: 4, port: 80, protocol: 'TCP', state: 'active' };
const b6: Backend = { address: 'fd00::a', family: 6, port: 80, protocol: 'TCP', state: 'active' };

t.test('from a dump: frontends with their slots (gaps kept), reference counts and entry counts', async (t) => {
  const dump: MapsDump = {
    services: [
      { fe, slot: 0, master },
      { fe, slot: 1, backendId: 7 },
      { fe, slot: 3, backendId: 7 },
      { fe: wild, slot: 0, master: { ...master, count: 0, revNatId: 0, type: 'Wildcard' } },
      { fe: fe6, slot: 1, backendId: 8 },
    ],
    backends: [
      { id: 7, backend: b4 },
      { id: 8, backend: b6 },
    ],
    revNat: [{ id: 1, family: 4, address: fe.address, port: 80 }],
  };
  const r = RealizedState.from(dump);
  const e = r.frontends.row('10.96.0.1:80/TCP');
  t.same([...r.frontends.heldSlots(e)], [[1, 7], [3, 7]], 'slots 1 and 3, slot 2 missing');
  t.equal(r.frontends.slotEnd(e), 4, 'the end is one past the highest slot held');
  t.equal(r.frontends.slot(e, 2), undefined);
  t.same(r.frontends.view('10.96.0.1:80/TCP')!.slots, [undefined, 7, undefined, 7], 'the same as a plain object');
  t.equal(r.slotRefs.get(7), 2, 'backend 7 is named by two slots');
  t.equal(r.slotRefs.get(8), 1);
  t.equal(r.clusterMasters('10.96.0.1'), 1, 'one ClusterIP master at the address (the wildcard does not count)');
  t.equal(r.clusterMasters('fd00::1'), 0, 'slots without a master do not count: no type says the address needs a wildcard');
  t.ok(r.hasPlainWildcard('10.96.0.1'), 'the wildcard entry, as a plan writes it: a bit, not a row');
  t.equal(r.frontends.row('10.96.0.1:0/ANY'), NO_ROW);
  t.same(
    ['lb4_services', 'lb6_services', 'lb4_backends', 'lb6_backends', 'lb4_reverse_nat', 'lb6_reverse_nat'].map((m) => r.entries(m as never)),
    [4, 1, 1, 1, 1, 0],
    'entries per map, as the dump holds them',
  );
});

t.test('slots and masters: counts follow every change, and an entry with nothing left goes', async (t) => {
  const r = new RealizedState();
  const key = '10.96.0.1:80/TCP';
  r.putSlot(key, fe, 2, 5);
  t.same(r.frontends.view(key)!.slots, [undefined, undefined, 5]);
  r.putSlot(key, fe, 2, 5);
  t.equal(r.entries('lb4_services'), 1, 'rewriting the same slot adds nothing');
  r.putSlot(key, fe, 2, 6);
  t.same([r.slotRefs.get(5), r.slotRefs.get(6)], [undefined, 1], 'a slot moved to another backend moves its reference');
  r.putMaster(key, fe, master);
  r.putMaster(key, fe, { ...master, count: 1 });
  t.equal(r.entries('lb4_services'), 2, 'a master rewritten is still one entry');
  r.deleteSlot(key, 2);
  t.same(r.frontends.view(key)!.slots, [undefined], 'trailing empty slots are trimmed');
  t.equal(r.slotRefs.has(6), false);
  t.ok(r.frontends.has(key), 'the master keeps the entry');
  r.deleteMaster(key);
  t.notOk(r.frontends.has(key), 'nothing left: the entry goes');
  t.equal(r.clusterMasters('10.96.0.1'), 0, 'and its address reference');
  t.equal(r.entries('lb4_services'), 0);
  r.deleteMaster(key);
  r.deleteSlot(key, 1);
  t.equal(r.entries('lb4_services'), 0, 'deleting what is not there changes nothing');
});

t.test('slots: filled in any order, their block grown, trimmed and grown again, each held once', async (t) => {
  const r = new RealizedState();
  const key = '10.96.0.1:80/TCP';
  // Every third slot up to 150 first (gaps), then the rest, from the top down.
  const order = [...Array.from({ length: 50 }, (_, i) => 3 * (i + 1)), ...Array.from({ length: 150 }, (_, i) => 150 - i).filter((s) => s % 3 !== 0)];
  for (const slot of order) r.putSlot(key, fe, slot, 1000 + slot);
  const held = [...r.frontends.heldSlots(r.frontends.row(key))];
  t.equal(held.length, 150, 'every slot held');
  t.ok(held.every(([slot, id], i) => slot === i + 1 && id === 1000 + slot), 'in slot order, each with its backend');
  t.equal(r.entries('lb4_services'), 150);
  t.equal(r.slotRefs.size, 150);
  for (let slot = 150; slot > 2; slot--) r.deleteSlot(key, slot);
  t.same(r.frontends.view(key)!.slots, [undefined, 1001, 1002], 'trimmed back to the slots left');
  r.putSlot(key, fe, 70, 7);
  t.same([...r.frontends.heldSlots(r.frontends.row(key))], [[1, 1001], [2, 1002], [70, 7]], 'and grown again');
  // Entries with no slot hold no block: a first slot, low or high, gets one.
  const other = '10.96.0.2:80/TCP';
  const fe2 = { ...fe, address: '10.96.0.2' };
  r.putMaster(other, fe2, master);
  const wkey = '10.96.0.1:0/ANY';
  r.putMaster(wkey, wild, master);
  r.putSlot(other, fe2, 100, 9);
  t.same([...r.frontends.heldSlots(r.frontends.row(other))], [[100, 9]], 'a first slot past the exact range');
  t.same(r.frontends.view(wkey)!.slots, [undefined], 'the other entries without slots are untouched');
  r.deleteSlot(other, 100);
  r.putSlot(other, fe2, 1, 9);
  t.same(r.frontends.view(other)!.slots, [undefined, 9]);
  t.same(r.frontends.view(wkey)!.slots, [undefined]);
});

t.test('address references count ClusterIP masters only: other frontends have no wildcard', async (t) => {
  const r = new RealizedState();
  const np = { address: '0.0.0.0', family: 4, port: 30080, protocol: 'TCP' } as const;
  r.putMaster('0.0.0.0:30080/TCP', np, { ...master, type: 'NodePort' });
  t.equal(r.clusterMasters('0.0.0.0'), 0, 'a NodePort surrogate');
  const ext = { address: '10.96.0.1', family: 4, port: 443, protocol: 'TCP' } as const;
  r.putMaster('10.96.0.1:443/TCP', ext, { ...master, type: 'ExternalIP' });
  t.equal(r.clusterMasters('10.96.0.1'), 0, 'an external IP');
  r.putMaster('10.96.0.1:80/TCP', fe, master);
  t.equal(r.clusterMasters('10.96.0.1'), 1, 'a cluster IP at the same address');
  r.putMaster('10.96.0.1:80/TCP', fe, { ...master, type: 'LoadBalancer' });
  t.equal(r.clusterMasters('10.96.0.1'), 0, 'the same key turned into another type drops its reference');
  r.putMaster('10.96.0.1:80/TCP', fe, master);
  r.deleteMaster('10.96.0.1:80/TCP');
  t.equal(r.clusterMasters('10.96.0.1'), 0, 'a deleted ClusterIP master drops it');
});

t.test('an internal-scope entry keeps its scope: deletes and adoption find it by its own key', async (t) => {
  const twin = { address: '0.0.0.0', family: 4, port: 30080, protocol: 'TCP', scope: 'internal' } as const;
  const r = RealizedState.from({ services: [{ fe: twin, slot: 0, master: { ...master, type: 'NodePort' } }], backends: [], revNat: [] });
  t.same([...r.frontends.keys()], ['0.0.0.0:30080/TCP/internal']);
  t.equal(r.frontends.view('0.0.0.0:30080/TCP/internal')!.scope, 'internal');
  const plain = new RealizedState();
  plain.putSlot('10.96.0.1:80/TCP', { ...fe, scope: undefined }, 1, 3);
  t.notOk('scope' in plain.frontends.view('10.96.0.1:80/TCP')!, 'an external entry carries no scope field');
});

t.test('rows and slot blocks are reused; every uint32 backend id is held as itself', async (t) => {
  const r = new RealizedState();
  const f = r.frontends;
  const ip = (i: number): string => `10.96.${i >> 8}.${i & 255}`;
  const keyOf = (i: number): string => `${ip(i)}:80/TCP`;
  const feOf = (i: number) => ({ ...fe, address: ip(i) });
  for (let i = 0; i < 200; i++) {
    r.putMaster(keyOf(i), feOf(i), { ...master, revNatId: i + 1 });
    for (let s = 1; s <= 3; s++) r.putSlot(keyOf(i), feOf(i), s, 10 * i + s);
  }
  t.equal(f.size, 200);
  const rows = new Set([...f.entries()].map(([, row]) => row));
  t.equal(rows.size, 200, 'a row each');
  for (let i = 0; i < 100; i++) {
    for (let s = 3; s >= 1; s--) r.deleteSlot(keyOf(i), s);
    r.deleteMaster(keyOf(i));
  }
  t.equal(f.size, 100);
  t.equal(f.row(keyOf(0)), NO_ROW, 'a removed entry has no row');
  for (let i = 200; i < 300; i++) {
    r.putMaster(keyOf(i), feOf(i), { ...master, revNatId: i + 1 });
    for (let s = 1; s <= 3; s++) r.putSlot(keyOf(i), feOf(i), s, 10 * i + s);
  }
  const after = new Set([...f.entries()].map(([, row]) => row));
  t.equal(Math.max(...after), Math.max(...rows), 'the freed rows were taken again: no row beyond the first 200');
  for (let i = 100; i < 300; i++) {
    const row = f.row(keyOf(i));
    t.same([f.address(row), f.revNatId(row), [...f.heldSlots(row)]], [ip(i), i + 1, [1, 2, 3].map((s) => [s, 10 * i + s])], `entry ${i} whole`);
  }
  r.putSlot(keyOf(150), feOf(150), 2, 0);
  r.putSlot(keyOf(150), feOf(150), 9, 0xffffffff);
  t.same(f.view(keyOf(150))!.slots, [undefined, 1501, 0, 1503, undefined, undefined, undefined, undefined, undefined, 0xffffffff], 'ids 0 and 2^32-1 held, the gaps missing');
  t.equal(r.slotRefs.get(0), 1);
  t.same(f.view(keyOf(151))!.slots, [undefined, 1511, 1512, 1513], 'a neighbour untouched by the growth');
});

t.test('backends: per-family counts, also when an id changes family', async (t) => {
  const r = new RealizedState();
  r.setBackend(1, b4);
  r.setBackend(2, b6);
  r.setBackend(1, { ...b4, state: 'terminating' });
  t.same([r.entries('lb4_backends'), r.entries('lb6_backends')], [1, 1]);
  r.setBackend(1, b6);
  t.same([r.entries('lb4_backends'), r.entries('lb6_backends')], [0, 2], 'id 1 now an IPv6 backend');
  t.same(r.deleteBackend(2), b6, 'delete returns what it removed');
  t.equal(r.deleteBackend(2), undefined);
  t.same([r.entries('lb4_backends'), r.entries('lb6_backends')], [0, 1]);
});

const SIX = ['lb4_services', 'lb6_services', 'lb4_backends', 'lb6_backends', 'lb4_reverse_nat', 'lb6_reverse_nat'] as const;
const digests = (r: RealizedState): string[] => SIX.map((m) => `${m} ${r.entries(m)} ${r.digest(m).a}/${r.digest(m).b}`);

t.test('the digests follow the entries held, not the writes that led there', async (t) => {
  const top = { address: '255.255.255.255', family: 4, port: 65535, protocol: 'UDP', scope: 'internal' } as const;
  // Written with overwrites and deletes on the way ...
  const a = new RealizedState();
  a.putMaster('10.96.0.1:80/TCP', fe, { ...master, count: 5 });
  a.putSlot('10.96.0.1:80/TCP', fe, 1, 9);
  a.putSlot('10.96.0.1:80/TCP', fe, 1, 7);
  a.putSlot('10.96.0.1:80/TCP', fe, 2, 8);
  a.putSlot('10.96.0.1:80/TCP', fe, 3, 8);
  a.deleteSlot('10.96.0.1:80/TCP', 3);
  a.putMaster('10.96.0.1:80/TCP', fe, master);
  a.putMaster('10.96.0.1:0/ANY', wild, { ...master, type: 'Wildcard' });
  a.putMaster('255.255.255.255:65535/UDP/internal', top, master);
  a.putMaster('[fd00::1]:80/TCP', fe6, master);
  a.putSlot('[fd00::1]:80/TCP', fe6, 1, 2);
  a.setBackend(7, { ...b4, state: 'terminating' });
  a.setBackend(7, b4);
  a.setBackend(8, b6);
  a.setBackend(8, { ...b4, port: 81 });
  a.setBackend(2, b6);
  a.setBackend(3, b6);
  a.deleteBackend(3);
  a.setRevNat(1, 4, { address: '10.96.0.9', port: 80 });
  a.setRevNat(1, 4, { address: '10.96.0.1', port: 80 });
  a.setRevNat(2, 4, { address: '10.96.0.2', port: 80 });
  a.deleteRevNat(2, 4);
  a.setRevNat(1, 6, { address: 'fd00::1', port: 80 });
  // ... or straight, in another order: the same digests.
  const b = new RealizedState();
  b.setRevNat(1, 6, { address: 'fd00::1', port: 80 });
  b.setRevNat(1, 4, { address: '10.96.0.1', port: 80 });
  b.setBackend(2, b6);
  b.setBackend(8, { ...b4, port: 81 });
  b.setBackend(7, b4);
  b.putSlot('[fd00::1]:80/TCP', fe6, 1, 2);
  b.putMaster('[fd00::1]:80/TCP', fe6, master);
  b.putMaster('255.255.255.255:65535/UDP/internal', top, master);
  b.putMaster('10.96.0.1:0/ANY', wild, { ...master, type: 'Wildcard' });
  b.putSlot('10.96.0.1:80/TCP', fe, 2, 8);
  b.putSlot('10.96.0.1:80/TCP', fe, 1, 7);
  b.putMaster('10.96.0.1:80/TCP', fe, master);
  t.same(digests(a), digests(b));
  // Emptied, every digest is where it started.
  const empty = digests(new RealizedState());
  t.notSame(digests(a), empty);
  for (const key of [...a.frontends.keys()]) {
    a.deleteMaster(key);
    for (let s = 1; s < 4; s++) a.deleteSlot(key, s);
  }
  for (const id of [2, 7, 8]) a.deleteBackend(id);
  a.deleteRevNat(1, 4);
  a.deleteRevNat(1, 6);
  t.same(digests(a), empty, 'nothing held: the empty digests');
});

t.test('every field of an entry moves its map\'s digest, and only its own map\'s', async (t) => {
  const one = (write: (r: RealizedState) => void): string[] => {
    const r = new RealizedState();
    write(r);
    return digests(r);
  };
  const base = one((r) => r.putMaster('k', fe, master));
  const variants: Array<[string, (r: RealizedState) => void]> = [
    ['count', (r) => r.putMaster('k', fe, { ...master, count: 3 })],
    ['qcount', (r) => r.putMaster('k', fe, { ...master, qcount: 1 })],
    ['rev-NAT id', (r) => r.putMaster('k', fe, { ...master, revNatId: 2 })],
    ['type', (r) => r.putMaster('k', fe, { ...master, type: 'NodePort' })],
    ['flags', (r) => r.putMaster('k', fe, { ...master, flags: 1 })],
    ['affinity timeout', (r) => r.putMaster('k', fe, { ...master, affinityTimeout: 10 })],
    ['address', (r) => r.putMaster('k', { ...fe, address: '10.96.0.2' }, master)],
    ['port', (r) => r.putMaster('k', { ...fe, port: 81 }, master)],
    ['protocol', (r) => r.putMaster('k', { ...fe, protocol: 'UDP' }, master)],
    ['scope', (r) => r.putMaster('k', { ...fe, scope: 'internal' }, master)],
  ];
  for (const [what, write] of variants) {
    const d = one(write);
    t.not(d[0], base[0], `${what}: lb4_services moves`);
    t.same(d.slice(1), base.slice(1), `${what}: no other map does`);
  }
  const slot = one((r) => r.putSlot('k', fe, 1, 7));
  t.not(one((r) => r.putSlot('k', fe, 2, 7))[0], slot[0], 'a slot: its number');
  t.not(one((r) => r.putSlot('k', fe, 1, 8))[0], slot[0], 'a slot: its backend');
  const be = one((r) => r.setBackend(7, b4));
  for (const [what, b] of [['state', { ...b4, state: 'quarantined' }], ['port', { ...b4, port: 81 }], ['protocol', { ...b4, protocol: 'UDP' }], ['address', { ...b4, address: '10.0.0.2' }]] as const) {
    t.not(one((r) => r.setBackend(7, b as Backend))[2], be[2], `a backend: its ${what}`);
  }
  t.not(one((r) => r.setBackend(8, b4))[2], be[2], 'a backend: its id');
  t.not(one((r) => r.setBackend(7, { ...b6, address: 'fd00::b' }))[3], one((r) => r.setBackend(7, b6))[3], 'an IPv6 backend: its address');
  const rn = one((r) => r.setRevNat(1, 4, { address: '10.96.0.1', port: 80 }));
  t.not(one((r) => r.setRevNat(1, 4, { address: '10.96.0.1', port: 81 }))[4], rn[4], 'rev-NAT: its port');
  t.not(one((r) => r.setRevNat(2, 4, { address: '10.96.0.1', port: 80 }))[4], rn[4], 'rev-NAT: its id');
});

t.test('plain wildcard entries are a bit by address: counted, hashed, deleted, and a row again once written otherwise', async (t) => {
  const wkey = '10.96.0.1:0/ANY';
  const r = new RealizedState();
  const rows = new RealizedState();
  // The same entry as a row: a wildcard with a slot, then without it.
  rows.putSlot(wkey, wild, 1, 5);
  rows.putMaster(wkey, wild, WILDCARD_MASTER);
  rows.deleteSlot(wkey, 1);
  r.putMaster(wkey, wild, WILDCARD_MASTER);
  t.ok(r.hasPlainWildcard('10.96.0.1'));
  t.equal(r.frontends.row(wkey), NO_ROW, 'no row');
  t.equal(r.entries('lb4_services'), 1, 'one entry');
  t.same(r.digest('lb4_services'), rows.digest('lb4_services'), 'hashed as the same entry held as a row');
  r.putMaster(wkey, wild, WILDCARD_MASTER);
  t.equal(r.entries('lb4_services'), 1, 'written again: still one');
  r.putMaster('10.96.0.1:80/TCP', fe, master);
  t.same([r.clusterMasters('10.96.0.1'), r.hasPlainWildcard('10.96.0.1')], [1, true], 'a cluster IP beside it: both kept');
  t.same([...r.plainWildcards()], ['10.96.0.1']);
  r.deleteMaster(wkey);
  t.ok(r.hasPlainWildcard('10.96.0.1'), 'a delete without the key fields cannot find the bit');
  r.deleteMaster(wkey, wild);
  t.same([r.hasPlainWildcard('10.96.0.1'), r.entries('lb4_services'), r.clusterMasters('10.96.0.1')], [false, 1, 1], 'deleted: the frontend stays');
  // Another shape turns the bit into a row, the digest unchanged by the move.
  r.putMaster(wkey, wild, WILDCARD_MASTER);
  const before = { ...r.digest('lb4_services') };
  r.putSlot(wkey, wild, 1, 9);
  t.notOk(r.hasPlainWildcard('10.96.0.1'), 'a slot: a row now');
  t.same(r.frontends.view(wkey), { ...wild, master: WILDCARD_MASTER, slots: [undefined, 9] });
  r.deleteSlot(wkey, 1);
  t.same({ ...r.digest('lb4_services') }, before, 'the slot gone: the digest is what the bit had');
  t.equal(r.entries('lb4_services'), 2);
  const d = RealizedState.from({ services: [{ fe: wild, slot: 0, master: WILDCARD_MASTER }], backends: [], revNat: [] });
  t.ok(d.hasPlainWildcard('10.96.0.1'), 'read back from the maps: the bit');
});

t.test('only an address\'s own wildcard key is the plain bit: other protocol-ANY keys read back from the maps are rows', async (t) => {
  const plain = { fe: wild, slot: 0, master: WILDCARD_MASTER };
  const internal = { fe: { ...wild, scope: 'internal' as const }, slot: 0, master: WILDCARD_MASTER };
  const port80 = { fe: { ...wild, port: 80 }, slot: 0, master: WILDCARD_MASTER };
  const a = RealizedState.from({ services: [plain, internal, port80], backends: [], revNat: [] });
  const b = RealizedState.from({ services: [port80, internal, plain], backends: [], revNat: [] });
  t.equal(a.entries('lb4_services'), 3, 'three entries, counted');
  t.same(a.digest('lb4_services'), b.digest('lb4_services'), 'hashed alike in either order');
  t.ok(a.hasPlainWildcard('10.96.0.1'), 'the address\'s own wildcard: the bit');
  t.not(a.frontends.row('10.96.0.1:0/ANY/internal'), NO_ROW, 'the internal-scope one: a row');
  t.not(a.frontends.row('10.96.0.1:80/ANY'), NO_ROW, 'one on a port: a row');
  a.putSlot('10.96.0.1:80/ANY', port80.fe, 1, 5);
  t.ok(a.hasPlainWildcard('10.96.0.1'), 'a slot written to another ANY key leaves the bit alone');
  a.deleteSlot('10.96.0.1:80/ANY', 1);
  a.deleteMaster('10.96.0.1:0/ANY/internal', internal.fe);
  a.deleteMaster('10.96.0.1:80/ANY', port80.fe);
  t.same([a.entries('lb4_services'), a.hasPlainWildcard('10.96.0.1')], [1, true], 'each deleted by its own key; the bit stays');
  a.deleteMaster('10.96.0.1:0/ANY', wild);
  t.same([a.entries('lb4_services'), { ...a.digest('lb4_services') }], [0, { ...new RealizedState().digest('lb4_services') }], 'and the last: nothing left, the digest back to empty');
});
