// IdAllocator: stable ids per key, handed out round-robin within a range,
// adopted on restore, and "no room" when the range is used up.
import t from 'tap';
import { LbError } from '../../src/base/errors.js';
import { IdAllocator } from '../../src/reconcile/ids.js';

t.test('the same key keeps its id; new keys get the next ids', async (t) => {
  const a = new IdAllocator<string>('test', 1, 10);
  t.same(['a', 'b', 'c', 'a'].map((k) => a.acquire(k)), [1, 2, 3, 1]);
  t.equal(a.size, 3);
  t.equal(a.get('b'), 2);
  t.equal(a.get('zz'), undefined);
  t.same([...a.entries()], [['a', 1], ['b', 2], ['c', 3]]);
});

t.test('round-robin: a freed id is not handed out at once, but comes round again', async (t) => {
  const a = new IdAllocator<string>('test', 1, 4);
  ['a', 'b', 'c'].forEach((k) => a.acquire(k));
  a.release('b');
  t.equal(a.acquire('d'), 4, 'the next id, not the freed 2');
  t.equal(a.acquire('e'), 2, 'past the end it wraps to the freed one');
  a.releaseId(1);
  t.equal(a.get('a'), undefined, 'releaseId frees whatever key held it');
  t.equal(a.acquire('f'), 1);
});

t.test('a used-up range is "no room": tryAcquire undefined, acquire LbError ENOSPC', async (t) => {
  const a = new IdAllocator<string>('IPv4 rev-NAT', 1, 2);
  a.acquire('a');
  a.acquire('b');
  t.equal(a.tryAcquire('c'), undefined);
  const err = t.throws(() => a.acquire('c')) as unknown;
  t.ok(err instanceof LbError);
  t.match(err, { code: 'ENOSPC', message: 'out of IPv4 rev-NAT ids: all 2 are in use' });
  t.equal(a.tryAcquire('a'), 1, 'a key that has an id still gets it');
  a.release('a');
  t.equal(a.tryAcquire('c'), 1, 'room again once one is released');
});

t.test('adopt (restore): ids in range and not taken; the next new id follows', async (t) => {
  const a = new IdAllocator<string>('test', 1, 8);
  t.equal(a.adopt('x', 5), true);
  t.equal(a.adopt('y', 5), false, 'an id already taken');
  t.equal(a.adopt('x', 6), false, 'a key that already has one');
  t.equal(a.adopt('z', 0), false, 'below the range: never an id');
  t.equal(a.acquire('n'), 6, 'new ids follow the highest adopted');
  t.equal(a.adopt('w', 8), true);
  t.equal(a.acquire('m'), 1, 'after the end of the range: the start');
  t.same([a.inRange(1), a.inRange(8), a.inRange(9), a.inRange(1.5)], [true, true, false, false]);
  t.equal(a.span, 8);
});

t.test('adopt beyond the range: kept while its key lives, takes no room, never handed out again', async (t) => {
  const a = new IdAllocator<string>('test', 1, 2);
  t.equal(a.adopt('old', 9), true, 'an id beyond max is adopted (renumbering it would need room a full map lacks)');
  t.equal(a.get('old'), 9);
  t.equal(a.acquire('a'), 1, 'the range is still all free');
  t.equal(a.acquire('b'), 2);
  t.equal(a.tryAcquire('c'), undefined, 'the range is full: the adopted id does not count in it, nor extend it');
  a.release('old');
  t.equal(a.tryAcquire('c'), undefined, 'releasing it frees nothing in the range');
  a.release('a');
  t.equal(a.acquire('c'), 1, 'ids come from the range only');
  t.equal(a.adopt('again', 9), true, 'a released id beyond the range is free to adopt again (a restore), never to acquire');
});

t.test('a bad range is refused at construction', async (t) => {
  t.throws(() => new IdAllocator('x', 5, 4), RangeError);
  t.throws(() => new IdAllocator('x', 1, Number.NaN), RangeError);
  t.doesNotThrow(() => new IdAllocator('x', 1, 1));
});
