// The socket rev-NAT write, before and after "a UDP socket's entry is written
// only when missing or different" (bpf/sock.c, sock4_record_revnat): the kernel's own accounting
// of each program's run time (BPF_ENABLE_STATS: run_time_ns and
// run_cnt of every program), over connect()+close() through a TCP ClusterIP
// and over sendto() on one unconnected UDP socket to a UDP ClusterIP, for
// two builds of the same source in the same run:
//
//   before  sock.c built with -DLB_REVNAT_ALWAYS_WRITE=1 (the old unconditional write),
//           compiled here into build/bench/
//   after   bpf/.output/sock.bpf.o, what lbctl loads
//
// One world (world.ts: client and backend netns, its own bpf root); the
// datapath is attached to the run's child cgroup and programmed directly (no
// agent: the agent has no flag to load another object), and the pinned links
// are switched from one build to the other between measurements
// (BPF_LINK_UPDATE, the maps stay). The order alternates from one repetition
// to the next (before, after, after, before, ...), so drift over the run
// falls on both builds alike.
//
//   node --import=@tapjs/typescript/import bench/revnat.ts [--count 20000] [--reps 3] [--out DIR]
//
// Also run by `make bench` (run.ts) after the timed points.
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { DEFAULT_OBJECT, loadDatapath } from '../src/datapath/loader.js';
import { desiredState } from '../src/model/desired.js';
import { validateEndpointSlice, validateService } from '../src/model/k8s.js';
import { Reconciler } from '../src/reconcile/reconciler.js';
import { service, slice } from '../test/fakes/objects.js';
import { BenchRun, POD_IPS, POD_PORT, ROOT, type World } from './world.js';
import { enableRunTimeStats } from '../src/native/bpf.js';

export interface RevnatProgram {
  readonly program: string;
  readonly runs: number;
  readonly avgNs: number;
}

export interface RevnatSample {
  readonly build: 'before' | 'after';
  readonly rep: number;
  /** Per program, over the TCP phase (connect()+close()) and the UDP phase (sendto()). */
  readonly tcp: RevnatProgram[];
  readonly udp: RevnatProgram[];
  readonly tcpP50Us: number;
  readonly udpP50Us: number;
}

export interface RevnatProfile {
  readonly count: number;
  readonly reps: number;
  readonly samples: RevnatSample[];
}

const CONNECT = path.join(ROOT, 'build/bench/connect');
const SERVER = path.join(ROOT, 'build/bench/server');
const BEFORE_OBJECT = path.join(ROOT, 'build/bench/sock_revnat_always.bpf.o');
const BENCH_CPU = 1;
const TCP_SVC = '10.96.0.10';
const UDP_SVC = '10.96.0.11';
const UDP_PORT = 53;
/** Nothing listens there: each datagram gets an ICMP port unreachable, which an unconnected socket ignores. */
const UDP_BACKEND_PORT = 5353;

/** The baseline object: the same source with the old unconditional write. */
export function buildBaseline(): string {
  mkdirSync(path.dirname(BEFORE_OBJECT), { recursive: true });
  const triple = execFileSync('gcc', ['-dumpmachine'], { encoding: 'utf8' }).trim();
  execFileSync(
    'clang',
    ['-O2', '-g', '-target', 'bpf', '-Wall', '-Werror', `-I/usr/include/${triple}`, `-I${path.join(ROOT, 'bpf')}`, '-DLB_REVNAT_ALWAYS_WRITE=1',
      '-c', path.join(ROOT, 'bpf/sock.c'), '-o', BEFORE_OBJECT],
    { stdio: 'inherit' },
  );
  return BEFORE_OBJECT;
}

function frontends() {
  const svcs = [
    service('tcp', [TCP_SVC], [{ name: 'http', port: 80 }]),
    service('udp', [UDP_SVC], [{ name: 'dns', port: UDP_PORT, protocol: 'UDP' }]),
  ].map((s) => {
    const v = validateService(s);
    if (!v.ok) throw new Error(v.reason);
    return v.value;
  });
  const slices = [
    slice('tcp-a', 'tcp', 'IPv4', [{ name: 'http', port: POD_PORT }], POD_IPS.map((ip) => ({ addresses: [ip] }))),
    slice('udp-a', 'udp', 'IPv4', [{ name: 'dns', port: UDP_BACKEND_PORT, protocol: 'UDP' }], POD_IPS.map((ip) => ({ addresses: [ip] }))),
  ].map((s) => {
    const v = validateEndpointSlice(s);
    if (!v.ok) throw new Error(v.reason);
    return v.value;
  });
  return desiredState({ services: svcs, slices }).frontends;
}

function client(run: BenchRun, w: World, args: string[]): { p50_us: number } {
  const cmd = ['netns', 'exec', w.client, 'taskset', '-c', String(BENCH_CPU), CONNECT, ...args];
  const r = spawnSync('sh', ['-c', `echo $$ > "$0/cgroup.procs" && exec ip "$@"`, run.cgroup, ...cmd], { encoding: 'utf8', timeout: 600_000 });
  const out = JSON.parse(r.stdout.trim().split('\n').pop() || '{}') as { p50_us?: number; error?: string };
  if (r.status !== 0 || out.error || out.p50_us === undefined) throw new Error(`connect ${args.join(' ')} failed (exit ${r.status}): ${out.error ?? r.stderr}`);
  return { p50_us: out.p50_us };
}

/** run_cnt and run_time_ns of every program attached under the world's bpf root, by program name. */
function stats(w: World): Map<string, { runs: number; ns: number }> {
  const out = new Map<string, { runs: number; ns: number }>();
  for (const name of readdirSync(path.join(w.bpfRoot, 'links'))) {
    const link = JSON.parse(execFileSync('bpftool', ['-j', 'link', 'show', 'pinned', path.join(w.bpfRoot, 'links', name)], { encoding: 'utf8' })) as { prog_id: number };
    const p = JSON.parse(execFileSync('bpftool', ['-j', 'prog', 'show', 'id', String(link.prog_id)], { encoding: 'utf8' })) as { run_cnt?: number; run_time_ns?: number };
    out.set(name, { runs: p.run_cnt ?? 0, ns: p.run_time_ns ?? 0 });
  }
  return out;
}

function delta(a: Map<string, { runs: number; ns: number }>, b: Map<string, { runs: number; ns: number }>): RevnatProgram[] {
  return [...b]
    .map(([program, x]) => {
      const y = a.get(program) ?? { runs: 0, ns: 0 };
      const runs = x.runs - y.runs;
      return { program, runs, avgNs: runs ? (x.ns - y.ns) / runs : 0 };
    })
    .filter((p) => p.runs > 0);
}

/** One measurement of the build whose programs the links run now: a TCP phase, then a UDP phase. */
function sample(run: BenchRun, w: World, build: 'before' | 'after', rep: number, count: number): RevnatSample {
  const s0 = stats(w);
  const tcp = client(run, w, ['-a', TCP_SVC, '-p', '80', '-n', String(count), '-m', 'cc']);
  const s1 = stats(w);
  const udp = client(run, w, ['-a', UDP_SVC, '-p', String(UDP_PORT), '-n', String(count), '-m', 'us']);
  const s2 = stats(w);
  return { build, rep, tcp: delta(s0, s1), udp: delta(s1, s2), tcpP50Us: tcp.p50_us, udpP50Us: udp.p50_us };
}

/** Needs build/bench/connect and server (run.ts compiles them; main() below does too). */
export async function revnatProfile(opts: { count: number; reps: number; log?: (s: string) => void }): Promise<RevnatProfile> {
  const before = buildBaseline();
  const run = new BenchRun();
  const samples: RevnatSample[] = [];
  let counting: { close(): void } | undefined;
  try {
    const w = run.world();
    await w.startServer(SERVER, BENCH_CPU);
    counting = enableRunTimeStats();
    let programmed = false;
    for (let rep = 0; rep < opts.reps; rep++) {
      const order: Array<['before' | 'after', string]> = [['before', before], ['after', DEFAULT_OBJECT]];
      if (rep % 2) order.reverse();
      for (const [build, object] of order) {
        // The first load attaches; each later one switches the pinned links to
        // the other build's programs (BPF_LINK_UPDATE), over the same maps.
        const dp = await loadDatapath({ bpfRoot: w.bpfRoot, cgroup: run.cgroup, object });
        try {
          if (!programmed) new Reconciler(dp.maps).sync(frontends(), { prune: true });
          programmed = true;
          const s = sample(run, w, build, rep, opts.count);
          opts.log?.(`revnat ${build} rep ${rep + 1}/${opts.reps}: ${[...s.tcp, ...s.udp].map((p) => `${p.program} ${p.avgNs.toFixed(0)} ns`).join(', ')}\n`);
          samples.push(s);
        } finally {
          dp.close();
        }
      }
    }
  } finally {
    counting?.close();
    run.close();
  }
  return { count: opts.count, reps: opts.reps, samples };
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? (s[(s.length - 1) >> 1]! + s[s.length >> 1]!) / 2 : NaN;
};

/** The report's table: median ns per run of each program, before and after, and after/before. */
export function revnatTable(p: RevnatProfile): string[] {
  const rows: Array<[string, 'tcp' | 'udp', string]> = [
    ['lb_sendmsg4', 'udp', 'per sendto() on one unconnected UDP socket to a service of 3 backends (after the first datagrams its entries are all there)'],
    ['lb_connect4', 'tcp', 'per TCP connect(): the same code in both builds (the compare is for UDP only), so this row is the run\'s noise'],
    ['lb_sock_release', 'tcp', 'per close() of those TCP sockets: the same code in both builds'],
  ];
  const at = (build: string, phase: 'tcp' | 'udp', program: string): number =>
    median(p.samples.filter((s) => s.build === build).map((s) => s[phase].find((x) => x.program === program)?.avgNs ?? NaN));
  const lines = [
    '| program | what runs it | before: ns per run | after: ns per run | after / before |',
    '|---|---|---:|---:|---:|',
  ];
  for (const [program, phase, what] of rows) {
    const b = at('before', phase, program);
    const a = at('after', phase, program);
    lines.push(`| \`${program}\` | ${what} | ${b.toFixed(0)} | ${a.toFixed(0)} | ${(a / b).toFixed(2)}× |`);
  }
  return lines;
}

async function main(): Promise<void> {
  const arg = (name: string, dflt: string): string => {
    const i = process.argv.indexOf(`--${name}`);
    return i > 0 ? process.argv[i + 1]! : dflt;
  };
  if (process.getuid?.() !== 0) throw new Error('bench/revnat.ts needs root (network namespaces, bpffs, cgroups)');
  execFileSync('taskset', ['-a', '-p', '-c', String(BENCH_CPU), String(process.pid)], { stdio: 'ignore' });
  mkdirSync(path.dirname(CONNECT), { recursive: true });
  for (const [src, out] of [['connect.c', CONNECT], ['server.c', SERVER]] as const) {
    execFileSync('cc', ['-O2', '-Wall', '-Wextra', '-o', out, path.join(ROOT, 'bench', src)], { stdio: 'inherit' });
  }
  const t0 = performance.now();
  const p = await revnatProfile({ count: Number(arg('count', '20000')), reps: Number(arg('reps', '3')), log: (s) => process.stderr.write(s) });
  const out = arg('out', path.join(ROOT, 'bench/results'));
  mkdirSync(out, { recursive: true });
  writeFileSync(path.join(out, 'revnat.json'), `${JSON.stringify(p, null, 1)}\n`);
  const md = [
    `# Socket rev-NAT write: before and after (${p.count.toLocaleString('en')} operations a phase, ${p.reps} reps, medians, ${((performance.now() - t0) / 1000).toFixed(0)} s)`,
    '',
    ...revnatTable(p),
    '',
  ].join('\n');
  writeFileSync(path.join(out, 'revnat.md'), md);
  process.stdout.write(md);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    process.stderr.write(`bench/revnat: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  });
}
