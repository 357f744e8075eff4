// Runs one function at a time, coalescing requests: run() while a run is in
// progress schedules exactly one more. A failed run is retried with
// exponential backoff until one succeeds. Timers are injectable for tests.
export interface RunnerTimers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export interface RunnerOptions {
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
  readonly timers?: RunnerTimers;
  readonly onError?: (err: unknown, retryInMs: number) => void;
}

export class CoalescingRunner {
  private running = false;
  private pending = false;
  private stopped = false;
  private retryMs = 0;
  private retryHandle: unknown;
  private idleWaiters: Array<() => void> = [];
  private readonly timers: RunnerTimers;

  constructor(
    private readonly fn: () => Promise<void> | void,
    private readonly opts: RunnerOptions = {},
  ) {
    this.timers = opts.timers ?? {
      setTimeout: (f, ms) => setTimeout(f, ms),
      clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
    };
  }

  /** Requests a run; never blocks, never runs two at once. */
  run(): void {
    if (this.stopped) return;
    if (this.running) {
      this.pending = true;
      return;
    }
    if (this.retryHandle !== undefined) {
      this.timers.clearTimeout(this.retryHandle);
      this.retryHandle = undefined;
    }
    void this.loop();
  }

  /** Resolves when no run is in progress or pending (retries still count as pending). */
  idle(): Promise<void> {
    if (!this.running && !this.pending && this.retryHandle === undefined) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  stop(): void {
    this.stopped = true;
    if (this.retryHandle !== undefined) this.timers.clearTimeout(this.retryHandle);
    this.retryHandle = undefined;
    this.pending = false;
    if (!this.running) this.wake();
  }

  private async loop(): Promise<void> {
    this.running = true;
    do {
      this.pending = false;
      try {
        await this.fn();
        this.retryMs = 0;
      } catch (err) {
        const min = this.opts.retryMinMs ?? 500;
        const max = this.opts.retryMaxMs ?? 30_000;
        this.retryMs = Math.min(max, this.retryMs === 0 ? min : this.retryMs * 2);
        this.opts.onError?.(err, this.retryMs);
        if (!this.pending && !this.stopped) {
          this.retryHandle = this.timers.setTimeout(() => {
            this.retryHandle = undefined;
            this.run();
          }, this.retryMs);
        }
      }
    } while (this.pending && !this.stopped);
    this.running = false;
    if (this.retryHandle === undefined) this.wake();
  }

  private wake(): void {
    const w = this.idleWaiters;
    this.idleWaiters = [];
    w.forEach((f) => f());
  }
}
