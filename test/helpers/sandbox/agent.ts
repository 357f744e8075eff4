// One agent and everything that reads it: the process with its log lines
// parsed as they come, its place (cgroup, bpf root, API socket, source), and
// the readers of what it made (lbctl, bpftool, pinned maps and links, the
// ports it serves health and metrics on). An AgentSlot knows nothing of the
// namespaces around it, so a sandbox can hold several: the node's own, the
// throwaway one of freshSync(), a second node's.
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { BPFTOOL, CLI_TIMEOUT_MS, how, killPid, LBCTL, recordPid, run, SLOW, type ExecResult } from './run.js';

/** One pino line of the agent, parsed. */
export type LogLine = Record<string, unknown> & { msg?: string };

export interface SyncReport extends LogLine {
  planned: number;
  applied: number;
  frontends: number;
}

export interface LbListEntry {
  frontend: string;
  revNatId: number;
  type: string;
  backends: Array<{ address: string; id: number; slot: number; state: string }>;
}

export interface PinnedLink {
  readonly linkId: number;
  readonly progId: number;
  /** bpftool's tag: a hash of the program's instructions. */
  readonly progTag: string;
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

  /** The first log line at index >= `from` that matches; the deadline scales with SLOW. */
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

/** `bpftool -j ARGS…`, parsed. */
export async function bpftool<T = unknown>(args: readonly string[]): Promise<T> {
  const r = await run(BPFTOOL, ['-j', ...args], CLI_TIMEOUT_MS);
  if (r.code !== 0) throw new Error(`bpftool ${args.join(' ')} failed ${how(r)}: ${r.stderr}${r.stdout}`);
  return JSON.parse(r.stdout) as T;
}

/** The entries of one pinned map, as bpftool dumps them (for maps lbctl does not print, e.g. lb4_sock_revnat). */
export async function mapEntries(bpfRoot: string, name: string): Promise<unknown[]> {
  const r = await run(BPFTOOL, ['-j', 'map', 'dump', 'pinned', path.join(bpfRoot, 'maps', name)], CLI_TIMEOUT_MS);
  if (r.code !== 0) throw new Error(`bpftool map dump ${name} failed ${how(r)}: ${r.stderr}${r.stdout}`);
  return JSON.parse(r.stdout) as unknown[];
}

/** Every pinned link under the bpf root: its id and the id and tag of the program it runs. */
export async function pinnedLinks(bpfRoot: string): Promise<Record<string, PinnedLink>> {
  const dir = path.join(bpfRoot, 'links');
  const out: Record<string, PinnedLink> = {};
  for (const name of readdirSync(dir).sort()) {
    const link = await bpftool<{ id: number; prog_id: number }>(['link', 'show', 'pinned', path.join(dir, name)]);
    const prog = await bpftool<{ tag: string }>(['prog', 'show', 'id', String(link.prog_id)]);
    out[name] = { linkId: link.id, progId: link.prog_id, progTag: prog.tag };
  }
  return out;
}

/** max_entries of every pinned map. */
export async function mapSizes(bpfRoot: string): Promise<Record<string, number>> {
  const dir = path.join(bpfRoot, 'maps');
  const out: Record<string, number> = {};
  for (const name of readdirSync(dir).sort()) {
    out[name] = (await bpftool<{ max_entries: number }>(['map', 'show', 'pinned', path.join(dir, name)])).max_entries;
  }
  return out;
}

/** `lbctl ARGS… --bpf-root ROOT`, outside any cgroup. */
export function lbctl(bpfRoot: string, args: readonly string[]): Promise<ExecResult> {
  return run(LBCTL, [...args, '--bpf-root', bpfRoot], CLI_TIMEOUT_MS);
}

export async function lbList(bpfRoot: string): Promise<LbListEntry[]> {
  const r = await lbctl(bpfRoot, ['bpf', 'lb', 'list', '-o', 'json']);
  if (r.code !== 0) throw new Error(`lbctl bpf lb list failed ${how(r)}: ${r.stderr}`);
  return JSON.parse(r.stdout) as LbListEntry[];
}

export async function datapathMetrics(bpfRoot: string): Promise<Record<string, number>> {
  const r = await lbctl(bpfRoot, ['bpf', 'metrics', 'list', '-o', 'json']);
  if (r.code !== 0) throw new Error(`lbctl bpf metrics list failed ${how(r)}: ${r.stderr}`);
  return JSON.parse(r.stdout) as Record<string, number>;
}

export interface AgentPlace {
  /** Where the pids of the processes started are recorded (the sweep ends them should the run die). */
  readonly runDir: string;
  /** The cgroup the agent attaches to. */
  readonly cgroup: string;
  /** Its own bpffs directory: pinned maps and links. */
  readonly bpfRoot: string;
  /** Its local API socket (lbctl status --api-socket …). */
  readonly apiSocket: string;
  /** How it gets its Services (`--source file:DIR`, or `--kubeconfig …`). */
  sourceArgs: string[];
  /** A network namespace (/run/netns/NAME) to run in, through nsenter (which keeps bpffs and cgroup2 visible): a "node". */
  readonly netns?: string;
  /**
   * A command the agent's command line is handed to (`unshare … sh -c '…;
   * exec "$@"' …`: a pod's mount namespace and environment). It must exec
   * the agent, so that the pid started is the agent's.
   */
  wrap?: readonly string[];
}

export interface SpawnOptions {
  /** Added to the agent's environment (a failpoint such as LBCTL_FAILPOINT_TC_ATTACH). */
  readonly env?: Readonly<Record<string, string>>;
}

/**
 * The place of one agent and the agent running there (at most one at a
 * time). It starts, stops and kills the process by its pid, and reads what
 * it made under its own bpf root. Removing the bpf root and the cgroup is
 * the owner's job (see Sandbox.teardown).
 */
export class AgentSlot {
  agent: AgentProcess | undefined;

  constructor(readonly place: AgentPlace) {}

  get bpfRoot(): string {
    return this.place.bpfRoot;
  }

  /** Spawns the agent and waits for its first sync. */
  async start(extraArgs: readonly string[] = [], opts: SpawnOptions = {}): Promise<SyncReport> {
    const agent = this.spawn(extraArgs, opts);
    return (await agent.waitForLog((l) => l.msg === 'sync done', 0, 30_000)) as SyncReport;
  }

  /**
   * Spawns the agent and returns at once: for a start that is not expected
   * to sync (an API server that is away, a port already taken). Flags in
   * `extraArgs` override the slot's own (the last occurrence wins).
   */
  spawn(extraArgs: readonly string[] = [], opts: SpawnOptions = {}): AgentProcess {
    if (this.agent?.running) throw new Error('the agent is already running');
    const { cgroup, bpfRoot, apiSocket, sourceArgs, runDir, netns, wrap = [] } = this.place;
    // nsenter execs lbctl in the node's namespace, as `wrap` must: the pid stays the agent's.
    const command = [...wrap, ...(netns ? ['nsenter', `--net=/run/netns/${netns}`] : []), LBCTL];
    const proc = spawn(
      command[0]!,
      [
        ...command.slice(1),
        'agent',
        ...sourceArgs,
        '--cgroup',
        cgroup,
        '--bpf-root',
        bpfRoot,
        // Any free ports, and a socket of this run's own: runs never collide with each other or a real agent.
        '--health-port',
        '0',
        '--health-bind-address',
        '127.0.0.1',
        '--metrics-port',
        '0',
        '--api-socket',
        apiSocket,
        // An agent in the machine's own network namespace: never on its devices.
        ...(netns || extraArgs.some((a) => a.startsWith('--devices')) ? [] : ['--no-nodeport']),
        // The health mesh listens on a fixed port: only in a node's own namespace, unless asked for.
        ...(netns || extraArgs.some((a) => a.startsWith('--health-mesh-port')) ? [] : ['--health-mesh-port', '0']),
        ...extraArgs,
      ],
      { stdio: ['ignore', 'pipe', 'pipe'], ...(opts.env ? { env: { ...process.env, ...opts.env } } : {}) },
    );
    recordPid(runDir, proc.pid);
    this.agent = new AgentProcess(proc);
    return this.agent;
  }

  requireAgent(): AgentProcess {
    if (!this.agent) throw new Error('the agent was not started');
    return this.agent;
  }

  /** SIGTERM, as an operator would (SIGKILL after `timeoutMs`, scaled); the datapath stays attached. */
  async stop(timeoutMs = 10_000): Promise<number | null> {
    timeoutMs *= SLOW;
    const agent = this.agent;
    if (!agent?.running) return null;
    killPid(agent.pid, 'SIGTERM');
    const timer = setTimeout(() => killPid(agent.pid, 'SIGKILL'), timeoutMs);
    const code = await agent.exited;
    clearTimeout(timer);
    return code;
  }

  /** SIGKILL (or another signal) by pid: a crash (SIGKILL 10 s, scaled, after another signal). Resolves with how it ended. */
  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    const agent = this.requireAgent();
    if (!agent.running) throw new Error('the agent is not running');
    killPid(agent.pid, signal);
    const timer = setTimeout(() => killPid(agent.pid, 'SIGKILL'), 10_000 * SLOW);
    const code = await agent.exited;
    clearTimeout(timer);
    return { code, signal: agent.exitSignal ?? null };
  }

  /** For teardown: SIGKILL by pid if it still runs. Synchronous. */
  killNow(): void {
    if (this.agent?.running) killPid(this.agent.pid);
  }

  /** The port the running agent serves health or metrics on (it logs them at start). */
  port(which: 'health' | 'metrics'): number {
    const line = this.requireAgent().logs.find((l) => l.msg === 'serving health, metrics and the local API');
    const port = Number(line?.[which]);
    if (!Number.isInteger(port) || port <= 0) throw new Error(`the agent logged no ${which} port`);
    return port;
  }
}
