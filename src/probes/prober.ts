// Backend probes in standalone mode (issue 17): one worker per distinct
// probe of a backend (address, resolved port and normalized probe: the
// probe identity of src/model/probe.ts), so a backend that several
// services share is probed once per distinct probe. Each worker follows
// kubelet's (pkg/kubelet/prober/worker.go):
//   - start: when the prober started less than a period ago (an agent
//     restart), the worker first waits a random part of its period, so a
//     restart does not probe everything at once; a worker created later
//     (a backend added) probes at once. Ticks then come a period apart on a
//     fixed grid (time.Ticker): how long a probe takes never shifts the next.
//   - initialDelaySeconds: ticks before it has passed since the worker was
//     created (kubelet: since the container started) do not probe, so the
//     first probe is the first tick at or after the delay.
//   - a tick that comes while the previous probe still runs is kept (the
//     ticker's channel holds one) and runs as soon as that probe ends;
//     further ones are dropped.
//   - counting (doProbe): a result equal to the last one extends the run,
//     a different one starts a new run of 1; the state becomes healthy at
//     successThreshold successes in a row and quarantined (kubelet:
//     Failure) at failureThreshold failures in a row; below them the state
//     does not change. The state starts unknown (kubelet starts a
//     readiness worker at Failure; lbctl at unknown: the backend is served
//     as its endpoint condition says until it has been probed).
//   - a probe never outlives its timeout: the executor gets an AbortSignal
//     that fires at the timeout, and the worker counts the probe a failure
//     then, whatever the executor answers later.
// Probes run through one pool of bounded concurrency shared by all workers;
// nothing here blocks the agent's start, syncs or API. The clock and the
// executors are injected (as in src/mesh/mesh.ts): unit tests use a fake clock.
import { probeKey, type ProbeSpec, type ProbeTarget } from '../model/probe.js';
import { wallClock, type Clock } from '../base/clock.js';
import { Pool } from '../base/pool.js';

export type { Clock } from '../base/clock.js';

export type ProbeState = 'unknown' | 'healthy' | 'quarantined';

/**
 * What an executor answers: success, or the failure's reason (kubelet's
 * output). `error` marks a prober error rather than an answer of the
 * backend (kubelet: an HTTP body that breaks off, a probe lbctl cannot
 * run): kubelet's worker throws such a result away, and so does this one:
 * it is shown as the last result but neither counted nor reported.
 */
export type ProbeOutcome = { readonly ok: true; readonly detail?: string } | { readonly ok: false; readonly reason: string; readonly error?: boolean };

/** One probe of one target, bounded by `timeoutMs`; `signal` aborts at the timeout (or when the worker stops). */
export type Executor = (target: ProbeTarget, opts: { readonly timeoutMs: number; readonly signal: AbortSignal }) => Promise<ProbeOutcome>;

export interface Executors {
  readonly httpGet: Executor;
  readonly tcpSocket: Executor;
  readonly grpc: Executor;
}

export interface LastResult {
  readonly ok: boolean;
  /** A prober error, thrown away (see ProbeOutcome). */
  readonly error?: boolean;
  /** The failure's reason, or the executor's detail on success. */
  readonly reason?: string;
  /** Epoch ms when the probe ended. */
  readonly at: number;
  readonly latencyMs: number;
}

/** One worker's status, for `lbctl service list` and metrics. */
export interface WorkerStatus {
  readonly key: string;
  readonly address: string;
  readonly port: number;
  readonly kind: ProbeSpec['handler']['kind'];
  readonly state: ProbeState;
  /** How many results in a row equal the last one (kubelet's resultRun). */
  readonly consecutive: number;
  readonly last?: LastResult;
}

export interface ProberOptions {
  readonly executors: Executors;
  /** Probes in flight at most, all workers together (default 64). */
  readonly concurrency?: number;
  readonly clock?: Clock;
  /** Random in [0, 1): injectable for tests. */
  readonly random?: () => number;
  /** A worker's state changed (never called for a worker's creation or removal). */
  readonly onChange?: (target: ProbeTarget & { readonly key: string }, state: ProbeState, previous: ProbeState) => void;
  /** Every probe's result (metrics: results per result, latency). */
  readonly onResult?: (target: ProbeTarget & { readonly key: string }, result: LastResult) => void;
}

export const DEFAULT_CONCURRENCY = 64;

interface Worker {
  readonly key: string;
  readonly target: ProbeTarget;
  readonly createdAt: number;
  state: ProbeState;
  /** kubelet's lastResult/resultRun. */
  lastOk?: boolean;
  run: number;
  last?: LastResult;
  timer?: unknown;
  /** A probe is queued or running. */
  busy: boolean;
  /** A tick came while busy: probe again when it ends (Go's ticker holds one tick). */
  tickPending: boolean;
  abort?: AbortController;
  stopped: boolean;
}

export class Prober {
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly workers = new Map<string, Worker>();
  private readonly pool: Pool;
  private running = false;
  private startedAt = 0;

  constructor(private readonly opts: ProberOptions) {
    this.clock = opts.clock ?? wallClock;
    this.random = opts.random ?? Math.random;
    this.pool = new Pool(Math.max(1, opts.concurrency ?? DEFAULT_CONCURRENCY));
  }

  /**
   * The targets to probe, all of them: a target not yet probed gets a
   * worker; one no longer listed loses its worker (its probe in flight is
   * aborted and its result dropped). A changed probe or port is another
   * key, so its worker is replaced and starts over from unknown. Returns
   * the keys, in the order given, so the caller can map its backends to
   * workers.
   */
  setTargets(targets: Iterable<ProbeTarget>): string[] {
    const keys: string[] = [];
    const wanted = new Map<string, ProbeTarget>();
    for (const t of targets) {
      const key = probeKey(t);
      keys.push(key);
      if (!wanted.has(key)) wanted.set(key, t);
    }
    for (const [key, w] of this.workers) {
      if (!wanted.has(key)) this.remove(w);
    }
    for (const [key, target] of wanted) {
      if (this.workers.has(key)) continue;
      const w: Worker = { key, target, createdAt: this.clock.now(), state: 'unknown', run: 0, busy: false, tickPending: false, stopped: false };
      this.workers.set(key, w);
      if (this.running) this.begin(w);
    }
    return keys;
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    this.startedAt = this.clock.now();
    for (const w of this.workers.values()) this.begin(w);
  }

  /** Stops every timer; probes in flight are aborted and their results dropped. Workers and their states stay. */
  stop(): void {
    this.running = false;
    for (const w of this.workers.values()) this.halt(w);
    // Queued probes get their turn at once and see the prober stopped: none stays busy forever.
    this.pool.releaseAll();
  }

  state(key: string): ProbeState | undefined {
    return this.workers.get(key)?.state;
  }

  worker(key: string): WorkerStatus | undefined {
    const w = this.workers.get(key);
    return w && statusOf(w);
  }

  status(): { readonly inFlight: number; readonly queued: number; readonly workers: readonly WorkerStatus[] } {
    return { inFlight: this.pool.inFlight, queued: this.pool.queued, workers: [...this.workers.values()].map(statusOf) };
  }

  private remove(w: Worker): void {
    w.stopped = true;
    this.halt(w);
    this.workers.delete(w.key);
  }

  private halt(w: Worker): void {
    if (w.timer !== undefined) this.clock.clearTimeout(w.timer);
    w.timer = undefined;
    w.tickPending = false;
    w.abort?.abort();
  }

  /** The worker's first tick: jittered within its period just after the prober starts, at once otherwise (worker.go, run). */
  private begin(w: Worker): void {
    w.stopped = false;
    const period = w.target.spec.periodSeconds * 1000;
    const delay = this.clock.now() - this.startedAt < period ? this.random() * period : 0;
    this.tickAt(w, this.clock.now() + delay);
  }

  private tickAt(w: Worker, at: number): void {
    w.timer = this.clock.setTimeout(() => {
      w.timer = undefined;
      if (w.stopped || !this.running || this.workers.get(w.key) !== w) return;
      // The grid: the next tick a period after this one was due, not after
      // it ran. Ticks the loop was too late for are dropped, as Go's Ticker
      // drops them for a slow receiver: never a burst to catch up.
      const period = w.target.spec.periodSeconds * 1000;
      let next = at + period;
      const now = this.clock.now();
      if (next <= now) next += (Math.floor((now - next) / period) + 1) * period;
      this.tickAt(w, next);
      this.tick(w);
    }, Math.max(0, at - this.clock.now()));
  }

  private tick(w: Worker): void {
    // Probe disabled for initialDelaySeconds (worker.go compares whole seconds since the start).
    if (this.clock.now() - w.createdAt < w.target.spec.initialDelaySeconds * 1000) return;
    if (w.busy) {
      w.tickPending = true;
      return;
    }
    void this.probe(w);
  }

  private async probe(w: Worker): Promise<void> {
    w.busy = true;
    try {
      await this.pool.run(async () => {
        if (w.stopped || !this.running) return;
        const result = await this.runOne(w);
        if (result !== undefined && !w.stopped) this.record(w, result);
      });
    } finally {
      w.busy = false;
    }
    if (w.tickPending && !w.stopped && this.running) {
      w.tickPending = false;
      void this.probe(w);
    }
  }

  /** One probe within its timeout; undefined when the worker stopped meanwhile (the result is dropped). */
  private runOne(w: Worker): Promise<LastResult | undefined> {
    const { spec } = w.target;
    const timeoutMs = spec.timeoutSeconds * 1000;
    const exec = this.opts.executors[spec.handler.kind];
    const abort = new AbortController();
    w.abort = abort;
    const started = this.clock.now();
    return new Promise<LastResult | undefined>((resolve) => {
      let done = false;
      const finish = (outcome: ProbeOutcome | undefined): void => {
        if (done) return;
        done = true;
        this.clock.clearTimeout(timer);
        if (w.abort === abort) w.abort = undefined;
        if (outcome === undefined) return resolve(undefined);
        const at = this.clock.now();
        const base = { ok: outcome.ok, reason: outcome.ok ? outcome.detail : outcome.reason, at, latencyMs: at - started };
        resolve(!outcome.ok && outcome.error ? { ...base, error: true } : base);
      };
      const timer = this.clock.setTimeout(() => {
        abort.abort();
        finish({ ok: false, reason: `timeout: no answer within ${spec.timeoutSeconds}s` });
      }, timeoutMs);
      abort.signal.addEventListener('abort', () => {
        // Aborted by stop() or removal (the timeout finishes first on its own).
        if (w.stopped || !this.running) finish(undefined);
      });
      let p: Promise<ProbeOutcome>;
      try {
        p = exec(w.target, { timeoutMs, signal: abort.signal });
      } catch (err) {
        p = Promise.reject(err);
      }
      p.then(
        (o) => finish(o),
        (err: unknown) => finish({ ok: false, reason: (err as Error)?.message ?? String(err) }),
      );
    });
  }

  /** kubelet's doProbe counting, after the probe. */
  private record(w: Worker, result: LastResult): void {
    w.last = result;
    // "Prober error, throw away the result" (worker.go, doProbe).
    if (result.error) return;
    if (w.lastOk === result.ok) w.run++;
    else {
      w.lastOk = result.ok;
      w.run = 1;
    }
    const target = { ...w.target, key: w.key };
    this.opts.onResult?.(target, result);
    const { successThreshold, failureThreshold } = w.target.spec;
    if ((!result.ok && w.run < failureThreshold) || (result.ok && w.run < successThreshold)) return;
    const next: ProbeState = result.ok ? 'healthy' : 'quarantined';
    if (next === w.state) return;
    const previous = w.state;
    w.state = next;
    this.opts.onChange?.(target, next, previous);
  }

}

function statusOf(w: Worker): WorkerStatus {
  return {
    key: w.key,
    address: w.target.address,
    port: w.target.port,
    kind: w.target.spec.handler.kind,
    state: w.state,
    consecutive: w.run,
    ...(w.last ? { last: w.last } : {}),
  };
}

export type AllFailPolicy = 'failOpen' | 'failClosed';

/**
 * Which of a service's backends new connections may pick, given their
 * probe states: healthy and unknown ones (unknown: not probed yet, served
 * as the endpoint condition says), never quarantined ones; but when every
 * backend is quarantined, fail open selects them all (a probe that is
 * wrong everywhere does not take the service down) and fail closed none.
 * `allQuarantined` tells the caller to count it and log it either way.
 */
export function selectBackends<T extends { readonly state: ProbeState }>(backends: readonly T[], policy: AllFailPolicy): { readonly selected: readonly T[]; readonly allQuarantined: boolean } {
  const selected = backends.filter((b) => b.state !== 'quarantined');
  const allQuarantined = backends.length > 0 && selected.length === 0;
  if (allQuarantined && policy === 'failOpen') return { selected: backends, allQuarantined };
  return { selected, allQuarantined };
}
