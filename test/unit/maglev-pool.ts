// Maglev tables built on several threads (src/lb/maglev-pool.ts) are the
// tables maglevTable builds, slot for slot, whatever the number of workers,
// who took which and the runs' sizes; a pool without workers builds them on
// this thread.
import t from 'tap';
import { MaglevPool } from '../../src/lb/maglev-pool.js';
import { maglevTable } from '../../src/lb/maglev.js';

const SEED = 0x5eed;
const backends = (s: number, n: number) => Array.from({ length: n }, (_, i) => ({ key: `10.${(s >> 8) & 255}.${s & 255}.${i + 1}:8080/TCP`, id: 7 * s + i + 1 }));
const jobs = (count: number) => Array.from({ length: count }, (_, s) => ({ backends: backends(s, 1 + (s % 5)) }));
const equal = (a: Uint32Array, b: Uint32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));

for (const size of [0, 1, 3]) {
  t.test(`${size} workers`, async (t) => {
    const pool = new MaglevPool(size);
    t.teardown(() => pool.close());
    await pool.ready();
    // 600 tables of 251: three runs (256 tables each at most).
    for (const [count, m] of [[1, 251], [7, 1021], [40, 4093], [600, 251], [48, 16381]] as const) {
      const js = jobs(count);
      const built = pool.buildMany(js, m, SEED);
      t.equal(built.length, count);
      t.ok(built.every((tab, k) => equal(tab, maglevTable(js[k]!.backends, m, SEED))), `${count} tables of ${m}: each the table maglevTable builds`);
    }
    t.equal(pool.threads, size, `${size} worker threads, none given up on`);
    // Who builds which is a race; 48 tables of 16,381 (about 10 ms) leave time for the workers to take some.
    if (size > 0) t.ok(pool.byWorkers > 0 && pool.byWorkers < 696, `the workers built ${pool.byWorkers} of the 696 tables, this thread the rest`);
    else t.equal(pool.byWorkers, 0, 'all built on this thread');
    const none = pool.buildMany([{ backends: [] }], 251, SEED);
    t.ok(none[0]!.every((v) => v === 0), 'no backends: an empty table');
  });
}

t.test('runs past the first ones reuse the memory of those dropped: each table asked for, in order, is the same', async (t) => {
  const pool = new MaglevPool(1);
  t.teardown(() => pool.close());
  await pool.ready();
  // 1,600 tables of 16,381: 7 runs of 256, 5 made at once, 2 later in the memory of runs 0 and 1; every 97th has no backends.
  const js = jobs(1600).map((j, s) => (s % 97 === 50 ? { backends: [] } : j));
  const b = pool.builds(js, 16381, SEED);
  t.teardown(() => b.close());
  let same = 0;
  for (let k = 0; k < js.length; k++) if (equal(b.table(k)!, maglevTable(js[k]!.backends, 16381, SEED))) same++;
  t.equal(same, js.length, 'each table, asked for as the reconciler does, is the table maglevTable builds');
});

t.test('tables asked for as they are written: ahead is built meanwhile, two runs behind is not kept', async (t) => {
  const pool = new MaglevPool(1);
  t.teardown(() => pool.close());
  const js = jobs(1000);
  const b = pool.builds(js, 251, SEED);
  t.teardown(() => b.close());
  t.ok(equal(b.table(10)!, maglevTable(js[10]!.backends, 251, SEED)), 'table 10');
  t.ok(equal(b.table(600)!, maglevTable(js[600]!.backends, 251, SEED)), 'table 600, in the third run');
  t.ok(equal(b.table(300)!, maglevTable(js[300]!.backends, 251, SEED)), 'table 300, one run behind: kept');
  t.equal(b.table(10), undefined, 'table 10, two runs behind: not kept (the caller builds it)');
  t.equal(b.table(1000), undefined, 'no table 1000');
  const bad = pool.builds([{ backends: backends(1, 2) }, { backends: [{ key: 'x', id: 0 }] }], 251, SEED);
  t.ok(bad.table(0), 'a set next to one no table holds is built');
  t.equal(bad.table(1), undefined, 'a set no table holds: undefined (its own build says why)');
  t.throws(() => pool.buildMany([{ backends: [{ key: 'x', id: 0 }] }], 251, SEED), /id 0/, 'buildMany throws for it');
  b.close();
  t.equal(b.table(600), undefined, 'closed: no table');
});
