// A steady load from a client's place (client.py load): fresh sockets at a
// fixed rate a second per target, every failure recorded, until stopped. It
// runs through whatever `exec` it is given, so the same load can come from
// the test cgroup's client netns or, later, from an external client's netns.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { CLIENT_PY, sleep, SLOW, type ExecResult } from './run.js';

export interface LoadOptions {
  /** HOST:PORT[@RATE] */
  readonly tcp?: readonly string[];
  readonly udp?: readonly string[];
  /** Attempts a second per target (default 300). */
  readonly rate?: number;
  /** The client stops by itself after this long (default 90). */
  readonly maxSeconds?: number;
  /** Seconds one attempt may take before it counts as failed (default 3; scaled by SLOW). */
  readonly attemptTimeout?: number;
}

export interface LoadProgress {
  attempted: number;
  ok: number;
  failed: number;
  /** The first failures (up to 10), so a test can say what failed, not only how many. */
  failures?: LoadFailure[];
  /** Epoch ms of this snapshot. */
  at: number;
}

export interface LoadFailure {
  target: string;
  phase: string;
  error: string;
  /** Epoch ms. */
  at: number;
  ms: number;
}

export interface LoadResult {
  /** Epoch ms. */
  started: number;
  seconds: number;
  issued: number;
  attempted: number;
  ok: number;
  failed: number;
  failures: LoadFailure[];
  targets: Record<string, { attempted: number; ok: number; failed: number; backends: Record<string, number> }>;
  maxLatencyMs: number;
  maxBacklog: number;
  /** Successful attempts by the 100 ms (epoch ms, floored) in which they ended. */
  okPer100ms: Record<string, number>;
}

export interface LoadRun {
  progress(): LoadProgress | undefined;
  waitFor(check: (p: LoadProgress) => boolean, what: string, timeoutMs?: number): Promise<LoadProgress>;
  /** Stops the client and returns what it saw. */
  stop(): Promise<LoadResult>;
}

/** Where a load runs from. */
export interface LoadHost {
  /** Its stop and progress files go here. */
  readonly runDir: string;
  readonly python: string;
  /** Runs a command in the client's place, with `timeoutMs` as it is (the load scales its own). */
  exec(cmd: readonly string[], opts: { timeoutMs?: number }): Promise<ExecResult>;
  /** Undone at teardown if the test never stops the load. */
  readonly cleanups: Set<() => void>;
}

export function startLoad(host: LoadHost, opts: LoadOptions): LoadRun {
  const id = Math.random().toString(16).slice(2, 8);
  const stopFile = path.join(host.runDir, `load-${id}.stop`);
  const progressFile = path.join(host.runDir, `load-${id}.progress`);
  // A lost packet still fails the attempt; only the wait for it scales with SLOW
  // (the emulated guest answered within 2.4 s at worst while the host was busy).
  const args = ['load', '--rate', String(opts.rate ?? 300), '--seconds', String(opts.maxSeconds ?? 90), '--stop-file', stopFile, '--progress', progressFile,
    '--timeout', String((opts.attemptTimeout ?? 3) * SLOW)];
  for (const t of opts.tcp ?? []) args.push('--tcp', t);
  for (const u of opts.udp ?? []) args.push('--udp', u);
  const done = host.exec([host.python, CLIENT_PY, ...args], { timeoutMs: ((opts.maxSeconds ?? 90) + 30 * SLOW) * 1000 });
  const progress = (): LoadProgress | undefined => {
    try {
      return JSON.parse(readFileSync(progressFile, 'utf8')) as LoadProgress;
    } catch {
      return undefined;
    }
  };
  const cleanup = (): void => {
    if (!existsSync(host.runDir)) return;
    writeFileSync(stopFile, '');
  };
  host.cleanups.add(cleanup);
  return {
    progress,
    waitFor: async (check, what, timeoutMs = 15_000) => {
      timeoutMs *= SLOW;
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const p = progress();
        if (p && check(p)) return p;
        if (Date.now() > deadline) throw new Error(`load: timed out after ${timeoutMs} ms waiting for ${what}; progress ${JSON.stringify(p)}`);
        await sleep(50);
      }
    },
    stop: async () => {
      writeFileSync(stopFile, '');
      const r = await done;
      host.cleanups.delete(cleanup);
      if (r.code !== 0) throw new Error(`client.py load failed (${r.code ?? r.signal}): ${r.stderr}`);
      return JSON.parse(r.stdout) as LoadResult;
    },
  };
}
