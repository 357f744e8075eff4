// A throwaway world for lbctl's end-to-end tests, built only from things this
// run creates and removes again (names and addresses: topology.ts):
//
//   child cgroup  <cgroup2>/lbctl-test-<run>      the agent attaches here; only test clients join it
//   bpf root      /sys/fs/bpf/lbctl-test-<run>     pinned maps and links
//   client netns  lbctl-test-<run>-c              no default route
//   backend netns lbctl-test-<run>-b              backend.py and dnsmasq
//   manifests     /tmp/lbctl-test-<run>/manifests  watched by the agent
//
// Service addresses (10.96.0.0/16, fd00:96::/64, 10.97.0.0/16) are routed
// nowhere, so a packet that escaped translation dies in the client netns.
// Teardown is synchronous, so the same code runs from t.teardown and from a
// process exit handler; a sweep at start removes what crashed runs left.
//
// The Sandbox composes four concerns, each in its own module:
//   topology.ts  netns, veth, cgroup, bpf root, the backend servers, removal, the sweep
//   agent.ts     an AgentSlot (cgroup + bpf root + API socket + source) and its AgentProcess, readers
//   load.ts      the load client, run through any `exec`
//   run.ts       commands with deadlines, clients in cgroup+netns, servers by pid, SLOW
//
// Growing it by composition (the NodePort tests):
//   - A second node: its own netns (`${runId}-n2`, made with ip() and a veth
//     to the backend netns as makeNetworks does), its own cgroup and bpf
//     root (`${runId}-n2` under cgroup2Mount() and BPFFS), and an AgentSlot
//     over them whose spawn runs inside that netns (`ip netns exec`). Add its
//     removal to teardown next to the first node's: slot.killNow(),
//     removeBpfRoot(), removeNetns(), removeCgroup(), in that order.
//   - An external client: a netns (`${runId}-x`) outside every test cgroup,
//     run into with `run('ip', ['netns', 'exec', ns, ...cmd], ms, this.clients)`
//     so teardown kills it by pid; startLoad() takes a LoadHost whose exec
//     does that.
// Every new name must start with runId, so sweepLeftovers() finds it after a
// crash, and every process must be started through run()/Servers/AgentSlot,
// so it is recorded and ended by its pid.
import type { ChildProcess } from 'node:child_process';
import { mkdirSync, renameSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { onExit } from 'signal-exit';
import {
  AgentSlot, bpftool, datapathMetrics, lbctl, lbList, mapEntries, mapSizes, pinnedLinks,
  type AgentProcess, type LbListEntry, type LogLine, type PinnedLink, type SyncReport,
} from './agent.js';
import { startLoad, type LoadOptions, type LoadRun } from './load.js';
import { CLIENT_PY, how, killPid, python, run, runInCgroupNetns, Servers, SLOW, waitUntil, type ExecResult } from './run.js';
import {
  backendAddrs, BPFFS, cgroup2Mount, dnsAddrs, ensureBpffs, makeNetworks, PREFIX, removeBpfRoot, removeCgroup, removeNetns,
  startBackendServers, startDnsServers, sweepLeftovers, type BackendAddrs,
} from './topology.js';

export interface SandboxOptions {
  /** HTTP (TCP 8080) + UDP echo (9000) backends, each on its own v4 and v6 address. Default 3. */
  readonly backends?: number;
  /** dnsmasq backends on 10.244.2.j:53 (UDP and TCP). Default 0. */
  readonly dns?: number;
  /** Files written to the manifest directory before the agent starts. */
  readonly manifests?: Readonly<Record<string, string>>;
  /** Start the agent (and wait for its first sync). Default true. */
  readonly agent?: boolean;
  /**
   * Run the agent in the client netns (through nsenter: bpffs and cgroup2
   * stay visible) rather than the machine's: for what the agent itself
   * connects to, such as readiness probes, which must reach the backends
   * without a route in the machine's namespace. Its health and metrics
   * ports are then in that netns (see scrapeMetrics).
   */
  readonly agentInClientNetns?: boolean;
}

export interface FreshSync {
  readonly sync: SyncReport;
  readonly list: LbListEntry[];
  readonly maps: Record<string, unknown[]>;
}

interface TeardownHost {
  teardown(fn: () => unknown): void;
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
  /** The node's agent: this run's cgroup, bpf root and API socket. */
  readonly node: AgentSlot;

  private readonly servers = new Servers(this.runDir);
  private readonly clients = new Set<number>();
  private syncMark = 0;
  private tornDown = false;
  /** Extra things a test made (a second datapath, a load client), undone first at teardown. */
  private readonly cleanups = new Set<() => void>();

  constructor(readonly opts: SandboxOptions = {}) {
    this.backends = backendAddrs(opts.backends ?? 3);
    this.dnsBackends = dnsAddrs(opts.dns ?? 0);
    this.python = python();
    this.node = new AgentSlot({
      runDir: this.runDir,
      cgroup: this.cgroup,
      bpfRoot: this.bpfRoot,
      apiSocket: path.join(this.runDir, 'agent.sock'),
      sourceArgs: ['--source', `file:${this.manifestDir}`],
      ...(opts.agentInClientNetns ? { netns: this.clientNs } : {}),
    });
  }

  /** The agent's /metrics text, fetched from wherever it runs (the client netns, with agentInClientNetns). */
  async scrapeMetrics(): Promise<string> {
    const url = `http://127.0.0.1:${this.agentPort('metrics')}/metrics`;
    if (!this.opts.agentInClientNetns) return (await fetch(url)).text();
    const r = await run('ip', ['netns', 'exec', this.clientNs, 'curl', '-sS', '--max-time', String(5 * SLOW), url], 10_000 * SLOW);
    if (r.code !== 0) throw new Error(`curl ${url} in ${this.clientNs} failed ${how(r)}: ${r.stderr}`);
    return r.stdout;
  }

  // ------------------------------------------------------------- build

  async start(): Promise<void> {
    live.add(this);
    installExitHook();
    mkdirSync(this.manifestDir, { recursive: true });
    ensureBpffs();
    mkdirSync(this.cgroup);
    makeNetworks(this.clientNs, this.backendNs, this.backends, this.dnsBackends);
    await startBackendServers(this.servers, this.backendNs, this.python, this.runId, this.backends);
    await startDnsServers(this.servers, this.backendNs, this.runDir, this.dnsBackends);
    for (const [name, text] of Object.entries(this.opts.manifests ?? {})) this.writeManifest(name, text);
    if (this.opts.agent ?? true) await this.startAgent();
  }

  // ------------------------------------------------------------- agent

  /** The node's agent process, once started (the last one, after a restart). */
  get agent(): AgentProcess | undefined {
    return this.node.agent;
  }

  /** How the agent gets its Services: the manifest directory, unless a test points it at an API server. */
  get sourceArgs(): string[] {
    return this.node.place.sourceArgs;
  }

  set sourceArgs(args: string[]) {
    this.node.place.sourceArgs = args;
  }

  /** The agent's local API socket (lbctl status --api-socket ...). */
  get apiSocket(): string {
    return this.node.place.apiSocket;
  }

  /** Starts the agent on the manifest directory and waits for its first sync. */
  async startAgent(extraArgs: string[] = []): Promise<SyncReport> {
    if (this.agent?.running) throw new Error('the agent is already running');
    const first = this.node.start(extraArgs);
    this.syncMark = 0;
    return first;
  }

  /** Starts the agent without waiting for a sync (an API server that is away, a port already taken). */
  spawnAgent(extraArgs: readonly string[] = []): AgentProcess {
    const agent = this.node.spawn(extraArgs);
    this.syncMark = 0;
    return agent;
  }

  /** SIGTERM, as an operator would; the datapath stays attached. */
  stopAgent(timeoutMs = 10_000): Promise<number | null> {
    return this.node.stop(timeoutMs);
  }

  /** SIGKILL (or another signal) to the agent, by pid: a crash. Resolves with how it ended. */
  killAgent(signal: NodeJS.Signals = 'SIGKILL'): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    return this.node.kill(signal);
  }

  /** The port the running agent serves health or metrics on (it logs them at start). */
  agentPort(which: 'health' | 'metrics'): number {
    return this.node.port(which);
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
    return (await this.node.requireAgent().waitForLog((l) => l.msg === 'sync done', this.syncMark, timeoutMs)) as SyncReport;
  }

  /** Polls `check` until it holds (for conditions no single sync line proves). */
  waitUntil(check: () => Promise<boolean> | boolean, what: string, timeoutMs = 15_000): Promise<void> {
    return waitUntil(check, what, timeoutMs);
  }

  /** Agent log lines since the last manifest change. */
  logsSinceChange(): LogLine[] {
    return this.node.requireAgent().logs.slice(this.syncMark);
  }

  // ----------------------------------------------------- clients & CLI

  /**
   * Runs a client in the test cgroup and the client netns. The shell joins
   * the cgroup first: `ip netns exec` remounts /sys, hiding cgroupfs. The
   * deadline (default 30 s) scales with SLOW, as every wait here does.
   */
  exec(cmd: readonly string[], opts: { timeoutMs?: number } = {}): Promise<ExecResult> {
    return runInCgroupNetns(this.cgroup, this.clientNs, cmd, (opts.timeoutMs ?? 30_000) * SLOW, this.clients);
  }

  /** client.py SUBCOMMAND ARGS… in the client's place; its JSON output, parsed. The deadline scales with SLOW. */
  async client<T = Record<string, unknown>>(args: readonly string[], timeoutMs = 60_000): Promise<T> {
    const r = await this.exec([this.python, CLIENT_PY, ...args], { timeoutMs });
    if (r.code !== 0) throw new Error(`client.py ${args.join(' ')} failed (${r.code ?? r.signal}): ${r.stderr}`);
    return JSON.parse(r.stdout) as T;
  }

  /** `lbctl ARGS… --bpf-root <ours>`, outside the cgroup. */
  lbctl(args: readonly string[]): Promise<ExecResult> {
    return lbctl(this.bpfRoot, args);
  }

  lbList(): Promise<LbListEntry[]> {
    return lbList(this.bpfRoot);
  }

  metrics(): Promise<Record<string, number>> {
    return datapathMetrics(this.bpfRoot);
  }

  /** The entries of one pinned map, as bpftool dumps them (for maps lbctl does not print, e.g. lb4_sock_revnat). */
  mapEntries(name: string, bpfRoot = this.bpfRoot): Promise<unknown[]> {
    return mapEntries(bpfRoot, name);
  }

  /** `bpftool -j ARGS…`, parsed. */
  bpftool<T = unknown>(args: readonly string[]): Promise<T> {
    return bpftool<T>(args);
  }

  /** Every pinned link under the bpf root: its id and the id and tag of the program it runs. */
  links(bpfRoot = this.bpfRoot): Promise<Record<string, PinnedLink>> {
    return pinnedLinks(bpfRoot);
  }

  /** max_entries of every pinned map. */
  mapSizes(bpfRoot = this.bpfRoot): Promise<Record<string, number>> {
    return mapSizes(bpfRoot);
  }

  /**
   * A steady load from the client's place (client.py load): fresh sockets
   * at `rate` a second per target, every failure recorded, until stop().
   * Killed at teardown if the test never stops it.
   */
  startLoad(opts: LoadOptions): LoadRun {
    // The load sets its own deadline (its run time plus a scaled grace), so its exec does not scale it again.
    const exec = (cmd: readonly string[], o: { timeoutMs?: number }): Promise<ExecResult> =>
      runInCgroupNetns(this.cgroup, this.clientNs, cmd, o.timeoutMs ?? 30_000 * SLOW, this.clients);
    return startLoad({ runDir: this.runDir, python: this.python, exec, cleanups: this.cleanups }, opts);
  }

  /**
   * What a fresh agent makes of the same manifests: a second agent with its
   * own bpf root and its own (empty) sibling cgroup, stopped after its first
   * sync; its `lbctl bpf lb list` and the raw entries of `maps`. Everything it
   * made is removed before this returns (and at teardown, should the test die).
   */
  async freshSync(opts: { args?: readonly string[]; maps?: readonly string[] } = {}): Promise<FreshSync> {
    const { slot: fresh, cleanup } = this.extraAgent('fresh');
    try {
      const sync = await fresh.start(opts.args);
      const r = await lbctl(fresh.bpfRoot, ['bpf', 'lb', 'list', '-o', 'json']);
      if (r.code !== 0) throw new Error(`lbctl bpf lb list (fresh) failed ${how(r)}: ${r.stderr}`);
      const maps: Record<string, unknown[]> = {};
      for (const m of opts.maps ?? []) maps[m] = await mapEntries(fresh.bpfRoot, m);
      await fresh.stop();
      return { sync, list: JSON.parse(r.stdout) as LbListEntry[], maps };
    } finally {
      this.cleanups.delete(cleanup);
      cleanup();
    }
  }

  /**
   * Another agent of this run, on the same manifests: its own sibling
   * cgroup (made here) and bpf root, in `netns` if given. `cleanup` kills it
   * and removes both; it runs at teardown too, unless the caller ran it and
   * took it off with cleanups.delete (freshSync does).
   */
  extraAgent(suffix: string, netns?: string): { slot: AgentSlot; cleanup: () => void } {
    const name = `${this.runId}-${suffix}`;
    const slot = new AgentSlot({
      runDir: this.runDir,
      cgroup: path.join(cgroup2Mount(), name),
      bpfRoot: path.join(BPFFS, name),
      apiSocket: path.join(this.runDir, `${suffix}.sock`),
      sourceArgs: ['--source', `file:${this.manifestDir}`],
      ...(netns ? { netns } : {}),
    });
    const cleanup = (): void => {
      slot.killNow();
      removeBpfRoot(slot.place.bpfRoot);
      removeCgroup(slot.place.cgroup);
    };
    this.cleanups.add(cleanup);
    mkdirSync(slot.place.cgroup);
    return { slot, cleanup };
  }

  /** Backend servers (backend.py) in another namespace of this run; killed at teardown. */
  startBackendsIn(netns: string, backends: readonly BackendAddrs[], extra: readonly string[] = []): Promise<void> {
    return startBackendServers(this.servers, netns, this.python, this.runId, backends, extra);
  }

  /**
   * Any server command in one of this run's namespaces (the backend netns,
   * usually), recorded and killed by its pid at teardown; resolves once it
   * prints its first line on stdout (its "ready"), with the process (to
   * end it earlier, by its pid).
   */
  async startServerIn(netns: string, cmd: readonly string[], readyTimeoutMs = 10_000): Promise<ChildProcess> {
    const proc = this.servers.spawn(netns, cmd);
    let stderr = '';
    proc.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${cmd.join(' ')}: not ready in ${(readyTimeoutMs * SLOW) / 1000} s: ${stderr}`)), readyTimeoutMs * SLOW);
      proc.stdout!.once('data', () => {
        clearTimeout(timer);
        proc.stdout!.resume();
        resolve();
      });
      proc.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`${cmd.join(' ')} exited (${code}): ${stderr}`));
      });
    });
    return proc;
  }

  /** Something a test made beyond the sandbox (namespaces, agents): undone first at teardown, even when the test fails. */
  addCleanup(fn: () => void): void {
    this.cleanups.add(fn);
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
    step('kill agent', () => this.node.killNow());
    step('lbctl cleanup', () => removeBpfRoot(this.bpfRoot));
    step('kill servers', () => this.servers.killAll());
    step('remove netns', () => [this.clientNs, this.backendNs].forEach(removeNetns));
    step('remove cgroup', () => removeCgroup(this.cgroup));
    step('remove run dir', () => rmSync(this.runDir, { recursive: true, force: true }));
    if (errors.length > 0) throw new Error(`sandbox ${this.runId} teardown: ${errors.join('; ')}`);
  }
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
