// A full map degrades to "what fits is programmed, what does not is named":
// removals of what is no longer desired run before any put (they free the
// room), a put that finds no room (E2BIG) fails its frontend only, the ids
// stay inside the maps' sizes and come round again. The maps are a fake with
// max_entries (test/fakes/fake-maps.ts: a full map answers E2BIG to a new
// key, as test/native/maps.ts shows the kernel's does).
import t from 'tap';
import { PartialWriteError, putOne, type PutBatch } from '../../src/datapath/lbmaps.js';
import { serviceAddrKey } from '../../src/lb/types.js';
import type { Frontend } from '../../src/model/types.js';
import { Reconciler } from '../../src/reconcile/reconciler.js';
import type { LbMapName } from '../../src/reconcile/realized.js';
import { consistent, FakeLbMaps } from '../fakes/fake-maps.js';
import { frontend, state } from '../fakes/frontends.js';



/** Service i: 10.96.0.i:80 with one backend of its own. */
const svc = (i: number): Frontend => frontend(`10.96.0.${i}`, 80, [`10.0.0.${i}`]);
const range = (from: number, to: number): number[] => Array.from({ length: to - from + 1 }, (_, k) => from + k);


/** Frontends the maps serve (a master entry that is not a wildcard). */
const served = (m: FakeLbMaps): string[] =>
  [...m.services.values()].filter((e) => e.slot === 0 && e.master?.type !== 'Wildcard').map((e) => serviceAddrKey(e.fe)).sort();

/** The agent's --max-services 4 (loader.ts): services map 2 * 4 + backends, rev-NAT 4; backends left large. */
const SMALL: Partial<Record<LbMapName, number>> = { lb4_reverse_nat: 4, lb6_reverse_nat: 4, lb4_backends: 1000, lb6_backends: 1000, lb4_services: 1008, lb6_services: 1008 };

t.test('the issue: 2 services, 38 more on a 4-entry rev-NAT map, then the 38 removed and one added', async (t) => {
  const m = new FakeLbMaps(SMALL);
  const r = new Reconciler(m, { maxEntries: SMALL });
  const two = [svc(1), svc(2)];
  t.same(r.sync(state(...two), { prune: true }).notProgrammed, [], 'two services fit');

  const more = range(3, 40).map(svc);
  const over = r.sync(state(...two, ...more), { prune: true });
  t.equal(consistent(m), undefined, 'nothing half-written');
  t.same(served(m), [1, 2, 3, 4].map((i) => `10.96.0.${i}:80/TCP`), 'what fits is programmed (4 rev-NAT entries)');
  t.equal(over.notProgrammed.length, 36, 'the 36 that do not fit are reported');
  t.same(over.notProgrammed[0], { frontend: '10.96.0.5:80/TCP', map: 'lb4_reverse_nat', reason: 'no free IPv4 rev-NAT id: all 4 are in use' }, 'by name, map and reason');
  t.ok([...m.revNat.values()].every((e) => e.id >= 1 && e.id <= 4), 'rev-NAT ids stay within the map’s 4 entries');
  t.same(r.pressure().find((p) => p.map === 'lb4_reverse_nat'), { map: 'lb4_reverse_nat', entries: 4, maxEntries: 4 }, 'the rev-NAT map is reported full');

  // A retry while still over changes nothing and still reports them.
  t.equal(r.sync(state(...two, ...more), { prune: true }).notProgrammed.length, 36, 'a retry reports the same');

  const added = svc(41);
  let res = r.sync(state(...two, added), { prune: true });
  t.same(served(m).filter((k) => k !== '10.96.0.41:80/TCP'), ['10.96.0.1:80/TCP', '10.96.0.2:80/TCP'], 'the 38 removed services are no longer served');
  t.equal(m.revNat.size, 2 + (m.services.has('10.96.0.41:80/TCP#0') ? 1 : 0), 'their rev-NAT entries are gone');
  // Their ids are free once their entries are deleted (a freed id is not
  // handed out in the same sync): the next sync (the agent retries) programs it.
  if (res.notProgrammed.length > 0) res = r.sync(state(...two, added), { prune: true });
  t.same(res.notProgrammed, [], 'the new service is programmed');
  t.ok(m.services.has('10.96.0.41:80/TCP#0'), 'and served');
  const id = m.services.get('10.96.0.41:80/TCP#0')!.master!.revNatId;
  t.ok(id >= 1 && id <= 4, `with a rev-NAT id inside the map's range (${id}), not 41`);
  t.equal(consistent(m), undefined, 'consistent');
  t.equal(r.sync(state(...two, added), { prune: true }).planned, 0, 'converged: nothing left to write');
});

t.test('without id limits, a full map still does not wedge the sync: removals run first', async (t) => {
  // The same over-ask with ids spanning 32 bits: the kernel's E2BIG is what stops the puts.
  const m = new FakeLbMaps({ lb4_reverse_nat: 4 });
  const r = new Reconciler(m);
  r.sync(state(...range(1, 40).map(svc)), { prune: true });
  t.equal(served(m).length, 4, 'four fit');
  const res = r.sync(state(svc(1), svc(2), svc(41)), { prune: true });
  t.equal(consistent(m), undefined, 'consistent');
  t.same(res.notProgrammed, [], 'the removals made room: the new service is programmed in the same sync');
  t.same(served(m), ['10.96.0.1:80/TCP', '10.96.0.2:80/TCP', '10.96.0.41:80/TCP'], 'and the removed ones are gone');
  t.equal(m.revNat.size, 3);
});

t.test('a frontend whose put finds no room: the rest of it is skipped, the others are written', async (t) => {
  const m = new FakeLbMaps({ lb4_backends: 3 });
  const r = new Reconciler(m);
  const a = frontend('10.96.0.1', 80, ['10.0.0.1']);
  const b = frontend('10.96.0.2', 80, ['10.0.0.2', '10.0.0.3', '10.0.0.4']);
  const c = frontend('10.96.0.3', 80, ['10.0.0.1']);
  const res = r.sync(state(a, b, c), { prune: true });
  t.equal(consistent(m), undefined, 'no master counts a slot whose backend is missing');
  t.same(served(m), ['10.96.0.1:80/TCP', '10.96.0.3:80/TCP'], 'a and c (sharing a backend that fit) are served');
  t.notOk(m.services.has('10.96.0.2:80/TCP#0'), 'b is not selectable');
  t.same(res.notProgrammed.map((n) => [n.frontend, n.map]), [['10.96.0.2:80/TCP', 'lb4_backends']], 'b is reported, with the map');
  t.match(res.notProgrammed[0]!.reason, /put backend \d+ \(10\.0\.0\.4:8080\/TCP\): .*E2BIG/, 'naming the write and the kernel’s error');
});

t.test('an update that does not fit keeps the previous version, and its backends are not deleted', async (t) => {
  const m = new FakeLbMaps({ lb4_backends: 2 });
  const r = new Reconciler(m);
  const a1 = frontend('10.96.0.1', 80, ['10.0.0.1']);
  const b = frontend('10.96.0.2', 80, ['10.0.0.2']);
  r.sync(state(a1, b), { prune: true });
  const before = m.services.get('10.96.0.1:80/TCP#1')!.backendId!;
  // a moves to a new backend: there is no room for it while the old one is still named.
  const a2 = frontend('10.96.0.1', 80, ['10.0.0.9']);
  const res = r.sync(state(a2, b), { prune: true });
  t.equal(consistent(m), undefined, 'consistent');
  t.same(res.notProgrammed.map((n) => n.frontend), ['10.96.0.1:80/TCP'], 'a is reported');
  t.equal(m.services.get('10.96.0.1:80/TCP#1')?.backendId, before, 'a still selects its previous backend');
  t.ok(m.backends.has(before), 'which a delete planned on the assumption that a moves was not allowed to remove');
  t.equal(m.backends.get(before)?.address, '10.0.0.1');
  // Room appears (b goes away): the next sync programs a's new version.
  const res2 = r.sync(state(a2), { prune: true });
  const res3 = res2.notProgrammed.length > 0 ? r.sync(state(a2), { prune: true }) : res2;
  t.same(res3.notProgrammed, [], 'a is programmed once there is room');
  t.equal(m.backends.get(m.services.get('10.96.0.1:80/TCP#1')!.backendId!)?.address, '10.0.0.9', 'with its new backend');
  t.equal(consistent(m), undefined, 'consistent');
});

/** FakeLbMaps with putBatch: E2BIG inside a batch comes back as a PartialWriteError, as KernelLbMaps reports it. */
class BatchingMaps extends FakeLbMaps {
  batches = 0;
  putBatch(b: PutBatch, from: number, to: number): void {
    this.batches++;
    for (let i = from; i < to; i++) {
      try {
        putOne(this, b, i);
      } catch (err) {
        throw new PartialWriteError((err as Error).message, i - from, { cause: err });
      }
    }
  }
}

t.test('batched writes: a batch that meets a full map programs the same as one-by-one writes', async (t) => {
  const caps = { lb4_reverse_nat: 5 };
  const d = state(...range(1, 12).map(svc));
  const one = new FakeLbMaps(caps);
  const batched = new BatchingMaps(caps);
  const r1 = new Reconciler(one);
  const r2 = new Reconciler(batched);
  const res1 = r1.sync(d, { prune: true });
  const res2 = r2.sync(d, { prune: true });
  t.ok(batched.batches > 0, 'batches were used');
  t.same(res2.notProgrammed, res1.notProgrammed, 'the same frontends are reported');
  t.equal(res2.notProgrammed.length, 7);
  t.same(served(batched), served(one), 'and the same are served');
  t.same(batched.dump(), one.dump(), 'the maps hold the same');
  t.equal(consistent(batched), undefined, 'consistent');
  t.same(r2.realized, r1.realized, 'the realized state names exactly the writes made');
});

t.test('ids: rev-NAT ids 1..max_entries of the rev-NAT map, backend ids 1..the room of both backend maps', async (t) => {
  const caps = { lb4_reverse_nat: 3, lb6_reverse_nat: 7, lb4_backends: 10, lb6_backends: 6 };
  const r = new Reconciler(new FakeLbMaps(caps), { maxEntries: caps });
  t.same([r.revNatIds[4].min, r.revNatIds[4].max, r.revNatIds[6].max], [1, 3, 7]);
  t.same([r.backendIds.min, r.backendIds.max], [1, 16]);
  const unlimited = new Reconciler(new FakeLbMaps());
  t.equal(unlimited.revNatIds[4].max, 0xffffffff, 'unknown sizes: 32-bit ids');
  t.same(unlimited.pressure(), [], 'and no pressure to report');
});

t.test('ids beyond the maps’ range (maps written by a wider range) are kept, not renumbered: nothing to rewrite, even in an exactly full map', async (t) => {
  const m = new FakeLbMaps();
  const wide = new Reconciler(m);
  const fes = range(1, 8).map(svc);
  wide.sync(state(...fes), { prune: true });
  const keep = state(...fes.slice(4)); // svc 5..8 stay, with rev-NAT ids 5..8 and backend ids 5..8
  wide.sync(keep, { prune: true });
  // Restored with maps exactly as full as what they hold: renumbering would
  // need a free entry before the old one could go, and there is none.
  const caps = { lb4_reverse_nat: 4, lb6_reverse_nat: 4, lb4_backends: 4, lb6_backends: 1 };
  m.maxEntries = caps;
  const r = new Reconciler(m, { maxEntries: caps });
  r.restore();
  m.calls.length = 0;
  const res = r.sync(keep, { prune: true });
  t.same(res.notProgrammed, [], 'every frontend is programmed');
  t.equal(res.planned, 0, 'nothing is rewritten: no socket rev-NAT entry goes stale');
  t.same(served(m), fes.slice(4).map((f) => f.key).sort(), 'the same services served');
  t.same([...m.revNat.values()].map((e) => e.id).sort(), [5, 6, 7, 8], 'with their old rev-NAT ids');

  // One goes and a new one comes: the new one gets ids from the range.
  const next = state(...fes.slice(5), svc(20));
  // A full plan counts only the removed frontends' own entries as room; the
  // rev-NAT entry they leave is deleted at the end, so the new service fits
  // on the next sync, which the agent runs at once when a sync deleted anything.
  const first = r.sync(next, { prune: true });
  t.ok((first.byKind['delete-revnat'] ?? 0) > 0, 'the old service and its rev-NAT entry are gone');
  const after = r.sync(next, { prune: true });
  t.same(after.notProgrammed, [], 'the new service fits in the room the old one freed');
  const id20 = m.services.get(`${svc(20).key}#0`)?.master?.revNatId;
  t.ok(id20 !== undefined && id20 >= 1 && id20 <= 4, `its rev-NAT id is within 1..4: ${id20}`);
  const slot20 = m.services.get(`${svc(20).key}#1`)?.backendId;
  t.ok(slot20 !== undefined && slot20 >= 1 && slot20 <= 5, `its backend id is within 1..5 (4 + 1): ${slot20}`);
  t.equal(consistent(m), undefined, 'consistent');
  t.equal(r.sync(next, { prune: true }).planned, 0, 'converged');
});

t.test('map pressure: entries the realized state holds / max_entries, per map', async (t) => {
  const caps = { lb4_services: 100, lb6_services: 100, lb4_backends: 10, lb6_backends: 10, lb4_reverse_nat: 8, lb6_reverse_nat: 8 };
  const m = new FakeLbMaps(caps);
  const r = new Reconciler(m, { maxEntries: caps });
  r.sync(state(svc(1), frontend('10.96.0.1', 443, ['10.0.0.1', '10.0.0.2']), frontend('fd00::1', 80, ['fd00::a'])), { prune: true });
  const p = Object.fromEntries(r.pressure().map((x) => [x.map, [x.entries, x.maxEntries]]));
  // lb4_services: 2 masters + 3 slots + 1 wildcard; lb6: 1 master + 1 slot + 1 wildcard.
  t.same(p, { lb4_services: [6, 100], lb6_services: [3, 100], lb4_backends: [2, 10], lb6_backends: [1, 10], lb4_reverse_nat: [2, 8], lb6_reverse_nat: [1, 8] });
  for (const name of Object.keys(caps) as LbMapName[]) t.equal(p[name]![0], m.entries(name), `${name}: the realized count equals the map's`);
  r.sync(state(), { prune: true });
  t.ok(r.pressure().every((x) => x.entries === 0), 'and all zero once everything is removed');
});

t.test('liveness probe: a full rev-NAT map is not a failure', async (t) => {
  // Nothing realized (the entries were written behind the agent's back), the map full.
  const m = new FakeLbMaps({ lb4_reverse_nat: 1 });
  m.revNat.set('4/9', { id: 9, family: 4, address: '10.9.9.9', port: 9 });
  const r = new Reconciler(m);
  t.doesNotThrow(() => r.probeWrite(), 'the probe passes: the kernel answered');
  t.same([...m.revNat.keys()], ['4/9'], 'and leaves the map as it was');
  const eperm = new FakeLbMaps();
  eperm.failWhen = (c) => c.method === 'putRevNat';
  t.throws(() => new Reconciler(eperm).probeWrite(), { code: 'EPERM' }, 'any other error still fails it');
});

t.test('a frontend out of ids is held as the maps have it, and nothing it uses is deleted', async (t) => {
  const m = new FakeLbMaps();
  const r = new Reconciler(m, { maxEntries: { lb4_reverse_nat: 8, lb6_reverse_nat: 8, lb4_backends: 1, lb6_backends: 1 } });
  const a1 = frontend('10.96.0.1', 80, ['10.0.0.1']);
  r.sync(state(a1), { prune: true });
  // 2 backend ids in all (1 + 1): a's second backend finds none.
  const a2 = frontend('10.96.0.1', 80, ['10.0.0.1', '10.0.0.2', '10.0.0.3']);
  const res = r.sync(state(a2), { prune: true });
  t.same(res.notProgrammed, [{ frontend: '10.96.0.1:80/TCP', map: 'lb4_backends', reason: 'no free backend id: all 2 are in use' }]);
  t.same(served(m), ['10.96.0.1:80/TCP'], 'a keeps being served');
  t.equal(m.services.get('10.96.0.1:80/TCP#0')?.master?.count, 1, 'in its previous version');
  t.ok(m.services.has('10.96.0.1:0/ANY#0'), 'its wildcard stays');
  t.equal(consistent(m), undefined, 'consistent');
  t.equal(m.backends.size, 1, 'its backend stays');
});


t.test('with the sizes known, a frontend is written whole or not at all: no slots of frontends whose master cannot fit', async (t) => {
  // Each frontend needs 3 services-map entries (master, slot, wildcard): 8 entries hold 2.
  const caps = { lb4_services: 8 };
  const m = new FakeLbMaps(caps);
  const r = new Reconciler(m, { maxEntries: caps });
  const res = r.sync(state(...range(1, 6).map(svc)), { prune: true });
  t.same(served(m), ['10.96.0.1:80/TCP', '10.96.0.2:80/TCP'], 'the first two are served');
  t.equal(m.services.size, 6, 'and nothing else sits in the services map (no orphan slots)');
  t.same(res.notProgrammed.map((n) => n.frontend), range(3, 6).map((i) => `10.96.0.${i}:80/TCP`), 'the other four are reported');
  t.match(res.notProgrammed[0]!.reason, /lb4_services is full: 2 free of 8 entries, 10\.96\.0\.3:80\/TCP needs 3 more/);
  t.equal(m.backends.size, 2, 'their backends are not written either');
  t.equal(m.revNat.size, 2, 'nor their rev-NAT entries');
});
