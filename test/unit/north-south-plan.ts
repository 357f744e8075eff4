// The tc datapath's per-frontend writes through the plan and the
// reconciler: a north-south frontend's Maglev table and source ranges are
// written before the master whose flags send the datapath to them, and
// deleted after it; a change rewrites only what changed; a restart adopts
// the tables it finds and rewrites each once; tables and ranges nothing
// desires any more are removed by a full sync.
import t from 'tap';
import { LbSvcFlags } from '../../src/datapath/abi.gen.js';
import { DEFAULT_MAGLEV_TABLE_SIZE, maglevTable } from '../../src/lb/maglev.js';
import { maglevTableKey, plan, type MapOp } from '../../src/reconcile/plan.js';
import { RealizedState } from '../../src/reconcile/realized.js';
import { Reconciler } from '../../src/reconcile/reconciler.js';
import { MaglevPool } from '../../src/lb/maglev-pool.js';
import { FakeLbMaps, FakeNorthSouthMaps } from '../fakes/fake-maps.js';
import { frontend, state } from '../fakes/frontends.js';

const M = 251;
const SEED = 12345;
const LB = (backends: string[], ranges: Array<[string, number]> = []) =>
  frontend('192.168.7.7', 80, backends, [], {
    type: 'LoadBalancer',
    maglev: true,
    sourceRanges: ranges.map(([address, prefixLen]) => ({ family: 4 as const, address, prefixLen })),
  });

const kinds = (ops: readonly MapOp[]): string[] => ops.filter((o) => o.kind !== 'put-backend' && o.kind !== 'put-slot' && o.kind !== 'delete-slot' && o.kind !== 'put-revnat').map((o) => o.kind);

t.test('a north-south frontend: table and ranges before its master, master flagged', async (t) => {
  const fe = LB(['10.0.0.1', '10.0.0.2'], [['10.1.0.0', 16]]);
  const ids = { backendId: (b: { address: string }) => Number(b.address.split('.')[3]), revNatId: () => 3 };
  const { ops } = plan(new RealizedState(), state(fe), ids, { prune: true, northSouth: true });
  t.same(kinds(ops), ['put-maglev', 'put-srcranges', 'put-master'], 'table, ranges, then the master');
  const master = ops.find((o) => o.kind === 'put-master') as Extract<MapOp, { kind: 'put-master' }>;
  t.equal(master.master.flags & LbSvcFlags.LB_SVC_F_MAGLEV, LbSvcFlags.LB_SVC_F_MAGLEV, 'the master says the table is there');
  t.equal(master.master.flags & LbSvcFlags.LB_SVC_F_SRC_RANGE, LbSvcFlags.LB_SVC_F_SRC_RANGE, 'and that ranges apply');
  const table = ops.find((o) => o.kind === 'put-maglev') as Extract<MapOp, { kind: 'put-maglev' }>;
  t.equal(table.table, maglevTableKey(3, 4), 'keyed by the rev-NAT id');
  t.same(table.backends.map((b) => b.id), [1, 2], 'built from the selectable backends');

  const withoutTc = plan(new RealizedState(), state(fe), ids, { prune: true });
  t.same(kinds(withoutTc.ops), ['put-master'], 'without the tc datapath: no table, no ranges');
  t.equal((withoutTc.ops.find((o) => o.kind === 'put-master') as Extract<MapOp, { kind: 'put-master' }>).master.flags & LbSvcFlags.LB_SVC_F_MAGLEV, 0, 'and no Maglev flag');

  const cluster = frontend('10.96.0.1', 80, ['10.0.0.1']);
  t.same(kinds(plan(new RealizedState(), state(cluster), ids, { prune: true, northSouth: true }).ops), ['put-master', 'put-master'], 'a ClusterIP frontend: no table (its master and its wildcard)');
  t.equal(maglevTableKey(3, 6), 0x80000003, 'an IPv6 frontend\'s table key has the top bit set');
});

t.test('through the reconciler: writes, changes, removal and restart', async (t) => {
  const maps = new FakeLbMaps();
  const ns = new FakeNorthSouthMaps();
  const rec = new Reconciler(maps, { northSouth: { maps: ns, maglevM: M, maglevSeed: SEED } });
  rec.restore();
  const v1 = LB(['10.0.0.1', '10.0.0.2'], [['10.1.0.0', 16], ['10.2.0.0', 16]]);
  rec.sync(state(v1), { prune: true });
  t.equal(ns.tables.size, 1, 'one table');
  const [key, table] = [...ns.tables][0]!;
  const ids = [...new Set(table)].sort();
  t.equal(ids.length, 2, 'naming both backends');
  t.same(table, maglevTable([...rec.realized.backends].map(([id, b]) => ({ key: `${b.address}:${b.port}/${b.protocol}`, id })), M, SEED), 'the table src/lb/maglev.ts builds');
  t.equal(ns.ranges.size, 2, 'two source ranges');
  t.ok(maps.dump().services.some((e) => e.slot === 0 && e.fe.address === '192.168.7.7' && e.master!.flags & LbSvcFlags.LB_SVC_F_MAGLEV), 'the master was written, flagged');

  ns.log.length = 0;
  rec.sync(state(v1), { prune: true });
  t.same(ns.log, [], 'an unchanged frontend writes no table and no range');

  ns.log.length = 0;
  const v2 = LB(['10.0.0.1', '10.0.0.2', '10.0.0.3'], [['10.1.0.0', 16]]);
  rec.sync(state(v2), { prune: true, changed: new Set([v2.key]) });
  t.same(ns.log.filter((l) => l.startsWith('put-maglev')), [`put-maglev ${key}`], 'a backend more: the table is rewritten (swapped) under the same key');
  t.ok(ns.log.some((l) => l.startsWith('delete-range') && l.includes('10.2.0.0')), 'the range no longer given is deleted');
  t.equal(ns.ranges.size, 1);

  // A restart: a new reconciler over the same maps adopts the table, rewrites it once.
  const again = new Reconciler(maps, { northSouth: { maps: ns, maglevM: M, maglevSeed: SEED } });
  again.restore();
  ns.log.length = 0;
  again.sync(state(v2), { prune: true });
  t.same(ns.log.filter((l) => l.startsWith('put-maglev')), [`put-maglev ${key}`], 'after a restart each table is rewritten once (same content, atomic swap)');
  ns.log.length = 0;
  again.sync(state(v2), { prune: true });
  t.same(ns.log, [], 'and then left alone');

  // Random instead of Maglev: the master loses its flag first, the table goes after.
  ns.log.length = 0;
  const random = { ...v2, maglev: false };
  again.sync(state(random), { prune: true, changed: new Set([random.key]) });
  t.same(ns.log, [`delete-maglev ${key}`], 'lb-algorithm random: the table is deleted');

  // Removed: master first, then the ranges.
  ns.log.length = 0;
  again.sync(state(), { prune: true, changed: new Set([random.key]) });
  t.ok(ns.log.some((l) => l.startsWith('delete-range')), 'a removed frontend\'s ranges are deleted');
  t.equal(ns.ranges.size, 0);
  t.equal(ns.tables.size, 0);

  // Left behind by a frontend removed while the agent was down: a full sync removes them.
  ns.putMaglev(99, new Uint32Array(M));
  ns.putSrcRange({ family: 4, revNatId: 42, address: '10.9.0.0', prefixLen: 16 });
  const third = new Reconciler(maps, { northSouth: { maps: ns, maglevM: M, maglevSeed: SEED } });
  third.restore();
  third.sync(state(), { prune: true });
  t.equal(ns.tables.size, 0, 'an orphaned table is deleted by a full sync');
  t.equal(ns.ranges.size, 0, 'and orphaned ranges');
  t.ok(DEFAULT_MAGLEV_TABLE_SIZE > M);
});

t.test('resync: with the service maps as written, Maglev tables and source ranges are still compared', async (t) => {
  // The service, backend and rev-NAT maps hold what was written (only the
  // reconciler wrote these fakes): matches() says so, as the kernel maps'
  // byte comparison would (test/native/resync.ts); the tc maps are compared here.
  const maps = Object.assign(new FakeLbMaps(), { matches: () => true });
  const ns = new FakeNorthSouthMaps();
  const rec = new Reconciler(maps, { northSouth: { maps: ns, maglevM: M, maglevSeed: SEED } });
  rec.restore();
  const v1 = LB(['10.0.0.1', '10.0.0.2'], [['10.1.0.0', 16], ['10.2.0.0', 16]]);
  rec.sync(state(v1), { prune: true });
  const [table] = [...ns.tables.keys()];
  const periodic = (): string[] => {
    ns.log.length = 0;
    rec.resync();
    rec.sync(state(v1), { prune: true, changed: new Set() });
    return [...ns.log];
  };

  const before = rec.realized;
  t.same(periodic(), [], 'as written: nothing re-read, nothing written');
  t.equal(rec.realized, before, 'the realized state stays');

  ns.deleteMaglev(table!);
  // (A re-read, as before: the ranges read back have no fingerprint and are written once more.)
  t.ok(periodic().includes(`put-maglev ${table}`), 'a table deleted behind the agent’s back is written again');
  t.not(rec.realized, before, 'after a re-read');

  const [range] = [...ns.ranges];
  const [family, revNatId, address, prefixLen] = range!.split('/');
  ns.deleteSrcRange({ family: Number(family) as 4, revNatId: Number(revNatId), address: address!, prefixLen: Number(prefixLen) });
  t.ok(periodic().includes(`put-range ${range}`), 'a source range deleted is written again');
  t.equal(ns.ranges.size, 2);

  ns.putSrcRange({ family: 4, revNatId: 42, address: '10.9.0.0', prefixLen: 16 });
  t.ok(periodic().includes('delete-range 4/42/10.9.0.0/16'), 'a source range nothing wrote is deleted');
  t.same(periodic(), [], 'and then all is left alone');
});

t.test('with a pool: the same tables, and a backend set no table holds fails its sync as without one', async (t) => {
  const pool = new MaglevPool(1);
  t.teardown(() => pool.close());
  await pool.ready();
  const fes = Array.from({ length: 40 }, (_, s) =>
    frontend(`192.168.8.${s + 1}`, 80, Array.from({ length: 1 + (s % 4) }, (_, i) => `10.8.${s}.${i + 1}`), [], { type: 'LoadBalancer', maglev: true }),
  );
  const one = new FakeNorthSouthMaps();
  const many = new FakeNorthSouthMaps();
  // Tables of 16,381 (about 8 ms for the 40): time for the worker to take some (who takes which is a race).
  new Reconciler(new FakeLbMaps(), { northSouth: { maps: one, maglevM: 16381, maglevSeed: SEED } }).sync(state(...fes), { prune: true });
  new Reconciler(new FakeLbMaps(), { northSouth: { maps: many, maglevM: 16381, maglevSeed: SEED, maglevPool: pool } }).sync(state(...fes), { prune: true });
  t.equal(many.tables.size, 40, '40 tables');
  t.ok(pool.byWorkers > 0, `the pool's worker built ${pool.byWorkers} of them`);
  t.ok([...one.tables].every(([k, v]) => Buffer.from(v.buffer, v.byteOffset, v.byteLength).equals(Buffer.from(many.tables.get(k)!.buffer, many.tables.get(k)!.byteOffset, many.tables.get(k)!.byteLength))), 'each the table built on one thread');

  const huge = frontend('192.168.9.1', 80, Array.from({ length: M + 1 }, (_, i) => `10.9.${i >> 8}.${(i & 255) + 1}`), [], { type: 'LoadBalancer', maglev: true });
  const errorOf = (pooled: boolean): string => {
    const rec = new Reconciler(new FakeLbMaps(), { northSouth: { maps: new FakeNorthSouthMaps(), maglevM: M, maglevSeed: SEED, ...(pooled ? { maglevPool: pool } : {}) } });
    try {
      rec.sync(state(...fes.slice(0, 20), huge), { prune: true });
      return 'no error';
    } catch (err) {
      return `${(err as Error).name}: ${(err as Error).message}`;
    }
  };
  t.match(errorOf(true), /backends do not fit a Maglev table/, `${M + 1} backends at M = ${M}: the sync fails naming why`);
  t.equal(errorOf(true), errorOf(false), 'the same error as without a pool');
});
