// kube-proxy's BoundedFrequencyRunner, for one sync function:
// - run() asks for a run. A lone request runs at once; requests arriving
//   within minInterval of the last run coalesce into one run when the
//   interval has passed (bursts cost one sync, not one per event).
// - At least every maxInterval a periodic run happens, flagged `full`, so
//   the sync can re-read the maps and repair drift.
// - A run that throws is retried with exponential backoff, also `full`.
// - Never two runs at once. The clock is injectable for tests.

import { systemClock, type Clock } from '../base/clock.js';

export { systemClock, type Clock } from '../base/clock.js';

export type RunReason = 'change' | 'periodic' | 'retry';

export interface RunnerOptions {
  /** Minimum time between the starts of two runs (kube-proxy's minSyncPeriod). */
  readonly minIntervalMs?: number;
  /** Maximum time between runs; 0 disables periodic runs (kube-proxy's syncPeriod). */
  readonly maxIntervalMs?: number;
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
  readonly clock?: Clock;
  readonly onError?: (err: unknown, retryInMs: number) => void;
}

export class BoundedFrequencyRunner {
  private readonly clock: Clock;
  private readonly minInterval: number;
  private readonly maxInterval: number;
  private running = false;
  private stopped = false;
  /** A run was asked for; the reason that will be passed (the strongest wins). */
  private pending: RunReason | undefined;
  private lastStart = Number.NEGATIVE_INFINITY;
  /** Start of the last full (periodic or retry) run; the first run counts as one. */
  private lastFull = Number.NaN;
  private retryMs = 0;
  private timer: { handle: unknown; at: number } | undefined;
  private periodic: unknown;
  private idleWaiters: Array<() => void> = [];

  constructor(
    private readonly fn: (reason: RunReason) => Promise<void> | void,
    private readonly opts: RunnerOptions = {},
  ) {
    this.clock = opts.clock ?? systemClock;
    this.minInterval = opts.minIntervalMs ?? 0;
    this.maxInterval = opts.maxIntervalMs ?? 0;
  }

  /** Requests a run; never blocks. */
  run(reason: RunReason = 'change'): void {
    if (this.stopped) return;
    this.pending = strongest(this.pending, reason);
    if (this.running) return;
    const wait = this.lastStart + this.minInterval - this.clock.now();
    if (wait <= 0) {
      this.cancelTimer();
      void this.loop();
    } else {
      this.schedule(wait);
    }
  }

  /** Resolves when nothing is running or waiting to run (periodic runs excluded). */
  idle(): Promise<void> {
    if (this.isIdle()) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  stop(): void {
    this.stopped = true;
    this.pending = undefined;
    this.cancelTimer();
    if (this.periodic !== undefined) this.clock.clearTimeout(this.periodic);
    this.periodic = undefined;
    if (!this.running) this.wake();
  }

  private isIdle(): boolean {
    return !this.running && this.pending === undefined && this.timer === undefined;
  }

  private schedule(ms: number): void {
    const at = this.clock.now() + ms;
    if (this.timer && this.timer.at <= at) return;
    this.cancelTimer();
    const handle = this.clock.setTimeout(() => {
      this.timer = undefined;
      if (this.pending !== undefined) this.run(this.pending);
      else this.wake();
    }, ms);
    this.timer = { handle, at };
  }

  private cancelTimer(): void {
    if (this.timer) this.clock.clearTimeout(this.timer.handle);
    this.timer = undefined;
  }

  private async loop(): Promise<void> {
    this.running = true;
    let reason = this.pending ?? 'change';
    this.pending = undefined;
    this.lastStart = this.clock.now();
    // A steady stream of changes must not postpone the full resync forever.
    if (Number.isNaN(this.lastFull)) this.lastFull = this.lastStart;
    else if (reason === 'change' && this.maxInterval > 0 && this.lastStart - this.lastFull >= this.maxInterval) reason = 'periodic';
    if (reason !== 'change') this.lastFull = this.lastStart;
    try {
      await this.fn(reason);
      this.retryMs = 0;
    } catch (err) {
      const min = this.opts.retryMinMs ?? 500;
      const max = this.opts.retryMaxMs ?? 30_000;
      this.retryMs = Math.min(max, this.retryMs === 0 ? min : this.retryMs * 2);
      this.opts.onError?.(err, this.retryMs);
      if (!this.stopped) {
        this.pending = strongest(this.pending, 'retry');
        this.schedule(Math.max(this.retryMs, this.minInterval));
      }
    }
    this.running = false;
    if (this.stopped) return this.wake();
    this.armPeriodic();
    if (this.pending !== undefined && this.timer === undefined) this.run(this.pending);
    else if (this.isIdle()) this.wake();
  }

  /** The next full resync falls due maxInterval after the last full one, whatever ran since. */
  private armPeriodic(): void {
    if (this.maxInterval <= 0) return;
    if (this.periodic !== undefined) this.clock.clearTimeout(this.periodic);
    const due = Math.max(0, this.lastFull + this.maxInterval - this.clock.now());
    this.periodic = this.clock.setTimeout(() => {
      this.periodic = undefined;
      this.run('periodic');
    }, due);
  }

  private wake(): void {
    const w = this.idleWaiters;
    this.idleWaiters = [];
    w.forEach((f) => f());
  }
}

/** periodic and retry runs are full syncs; they win over a plain change. */
function strongest(a: RunReason | undefined, b: RunReason): RunReason {
  if (a === undefined) return b;
  return a === 'change' ? b : a;
}
