// The Kubernetes source's retry delays (src/sources/backoff.ts), on an
// injected random source: equal jitter within each step, steps doubling to
// the cap, an outage forgotten as soon as the server answers, refusals only
// once the resource makes progress.
import t from 'tap';
import { Backoff } from '../../src/sources/backoff.js';

/** A random source that returns `values` in turn, then the last one forever. */
const sequence = (...values: number[]): (() => number) => {
  let i = 0;
  return () => values[Math.min(i++, values.length - 1)]!;
};

t.test('equal jitter: each delay is half its step plus up to the other half; steps double up to the cap', async (t) => {
  const low = new Backoff({ minMs: 500, maxMs: 30_000, random: () => 0 });
  const high = new Backoff({ minMs: 500, maxMs: 30_000, random: () => 0.999999 });
  const lows = Array.from({ length: 9 }, () => low.next('unanswered'));
  const highs = Array.from({ length: 9 }, () => high.next('unanswered'));
  t.same(lows, [250, 500, 1000, 2000, 4000, 8000, 15_000, 15_000, 15_000], 'the low end: half of 500, 1000, ... capped at half of 30 s');
  t.same(highs, [500, 1000, 2000, 4000, 8000, 16_000, 30_000, 30_000, 30_000], 'the high end: the step itself, capped at 30 s');
  const mid = new Backoff({ minMs: 500, maxMs: 30_000, random: sequence(0.5, 0.25) });
  t.same([mid.next('answered'), mid.next('answered')], [375, 625], 'in between, as the random source says');
  t.equal(low.failures, 9);
  // Many failures never overflow the step.
  for (let i = 0; i < 2000; i++) low.next('answered');
  t.equal(low.next('answered'), 15_000);
});

t.test('a cap for one failure (an unreachable server): the step stops growing there, still jittered, and the count goes on', async (t) => {
  const b = new Backoff({ minMs: 500, maxMs: 30_000, random: () => 0.999999 });
  const capped = Array.from({ length: 8 }, () => b.next('unanswered', 5000));
  t.same(capped, [500, 1000, 2000, 4000, 5000, 5000, 5000, 5000], 'the high end: never above the cap');
  const low = new Backoff({ minMs: 500, maxMs: 30_000, random: () => 0 });
  for (let i = 0; i < 7; i++) low.next('unanswered', 5000);
  t.equal(low.next('unanswered', 5000), 2500, 'the low end at the cap: half of it');
  t.equal(b.next('unanswered'), 30_000, 'an uncapped failure after them takes the step the count has reached');
});

t.test('jitter spreads agents that failed together: 1,000 of them retry over the whole second half of the step', async (t) => {
  const delays = Array.from({ length: 1000 }, () => new Backoff({ minMs: 500, maxMs: 30_000 }).next('answered'));
  t.ok(delays.every((d) => d >= 250 && d <= 500), 'all within [250, 500] ms');
  const buckets = new Set(delays.map((d) => Math.floor((d - 250) / 25)));
  t.ok(buckets.size >= 10, `spread over the whole window (${buckets.size} of its 25 ms slots hit)`);
});

t.test('an outage ends when the server answers: its failures are forgotten, refusals are not', async (t) => {
  const b = new Backoff({ minMs: 100, maxMs: 10_000, random: () => 0 });
  for (let i = 0; i < 6; i++) b.next('unanswered');
  t.equal(b.next('unanswered'), 3200, 'seven failures during an outage: the step has grown to 6.4 s');
  b.serverAnswered();
  t.equal(b.failures, 0);
  t.equal(b.next('answered'), 50, 'the first refusal after the answer (a watch\'s 410) waits the first step, not 6.4 s');

  // A server that answers every watch with 410: its relists back off.
  const loop = new Backoff({ minMs: 100, maxMs: 10_000, random: () => 0 });
  const relists = [];
  for (let i = 0; i < 5; i++) {
    loop.serverAnswered(); // the list, and the watch, were answered 200
    relists.push(loop.next('answered')); // then the watch said 410
  }
  t.same(relists, [50, 100, 200, 400, 800], 'answers do not reset refusals: a 410 loop backs off');
  loop.progressed();
  t.equal(loop.next('answered'), 50, 'progress (an event, a watch that ran its course) forgets them');
});

t.test('first(): the first step, for a retry cut short, counts nothing', async (t) => {
  const b = new Backoff({ minMs: 200, maxMs: 1000, random: () => 1 });
  b.next('unanswered');
  b.next('unanswered');
  t.equal(b.first(), 200);
  t.equal(b.failures, 2);
});

t.test('bounds are checked', async (t) => {
  t.throws(() => new Backoff({ minMs: 0, maxMs: 100 }), RangeError);
  t.throws(() => new Backoff({ minMs: 200, maxMs: 100 }), RangeError);
  t.throws(() => new Backoff({ minMs: Number.NaN, maxMs: 100 }), RangeError);
});
