// IdMap: a Map from ids to values in pages, behaving as a Map does.
import t from 'tap';
import { IdMap } from '../../src/reconcile/id-map.js';

t.test('behaves as a Map over random sets and deletes, ids in pages and beyond them', async (t) => {
  const m = new IdMap<string>();
  const ref = new Map<number, string>();
  let seed = 7;
  const rnd = (n: number): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) % n);
  const ids = [0, 1, 1023, 1024, 2047, 5000, 2 ** 24 - 1, 2 ** 24, 2 ** 32 - 1];
  for (let i = 0; i < 5000; i++) {
    const id = rnd(3) === 0 ? ids[rnd(ids.length)]! : rnd(20_000);
    if (rnd(3) === 0) t.equal(m.delete(id), ref.delete(id), `delete ${id}`);
    else {
      m.set(id, `v${i}`);
      ref.set(id, `v${i}`);
    }
    if (m.size !== ref.size) t.fail(`size ${m.size} != ${ref.size} after op ${i}`);
  }
  for (const id of [...ids, 3, 19_999]) t.equal(m.get(id), ref.get(id), `get ${id}`);
  t.same(new Map(m.entries()), ref, 'the same entries');
  t.same([...m.keys()].filter((k) => k < 2 ** 24), [...ref.keys()].filter((k) => k < 2 ** 24).sort((a, b) => a - b), 'paged ids ascending');
});

t.test('a page goes with its last id', async (t) => {
  const m = new IdMap<number>();
  m.set(5000, 1);
  m.set(5001, 2);
  const pages = (): number => (m as unknown as { pages: unknown[] }).pages.filter(Boolean).length;
  t.equal(pages(), 1);
  m.delete(5000);
  t.equal(pages(), 1, 'kept while an id is in it');
  m.delete(5001);
  t.equal(pages(), 0, 'dropped with the last');
  t.equal(m.size, 0);
});
