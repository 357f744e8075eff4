// Maglev tables in the kernel's maps (lb_maglev_index, lb_maglev's chunks),
// written through the agent's KernelMaglevMaps and read back from the
// kernel: tables packed without gaps read back exactly, a rewrite in place
// leaves its neighbours alone, a freed place is not reused within the
// quarantine, an emptied chunk is dropped, a restarted agent adopts the
// tables and fills the gaps, a changed --maglev-table-size moves each table
// as it is rewritten, and the kernel memory is M × 4 bytes a table. Then two
// agents (two sets of maps, two reconcilers) fed the same services in
// another order: their tables are the same slot for slot.
//
// The maps come from bpf/.output/tests/nodeport_test.bpf.o (nothing pinned);
// no program runs (test/bpf/maglev.ts sends packets through the tables).
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';
import { lb4_backend, u32 } from '../../src/datapath/abi.gen.js';
import { KernelLbMaps, LB_MAP_NAMES, type LbMapSet } from '../../src/datapath/maps.js';
import { KernelMaglevMaps, KernelNorthSouthMaps, readMaglevTables } from '../../src/datapath/maglev-maps.js';
import { uintToIpv4 } from '../../src/lb/addr.js';
import { maglevTable } from '../../src/lb/maglev.js';
import { MaglevPool } from '../../src/lb/maglev-pool.js';
import { BpfObject } from '../../src/native/bpf.js';
import { Reconciler } from '../../src/reconcile/reconciler.js';
import { frontend, state } from '../fakes/frontends.js';

if (process.getuid?.() !== 0) t.bailout('the native suites need root (BPF): run `make test` as root');

const OBJECT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../bpf/.output/tests/nodeport_test.bpf.o');
const M = 16381;
/** Tables of the first test: few, as the guests run it under emulation. */
const TABLES = 24;
/** The two agents' table size: any prime shows the property, a small one costs the guests less. */
const M2 = 4093;
const SEED = 0x5eed;
const backends = (t0: number, n = 3) => Array.from({ length: n }, (_, i) => ({ key: `10.${(t0 >> 8) & 255}.${t0 & 255}.${i + 1}:8080/TCP`, id: 3 * t0 + i + 1 }));
const same = (a: Uint32Array | undefined, b: Uint32Array): boolean => a !== undefined && Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));

async function loaded(t: Test): Promise<BpfObject> {
  const obj = BpfObject.open(OBJECT);
  await obj.load();
  t.teardown(() => obj.close());
  return obj;
}

t.test('tables packed without gaps, in place, quarantined, dropped, adopted', async (t) => {
  const obj = await loaded(t);
  let clock = 0;
  const maps = (m = M) => new KernelMaglevMaps(obj.map('lb_maglev'), obj.map('lb_maglev_index'), m, () => clock);
  const mg = maps();
  const tables = new Map<number, Uint32Array>();
  mg.reserve(Array.from({ length: TABLES }, (_, k) => k + 1));
  for (let k = 1; k <= TABLES; k++) {
    tables.set(k, maglevTable(backends(k), M, SEED));
    mg.put(k, tables.get(k)!);
  }
  const mem = mg.kernelMemory();
  t.equal(mem.chunks, 1, `reserve made one chunk for the ${TABLES} tables`);
  t.equal(mem.slots, Math.ceil((TABLES * M) / 1024) * 1024, 'sized to them, without gaps');
  t.ok(mem.bytes <= TABLES * M * 4 + 3 * 4096, `kernel memory ${mem.bytes} B: ${TABLES} tables of ${M} ids, one partial 4 KiB block and the array's header (page-rounded before 6.x) (bench/nodeport-tc.ts holds 64 KiB a table at 10,000)`);
  let read = readMaglevTables(obj.map('lb_maglev'), obj.map('lb_maglev_index'));
  t.equal(read.size, TABLES, `the index names ${TABLES} tables`);
  t.ok([...tables].every(([k, v]) => same(read.get(k), v)), 'each reads back slot for slot');

  // Table 7 rewritten: the same place, its neighbours (sharing its first and last blocks) unchanged.
  tables.set(7, maglevTable(backends(1007), M, SEED));
  mg.put(7, tables.get(7)!);
  read = mg.read();
  t.ok([...tables].every(([k, v]) => same(read.get(k), v)), 'a rewrite in place leaves 6 and 8 as they were');
  t.equal(mg.kernelMemory().chunks, 1, 'no chunk made for a rewrite');

  // Table 5 goes; a new table within the quarantine does not take its place.
  const placeOf = (k: number): string => obj.map('lb_maglev_index').lookup(u32.encode(k))!.toString('hex');
  const five = placeOf(5);
  mg.delete(5);
  tables.delete(5);
  tables.set(141, maglevTable(backends(141), M, SEED));
  mg.put(141, tables.get(141)!);
  t.not(placeOf(141), five, 'a place freed 0 s ago is not reused');
  t.equal(mg.kernelMemory().chunks, 2, 'a new chunk for it instead');
  clock += 2500;
  tables.set(142, maglevTable(backends(142), M, SEED));
  mg.put(142, tables.get(142)!);
  t.equal(placeOf(142), five, 'after the quarantine it is');

  // A restarted agent adopts every table and fills a gap first. It looks
  // lb_maglev up only at the chunks the index names and never walks it:
  // before 6.8 each lookup of a map-of-maps waits for an RCU grace period,
  // and a walk of its 4,096 entries took 66 s in the 5.10 guest.
  const calls: string[] = [];
  const outer = obj.map('lb_maglev');
  const counted = new Proxy(outer, {
    get(target, prop, receiver) {
      const v = Reflect.get(target, prop, receiver) as unknown;
      if (typeof v !== 'function') return v;
      return (...args: unknown[]) => {
        if (prop === 'lookup' || prop === 'entries' || prop === 'entriesFlat' || prop === 'keys') calls.push(String(prop));
        return (v as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
  const again = new KernelMaglevMaps(counted, obj.map('lb_maglev_index'), M, () => clock);
  t.same(calls, ['lookup', 'lookup'], 'adopting looks lb_maglev up once per chunk the index names (2), and never walks it');
  calls.length = 0;
  readMaglevTables(counted, obj.map('lb_maglev_index'));
  t.same(calls, ['lookup', 'lookup'], 'so does reading the tables (lbctl bpf lb list --maglev)');
  read = again.read();
  t.equal(read.size, tables.size, 'the restarted agent reads every table');
  t.ok([...tables].every(([k, v]) => same(read.get(k), v)), 'slot for slot');
  again.delete(9);
  tables.delete(9);
  clock += 2500;
  const before = again.kernelMemory().chunks;
  tables.set(143, maglevTable(backends(143), M, SEED));
  again.put(143, tables.get(143)!);
  t.equal(again.kernelMemory().chunks, before, 'a new table takes a free place of the adopted chunks');

  // --maglev-table-size changed: old tables stay readable, each moves as it is rewritten; emptied chunks go.
  const small = maps(251);
  t.equal(small.read().size, tables.size, 'tables of 16381 still read at 251');
  for (const k of small.keys()) small.put(k, maglevTable(backends(k), 251, SEED));
  read = small.read();
  t.ok([...read.values()].every((v) => v.length === 251), 'every table rewritten at 251 slots');
  const left = small.kernelMemory();
  t.ok(left.bytes < tables.size * 251 * 4 + 2 * 2 ** 20, `the room of the 16381-slot tables is given back or reused (${left.chunks} chunks, ${left.bytes} B left)`);
  for (const k of small.keys()) small.delete(k);
  t.equal(small.kernelMemory().chunks, 0, 'no table, no chunk');
  t.equal(obj.map('lb_maglev').entries().length, 0, 'lb_maglev names no chunk');
});

t.test('two agents, the same services in another order: the same tables, slot for slot', async (t) => {
  const services = Array.from({ length: 30 }, (_, s) =>
    frontend(`192.168.${s >> 8}.${s & 255}`, 80, Array.from({ length: 2 + (s % 5) }, (_, i) => `10.244.${s}.${i + 1}`), [], { type: 'LoadBalancer', maglev: true }),
  );
  const agent = async (order: typeof services, pool?: MaglevPool) => {
    const obj = await loaded(t);
    const set = {} as LbMapSet;
    for (const name of LB_MAP_NAMES) set[name] = obj.map(name);
    const ns = new KernelNorthSouthMaps(new KernelMaglevMaps(obj.map('lb_maglev'), obj.map('lb_maglev_index'), M2), { 4: obj.map('lb4_src_range'), 6: obj.map('lb6_src_range') });
    const rec = new Reconciler(new KernelLbMaps(set), { northSouth: { maps: ns, maglevM: M2, maglevSeed: SEED, ...(pool ? { maglevPool: pool } : {}) } });
    rec.restore();
    // Backends programmed one service at a time, in this agent's order: ids differ between the agents.
    // With a pool, all at once: one sync, whose tables the pool builds on two threads.
    if (pool) rec.sync(state(...order), { prune: true });
    else for (let i = 1; i <= order.length; i++) rec.sync(state(...order.slice(0, i)), { prune: true });
    // Each table as the backends it names, by frontend address.
    const addr = new Map<number, string>();
    for (const [k, v] of obj.map('lb4_backends').entries()) {
      const b = lb4_backend.decode(v);
      addr.set(k.readUInt32LE(0), `${uintToIpv4(b.address)}:${b.port}`);
    }
    const byFrontend = new Map<string, Buffer>();
    const tables = readMaglevTables(obj.map('lb_maglev'), obj.map('lb_maglev_index'));
    for (const fe of order) {
      const revNat = rec.realized.frontends.revNatId(rec.realized.frontends.row(fe.key));
      const ids = tables.get(revNat!)!;
      byFrontend.set(fe.address, Buffer.from([...ids].map((id) => addr.get(id) ?? '?').join(',')));
    }
    const ids = new Map([...tables].map(([k, v]) => [k, v]));
    return { byFrontend, ids };
  };
  const a = await agent(services);
  const reversed = [...services].reverse().map((fe) => ({ ...fe, backends: [...fe.backends].reverse() }));
  const b = await agent(reversed);
  t.equal(a.byFrontend.size, 30, 'agent A has 30 tables');
  t.ok(services.every((fe) => a.byFrontend.get(fe.address)!.equals(b.byFrontend.get(fe.address)!)), 'agent B\'s tables name the same backend in every slot of every table');
  const c = await agent(services);
  t.ok([...a.ids].every(([k, v]) => same(c.ids.get(k), v)), 'a third agent fed the same order writes the same bytes');
  const pool = new MaglevPool(1);
  t.teardown(() => pool.close());
  await pool.ready(); // up before the sync, as the agent's (started with the tc datapath)
  const d = await agent(reversed, pool);
  t.ok(pool.byWorkers > 0, `a fourth agent's pool built ${pool.byWorkers} of its tables on a worker thread`);
  t.ok(services.every((fe) => a.byFrontend.get(fe.address)!.equals(d.byFrontend.get(fe.address)!)), 'and its tables name the same backend in every slot of every table');
});
