// NumberKeyMap (whole-number keys in typed arrays, open addressing with
// backward-shift deletes), NumberIdMap (number values in Float64 pages) and
// NumberKeyIds (the backend id allocator's two directions): each checked
// against an ordinary Map through the same random operations.
import t from 'tap';
import { NumberKeyMap } from '../../src/reconcile/number-map.js';
import { NumberIdMap } from '../../src/reconcile/id-map.js';
import { IdAllocator, NumberKeyIds } from '../../src/reconcile/ids.js';

/** A small deterministic generator (mulberry32), so a failure repeats. */
function rng(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let x = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 2 ** 32;
  };
}

t.test('NumberKeyMap follows a Map through random sets and deletes, keys of up to 53 bits', async (t) => {
  const r = rng(18);
  const m = new NumberKeyMap();
  const model = new Map<number, number>();
  // Few distinct keys, many operations: runs of collisions, wrap-around at
  // the table's end, deletes in the middle of runs, growth past each size.
  const pool = Array.from({ length: 3000 }, (_, i) => (i % 3 === 0 ? i : Math.floor(r() * 2 ** 53)));
  pool.push(0, 2 ** 53 - 1, 2 ** 32, 2 ** 32 - 1);
  let mismatches = 0;
  for (let op = 0; op < 60000; op++) {
    const k = pool[Math.floor(r() * pool.length)]!;
    if (r() < 0.55) {
      const v = Math.floor(r() * 2 ** 32);
      m.set(k, v);
      model.set(k, v);
    } else if (m.delete(k) !== model.delete(k)) mismatches++;
    if (m.get(k) !== model.get(k)) mismatches++;
  }
  t.equal(mismatches, 0, 'every get and delete answered as the Map did');
  t.equal(m.size, model.size);
  const entries = [...m.entries()].sort((a, b) => a[0] - b[0]);
  t.same(entries, [...model.entries()].sort((a, b) => a[0] - b[0]), 'the same entries, every key exact');
  for (const k of pool) if (m.get(k) !== model.get(k)) mismatches++;
  t.equal(mismatches, 0, 'every key found where it is, and only there');
});

t.test('NumberKeyMap: keys that are not whole numbers in 0..2^53 are refused on set and absent on get', async (t) => {
  const m = new NumberKeyMap();
  for (const bad of [-1, 0.5, 2 ** 53, Number.NaN, Number.POSITIVE_INFINITY]) {
    t.throws(() => m.set(bad, 1), RangeError, `set(${bad})`);
    t.equal(m.get(bad), undefined);
    t.equal(m.delete(bad), false);
  }
  t.equal(m.size, 0);
});

t.test('NumberIdMap follows a Map: paged ids and ids past the pages, any number value but NaN', async (t) => {
  const r = rng(5);
  const m = new NumberIdMap();
  const model = new Map<number, number>();
  const ids = [...Array.from({ length: 500 }, () => Math.floor(r() * 5000)), 2 ** 24, 2 ** 32 - 1, 0];
  for (let op = 0; op < 20000; op++) {
    const id = ids[Math.floor(r() * ids.length)]!;
    if (r() < 0.6) {
      const v = Math.floor(r() * 2 ** 53) * (r() < 0.1 ? -1 : 1);
      m.set(id, v);
      model.set(id, v);
    } else if (m.delete(id) !== model.delete(id)) t.fail(`delete(${id}) disagrees`);
  }
  t.equal(m.size, model.size);
  t.ok(ids.every((id) => m.get(id) === model.get(id)), 'every id reads as the Map');
  t.throws(() => m.set(1, Number.NaN), RangeError);
});

t.test('NumberKeyIds: an allocator over numeric and string keys alike', async (t) => {
  const a = new IdAllocator<number | string>('backend', 1, 5, new NumberKeyIds<string>());
  const v4 = 2 ** 49 - 2;
  t.same([a.acquire(v4), a.acquire('[fd00::1]:80/TCP'), a.acquire(7), a.acquire(v4)], [1, 2, 3, 1]);
  t.equal(a.size, 3);
  t.same(
    [...a.entries()].sort((x, y) => x[1] - y[1]),
    [
      [v4, 1],
      ['[fd00::1]:80/TCP', 2],
      [7, 3],
    ],
  );
  a.releaseId(1);
  t.equal(a.get(v4), undefined, 'releaseId finds a numeric key');
  a.releaseId(2);
  t.equal(a.get('[fd00::1]:80/TCP'), undefined, 'and a string key');
  t.ok(a.adopt(2 ** 40, 4000), 'an id beyond the range is adopted');
  t.notOk(a.adopt(9, 4000), 'but not twice');
  t.equal(a.get(2 ** 40), 4000);
  a.release(2 ** 40);
  t.equal(a.size, 1);
});
