/**
 * Maglev tables built on several cores, called synchronously: the
 * reconciler's sync stays one synchronous pass over the maps, and a cold
 * start of thousands of Maglev frontends (each table about 0.2 ms of one
 * core at M = 16,381) shares its builds between this thread and workers.
 *
 * This thread hashes every backend (maglevPermutations: the only part that
 * depends on names and the seed) and fills its share of the tables; each
 * worker fills a share into one SharedArrayBuffer and counts itself done
 * with Atomics; this thread waits for them with Atomics.wait. Workers run
 * fillMaglev's own source (it names nothing outside itself), so they need
 * no module file: the agent ships as one bundle. The tables are the same
 * slot for slot whoever fills them (test/unit/maglev-pool.ts).
 *
 * A worker that fails or does not answer within WAIT_MS is given up on for
 * good: its tables are built here, and later batches use this thread only.
 */
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { fillMaglev, maglevPermutations, TAIL_SLOTS, type MaglevBackend, type MaglevPermutations } from './maglev.js';

/** A worker's share of a batch: the tables it fills and where. */
interface Share {
  readonly m: number;
  readonly tail: number;
  readonly out: SharedArrayBuffer;
  readonly done: SharedArrayBuffer;
  readonly worker: number;
  readonly jobs: ReadonlyArray<{ readonly at: number; readonly offset: Int32Array; readonly skip: Int32Array; readonly ids: Uint32Array }>;
}

const WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const fillMaglev = ${fillMaglev.toString()};
parentPort.on('message', (s) => {
  const done = new Int32Array(s.done);
  try {
    for (const j of s.jobs) fillMaglev(new Uint32Array(s.out, j.at * s.m * 4, s.m), j.offset, j.skip, j.ids, s.m, s.tail);
    Atomics.store(done, s.worker, 1);
  } catch (err) {
    Atomics.store(done, s.worker, 2);
  }
  Atomics.notify(done, s.worker);
});
`;

/** How long this thread waits for a worker's share before building it itself. */
const WAIT_MS = 10_000;
/** Fewer tables than this a worker are built on this thread: a message costs more than they do. */
const MIN_PER_WORKER = 8;

export interface MaglevJob {
  readonly backends: readonly MaglevBackend[];
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

  /** The tables of `jobs` in a table of `m`, in order: each equals maglevTable(job.backends, m, seed). */
  buildMany(jobs: readonly MaglevJob[], m: number, seed: number): Uint32Array[] {
    const perms: MaglevPermutations[] = jobs.map((j) => maglevPermutations(j.backends, m, seed));
    const out = new SharedArrayBuffer(jobs.length * m * 4);
    const tables: Uint32Array[] = perms.map((_, k) => new Uint32Array(out, k * m * 4, m));
    const want = Math.floor(jobs.length / MIN_PER_WORKER) - 1; // workers worth a message (none: no thread is started)
    const helpers = want > 0 ? Math.min(this.start(), want) : 0;
    const parts = Math.max(1, helpers + 1);
    const per = Math.ceil(jobs.length / parts);
    const done = new Int32Array(new SharedArrayBuffer(4 * Math.max(1, helpers)));
    const given: Array<[number, number, number]> = [];
    for (let w = 0; w < helpers; w++) {
      const from = (w + 1) * per;
      const to = Math.min(jobs.length, from + per);
      if (from >= to) continue;
      const share: Share = {
        m, tail: TAIL_SLOTS, out, done: done.buffer as SharedArrayBuffer, worker: w,
        jobs: perms.slice(from, to).map((p, i) => ({ at: from + i, offset: p.offset, skip: p.skip, ids: p.ids })),
      };
      this.workers[w]!.postMessage(share);
      given.push([w, from, to]);
    }
    for (let k = 0; k < Math.min(per, jobs.length); k++) fill(tables[k]!, perms[k]!, m);
    for (const [w, from, to] of given) {
      if (Atomics.load(done, w) === 0) Atomics.wait(done, w, 0, WAIT_MS);
      if (Atomics.load(done, w) === 1) {
        this.byWorkers += to - from;
        continue;
      }
      this.giveUp(); // failed or silent: its share is built here, and no worker is asked again
      for (let k = from; k < to; k++) {
        tables[k] = new Uint32Array(m); // not the shared one: the worker may still be writing there
        fill(tables[k]!, perms[k]!, m);
      }
    }
    return tables;
  }

  /** Stops the workers (they never keep the process alive). */
  close(): void {
    this.giveUp();
  }

  private start(): number {
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

  private giveUp(): void {
    for (const w of this.workers) void w.terminate();
    this.workers = [];
    this.started = true;
  }
}

function fill(table: Uint32Array, p: MaglevPermutations, m: number): void {
  if (p.ids.length > 0) fillMaglev(table, p.offset, p.skip, p.ids, m, TAIL_SLOTS);
}
