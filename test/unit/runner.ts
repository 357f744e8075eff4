import t from 'tap';
import { CoalescingRunner, type RunnerTimers } from '../../src/agent/runner.js';

class FakeTimers implements RunnerTimers {
  pending: Array<{ fn: () => void; ms: number }> = [];
  setTimeout(fn: () => void, ms: number): unknown {
    const h = { fn, ms };
    this.pending.push(h);
    return h;
  }
  clearTimeout(h: unknown): void {
    this.pending = this.pending.filter((p) => p !== h);
  }
  fire(): void {
    const p = this.pending.shift();
    p?.fn();
  }
}

t.test('requests during a run coalesce into one more run', async (t) => {
  let runs = 0;
  let release!: () => void;
  const r = new CoalescingRunner(async () => {
    runs++;
    if (runs === 1) await new Promise<void>((res) => (release = res));
  });
  r.run();
  r.run();
  r.run();
  r.run();
  release();
  await r.idle();
  t.equal(runs, 2);
});

t.test('a failed run is retried with growing backoff, then succeeds', async (t) => {
  const timers = new FakeTimers();
  const delays: number[] = [];
  let runs = 0;
  const r = new CoalescingRunner(
    () => {
      runs++;
      if (runs < 4) throw new Error('map full');
    },
    { timers, retryMinMs: 100, retryMaxMs: 300, onError: (_e, ms) => delays.push(ms) },
  );
  r.run();
  await new Promise((res) => setImmediate(res));
  for (let i = 0; i < 3; i++) {
    timers.fire();
    await new Promise((res) => setImmediate(res));
  }
  await r.idle();
  t.equal(runs, 4);
  t.same(delays, [100, 200, 300]);
  t.same(timers.pending, []);
});
