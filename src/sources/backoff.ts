// The Kubernetes source's retry delays. Exponential from minMs to maxMs
// with "equal jitter" (a delay between half the step and the whole step),
// so that the agents of a cluster that failed together do not retry
// together. Two kinds of failure are counted apart, because they end
// differently:
//   - unanswered: the API server did not answer (no connection, a reset,
//     a timeout) or answered that it cannot serve now (5xx, 429). This is
//     an outage, and it is over as soon as the server answers a request:
//     serverAnswered() forgets these, so the first failure after an outage
//     (a watch's 410, say) waits the first step, not a step that grew
//     while the server was away.
//   - answered: the server answered and refused (410 Gone, 403, a watch
//     that ended at once). A server that answers every watch with 410
//     would otherwise be relisted from in a loop at the first step's pace;
//     these are forgotten only when the resource makes progress (an event
//     arrives, a watch runs its course), in progressed().
// client-go's reflector keeps one backoff, which starts over only once 2
// minutes have passed since it last did (reflector.go defaultBackoffReset,
// wait.Backoff.DelayWithReset): a relist after an outage shorter than that
// waits out a delay that grew during it.

export interface BackoffOptions {
  /** The first step (ms). */
  readonly minMs: number;
  /** The largest step (ms): delays stay within [maxMs / 2, maxMs]. */
  readonly maxMs: number;
  /** Random numbers in [0, 1): Math.random unless a test injects its own. */
  readonly random?: () => number;
}

export type FailureKind = 'unanswered' | 'answered';

export class Backoff {
  private unanswered = 0;
  private refused = 0;
  private readonly random: () => number;

  constructor(private readonly opts: BackoffOptions) {
    if (!(opts.minMs > 0) || !(opts.maxMs >= opts.minMs)) throw new RangeError(`backoff: need 0 < minMs <= maxMs, got ${opts.minMs} and ${opts.maxMs}`);
    this.random = opts.random ?? Math.random;
  }

  /** Failures counted since the last reset of each kind. */
  get failures(): number {
    return this.unanswered + this.refused;
  }

  /**
   * Counts a failure of this kind and gives the delay before the next
   * attempt; with capMs, a step never larger than that (still jittered).
   */
  next(kind: FailureKind, capMs = Number.POSITIVE_INFINITY): number {
    if (kind === 'unanswered') this.unanswered++;
    else this.refused++;
    return this.jittered(Math.min(capMs, this.step(this.failures - 1)));
  }

  /** The delay of a first failure, for an attempt cut short (not counted). */
  first(): number {
    return this.jittered(this.opts.minMs);
  }

  /** The server answered a request with success: the outage is over. */
  serverAnswered(): void {
    this.unanswered = 0;
  }

  /** The resource made progress: every failure is forgotten. */
  progressed(): void {
    this.unanswered = 0;
    this.refused = 0;
  }

  /** The step after `n` earlier failures: minMs doubled n times, at most maxMs. */
  private step(n: number): number {
    return Math.min(this.opts.maxMs, this.opts.minMs * 2 ** Math.min(n, 40));
  }

  /** "Equal jitter": half the step, plus up to the other half at random. */
  private jittered(step: number): number {
    return Math.round(step / 2 + this.random() * (step / 2));
  }
}
