/**
 * Maglev tables built on several cores, called synchronously: the
 * reconciler's sync stays one synchronous pass over the maps, and a cold
 * start of thousands of Maglev frontends (each table about 0.2 ms of one
 * core at M = 16,381) shares its builds between this thread and workers.
 *
 * A sync's tables are cut into runs (up to RUN_BYTES of tables). This
 * thread hashes a run's backends (maglevPermutations: the only part that
 * depends on names and the seed) into one SharedArrayBuffer and posts it;
 * every thread, this one included, takes the run's next table from a shared
 * counter (Atomics.add) and fills it in place, until none is left: no thread
 * waits for a slower one's share. The runs ahead of the one this thread
 * writes (up to AHEAD_BYTES) are posted too, so the workers keep building
 * while it writes and while it makes room in the kernel; when it needs a
 * table not yet built it builds the run's next ones itself, and waits
 * (Atomics.wait) only for a table a worker is filling. Workers run
 * fillMaglev's own source (it names nothing outside itself), so they need
 * no module file: the agent ships as one bundle. The tables are the same
 * slot for slot whoever fills them (test/unit/maglev-pool.ts).
 *
 * A worker that fails or does not answer within WAIT_MS is given up on for
 * good: its tables are built here, and later runs use this thread only.
 */
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { fillMaglev, maglevPermutations, TAIL_SLOTS, type MaglevBackend } from './maglev.js';

/**
 * A run's state, one SharedArrayBuffer of int32: the next table to take,
 * each table's state, then where each table's backends start in the three
 * columns that follow (offset, skip, id; a table's are [at[k], at[k + 1])).
 */
const NEXT = 0;
const STATE = 1;
/** A table's state: being built (or not yet taken), built here, built by a worker, failed, not built (this thread builds it when asked). */
const PENDING = 0;
const HERE = 1;
const BY_WORKER = 2;
const FAILED = 3;
const SKIPPED = 4;

const WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const fillMaglev = ${fillMaglev.toString()};
parentPort.on('message', (r) => {
  if (r === 'ready') return parentPort.postMessage('ready');
  const s = new Int32Array(r.state);
  const ids = new Uint32Array(r.state);
  const at = ${STATE} + r.count;
  const col = at + r.count + 1;
  const total = s[at + r.count];
  for (;;) {
    const k = Atomics.add(s, ${NEXT}, 1);
    if (k >= r.count) return;
    if (Atomics.load(s, ${STATE} + k) !== ${PENDING}) continue;
    const a = col + s[at + k];
    const b = col + s[at + k + 1];
    let done = ${BY_WORKER};
    try {
      const table = new Uint32Array(r.out, k * r.m * 4, r.m);
      if (!r.fresh) table.fill(0);
      fillMaglev(table, s.subarray(a, b), s.subarray(a + total, b + total), ids.subarray(a + 2 * total, b + 2 * total), r.m, r.tail);
    } catch {
      done = ${FAILED};
    }
    Atomics.store(s, ${STATE} + k, done);
    Atomics.notify(s, ${STATE} + k);
  }
});
`;

/** How long this thread waits for a table a worker is building before building it itself. */
const WAIT_MS = 10_000;
/** A run's tables: up to 16 MiB of them (256 at M = 16,381), at least MIN_POST. */
const RUN_BYTES = 16 << 20;
const RUN_MAX = 256;
/** Tables posted ahead of the run asked: up to 64 MiB of them (1,024 at M = 16,381, about 0.3 s of a core). */
const AHEAD_BYTES = 64 << 20;
/** Runs of fewer tables are built on this thread: a message costs more than they do. */
const MIN_POST = 8;

export interface MaglevJob {
  readonly backends: readonly MaglevBackend[];
}

/** A run of tables: what the threads share, and the tables this thread built apart (after a worker failed). */
interface Run {
  readonly from: number;
  readonly count: number;
  readonly state: Int32Array;
  readonly ids: Uint32Array;
  readonly out: SharedArrayBuffer;
  /** `out` is new memory, all zeros (else a dropped run's, reused: each table is zeroed before it is filled). */
  readonly fresh: boolean;
  readonly apart: Map<number, Uint32Array>;
}

/**
 * The tables of a list of jobs, built as they are asked for (in about the
 * order of the list: the runs ahead of the one asked are built meanwhile).
 *
 * A table is a view of its run's memory, which a run two on reuses: write
 * it (or copy it) before asking for tables two runs on. Reused memory is
 * memory the kernel has given already: new memory costs a page fault every
 * 4 KiB, and two threads faulting at once (in one process) about halved
 * both threads' speed.
 */
export class MaglevBuilds {
  private readonly runs = new Map<number, Run>();
  private readonly per: number;
  /** Runs posted ahead of the one asked (none without workers). */
  private readonly ahead: number;
  /** Runs up to this one were dropped (two behind the one asked), and are never made again. */
  private dropped = -1;
  private closed = false;
  /** The memory of runs dropped, for the runs to come. */
  private readonly spare: SharedArrayBuffer[] = [];

  /** @internal MaglevPool.builds() */
  constructor(
    private readonly pool: MaglevPool,
    private readonly jobs: readonly MaglevJob[],
    private readonly m: number,
    private readonly seed: number,
  ) {
    this.per = Math.max(MIN_POST, Math.min(RUN_MAX, Math.floor(RUN_BYTES / (4 * m))));
    this.ahead = pool.threads > 0 ? Math.max(1, Math.floor(AHEAD_BYTES / (this.per * 4 * m))) : 0;
    for (let r = 0; r <= this.ahead; r++) this.run(r); // the workers start now
  }

  get length(): number {
    return this.jobs.length;
  }

  /**
   * Job k's table (maglevTable(jobs[k].backends, m, seed)), or undefined when
   * it is not kept any more (its run is two behind the last asked) or its
   * backends fit no table: the caller builds it itself (and gets the error).
   */
  table(k: number): Uint32Array | undefined {
    if (this.closed || k < 0 || k >= this.jobs.length) return undefined;
    const r = Math.floor(k / this.per);
    for (const [old, gone] of this.runs) if (old < r - 1) this.drop(old, gone, true);
    const run = this.run(r);
    // The runs after it are posted now (AHEAD_BYTES of them): the workers build them while this thread writes run r.
    for (let next = r + 1; next <= r + this.ahead; next++) this.run(next);
    if (!run) return undefined;
    const j = k - run.from;
    const apart = run.apart.get(j);
    if (apart) return apart;
    const s = run.state;
    while (Atomics.load(s, STATE + j) === PENDING) {
      const next = Atomics.add(s, NEXT, 1);
      if (next < run.count) {
        this.fill(run, next);
        continue;
      }
      // Taken by a worker: wait for it, unless the workers were given up on.
      if (this.pool.threads === 0 || Atomics.wait(s, STATE + j, PENDING, WAIT_MS) === 'timed-out') break;
    }
    const state = Atomics.load(s, STATE + j);
    if (state === HERE || state === BY_WORKER) {
      if (state === BY_WORKER) this.pool.byWorkers++;
      return new Uint32Array(run.out, j * this.m * 4, this.m);
    }
    if (state === SKIPPED) return undefined;
    this.pool.giveUp(); // failed or silent: built here, apart (the worker may still be writing there), and no worker is asked again
    const table = new Uint32Array(this.m);
    this.fillInto(run, j, table);
    run.apart.set(j, table);
    return table;
  }

  /** Stops the builds of the runs posted (the tables asked for stay as they are). */
  close(): void {
    this.closed = true;
    for (const [r, run] of this.runs) this.drop(r, run, false);
    this.spare.length = 0;
  }

  /** Run r is not built further; its memory is kept for another if `reuse` and no worker is still writing there. */
  private drop(r: number, run: Run, reuse: boolean): void {
    const taken = Math.min(run.count, Atomics.exchange(run.state, NEXT, run.count)); // nothing left to take
    this.runs.delete(r);
    this.dropped = Math.max(this.dropped, r);
    for (let j = 0; j < taken; j++) if (Atomics.load(run.state, STATE + j) === PENDING) return;
    if (reuse && run.out.byteLength === this.per * this.m * 4) this.spare.push(run.out);
  }

  /** Run r: hashed and posted at its first ask; undefined past the end or once dropped. */
  private run(r: number): Run | undefined {
    const have = this.runs.get(r);
    if (have || r * this.per >= this.jobs.length || r <= this.dropped) return have;
    const from = r * this.per;
    const jobs = this.jobs.slice(from, from + this.per);
    const perms = jobs.map((j) => {
      try {
        return maglevPermutations(j.backends, this.m, this.seed);
      } catch {
        return undefined; // fits no table: its own build says why
      }
    });
    const count = jobs.length;
    const total = perms.reduce((n, p) => n + (p?.ids.length ?? 0), 0);
    const at = STATE + count;
    const col = at + count + 1;
    const buf = new SharedArrayBuffer(4 * (col + 3 * total));
    const state = new Int32Array(buf);
    const ids = new Uint32Array(buf);
    let n = 0;
    perms.forEach((p, k) => {
      state[at + k] = n;
      if (!p || p.ids.length === 0) state[STATE + k] = p ? HERE : SKIPPED;
      if (!p) return;
      state.set(p.offset, col + n);
      state.set(p.skip, col + total + n);
      ids.set(p.ids, col + 2 * total + n);
      n += p.ids.length;
    });
    state[at + count] = n;
    const reused = this.spare.pop();
    const out = reused ?? new SharedArrayBuffer(this.per * this.m * 4);
    const run: Run = { from, count, state, ids, out, fresh: !reused, apart: new Map() };
    // No backends: the zeroed table is it.
    if (reused) perms.forEach((p, k) => p?.ids.length === 0 && new Uint32Array(out, k * this.m * 4, this.m).fill(0));
    this.runs.set(r, run);
    if (count >= MIN_POST) this.pool.post({ state: buf, out, fresh: run.fresh, count, m: this.m, tail: TAIL_SLOTS });
    return run;
  }

  /** Table j of `run`, taken by this thread. */
  private fill(run: Run, j: number): void {
    if (Atomics.load(run.state, STATE + j) !== PENDING) return;
    const table = new Uint32Array(run.out, j * this.m * 4, this.m);
    if (!run.fresh) table.fill(0);
    this.fillInto(run, j, table);
    Atomics.store(run.state, STATE + j, HERE);
  }

  private fillInto(run: Run, j: number, table: Uint32Array): void {
    const s = run.state;
    const col = STATE + 2 * run.count + 1;
    const from = col + s[STATE + run.count + j]!;
    const to = col + s[STATE + run.count + j + 1]!;
    const total = s[STATE + 2 * run.count]!;
    if (to > from) fillMaglev(table, s.subarray(from, to), s.subarray(from + total, to + total), run.ids.subarray(from + 2 * total, to + 2 * total), this.m, TAIL_SLOTS);
  }
}

export class MaglevPool {
  private workers: Worker[] = [];
  private started = false;
  /** Tables the workers built (the rest were built on this thread). */
  byWorkers = 0;

  /** `workers`: threads besides this one (default: the cores there are, less one, at most 3). */
  constructor(private readonly size = Math.min(3, Math.max(0, availableParallelism() - 1))) {}

  /** Threads besides this one that build tables. */
  get threads(): number {
    return this.started ? this.workers.length : this.size;
  }

  /**
   * Starts the workers now (else at the first run of tables), so that they
   * are up by the first sync; returns how many there are.
   */
  start(): number {
    if (!this.started) {
      this.started = true;
      try {
        for (let w = 0; w < this.size; w++) {
          const worker = new Worker(WORKER_SOURCE, { eval: true });
          worker.unref();
          worker.on('error', () => this.giveUp());
          this.workers.push(worker);
        }
      } catch {
        this.giveUp();
      }
    }
    return this.workers.length;
  }

  /** Resolves once every worker answers (tests: a worker asked for tables is up). */
  async ready(): Promise<void> {
    this.start();
    await Promise.all(this.workers.map((w) => new Promise<void>((resolve) => {
      w.once('message', () => resolve());
      w.once('error', () => resolve());
      w.postMessage('ready');
    })));
  }

  /** The tables of `jobs` in a table of `m`, built as MaglevBuilds.table asks for them (close it when done). */
  builds(jobs: readonly MaglevJob[], m: number, seed: number): MaglevBuilds {
    return new MaglevBuilds(this, jobs, m, seed);
  }

  /** The tables of `jobs` in a table of `m`, in order: each equals maglevTable(job.backends, m, seed). */
  buildMany(jobs: readonly MaglevJob[], m: number, seed: number): Uint32Array[] {
    const b = this.builds(jobs, m, seed);
    try {
      return jobs.map((_, k) => {
        const table = b.table(k)?.slice(); // a copy: its run's memory is reused
        if (table) return table;
        const p = maglevPermutations(jobs[k]!.backends, m, seed); // throws for a set no table holds
        const own = new Uint32Array(m);
        if (p.ids.length > 0) fillMaglev(own, p.offset, p.skip, p.ids, m, TAIL_SLOTS);
        return own;
      });
    } finally {
      b.close();
    }
  }

  /** Stops the workers (they never keep the process alive); resolves once their threads are gone. */
  async close(): Promise<void> {
    const workers = this.workers;
    this.giveUp();
    await Promise.all(workers.map((w) => w.terminate().catch(() => undefined)));
  }

  /** @internal MaglevBuilds: a run for every worker. */
  post(run: { state: SharedArrayBuffer; out: SharedArrayBuffer; fresh: boolean; count: number; m: number; tail: number }): void {
    if (this.start() === 0) return;
    for (const w of this.workers) w.postMessage(run);
  }

  /** @internal */
  giveUp(): void {
    for (const w of this.workers) void w.terminate();
    this.workers = [];
    this.started = true;
  }
}
