// A bound on how many probes run at once, shared by all the workers of a
// prober: the health mesh's (src/mesh/mesh.ts) and the backends' (src/probes/prober.ts).
export class Pool {
  private readonly waiting: Array<() => void> = [];
  private active = 0;

  constructor(readonly limit: number) {}

  get inFlight(): number {
    return this.active;
  }

  get queued(): number {
    return this.waiting.length;
  }

  /** Runs `fn` once a slot is free (in arrival order). */
  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.active >= this.limit) await new Promise<void>((resolve) => this.waiting.push(resolve));
    this.active++;
    try {
      return await fn();
    } finally {
      this.active--;
      this.waiting.shift()?.();
    }
  }

  /** A stop: every waiting caller goes on at once, and checks for itself whether it should still run. */
  releaseAll(): void {
    for (const release of this.waiting.splice(0)) release();
  }
}
