// The benchmark's throwaway world, built only from things this run creates
// and removes again (the same rules as the e2e sandbox, test/helpers/sandbox.ts):
//
//   client netns  lbctl-bench-<run>-c<k>  veth lbbc<k>  10.244.0.1/16, route 10.96.0.0/12 dev lbbc<k>,
//                                          no default route (a packet that escapes translation dies
//                                          in the backend netns, which we also made)
//   backend netns lbctl-bench-<run>-s<k>  veth lbbs<k>  10.244.0.2, .3, .4 (the measured services' pods)
//   child cgroup  <cgroup2>/lbctl-bench-<run>   lbctl attaches here; only the bench client joins it
//   side cgroups  <cgroup2>/lbctl-bench-<run>-<name>   beside it: bench/sock-floor.ts's direct clients
//                                          and the datapaths it compares with lbctl's
//   bpf root      /sys/fs/bpf/lbctl-bench-<run>-<k>
//   memory cgroup <memory>/lbctl-bench-<run>-mem   the agent of a memory-limited point (v1's memory
//                                          hierarchy where it is mounted, else cgroup2 with memory enabled)
//
// Every mode gets a fresh pair of namespaces (world k), so no conntrack or
// rule state carries over from one mode to the next.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const LBCTL = path.join(ROOT, 'bin/lbctl');
const PREFIX = 'lbctl-bench-';
const BPFFS = '/sys/fs/bpf';
const NETNS_DIR = '/run/netns';

export const CLIENT_IP = '10.244.0.1';
/** The pods of the measured services (all in the backend netns). */
export const POD_IPS = ['10.244.0.2', '10.244.0.3', '10.244.0.4'] as const;
export const POD_PORT = 8080;
export const CLUSTER_CIDR = '10.244.0.0/16';
export const SERVICE_CIDR = '10.96.0.0/12';

function mounts(): string[][] {
  return readFileSync('/proc/mounts', 'utf8').trim().split('\n').map((l) => l.split(' '));
}

export function cgroup2Mount(): string {
  const m = mounts().find((l) => l[2] === 'cgroup2');
  if (!m?.[1]) throw new Error('no cgroup2 mount in /proc/mounts');
  return m[1];
}

export function sh(cmd: string, args: readonly string[], input?: string): string {
  return execFileSync(cmd, args, { encoding: 'utf8', input, stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'], maxBuffer: 1 << 30 });
}

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function removeCgroup(cg: string): void {
  for (let i = 0; existsSync(cg); i++) {
    for (const pid of readFileSync(path.join(cg, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean)) {
      try {
        process.kill(Number(pid), 'SIGKILL'); // only bench clients ever join it
      } catch {
        /* gone */
      }
    }
    try {
      rmdirSync(cg);
    } catch (err) {
      if (i >= 50) throw err;
      sleepSync(50);
    }
  }
}

function removeBpfRoot(dir: string): void {
  if (!existsSync(dir)) return;
  sh(LBCTL, ['cleanup', '--bpf-root', dir]);
  rmSync(dir, { recursive: true, force: true });
}

function removeNetns(name: string): void {
  if (existsSync(path.join(NETNS_DIR, name))) sh('ip', ['netns', 'del', name]);
}

/** Removes what crashed bench runs left (their owning process is gone). */
export function sweepLeftovers(): void {
  const stale = (dir: string): string[] =>
    (existsSync(dir) ? readdirSync(dir) : []).filter((n) => {
      const m = new RegExp(`^${PREFIX}(\\d+)`).exec(n);
      return m && !pidAlive(Number(m[1]));
    });
  for (const n of stale(NETNS_DIR)) removeNetns(n);
  for (const n of stale(BPFFS)) removeBpfRoot(path.join(BPFFS, n));
  const cg = cgroup2Mount();
  for (const n of stale(cg)) removeCgroup(path.join(cg, n));
  const mem = memoryHierarchy();
  if (mem && mem.root !== cg) for (const n of stale(mem.root)) removeCgroup(path.join(mem.root, n));
}

/**
 * Where a memory limit can be set: cgroup v1's memory hierarchy when it is
 * mounted (hybrid hosts like this one, whose cgroup2 mount has no
 * controllers), else the cgroup2 mount when its root already enables the
 * memory controller for its children (never enabled by the bench). Undefined: nowhere (the memory-limited run is then not made).
 */
export function memoryHierarchy(): { root: string; v: 1 | 2 } | undefined {
  const v1 = mounts().find((l) => l[2] === 'cgroup' && (l[3] ?? '').split(',').includes('memory'));
  if (v1?.[1]) return { root: v1[1], v: 1 };
  const v2 = cgroup2Mount();
  try {
    // Only where the host already gives its children the memory controller:
    // the bench never changes the root cgroup's configuration.
    if (readFileSync(path.join(v2, 'cgroup.subtree_control'), 'utf8').split(/\s+/).includes('memory')) return { root: v2, v: 2 };
  } catch {
    /* no controllers file */
  }
  return undefined;
}

/** A memory cgroup with a hard limit: the container limit a DaemonSet sets, for one process of the run. */
export class MemoryCgroup {
  private constructor(
    readonly dir: string,
    readonly v: 1 | 2,
    readonly limitBytes: number,
  ) {}

  static make(runId: string, limitBytes: number): MemoryCgroup | undefined {
    const h = memoryHierarchy();
    if (!h) return undefined;
    const dir = path.join(h.root, `${runId}-mem`);
    if (!existsSync(dir)) mkdirSync(dir);
    writeFileSync(path.join(dir, h.v === 1 ? 'memory.limit_in_bytes' : 'memory.max'), String(limitBytes));
    return new MemoryCgroup(dir, h.v, limitBytes);
  }

  /** The wrapper that puts a command into this cgroup before it runs (argv prefix). */
  wrap(cmd: string, args: readonly string[]): [string, string[]] {
    return ['sh', ['-c', `echo $$ > "$0/cgroup.procs" && exec "$@"`, this.dir, cmd, ...args]];
  }

  /** The kernel's OOM kills in this cgroup so far. */
  oomKills(): number {
    const file = path.join(this.dir, this.v === 1 ? 'memory.oom_control' : 'memory.events');
    return Number(/^oom_kill (\d+)$/m.exec(readFileSync(file, 'utf8'))?.[1] ?? 0);
  }

  /** The cgroup's peak charge in bytes (v1: max_usage_in_bytes; v2: memory.peak, 5.19+), page cache included. */
  peakBytes(): number | undefined {
    try {
      return Number(readFileSync(path.join(this.dir, this.v === 1 ? 'memory.max_usage_in_bytes' : 'memory.peak'), 'utf8').trim());
    } catch {
      return undefined;
    }
  }

  close(): void {
    removeCgroup(this.dir);
  }
}

/** One run: owns the cgroup and every world it makes; `close()` removes them all. */
export class BenchRun {
  readonly id = `${PREFIX}${process.pid}`;
  readonly cgroup = path.join(cgroup2Mount(), this.id);
  private readonly worlds = new Set<World>();
  private readonly procs = new Set<ChildProcess>();
  private readonly memCgroups = new Set<MemoryCgroup>();
  private readonly sideCgroups = new Set<string>();
  private next = 0;

  constructor() {
    sweepLeftovers();
    if (!mounts().some((l) => l[1] === BPFFS && l[2] === 'bpf')) sh('mount', ['-t', 'bpf', 'bpf', BPFFS]);
    mkdirSync(this.cgroup);
    const bye = (): void => this.close();
    process.once('exit', bye);
    for (const sig of ['SIGINT', 'SIGTERM'] as const) {
      process.once(sig, () => {
        bye();
        process.exit(130);
      });
    }
  }

  /** A memory cgroup limited to `limitBytes`, removed at close; undefined where no memory controller is mounted. */
  memoryCgroup(limitBytes: number): MemoryCgroup | undefined {
    const m = MemoryCgroup.make(this.id, limitBytes);
    if (m) this.memCgroups.add(m);
    return m;
  }

  /**
   * A cgroup beside the run's (not below it, so nothing attached to the
   * run's cgroup applies in it), `<cgroup2>/<run id>-<name>`, made once and
   * removed at close: bench/sock-floor.ts's direct clients and its other
   * datapaths.
   */
  sideCgroup(name: string): string {
    const cg = `${this.cgroup}-${name}`;
    if (!this.sideCgroups.has(cg)) {
      mkdirSync(cg);
      this.sideCgroups.add(cg);
    }
    return cg;
  }

  world(): World {
    const w = new World(this, this.next++);
    this.worlds.add(w);
    return w;
  }

  /** A child process this run owns: killed (by its PID) at close if still running. */
  spawn(cmd: string, args: readonly string[], opts: { cgroup?: boolean } = {}): ChildProcess {
    // Into the cgroup first, then into the namespace (ip netns exec remounts /sys).
    const p = opts.cgroup
      ? spawn('sh', ['-c', `echo $$ > "$0/cgroup.procs" && exec "$@"`, this.cgroup, cmd, ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
      : spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    this.procs.add(p);
    p.once('exit', () => this.procs.delete(p));
    return p;
  }

  dropWorld(w: World): void {
    this.worlds.delete(w);
  }

  close(): void {
    for (const p of this.procs) if (p.exitCode === null && p.pid) process.kill(p.pid, 'SIGKILL');
    this.procs.clear();
    for (const w of this.worlds) w.close();
    removeCgroup(this.cgroup);
    for (const cg of this.sideCgroups) removeCgroup(cg);
    this.sideCgroups.clear();
    for (const m of this.memCgroups) m.close();
    this.memCgroups.clear();
  }
}

/** A client netns and a backend netns joined by veth, with the pods' server running. */
export class World {
  readonly client: string;
  readonly backend: string;
  readonly bpfRoot: string;
  private server?: ChildProcess;
  private closed = false;

  constructor(
    readonly run: BenchRun,
    readonly k: number,
  ) {
    this.client = `${run.id}-c${k}`;
    this.backend = `${run.id}-s${k}`;
    this.bpfRoot = path.join(BPFFS, `${run.id}-${k}`);
    const vc = `lbbc${k}`;
    const vs = `lbbs${k}`;
    sh('ip', ['netns', 'add', this.client]);
    sh('ip', ['netns', 'add', this.backend]);
    const inC = (...a: string[]): string => sh('ip', ['-n', this.client, ...a]);
    const inS = (...a: string[]): string => sh('ip', ['-n', this.backend, ...a]);
    sh('ip', ['link', 'add', vc, 'netns', this.client, 'type', 'veth', 'peer', 'name', vs, 'netns', this.backend]);
    inC('link', 'set', 'lo', 'up');
    inS('link', 'set', 'lo', 'up');
    inC('addr', 'add', `${CLIENT_IP}/16`, 'dev', vc);
    for (const a of POD_IPS) inS('addr', 'add', `${a}/16`, 'dev', vs);
    inC('link', 'set', vc, 'up');
    inS('link', 'set', vs, 'up');
    inC('route', 'add', SERVICE_CIDR, 'dev', vc);
  }

  /** Runs a command in the client netns (synchronously). */
  inClient(cmd: string, args: readonly string[], input?: string): string {
    return sh('ip', ['netns', 'exec', this.client, cmd, ...args], input);
  }

  /** Starts the pods' server in the backend netns, on `cpu`; resolves once it listens. */
  async startServer(bin: string, cpu: number): Promise<void> {
    const p = this.run.spawn('ip', ['netns', 'exec', this.backend, 'taskset', '-c', String(cpu), bin, '-p', String(POD_PORT), '-a', '0.0.0.0']);
    this.server = p;
    await new Promise<void>((resolve, reject) => {
      let out = '';
      const timer = setTimeout(() => reject(new Error(`bench server did not start: ${out}`)), 10_000);
      p.stdout!.on('data', (d: Buffer) => {
        out += d.toString();
        if (out.includes('listening')) {
          clearTimeout(timer);
          resolve();
        }
      });
      p.stderr!.on('data', (d: Buffer) => (out += d.toString()));
      p.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`bench server exited ${code}: ${out}`));
      });
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.server?.pid && this.server.exitCode === null) process.kill(this.server.pid, 'SIGKILL');
    removeBpfRoot(this.bpfRoot);
    removeNetns(this.client);
    removeNetns(this.backend);
    // The agent's local API socket (bench/lbctl.ts names it after the client): left behind by an agent that was killed.
    rmSync(path.join('/tmp', `${this.client}.sock`), { force: true });
    this.run.dropWorld(this);
  }
}
