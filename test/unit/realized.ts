// RealizedState: the maps as last written or read, with the reference
// counts change syncs rely on and the per-map entry counts of map pressure.
import t from 'tap';
import type { MapsDump } from '../../src/datapath/lbmaps.js';
import { serviceAddr4Id, type Backend } from '../../src/lb/types.js';
import { RealizedState, heldSlots } from '../../src/reconcile/realized.js';

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
  const e = r.frontends.get('10.96.0.1:80/TCP')!;
  t.same([...heldSlots(e)], [[1, 7], [3, 7]], 'slots 1 and 3, slot 2 missing');
  t.equal(e.slots.length - 1, 3, 'length - 1 is the highest slot held');
  t.equal(r.slotRefs.get(7), 2, 'backend 7 is named by two slots');
  t.equal(r.slotRefs.get(8), 1);
  t.equal(r.addrRefs.get('10.96.0.1'), 1, 'one ClusterIP master at the address (the wildcard does not count)');
  t.equal(r.addrRefs.get('fd00::1'), undefined, 'slots without a master do not count: no type says the address needs a wildcard');
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
  t.same(r.frontends.get(key)!.slots, [undefined, undefined, 5]);
  r.putSlot(key, fe, 2, 5);
  t.equal(r.entries('lb4_services'), 1, 'rewriting the same slot adds nothing');
  r.putSlot(key, fe, 2, 6);
  t.same([r.slotRefs.get(5), r.slotRefs.get(6)], [undefined, 1], 'a slot moved to another backend moves its reference');
  r.putMaster(key, fe, master);
  r.putMaster(key, fe, { ...master, count: 1 });
  t.equal(r.entries('lb4_services'), 2, 'a master rewritten is still one entry');
  r.deleteSlot(key, 2);
  t.same(r.frontends.get(key)!.slots, [undefined], 'trailing empty slots are trimmed');
  t.equal(r.slotRefs.has(6), false);
  t.ok(r.frontends.has(key), 'the master keeps the entry');
  r.deleteMaster(key);
  t.notOk(r.frontends.has(key), 'nothing left: the entry goes');
  t.equal(r.addrRefs.has('10.96.0.1'), false, 'and its address reference');
  t.equal(r.entries('lb4_services'), 0);
  r.deleteMaster(key);
  r.deleteSlot(key, 1);
  t.equal(r.entries('lb4_services'), 0, 'deleting what is not there changes nothing');
});

t.test('address references count ClusterIP masters only: other frontends have no wildcard', async (t) => {
  const r = new RealizedState();
  const np = { address: '0.0.0.0', family: 4, port: 30080, protocol: 'TCP' } as const;
  r.putMaster('0.0.0.0:30080/TCP', np, { ...master, type: 'NodePort' });
  t.equal(r.addrRefs.has('0.0.0.0'), false, 'a NodePort surrogate');
  const ext = { address: '10.96.0.1', family: 4, port: 443, protocol: 'TCP' } as const;
  r.putMaster('10.96.0.1:443/TCP', ext, { ...master, type: 'ExternalIP' });
  t.equal(r.addrRefs.has('10.96.0.1'), false, 'an external IP');
  r.putMaster('10.96.0.1:80/TCP', fe, master);
  t.equal(r.addrRefs.get('10.96.0.1'), 1, 'a cluster IP at the same address');
  r.putMaster('10.96.0.1:80/TCP', fe, { ...master, type: 'LoadBalancer' });
  t.equal(r.addrRefs.has('10.96.0.1'), false, 'the same key turned into another type drops its reference');
  r.putMaster('10.96.0.1:80/TCP', fe, master);
  r.deleteMaster('10.96.0.1:80/TCP');
  t.equal(r.addrRefs.has('10.96.0.1'), false, 'a deleted ClusterIP master drops it');
});

t.test('an internal-scope entry keeps its scope: deletes and adoption find it by its own key', async (t) => {
  const twin = { address: '0.0.0.0', family: 4, port: 30080, protocol: 'TCP', scope: 'internal' } as const;
  const r = RealizedState.from({ services: [{ fe: twin, slot: 0, master: { ...master, type: 'NodePort' } }], backends: [], revNat: [] });
  t.same([...r.frontends.keys()], ['0.0.0.0:30080/TCP/internal']);
  t.equal(r.frontends.get('0.0.0.0:30080/TCP/internal')!.fe.scope, 'internal');
  const plain = new RealizedState();
  plain.putSlot('10.96.0.1:80/TCP', { ...fe, scope: undefined }, 1, 3);
  t.notOk('scope' in plain.frontends.get('10.96.0.1:80/TCP')!.fe, 'an external entry carries no scope field');
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

t.test('IPv4 frontends are found by their numeric key too, and leave that index with their last entry', async (t) => {
  const id = (address: number, port: number, protocol: 'TCP' | 'UDP' | 'ANY', scope?: 'internal'): number => serviceAddr4Id(address, port, protocol, scope);
  const r = new RealizedState();
  r.putMaster('10.96.0.1:80/TCP', fe, master);
  r.putSlot('10.96.0.1:80/TCP', fe, 1, 7);
  r.putMaster('10.96.0.1:0/ANY', wild, { ...master, type: 'Wildcard' });
  const top = { address: '255.255.255.255', family: 4, port: 65535, protocol: 'UDP', scope: 'internal' } as const;
  r.putMaster('255.255.255.255:65535/UDP/internal', top, master);
  r.putSlot('[fd00::1]:80/TCP', fe6, 1, 8);
  t.equal(r.frontendAt4(id(0x0a600001, 80, 'TCP')), r.frontends.get('10.96.0.1:80/TCP'), 'by address, port and protocol');
  t.equal(r.frontendAt4(id(0x0a600001, 0, 'ANY')), r.frontends.get('10.96.0.1:0/ANY'), 'the wildcard has its own');
  t.equal(r.frontendAt4(id(0x0a600001, 80, 'UDP')), undefined, 'another protocol is another frontend');
  t.equal(r.frontendAt4(id(0x0a600001, 80, 'TCP', 'internal')), undefined, 'so is the internal scope');
  t.equal(r.frontendAt4(id(0xffffffff, 65535, 'UDP', 'internal')), r.frontends.get('255.255.255.255:65535/UDP/internal'), 'the largest key is exact (below 2^53)');
  t.ok(id(0xffffffff, 65535, 'UDP', 'internal') < Number.MAX_SAFE_INTEGER);
  t.equal(r.frontendAt('[fd00::1]:80/TCP'), r.frontends.get('[fd00::1]:80/TCP'), 'IPv6 by its key text');
  r.deleteMaster('10.96.0.1:80/TCP');
  t.ok(r.frontendAt4(id(0x0a600001, 80, 'TCP')), 'kept while a slot remains');
  r.deleteSlot('10.96.0.1:80/TCP', 1);
  t.equal(r.frontendAt4(id(0x0a600001, 80, 'TCP')), undefined, 'gone with its last entry');
  t.equal(r.frontends.has('10.96.0.1:80/TCP'), false);
});
