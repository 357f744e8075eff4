// A clock whose timers fire only when a test advances it: the Clock
// (src/base/clock.ts) the mesh and the prober take, for tests with no sleeps.
import type { Clock } from '../../src/base/clock.js';

/** Lets the promise chains a timer started settle (a few microtask turns). */
export const settle = async (): Promise<void> => {
  for (let i = 0; i < 20; i++) await Promise.resolve();
};

export class FakeClock implements Clock {
  private t = 1_700_000_000_000;
  private timers = new Map<number, { at: number; fn: () => void }>();
  private next = 1;
  /** The epoch ms the clock started at. */
  readonly start = this.t;
  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number): unknown {
    const id = this.next++;
    this.timers.set(id, { at: this.t + ms, fn });
    return id;
  }
  clearTimeout(h: unknown): void {
    this.timers.delete(h as number);
  }
  /** Timers not yet fired. */
  pending(): number {
    return this.timers.size;
  }
  /** Time passes with no timer run: a blocked event loop. */
  block(ms: number): void {
    this.t += ms;
  }
  /** Runs every timer due by now + ms, in order (ties by creation), letting promises settle in between. */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    for (;;) {
      await settle();
      const due = [...this.timers.entries()].filter(([, x]) => x.at <= end).sort((a, b) => a[1].at - b[1].at || a[0] - b[0])[0];
      if (!due) break;
      this.timers.delete(due[0]);
      this.t = Math.max(this.t, due[1].at);
      due[1].fn();
    }
    this.t = end;
    await settle();
  }
}
