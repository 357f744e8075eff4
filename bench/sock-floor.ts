// The socket path against its floor: connect()+close() through lbctl's
// programs, through the least a socket load balancer does
// (bench/sock_floor.c: look the frontend up, pick a backend, rewrite; over
// lbctl's own maps), and straight to the pod address with no program at
// all, interleaved in one world so drift over the run falls on all three
// alike:
//
//   direct  a cgroup with nothing attached, connecting to the pod address
//   floor   a cgroup with bench/sock_floor.c's connect4 attached, to the ClusterIP
//   lbctl   the cgroup lbctl is attached to, to the same ClusterIP
//   (more)  standalone only: `--variant NAME=-DFLAG,...` builds bpf/sock.c
//           again with those flags and attaches it to a cgroup of its own,
//           over the same maps (what a change would save, measured before
//           it is made)
//
// Each round runs one block of every arm, the order rotated from one round
// to the next; a block is BLOCK timed connects after a short warm-up, one
// client process (bench/connect.c), its p50. A ratio is arm p50 / direct
// p50 of the same round; the reported ratio is the median over the rounds.
//
// `make bench` (run.ts) measures it in every lbctl point, over the agent's
// maps. Standalone, without an agent (the datapath loaded and programmed
// directly, N services of 3 endpoints):
//
//   node --import=@tapjs/typescript/import bench/sock-floor.ts [--sizes 10000] [--rounds 20]
//        [--block 2000] [--variant NAME=-DFLAG,...]... [--out DIR]
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { loadDatapath, mapsDir } from '../src/datapath/loader.js';
import { desiredState } from '../src/model/desired.js';
import { validateEndpointSlice, validateService } from '../src/model/k8s.js';
import { BpfObject, openPinnedMap } from '../src/native/bpf.js';
import { Reconciler } from '../src/reconcile/reconciler.js';
import { service, slice } from '../test/fakes/objects.js';
import { median } from './report.js';
import { makeServices } from './services.js';
import { BenchRun, POD_IPS, POD_PORT, ROOT, type World } from './world.js';

const BUILD = path.join(ROOT, 'build/bench');
const FLOOR_OBJECT = path.join(BUILD, 'sock_floor.bpf.o');
const CONNECT = path.join(ROOT, 'build/bench/connect');
const SERVER = path.join(ROOT, 'build/bench/server');
const BENCH_CPU = 1;

export interface SockFloorOptions {
  readonly rounds: number;
  /** Timed connects per block. */
  readonly block: number;
  /** Untimed connects before each block's timed ones. */
  readonly warmup: number;
}

export const SOCK_FLOOR_DEFAULTS: SockFloorOptions = { rounds: 20, block: 2000, warmup: 200 };
export const SOCK_FLOOR_QUICK: SockFloorOptions = { rounds: 8, block: 1000, warmup: 100 };

/** One arm's blocks, in round order. */
export interface SockFloorArm {
  readonly arm: string;
  readonly p50Us: number[];
  readonly p99Us: number[];
  /** p50 over the same round's direct p50. */
  readonly ratio: number[];
}

export interface SockFloorResult {
  readonly n: number;
  readonly service: string;
  readonly rounds: number;
  readonly block: number;
  readonly arms: SockFloorArm[];
}

function clang(src: string, out: string, defines: readonly string[] = []): string {
  mkdirSync(path.dirname(out), { recursive: true });
  const triple = execFileSync('gcc', ['-dumpmachine'], { encoding: 'utf8' }).trim();
  execFileSync(
    'clang',
    ['-O2', '-g', '-target', 'bpf', '-Wall', '-Werror', `-I/usr/include/${triple}`, `-I${path.join(ROOT, 'bpf')}`, ...defines, '-c', src, '-o', out],
    { stdio: 'inherit' },
  );
  return out;
}

/** bench/sock_floor.c, compiled into build/bench/. */
export function buildSockFloor(): string {
  return clang(path.join(ROOT, 'bench/sock_floor.c'), FLOOR_OBJECT);
}

/** A datapath attached over another's maps: close() detaches it (its link pins removed) and releases it. */
export interface Attached {
  close(): void;
}

/**
 * Loads `object` over the maps pinned under `bpfRoot` (each map it declares
 * that is pinned there is reused; a map it alone has is pinned beside them)
 * and attaches every program to `cgroup`, its links pinned under
 * `bpfRoot/links-<tag>`.
 */
export async function attachOver(bpfRoot: string, object: string, cgroup: string, tag: string): Promise<Attached> {
  const declared = (() => {
    const o = BpfObject.open(object);
    try {
      return o.mapNames();
    } finally {
      o.close();
    }
  })();
  const pinned = new Set(readdirSync(mapsDir(bpfRoot)));
  const reuse = declared.filter((n) => pinned.has(n)).map((n) => [n, openPinnedMap(path.join(mapsDir(bpfRoot), n))] as const);
  let o: BpfObject;
  try {
    o = await BpfObject.openLoaded(object, { pinRoot: mapsDir(bpfRoot), reuseMaps: Object.fromEntries(reuse.map(([n, m]) => [n, m.fd])) });
  } finally {
    for (const [, m] of reuse) m.close();
  }
  const links = path.join(bpfRoot, `links-${tag}`);
  const close = (): void => {
    rmSync(links, { recursive: true, force: true });
    o.close();
  };
  mkdirSync(links, { recursive: true });
  try {
    for (const p of o.programNames()) o.attachCgroup(p, cgroup, path.join(links, p));
  } catch (err) {
    close();
    throw err;
  }
  return { close };
}

/** One block: the client joins `cgroup`, then the world's client netns, pinned to the bench CPU. */
function block(w: World, cgroup: string, addr: string, port: number, opts: SockFloorOptions): { p50_us: number; p99_us: number } {
  const args = ['netns', 'exec', w.client, 'taskset', '-c', String(BENCH_CPU), CONNECT, '-a', addr, '-p', String(port), '-n', String(opts.block), '-w', String(opts.warmup), '-m', 'cc'];
  const r = spawnSync('sh', ['-c', `echo $$ > "$0/cgroup.procs" && exec ip "$@"`, cgroup, ...args], { encoding: 'utf8', timeout: 600_000 });
  const out = JSON.parse(r.stdout.trim().split('\n').pop() || '{}') as { p50_us?: number; p99_us?: number; error?: string };
  if (r.status !== 0 || out.error || out.p50_us === undefined || out.p99_us === undefined) {
    throw new Error(`connect ${addr}:${port} from ${cgroup} failed (exit ${r.status}): ${out.error ?? r.stderr}`);
  }
  return { p50_us: out.p50_us, p99_us: out.p99_us };
}

export interface Arm {
  readonly arm: string;
  readonly cgroup: string;
  readonly addr: string;
  readonly port: number;
}

/** The arms' blocks, interleaved; arms[0] must be the direct one (the ratios' denominator). */
export function interleave(w: World, n: number, service: string, arms: readonly Arm[], opts: SockFloorOptions, log?: (s: string) => void): SockFloorResult {
  const out = arms.map((a) => ({ arm: a.arm, p50Us: [] as number[], p99Us: [] as number[], ratio: [] as number[] }));
  for (let r = 0; r < opts.rounds; r++) {
    const got = new Map<number, { p50_us: number; p99_us: number }>();
    for (let k = 0; k < arms.length; k++) {
      const i = (k + r) % arms.length;
      const a = arms[i]!;
      got.set(i, block(w, a.cgroup, a.addr, a.port, opts));
    }
    const direct = got.get(0)!.p50_us;
    for (const [i, g] of got) {
      out[i]!.p50Us.push(g.p50_us);
      out[i]!.p99Us.push(g.p99_us);
      out[i]!.ratio.push(g.p50_us / direct);
    }
    log?.(`sock-floor N=${n} round ${r + 1}/${opts.rounds}: ${out.map((a) => `${a.arm} ${a.p50Us.at(-1)!.toFixed(2)} µs (${a.ratio.at(-1)!.toFixed(3)}×)`).join(', ')}\n`);
  }
  return { n, service, rounds: opts.rounds, block: opts.block, arms: out };
}

/**
 * What run.ts measures in an lbctl point: the agent's datapath (attached to
 * the run's cgroup, its maps pinned under w.bpfRoot) against the minimal LB
 * over the same maps and a direct connect, through the service `clusterIP`
 * (port 80).
 */
export async function sockFloor(run: BenchRun, w: World, n: number, clusterIP: string, opts: SockFloorOptions, log?: (s: string) => void): Promise<SockFloorResult> {
  const direct = run.sideCgroup('direct');
  const floorCg = run.sideCgroup(`floor${w.k}`);
  const floor = await attachOver(w.bpfRoot, FLOOR_OBJECT, floorCg, 'floor');
  try {
    return interleave(
      w,
      n,
      clusterIP,
      [
        { arm: 'direct', cgroup: direct, addr: POD_IPS[0]!, port: POD_PORT },
        { arm: 'floor', cgroup: floorCg, addr: clusterIP, port: 80 },
        { arm: 'lbctl', cgroup: run.cgroup, addr: clusterIP, port: 80 },
      ],
      opts,
      log,
    );
  } finally {
    floor.close();
  }
}

/** The median ratio of an arm over the direct connect, and its p50 (µs). */
export function armSummary(r: SockFloorResult, arm: string): { ratio: number; p50Us: number; ratioRange: [number, number] } | undefined {
  const a = r.arms.find((x) => x.arm === arm);
  if (!a) return undefined;
  return { ratio: median(a.ratio), p50Us: median(a.p50Us), ratioRange: [Math.min(...a.ratio), Math.max(...a.ratio)] };
}

/** The report's table: per N, direct, the floor and lbctl, and lbctl's distance from the floor. */
export function sockFloorTable(results: readonly SockFloorResult[]): string[] {
  const lines = [
    '| N | direct p50 | floor (minimal LB) / direct | lbctl / direct | lbctl − floor | target ≤ 0.02 |',
    '|---:|---:|---:|---:|---:|---|',
  ];
  const sizes = [...new Set(results.map((r) => r.n))].sort((a, b) => a - b);
  for (const n of sizes) {
    // Every block of every repetition at this N, pooled.
    const pool = (arm: string): number[] => results.filter((r) => r.n === n).flatMap((r) => r.arms.find((a) => a.arm === arm)?.ratio ?? []);
    const direct = median(results.filter((r) => r.n === n).flatMap((r) => r.arms.find((a) => a.arm === 'direct')?.p50Us ?? []));
    const fl = median(pool('floor'));
    const lb = median(pool('lbctl'));
    lines.push(`| ${n.toLocaleString('en')} | ${direct.toFixed(2)} µs | ${fl.toFixed(3)}× | ${lb.toFixed(3)}× | ${(lb - fl).toFixed(3)} | ${lb - fl <= 0.02 ? 'met' : '**missed**'} |`);
  }
  return lines;
}

// ---------------------------------------------------------------- standalone

function frontends(n: number) {
  const objs = makeServices(n).slice(0, n);
  const svcs = objs.map((s) => {
    const v = validateService(service(s.name, [s.clusterIP], [{ name: s.portName, port: s.port }], {}, s.namespace));
    if (!v.ok) throw new Error(v.reason);
    return v.value;
  });
  const slices = objs.map((s) => {
    const v = validateEndpointSlice(slice(`${s.name}-a`, s.name, 'IPv4', [{ name: s.portName, port: POD_PORT }], s.endpoints.map((e) => ({ addresses: [e.ip] })), s.namespace));
    if (!v.ok) throw new Error(v.reason);
    return v.value;
  });
  return { frontends: desiredState({ services: svcs, slices }).frontends, last: objs[n - 1]!.clusterIP };
}

async function main(): Promise<void> {
  const o = new Command()
    .option('--sizes <list>', 'numbers of services', '10000')
    .option('--rounds <n>', 'rounds (one block of every arm each)', String(SOCK_FLOOR_DEFAULTS.rounds))
    .option('--block <n>', 'timed connects per block', String(SOCK_FLOOR_DEFAULTS.block))
    .option('--variant <spec...>', 'NAME=-DFLAG,-DFLAG2: bpf/sock.c built with these flags, as one more arm')
    .option('--out <dir>', 'where sock-floor.json goes', path.join(ROOT, 'bench/results'))
    .parse()
    .opts<{ sizes: string; rounds: string; block: string; variant?: string[]; out: string }>();
  if (process.getuid?.() !== 0) throw new Error('bench/sock-floor.ts needs root (network namespaces, bpffs, cgroups)');
  execFileSync('taskset', ['-a', '-p', '-c', String(BENCH_CPU), String(process.pid)], { stdio: 'ignore' });
  mkdirSync(BUILD, { recursive: true });
  for (const [src, out] of [['connect.c', CONNECT], ['server.c', SERVER]] as const) {
    execFileSync('cc', ['-O2', '-Wall', '-Wextra', '-o', out, path.join(ROOT, 'bench', src)], { stdio: 'inherit' });
  }
  buildSockFloor();
  const variants = (o.variant ?? []).map((spec) => {
    const [name, flags = ''] = spec.split('=');
    if (!name) throw new Error(`--variant ${spec}: want NAME=-DFLAG,...`);
    return { name, object: clang(path.join(ROOT, 'bpf/sock.c'), path.join(BUILD, `sock_${name}.bpf.o`), flags.split(',').filter(Boolean)) };
  });
  const opts = { ...SOCK_FLOOR_DEFAULTS, rounds: Number(o.rounds), block: Number(o.block) };
  const results: SockFloorResult[] = [];
  const run = new BenchRun();
  try {
    for (const n of o.sizes.split(',').map((x) => Number(x.replace(/_/g, '')))) {
      const w = run.world();
      const objects: Attached[] = [];
      try {
        await w.startServer(SERVER, BENCH_CPU);
        const { frontends: fes, last } = frontends(n);
        const dp = await loadDatapath({ bpfRoot: w.bpfRoot, cgroup: run.cgroup, sizes: { services: Math.max(1024, n * 2), backends: Math.max(4096, n * 4) } });
        objects.push(dp);
        new Reconciler(dp.maps).sync(fes, { prune: true });
        const direct = run.sideCgroup('direct');
        const floorCg = run.sideCgroup(`floor${w.k}`);
        objects.push(await attachOver(w.bpfRoot, FLOOR_OBJECT, floorCg, 'floor'));
        const arms: Arm[] = [
          { arm: 'direct', cgroup: direct, addr: POD_IPS[0]!, port: POD_PORT },
          { arm: 'floor', cgroup: floorCg, addr: last, port: 80 },
          { arm: 'lbctl', cgroup: run.cgroup, addr: last, port: 80 },
        ];
        for (const v of variants) {
          const cg = run.sideCgroup(`${v.name}${w.k}`);
          objects.push(await attachOver(w.bpfRoot, v.object, cg, v.name));
          arms.push({ arm: v.name, cgroup: cg, addr: last, port: 80 });
        }
        const r = interleave(w, n, last, arms, opts, (s) => process.stderr.write(s));
        results.push(r);
        for (const a of r.arms) {
          const s = armSummary(r, a.arm)!;
          process.stdout.write(`N=${n} ${a.arm}: p50 ${s.p50Us.toFixed(2)} µs, ${s.ratio.toFixed(3)}× direct (rounds ${s.ratioRange[0].toFixed(3)}–${s.ratioRange[1].toFixed(3)})\n`);
        }
      } finally {
        for (const ob of objects.reverse()) ob.close();
        w.close();
      }
    }
  } finally {
    run.close();
  }
  mkdirSync(o.out, { recursive: true });
  writeFileSync(path.join(o.out, 'sock-floor.json'), `${JSON.stringify(results, null, 1)}\n`);
  process.stdout.write(`${sockFloorTable(results).join('\n')}\n`);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    process.stderr.write(`bench/sock-floor: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  });
}
