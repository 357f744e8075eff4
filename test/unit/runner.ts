import t from 'tap';
import { BoundedFrequencyRunner, type Clock, type RunReason } from '../../src/agent/runner.js';

/** A clock whose time moves only when the test says so. */
class FakeClock implements Clock {
  t = 0;
  private timers: Array<{ at: number; fn: () => void; id: number }> = [];
  private seq = 0;
  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number): unknown {
    const id = ++this.seq;
    this.timers.push({ at: this.t + ms, fn, id });
    return id;
  }
  clearTimeout(h: unknown): void {
    this.timers = this.timers.filter((x) => x.id !== h);
  }
  /** Advances time, firing due timers in order; lets promises settle between them. */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    for (;;) {
      await settle();
      this.timers.sort((a, b) => a.at - b.at);
      const next = this.timers[0];
      if (!next || next.at > end) break;
      this.timers.shift();
      this.t = next.at;
      next.fn();
    }
    this.t = end;
    await settle();
  }
}

const settle = async (): Promise<void> => {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
};

function setup(opts: { min?: number; max?: number; fail?: (n: number) => boolean } = {}) {
  const clock = new FakeClock();
  const runs: Array<{ at: number; reason: RunReason }> = [];
  const errors: number[] = [];
  const r = new BoundedFrequencyRunner(
    (reason) => {
      runs.push({ at: clock.t, reason });
      if (opts.fail?.(runs.length)) throw new Error('map full');
    },
    { clock, minIntervalMs: opts.min ?? 0, maxIntervalMs: opts.max ?? 0, retryMinMs: 100, retryMaxMs: 400, onError: (_e, ms) => errors.push(ms) },
  );
  return { clock, runs, errors, r };
}

t.test('a lone change runs at once', async (t) => {
  const { r, runs } = setup({ min: 1000 });
  r.run();
  await settle();
  t.same(runs, [{ at: 0, reason: 'change' }]);
});

t.test('a burst within minInterval coalesces into one more run at the interval', async (t) => {
  const { r, runs, clock } = setup({ min: 1000 });
  r.run();
  await clock.advance(10);
  for (let i = 0; i < 50; i++) r.run();
  await clock.advance(500);
  t.equal(runs.length, 1, 'held back');
  await clock.advance(600);
  t.same(runs.map((x) => x.at), [0, 1000]);
  await clock.advance(5000);
  t.equal(runs.length, 2, 'nothing more without requests');
});

t.test('periodic full runs happen every maxInterval', async (t) => {
  const { r, runs, clock } = setup({ min: 0, max: 30_000 });
  r.run();
  await clock.advance(95_000);
  t.same(runs.map((x) => `${x.at}:${x.reason}`), ['0:change', '30000:periodic', '60000:periodic', '90000:periodic']);
  r.stop();
});

t.test('a steady stream of changes does not postpone the full resync', async (t) => {
  const { r, runs, clock } = setup({ min: 0, max: 3000 });
  r.run();
  for (let i = 0; i < 10; i++) {
    await clock.advance(1000);
    r.run();
  }
  await clock.advance(10);
  const full = runs.filter((x) => x.reason === 'periodic').map((x) => x.at);
  t.same(full, [3000, 6000, 9000], 'a full run every maxInterval even though changes came every second');
  r.stop();
});

t.test('a failed run is retried with growing backoff as a full run, then succeeds', async (t) => {
  const { r, runs, errors, clock } = setup({ fail: (n) => n < 4 });
  r.run();
  await clock.advance(10_000);
  t.same(errors, [100, 200, 400]);
  t.same(runs.map((x) => `${x.at}:${x.reason}`), ['0:change', '100:retry', '300:retry', '700:retry']);
  await r.idle();
});

t.test('never two runs at once; a request during a run is served after it', async (t) => {
  const clock = new FakeClock();
  let active = 0;
  let maxActive = 0;
  let release!: () => void;
  const r = new BoundedFrequencyRunner(
    async () => {
      active++;
      maxActive = Math.max(maxActive, active);
      if (maxActive === 1 && active === 1 && !release) await new Promise<void>((res) => (release = res));
      active--;
    },
    { clock },
  );
  r.run();
  await settle();
  r.run();
  r.run();
  release();
  await clock.advance(10);
  await r.idle();
  t.equal(maxActive, 1);
});
