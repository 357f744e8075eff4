// A throwaway world for lbctl's end-to-end tests, built only from things this
// run creates and removes again:
//
//   child cgroup  <cgroup2>/lbctl-test-<run>      the agent attaches here; only test clients join it
//   bpf root      /sys/fs/bpf/lbctl-test-<run>     pinned maps and links
//   client netns  lbctl-test-<run>-c  veth lbc0  10.244.0.1/16  fd00:244::1/64, no default route
//   backend netns lbctl-test-<run>-b  veth lbb0  backend i: 10.244.1.i, fd00:244::1:i
//                                                 dns j:     10.244.2.j
//   manifests     /tmp/lbctl-test-<run>/manifests  watched by the agent
//
// Service addresses (10.96.0.0/16, fd00:96::/64, 10.97.0.0/16) are routed
// nowhere, so a packet that escaped translation dies in the client netns.
// Teardown is synchronous, so the same code runs from t.teardown and from a
// process exit handler; a sweep at start removes what crashed runs left.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, rmdirSync, unlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { onExit } from 'signal-exit';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(HERE, '../..');
export const LBCTL = path.join(ROOT, 'bin/lbctl');
export const CLIENT_PY = path.join(HERE, 'client.py');
const BACKEND_PY = path.join(HERE, 'backend.py');
const PREFIX = 'lbctl-test-';
const BPFFS = '/sys/fs/bpf';
const NETNS_DIR = '/run/netns';
const BPFTOOL = existsSync('/usr/sbin/bpftool') ? '/usr/sbin/bpftool' : 'bpftool';

export const HTTP_PORT = 8080;
export const UDP_PORT = 9000;
export const DNS_PORT = 53;
export const DNS_NAME = 'svc.test';
export const DNS_ANSWER = '1.2.3.4';
export const CLIENT_V4 = '10.244.0.1';
export const CLIENT_V6 = 'fd00:244::1';

export interface BackendAddrs {
  readonly v4: string;
  readonly v6: string;
}

export interface SandboxOptions {
  /** HTTP (TCP 8080) + UDP echo (9000) backends, each on its own v4 and v6 address. Default 3. */
  readonly backends?: number;
  /** dnsmasq backends on 10.244.2.j:53 (UDP and TCP). Default 0. */
  readonly dns?: number;
  /** Files written to the manifest directory before the agent starts. */
  readonly manifests?: Readonly<Record<string, string>>;
  /** Start the agent (and wait for its first sync). Default true. */
  readonly agent?: boolean;
}

export interface ExecResult {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly ms: number;
}

export interface LbListEntry {
  frontend: string;
  revNatId: number;
  type: string;
  backends: Array<{ address: string; id: number; slot: number; state: string }>;
}

/** One pino line of the agent, parsed. */
export type LogLine = Record<string, unknown> & { msg?: string };

export interface SyncReport extends LogLine {
  planned: number;
  applied: number;
  frontends: number;
}

export interface PinnedLink {
  readonly linkId: number;
  readonly progId: number;
  /** bpftool's tag: a hash of the program's instructions. */
  readonly progTag: string;
}

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

export interface FreshSync {
  readonly sync: SyncReport;
  readonly list: LbListEntry[];
  readonly maps: Record<string, unknown[]>;
}

interface TeardownHost {
  teardown(fn: () => unknown): void;
}

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

const sleepSync = (ms: number): void => {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
};
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function mounts(): string[][] {
  return readFileSync('/proc/mounts', 'utf8').trim().split('\n').map((l) => l.split(' '));
}

/** The cgroup v2 mount (/sys/fs/cgroup/unified on hybrid hosts, /sys/fs/cgroup elsewhere). */
export function cgroup2Mount(): string {
  const m = mounts().find((l) => l[2] === 'cgroup2');
  if (!m?.[1]) throw new Error('no cgroup2 mount in /proc/mounts');
  return m[1];
}

function ensureBpffs(): void {
  if (mounts().some((l) => l[1] === BPFFS && l[2] === 'bpf')) return;
  execFileSync('mount', ['-t', 'bpf', 'bpf', BPFFS]);
}

function ip(...args: string[]): string {
  return execFileSync('ip', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
  } catch {
    return '';
  }
}

function killPid(pid: number | undefined, signal: NodeJS.Signals = 'SIGKILL'): void {
  if (pid === undefined) return;
  try {
    process.kill(pid, signal);
  } catch {
    /* already gone */
  }
}

function cgroupPids(cg: string): number[] {
  try {
    return readFileSync(path.join(cg, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** Kills what is left in a test cgroup (only our clients ever join one) and removes it. */
function removeCgroup(cg: string): void {
  if (!existsSync(cg)) return;
  for (let i = 0; i < 50; i++) {
    const pids = cgroupPids(cg);
    for (const pid of pids) killPid(pid);
    try {
      rmdirSync(cg);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      if (i === 49) throw err;
    }
    sleepSync(50);
  }
}

function removeBpfRoot(dir: string): void {
  if (!existsSync(dir)) return;
  execFileSync(LBCTL, ['cleanup', '--bpf-root', dir], { stdio: ['ignore', 'ignore', 'pipe'], timeout: CLI_TIMEOUT_MS });
}

function removeNetns(name: string): void {
  if (existsSync(path.join(NETNS_DIR, name))) ip('netns', 'del', name);
}

/** The run directory's `pids` file: one pid a line, every process the run started outside the cgroup. */
function recordedPids(runDir: string): number[] {
  try {
    return readFileSync(path.join(runDir, 'pids'), 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

function runOwnerAlive(name: string): boolean {
  const m = /^lbctl-test-(\d+)-/.exec(name);
  return m ? pidAlive(Number(m[1])) : true;
}

/** Removes everything earlier runs left behind (their owning test process is dead). */
export function sweepLeftovers(): string[] {
  const removed: string[] = [];
  const stale = (names: string[]): string[] => names.filter((n) => n.startsWith(PREFIX) && !runOwnerAlive(n));
  const list = (dir: string): string[] => (existsSync(dir) ? readdirSync(dir) : []);
  for (const name of stale(list(os.tmpdir()))) {
    const runDir = path.join(os.tmpdir(), name);
    for (const pid of recordedPids(runDir)) if (cmdline(pid).includes(name)) killPid(pid);
    rmSync(runDir, { recursive: true, force: true });
    removed.push(runDir);
  }
  const cg = cgroup2Mount();
  for (const name of stale(list(cg))) {
    removeCgroup(path.join(cg, name));
    removed.push(path.join(cg, name));
  }
  for (const name of stale(list(BPFFS))) {
    removeBpfRoot(path.join(BPFFS, name));
    removed.push(path.join(BPFFS, name));
  }
  for (const name of stale(list(NETNS_DIR))) {
    removeNetns(name);
    removed.push(`netns ${name}`);
  }
  return removed;
}

/** Sandboxes still standing, torn down by the exit handler if the test dies first. */
const live = new Set<Sandbox>();
let exitHookInstalled = false;
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  onExit(() => {
    for (const sb of live) {
      try {
        sb.teardown();
      } catch (err) {
        process.stderr.write(`sandbox ${sb.runId}: teardown failed: ${String(err)}\n`);
      }
    }
  });
}

/** The agent as a child process, with its log lines parsed as they come. */
export class AgentProcess {
  readonly logs: LogLine[] = [];
  readonly exited: Promise<number | null>;
  private readonly waiters = new Set<() => void>();
  private exitCode: number | null | undefined;
  /** The signal that ended the process, once it has exited (null: it exited by itself). */
  exitSignal: NodeJS.Signals | null | undefined;

  constructor(readonly proc: ChildProcess) {
    const rl = createInterface({ input: proc.stderr! });
    rl.on('line', (line) => {
      let parsed: LogLine;
      try {
        parsed = JSON.parse(line) as LogLine;
      } catch {
        parsed = { msg: 'non-json', line };
      }
      this.logs.push(parsed);
      this.waiters.forEach((w) => w());
    });
    proc.stdout!.resume();
    proc.on('exit', (_code, signal) => (this.exitSignal = signal));
    this.exited = new Promise((resolve) => {
      proc.on('exit', (code) => {
        this.exitCode = code;
        this.waiters.forEach((w) => w());
        resolve(code);
      });
    });
  }

  get pid(): number {
    return this.proc.pid!;
  }

  get running(): boolean {
    return this.exitCode === undefined;
  }

  syncs(): SyncReport[] {
    return this.logs.filter((l): l is SyncReport => l.msg === 'sync done');
  }

  /** The first log line at index >= `from` that matches. */
  waitForLog(match: (l: LogLine) => boolean, from = 0, timeoutMs = 15_000): Promise<LogLine> {
    timeoutMs *= SLOW;
    return new Promise((resolve, reject) => {
      const check = (): void => {
        for (let i = from; i < this.logs.length; i++) {
          if (match(this.logs[i]!)) return done(() => resolve(this.logs[i]!));
        }
        if (!this.running) done(() => reject(new Error(`agent exited (${this.exitCode}) before the awaited log line; last lines:\n${this.tail()}`)));
      };
      const timer = setTimeout(() => done(() => reject(new Error(`no such agent log line within ${timeoutMs} ms; last lines:\n${this.tail()}`))), timeoutMs);
      const done = (fn: () => void): void => {
        clearTimeout(timer);
        this.waiters.delete(check);
        fn();
      };
      this.waiters.add(check);
      check();
    });
  }

  tail(n = 15): string {
    return this.logs.slice(-n).map((l) => JSON.stringify(l)).join('\n');
  }
}

export class Sandbox {
  readonly runId = `${PREFIX}${process.pid}-${Math.random().toString(16).slice(2, 8)}`;
  readonly runDir = path.join(os.tmpdir(), this.runId);
  readonly manifestDir = path.join(this.runDir, 'manifests');
  readonly cgroup = path.join(cgroup2Mount(), this.runId);
  readonly bpfRoot = path.join(BPFFS, this.runId);
  readonly clientNs = `${this.runId}-c`;
  readonly backendNs = `${this.runId}-b`;
  readonly backends: BackendAddrs[];
  readonly dnsBackends: string[];
  readonly python: string;
  agent: AgentProcess | undefined;

  private readonly servers: ChildProcess[] = [];
  private readonly clients = new Set<number>();
  private syncMark = 0;
  private tornDown = false;
  /** Extra things a test made (a second datapath, a load client), undone first at teardown. */
  private readonly cleanups = new Set<() => void>();

  constructor(readonly opts: SandboxOptions = {}) {
    this.backends = Array.from({ length: opts.backends ?? 3 }, (_, i) => ({ v4: `10.244.1.${i + 1}`, v6: `fd00:244::1:${i + 1}` }));
    this.dnsBackends = Array.from({ length: opts.dns ?? 0 }, (_, j) => `10.244.2.${j + 1}`);
    this.python = execFileSync('python3', ['-c', 'import sys; print(sys.executable)'], { encoding: 'utf8' }).trim();
  }

  // ------------------------------------------------------------- build

  async start(): Promise<void> {
    live.add(this);
    installExitHook();
    mkdirSync(this.manifestDir, { recursive: true });
    ensureBpffs();
    mkdirSync(this.cgroup);
    this.makeNetworks();
    await this.startBackendServers();
    await this.startDnsServers();
    for (const [name, text] of Object.entries(this.opts.manifests ?? {})) this.writeManifest(name, text);
    if (this.opts.agent ?? true) await this.startAgent();
  }

  private makeNetworks(): void {
    const c = this.clientNs;
    const b = this.backendNs;
    ip('netns', 'add', c);
    ip('netns', 'add', b);
    ip('link', 'add', 'lbc0', 'netns', c, 'type', 'veth', 'peer', 'name', 'lbb0', 'netns', b);
    const inNs = (ns: string, ...args: string[]): string => ip('-n', ns, ...args);
    inNs(c, 'addr', 'add', `${CLIENT_V4}/16`, 'dev', 'lbc0');
    inNs(c, 'addr', 'add', `${CLIENT_V6}/64`, 'dev', 'lbc0', 'nodad');
    for (const be of this.backends) {
      inNs(b, 'addr', 'add', `${be.v4}/16`, 'dev', 'lbb0');
      inNs(b, 'addr', 'add', `${be.v6}/64`, 'dev', 'lbb0', 'nodad');
    }
    for (const a of this.dnsBackends) inNs(b, 'addr', 'add', `${a}/16`, 'dev', 'lbb0');
    for (const ns of [c, b]) {
      inNs(ns, 'link', 'set', 'lo', 'up');
      inNs(ns, 'link', 'set', ns === c ? 'lbc0' : 'lbb0', 'up');
    }
  }

  /** Spawns a server inside the backend netns (outside the test cgroup) and remembers its pid. */
  private spawnServer(args: string[]): ChildProcess {
    const proc = spawn('ip', ['netns', 'exec', this.backendNs, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.servers.push(proc);
    this.recordPid(proc.pid);
    return proc;
  }

  private async startBackendServers(): Promise<void> {
    if (this.backends.length === 0) return;
    const args = [this.python, BACKEND_PY, '--tag', this.runId];
    for (const be of this.backends) {
      args.push('--http', `${be.v4}:${HTTP_PORT}`, '--http', `[${be.v6}]:${HTTP_PORT}`);
      args.push('--udp', `${be.v4}:${UDP_PORT}`, '--udp', `[${be.v6}]:${UDP_PORT}`);
    }
    const proc = this.spawnServer(args);
    let stderr = '';
    proc.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`backend servers not ready in 10 s: ${stderr}`)), 10_000);
      proc.stdout!.once('data', () => {
        clearTimeout(timer);
        resolve();
      });
      proc.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`backend servers exited (${code}): ${stderr}`));
      });
    });
  }

  private async startDnsServers(): Promise<void> {
    for (const [j, addr] of this.dnsBackends.entries()) {
      const proc = this.spawnServer([
        'dnsmasq', '--keep-in-foreground', '--conf-file=/dev/null', '--no-resolv', '--no-hosts',
        '--bind-interfaces', `--listen-address=${addr}`, `--port=${DNS_PORT}`, '--user=root', '--group=root',
        `--address=/${DNS_NAME}/${DNS_ANSWER}`, `--address=/whoami.${DNS_NAME}/${addr}`,
        `--pid-file=${path.join(this.runDir, `dnsmasq-${j}.pid`)}`,
      ]);
      proc.stdout!.resume();
      proc.stderr!.resume();
    }
    for (const addr of this.dnsBackends) {
      for (let i = 0; ; i++) {
        const r = await run('ip', ['netns', 'exec', this.backendNs, 'dig', `@${addr}`, DNS_NAME, '+short', '+time=1', '+tries=1'], 5_000);
        if (r.stdout.trim() === DNS_ANSWER) break;
        if (i >= 50) throw new Error(`dnsmasq on ${addr} does not answer: ${r.stdout} ${r.stderr}`);
        await sleep(100);
      }
    }
  }

  /** Remembered in the run directory, so a later run can end it if this one dies first. */
  private recordPid(pid: number | undefined): void {
    if (pid !== undefined) appendFileSync(path.join(this.runDir, 'pids'), `${pid}\n`);
  }

  // ------------------------------------------------------------- agent

  /** How the agent gets its Services: the manifest directory, unless a test points it at an API server. */
  sourceArgs: string[] = ['--source', `file:${this.manifestDir}`];

  /** The agent's local API socket (lbctl status --api-socket ...). */
  get apiSocket(): string {
    return path.join(this.runDir, 'agent.sock');
  }

  /** Starts the agent on the manifest directory and waits for its first sync. */
  async startAgent(extraArgs: string[] = []): Promise<SyncReport> {
    if (this.agent?.running) throw new Error('the agent is already running');
    const proc = spawn(
      LBCTL,
      [
        'agent',
        ...this.sourceArgs,
        '--cgroup',
        this.cgroup,
        '--bpf-root',
        this.bpfRoot,
        // Any free ports, and a socket of this run's own: runs never collide with each other or a real agent.
        '--health-port',
        '0',
        '--health-bind-address',
        '127.0.0.1',
        '--metrics-port',
        '0',
        '--api-socket',
        this.apiSocket,
        ...extraArgs,
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    this.recordPid(proc.pid);
    this.agent = new AgentProcess(proc);
    this.syncMark = 0;
    return (await this.agent.waitForLog((l) => l.msg === 'sync done', 0, 30_000)) as SyncReport;
  }

  /** SIGTERM, as an operator would; the datapath stays attached. */
  async stopAgent(timeoutMs = 10_000): Promise<number | null> {
    timeoutMs *= SLOW;
    const agent = this.agent;
    if (!agent?.running) return null;
    killPid(agent.pid, 'SIGTERM');
    const timer = setTimeout(() => killPid(agent.pid, 'SIGKILL'), timeoutMs);
    const code = await agent.exited;
    clearTimeout(timer);
    return code;
  }

  private requireAgent(): AgentProcess {
    if (!this.agent) throw new Error('the agent was not started');
    return this.agent;
  }

  /** Writes a manifest atomically (temp file + rename), so the agent never reads half a file. */
  writeManifest(name: string, text: string): void {
    const tmp = path.join(this.manifestDir, `.${name}.tmp`);
    writeFileSync(tmp, text);
    this.syncMark = this.agent?.logs.length ?? 0;
    renameSync(tmp, path.join(this.manifestDir, name));
  }

  removeManifest(name: string): void {
    this.syncMark = this.agent?.logs.length ?? 0;
    unlinkSync(path.join(this.manifestDir, name));
  }

  /** The first sync that finished after the last manifest change. */
  async waitForSync(timeoutMs = 15_000): Promise<SyncReport> {
    return (await this.requireAgent().waitForLog((l) => l.msg === 'sync done', this.syncMark, timeoutMs)) as SyncReport;
  }

  /** Polls `check` until it holds (for conditions no single sync line proves). */
  async waitUntil(check: () => Promise<boolean> | boolean, what: string, timeoutMs = 15_000): Promise<void> {
    timeoutMs *= SLOW;
    const deadline = Date.now() + timeoutMs;
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`);
      await sleep(100);
    }
  }

  /** Agent log lines since the last manifest change. */
  logsSinceChange(): LogLine[] {
    return this.requireAgent().logs.slice(this.syncMark);
  }

  // ----------------------------------------------------- clients & CLI

  /**
   * Runs a client in the test cgroup and the client netns. The shell joins
   * the cgroup first: `ip netns exec` remounts /sys, hiding cgroupfs.
   */
  exec(cmd: readonly string[], opts: { timeoutMs?: number } = {}): Promise<ExecResult> {
    const script = 'cg=$1; ns=$2; shift 2; echo $$ > "$cg/cgroup.procs" && exec ip netns exec "$ns" "$@"';
    return run('sh', ['-c', script, 'sh', this.cgroup, this.clientNs, ...cmd], opts.timeoutMs ?? 30_000, this.clients);
  }

  /** client.py SUBCOMMAND ARGS… in the client's place; its JSON output, parsed. */
  async client<T = Record<string, unknown>>(args: readonly string[], timeoutMs = 60_000): Promise<T> {
    const r = await this.exec([this.python, CLIENT_PY, ...args], { timeoutMs });
    if (r.code !== 0) throw new Error(`client.py ${args.join(' ')} failed (${r.code ?? r.signal}): ${r.stderr}`);
    return JSON.parse(r.stdout) as T;
  }

  /** `lbctl ARGS… --bpf-root <ours>`, outside the cgroup. */
  lbctl(args: readonly string[]): Promise<ExecResult> {
    return run(LBCTL, [...args, '--bpf-root', this.bpfRoot], CLI_TIMEOUT_MS);
  }

  async lbList(): Promise<LbListEntry[]> {
    const r = await this.lbctl(['bpf', 'lb', 'list', '-o', 'json']);
    if (r.code !== 0) throw new Error(`lbctl bpf lb list failed ${how(r)}: ${r.stderr}`);
    return JSON.parse(r.stdout) as LbListEntry[];
  }

  async metrics(): Promise<Record<string, number>> {
    const r = await this.lbctl(['bpf', 'metrics', 'list', '-o', 'json']);
    if (r.code !== 0) throw new Error(`lbctl bpf metrics list failed ${how(r)}: ${r.stderr}`);
    return JSON.parse(r.stdout) as Record<string, number>;
  }

  /** The entries of one pinned map, as bpftool dumps them (for maps lbctl does not print, e.g. lb4_sock_revnat). */
  async mapEntries(name: string, bpfRoot = this.bpfRoot): Promise<unknown[]> {
    const r = await run(BPFTOOL, ['-j', 'map', 'dump', 'pinned', path.join(bpfRoot, 'maps', name)], CLI_TIMEOUT_MS);
    if (r.code !== 0) throw new Error(`bpftool map dump ${name} failed ${how(r)}: ${r.stderr}${r.stdout}`);
    return JSON.parse(r.stdout) as unknown[];
  }

  /** `bpftool -j ARGS…`, parsed. */
  async bpftool<T = unknown>(args: readonly string[]): Promise<T> {
    const r = await run(BPFTOOL, ['-j', ...args], CLI_TIMEOUT_MS);
    if (r.code !== 0) throw new Error(`bpftool ${args.join(' ')} failed ${how(r)}: ${r.stderr}${r.stdout}`);
    return JSON.parse(r.stdout) as T;
  }

  /** Every pinned link under the bpf root: its id and the id and tag of the program it runs. */
  async links(bpfRoot = this.bpfRoot): Promise<Record<string, PinnedLink>> {
    const dir = path.join(bpfRoot, 'links');
    const out: Record<string, PinnedLink> = {};
    for (const name of readdirSync(dir).sort()) {
      const link = await this.bpftool<{ id: number; prog_id: number }>(['link', 'show', 'pinned', path.join(dir, name)]);
      const prog = await this.bpftool<{ tag: string }>(['prog', 'show', 'id', String(link.prog_id)]);
      out[name] = { linkId: link.id, progId: link.prog_id, progTag: prog.tag };
    }
    return out;
  }

  /** max_entries of every pinned map. */
  async mapSizes(bpfRoot = this.bpfRoot): Promise<Record<string, number>> {
    const dir = path.join(bpfRoot, 'maps');
    const out: Record<string, number> = {};
    for (const name of readdirSync(dir).sort()) {
      out[name] = (await this.bpftool<{ max_entries: number }>(['map', 'show', 'pinned', path.join(dir, name)])).max_entries;
    }
    return out;
  }

  /** The port the running agent serves health or metrics on (it logs them at start). */
  agentPort(which: 'health' | 'metrics'): number {
    const line = this.requireAgent().logs.find((l) => l.msg === 'serving health, metrics and the local API');
    const port = Number(line?.[which]);
    if (!Number.isInteger(port) || port <= 0) throw new Error(`the agent logged no ${which} port`);
    return port;
  }

  /** SIGKILL (or another signal) to the agent, by pid: a crash. Resolves with how it ended. */
  async killAgent(signal: NodeJS.Signals = 'SIGKILL'): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    const agent = this.requireAgent();
    if (!agent.running) throw new Error('the agent is not running');
    killPid(agent.pid, signal);
    const timer = setTimeout(() => killPid(agent.pid, 'SIGKILL'), 10_000);
    const code = await agent.exited;
    clearTimeout(timer);
    return { code, signal: agent.exitSignal ?? null };
  }

  /**
   * A steady load from the client's place (client.py load): fresh sockets
   * at `rate` a second per target, every failure recorded, until stop().
   * Killed at teardown if the test never stops it.
   */
  startLoad(opts: LoadOptions): LoadRun {
    const id = Math.random().toString(16).slice(2, 8);
    const stopFile = path.join(this.runDir, `load-${id}.stop`);
    const progressFile = path.join(this.runDir, `load-${id}.progress`);
    // A lost packet still fails the attempt; only the wait for it scales with SLOW
    // (the emulated guest answered within 2.4 s at worst while the host was busy).
    const args = ['load', '--rate', String(opts.rate ?? 300), '--seconds', String(opts.maxSeconds ?? 90), '--stop-file', stopFile, '--progress', progressFile,
      '--timeout', String((opts.attemptTimeout ?? 3) * SLOW)];
    for (const t of opts.tcp ?? []) args.push('--tcp', t);
    for (const u of opts.udp ?? []) args.push('--udp', u);
    const done = this.exec([this.python, CLIENT_PY, ...args], { timeoutMs: ((opts.maxSeconds ?? 90) + 30 * SLOW) * 1000 });
    const progress = (): LoadProgress | undefined => {
      try {
        return JSON.parse(readFileSync(progressFile, 'utf8')) as LoadProgress;
      } catch {
        return undefined;
      }
    };
    const cleanup = (): void => {
      if (!existsSync(this.runDir)) return;
      writeFileSync(stopFile, '');
    };
    this.cleanups.add(cleanup);
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
        this.cleanups.delete(cleanup);
        if (r.code !== 0) throw new Error(`client.py load failed (${r.code ?? r.signal}): ${r.stderr}`);
        return JSON.parse(r.stdout) as LoadResult;
      },
    };
  }

  /**
   * What a fresh agent makes of the same manifests: a second agent with its
   * own bpf root and its own (empty) sibling cgroup, stopped after its first
   * sync; its `lbctl bpf lb list` and the raw entries of `maps`. Everything it
   * made is removed before this returns (and at teardown, should the test die).
   */
  async freshSync(opts: { args?: readonly string[]; maps?: readonly string[] } = {}): Promise<FreshSync> {
    const name = `${this.runId}-fresh`;
    const bpfRoot = path.join(BPFFS, name);
    const cgroup = path.join(cgroup2Mount(), name);
    let agent: AgentProcess | undefined;
    const cleanup = (): void => {
      if (agent?.running) killPid(agent.pid);
      removeBpfRoot(bpfRoot);
      removeCgroup(cgroup);
    };
    this.cleanups.add(cleanup);
    try {
      mkdirSync(cgroup);
      const proc = spawn(
        LBCTL,
        [
          'agent', '--source', `file:${this.manifestDir}`, '--cgroup', cgroup, '--bpf-root', bpfRoot,
          '--health-port', '0', '--health-bind-address', '127.0.0.1', '--metrics-port', '0',
          '--api-socket', path.join(this.runDir, 'fresh.sock'), ...(opts.args ?? []),
        ],
        { stdio: ['ignore', 'pipe', 'pipe'] },
      );
      this.recordPid(proc.pid);
      agent = new AgentProcess(proc);
      const sync = (await agent.waitForLog((l) => l.msg === 'sync done', 0, 30_000)) as SyncReport;
      const r = await run(LBCTL, ['bpf', 'lb', 'list', '-o', 'json', '--bpf-root', bpfRoot], CLI_TIMEOUT_MS);
      if (r.code !== 0) throw new Error(`lbctl bpf lb list (fresh) failed ${how(r)}: ${r.stderr}`);
      const maps: Record<string, unknown[]> = {};
      for (const m of opts.maps ?? []) maps[m] = await this.mapEntries(m, bpfRoot);
      killPid(agent.pid, 'SIGTERM');
      const timer = setTimeout(() => killPid(agent?.pid, 'SIGKILL'), 10_000);
      await agent.exited;
      clearTimeout(timer);
      return { sync, list: JSON.parse(r.stdout) as LbListEntry[], maps };
    } finally {
      this.cleanups.delete(cleanup);
      cleanup();
    }
  }

  // ---------------------------------------------------------- teardown

  /** Removes everything this sandbox made; synchronous so an exit handler can run it. Idempotent. */
  teardown(): void {
    if (this.tornDown) return;
    this.tornDown = true;
    live.delete(this);
    const errors: string[] = [];
    const step = (what: string, fn: () => void): void => {
      try {
        fn();
      } catch (err) {
        errors.push(`${what}: ${(err as Error).message}`);
      }
    };
    for (const fn of this.cleanups) step('extra cleanup', fn);
    this.cleanups.clear();
    step('kill clients', () => this.clients.forEach((pid) => killPid(pid)));
    step('kill agent', () => {
      if (this.agent?.running) killPid(this.agent.pid);
    });
    step('lbctl cleanup', () => removeBpfRoot(this.bpfRoot));
    step('kill servers', () => this.servers.forEach((p) => killPid(p.pid)));
    step('remove netns', () => [this.clientNs, this.backendNs].forEach(removeNetns));
    step('remove cgroup', () => removeCgroup(this.cgroup));
    step('remove run dir', () => rmSync(this.runDir, { recursive: true, force: true }));
    if (errors.length > 0) throw new Error(`sandbox ${this.runId} teardown: ${errors.join('; ')}`);
  }
}

/** How a command ended, for error messages: a deadline kill shows as a signal after the timeout. */
export function how(r: ExecResult): string {
  return `(${r.code !== null ? `exit ${r.code}` : `killed by ${r.signal}`} after ${Math.round(r.ms)} ms)`;
}

/** Runs a command with a deadline (SIGKILL by pid when it passes). */
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
    // SIGTERM first, so a script's cleanup trap runs; SIGKILL 10 s later.
    let hard: NodeJS.Timeout | undefined;
    const timer = setTimeout(() => {
      killPid(pid, 'SIGTERM');
      hard = setTimeout(() => killPid(pid), 10_000);
    }, timeoutMs);
    // A grandchild that outlives the process can hold its pipes open: once
    // the process itself has exited, stop waiting for them after 5 s.
    proc.on('exit', () => setTimeout(() => (proc.stdout.destroy(), proc.stderr.destroy()), 5_000).unref());
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

/** Builds a sandbox, registers its teardown on `t`, and returns it ready to use. */
export async function createSandbox(t: TeardownHost, opts: SandboxOptions = {}): Promise<Sandbox> {
  sweepLeftovers();
  const sb = new Sandbox(opts);
  t.teardown(() => sb.teardown());
  try {
    await sb.start();
  } catch (err) {
    sb.teardown();
    throw err;
  }
  return sb;
}
