// Maglev tables built on several threads (src/lb/maglev-pool.ts) are the
// tables maglevTable builds, slot for slot, whatever the number of workers
// and the batch's size; a pool without workers builds them on this thread.
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
    for (const [count, m] of [[1, 251], [7, 1021], [40, 4093], [100, 251]] as const) {
      const js = jobs(count);
      const built = pool.buildMany(js, m, SEED);
      t.equal(built.length, count);
      t.ok(built.every((tab, k) => equal(tab, maglevTable(js[k]!.backends, m, SEED))), `${count} tables of ${m}: each the table maglevTable builds`);
    }
    t.equal(pool.threads, size, `${size} worker threads, none given up on`);
    if (size > 0) t.ok(pool.byWorkers > 0 && pool.byWorkers < 148, `the workers built ${pool.byWorkers} of the 148 tables, this thread the rest`);
    else t.equal(pool.byWorkers, 0, 'all built on this thread');
    const none = pool.buildMany([{ backends: [] }], 251, SEED);
    t.ok(none[0]!.every((v) => v === 0), 'no backends: an empty table');
  });
}
