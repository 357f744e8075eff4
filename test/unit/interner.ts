// Interner: one object per distinct key, made once; the table stays bounded.
import t from 'tap';
import { Interner, packed } from '../../src/lb/types.js';

t.test('one value per key, made once; past the bound, made per call and not kept', async (t) => {
  const i = new Interner<{ k: string }>(2);
  let made = 0;
  const of = (k: string) => i.of(k, () => ({ k: `${k}${made++}` }));
  const a = of('a');
  t.equal(of('a'), a, 'the same key gives the same object');
  t.equal(made, 1, 'made once');
  of('b');
  t.equal(i.size, 2);
  const c1 = of('c');
  const c2 = of('c');
  t.not(c1, c2, 'past the bound, a new key is made per call');
  t.equal(i.size, 2, 'and the table does not grow');
  t.equal(of('b'), of('b'), 'keys held before the bound are still shared');
});

t.test('packed: exact copies, one shared empty list', async (t) => {
  const grown: number[] = [];
  for (let k = 0; k < 3; k++) grown.push(k);
  const p = packed(grown);
  t.same(p, [0, 1, 2]);
  t.not(p, grown, 'a copy');
  t.equal(packed([]), packed([] as string[]), 'every empty list is one object');
  t.ok(Object.isFrozen(packed([])));
});
