// Batched writes: runs of puts of one kind and family go to LbMaps.putBatch
// (BPF_MAP_UPDATE_BATCH on the kernel's maps). The result must be exactly
// what one-by-one writes give, and a batch that fails part way must leave
// the realized state naming exactly the writes that happened.
import t from 'tap';
import { PartialWriteError, putOne, type PutBatch } from '../../src/datapath/lbmaps.js';
import { desiredState } from '../../src/model/desired.js';
import { validateEndpointSlice, validateService } from '../../src/model/k8s.js';
import type { DesiredState } from '../../src/model/types.js';
import { Reconciler, SyncError } from '../../src/reconcile/reconciler.js';
import { FakeLbMaps } from '../fakes/fake-maps.js';
import { service, slice } from '../fakes/objects.js';

/** FakeLbMaps with putBatch; `failAt` makes the write with that global index fail (inside its batch). */
class BatchingMaps extends FakeLbMaps {
  batches: number[] = [];
  writes = 0;
  failAt: number | undefined;

  putBatch(b: PutBatch, from: number, to: number): void {
    this.batches.push(to - from);
    for (let i = from; i < to; i++) {
      if (this.writes === this.failAt) throw new PartialWriteError('E2BIG: map full', i - from);
      this.writes++;
      putOne(this, b, i);
    }
  }
}

function desired(n: number, dual = false): DesiredState {
  const services = [];
  const slices = [];
  for (let i = 0; i < n; i++) {
    const ips = dual ? [`10.96.0.${i + 1}`, `fd00::${i + 1}`] : [`10.96.0.${i + 1}`];
    const v = validateService(service(`s${i}`, ips, [{ name: 'p', port: 80, protocol: 'TCP' }]));
    if (!v.ok) throw new Error(v.reason);
    services.push(v.value);
    const families: Array<['IPv4' | 'IPv6', string[]]> = [['IPv4', [`10.244.${i}.1`, `10.244.${i}.2`, `10.244.${i}.3`]]];
    if (dual) families.push(['IPv6', [`fd00:244::${i}:1`]]);
    for (const [fam, addrs] of families) {
      const e = validateEndpointSlice(slice(`s${i}-${fam.toLowerCase()}`, `s${i}`, fam, [{ name: 'p', port: 8080, protocol: 'TCP' }], addrs.map((a) => ({ addresses: [a] }))));
      if (!e.ok) throw new Error(e.reason);
      slices.push(e.value);
    }
  }
  return desiredState({ services, slices }).frontends;
}

t.test('batched writes give the same maps as one-by-one writes, in a few batches', async (t) => {
  const want = desired(20, true);
  const plain = new FakeLbMaps();
  new Reconciler(plain).sync(want, { prune: true });
  const batching = new BatchingMaps();
  const r = new Reconciler(batching).sync(want, { prune: true });
  t.same(batching.dump(), plain.dump(), 'identical maps');
  t.equal(r.applied, r.planned, 'every write applied');
  t.ok(batching.batches.length <= 10, `${r.planned} writes in ${batching.batches.length} batches (${batching.batches.join(', ')})`);
  const again = new Reconciler(batching);
  again.restore();
  t.equal(again.sync(want, { prune: true }).planned, 0, 'a restored reconciler plans nothing');
});

t.test('a batch that fails part way: the realized state holds exactly what was written, and the next sync finishes', async (t) => {
  const want = desired(10);
  const maps = new BatchingMaps();
  maps.failAt = 35; // inside the slot batch (30 backends, 10 rev-NAT entries come first)
  const rec = new Reconciler(maps);
  const err = t.throws(() => rec.sync(want, { prune: true })) as unknown as SyncError;
  t.ok(err instanceof SyncError, 'a SyncError');
  t.equal(err.applied, 35, 'it counts the 35 writes that happened');
  t.match(err.message, /E2BIG: map full/, 'and says why');
  const fresh = new Reconciler(maps);
  fresh.restore();
  t.same(fresh.realized, rec.realized, 'the realized state matches the maps exactly');
  maps.failAt = undefined;
  const r = rec.sync(want, { prune: true });
  t.equal(r.planned, r.applied, `the next sync writes the rest (${r.applied})`);
  const check = new Reconciler(maps);
  check.restore();
  t.equal(check.sync(want, { prune: true }).planned, 0, 'and the maps are complete');
});
