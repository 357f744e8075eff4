// make bench / bench-quick: the tc datapath (bpf/nodeport.c) per packet, and
// its Maglev tables from cold, on the real kernel, each against a baseline
// measured in the same run.
//
//   node --import=@tapjs/typescript/import bench/nodeport-tc.ts [--quick] [--out DIR]
//        [--sizes 1,1000,10000,100000] [--rounds 15] [--repeat 500000]
//
// Per packet: BPF_PROG_TEST_RUN with repeat = many, the kernel's own
// duration per run, on bench/nodeport_bench.c (bpf/nodeport.c with its maps
// unpinned; a wrapper puts the headers back after each run, see there) with
// N services programmed by the agent's own path (the model and the
// reconciler over the object's maps, the Maglev tables through
// KernelNorthSouthMaps), N = 1, 1,000, 10,000, 100,000. The packets:
//   (a) a non-service packet to a node address (TCP to port 22),
//   (b) an established NodePort flow to a remote backend (CT hit, DNAT+SNAT, FIB, redirect),
//   (c) that flow's reply from the remote backend (rev-SNAT + rev-DNAT, FIB, redirect),
//   (d) an established NodePort flow to a local backend (CT hit, DNAT, up the stack),
//   (d') that flow's reply at egress (rev-DNAT).
// Baseline: an empty tc program run the same way (the test run's own
// floor), which (a)-(d') are reported over (issue 37's targets are). The
// translated packets run inside a wrapper that puts their headers back
// after each run; its own cost (the same wrapper around a function that
// does nothing, over the empty program) is in their figures and reported
// beside them. The cases run in interleaved rounds; medians are reported.
// A second build with the FIB lookup stubbed (-DBENCH_NO_FIB) gives the
// lookup's share.
//
// Maglev: 10,000 NodePort services x 3 backends, M = 16381, programmed from
// cold through the reconciler over a loaded lb_maglev; then one service's
// backend set changed (a new table built and swapped in), timed per change
// sync. Baseline: the same services with lbctl.io/lb-algorithm random (no
// tables), the same path, in the same run.
//
// bpf_fib_lookup answers from the namespace the run happens in, so this
// file runs itself again under `unshare --net` (as test/bpf/nodeport-unit.ts
// does): nothing is pinned, and the host's devices are never touched.
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { LbDeviceFlags, LbNpConfigFlags, lb_device, lb_node_addr, lb_node_addr_key, lb_np_config, u32 } from '../src/datapath/abi.gen.js';
import { KernelLbMaps, LB_MAP_NAMES, type LbMapSet } from '../src/datapath/maps.js';
import { FrontendPorts } from '../src/datapath/frontend-ports.js';
import { KernelMaglevMaps, KernelNorthSouthMaps } from '../src/datapath/maglev-maps.js';
import { DEFAULT_MAGLEV_SEED, maglevTable, parseMaglevSeed } from '../src/lb/maglev.js';
import { MaglevPool } from '../src/lb/maglev-pool.js';
import { DesiredModel, serviceId } from '../src/model/desired.js';
import { validateEndpointSlice, validateService } from '../src/model/k8s.js';
import { Reconciler } from '../src/reconcile/reconciler.js';
import { BpfObject, progTestRun } from '../src/native/bpf.js';
import { frame, ip4, parseFrame, TCP_ACK, TCP_SYN, type FrameSpec } from '../test/helpers/packet.js';
import { npServices, serviceObject, sliceObject, type NpService } from './np-services.js';
import { ROOT } from './world.js';
import { overEmpty, TARGET_NS, wrapperCost } from './np-figures.js';

const CHILD = 'LBCTL_BENCH_NP_PARENT_NETNS';
const BUILD = path.join(ROOT, 'build/bench');
const OBJECTS = { standard: path.join(BUILD, 'nodeport_bench.bpf.o'), noFib: path.join(BUILD, 'nodeport_bench_nofib.bpf.o'), xdp: path.join(BUILD, 'nodeport_bench_xdp.bpf.o') } as const;

// The namespace (as test/bpf/nodeport-unit.ts lays it out).
const NP0_MAC = '02:00:00:00:01:01';
const GW_MAC = '02:00:00:00:00:fe';
const PEER_MAC = '02:00:00:00:00:02';
const POD0_MAC = '02:00:00:00:02:01';
const NODE4 = '192.168.50.1';
const GW4 = '192.168.50.254';
const PEER4 = '192.168.50.2';
const CLIENT4 = '10.0.0.5';
const LOCAL_BE = '10.244.1.2';
const REMOTE_BE = '10.244.2.7';
const BE_PORT = 8080;
const NODEPORTS = { first: 20000, last: 59999 };
const SNAT = { first: 61000, last: 65535 };
const M = 16381;
const SEEDS = parseMaglevSeed(DEFAULT_MAGLEV_SEED);

// tc verdicts as the test run returns them.
const TC_ACT_UNSPEC = -1;
const TC_ACT_OK = 0;
const TC_ACT_REDIRECT = 7;
const XDP_PASS = 2;
const XDP_TX = 3;

const FLAT = 0.15;
const MAGLEV_COLD_TARGET_MS = 3000;
const MAGLEV_CHANGE_TARGET_MS = 2;

interface Plan {
  quick: boolean;
  out: string;
  sizes: number[];
  rounds: number;
  repeat: number;
  maglevServices: number;
  maglevChanges: number;
  cpu: number;
}

function parse(): Plan {
  const o = new Command()
    .option('--quick', 'fewer sizes, rounds and repeats')
    .option('--out <dir>', 'where results go', path.join(ROOT, 'bench/results'))
    .option('--sizes <list>', 'numbers of services, comma-separated')
    .option('--rounds <n>', 'interleaved rounds per size (medians reported)')
    .option('--repeat <n>', 'test-run repeat per measurement')
    .option('--maglev-services <n>', 'services of the Maglev measurement (0: none)')
    .option('--cpu <n>', 'the CPU the test runs are pinned to', '1')
    .allowUnknownOption(false)
    .parse()
    .opts<{ quick?: boolean; out: string; sizes?: string; rounds?: string; repeat?: string; maglevServices?: string; cpu: string }>();
  const quick = Boolean(o.quick);
  return {
    quick,
    out: o.out,
    sizes: o.sizes ? o.sizes.split(',').map((x) => Number(x.replace(/_/g, ''))) : quick ? [1, 10_000] : [1, 1000, 10_000, 100_000],
    rounds: Number(o.rounds ?? (quick ? 5 : 15)),
    repeat: Number(o.repeat ?? (quick ? 200_000 : 500_000)),
    maglevServices: Number(o.maglevServices ?? (quick ? 1000 : 10_000)),
    maglevChanges: quick ? 10 : 30,
    cpu: Number(o.cpu),
  };
}

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

function compile(): void {
  mkdirSync(BUILD, { recursive: true });
  const triple = execFileSync('gcc', ['-dumpmachine'], { encoding: 'utf8' }).trim();
  for (const [out, extra] of [[OBJECTS.standard, []], [OBJECTS.noFib, ['-DBENCH_NO_FIB']], [OBJECTS.xdp, ['-DNP_XDP']]] as const) {
    execFileSync('clang', ['-O2', '-g', '-target', 'bpf', '-Wall', '-Werror', `-I/usr/include/${triple}`, `-I${path.join(ROOT, 'bpf')}`, ...extra,
      '-c', path.join(ROOT, 'bench/nodeport_bench.c'), '-o', out], { stdio: 'inherit' });
  }
}

const ip = (...args: string[]): string => execFileSync('ip', args, { encoding: 'utf8' });
const ifindex = (dev: string): number => (JSON.parse(ip('-j', 'link', 'show', dev)) as Array<{ ifindex: number }>)[0]!.ifindex;

/** The namespace: np0 is the node's device (gateway to the clients, a second node's pods behind the peer), pod0 leads to this node's pods. */
function makeNamespace(): { np0: number; pod0: number } {
  ip('link', 'set', 'lo', 'up');
  for (const [dev, peer] of [['np0', 'np0p'], ['pod0', 'pod0p']] as const) ip('link', 'add', dev, 'type', 'veth', 'peer', 'name', peer);
  ip('link', 'set', 'np0', 'address', NP0_MAC);
  ip('link', 'set', 'pod0', 'address', POD0_MAC);
  for (const dev of ['np0', 'np0p', 'pod0', 'pod0p']) ip('link', 'set', dev, 'up');
  ip('addr', 'add', `${NODE4}/24`, 'dev', 'np0');
  ip('addr', 'add', '10.244.1.1/24', 'dev', 'pod0');
  ip('neigh', 'add', GW4, 'lladdr', GW_MAC, 'dev', 'np0', 'nud', 'permanent');
  ip('neigh', 'add', PEER4, 'lladdr', PEER_MAC, 'dev', 'np0', 'nud', 'permanent');
  ip('neigh', 'add', LOCAL_BE, 'lladdr', '02:00:00:00:02:02', 'dev', 'pod0', 'nud', 'permanent');
  ip('route', 'add', '10.0.0.0/24', 'via', GW4);
  ip('route', 'add', '10.244.2.0/24', 'via', PEER4);
  writeFileSync('/proc/sys/net/ipv4/conf/all/forwarding', '1');
  return { np0: ifindex('np0'), pod0: ifindex('pod0') };
}

// ------------------------------------------------------------ programming

/** Map sizes: the object's defaults where N fits them, else what --max-services / --max-backends would give (the services map at 1.25x its entries). */
function sizesFor(services: readonly NpService[]): Record<string, number> | undefined {
  let frontends = 0;
  let entries = 0;
  let backends = 0;
  for (const s of services) {
    const fes = 1 + (s.nodePort ? 1 : 0) + (s.loadBalancerIP ? 1 : 0);
    frontends += fes;
    entries += fes * (1 + s.endpoints.length) + 1 + (s.loadBalancerIP ? 1 : 0); // masters, slots, a wildcard per address
    backends += s.endpoints.length;
  }
  const pow2 = (x: number): number => 2 ** Math.ceil(Math.log2(Math.max(x, 2)));
  if (entries <= (2 * 65536 + 262144) && frontends <= 65536 && backends <= 262144) return undefined;
  return {
    lb4_services: Math.ceil(entries * 1.25),
    lb4_backends: pow2(backends),
    lb4_reverse_nat: pow2(frontends),
  };
}

interface Loaded {
  obj: BpfObject;
  reconciler: Reconciler;
  model: DesiredModel;
  programMs: number;
  entries: Record<string, number>;
  maxEntries: Record<string, number>;
}

function validated<T>(v: { ok: true; value: T } | { ok: false; reason: string }): T {
  if (!v.ok) throw new Error(v.reason);
  return v.value;
}

/** Loads `object` sized for `services` and programs them the agent's way; node address, device and settings as the agent writes them. */
async function loadAndProgram(object: string, services: readonly NpService[], ns: { np0: number }, nodeOf?: (ip: string) => string): Promise<Loaded> {
  const maxEntries = sizesFor(services);
  const obj = BpfObject.open(object, maxEntries ? { maxEntries } : undefined);
  await obj.load();
  const config = lb_np_config.encode({
    ...lb_np_config.decode(Buffer.alloc(lb_np_config.size)),
    nodeportMin: NODEPORTS.first, nodeportMax: NODEPORTS.last, snatMin: SNAT.first, snatMax: SNAT.last, flags: LbNpConfigFlags.LB_NP_F_PORTS, snatRetries: 16,
    maglevM: M, maglevSeed4: SEEDS.flow4, maglevSeed6: SEEDS.flow6,
  });
  obj.map('lb_np_config').update(u32.encode(0), config);
  const address = Buffer.alloc(16);
  address.writeUInt32BE(ip4(NODE4));
  obj.map('lb_node_addrs').update(lb_node_addr_key.encode({ address, family: 4 }), lb_node_addr.encode({ ifindex: ns.np0, flags: 0 }));
  obj.map('lb_devices').update(u32.encode(ns.np0), lb_device.encode({ addr4: ip4(NODE4), addr6: Buffer.alloc(16), mtu: 1500, flags: 0 }));
  const set = {} as LbMapSet;
  for (const name of LB_MAP_NAMES) set[name] = obj.map(name);
  const northSouth = new KernelNorthSouthMaps(new KernelMaglevMaps(obj.map('lb_maglev'), obj.map('lb_maglev_index'), M), { 4: obj.map('lb4_src_range'), 6: obj.map('lb6_src_range') });
  // As the agent: lb_np_ports filled, each frontend's port marked as it is written (LB_NP_F_PORTS set above).
  const lbMaps = new KernelLbMaps(set);
  lbMaps.useFrontendPorts(new FrontendPorts(obj.map('lb_np_ports')));
  const reconciler = new Reconciler(lbMaps, {
    maxEntries: Object.fromEntries(LB_MAP_NAMES.map((n) => [n, obj.map(n).maxEntries])),
    northSouth: { maps: northSouth, maglevM: M, maglevSeed: SEEDS.table },
  });
  reconciler.restore();
  const model = new DesiredModel({ nodePortRange: NODEPORTS });
  const t0 = performance.now();
  for (const s of services) {
    model.setService(serviceId(s.namespace, s.name), validated(validateService(serviceObject(s))));
    model.setSlice(serviceId(s.namespace, `${s.name}-x7k2p`), validated(validateEndpointSlice(sliceObject(s, nodeOf))));
  }
  const flushed = model.flush();
  const r = reconciler.sync(model.frontends, { prune: true, changed: flushed.changed });
  if (r.notProgrammed.length > 0) throw new Error(`${r.notProgrammed.length} frontends not programmed: ${r.notProgrammed[0]!.frontend}: ${r.notProgrammed[0]!.reason}`);
  const programMs = performance.now() - t0;
  const entries: Record<string, number> = {};
  for (const name of ['lb4_services', 'lb4_backends', 'lb4_reverse_nat', 'lb_maglev_index']) entries[name] = obj.map(name).keys().length;
  return { obj, reconciler, model, programMs, entries, maxEntries: Object.fromEntries(['lb4_services', 'lb4_backends', 'lb4_reverse_nat', 'lb4_ct'].map((n) => [n, obj.map(n).maxEntries])) };
}

// ---------------------------------------------------------------- packets

type CaseId = 'empty' | 'wrapped' | 'a' | 'b' | 'c' | 'd' | 'd_egress' | `prim_${string}`;

interface Case {
  readonly id: CaseId | `xdp_${string}`;
  readonly prog: string;
  readonly data: Buffer;
  readonly rc: number;
  /** Another object's program (the XDP build), run with its own context. */
  readonly obj?: BpfObject;
  readonly ctx?: Buffer;
}

const fromClient = (spec: Omit<FrameSpec, 'srcMac' | 'dstMac'>): Buffer => frame({ srcMac: GW_MAC, dstMac: NP0_MAC, ...spec });
const fromPeer = (spec: Omit<FrameSpec, 'srcMac' | 'dstMac'>): Buffer => frame({ srcMac: PEER_MAC, dstMac: NP0_MAC, ...spec });
const fromPod = (spec: Omit<FrameSpec, 'srcMac' | 'dstMac'>): Buffer => frame({ srcMac: NP0_MAC, dstMac: GW_MAC, ...spec });

function ctxFor(np0: number): Buffer {
  const ctx = Buffer.alloc(192);
  ctx.writeUInt32LE(np0, 40); // struct __sk_buff ifindex: the packet is on np0
  return ctx;
}

/**
 * Opens the two established flows through the real entry points (SYN in,
 * SYN-ACK back), trying client ports until one flow has the remote backend
 * and one the local one (the measured service has both), and returns the
 * packets to time with the verdict each must get.
 */
function flows(obj: BpfObject, np0: number, nodePort: number): Case[] {
  const ctx = ctxFor(np0);
  const run = (prog: string, data: Buffer): { rc: number; p: ReturnType<typeof parseFrame> } => {
    const r = progTestRun(obj.progFd(prog), { data, ctx });
    return { rc: r.retval | 0, p: parseFrame(r.data) };
  };
  let remote: { sport: number; snat: number } | undefined;
  let local: { sport: number } | undefined;
  for (let sport = 40000; sport < 40200 && !(remote && local); sport++) {
    const syn = run('lb_nodeport_ingress', fromClient({ src: CLIENT4, dst: NODE4, proto: 'tcp', sport, dport: nodePort, flags: TCP_SYN }));
    if (syn.rc === TC_ACT_REDIRECT && syn.p.dst === REMOTE_BE && !remote) {
      const snat = syn.p.sport!;
      const back = run('lb_nodeport_ingress', fromPeer({ src: REMOTE_BE, dst: NODE4, proto: 'tcp', sport: BE_PORT, dport: snat, flags: TCP_SYN | TCP_ACK }));
      if (back.rc !== TC_ACT_REDIRECT || back.p.dst !== CLIENT4) throw new Error(`the remote flow's SYN-ACK: rc ${back.rc}, to ${back.p.dst}`);
      remote = { sport, snat };
    } else if (syn.rc === TC_ACT_OK && syn.p.dst === LOCAL_BE && !local) {
      const back = run('lb_nodeport_egress', fromPod({ src: LOCAL_BE, dst: CLIENT4, proto: 'tcp', sport: BE_PORT, dport: sport, flags: TCP_SYN | TCP_ACK }));
      if (back.rc !== TC_ACT_UNSPEC || back.p.src !== NODE4) throw new Error(`the local flow's SYN-ACK: rc ${back.rc}, from ${back.p.src}`);
      local = { sport };
    }
  }
  if (!remote || !local) throw new Error(`no ${remote ? 'local' : 'remote'} flow after 200 client ports`);
  const ack = { proto: 'tcp' as const, flags: TCP_ACK };
  const nonService = fromClient({ src: CLIENT4, dst: NODE4, sport: 40999, dport: 22, ...ack });
  return [
    { id: 'empty', prog: 'bench_empty', data: nonService, rc: TC_ACT_UNSPEC },
    { id: 'wrapped', prog: 'bench_wrapped_empty', data: nonService, rc: TC_ACT_UNSPEC },
    // untouched by the datapath: the real entry, no wrapper
    { id: 'a', prog: 'lb_nodeport_ingress', data: nonService, rc: TC_ACT_UNSPEC },
    { id: 'b', prog: 'bench_np_ingress', data: fromClient({ src: CLIENT4, dst: NODE4, sport: remote.sport, dport: nodePort, ...ack }), rc: TC_ACT_REDIRECT },
    { id: 'c', prog: 'bench_np_ingress', data: fromPeer({ src: REMOTE_BE, dst: NODE4, sport: BE_PORT, dport: remote.snat, ...ack }), rc: TC_ACT_REDIRECT },
    { id: 'd', prog: 'bench_np_ingress', data: fromClient({ src: CLIENT4, dst: NODE4, sport: local.sport, dport: nodePort, ...ack }), rc: TC_ACT_OK },
    { id: 'd_egress', prog: 'bench_np_egress', data: fromPod({ src: LOCAL_BE, dst: CLIENT4, sport: BE_PORT, dport: local.sport, ...ack }), rc: TC_ACT_UNSPEC },
    ...primitives(nonService, fromClient({ src: CLIENT4, dst: NODE4, sport: remote.sport, dport: nodePort, ...ack })),
  ];
}

/** struct xdp_md for a test run of `data` arriving on `ifindex`. */
function xdpCtx(data: Buffer, ifindex: number): Buffer {
  const ctx = Buffer.alloc(24);
  ctx.writeUInt32LE(data.length, 4); // data_end: the frame's length (data and data_meta 0)
  ctx.writeUInt32LE(ifindex, 12); // ingress_ifindex
  return ctx;
}

/**
 * The XDP build (--nodeport-acceleration) on the tc object's maps, on the
 * flows flows() opened: (a), (b) and (c) at XDP over its own empty program.
 * np0 is marked an XDP device, so (b) and (c), whose way out is np0 again,
 * go back out of it (XDP_TX).
 */
async function xdpCases(tc: BpfObject, np0: number, cases: readonly Case[]): Promise<{ xdp: BpfObject; cases: Case[] }> {
  const declared = BpfObject.open(OBJECTS.xdp);
  const names = new Set(declared.mapNames());
  declared.close();
  const xdp = BpfObject.open(OBJECTS.xdp, { reuseMaps: Object.fromEntries(tc.mapNames().filter((n) => names.has(n) && !n.includes('.') && !n.startsWith('bench_')).map((n) => [n, tc.map(n).fd])) });
  await xdp.load();
  const devices = tc.map('lb_devices');
  const dev = lb_device.decode(devices.lookup(u32.encode(np0))!);
  devices.update(u32.encode(np0), lb_device.encode({ ...dev, flags: dev.flags | LbDeviceFlags.LB_DEV_F_XDP }));
  const of = (id: string): Buffer => cases.find((c) => c.id === id)!.data;
  const mk = (id: string, prog: string, data: Buffer, rc: number): Case => ({ id: `xdp_${id}`, prog, data, rc, obj: xdp, ctx: xdpCtx(data, np0) });
  return {
    xdp,
    cases: [
      mk('empty', 'bench_xdp_empty', of('a'), XDP_PASS),
      mk('wrapped', 'bench_xdp_wrapped_empty', of('a'), TC_ACT_UNSPEC),
      mk('a', 'lb_nodeport_xdp', of('a'), XDP_PASS),
      mk('b', 'bench_xdp_ingress', of('b'), XDP_TX),
      mk('c', 'bench_xdp_ingress', of('c'), XDP_TX),
    ],
  };
}

/** The primitives (bench_prim_*, measured over bench_empty): on the non-service packet, or on (b)'s established packet. */
const PRIMITIVES: ReadonlyArray<{ id: string; what: string; on: 'a' | 'b'; rc: number }> = [
  { id: 'load3', what: '3 bpf_skb_load_bytes (IPv4 header, ports, TCP flags: np4_parse before issue 37)', on: 'b', rc: TC_ACT_UNSPEC },
  { id: 'direct3', what: 'the same 3 reads by direct packet access (np4_parse)', on: 'b', rc: TC_ACT_UNSPEC },
  { id: 'svc_lookup', what: 'one lb4_services lookup, a miss', on: 'a', rc: TC_ACT_UNSPEC },
  { id: 'nodeaddr', what: 'one lb_node_addrs lookup, a hit', on: 'a', rc: TC_ACT_OK },
  { id: 'ct_lookup', what: 'one lb4_ct lookup, a hit', on: 'b', rc: TC_ACT_OK },
  { id: 'ktime', what: 'one bpf_ktime_get_ns', on: 'b', rc: TC_ACT_UNSPEC },
  { id: 'ktime_coarse', what: 'one bpf_ktime_get_coarse_ns (5.11+)', on: 'b', rc: TC_ACT_UNSPEC },
  { id: 'store4', what: 'one 4-byte bpf_skb_store_bytes', on: 'b', rc: TC_ACT_UNSPEC },
  { id: 'l4_csum', what: 'one bpf_l4_csum_replace (pseudo header)', on: 'b', rc: TC_ACT_UNSPEC },
  { id: 'l3_csum', what: 'one bpf_l3_csum_replace', on: 'b', rc: TC_ACT_UNSPEC },
  { id: 'l4_csum_diff', what: 'one bpf_l4_csum_replace by a sum (pseudo header)', on: 'b', rc: TC_ACT_UNSPEC },
];

function primitives(a: Buffer, b: Buffer): Case[] {
  return PRIMITIVES.map((p) => ({ id: `prim_${p.id}` as CaseId, prog: `bench_prim_${p.id}`, data: p.on === 'a' ? a : b, rc: p.rc }));
}

/** A test run, again when a signal interrupted it (the kernel gives up a long run with EINTR). */
function testRun(fd: number, opts: Parameters<typeof progTestRun>[1]): ReturnType<typeof progTestRun> {
  for (let i = 0; ; i++) {
    try {
      return progTestRun(fd, opts);
    } catch (err) {
      if (i >= 5 || !String((err as Error).message).includes('EINTR')) throw err;
    }
  }
}

/** Interleaved rounds of every case; ns per run (the kernel's duration) of each. */
function measure(obj: BpfObject, np0: number, cases: readonly Case[], rounds: number, repeat: number): Record<string, number[]> {
  const ctx = ctxFor(np0);
  const out: Record<string, number[]> = {};
  for (const c of cases) {
    // warm-up, and the verdict the case must get
    const r = testRun((c.obj ?? obj).progFd(c.prog), { data: c.data, ctx: c.ctx ?? ctx, repeat: 1000 });
    if ((r.retval | 0) !== c.rc) throw new Error(`case ${c.id}: verdict ${r.retval | 0}, expected ${c.rc}`);
    out[c.id] = [];
  }
  for (let i = 0; i < rounds; i++) {
    const order = i % 2 ? [...cases].reverse() : cases;
    for (const c of order) {
      const r = testRun((c.obj ?? obj).progFd(c.prog), { data: c.data, ctx: c.ctx ?? ctx, repeat });
      if ((r.retval | 0) !== c.rc) throw new Error(`case ${c.id}, round ${i}: verdict ${r.retval | 0}, expected ${c.rc}`);
      out[c.id]!.push(r.duration);
    }
  }
  return out;
}

/** Per case: the share of each symbol in cpu-clock samples of this process (perf record -p) during one long test run. */
type Profile = Record<string, Array<{ sym: string; pct: number }>>;

async function perfProfile(obj: BpfObject, np0: number, cases: readonly Case[], repeat: number): Promise<Profile | undefined> {
  const ctx = ctxFor(np0);
  const out: Profile = {};
  for (const c of cases.filter((x) => ['empty', 'wrapped', 'a', 'b', 'c', 'd'].includes(x.id))) {
    const data = path.join(os.tmpdir(), `lbctl-bench-np-${process.pid}-${c.id}.perf`);
    const perf = spawn('perf', ['record', '-q', '-e', 'cpu-clock', '-F', '20000', '-p', String(process.pid), '-o', data], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    perf.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    await new Promise((r) => setTimeout(r, 500));
    if (perf.exitCode !== null) {
      process.stderr.write(`perf record did not start (${err.trim()}): no profile\n`);
      return undefined;
    }
    testRun(obj.progFd(c.prog), { data: c.data, ctx, repeat });
    const done = new Promise((r) => perf.once('exit', r));
    perf.kill('SIGINT');
    await done;
    const report = spawnSync('perf', ['report', '-i', data, '--stdio', '--sort', 'sym', '--percent-limit', '1.5'], { encoding: 'utf8' });
    rmSync(data, { force: true });
    rmSync(`${data}.old`, { force: true });
    out[c.id] = report.stdout
      .split('\n')
      .map((l) => /^\s*([\d.]+)%\s+\[[.k]\]\s+(.+?)\s*$/.exec(l))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => ({ pct: Number(m[1]), sym: m[2]! }));
  }
  return out;
}

interface SizePoint {
  n: number;
  programMs: number;
  entries: Record<string, number>;
  maxEntries: Record<string, number>;
  /** ns per run, every round. */
  samples: Record<string, number[]>;
  /** (a)-(c) at XDP and its empty program (xdp_*), measured on their own in interleaved rounds. */
  xdp?: Record<string, number[]>;
  /** The same cases with the FIB lookup stubbed (only at the first size). */
  noFib?: Record<string, number[]>;
  /** perf's split of each case (only at the first size). */
  profile?: Profile;
}

/** The measured service (index 0): a NodePort with one local and one remote backend; the others: fillers. */
function tcServices(n: number): NpService[] {
  return npServices(n, {
    type: 'LoadBalancer',
    nodePorts: NODEPORTS,
    measured: [[{ ip: LOCAL_BE, port: BE_PORT }, { ip: REMOTE_BE, port: BE_PORT }]],
    fillerAlgorithm: 'random',
  });
}

async function sizePoint(plan: Plan, n: number, ns: { np0: number }, withNoFib: boolean): Promise<SizePoint> {
  const services = tcServices(n);
  const log = (s: string): void => void process.stderr.write(`tc N=${n}: ${s}\n`);
  let profile: Profile | undefined;
  let xdpSamples: Record<string, number[]> | undefined;
  const one = async (object: string): Promise<{ samples: Record<string, number[]>; l: Loaded }> => {
    const l = await loadAndProgram(object, services, ns);
    try {
      if (object === OBJECTS.noFib) {
        const fib = l.obj.map('bench_fib');
        const answer = (dev: number, smac: string, dmac: string): Buffer => {
          const b = Buffer.alloc(16);
          b.writeUInt32LE(dev, 0);
          Buffer.from(smac.split(':').map((x) => parseInt(x, 16))).copy(b, 4);
          Buffer.from(dmac.split(':').map((x) => parseInt(x, 16))).copy(b, 10);
          return b;
        };
        const key = (a: string): Buffer => { const k = Buffer.alloc(4); k.writeUInt32BE(ip4(a)); return k; };
        fib.update(key(REMOTE_BE), answer(ns.np0, NP0_MAC, PEER_MAC));
        fib.update(key(CLIENT4), answer(ns.np0, NP0_MAC, GW_MAC));
        fib.update(key(LOCAL_BE), answer(ifindex('pod0'), POD0_MAC, '02:00:00:00:02:02'));
      }
      const cases = flows(l.obj, ns.np0, services[0]!.nodePort);
      const samples = measure(l.obj, ns.np0, cases, plan.rounds, plan.repeat);
      if (object === OBJECTS.standard) {
        const x = await xdpCases(l.obj, ns.np0, cases);
        try {
          xdpSamples = measure(l.obj, ns.np0, x.cases, plan.rounds, plan.repeat);
        } finally {
          x.xdp.close();
        }
      }
      if (withNoFib && object === OBJECTS.standard) profile = await perfProfile(l.obj, ns.np0, cases, plan.repeat * 20);
      return { samples, l };
    } finally {
      l.obj.close();
    }
  };
  const std = await one(OBJECTS.standard);
  log(`programmed in ${std.l.programMs.toFixed(0)} ms (${std.l.entries.lb4_services} service entries); ${summary(std.samples)}`);
  const point: SizePoint = { n, programMs: std.l.programMs, entries: std.l.entries, maxEntries: std.l.maxEntries, samples: std.samples, ...(xdpSamples ? { xdp: xdpSamples } : {}) };
  if (xdpSamples) log(`at XDP: ${summary(xdpSamples)}`);
  if (withNoFib) {
    point.noFib = (await one(OBJECTS.noFib)).samples;
    if (profile) point.profile = profile;
    log(`without the FIB lookup: ${summary(point.noFib)}`);
  }
  return point;
}

function summary(s: Record<string, number[]>): string {
  return Object.entries(s).map(([k, v]) => `${k} ${median(v)}`).join(', ');
}

// ----------------------------------------------------------------- Maglev

interface MaglevSteps {
  /** KernelMaglevMaps.put: the table's blocks written in place (and a new frontend's index entry, a new chunk now and then). */
  writeMs: number;
  tables: number;
}

interface MaglevRun {
  coldMs: number;
  phases: Record<string, number>;
  steps: MaglevSteps;
  changeMs: number[];
  changeSteps: MaglevSteps[];
  tables: number;
  /** Of the cold sync's tables, those the pool's workers built, and how many workers it had besides this thread. */
  pool: { byWorkers: number; workers: number };
  /** The tables' kernel memory after the cold sync (the chunks' memlock), the chunks, their slots and the tables in them. */
  memory?: { bytes: number; chunks: number; slots: number; tables: number };
}

interface MaglevPoint {
  services: number;
  backendsEach: number;
  m: number;
  maglev: MaglevRun;
  /** Baseline: the same services with lbctl.io/lb-algorithm random (no tables), before and after the Maglev run. */
  baseline: MaglevRun[];
  /** maglevTable() for the same backend sets alone, in this process, ms. */
  buildOnlyMs: number;
}

/** KernelMaglevMaps.put, timed (the same call). */
function instrument(maglev: KernelMaglevMaps, stepsNow: () => MaglevSteps): void {
  const put = maglev.put.bind(maglev);
  maglev.put = (key: number, table: Uint32Array): void => {
    const t0 = performance.now();
    put(key, table);
    const steps = stepsNow();
    steps.writeMs += performance.now() - t0;
    steps.tables++;
  };
}

const noSteps = (): MaglevSteps => ({ writeMs: 0, tables: 0 });

async function maglevRun(plan: Plan, algorithm: 'maglev' | 'random'): Promise<MaglevRun> {
  const n = plan.maglevServices;
  const services = npServices(n, { type: 'NodePort', nodePorts: NODEPORTS, measured: [], ...(algorithm === 'random' ? { fillerAlgorithm: 'random' as const } : {}) });
  const obj = BpfObject.open(OBJECTS.standard);
  // As the agent builds them: on this thread and the pool's (the cores there
  // are, less one; the DaemonSet sets no CPU limit), so this run is let onto
  // every core and pinned back after.
  pinTo(`0-${os.cpus().length - 1}`);
  const pool = new MaglevPool();
  pool.start(); // as the agent does with the tc datapath, before its first sync
  await obj.load();
  try {
    const set = {} as LbMapSet;
    for (const name of LB_MAP_NAMES) set[name] = obj.map(name);
    const maglev = new KernelMaglevMaps(obj.map('lb_maglev'), obj.map('lb_maglev_index'), M);
    let steps = noSteps();
    const current = { steps };
    instrument(maglev, () => current.steps);
    const lbMaps = new KernelLbMaps(set);
    lbMaps.useFrontendPorts(new FrontendPorts(obj.map('lb_np_ports')));
    const reconciler = new Reconciler(lbMaps, {
      maxEntries: Object.fromEntries(LB_MAP_NAMES.map((x) => [x, obj.map(x).maxEntries])),
      northSouth: { maps: new KernelNorthSouthMaps(maglev, { 4: obj.map('lb4_src_range'), 6: obj.map('lb6_src_range') }), maglevM: M, maglevSeed: SEEDS.table, maglevPool: pool },
    });
    reconciler.restore();
    const model = new DesiredModel({ nodePortRange: NODEPORTS });
    const slices = services.map((s) => validated(validateEndpointSlice(sliceObject(s))));
    const svcs = services.map((s) => validated(validateService(serviceObject(s))));
    const t0 = performance.now();
    svcs.forEach((s, i) => {
      model.setService(serviceId(s.namespace, s.name), s);
      model.setSlice(serviceId(s.namespace, `${s.name}-x7k2p`), slices[i]!);
    });
    let flushed = model.flush();
    const cold = reconciler.sync(model.frontends, { prune: true, changed: flushed.changed });
    const coldMs = performance.now() - t0;
    if (cold.notProgrammed.length) throw new Error(`Maglev cold: ${cold.notProgrammed.length} not programmed`);
    const coldSteps = steps;
    const tables = maglev.keys().length;
    const memory = tables > 0 ? maglev.kernelMemory() : undefined;
    // One service's backend set changes (its third backend replaced, then back), one change sync each.
    const changeMs: number[] = [];
    const changeSteps: MaglevSteps[] = [];
    const s = services[Math.floor(n / 2)]!;
    for (let i = 0; i < plan.maglevChanges; i++) {
      const eps = i % 2 === 0 ? [...s.endpoints.slice(0, 2), { ip: '10.127.0.9', port: 8080 }] : s.endpoints;
      const slice = validated(validateEndpointSlice(sliceObject({ ...s, endpoints: eps })));
      current.steps = steps = noSteps();
      const t1 = performance.now();
      model.setSlice(serviceId(s.namespace, `${s.name}-x7k2p`), slice);
      flushed = model.flush();
      const r = reconciler.sync(model.frontends, { prune: true, changed: flushed.changed });
      changeMs.push(performance.now() - t1);
      changeSteps.push(steps);
      if (r.planned === 0) throw new Error('the change sync planned nothing');
    }
    const poolUse = { byWorkers: pool.byWorkers, workers: pool.threads };
    const run: MaglevRun = { coldMs, phases: { ...cold.phasesMs }, steps: coldSteps, changeMs, changeSteps, tables, pool: poolUse, ...(memory ? { memory } : {}) };
    process.stderr.write(
      `maglev (${algorithm}): cold ${coldMs.toFixed(0)} ms (${tables} tables, written in ${coldSteps.writeMs.toFixed(0)} ms; phases ${JSON.stringify(run.phases)}), change median ${median(changeMs).toFixed(3)} ms` +
        (memory ? `; kernel memory ${(memory.bytes / 2 ** 20).toFixed(1)} MiB for ${memory.tables} tables (${memory.chunks} chunks, ${memory.slots} slots)` : '') + '\n',
    );
    return run;
  } finally {
    await pool.close(); // its thread gone before taskset -a walks the threads
    obj.close();
    pinTo(String(plan.cpu));
  }
}

/** Every thread of this process onto `cpus` (taskset's list). */
function pinTo(cpus: string): void {
  const r = spawnSync('taskset', ['-a', '-p', '-c', cpus, String(process.pid)], { stdio: ['ignore', 'ignore', 'pipe'] });
  if (r.status !== 0) throw new Error(`taskset -a -p -c ${cpus}: ${r.stderr?.toString().trim() || `exit ${r.status}`}`);
}

async function maglevPoint(plan: Plan): Promise<MaglevPoint> {
  const n = plan.maglevServices;
  // Baseline, Maglev, baseline: drift over the run falls on both.
  const base1 = await maglevRun(plan, 'random');
  const mg = await maglevRun(plan, 'maglev');
  const base2 = await maglevRun(plan, 'random');
  const sets = npServices(n, { type: 'NodePort', nodePorts: NODEPORTS, measured: [] }).map((s) => s.endpoints.map((e, i) => ({ key: `${e.ip}:${e.port}/TCP`, id: i + 1 })));
  const t0 = performance.now();
  for (const b of sets) maglevTable(b, M, SEEDS.table);
  const buildOnlyMs = performance.now() - t0;
  process.stderr.write(`maglev: build alone ${buildOnlyMs.toFixed(0)} ms\n`);
  return { services: n, backendsEach: 3, m: M, maglev: mg, baseline: [base1, base2], buildOnlyMs };
}

// ----------------------------------------------------------------- report

export interface TcResults {
  meta: Record<string, unknown>;
  sizes: SizePoint[];
  maglev?: MaglevPoint;
}

const f0 = (x: number): string => (Number.isNaN(x) ? '–' : x.toFixed(0));
const f1 = (x: number): string => (Number.isNaN(x) ? '–' : x.toFixed(1));

const PACKETS = ['a', 'b', 'c', 'd', 'd_egress'] as const;
const label = (id: string): string => (id === 'd_egress' ? "(d')" : `(${id})`);

export function tcReport(r: TcResults): string[] {
  const lines: string[] = [];
  const over = overEmpty;
  lines.push(
    `## tc datapath: ns per packet (BPF_PROG_TEST_RUN, repeat ${r.meta.repeat}, ${r.meta.rounds} interleaved rounds, medians)`,
    '',
    ...(r.meta.bpfStatsEnabled ? ['kernel.bpf_stats_enabled was 1 during this run (someone else\'s measurement?): every run, the baselines\' too, paid its two clock reads; the figures over the baseline hold, the raw ones do not.', ''] : []),
    'ns over the empty tc program; in brackets the raw ns per run. The empty program itself runs in ' +
      `${r.sizes.map((p) => f1(median(p.samples.empty!))).join(' / ')} ns (per N). (a) is the real entry on an untouched packet; (b)-(d') run in a wrapper that puts the headers back after each run, whose own cost, ` +
      `${r.sizes.map((p) => f1(wrapperCost(p))).join(' / ')} ns over the empty program (per N), is included in their figures.`,
    '',
    '| N | programmed in | (a) non-service to a node address | (b) established, remote (CT, DNAT+SNAT, FIB) | (c) its reply (rev-SNAT+rev-DNAT, FIB) | (d) established, local (CT, DNAT) | (d\') its reply at egress | the wrapper, in (b)-(d\') |',
    '|---:|---:|---:|---:|---:|---:|---:|---:|',
  );
  for (const p of r.sizes) {
    const cell = (id: string): string => `${f1(over(p, id))} (${f1(median(p.samples[id]!))})`;
    lines.push(`| ${p.n.toLocaleString('en')} | ${(p.programMs / 1000).toFixed(2)} s | ${PACKETS.map(cell).join(' | ')} | ${f1(wrapperCost(p))} |`);
  }
  const first = r.sizes[0]!;
  const last = r.sizes[r.sizes.length - 1]!;
  lines.push('', `Flatness, ${first.n.toLocaleString('en')} → ${last.n.toLocaleString('en')} services (ns over the empty program; target: within ${FLAT * 100}%):`, '');
  lines.push('| packet | at the fewest | at the most | change | min–max over all N | verdict |', '|---|---:|---:|---:|---:|---|');
  for (const id of PACKETS) {
    const xs = r.sizes.map((p) => over(p, id));
    const change = (xs[xs.length - 1]! - xs[0]!) / xs[0]!;
    const spread = (Math.max(...xs) - Math.min(...xs)) / Math.min(...xs);
    lines.push(`| ${label(id)} | ${f1(xs[0]!)} | ${f1(xs[xs.length - 1]!)} | ${change >= 0 ? '+' : ''}${(100 * change).toFixed(1)}% | ${f1(Math.min(...xs))}–${f1(Math.max(...xs))} (${(100 * spread).toFixed(0)}%) | ${Math.abs(change) <= FLAT ? 'flat' : '**not flat**'} |`);
  }
  lines.push('', 'Targets (issue 37; ns over the empty program, at every N):', '', '| packet | target | worst over N | verdict |', '|---|---:|---:|---|');
  for (const [id, target] of Object.entries(TARGET_NS)) {
    const worst = Math.max(...r.sizes.map((p) => over(p, id)));
    lines.push(`| ${label(id)} | ≤ ${target} ns | ${f1(worst)} ns | ${worst <= target ? 'met' : `**missed** by ${f1(worst - target)} ns`} |`);
  }
  const withXdp = r.sizes.filter((p) => p.xdp);
  if (withXdp.length > 0) {
    // at XDP: over the empty XDP program, measured in the same rounds as its cases
    const x = (p: SizePoint, id: string): number => median(p.xdp![`xdp_${id}`]!) - median(p.xdp!['xdp_empty']!);
    lines.push(
      '',
      'At XDP (--nodeport-acceleration; nodeport_xdp.bpf.o on the same maps and flows): ns over the empty XDP program, in brackets the raw ns, beside tc\'s figure over the empty tc program. ' +
        `The empty XDP program runs in ${withXdp.map((p) => f1(median(p.xdp!['xdp_empty']!))).join(' / ')} ns; its wrapper costs ${withXdp.map((p) => f1(x(p, 'wrapped'))).join(' / ')} ns (per N), included as at tc. (b) and (c) leave by the device they came in on (XDP_TX).`,
      '',
      '| N | (a) at XDP | (a) at tc | (b) at XDP | (b) at tc | (c) at XDP | (c) at tc |',
      '|---:|---:|---:|---:|---:|---:|---:|',
    );
    for (const p of withXdp) {
      const cell = (id: string): string => `${f1(x(p, id))} (${f1(median(p.xdp![`xdp_${id}`]!))})`;
      lines.push(`| ${p.n.toLocaleString('en')} | ${['a', 'b', 'c'].map((id) => `${cell(id)} | ${f1(over(p, id))}`).join(' | ')} |`);
    }
  }
  lines.push('', 'The primitives the paths are made of (ns over the empty program; each program does one, on the packet as it is):', '');
  lines.push(`| primitive | ${r.sizes.map((p) => `N = ${p.n.toLocaleString('en')}`).join(' | ')} |`, `|---|${r.sizes.map(() => '---:').join('|')}|`);
  for (const prim of PRIMITIVES) {
    lines.push(`| ${prim.what} | ${r.sizes.map((p) => (p.samples[`prim_${prim.id}`] ? f1(over(p, `prim_${prim.id}`)) : '–')).join(' | ')} |`);
  }
  if (first.noFib) {
    const nf = first.noFib;
    const nfOver = (id: string): number => overEmpty({ samples: nf }, id);
    lines.push('', `Where the time goes, N = ${first.n}: the same cases in a build whose bpf_fib_lookup is a map-backed stub giving the same answer (-DBENCH_NO_FIB):`, '');
    lines.push('| packet | with the FIB lookup | without | the lookup\'s share |', '|---|---:|---:|---:|');
    for (const id of PACKETS) lines.push(`| ${label(id)} | ${f1(over(first, id))} | ${f1(nfOver(id))} | ${f1(over(first, id) - nfOver(id))} |`);
  }
  if (first.profile) {
    lines.push('', `perf (cpu-clock samples of the bench process during one test run of each case, repeat ${Number(r.meta.repeat) * 20}, N = ${first.n}; symbols at 1.5% or more):`, '');
    lines.push('Each symbol\'s share, and that share of the case\'s raw ns per run (bpf_prog_..._np_ingress4 is the datapath\'s own instructions, bpf_prog_..._bench_* the wrapper\'s; memcpy is the helpers\' copying).', '');
    for (const [id, syms] of Object.entries(first.profile)) {
      const raw = median(first.samples[id]!);
      lines.push(`- ${id} (${f0(raw)} ns): ${syms.map((x) => `${x.sym.replace(/^bpf_prog_[0-9a-f]+_/, 'bpf_prog_')} ${x.pct.toFixed(1)}% ≈ ${f0((x.pct / 100) * raw)} ns`).join(', ')}`);
    }
  }
  lines.push('', 'Map fill per N (entries / max_entries):', '');
  for (const p of r.sizes) {
    lines.push(`- N = ${p.n.toLocaleString('en')}: lb4_services ${p.entries.lb4_services} / ${p.maxEntries.lb4_services}, lb4_backends ${p.entries.lb4_backends} / ${p.maxEntries.lb4_backends}, lb4_reverse_nat ${p.entries.lb4_reverse_nat} / ${p.maxEntries.lb4_reverse_nat}, Maglev tables ${p.entries.lb_maglev_index}`);
  }
  if (r.maglev) {
    const m = r.maglev;
    const g = m.maglev;
    const baseCold = median(m.baseline.map((b) => b.coldMs));
    const baseChange = median(m.baseline.flatMap((b) => b.changeMs));
    const ch = median(g.changeMs);
    const per = (x: number): string => (g.steps.tables ? (x / g.steps.tables).toFixed(3) : '–');
    const chWrite = median(g.changeSteps.map((s) => s.writeMs));
    const mem = g.memory;
    const perTable = mem ? mem.bytes / mem.tables : NaN;
    lines.push(
      '',
      `## Maglev tables: ${m.services.toLocaleString('en')} NodePort services × ${m.backendsEach} backends, M = ${m.m}, through the reconciler`,
      '',
      '| | Maglev (the default) | baseline: lb-algorithm random (no tables) | Maglev / baseline | target | verdict |',
      '|---|---:|---:|---:|---:|---|',
      `| cold: model + sync, every table built and written | ${f0(g.coldMs)} ms | ${f0(baseCold)} ms | ${(g.coldMs / baseCold).toFixed(1)}× | ≤ ${MAGLEV_COLD_TARGET_MS} ms | ${g.coldMs <= MAGLEV_COLD_TARGET_MS ? 'met' : `**missed** (${(g.coldMs / MAGLEV_COLD_TARGET_MS).toFixed(1)}×)`} |`,
      `| one service's backend set changed: the change sync (median of ${g.changeMs.length}; p90 ${percentile(g.changeMs, 90).toFixed(2)} ms) | ${ch.toFixed(2)} ms | ${baseChange.toFixed(2)} ms | ${(ch / baseChange).toFixed(0)}× | ≤ ${MAGLEV_CHANGE_TARGET_MS} ms | ${ch <= MAGLEV_CHANGE_TARGET_MS ? 'met' : `**missed** (${(ch / MAGLEV_CHANGE_TARGET_MS).toFixed(1)}×)`} |`,
      ...(mem ? [`| kernel memory per table (the chunks' memlock / tables) | ${f0(perTable)} B (${(perTable / 1024).toFixed(2)} KiB) | – | – | ≤ 64 KiB | ${perTable <= 65536 ? 'met' : `**missed** (${(perTable / 65536).toFixed(3)}×)`} |`] : []),
      '',
      `Where the cold sync's time goes (${g.steps.tables} tables): writing them in place (KernelMaglevMaps.put) ${f0(g.steps.writeMs)} ms (${per(g.steps.writeMs)} per table); ` +
        `building them (the sync on ${g.pool.workers + 1} threads, ${g.pool.byWorkers} of the tables by its ${g.pool.workers} worker${g.pool.workers === 1 ? '' : 's'}); building the same tables alone on one thread (maglevTable, in this process) ${f0(m.buildOnlyMs)} ms; the sync's phases ${Object.entries(g.phases).map(([k, v]) => `${k} ${f0(v)}`).join(', ')} ms. ` +
        `Of a change sync, the write: ${chWrite.toFixed(3)} ms (median).` +
        (mem ? ` Kernel memory: ${(mem.bytes / 2 ** 20).toFixed(1)} MiB in ${mem.chunks} chunks (${mem.slots} slots) for ${mem.tables} tables of ${m.m}.` : ''),
    );
  }
  return lines;
}

function percentile(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

// ------------------------------------------------------------------- main

async function inNamespace(plan: Plan): Promise<void> {
  const ns = makeNamespace();
  const started = performance.now();
  const results: TcResults = {
    meta: {
      date: new Date().toISOString(), kernel: os.release(), cpus: os.cpus().length, cpu: os.cpus()[0]?.model ?? 'unknown', quick: plan.quick, rounds: plan.rounds, repeat: plan.repeat, pinnedTo: plan.cpu,
      // With the kernel's BPF run-time accounting on, every run pays two more clock reads (about 70 ns here): the baselines pay them too.
      bpfStatsEnabled: readFileSync('/proc/sys/kernel/bpf_stats_enabled', 'utf8').trim() === '1',
    },
    sizes: [],
  };
  for (const [i, n] of plan.sizes.entries()) results.sizes.push(await sizePoint(plan, n, ns, i === 0));
  if (plan.maglevServices > 0) results.maglev = await maglevPoint(plan);
  results.meta.seconds = Math.round((performance.now() - started) / 1000);
  mkdirSync(plan.out, { recursive: true });
  writeFileSync(path.join(plan.out, 'nodeport-tc.json'), `${JSON.stringify(results, null, 1)}\n`);
  const md = [`# tc datapath (NodePort): per packet and Maglev (${results.meta.date}, ${results.meta.cpus} × ${results.meta.cpu}, kernel ${results.meta.kernel}, ${results.meta.seconds} s)`, '', ...tcReport(results), ''].join('\n');
  writeFileSync(path.join(plan.out, 'nodeport-tc.md'), md);
  process.stdout.write(md);
}

const plan = parse();
if (process.env[CHILD] === undefined) {
  if (process.getuid?.() !== 0) throw new Error('bench/nodeport-tc.ts needs root (BPF, network namespaces)');
  compile();
  const self = fileURLToPath(import.meta.url);
  // The test runs on one CPU: the other is left to the machine.
  const r = spawnSync('unshare', ['--net', '--', 'taskset', '-c', String(plan.cpu), process.execPath, ...process.execArgv, self, ...process.argv.slice(2)], {
    stdio: 'inherit',
    env: { ...process.env, [CHILD]: readlinkSync('/proc/self/ns/net') },
  });
  process.exit(r.status ?? 1);
} else {
  if (readlinkSync('/proc/self/ns/net') === process.env[CHILD]) throw new Error('not in a network namespace of its own: refusing to create devices');
  inNamespace(plan).catch((err: unknown) => {
    process.stderr.write(`bench/nodeport-tc: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  });
}
