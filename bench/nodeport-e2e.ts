// make bench / bench-quick: NodePort end to end, from a client outside the
// node, through the lab of the NodePort e2e test (test/helpers/nodeport-lab.ts:
// ext → node 1 → a pod on node 1 (local) or on node 2 (remote)), four ways:
//
//   routed     the client dials the pod's own address, routed through node 1 (no translation at all)
//   lbctl      the agent in node 1 (nodeport.bpf.o at tc on n1e and n1b), the client dials node 1's NodePort
//   lbctl-xdp  the same with --nodeport-acceleration native (nodeport_xdp.bpf.o at XDP on n1e and n1b too)
//   lbctl-dsr  --nodeport-mode dsr on node 1 and on node 2 (an agent there too, and the client's second
//              wire to node 2, test/helpers/nodeport-lab.ts's addNode2): node 2 answers the client itself
//   iptables   kube-proxy's iptables mode, emulated (bench/kube-proxy.ts): its nat and filter
//              rules for the N services in node 1's namespace, loaded with iptables-legacy-restore
//   nftables   kube-proxy's nftables mode, emulated the same way, loaded with nft -f
//
//   node --import=@tapjs/typescript/import bench/nodeport-e2e.ts [--quick] [--out DIR] [--sizes 2,10000] [--reps 3]
//        [--rounds 4] [--modes lbctl,...] [--sustain 3] [--search-window 20] [--search-start 1000] [--search-steps 3]
//
// Every lab is wired as XDP needs it, whatever the mode, so the labs are the
// same: the veths XDP sends frames to (ext0, n2a) run an XDP program that
// passes everything (their NAPI on), and the client and the pods send whole
// checksums (ethtool tx off), as frames off a wire have them.
//
// N NodePort services (externalTrafficPolicy Cluster): the two measured ones
// (one whose only endpoint is the pod on node 1, one whose only endpoint is
// the pod on node 2) last in kube-proxy's rule order, the others with 3
// endpoints nothing answers. The fillers ask for lbctl.io/lb-algorithm random,
// so the agent's first sync builds no 10,000 Maglev tables (see
// nodeport-tc.ts for what those cost); the measured ones keep Maglev.
//
// Per point, for the local and the remote pod: connect + 64-byte
// request/reply + close latency (bench/connect.c -m rr, one at a time, p50
// and p99), then requests per second (bench/np-load.c: 32 connections in
// flight, each connect + request/reply + close). Client, node and pods share
// CPU 1 (veth hands packets on in the sender's softirq, so every step of a
// connection runs there): requests per second measure what a connection
// costs the whole path; the bench and lbctl's agents run on the other CPUs.
// Each mode gets a fresh lab (no rule, conntrack or CT state carries over),
// timed in --rounds rounds in turn with the routed pod, whose lab of its own
// lives through the N (which goes first alternates): the machine's drift
// falls on both sides of each round's ratio. Modes run in a rotating order
// per repetition; ratios over the routed pod are the medians of every
// round's, figures the medians of the rounds.
//
// lbctl SNATs flows to a remote pod to ports of --snat-port-range (from
// above the NodePort range to 65535 by default), keeping the client's own
// port when it is free and taking over a closed flow's port when no free
// one is found (docs/nodeport.md, "SNAT ports"). A last sustained run
// (--sustain seconds, remote pod, every mode but the routed pod, 32 in flight) follows the
// timed points.
//
// Then the sustained rate (issue 34): for lbctl, iptables and nftables, the
// highest rate of new connections to the remote pod that the mode takes for
// --search-window seconds with no failed connection. The pod closes first
// (bench/server.c -c, an HTTP server's "Connection: close": it holds each
// tuple it saw in TIME_WAIT, the hard case for a NAT's port reuse); the
// client starts connections on a fixed schedule (np-load -r, open loop) and
// a connection fails when it is not done in 2.5 s (one SYN retransmit
// allowed), is reset or refused. A rate is held when none fails, the client
// keeps its schedule and the NAT counts no packet dropped for want of room
// (lbctl's np_snat_exhausted and np_ct_full, conntrack's insert_failed and
// drop: a SYN dropped once and retransmitted in time is no failed
// connection, but it is a NAT out of ports). Each probe is one rate in a
// fresh lab at N = the smallest size: from --search-start, doubled while it
// is held (or halved while it is not), then --search-steps bisections
// between the highest rate held and the lowest not (geometric midpoints:
// 3 steps find the rate within 9%). A search, not each mode's closed-loop saturation rate:
// a closed loop slows down when connections stall (SYNs dropped for want of
// a port, or refused by the pod's TIME_WAIT) and reports a rate with those
// failures inside it, where the question a node's operator asks is which
// rate it takes without failing a connection.
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Command } from 'commander';
import { iptablesRestoreFull, nftablesFull } from './kube-proxy.js';
import { npServices, serviceObject, sliceObject, type NpService } from './np-services.js';
import { pairedRatios } from './np-figures.js';
import { ROOT } from './world.js';
import { createSandbox, type Sandbox } from '../test/helpers/sandbox.js';
import { addNode2, makeLab, NODE1, POD1, POD2, type Lab } from '../test/helpers/nodeport-lab.js';
import { failureSummary, npLoad, SUSTAINED_TIMEOUT_MS, type NpLoadResult } from '../test/helpers/np-load.js';
import { enableRunTimeStats } from '../src/native/bpf.js';

const MODES = ['routed', 'lbctl', 'lbctl-xdp', 'lbctl-dsr', 'iptables', 'nftables'] as const;
type Mode = (typeof MODES)[number];
const SEARCH_MODES = ['lbctl', 'iptables', 'nftables'] as const satisfies readonly Mode[];
/** The search's bounds: below the floor a mode is reported as taking less; the ceiling is beyond what one CPU carries. */
const SEARCH_FLOOR = 100;
const SEARCH_CEILING = 64_000;
const CONNECT = path.join(ROOT, 'build/bench/connect');
const SERVER = path.join(ROOT, 'build/bench/server');
const LOAD = path.join(ROOT, 'build/bench/np-load');
const CPU = 1;
const POD_PORT = 8081;
const NODEPORTS = { first: 30000, last: 40999 };
const CLUSTER_CIDR = '10.252.0.0/16';
/** Issue 37: requests/s over the routed pod's (tc, SNAT), with XDP; at least the best kube-proxy mode's; p50 over the routed pod's. */
const ROUTED_TARGET = 0.95;
const ROUTED_TARGET_XDP = 0.97;
const P50_TARGET = 1.1;
const XDP_PASS_OBJECT = path.join(ROOT, 'bpf/.output/tests/xdp_pass.bpf.o');

interface Plan {
  quick: boolean;
  out: string;
  sizes: number[];
  reps: number;
  rounds: number;
  rr: number;
  load: number;
  concurrency: number;
  sustain: number;
  searchWindow: number;
  searchStart: number;
  searchSteps: number;
  modes: readonly Mode[];
}

function parse(): Plan {
  const o = new Command()
    .option('--quick', 'N = 2 and 1,000, one repetition')
    .option('--out <dir>', 'where results go', path.join(ROOT, 'bench/results'))
    .option('--sizes <list>', 'numbers of services (at least 2: the measured ones)')
    .option('--reps <n>', 'repetitions (fresh labs, rotating mode order)')
    .option('--rounds <n>', 'rounds per lab, each measuring the mode and the routed pod in turn')
    .option('--sustain <s>', 'seconds of the sustained run to the remote pod (0: none)')
    .option('--search-window <s>', 'seconds each probe of the sustained-rate search runs (0: no search)')
    .option('--search-start <rate>', 'the search\'s first rate, new connections a second', '1000')
    .option('--search-steps <n>', 'bisections after the first pass and failure')
    .option('--modes <list>', `the modes timed, comma-separated (default every one: ${MODES.join(', ')}; routed is always one)`)
    .parse()
    .opts<{ quick?: boolean; out: string; sizes?: string; reps?: string; rounds?: string; sustain?: string; searchWindow?: string; searchStart: string; searchSteps?: string; modes?: string }>();
  const modes = o.modes ? o.modes.split(',') : [...MODES];
  const unknown = modes.filter((m) => !(MODES as readonly string[]).includes(m));
  if (unknown.length) throw new Error(`--modes: no mode ${unknown.join(', ')} (${MODES.join(', ')})`);
  if (!modes.some((m) => m !== 'routed')) throw new Error('--modes: at least one mode besides routed (each is timed beside it)');
  const quick = Boolean(o.quick);
  const plan: Plan = {
    quick,
    out: o.out,
    sizes: o.sizes ? o.sizes.split(',').map((x) => Number(x.replace(/_/g, ''))) : quick ? [2, 1000] : [2, 10_000],
    reps: Number(o.reps ?? (quick ? 1 : 5)),
    rounds: Number(o.rounds ?? (quick ? 2 : 4)),
    rr: 1000,
    load: quick ? 1500 : 8000,
    concurrency: 32,
    sustain: Number(o.sustain ?? (quick ? 0 : 3)),
    searchWindow: Number(o.searchWindow ?? (quick ? 5 : 20)),
    searchStart: Number(o.searchStart),
    searchSteps: Number(o.searchSteps ?? (quick ? 1 : 3)),
    modes: MODES.filter((m) => m === 'routed' || modes.includes(m)),
  };
  if (!Number.isInteger(plan.rounds) || plan.rounds < 1) throw new Error(`--rounds ${o.rounds}: a positive integer (an even one puts each side first as often)`);
  return plan;
}

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

function compile(): void {
  mkdirSync(path.dirname(CONNECT), { recursive: true });
  for (const [src, out] of [['connect.c', CONNECT], ['server.c', SERVER], ['np-load.c', LOAD]] as const) {
    execFileSync('cc', ['-O2', '-Wall', '-Wextra', '-o', out, path.join(ROOT, 'bench', src)], { stdio: 'inherit' });
  }
}

const inNs = (ns: string, cmd: string, args: readonly string[], input?: string): string =>
  execFileSync('ip', ['netns', 'exec', ns, cmd, ...args], { encoding: 'utf8', input, stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'], maxBuffer: 1 << 30 });

/** The services: fillers first, the measured local and remote ones last (kube-proxy's worst case). */
function services(n: number): { all: NpService[]; local: NpService; remote: NpService } {
  const made = npServices(n, {
    type: 'NodePort',
    nodePorts: NODEPORTS,
    measured: [[{ ip: POD1.v4, port: POD_PORT }], [{ ip: POD2.v4, port: POD_PORT }]],
    fillerAlgorithm: 'random',
  });
  const [local, remote] = [made[0]!, made[1]!];
  return { all: [...made.slice(2), local, remote], local, remote };
}

interface Lat { p50_us: number; p99_us: number; failed: number }
interface Load { rps: number; completed: number; failed: number; p50_us: number; p99_us: number; seconds: number }
/** lbctl: the tc programs' own run time (BPF_ENABLE_STATS) in a requests/s run of its own (bpfTime()), per connection. */
interface BpfTime { ingressNsPerConn: number; egressNsPerConn: number; ingressRunsPerConn: number; egressRunsPerConn: number; ingressNsPerRun: number; egressNsPerRun: number }
interface TargetResult { latency: Lat; load: Load; bpf?: BpfTime }
/** One round's ratios over the floor measured beside it: requests/s and p50 latency, to each pod. */
interface Round { local: { rps: number; p50: number }; remote: { rps: number; p50: number } }
interface PointResult {
  mode: Mode;
  n: number;
  rep: number;
  setupMs: number;
  /** Medians over the point's rounds. */
  local: TargetResult;
  remote: TargetResult;
  /** Each round's ratios over the routed pod measured beside it (absent: the floor's own point). */
  rounds?: Round[];
  sustained?: Load;
  /** lbctl: the datapath's counters after the point (np_* only). */
  counters?: Record<string, number>;
}

function latency(lab: Lab, addr: string, port: number, count: number): Lat {
  const r = spawnSync('ip', ['netns', 'exec', lab.ext, 'taskset', '-c', String(CPU), CONNECT, '-a', addr, '-p', String(port), '-n', String(count), '-w', '100', '-m', 'rr', '-t', '1000'], { encoding: 'utf8', timeout: 300_000 });
  const out = JSON.parse(r.stdout.trim().split('\n').pop() || '{}') as Lat & { error?: string };
  if (r.status !== 0 && r.status !== 3) throw new Error(`connect ${addr}:${port} failed (exit ${r.status}): ${out.error ?? r.stderr}`);
  return { p50_us: out.p50_us, p99_us: out.p99_us, failed: out.failed };
}

function load(lab: Lab, addr: string, port: number, args: string[]): Load {
  const r = spawnSync('ip', ['netns', 'exec', lab.ext, 'taskset', '-c', String(CPU), LOAD, '-a', addr, '-p', String(port), '-c', String(32), ...args], { encoding: 'utf8', timeout: 300_000 });
  if (r.status !== 0) throw new Error(`np-load ${addr}:${port} failed (exit ${r.status}): ${r.stderr}`);
  return JSON.parse(r.stdout.trim()) as Load;
}

interface ModeLab {
  sb: Sandbox;
  lab: Lab;
  /** Rules loaded, or the agent started and synced, ms. */
  setupMs: number;
}

/**
 * A fresh lab with `mode` set up for the services, its pods' servers on CPU 1
 * (closing first with `serverCloses`), handed to `fn`; torn down after it.
 */
async function withLab<T>(mode: Mode, n: number, svc: ReturnType<typeof services>, texts: Map<string, string>, serverCloses: boolean, fn: (ml: ModeLab) => Promise<T>): Promise<T> {
  const teardowns: Array<() => unknown> = [];
  const sb: Sandbox = await createSandbox({ teardown: (fn) => teardowns.push(fn) }, { backends: 0, agent: false });
  try {
    const lab = await makeLab(sb);
    // The routed mode's routes (in every mode, so the labs are the same): the client reaches
    // the pods through node 1, and node 2 routes the client's replies back through node 1.
    execFileSync('ip', ['-n', lab.ext, 'route', 'add', '10.252.0.0/16', 'via', NODE1.v4]);
    execFileSync('ip', ['-n', lab.n2, 'route', 'add', '10.250.0.0/24', 'via', '10.251.0.1']);
    for (const [ns, dev] of [[lab.ext, 'ext0'], [lab.n2, 'n2a']] as const) execFileSync('ip', ['-n', ns, 'link', 'set', 'dev', dev, 'xdpdrv', 'obj', XDP_PASS_OBJECT, 'sec', 'xdp']);
    for (const [ns, dev] of [[lab.ext, 'ext0'], [lab.p1, 'eth0'], [lab.p2, 'eth0']] as const) execFileSync('ip', ['netns', 'exec', ns, 'ethtool', '-K', dev, 'tx', 'off'], { stdio: 'ignore' });
    for (const ns of [lab.p1, lab.p2]) startServer(sb, ns, serverCloses);
    await new Promise((r) => setTimeout(r, 300));
    const t0 = performance.now();
    const text = (key: string, make: () => string): string => {
      let t = texts.get(key);
      if (t === undefined) texts.set(key, (t = make()));
      return t;
    };
    const opts = { clusterCIDR: CLUSTER_CIDR };
    switch (mode) {
      case 'routed':
        break;
      case 'iptables':
        inNs(lab.n1, 'iptables-legacy-restore', ['-w', '--noflush', '--counters'], text(`ipt-${n}`, () => iptablesRestoreFull(svc.all, opts)));
        break;
      case 'nftables':
        inNs(lab.n1, 'nft', ['-f', '-'], text(`nft-${n}`, () => nftablesFull(svc.all, { ...opts, nodeIP: NODE1.v4 })));
        break;
      case 'lbctl':
      case 'lbctl-xdp':
      case 'lbctl-dsr': {
        const objects = svc.all.flatMap((s) => [serviceObject(s), sliceObject(s, (ip) => (ip === POD1.v4 ? 'node1' : 'node2'))]);
        sb.writeManifest('services.json', JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }));
        const common = ['--nodeport-range', `${NODEPORTS.first}-${NODEPORTS.last}`, '--sync-period', '3600000'];
        const extra = mode === 'lbctl-xdp' ? ['--nodeport-acceleration', 'native'] : mode === 'lbctl-dsr' ? ['--nodeport-mode', 'dsr'] : [];
        if (mode === 'lbctl-dsr') {
          const node2 = addNode2(sb, lab);
          await node2.start(['--devices', 'n2a,n2e', '--node-name', 'node2', ...common, ...extra]);
          await node2.agent!.waitForLog((l) => l.msg === 'sync done' && Number(l.frontends) >= 2 * n, 0, 300_000);
        }
        await lab.agent.start(['--devices', 'n1e,n1b', '--node-name', 'node1', ...common, ...extra]);
        // The first sync may come before the file is read: wait for the one with every frontend (a ClusterIP and a NodePort each).
        await lab.agent.agent!.waitForLog((l) => l.msg === 'sync done' && Number(l.frontends) >= 2 * n, 0, 300_000);
        break;
      }
    }
    return await fn({ sb, lab, setupMs: performance.now() - t0 });
  } finally {
    for (const fn of teardowns.reverse()) await fn();
  }
}

/** Where the client dials a service's pod in `mode`. */
const dial = (mode: Mode, s: NpService, pod: string): [string, number] => (mode === 'routed' ? [pod, POD_PORT] : [NODE1.v4, s.nodePort]);

/** One measurement of the pod behind `s` in `lab` (`mode` says how it is dialled): latency, then requests/s. */
function measure(plan: Plan, mode: Mode, lab: Lab, s: NpService, pod: string): TargetResult {
  const [addr, port] = dial(mode, s, pod);
  return { latency: latency(lab, addr, port, plan.rr), load: load(lab, addr, port, ['-n', String(plan.load), '-w', '200']) };
}

/**
 * lbctl's tc programs' run time per connection to the pod behind `s`, in a
 * requests/s run of its own: the kernel's accounting (BPF_ENABLE_STATS)
 * costs every program run two clock reads, so it is on for this run only,
 * never for the timed ones.
 */
let statsNoted = false;
function bpfTime(plan: Plan, sb: Sandbox, lab: Lab, s: NpService): BpfTime | undefined {
  let stats: { close(): void };
  try {
    stats = enableRunTimeStats();
  } catch {
    if (!statsNoted) process.stderr.write('no BPF run-time stats (BPF_ENABLE_STATS, 5.8+): the BPF time per connection is left out\n');
    statsNoted = true;
    return undefined;
  }
  try {
    const [addr, port] = dial('lbctl', s, '');
    const before = tcStats(sb.bpfRoot);
    const ld = load(lab, addr, port, ['-n', String(plan.load), '-w', '200']);
    const after = tcStats(sb.bpfRoot);
    // np-load made (about) warm-up + counted + the ones in flight at the end: per connection over what it reports plus the warm-up
    const conns = ld.completed + ld.failed + 200;
    const d = (k: 'ingress' | 'egress', f: 'ns' | 'runs'): number => after[k][f] - before[k][f];
    return {
      ingressNsPerConn: d('ingress', 'ns') / conns, egressNsPerConn: d('egress', 'ns') / conns,
      ingressRunsPerConn: d('ingress', 'runs') / conns, egressRunsPerConn: d('egress', 'runs') / conns,
      ingressNsPerRun: d('ingress', 'ns') / d('ingress', 'runs'), egressNsPerRun: d('egress', 'ns') / d('egress', 'runs'),
    };
  } finally {
    stats.close();
  }
}

/** The median of each measured figure over rounds (counts summed). */
function medianOf(rs: readonly TargetResult[]): TargetResult {
  const m = (f: (r: TargetResult) => number): number => median(rs.map(f));
  const sum = (f: (r: TargetResult) => number): number => rs.reduce((a, r) => a + f(r), 0);
  return {
    latency: { p50_us: m((r) => r.latency.p50_us), p99_us: m((r) => r.latency.p99_us), failed: sum((r) => r.latency.failed) },
    load: { rps: m((r) => r.load.rps), completed: sum((r) => r.load.completed), failed: sum((r) => r.load.failed), p50_us: m((r) => r.load.p50_us), p99_us: m((r) => r.load.p99_us), seconds: sum((r) => r.load.seconds) },
  };
}

/**
 * One mode at one N, in a fresh lab, measured in rounds alternating with
 * the floor (the routed pod, in a lab of its own that lives through the
 * whole N): each round measures both, in turn (which goes first alternates),
 * so the machine's drift between runs (other tenants, the hypervisor) falls
 * on both sides of each ratio. The floor's own measurements are its point.
 */
function point(plan: Plan, mode: Mode, n: number, rep: number, svc: ReturnType<typeof services>, texts: Map<string, string>, floor: ModeLab): Promise<{ point: PointResult; floor: PointResult }> {
  return withLab(mode, n, svc, texts, false, async ({ sb, lab, setupMs }) => {
    const ours: Record<'local' | 'remote', TargetResult[]> = { local: [], remote: [] };
    const theirs: Record<'local' | 'remote', TargetResult[]> = { local: [], remote: [] };
    for (let round = 0; round < plan.rounds; round++) {
      for (const [target, s, pod] of [['local', svc.local, POD1.v4], ['remote', svc.remote, POD2.v4]] as const) {
        // which of the two goes first alternates
        const routed = round % 2 === 0 ? measure(plan, 'routed', floor.lab, s, pod) : undefined;
        ours[target].push(measure(plan, mode, lab, s, pod));
        theirs[target].push(routed ?? measure(plan, 'routed', floor.lab, s, pod));
      }
    }
    const over = (t: 'local' | 'remote', i: number): Round['local'] => ({
      rps: ours[t][i]!.load.rps / theirs[t][i]!.load.rps,
      p50: ours[t][i]!.latency.p50_us / theirs[t][i]!.latency.p50_us,
    });
    const ratios: Round[] = ours.local.map((_, i) => ({ local: over('local', i), remote: over('remote', i) }));
    const result: PointResult = { mode, n, rep, setupMs, local: medianOf(ours.local), remote: medianOf(ours.remote), rounds: ratios };
    if (mode === 'lbctl') {
      const [l, r] = [bpfTime(plan, sb, lab, svc.local), bpfTime(plan, sb, lab, svc.remote)];
      if (l && r) [result.local.bpf, result.remote.bpf] = [l, r];
    }
    if (plan.sustain > 0) {
      const [addr, port] = dial(mode, svc.remote, POD2.v4);
      result.sustained = load(lab, addr, port, ['-d', String(plan.sustain), '-w', '0']);
    }
    if (mode.startsWith('lbctl')) {
      const m = await sb.metrics();
      result.counters = Object.fromEntries(Object.entries(m).filter(([k, v]) => k.startsWith('np_') && v > 0));
      await lab.agent.stop(20_000);
    }
    return { point: result, floor: { mode: 'routed', n, rep, setupMs: 0, local: medianOf(theirs.local), remote: medianOf(theirs.remote) } };
  });
}

/** run_cnt and run_time_ns of the tc programs attached under the agent's bpf root (each program counts its runs on every device), by direction. */
function tcStats(bpfRoot: string): Record<'ingress' | 'egress', { runs: number; ns: number }> {
  const out = { ingress: { runs: 0, ns: 0 }, egress: { runs: 0, ns: 0 } };
  const dir = path.join(bpfRoot, 'links');
  // One program runs on every device it is attached to: its counters once, not once per link.
  const progs = new Set<number>();
  for (const name of readdirSync(dir)) {
    const link = JSON.parse(execFileSync('bpftool', ['-j', 'link', 'show', 'pinned', path.join(dir, name)], { encoding: 'utf8' })) as { prog_id: number };
    if (progs.has(link.prog_id)) continue;
    progs.add(link.prog_id);
    const p = JSON.parse(execFileSync('bpftool', ['-j', 'prog', 'show', 'id', String(link.prog_id)], { encoding: 'utf8' })) as { name?: string; run_cnt?: number; run_time_ns?: number };
    const k = p.name === 'lb_nodeport_ingress' ? 'ingress' : p.name === 'lb_nodeport_egress' ? 'egress' : undefined;
    if (!k) continue;
    out[k].runs += p.run_cnt ?? 0;
    out[k].ns += p.run_time_ns ?? 0;
  }
  return out;
}

/** bench/server.c in a pod's namespace on CPU 1 (closing first: -c), killed at the sandbox's teardown. */
function startServer(sb: Sandbox, ns: string, closeFirst: boolean): void {
  const r = spawnSync('sh', ['-c', `ip netns exec "$0" taskset -c ${CPU} "$1" -p ${POD_PORT} -a 0.0.0.0 ${closeFirst ? '-c' : ''} >/dev/null 2>&1 & echo $!`, ns, SERVER], { encoding: 'utf8' });
  const pid = Number(r.stdout.trim());
  if (!pid) throw new Error(`bench server in ${ns} did not start: ${r.stderr}`);
  sb.addCleanup(() => {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  });
}

// ------------------------------------------------- sustained-rate search

/** One rate held for the search's window in a fresh lab. */
interface Probe {
  rate: number;
  /**
   * No connection failed, the client kept the schedule (the rate achieved
   * within 1% of the rate asked) and the NAT counted no packet it dropped for
   * want of room (every counter below 0).
   */
  ok: boolean;
  load: NpLoadResult;
  /**
   * Over the probe. lbctl: np_snat_exhausted and np_ct_full; kube-proxy's
   * modes: conntrack's insert_failed and drop in node 1 (/proc/net/stat/nf_conntrack).
   */
  counters: Record<string, number>;
}

interface SearchResult {
  mode: Mode;
  /** The highest rate that passed; 0: none did, down to SEARCH_FLOOR. */
  best: number;
  /** The lowest rate that failed; absent: none did, up to SEARCH_CEILING. */
  failedAt?: number;
  probes: Probe[];
}

/** The client's slack (test/e2e/nodeport-sustained.ts's RATE_SLACK): a probe whose client fell behind its schedule did not hold the rate. */
const RATE_SLACK = 0.01;

function probe(plan: Plan, mode: Mode, n: number, svc: ReturnType<typeof services>, texts: Map<string, string>, rate: number): Promise<Probe> {
  return withLab(mode, n, svc, texts, true, async ({ sb, lab }) => {
    const [addr, port] = dial(mode, svc.remote, POD2.v4);
    const drops = async (): Promise<Record<string, number>> => {
      if (!mode.startsWith('lbctl')) return conntrackDrops(lab);
      const m = await sb.metrics();
      return { np_snat_exhausted: m.np_snat_exhausted ?? 0, np_ct_full: m.np_ct_full ?? 0 };
    };
    // Two seconds for what setting up left running (the agent's start-up work beside its first sync), in every mode alike.
    await new Promise((r) => setTimeout(r, 2000));
    const before = await drops();
    // A second's worth of failures ends the probe: it has failed, and the rest of the window would only wait on timeouts.
    const load = await npLoad((cmd, ms) => lab.inNs(lab.ext, cmd, ms), LOAD, {
      addr, port, seconds: plan.searchWindow, rate, timeoutMs: SUSTAINED_TIMEOUT_MS, close: 'server', maxFailed: rate, cpu: CPU,
    });
    const after = await drops();
    const counters = Object.fromEntries(Object.keys(after).map((k) => [k, after[k]! - (before[k] ?? 0)]));
    const ok = load.failed === 0 && load.started === Math.floor(rate * plan.searchWindow) && load.rps >= rate * (1 - RATE_SLACK) && Object.values(counters).every((v) => v === 0);
    if (mode.startsWith('lbctl')) await lab.agent.stop(20_000);
    return { rate, ok, load, counters };
  });
}

/** Conntrack's insert_failed and drop in node 1, summed over its CPUs. */
async function conntrackDrops(lab: Lab): Promise<Record<string, number>> {
  const r = await lab.inNs(lab.n1, ['cat', '/proc/net/stat/nf_conntrack']);
  const [head, ...rows] = r.stdout.trim().split('\n');
  const names = (head ?? '').trim().split(/\s+/);
  const sum = (name: string): number => rows.reduce((a, row) => a + parseInt(row.trim().split(/\s+/)[names.indexOf(name)] ?? '0', 16), 0);
  return { insert_failed: sum('insert_failed'), drop: sum('drop') };
}

/** Builds a lab again when it could not be built (a busy machine: the pods' servers slow to start), twice at most. */
async function retrying<T>(what: string, fn: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn();
    } catch (err) {
      if (attempt >= 3) throw err;
      process.stderr.write(`${what}: ${(err as Error).message.split('\n')[0]}; a fresh lab, attempt ${attempt + 1}\n`);
    }
  }
}

/** The highest rate `mode` holds for the window with no failed connection: doubling or halving from the start rate, then bisections. */
async function search(plan: Plan, mode: Mode, n: number, svc: ReturnType<typeof services>, texts: Map<string, string>): Promise<SearchResult> {
  const probes: Probe[] = [];
  const tryRate = async (rate: number): Promise<boolean> => {
    const p = await retrying(`search ${mode} ${rate}/s`, () => probe(plan, mode, n, svc, texts, rate));
    probes.push(p);
    process.stderr.write(
      `search ${mode} ${rate}/s for ${plan.searchWindow} s: ${p.ok ? 'held' : 'not held'}: ${p.load.completed} of ${p.load.started} completed, ${p.load.rps.toFixed(0)}/s; ` +
        `failed: ${failureSummary(p.load)}; ${JSON.stringify(p.counters)}\n`,
    );
    return p.ok;
  };
  let pass = 0;
  let fail = Infinity;
  let rate = plan.searchStart;
  if (await tryRate(rate)) {
    pass = rate;
    while (rate * 2 <= SEARCH_CEILING) {
      rate *= 2;
      if (!(await tryRate(rate))) {
        fail = rate;
        break;
      }
      pass = rate;
    }
  } else {
    fail = rate;
    while (Math.round(rate / 2) >= SEARCH_FLOOR) {
      rate = Math.round(rate / 2);
      if (await tryRate(rate)) {
        pass = rate;
        break;
      }
      fail = rate;
    }
  }
  for (let i = 0; i < plan.searchSteps && pass > 0 && fail < Infinity; i++) {
    const mid = Math.round(Math.sqrt(pass * fail));
    if (mid <= pass || mid >= fail) break;
    if (await tryRate(mid)) pass = mid;
    else fail = mid;
  }
  return { mode, best: pass, ...(fail < Infinity ? { failedAt: fail } : {}), probes };
}

// ----------------------------------------------------------------- report

export interface E2eResults {
  meta: Record<string, unknown>;
  points: PointResult[];
  /** The sustained-rate search, at one N. */
  search?: { n: number; window: number; timeoutMs: number; start: number; steps: number; modes: SearchResult[] };
}

/** The q-quantile of xs (linear between neighbours). */
const quantile = (xs: readonly number[], q: number): number => {
  const v = [...xs].sort((a, b) => a - b);
  if (v.length === 0) return NaN;
  const i = (v.length - 1) * q;
  return v[Math.floor(i)]! + (v[Math.ceil(i)]! - v[Math.floor(i)]!) * (i - Math.floor(i));
};

export function e2eReport(r: E2eResults): string[] {
  const sizes = [...new Set(r.points.map((p) => p.n))];
  const at = (mode: Mode, n: number): PointResult[] => r.points.filter((p) => p.mode === mode && p.n === n);
  const stat = (mode: Mode, n: number, f: (p: PointResult) => number): number => median(at(mode, n).map(f));
  const ratio = (mode: Mode, n: number, target: 'local' | 'remote', what: 'rps' | 'p50'): number => median(pairedRatios(r, mode, n, target, what));
  const spread = (mode: Mode, n: number, target: 'local' | 'remote', what: 'rps' | 'p50'): string => {
    const xs = pairedRatios(r, mode, n, target, what);
    return mode === 'routed' ? '' : ` (${quantile(xs, 0.25).toFixed(2)}–${quantile(xs, 0.75).toFixed(2)})`;
  };
  const lines: string[] = [];
  lines.push(
    `## NodePort end to end (${r.meta.reps} repetitions of ${r.meta.rounds} rounds, each round measuring the mode and the routed pod in turn; ${r.meta.rr} timed connect+request+close one at a time for latency, ${r.meta.load} with 32 in flight for requests/s, after warm-ups)`,
    '',
    'Ratios over the routed pod are medians of the rounds\' ratios (in brackets, their quartiles: the spread of the machine\'s noise); requests/s and latencies are medians of the rounds.',
    '',
  );
  for (const target of ['local', 'remote'] as const) {
    lines.push(
      `### ${target === 'local' ? 'Local backend (the pod on node 1: lbctl DNATs only; kube-proxy DNATs and masquerades)' : 'Remote backend (the pod on node 2: DNAT and SNAT in every mode)'}`,
      '',
      '| N | mode | requests/s | / routed pod | / best kube-proxy | p50 µs | p50 / routed pod | p99 µs | failed |',
      '|---:|---|---:|---:|---:|---:|---:|---:|---:|',
    );
    for (const n of sizes) {
      const best = Math.max(ratio('iptables', n, target, 'rps'), ratio('nftables', n, target, 'rps'));
      for (const m of MODES) {
        if (at(m, n).length === 0) continue;
        const failed = at(m, n).reduce((a, p) => a + p[target].load.failed + p[target].latency.failed, 0);
        lines.push(
          `| ${n.toLocaleString('en')} | ${m} | ${stat(m, n, (p) => p[target].load.rps).toFixed(0)} | ${ratio(m, n, target, 'rps').toFixed(2)}×${spread(m, n, target, 'rps')} | ${(ratio(m, n, target, 'rps') / best).toFixed(2)}× | ` +
            `${stat(m, n, (p) => p[target].latency.p50_us).toFixed(1)} | ${ratio(m, n, target, 'p50').toFixed(2)}×${spread(m, n, target, 'p50')} | ${stat(m, n, (p) => p[target].latency.p99_us).toFixed(1)} | ${failed} |`,
        );
      }
    }
    lines.push('');
  }
  lines.push('Targets (issue 37):', '', '| target | N | backend | lbctl | verdict |', '|---|---:|---|---:|---|');
  const verdict = (ok: boolean): string => (ok ? 'met' : '**missed**');
  for (const n of sizes) {
    for (const target of ['local', 'remote'] as const) {
      const rps = (m: Mode): number => ratio(m, n, target, 'rps');
      const p50 = (m: Mode): number => ratio(m, n, target, 'p50');
      const best = Math.max(rps('iptables'), rps('nftables'));
      const row = (what: string, v: number, ok: boolean): number => lines.push(`| ${what} | ${n.toLocaleString('en')} | ${target} | ${v.toFixed(2)}× | ${verdict(ok)} |`);
      if (at('lbctl', n).length) row(`requests/s ≥ ${ROUTED_TARGET}× the routed pod (tc, SNAT)`, rps('lbctl'), rps('lbctl') >= ROUTED_TARGET);
      for (const [m, what] of [['lbctl-xdp', 'XDP'], ['lbctl-dsr', 'DSR']] as const) {
        if (at(m, n).length) row(`requests/s ≥ ${ROUTED_TARGET_XDP}× the routed pod (${what})`, rps(m), rps(m) >= ROUTED_TARGET_XDP);
      }
      if (Number.isFinite(best) && at('lbctl', n).length) row('requests/s ≥ the best kube-proxy mode (tc)', rps('lbctl') / best, rps('lbctl') >= best);
      if (at('lbctl', n).length) row(`p50 ≤ ${P50_TARGET}× the routed pod (tc)`, p50('lbctl'), p50('lbctl') <= P50_TARGET);
      for (const [m, what] of [['lbctl-xdp', 'XDP'], ['lbctl-dsr', 'DSR']] as const) {
        if (at(m, n).length) row(`p50 ≤ ${P50_TARGET}× the routed pod (${what})`, p50(m), p50(m) <= P50_TARGET);
      }
    }
  }
  const sustained = r.points.filter((p) => p.sustained);
  if (sustained.length) {
    lines.push('', `Sustained, remote pod, ${r.meta.sustain} s with 32 in flight:`, '');
    lines.push('| N | mode | requests/s | completed | failed (1 s timeouts) |', '|---:|---|---:|---:|---:|');
    for (const n of sizes) {
      for (const m of MODES) {
        const ps = at(m, n).filter((p) => p.sustained);
        if (!ps.length) continue;
        lines.push(`| ${n.toLocaleString('en')} | ${m} | ${median(ps.map((p) => p.sustained!.rps)).toFixed(0)} | ${median(ps.map((p) => p.sustained!.completed))} | ${median(ps.map((p) => p.sustained!.failed))} |`);
      }
    }
  }
  const withBpf = r.points.filter((p) => p.local.bpf && p.remote.bpf);
  if (withBpf.length) {
    lines.push('', "lbctl's tc programs in a requests/s run of their own after the timed rounds (BPF_ENABLE_STATS: its clock reads are kept out of the timed runs), medians:", '', '| N | backend | ingress runs / connection | ns / run | egress runs / connection | ns / run | µs of BPF per connection | µs per connection over the routed pod (from requests/s) |', '|---:|---|---:|---:|---:|---:|---:|---:|');
    for (const n of sizes) {
      for (const target of ['local', 'remote'] as const) {
        const ps = withBpf.filter((p) => p.n === n);
        if (!ps.length) continue;
        const m = (f: (b: BpfTime) => number): number => median(ps.map((p) => f(p[target].bpf!)));
        // a connection's time over the routed pod's, from the paired ratio: routed's µs × (1 / ratio - 1)
        const over = (1e6 / stat('routed', n, (p) => p[target].load.rps)) * (1 / median(pairedRatios(r, 'lbctl', n, target, 'rps')) - 1);
        lines.push(`| ${n.toLocaleString('en')} | ${target} | ${m((b) => b.ingressRunsPerConn).toFixed(1)} | ${m((b) => b.ingressNsPerRun).toFixed(0)} | ${m((b) => b.egressRunsPerConn).toFixed(1)} | ${m((b) => b.egressNsPerRun).toFixed(0)} | ${(m((b) => b.ingressNsPerConn + b.egressNsPerConn) / 1000).toFixed(2)} | ${over.toFixed(2)} |`);
      }
    }
  }
  if (r.search) lines.push('', ...searchReport(r.search));
  const counters = r.points.filter((p) => p.counters);
  if (counters.length) lines.push('', `lbctl's datapath counters after each point: ${counters.map((p) => `N=${p.n} rep ${p.rep + 1}: ${JSON.stringify(p.counters)}`).join('; ')}`);
  lines.push('', `Setup per point (rules loaded, or the agent started and synced), median ms: ${sizes.map((n) => `N=${n}: ${MODES.map((m) => `${m} ${stat(m, n, (p) => p.setupMs).toFixed(0)}`).join(', ')}`).join('; ')}.`);
  return lines;
}

function searchReport(s: NonNullable<E2eResults['search']>): string[] {
  const best = Math.max(...s.modes.filter((m) => m.mode !== 'lbctl').map((m) => m.best));
  const lines = [
    `### Sustained new connections to the remote pod (N = ${s.n.toLocaleString('en')}; the pod closes first; each rate held ${s.window} s, open loop, in a fresh lab; a connection fails when not done in ${s.timeoutMs / 1000} s, reset or refused)`,
    '',
    '| mode | highest rate with no failed connection (/s) | / best kube-proxy | lowest rate that failed (/s) | how it failed | rates probed |',
    '|---|---:|---:|---:|---|---|',
  ];
  for (const m of s.modes) {
    const failed = m.probes.find((p) => p.rate === m.failedAt);
    const how = failed
      ? [
          failed.load.failed ? failureSummary(failed.load) : failed.load.rps < failed.rate * (1 - RATE_SLACK) ? `the client fell behind (${failed.load.rps.toFixed(0)}/s achieved)` : 'none failed',
          Object.entries(failed.counters).map(([k, v]) => `${k} ${v}`).join(', '),
        ].join('; ')
      : '';
    lines.push(
      `| ${m.mode} | ${m.best ? m.best.toLocaleString('en') : `< ${SEARCH_FLOOR}`} | ${best > 0 ? `${(m.best / best).toFixed(2)}×` : '–'} | ${m.failedAt?.toLocaleString('en') ?? `none up to ${SEARCH_CEILING.toLocaleString('en')}`} | ${how} | ${m.probes.map((p) => `${p.rate.toLocaleString('en')}${p.ok ? '' : '✗'}`).join(', ')} |`,
    );
  }
  return lines;
}

// ------------------------------------------------------------------- main

/**
 * This process, and so what it starts (lbctl's agents, their worker
 * threads), on every CPU but the measured one: client, nodes and pods are
 * pinned to CPU 1 themselves (taskset), and kube-proxy's modes, emulated by
 * their rules, run no daemon there either. An agent the scheduler put on
 * CPU 1 took its turns from the connections measured.
 */
function keepOffMeasuredCpu(): void {
  // the CPUs this process may use (a cpuset may hold fewer than os.cpus()): Cpus_allowed_list, as 0-3,5
  const list = /^Cpus_allowed_list:\s*(\S+)/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '';
  const allowed = list.split(',').flatMap((r) => {
    const [a, b = a] = r.split('-').map(Number);
    return Array.from({ length: b! - a! + 1 }, (_, i) => a! + i);
  });
  if (!allowed.includes(CPU)) throw new Error(`CPU ${CPU}, where the lab is measured, is not among this process's CPUs (${list})`);
  const others = allowed.filter((i) => i !== CPU);
  if (others.length === 0) throw new Error(`only CPU ${CPU} is allowed (${list}): the bench and the agents would run on the CPU measured`);
  execFileSync('taskset', ['-a', '-p', '-c', others.join(','), String(process.pid)], { stdio: ['ignore', 'ignore', 'pipe'] });
}

async function main(): Promise<void> {
  const plan = parse();
  if (process.getuid?.() !== 0) throw new Error('bench/nodeport-e2e.ts needs root (network namespaces, BPF)');
  if (plan.sizes.some((n) => n < 2)) throw new Error('--sizes: at least 2 (the measured local and remote services)');
  compile();
  keepOffMeasuredCpu();
  const started = performance.now();
  const results: E2eResults = {
    meta: { date: new Date().toISOString(), kernel: os.release(), cpus: os.cpus().length, cpu: os.cpus()[0]?.model ?? 'unknown', quick: plan.quick, reps: plan.reps, rounds: plan.rounds, rr: plan.rr, load: plan.load, sustain: plan.sustain },
    points: [],
  };
  mkdirSync(plan.out, { recursive: true });
  for (const n of plan.sizes) {
    const svc = services(n);
    const texts = new Map<string, string>();
    // The floor: the routed pod in a lab of its own, measured in turn with every mode's lab at this N.
    await withLab('routed', n, svc, texts, false, async (floor) => {
      const modes = plan.modes.filter((m) => m !== 'routed');
      for (let rep = 0; rep < plan.reps; rep++) {
        const order = [...modes.slice(rep % modes.length), ...modes.slice(0, rep % modes.length)];
        for (const mode of order) {
          // A lab that could not be built (a busy machine: the pods' servers slow to start) is built again, twice at most.
          let p: { point: PointResult; floor: PointResult } | undefined;
          for (let attempt = 1; !p; attempt++) {
            try {
              p = await point(plan, mode, n, rep, svc, texts, floor);
            } catch (err) {
              if (attempt >= 3) throw err;
              process.stderr.write(`e2e N=${n} rep ${rep + 1} ${mode}: ${(err as Error).message.split('\n')[0]}; a fresh lab, attempt ${attempt + 1}\n`);
            }
          }
          results.points.push(p.point, p.floor);
          const q = p.point;
          const r = (t: 'local' | 'remote'): string => q.rounds!.map((x) => x[t].rps.toFixed(2)).join(' ');
          process.stderr.write(
            `e2e N=${n} rep ${rep + 1}/${plan.reps} ${mode}: setup ${q.setupMs.toFixed(0)} ms; local ${q.local.load.rps.toFixed(0)} req/s (routed ${p.floor.local.load.rps.toFixed(0)}; rounds ${r('local')}) p50 ${q.local.latency.p50_us} µs; ` +
              `remote ${q.remote.load.rps.toFixed(0)} req/s (routed ${p.floor.remote.load.rps.toFixed(0)}; rounds ${r('remote')}) p50 ${q.remote.latency.p50_us} µs` +
              `${q.sustained ? `; sustained ${q.sustained.rps.toFixed(0)} req/s (${q.sustained.failed} failed)` : ''}\n`,
          );
          writeFileSync(path.join(plan.out, 'nodeport-e2e.json'), `${JSON.stringify(results, null, 1)}\n`);
        }
      }
    });
  }
  if (plan.searchWindow > 0) {
    // At the smallest N: the rate to one backend is the NAT's, not the rule walk's (the table above has that).
    const n = Math.min(...plan.sizes);
    const svc = services(n);
    const texts = new Map<string, string>();
    results.search = { n, window: plan.searchWindow, timeoutMs: SUSTAINED_TIMEOUT_MS, start: plan.searchStart, steps: plan.searchSteps, modes: [] };
    for (const mode of SEARCH_MODES.filter((m) => plan.modes.includes(m))) {
      results.search.modes.push(await search(plan, mode, n, svc, texts));
      writeFileSync(path.join(plan.out, 'nodeport-e2e.json'), `${JSON.stringify(results, null, 1)}\n`);
    }
  }
  results.meta.seconds = Math.round((performance.now() - started) / 1000);
  writeFileSync(path.join(plan.out, 'nodeport-e2e.json'), `${JSON.stringify(results, null, 1)}\n`);
  const md = [`# NodePort end to end (${results.meta.date}, ${results.meta.cpus} × ${results.meta.cpu}, kernel ${results.meta.kernel}, ${results.meta.seconds} s)`, '', ...e2eReport(results), ''].join('\n');
  writeFileSync(path.join(plan.out, 'nodeport-e2e.md'), md);
  process.stdout.write(md);
}

main().catch((err: unknown) => {
  process.stderr.write(`bench/nodeport-e2e: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
