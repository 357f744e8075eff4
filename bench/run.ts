// make bench / make bench-quick: lbctl against kube-proxy's iptables
// (legacy and nft backends) and nftables modes, and against the floor (a
// direct connection to a pod address with no rules at all), in one run.
//
//   node --import=@tapjs/typescript/import bench/run.ts [--quick] [--out DIR] [--sizes 1,100,...]
//        [--reps 3] [--modes floor,lbctl,iptables-legacy,iptables-nft,nftables]
//
// For every N, every repetition and every mode, a fresh world (client and
// backend network namespaces, see world.ts) is made, the N services are
// programmed from cold (timed), the connection cost is measured through the
// first and the last service (connect+close, and connect+64-byte
// request/reply+close, by bench/connect.c, pinned to one CPU with the
// server), one service is added on top (timed), and for lbctl the latency
// from an EndpointSlice change in the API server to the kernel map, the
// socket path against its floor (bench/sock-floor.ts: lbctl, a minimal
// socket LB over the same maps and a direct connect, interleaved), and the
// agent's memory. Results: results.json, results.md, and plots (SVG, PNG).
import { execFileSync, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { Command } from 'commander';
import { iptablesRestoreAdd, iptablesRestoreFull, nftablesAdd, nftablesFull, type BenchService } from './kube-proxy.js';
import { BenchAgent, MasterProbe, deleteServices, masterKey, putServices, sliceName, sliceObject, startCluster } from './lbctl.js';
import { report, type ConnStats, type Results } from './report.js';
import { revnatProfile } from './revnat.js';
import { buildSockFloor, sockFloor, SOCK_FLOOR_DEFAULTS, SOCK_FLOOR_QUICK } from './sock-floor.js';
import { makeServices } from './services.js';
import { BenchRun, CLUSTER_CIDR, POD_IPS, POD_PORT, ROOT, type MemoryCgroup, type World } from './world.js';
import { parseAllDocuments } from 'yaml';
import { AGENT_TOKEN, type FakeApiServer } from '../test/helpers/fake-apiserver.js';
import { mapsDir } from '../src/datapath/loader.js';
import { enableRunTimeStats } from '../src/native/bpf.js';

export const MODES = ['floor', 'lbctl', 'iptables-legacy', 'iptables-nft', 'nftables'] as const;
export type Mode = (typeof MODES)[number];

/** The CPU the client and the server share, and the one the agent gets. */
const BENCH_CPU = 1;
const AGENT_CPU = 0;

interface Plan {
  readonly quick: boolean;
  readonly sizes: readonly number[];
  readonly reps: number;
  readonly modes: readonly Mode[];
  /** Timed connect+close iterations per point (after 1,000 warm-up ones). */
  readonly ccCount: number;
  /** Timed connect+request/reply+close iterations per point. */
  readonly rrCount: number;
  /** EndpointSlice changes timed from the API server to the kernel map, per lbctl point. */
  readonly events: number;
  /** kube-proxy's iptables mode is measured up to this N (beyond, one load takes minutes). */
  readonly iptablesMax: number;
  /** kube-proxy's nftables mode likewise (its load time grows quadratically: 26 s at 10,000 here). */
  readonly nftablesMax: number;
  readonly out: string;
  readonly profileOnly: boolean;
  /** The agent's memory limit (a cgroup's), bytes; 0: none. Default: the DaemonSet's limits.memory. */
  readonly memoryLimit: number;
  /** lbctl: periodic full resyncs timed per point up to this N (an agent of its own with a short sync period). */
  readonly resyncMax: number;
  /** lbctl: the datapath and rev-NAT profiles after the points (run-time stats, BPF_ENABLE_STATS). */
  readonly profiles: boolean;
}

function parse(): Plan {
  const o = new Command()
    .option('--quick', 'a minute or so: fewer sizes and iterations')
    .option('--out <dir>', 'where results go', path.join(ROOT, 'bench/results'))
    .option('--sizes <list>', 'numbers of services, comma-separated')
    .option('--reps <n>', 'repetitions of every point (medians are reported)')
    .option('--modes <list>', `comma-separated subset of ${MODES.join(',')}`)
    .option('--iptables-max <n>', 'largest N for the iptables modes')
    .option('--nftables-max <n>', 'largest N for the nftables mode')
    .option('--profile-only', 'add the datapath profile to the results already in --out, and rewrite the report')
    .option('--memory-limit <bytes>', "the agent's memory limit in bytes, set as a cgroup's (0: none; default: deploy/base's DaemonSet limits.memory)")
    .option('--resync-max <n>', 'largest N at which periodic resyncs are timed')
    .option('--no-profiles', 'leave out the datapath and rev-NAT profiles (they turn the run-time stats of every BPF program on for a while, BPF_ENABLE_STATS)')
    .parse()
    .opts<{ quick?: boolean; out: string; sizes?: string; reps?: string; modes?: string; iptablesMax?: string; nftablesMax?: string; profileOnly?: boolean; memoryLimit?: string; resyncMax?: string; profiles: boolean }>();
  const quick = Boolean(o.quick);
  const list = (s: string): number[] => s.split(',').map((x) => Number(x.replace(/_/g, '')));
  const modes = (o.modes?.split(',') ?? [...MODES]) as Mode[];
  for (const m of modes) if (!MODES.includes(m)) throw new Error(`--modes: unknown mode ${m}`);
  if (!modes.includes('floor')) modes.unshift('floor'); // every ratio needs the floor of the same run
  return {
    quick,
    sizes: o.sizes ? list(o.sizes) : quick ? [1, 1000] : [1, 100, 1000, 10_000, 100_000],
    reps: Number(o.reps ?? 3),
    modes,
    ccCount: quick ? 5000 : 20_000,
    rrCount: quick ? 2000 : 10_000,
    events: quick ? 20 : 300,
    iptablesMax: Number(o.iptablesMax ?? 10_000),
    nftablesMax: Number(o.nftablesMax ?? 10_000),
    out: o.out,
    profileOnly: Boolean(o.profileOnly),
    memoryLimit: o.memoryLimit !== undefined ? Number(o.memoryLimit) : daemonSetMemoryLimit(),
    resyncMax: Number(o.resyncMax ?? 10_000),
    profiles: o.profiles,
  };
}

/** Kubernetes' binary and decimal quantity suffixes, as bytes. */
const QUANTITY: Record<string, number> = { '': 1, k: 1e3, M: 1e6, G: 1e9, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30 };

/**
 * The memory limit the shipped DaemonSet gives the agent's container
 * (deploy/base/daemonset.yaml): the bench runs the agent under it, so the
 * manifest's number is what the benchmark proves enough.
 */
export function daemonSetMemoryLimit(): number {
  const file = path.join(ROOT, 'deploy/base/daemonset.yaml');
  for (const doc of parseAllDocuments(readFileSync(file, 'utf8'))) {
    const ds = doc.toJS() as { kind?: string; spec?: { template?: { spec?: { containers?: Array<{ name: string; resources?: { limits?: { memory?: string } } }> } } } };
    if (ds?.kind !== 'DaemonSet') continue;
    const q = ds.spec?.template?.spec?.containers?.find((c) => c.name === 'lbctl-agent')?.resources?.limits?.memory;
    const m = q ? /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|k|M|G)?$/.exec(q) : null;
    if (!m) throw new Error(`${file}: the lbctl-agent container's resources.limits.memory ${JSON.stringify(q)} is not a quantity the bench reads`);
    return Math.round(Number(m[1]) * QUANTITY[m[2] ?? '']!);
  }
  throw new Error(`${file}: no DaemonSet`);
}


const CONNECT = path.join(ROOT, 'build/bench/connect');
const SERVER = path.join(ROOT, 'build/bench/server');

function compile(): void {
  mkdirSync(path.dirname(CONNECT), { recursive: true });
  for (const [src, out] of [['connect.c', CONNECT], ['server.c', SERVER]] as const) {
    execFileSync('cc', ['-O2', '-Wall', '-Wextra', '-o', out, path.join(ROOT, 'bench', src)], { stdio: 'inherit' });
  }
}

/** Runs the C client in the world's client netns on the bench CPU (inside the cgroup, where lbctl is attached). */
function connect(run: BenchRun, w: World, addr: string, port: number, kind: 'cc' | 'rr', count: number): ConnStats {
  const args = ['netns', 'exec', w.client, 'taskset', '-c', String(BENCH_CPU), CONNECT, '-a', addr, '-p', String(port), '-n', String(count), '-m', kind];
  const r = spawnSync('sh', ['-c', `echo $$ > "$0/cgroup.procs" && exec ip "$@"`, run.cgroup, ...args], { encoding: 'utf8', timeout: 600_000 });
  let out: (ConnStats & { error?: string }) | undefined;
  try {
    out = JSON.parse(r.stdout.trim().split('\n').pop() ?? '') as ConnStats & { error?: string };
  } catch {
    /* reported below */
  }
  if (r.status !== 0 || !out || out.error) {
    throw new Error(`connect ${addr}:${port} (${kind}) in ${w.client} failed (exit ${r.status}): ${out?.error ?? r.stderr.trim() ?? r.stdout.trim()}`);
  }
  return out;
}

function timed(fn: () => void): number {
  const t0 = performance.now();
  fn();
  return performance.now() - t0;
}

interface Programmed {
  coldMs: number;
  /** lbctl: from the agent's start to its first sync written (process start, BPF load, list, sync). */
  startToSyncedMs?: number;
  /** lbctl: the cold sync's phases as the agent reports them. */
  coldPhasesMs?: Record<string, number>;
  /** lbctl: from the first list (or watch-list) request the API server received to the cold sync logged. */
  coldFromListMs?: number;
  /** lbctl: from spawning the agent to /readyz answering 200. */
  startToReadyMs?: number;
  /** lbctl: VmHWM right after the cold sync, MiB. */
  coldHwmMiB?: number;
  /** lbctl: the memory cgroup's limit and peak charge (MiB), and its OOM kills. */
  memoryLimitMiB?: number;
  cgroupPeakMiB?: number;
  oomKills?: number;
  addMs?: number;
  /** lbctl: the API server's event to the new frontend in the kernel map. */
  addEventToMapMs?: number;
  eventToMapMs?: number[];
  memory?: Awaited<ReturnType<BenchAgent['memory']>>;
  /** The same, after the agent sat idle for IDLE_MS (V8 shrinks an idle heap on its own). */
  memoryIdle?: Awaited<ReturnType<BenchAgent['memory']>>;
  /** lbctl: CPU (every thread) in each second of the idle time after IDLE_SETTLE_MS, ms. */
  idleCpuMsPerS?: number[];
  /** lbctl: the same add repeated in a warm agent (deleted, then added again), sync ms and event → map ms each. */
  addAgainMs?: number[];
  addAgainEventToMapMs?: number[];
  /** kube-proxy modes: writes the one-service addition as kube-proxy's partial sync would; returns ms. */
  add?: () => number;
  agent?: BenchAgent;
  finish(): Promise<void>;
}

const LOADER: Record<'iptables-legacy' | 'iptables-nft', string> = {
  'iptables-legacy': 'iptables-legacy-restore',
  'iptables-nft': 'iptables-nft-restore',
};

/** Programs N services the way `mode` does, from cold, and times it. */
async function program(
  mode: Mode,
  ctx: { run: BenchRun; w: World; services: BenchService[]; n: number; plan: Plan; api: FakeApiServer; texts: Map<string, string>; memory?: MemoryCgroup | undefined },
): Promise<Programmed> {
  const { w, services, n } = ctx;
  const live = services.slice(0, n);
  const added = services[n]!;
  const opts = { clusterCIDR: CLUSTER_CIDR };
  const text = (key: string, make: () => string): string => {
    let t = ctx.texts.get(key);
    if (t === undefined) ctx.texts.set(key, (t = make()));
    return t;
  };
  switch (mode) {
    case 'floor':
      return { coldMs: 0, finish: async () => {} };
    case 'iptables-legacy':
    case 'iptables-nft': {
      const full = text(`ipt-full-${n}`, () => iptablesRestoreFull(live, opts));
      const add = text(`ipt-add-${n}`, () => iptablesRestoreAdd(live, added, opts));
      // kube-proxy runs iptables-restore with --noflush --counters (its chains are declared, so they are flushed).
      const coldMs = timed(() => w.inClient(LOADER[mode], ['-w', '--noflush', '--counters'], full));
      return { coldMs, add: () => timed(() => w.inClient(LOADER[mode], ['-w', '--noflush', '--counters'], add)), finish: async () => {} };
    }
    case 'nftables': {
      const full = text(`nft-full-${n}`, () => nftablesFull(live, opts));
      const add = text(`nft-add-${n}`, () => nftablesAdd(added, opts));
      const coldMs = timed(() => w.inClient('nft', ['-f', '-'], full));
      return { coldMs, add: () => timed(() => w.inClient('nft', ['-f', '-'], add)), finish: async () => {} };
    }
    case 'lbctl': {
      const mark = ctx.api.requests.length;
      const agent = BenchAgent.start(ctx.run, w, ctx.api, n, AGENT_CPU, ctx.memory ? { memory: ctx.memory } : {});
      const first = await agent.waitForSync(0).catch((err: unknown) => {
        throw oomKilled(ctx.memory, n, err);
      });
      if (first.frontends !== n) throw new Error(`lbctl's first sync has ${first.frontends} frontends, not ${n}`);
      const coldHwmMiB = (await agent.memory()).hwmMiB;
      const firstList = ctx.api.requests.slice(mark).find((r) => r.verb === 'list' || r.verb === 'watch');
      const deadline = performance.now() + 60_000;
      while (agent.readyAt === undefined && performance.now() < deadline) await new Promise((r) => setTimeout(r, 5));
      return {
        coldMs: first.durationMs,
        startToSyncedMs: first.seenAt - agent.startedAt,
        ...(agent.readyAt !== undefined ? { startToReadyMs: agent.readyAt - agent.startedAt } : {}),
        ...(firstList ? { coldFromListMs: first.seenAt - firstList.at } : {}),
        ...(first.phasesMs ? { coldPhasesMs: first.phasesMs } : {}),
        coldHwmMiB,
        agent,
        finish: async () => agent.stop(),
      };
    }
  }
}

/**
 * Runs `change` (which makes the API server send watch events) and returns
 * when the server handed the first of them to a watch connection: where
 * "event → map" starts, so the server's own bookkeeping before it sends is
 * not counted as lbctl's. (Absolute time; the change's start if it sent nothing.)
 */
function sentBy(api: FakeApiServer, change: () => void): number {
  let first: number | undefined;
  api.onSend = (at) => (first ??= at);
  const start = performance.timeOrigin + performance.now();
  try {
    change();
  } finally {
    api.onSend = undefined;
  }
  return first ?? start;
}

/** lbctl: how long one added service takes, from the API server to the kernel map, and the sync that wrote it. */
async function timedAdd(agent: BenchAgent, probe: MasterProbe, api: FakeApiServer, added: BenchService): Promise<{ syncMs: number; eventMs: number }> {
  const mark = agent.syncs.length;
  const { seen } = await probe.arm(3);
  const t0 = sentBy(api, () => putServices(api, [added]));
  const eventMs = (await seen) - t0;
  const s = await agent.waitForSync(mark, (x) => x.reason === 'change' && x.planned > 0);
  return { syncMs: s.durationMs, eventMs };
}

/** Adds one service on top of N, timed as each mode's own sync would write it. */
async function addOne(mode: Mode, p: Programmed, ctx: { w: World; services: BenchService[]; n: number; api: FakeApiServer }): Promise<void> {
  const added = ctx.services[ctx.n]!;
  if (mode === 'floor') return;
  if (p.add) {
    p.addMs = p.add();
    return;
  }
  const probe = new MasterProbe(ctx.w.bpfRoot, added.clusterIP, added.port);
  try {
    const t = await timedAdd(p.agent!, probe, ctx.api, added);
    p.addMs = t.syncMs;
    p.addEventToMapMs = t.eventMs;
  } finally {
    await probe.close();
  }
}

/** lbctl: times the add is repeated in the running agent (addAgain). */
const ADD_AGAIN = 5;
/** How long the agent sits idle before its memory is sampled a second time (not in --quick). */
const IDLE_MS = 15_000;
/** Of which the first part is left out of the idle CPU figure (the collections that follow activity). */
const IDLE_SETTLE_MS = 5_000;

/**
 * lbctl: the added service deleted and added again ADD_AGAIN times, in an
 * agent that has synced changes before: what a partial sync costs in a
 * running agent. The first add after start (addOne) is slower, for reasons
 * not all measured (docs/benchmarks.md), and is reported on its own.
 */
async function addAgain(p: Programmed, ctx: { w: World; services: BenchService[]; n: number; api: FakeApiServer }): Promise<void> {
  const added = ctx.services[ctx.n]!;
  const agent = p.agent!;
  const probe = new MasterProbe(ctx.w.bpfRoot, added.clusterIP, added.port);
  p.addAgainMs = [];
  p.addAgainEventToMapMs = [];
  try {
    for (let i = 0; i < ADD_AGAIN; i++) {
      const beforeDelete = agent.syncs.length;
      deleteServices(ctx.api, [added]);
      await probe.until(undefined);
      // The delete's own sync line must be in before the add is timed, or it would be taken for the add's.
      await agent.waitForSync(beforeDelete, (x) => x.reason === 'change' && x.planned > 0);
      await new Promise((r) => setTimeout(r, 20));
      const t = await timedAdd(agent, probe, ctx.api, added);
      p.addAgainMs.push(t.syncMs);
      p.addAgainEventToMapMs.push(t.eventMs);
    }
  } finally {
    await probe.close();
  }
}

/**
 * EndpointSlice changes (a 4th endpoint added, then removed again) to the
 * service in the middle, each timed from the API server sending it to the
 * kernel map holding it, 20 ms apart.
 */
async function timedSliceChanges(ctx: { w: World; services: BenchService[]; n: number; api: FakeApiServer; plan: Plan }): Promise<number[]> {
  const s = ctx.services[Math.floor(ctx.n / 2)]!;
  const probe = new MasterProbe(ctx.w.bpfRoot, s.clusterIP, s.port);
  const samples: number[] = [];
  try {
    for (let i = 0; i < ctx.plan.events; i++) {
      const grow = i % 2 === 0;
      const eps = grow ? [...s.endpoints, { ip: '10.244.9.9', port: POD_PORT }] : s.endpoints;
      await new Promise((r) => setTimeout(r, 20));
      const { seen } = await probe.arm(eps.length);
      const t0 = sentBy(ctx.api, () => ctx.api.put(sliceObject({ ...s, endpoints: eps }) as never));
      samples.push((await seen) - t0);
    }
  } finally {
    await probe.close();
  }
  return samples;
}

/** lbctl: the EndpointSlice changes through the agent. */
async function events(p: Programmed, ctx: { w: World; services: BenchService[]; n: number; api: FakeApiServer; plan: Plan }): Promise<void> {
  p.eventToMapMs = await timedSliceChanges(ctx);
}

/**
 * The first stdout line of a floor process that starts with `prefix`, and
 * when this process read it. Rejects when the process ends first (on
 * 'close': a line may still be in the pipe at 'exit') or after `timeoutMs`,
 * with what it wrote to stderr.
 */
function untilLine(proc: ChildProcess, prefix: string, what: string, timeoutMs: number): Promise<{ line: string; seenAt: number }> {
  let err = '';
  proc.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  return new Promise((resolve, reject) => {
    const deadline = setTimeout(() => reject(new Error(`${what} printed no "${prefix.trim()}" within ${timeoutMs / 1000} s: ${err.trim()}`)), timeoutMs);
    createInterface({ input: proc.stdout! }).on('line', (line) => {
      if (!line.startsWith(prefix)) return;
      clearTimeout(deadline);
      resolve({ line, seenAt: performance.now() });
    });
    proc.once('close', (code) => {
      clearTimeout(deadline);
      reject(new Error(`${what} exited (${code}) before it printed "${prefix.trim()}": ${err.trim()}`));
    });
  });
}

/**
 * The same EndpointSlice changes through bench/event-floor.ts instead of
 * the agent (stopped by now; its maps stay pinned), on the agent's CPU: the
 * least a Node.js watcher needs on this machine, the baseline of lbctl's
 * event → map figures in the same run.
 */
async function eventFloor(ctx: { run: BenchRun; w: World; services: BenchService[]; n: number; api: FakeApiServer; plan: Plan }): Promise<number[]> {
  const s = ctx.services[Math.floor(ctx.n / 2)]!;
  const key = masterKey(s.clusterIP, s.port);
  const args = [
    '-c', String(AGENT_CPU), process.execPath, '--import=@tapjs/typescript/import', path.join(ROOT, 'bench/event-floor.ts'),
    ctx.api.url, AGENT_TOKEN, String(ctx.api.resourceVersion), path.join(ctx.w.bpfRoot, 'maps', 'lb4_services'), key.toString('hex'), sliceName(s),
  ];
  const floor = ctx.run.spawn('taskset', args);
  try {
    await untilLine(floor, 'watching', 'bench/event-floor.ts', 60_000);
    return await timedSliceChanges(ctx);
  } finally {
    if (floor.exitCode === null) floor.kill('SIGKILL');
  }
}

/** What bench/cold-floor.ts measured: first list request → its last map write (the same clocks as lbctl's row), and its own split. */
interface ColdFloor {
  fromListMs: number;
  listMs: number;
  encodeMs: number;
  kernelMs: number;
  entries: number;
}

/**
 * The same cold start through bench/cold-floor.ts instead of the agent, on
 * the agent's CPU, against the same API server: the least a Node.js agent
 * needs on this machine to list the objects and write their entries, the
 * baseline of lbctl's "first list request → every frontend in the kernel".
 */
async function coldFloor(ctx: { run: BenchRun; w: World; n: number; api: FakeApiServer }): Promise<ColdFloor> {
  const pin = `${ctx.w.bpfRoot}-cold-floor`;
  const mark = ctx.api.requests.length;
  const args = ['-c', String(AGENT_CPU), process.execPath, '--import=@tapjs/typescript/import', path.join(ROOT, 'bench/cold-floor.ts'), ctx.api.url, AGENT_TOKEN, pin, String(ctx.n)];
  const floor = ctx.run.spawn('taskset', args);
  try {
    const done = await untilLine(floor, 'done ', 'bench/cold-floor.ts', 600_000);
    const firstList = ctx.api.requests.slice(mark).find((r) => r.verb === 'list');
    if (!firstList) throw new Error('bench/cold-floor.ts: the API server saw no list');
    return { fromListMs: done.seenAt - firstList.at, ...(JSON.parse(done.line.slice(5)) as Omit<ColdFloor, 'fromListMs'>) };
  } finally {
    if (floor.exitCode === null) floor.kill('SIGKILL');
    rmSync(pin, { recursive: true, force: true });
  }
}

/** An agent that died under the memory limit is named as such: the limit is a target of its own. */
function oomKilled(memory: MemoryCgroup | undefined, n: number, err: unknown): Error {
  if (!memory || memory.oomKills() === 0) return err as Error;
  return new Error(
    `the lbctl agent was OOM-killed at N=${n.toLocaleString('en')} under its memory limit of ${(memory.limitBytes / 2 ** 20).toFixed(0)} MiB ` +
      `(deploy/base/daemonset.yaml's limits.memory; --memory-limit overrides): ${(err as Error).message}`,
  );
}

/** Periodic resyncs timed per point: RESYNCS of them, after the first (which the heap compaction after the cold sync shares). */
const RESYNCS = 3;
const RESYNC_PERIOD_MS = 3000;

/**
 * lbctl: what one periodic full resync costs (kube-proxy's syncPeriod: the
 * maps re-read, compared with what the agent wrote, drift repaired). An
 * agent of its own with a short sync period (debug logging, so the routine
 * resyncs that repair nothing are logged), after its cold sync: each
 * resync's own duration, and the agent's CPU time (every thread) over the
 * period that holds it, idle work included, so an upper bound.
 */
async function resyncCost(
  run: BenchRun,
  api: FakeApiServer,
  n: number,
  memory: MemoryCgroup | undefined,
): Promise<{ resyncMs: number[]; resyncCpuMs: number[]; floorResyncCpuMs?: number[] }> {
  const w = run.world();
  try {
    const agent = BenchAgent.start(run, w, api, n, AGENT_CPU, { syncPeriodMs: RESYNC_PERIOD_MS, logLevel: 'debug', ...(memory ? { memory } : {}) });
    let timed: { resyncMs: number[]; resyncCpuMs: number[] };
    try {
      await agent.waitForSync(0);
      const periodic = async (from: number): Promise<number> => {
        const s = await agent.waitForSync(from, (x) => x.reason === 'periodic', 60_000);
        return agent.syncs.indexOf(s);
      };
      let at = await periodic(0);
      let cpu = agent.cpuMs();
      const resyncMs: number[] = [];
      const resyncCpuMs: number[] = [];
      for (let i = 0; i < RESYNCS; i++) {
        at = await periodic(at + 1);
        const now = agent.cpuMs();
        resyncMs.push(agent.syncs[at]!.durationMs);
        resyncCpuMs.push(now - cpu);
        cpu = now;
      }
      timed = { resyncMs, resyncCpuMs };
    } finally {
      await agent.stop();
    }
    // The floor: the same maps (still pinned) read by a bare process on the agent's CPU.
    // One that fails is left out, with a line saying why.
    try {
      const out = execFileSync(
        'taskset',
        ['-c', String(AGENT_CPU), process.execPath, '--import=@tapjs/typescript/import', path.join(ROOT, 'bench/resync-floor.ts'), mapsDir(w.bpfRoot), String(RESYNCS + 2)],
        { encoding: 'utf8', timeout: 120_000 },
      );
      const done = out.split('\n').find((l) => l.startsWith('done '));
      if (!done) throw new Error(`it printed no result: ${out.trim()}`);
      // The first read (cold caches, code not yet optimized) is left out, as the agent's first resync is.
      return { ...timed, floorResyncCpuMs: (JSON.parse(done.slice(5)) as { cpuMs: number[] }).cpuMs.slice(1) };
    } catch (err) {
      process.stderr.write(`N=${n}: the resync floor failed and is left out: ${(err as Error).message}\n`);
      return timed;
    }
  } finally {
    w.close();
  }
}

async function main(): Promise<void> {
  const plan = parse();
  if (process.getuid?.() !== 0) throw new Error('make bench needs root (network namespaces, bpffs, cgroups)');
  // This process polls the maps and serves the API: keep it off the agent's CPU.
  execFileSync('taskset', ['-a', '-p', '-c', String(BENCH_CPU), String(process.pid)], { stdio: 'ignore' });
  compile();
  if (plan.modes.includes('lbctl')) buildSockFloor();
  mkdirSync(plan.out, { recursive: true });
  if (plan.profileOnly) {
    const file = path.join(plan.out, 'results.json');
    const r = JSON.parse(readFileSync(file, 'utf8')) as Results;
    r.datapathProfile = await datapathProfile(plan);
    r.revnatProfile = await revnatProfile(revnatPlan(plan));
    writeFileSync(file, `${JSON.stringify(r, null, 1)}\n`);
    report(r, plan.out);
    process.stdout.write(readFileSync(path.join(plan.out, 'results.md'), 'utf8'));
    return;
  }
  const results: Results = {
    meta: {
      date: new Date().toISOString(),
      commit: commit(),
      kernel: os.release(),
      cpu: os.cpus()[0]?.model ?? 'unknown',
      cpus: os.cpus().length,
      quick: plan.quick,
      reps: plan.reps,
      ccCount: plan.ccCount,
      rrCount: plan.rrCount,
      events: plan.events,
      iptablesMax: plan.iptablesMax,
      nftablesMax: plan.nftablesMax,
      pinning: `client and server share CPU ${BENCH_CPU}; the lbctl agent runs on CPU ${AGENT_CPU}`,
      versions: versions(),
    },
    points: [],
    skipped: [],
  };
  const save = (): void => {
    writeFileSync(path.join(plan.out, 'results.json'), `${JSON.stringify(results, null, 1)}\n`);
  };

  const run = new BenchRun();
  // The agent runs under the DaemonSet's memory limit, as a cgroup's (one for the run: its peak is per point, from VmHWM).
  const memory = plan.memoryLimit > 0 ? run.memoryCgroup(plan.memoryLimit) : undefined;
  results.meta.memoryLimitMiB = memory ? plan.memoryLimit / 2 ** 20 : null;
  if (plan.memoryLimit > 0 && !memory) process.stderr.write('no memory controller mounted: the agent runs without a memory limit\n');
  try {
    for (const n of plan.sizes) {
      const services = makeServices(n);
      const texts = new Map<string, string>();
      const api = await startCluster();
      try {
        if (plan.modes.includes('lbctl')) putServices(api, services.slice(0, n));
        for (let rep = 0; rep < plan.reps; rep++) {
          for (const mode of plan.modes) {
            if (mode.startsWith('iptables') && n > plan.iptablesMax) {
              if (rep === 0) results.skipped.push({ mode, n, why: `iptables mode is measured up to ${plan.iptablesMax} services (--iptables-max): one restore beyond takes minutes` });
              continue;
            }
            if (mode === 'nftables' && n > plan.nftablesMax) {
              if (rep === 0) results.skipped.push({ mode, n, why: `nftables mode is measured up to ${plan.nftablesMax} services (--nftables-max): the load time grows quadratically with the number of services (one anonymous numgen vmap per service), about 45 minutes projected for 100,000` });
              continue;
            }
            const label = `N=${n} rep ${rep + 1}/${plan.reps} ${mode}`;
            process.stderr.write(`${label}: programming\n`);
            const w = run.world();
            try {
              await w.startServer(SERVER, BENCH_CPU);
              const ctx = { run, w, services, n, plan, api, texts, memory: mode === 'lbctl' ? memory : undefined };
              const p = await program(mode, ctx);
              try {
                const targets: Array<[string, string]> =
                  mode === 'floor' ? [['pod', POD_IPS[0]!]] : [['first', services[0]!.clusterIP], ['last', services[n - 1]!.clusterIP]];
                const conn: Record<string, { cc: ConnStats; rr: ConnStats }> = {};
                for (const [which, addr] of targets) {
                  const port = mode === 'floor' ? POD_PORT : 80;
                  conn[which] = { cc: connect(run, w, addr, port, 'cc', plan.ccCount), rr: connect(run, w, addr, port, 'rr', plan.rrCount) };
                }
                // The socket path's floor, interleaved with lbctl and a direct connect, through the last service.
                const sockFloorResult =
                  mode === 'lbctl'
                    ? await sockFloor(run, w, n, services[n - 1]!.clusterIP, plan.quick ? SOCK_FLOOR_QUICK : SOCK_FLOOR_DEFAULTS)
                    : undefined;
                await addOne(mode, p, { w, services, n, api });
                // The added service must work too (20 sanity connects in the client).
                if (mode !== 'floor') connect(run, w, services[n]!.clusterIP, 80, 'cc', 100);
                if (mode === 'lbctl') {
                  await events(p, { w, services, n, api, plan });
                  await addAgain(p, { w, services, n, api });
                  p.memory = await p.agent!.memory();
                  if (!plan.quick) {
                    await new Promise((r) => setTimeout(r, IDLE_SETTLE_MS));
                    // One sample a second: the collections V8 runs on its own
                    // after activity (up to some 100 ms each) land in one or
                    // two of them, and the median is what the idle agent pays.
                    p.idleCpuMsPerS = [];
                    for (let at = IDLE_SETTLE_MS; at < IDLE_MS; at += 1000) {
                      const cpu = p.agent!.cpuMs();
                      await new Promise((r) => setTimeout(r, 1000));
                      p.idleCpuMsPerS.push(p.agent!.cpuMs() - cpu);
                    }
                    p.memoryIdle = await p.agent!.memory();
                  }
                  deleteServices(api, [services[n]!]);
                }
                // The resyncs get an agent of their own (a short sync period); this point's agent is done.
                if (mode === 'lbctl') await p.agent!.stop();
                const floorEvents = mode === 'lbctl' ? await eventFloor({ run, w, services, n, api, plan }) : undefined;
                // A floor that fails is left out of the point, with a line saying why; the point stays.
                const floorCold =
                  mode === 'lbctl'
                    ? await coldFloor({ run, w, n, api }).catch((err: unknown) => {
                        process.stderr.write(`${label}: the cold floor failed and is left out: ${(err as Error).message}\n`);
                        return undefined;
                      })
                    : undefined;
                const resync = mode === 'lbctl' && n <= plan.resyncMax ? await resyncCost(run, api, n, memory) : undefined;
                results.points.push({
                  mode,
                  n,
                  rep,
                  connections: conn,
                  ...(sockFloorResult ? { sockFloor: sockFloorResult } : {}),
                  coldMs: p.coldMs,
                  startToSyncedMs: p.startToSyncedMs,
                  startToReadyMs: p.startToReadyMs,
                  coldFromListMs: p.coldFromListMs,
                  coldHwmMiB: p.coldHwmMiB,
                  ...(mode === 'lbctl' && memory ? { memoryLimitMiB: memory.limitBytes / 2 ** 20, oomKills: memory.oomKills() } : {}),
                  ...(resync ?? {}),
                  coldPhasesMs: p.coldPhasesMs,
                  addMs: p.addMs,
                  addEventToMapMs: p.addEventToMapMs,
                  addAgainMs: p.addAgainMs,
                  addAgainEventToMapMs: p.addAgainEventToMapMs,
                  eventToMapMs: p.eventToMapMs,
                  ...(floorEvents ? { floorEventToMapMs: floorEvents } : {}),
                  ...(floorCold ? { floorCold } : {}),
                  memory: p.memory,
                  memoryIdle: p.memoryIdle,
                  idleCpuMsPerS: p.idleCpuMsPerS,
                });
                const c = conn.last ?? conn.pod!;
                process.stderr.write(
                  `${label}: cold ${p.coldMs.toFixed(1)} ms, add ${p.addMs?.toFixed(2) ?? '-'} ms, connect+close p50 ${c.cc.p50_us} µs p99 ${c.cc.p99_us} µs\n`,
                );
              } finally {
                await p.finish();
              }
            } finally {
              w.close();
            }
            save();
          }
        }
      } finally {
        await api.stop();
      }
    }
  } finally {
    run.close();
  }
  if (plan.modes.includes('lbctl') && plan.profiles) {
    process.stderr.write('datapath profile: run-time stats (BPF_ENABLE_STATS) during 20,000 connects through lbctl\n');
    results.datapathProfile = await datapathProfile(plan);
    process.stderr.write('socket rev-NAT write: the old build against the current one, run-time stats (BPF_ENABLE_STATS)\n');
    results.revnatProfile = await revnatProfile(revnatPlan(plan));
  }
  save();
  report(results, plan.out);
  process.stderr.write(`results: ${path.join(plan.out, 'results.md')}\n`);
  process.stdout.write(readFileSync(path.join(plan.out, 'results.md'), 'utf8'));
}

/**
 * Where lbctl's per-connection cost goes: the kernel's own accounting of each
 * BPF program's run time (BPF_ENABLE_STATS), over 20,000 connects
 * through a ClusterIP at N=1,000. A separate world, after every timed point:
 * the accounting itself costs a little.
 */
async function datapathProfile(plan: Plan): Promise<NonNullable<Results['datapathProfile']>> {
  const n = 1000;
  const connects = 20_000;
  const services = makeServices(n);
  const api = await startCluster();
  const run = new BenchRun();
  try {
    putServices(api, services.slice(0, n));
    const w = run.world();
    await w.startServer(SERVER, BENCH_CPU);
    const agent = BenchAgent.start(run, w, api, n, AGENT_CPU);
    try {
      await agent.waitForSync(0);
      const progIds = (): Map<number, string> => {
        const ids = new Map<number, string>();
        for (const name of readdirSync(path.join(w.bpfRoot, 'links'))) {
          const link = JSON.parse(execFileSync('bpftool', ['-j', 'link', 'show', 'pinned', path.join(w.bpfRoot, 'links', name)], { encoding: 'utf8' })) as { prog_id: number };
          ids.set(link.prog_id, name);
        }
        return ids;
      };
      const stats = (): Map<string, { runs: number; ns: number }> => {
        const ids = progIds();
        const out = new Map<string, { runs: number; ns: number }>();
        for (const [id, name] of ids) {
          const p = JSON.parse(execFileSync('bpftool', ['-j', 'prog', 'show', 'id', String(id)], { encoding: 'utf8' })) as { run_cnt?: number; run_time_ns?: number };
          out.set(name, { runs: p.run_cnt ?? 0, ns: p.run_time_ns ?? 0 });
        }
        return out;
      };
      const counting = enableRunTimeStats();
      let before: ReturnType<typeof stats>;
      let after: ReturnType<typeof stats>;
      let c: ReturnType<typeof connect>;
      try {
        before = stats();
        c = connect(run, w, services[0]!.clusterIP, 80, 'cc', connects);
        after = stats();
      } finally {
        counting.close();
      }
      const programs = [...after].map(([name, a]) => {
        const b = before.get(name) ?? { runs: 0, ns: 0 };
        const runs = a.runs - b.runs;
        const ns = a.ns - b.ns;
        return { program: name, runs, avgNs: runs ? ns / runs : 0, nsPerConnect: ns / (connects + 1000 + 20) };
      });
      return { n, connects, p50_us: c.p50_us, programs: programs.filter((p) => p.runs > 0).sort((x, y) => y.nsPerConnect - x.nsPerConnect) };
    } finally {
      await agent.stop();
    }
  } finally {
    run.close();
    await api.stop();
    void plan;
  }
}

/** bench/revnat.ts at this run's size: about 2.5 minutes (20 s in quick mode). */
function revnatPlan(plan: Plan): { count: number; reps: number; log: (s: string) => void } {
  return { count: plan.quick ? 5000 : 20_000, reps: plan.quick ? 4 : 8, log: (s) => process.stderr.write(s) };
}

/** The commit this run measures (bench/record.ts names the run's record by it); '+' when the tree has changes. */
function commit(): string {
  try {
    const sha = execFileSync('git', ['-C', ROOT, 'rev-parse', '--short=7', 'HEAD'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    const dirty = execFileSync('git', ['-C', ROOT, 'status', '--porcelain', '--untracked-files=no'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    return dirty ? `${sha}+` : sha;
  } catch {
    return 'unknown';
  }
}

function versions(): Record<string, string> {
  const v = (cmd: string, args: string[]): string => {
    try {
      return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim().split('\n')[0]!;
    } catch {
      return 'absent';
    }
  };
  return {
    'iptables-legacy': v('iptables-legacy', ['--version']),
    'iptables-nft': v('iptables-nft', ['--version']),
    nft: v('nft', ['--version']),
    node: process.version,
  };
}

main().catch((err: unknown) => {
  process.stderr.write(`bench: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
