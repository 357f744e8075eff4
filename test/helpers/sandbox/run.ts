// Processes: running a command with a deadline, clients inside a cgroup and a
// network namespace, servers inside a namespace, and ending each of them by
// the pid this run got when it started it (never by name). Also the clock the
// tests wait by: every deadline scales with SLOW.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(HERE, '../../..');
/**
 * bin/lbctl through test/helpers/lbctl, which drops the coverage hook tap's
 * runner puts in NODE_OPTIONS (a 4x slower start; see that file).
 */
export const LBCTL = path.join(ROOT, 'test/helpers/lbctl');
export const CLIENT_PY = path.resolve(HERE, '../client.py');
export const BACKEND_PY = path.resolve(HERE, '../backend.py');
export const BPFTOOL = existsSync('/usr/sbin/bpftool') ? '/usr/sbin/bpftool' : 'bpftool';

/**
 * Waits scale by this factor where everything runs slower (the vmtest guest
 * under TCG sets LBCTL_TEST_SLOW): a timeout there is not a behaviour failure.
 */
export const SLOW = Math.max(1, Number(process.env.LBCTL_TEST_SLOW ?? 1) || 1);

/**
 * The deadline of one lbctl or bpftool command. Under a second here; in the
 * emulated guest `lbctl bpf lb list` takes 5 s alone and 15-30 s beside a
 * steady load, so the deadline scales too.
 */
export const CLI_TIMEOUT_MS = 30_000 * SLOW;

export const sleepSync = (ms: number): void => {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
};
export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `check` until it holds; the deadline (`timeoutMs` here) scales with SLOW. */
export async function waitUntil(check: () => Promise<boolean> | boolean, what: string, timeoutMs = 15_000): Promise<void> {
  timeoutMs *= SLOW;
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`);
    await sleep(100);
  }
}

export interface ExecResult {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly ms: number;
}

export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

export function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
  } catch {
    return '';
  }
}

export function killPid(pid: number | undefined, signal: NodeJS.Signals = 'SIGKILL'): void {
  if (pid === undefined) return;
  try {
    process.kill(pid, signal);
  } catch {
    /* already gone */
  }
}

/** The run directory's `pids` file: one pid a line, every process the run started outside the cgroup. */
export function recordPid(runDir: string, pid: number | undefined): void {
  if (pid !== undefined) appendFileSync(path.join(runDir, 'pids'), `${pid}\n`);
}

export function recordedPids(runDir: string): number[] {
  try {
    return readFileSync(path.join(runDir, 'pids'), 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** How a command ended, for error messages: a deadline kill shows as a signal after the timeout. */
export function how(r: ExecResult): string {
  return `(${r.code !== null ? `exit ${r.code}` : `killed by ${r.signal}`} after ${Math.round(r.ms)} ms)`;
}

/**
 * Runs a command with a deadline (SIGTERM by pid when it passes, SIGKILL
 * later). `timeoutMs` is taken as it is: callers scale it (exec() does).
 */
export function run(cmd: string, args: readonly string[], timeoutMs: number, track?: Set<number>): Promise<ExecResult> {
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const proc = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const pid = proc.pid;
    if (pid !== undefined) track?.add(pid);
    let stdout = '';
    let stderr = '';
    proc.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    proc.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    // SIGTERM first, so a script's cleanup trap runs; SIGKILL 10 s (scaled) later.
    let hard: NodeJS.Timeout | undefined;
    const timer = setTimeout(() => {
      killPid(pid, 'SIGTERM');
      hard = setTimeout(() => killPid(pid), 10_000 * SLOW);
    }, timeoutMs);
    // A grandchild that outlives the process can hold its pipes open: once
    // the process itself has exited, stop waiting for them after 5 s (scaled).
    proc.on('exit', () => setTimeout(() => (proc.stdout.destroy(), proc.stderr.destroy()), 5_000 * SLOW).unref());
    proc.on('error', (err) => {
      clearTimeout(timer);
      clearTimeout(hard);
      reject(err);
    });
    proc.on('close', (code, signal) => {
      clearTimeout(timer);
      clearTimeout(hard);
      if (pid !== undefined) track?.delete(pid);
      resolve({ code, signal, stdout, stderr, ms: performance.now() - t0 });
    });
  });
}

/**
 * Runs a client in `cgroup` and network namespace `netns`, its pid kept in
 * `track` while it runs; `timeoutMs` as it is (unscaled). The shell joins
 * the cgroup first: `ip netns exec` remounts /sys, hiding cgroupfs. An
 * external client (a netns outside the test cgroup) would be the same
 * without the first step.
 */
export function runInCgroupNetns(cgroup: string, netns: string, cmd: readonly string[], timeoutMs: number, track: Set<number>): Promise<ExecResult> {
  const script = 'cg=$1; ns=$2; shift 2; echo $$ > "$cg/cgroup.procs" && exec ip netns exec "$ns" "$@"';
  return run('sh', ['-c', script, 'sh', cgroup, netns, ...cmd], timeoutMs, track);
}

/** The interpreter the clients and backends run with (resolved once per sandbox). */
export function python(): string {
  return execFileSync('python3', ['-c', 'import sys; print(sys.executable)'], { encoding: 'utf8' }).trim();
}

/**
 * Long-running servers inside a network namespace and outside the test
 * cgroup, each recorded in the run directory so a later run can end it if
 * this one dies first, and each killed by its pid.
 */
export class Servers {
  private readonly procs: ChildProcess[] = [];

  constructor(private readonly runDir: string) {}

  spawn(netns: string, args: readonly string[]): ChildProcess {
    const proc = spawn('ip', ['netns', 'exec', netns, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.procs.push(proc);
    recordPid(this.runDir, proc.pid);
    return proc;
  }

  killAll(): void {
    this.procs.forEach((p) => killPid(p.pid));
  }
}
