// src/datapath/maps.ts against the real kernel: the datapath object is
// loaded (not attached) with small maps into a fresh pin directory under
// bpffs, and KernelLbMaps writes, reads back and deletes through it. It
// also pins down what the reconciler relies on when a map is full: a BPF
// hash map answers E2BIG to a new key, for a single update and inside
// BPF_MAP_UPDATE_BATCH (with the count written before it), while an update
// of an existing key (BPF_ANY or BPF_EXIST) and a delete still work. Root only.
import t, { type Test } from 'tap';
import { mapSpecs } from '../../src/datapath/abi.gen.js';
import { PartialWriteError } from '../../src/datapath/lbmaps.js';
import { KernelLbMaps, LB_MAP_NAMES, verifyMapLayout, type ByteMap } from '../../src/datapath/maps.js';
import type { Backend } from '../../src/lb/types.js';
import { frontendKey } from '../../src/lb/types.js';
import type { DesiredState, Frontend } from '../../src/model/types.js';
import { BpfError } from '../../src/native/bpf.js';
import { Reconciler, isNoRoom } from '../../src/reconcile/reconciler.js';
import { PutRun } from '../../src/reconcile/plan.js';
import { loadDatapathMaps } from '../helpers/datapath-maps.js';

const SMALL = 4;


/** The datapath object loaded into a fresh pin dir with 4-entry maps; removed at teardown, even on failure. */
function loadSmall(t: Test): ReturnType<typeof loadDatapathMaps> {
  return loadDatapathMaps(t, 'maps', SMALL);
}

const be = (i: number, family: 4 | 6 = 4): Backend =>
  family === 4
    ? { address: `10.0.0.${i}`, family, port: 8080, protocol: 'TCP', state: 'active' }
    : { address: `fd00::${i}`, family, port: 8080, protocol: 'UDP', state: 'terminating' };

function frontend(i: number): Frontend {
  const addr = { address: `10.96.0.${i}`, family: 4, port: 80, protocol: 'TCP' } as const;
  return {
    ...addr,
    key: frontendKey(addr),
    type: 'ClusterIP',
    service: { namespace: 'default', name: `svc-${i}`, portName: 'p' },
    backends: [{ address: `10.0.0.${i}`, family: 4, port: 8080, protocol: 'TCP', state: 'active' }],
    terminating: [],
    maglev: false,
    affinityTimeout: 0,
    localOnly: false,
    externalLocal: false,
    sourceRanges: [],
  };
}
const state = (...fes: Frontend[]): DesiredState => new Map(fes.map((f) => [f.key, f]));

if (process.getuid?.() !== 0) {
  t.bailout('test/native/maps.ts needs root: it loads the real datapath object');
} else {
  t.test('KernelLbMaps: every kind of entry written, read back and deleted, both families', async (t) => {
    const { set } = await loadSmall(t);
    const maps = new KernelLbMaps(set);
    for (const name of LB_MAP_NAMES) t.equal(set[name].maxEntries, SMALL, `${name} loaded with max_entries ${SMALL}`);
    const fe4 = { address: '10.96.0.10', family: 4, port: 80, protocol: 'TCP' } as const;
    const fe6 = { address: 'fd00:96::10', family: 6, port: 53, protocol: 'UDP' } as const;
    const master = { count: 1, qcount: 0, revNatId: 3, type: 'ClusterIP', flags: 0, affinityTimeout: 10800 } as const;
    maps.putBackend(7, be(7));
    maps.putBackend(8, be(8, 6));
    maps.putRevNat(3, 4, { address: fe4.address, port: 80 });
    maps.putRevNat(3, 6, { address: fe6.address, port: 53 });
    maps.putSlot(fe4, 1, 7);
    maps.putMaster(fe4, master);
    maps.putSlot(fe6, 1, 8);
    maps.putMaster(fe6, { ...master, qcount: 1, count: 0, type: 'Wildcard' });
    const d = maps.dump();
    t.same(
      [...d.backends].sort((a, b) => a.id - b.id),
      [
        { id: 7, backend: be(7) },
        { id: 8, backend: be(8, 6) },
      ],
      'backends: address, port, protocol, state and family round-trip',
    );
    t.same(
      [...d.revNat].sort((a, b) => a.family - b.family),
      [
        { id: 3, family: 4, address: fe4.address, port: 80 },
        { id: 3, family: 6, address: fe6.address, port: 53 },
      ],
      'rev-NAT entries per family',
    );
    const byKey = new Map(d.services.map((e) => [`${e.fe.address}:${e.fe.port}/${e.fe.protocol}#${e.slot}`, e]));
    t.same(byKey.get('10.96.0.10:80/TCP#0')?.master, master, 'the IPv4 master');
    t.equal(byKey.get('10.96.0.10:80/TCP#1')?.backendId, 7, 'its slot');
    t.same(byKey.get('fd00:96::10:53/UDP#0')?.master, { ...master, qcount: 1, count: 0, type: 'Wildcard' }, 'the IPv6 master');
    t.equal(byKey.get('fd00:96::10:53/UDP#1')?.backendId, 8, 'its slot');

    maps.deleteMaster(fe4);
    maps.deleteSlot(fe4, 1);
    maps.deleteRevNat(3, 4);
    maps.deleteBackend(7, 4);
    const after = maps.dump();
    t.same(after.services.map((e) => e.fe.family), [6, 6], 'the IPv4 entries are gone, the IPv6 ones stay');
    t.same(after.backends.map((b) => b.id), [8]);
    t.same(after.revNat.map((e) => e.family), [6]);
  });

  t.test('a full hash map: E2BIG to a new key (single and batch), an existing key still takes a write', async (t) => {
    const { set } = await loadSmall(t);
    const maps = new KernelLbMaps(set);
    for (let id = 1; id <= SMALL; id++) maps.putRevNat(id, 4, { address: `10.96.0.${id}`, port: 80 });

    const single = t.throws(() => maps.putRevNat(5, 4, { address: '10.96.0.5', port: 80 })) as unknown;
    t.ok(single instanceof BpfError, 'a BpfError');
    t.match(single, { code: 'E2BIG', errno: 7 }, 'single update of a new key into the full map: E2BIG');
    t.ok(isNoRoom(single), 'which the reconciler reads as "no room"');

    t.doesNotThrow(() => maps.putRevNat(2, 4, { address: '10.96.9.2', port: 81 }), 'BPF_ANY update of an existing key on the full map works');
    t.doesNotThrow(() => maps.rewriteRevNat(3, 4, { address: '10.96.0.3', port: 80 }), 'BPF_EXIST rewrite works too (the liveness probe)');
    t.throws(() => maps.rewriteRevNat(9, 4, { address: '10.96.0.9', port: 80 }), { code: 'ENOENT' }, 'BPF_EXIST of a missing key: ENOENT, never an insert');

    // A batch: two existing keys, then two new ones.
    const batch = new PutRun('put-revnat', 4);
    for (const id of [2, 4, 6, 7]) batch.revNat(id, `rev-NAT ${id}`, { address: `10.96.1.${id}`, port: 80 });
    const err = t.throws(() => maps.putBatch(batch, 0, batch.length)) as unknown;
    t.ok(err instanceof PartialWriteError, 'BPF_MAP_UPDATE_BATCH into the full map fails part way');
    t.equal((err as PartialWriteError).written, 2, 'after the two existing keys (the count the kernel reports)');
    t.match((err as PartialWriteError).cause, { code: 'E2BIG' }, 'with E2BIG');
    t.ok(isNoRoom((err as PartialWriteError).cause), 'no room');
    const now = new Map(maps.dump().revNat.map((e) => [e.id, e.address]));
    t.same([...now.keys()].sort(), [1, 2, 3, 4], 'nothing new was inserted');
    t.equal(now.get(4), '10.96.1.4', 'and the writes before the failure are in');

    maps.deleteRevNat(1, 4);
    t.doesNotThrow(() => maps.putRevNat(5, 4, { address: '10.96.0.5', port: 80 }), 'a delete makes room for a new key');
  });

  t.test('the reconciler over the real maps: what fits is programmed, removals make room, the probe passes', async (t) => {
    const { set, maxEntries } = await loadSmall(t);
    const maps = new KernelLbMaps(set);
    const r = new Reconciler(maps, { maxEntries });
    const fes = Array.from({ length: 8 }, (_, i) => frontend(i + 1));
    const over = r.sync(state(...fes), { prune: true });
    // Each frontend needs a master, a slot and a wildcard: the 4-entry services map holds one.
    t.ok(over.notProgrammed.length > 0, `${over.notProgrammed.length} frontends reported not programmed`);
    t.ok(over.notProgrammed.every((n) => /E2BIG|no free|is full/.test(n.reason)), 'each for want of room');
    const served = (): string[] => maps.dump().services.filter((e) => e.slot === 0 && e.master?.type !== 'Wildcard').map((e) => e.fe.address).sort();
    t.same(served(), ['10.96.0.1'], 'what fits is served: the first frontend, whole');
    t.equal(over.notProgrammed.length, 7, 'the other seven are reported');
    const programmed = new Set(served());
    t.same(
      over.notProgrammed.map((n) => n.frontend.split(':')[0]).filter((a) => programmed.has(a!)),
      [],
      'nothing reported is served, nothing served is reported',
    );
    for (const p of r.pressure()) {
      t.equal(p.entries, set[p.map].entries().length, `${p.map}: the realized count is the kernel's (${p.entries}/${p.maxEntries})`);
    }
    t.doesNotThrow(() => r.probeWrite(), 'the liveness probe passes with full maps');

    // All removed, one new: programmed (within two syncs: a freed id comes round on the next).
    const fresh = frontend(41);
    let res = r.sync(state(fresh), { prune: true });
    if (res.notProgrammed.length > 0) res = r.sync(state(fresh), { prune: true });
    t.same(res.notProgrammed, [], 'the new frontend is programmed');
    t.same(served(), ['10.96.0.41'], 'and alone served');
    const id = maps.dump().services.find((e) => e.slot === 0 && e.fe.address === '10.96.0.41' && e.fe.protocol === 'TCP')!.master!.revNatId;
    t.ok(id >= 1 && id <= SMALL, `its rev-NAT id ${id} is within the map's ${SMALL} entries`);
  });

  t.test('verifyMapLayout names the map whose layout differs', async (t) => {
    const { set } = await loadSmall(t);
    const real = set.lb4_backends;
    const wrong: ByteMap = {
      name: real.name,
      keySize: real.keySize,
      valueSize: real.valueSize + 4,
      maxEntries: real.maxEntries,
      lookup: (k) => real.lookup(k),
      update: (k, v, f) => real.update(k, v, f),
      delete: (k) => real.delete(k),
      entries: () => real.entries(),
    };
    t.doesNotThrow(() => verifyMapLayout(real, mapSpecs.lb4_backends), 'the loaded map matches the codecs');
    t.throws(() => verifyMapLayout(wrong, mapSpecs.lb4_backends), { message: /map lb4_backends: value is \d+ bytes, lbctl expects \d+/ });
  });

}
