// The record of one benchmark run: the figures docs/benchmarks.md's tables
// give, each beside its target and the floor of the same run, in one JSON
// file per run under bench/results/runs/ (named by date and commit), so
// that runs compare by their ids. `make bench` runs this last; it reads
// what the run's scripts wrote into --out (results.json, file-load.json,
// nodeport-tc.json, nodeport-e2e.json, probes.json), skipping a file that
// an earlier run left (written before results.json's run started, or more
// than three hours after; --all takes every file there).
//
//   node --import=@tapjs/typescript/import bench/record.ts [--out bench/results] [--commit SHA] [--all]
//
// The records of the runs before this file existed were taken from the
// journal docs/benchmarks.md kept until then, in the same form; where the
// journal gave only a range, a result has `range` instead of `value`.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Command } from 'commander';
import type { TcResults } from './nodeport-tc.js';
import { overEmpty, pairedRatios, TARGET_NS, wrapperCost } from './np-figures.js';
import type { E2eResults } from './nodeport-e2e.js';
import type { Point, Results } from './report.js';
import { ROOT } from './world.js';

export interface RunRecord {
  /** The form of this file; bumped when a result's meaning changes. */
  schema: 1;
  /** When the run started (ISO 8601; a day only where that is all the journal kept). */
  date: string;
  /** The commit the run measured (short hash). */
  commit: string;
  machine: { cpus?: number; cpu?: string; kernel?: string; node?: string; note?: string };
  /** What ran: `make bench`, or the script and its arguments. */
  scope: string;
  /** Where the figures come from. */
  source: string;
  note?: string;
  results: RunResult[];
}

export interface RunResult {
  /** What is measured: one of IDS below. */
  id: string;
  /** Number of services, where it matters. */
  n?: number;
  /** lbctl unless said: floor, iptables-legacy, iptables-nft, nftables, routed. */
  mode?: string;
  /** Which one: the first or last service, the local or remote backend, YAML or JSON, a probe handler, a packet (a, b, c, d, d'). */
  at?: string;
  /** The median over the run's repetitions (percentiles for the p-rows). */
  value?: number;
  /** Where only a range was recorded (over repetitions, points or N). */
  range?: [number, number];
  unit: string;
  /** The floor of the same run, in the same unit. */
  floor?: number;
  /** The parts of the figure, or the floor's, by name, in the same unit. */
  parts?: Record<string, number>;
  target?: string;
  met?: boolean;
  note?: string;
}

/** Every id, with its unit: docs/benchmarks.md says what each measures. */
export const IDS: Record<string, string> = {
  'connect-p50': '× floor', // connect()+close() p50, lbctl (or a kube-proxy mode) over the floor of the same N
  'connect-p99': '× floor',
  'sock-connect-p50': '× direct', // connect()+close() p50 through the last service over a direct connect, interleaved (bench/sock-floor.ts): lbctl, or mode 'sock-floor' (the minimal socket LB); lbctl's floor: the minimal LB's
  cold: 'ms', // programming N services from cold: lbctl's first sync alone; kube-proxy's restore
  'add-first': 'ms', // one more service, the first change after start
  'add-again': 'ms', // the same add in the running agent (median of 5)
  add: 'ms', // kube-proxy modes: one more service (iptables-restore --noflush; nft's incremental transaction)
  'start-synced': 'ms',
  'start-ready': 'ms',
  'cold-from-list': 'ms', // first list request → every frontend in the kernel; parts.sync: the sync alone; floor: bench/cold-floor.ts, and its split
  'event-p50': 'ms', // API server sends an EndpointSlice change → the kernel map holds it; floor: bench/event-floor.ts
  'event-p99': 'ms',
  'resync-cpu': 'ms', // CPU of one periodic resync over its period; floor: bench/resync-floor.ts, a read of the maps
  'peak-rss': 'MiB', // VmHWM after the events (at 10,000) or right after the cold sync (at 100,000)
  'rss-events': 'MiB', // VmRSS after the events; parts: the V8 heap used and reserved then
  'rss-idle': 'MiB', // VmRSS after 15 s idle
  'memory-limit': 'MiB', // the largest peak under the DaemonSet's limit; parts.oomKills
  'idle-cpu': 'ms/s', // the agent's CPU a second with nothing to do
  'file-load': 'ms', // 10,000 Services and slices renamed into the directory → programmed
  'np-packet': 'ns', // tc, ns over the header wrapper's baseline, per packet (a)-(d'): the runs before issue 37 (to 2026-11-28)
  'np-packet-ns': 'ns', // tc, ns over the empty program per packet (a)-(d'), issue 37's targets; parts.wrapper: the header restore's share (in the value)
  'maglev-cold': 'ms', // 10,000 NodePort services × 3 backends, M = 16,381, from cold; parts.baseline: lb-algorithm random
  'maglev-change': 'ms', // one service's backend set changed: its change sync
  'np-rps': 'requests/s', // NodePort end to end, 32 in flight
  'np-rps-ratio': '× best kube-proxy mode',
  'np-p50-ratio': '× routed pod',
  'np-sustained': 'requests/s', // 3 s to the remote pod with 32 in flight; parts.failed
  'np-rate-held': 'connections/s', // the sustained-rate search's highest rate held; parts.failedAt
  probes: 'probes/s', // 1,000 backends at periodSeconds 1, per handler; met: keeps up
};

function median(xs: readonly number[]): number {
  const s = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** Nearest rank, as report.ts. */
function percentile(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]! : NaN;
}

const round = (x: number, digits = 3): number => Number(x.toFixed(digits));

class Rows {
  readonly out: RunResult[] = [];
  add(r: Omit<RunResult, 'unit'> & { unit?: string }, limit?: { max?: number; min?: number; target: string }): void {
    if (r.value === undefined || Number.isNaN(r.value)) return;
    const row: RunResult = { ...r, value: round(r.value), unit: r.unit ?? IDS[r.id]! };
    if (row.floor !== undefined) row.floor = Number.isNaN(row.floor) ? undefined : round(row.floor);
    if (row.floor === undefined) delete row.floor;
    if (limit) {
      row.target = limit.target;
      row.met = (limit.max === undefined || r.value <= limit.max) && (limit.min === undefined || r.value >= limit.min);
    }
    this.out.push(row);
  }
}

/** bench/run.ts's results.json: the socket-level rows and issue 18's. */
function socketRows(r: Results, rows: Rows): void {
  const sizes = [...new Set(r.points.map((p) => p.n))].sort((a, b) => a - b);
  const modes = [...new Set(r.points.map((p) => p.mode))].filter((m) => m !== 'floor');
  const at = (mode: string, n: number): Point[] => r.points.filter((p) => p.mode === mode && p.n === n);
  const conn = (mode: string, n: number, which: string, stat: 'p50_us' | 'p99_us'): number =>
    median(at(mode, n).map((p) => p.connections[which]?.cc[stat] ?? NaN));
  const med = (n: number, get: (p: Point) => number | undefined): number => median(at('lbctl', n).map((p) => get(p) ?? NaN));
  for (const n of sizes) {
    for (const mode of modes) {
      if (at(mode, n).length === 0) continue;
      const m = mode === 'lbctl' ? undefined : mode;
      for (const which of ['first', 'last']) {
        const p50 = conn(mode, n, which, 'p50_us') / conn('floor', n, 'pod', 'p50_us');
        const p99 = conn(mode, n, which, 'p99_us') / conn('floor', n, 'pod', 'p99_us');
        // issue 5: ≤ 1.05× at every N; issue 18: ≤ 1.03× at 10,000 and 100,000
        const p50Target = mode !== 'lbctl' ? undefined : n >= 10_000 ? { max: 1.03, target: '≤ 1.03×' } : { max: 1.05, target: '≤ 1.05×' };
        rows.add({ id: 'connect-p50', n, mode: m, at: which, value: p50 }, p50Target);
        rows.add({ id: 'connect-p99', n, mode: m, at: which, value: p99 }, mode === 'lbctl' ? { max: 1.2, target: '≤ 1.2×' } : undefined);
      }
      const cold = median(at(mode, n).map((p) => p.coldMs));
      const coldTarget = mode !== 'lbctl' ? undefined : n === 10_000 ? { max: 200, target: '≤ 200 ms' } : n === 100_000 ? { max: 2000, target: '≤ 2 s' } : undefined;
      rows.add({ id: 'cold', n, mode: m, value: cold }, coldTarget);
      if (mode !== 'lbctl') {
        rows.add({ id: 'add', n, mode: m, value: median(at(mode, n).map((p) => p.addMs ?? NaN)) });
        continue;
      }
      // issue 37: lbctl within 0.02 of the minimal socket LB, both over a direct connect in the same rounds
      const sf = at('lbctl', n).flatMap((p) => (p.sockFloor ? [p.sockFloor] : []));
      if (sf.length > 0) {
        const pooled = (arm: string): number => median(sf.flatMap((x) => x.arms.find((a) => a.arm === arm)?.ratio ?? []));
        const floorRatio = pooled('floor');
        rows.add({ id: 'sock-connect-p50', n, mode: 'sock-floor', at: 'last', value: floorRatio });
        rows.add({ id: 'sock-connect-p50', n, at: 'last', value: pooled('lbctl'), floor: floorRatio }, { max: floorRatio + 0.02, target: '≤ the floor + 0.02' });
      }
      const one = n === 10_000 ? { max: 1, target: '≤ 1 ms' } : undefined;
      rows.add({ id: 'add-first', n, value: med(n, (p) => p.addMs) }, one);
      rows.add({ id: 'add-again', n, value: median(at('lbctl', n).flatMap((p) => p.addAgainMs ?? [])) }, one);
      rows.add({ id: 'start-synced', n, value: med(n, (p) => p.startToSyncedMs) }, n === 100_000 ? { max: 3000, target: '≤ 3 s' } : undefined);
      rows.add({ id: 'start-ready', n, value: med(n, (p) => p.startToReadyMs) }, n === 10_000 ? { max: 1000, target: '≤ 1 s' } : undefined);
      const fromList = med(n, (p) => p.coldFromListMs);
      const floorCold = med(n, (p) => p.floorCold?.fromListMs);
      const split = { lists: med(n, (p) => p.floorCold?.listMs), encoding: med(n, (p) => p.floorCold?.encodeMs), kernel: med(n, (p) => p.floorCold?.kernelMs) };
      rows.add(
        { id: 'cold-from-list', n, value: fromList, floor: floorCold, parts: { sync: round(cold), ...(Number.isNaN(floorCold) ? {} : { floorLists: round(split.lists), floorEncoding: round(split.encoding), floorKernel: round(split.kernel) }) } },
        n === 10_000 ? { max: 200, target: '≤ 200 ms' } : n === 100_000 ? { max: 1500, target: '≤ 1.5 s' } : undefined,
      );
      const events = at('lbctl', n).flatMap((p) => [...(p.eventToMapMs ?? []), ...(p.addEventToMapMs !== undefined ? [p.addEventToMapMs] : []), ...(p.addAgainEventToMapMs ?? [])]);
      const floorEvents = at('lbctl', n).flatMap((p) => p.floorEventToMapMs ?? []);
      if (events.length) {
        const fl = (q: number): number | undefined => (floorEvents.length ? percentile(floorEvents, q) : undefined);
        rows.add({ id: 'event-p50', n, value: percentile(events, 50), floor: fl(50), note: `${events.length} events` });
        rows.add({ id: 'event-p99', n, value: percentile(events, 99), floor: fl(99), note: `${events.length} events` }, n === 10_000 ? { max: 2, target: '≤ 2 ms (issue 5: ≤ 5 ms)' } : undefined);
      }
      const resync = at('lbctl', n).flatMap((p) => p.resyncCpuMs ?? []);
      if (resync.length) {
        const fl = at('lbctl', n).flatMap((p) => p.floorResyncCpuMs ?? []);
        rows.add(
          { id: 'resync-cpu', n, value: median(resync), ...(fl.length ? { floor: median(fl) } : {}), parts: { resync: round(median(at('lbctl', n).flatMap((p) => p.resyncMs ?? []))) }, note: `median of ${resync.length} periods` },
          n === 10_000 ? { max: 50, target: '≤ 50 ms' } : undefined,
        );
      }
      const peak = n >= 100_000 ? med(n, (p) => p.coldHwmMiB) : med(n, (p) => p.memory?.hwmMiB);
      rows.add({ id: 'peak-rss', n, value: peak }, n === 10_000 ? { max: 150, target: '≤ 150 MiB' } : n === 100_000 ? { max: 400, target: '≤ 400 MiB' } : undefined);
      const heap = { heapUsed: round(med(n, (p) => p.memory?.heapUsedMiB)), heapReserved: round(med(n, (p) => p.memory?.heapTotalMiB)) };
      rows.add({ id: 'rss-events', n, value: med(n, (p) => p.memory?.rssMiB), ...(Number.isNaN(heap.heapUsed) ? {} : { parts: heap }) }, n === 10_000 ? { max: 150 / 1.048576, target: '≤ 150 MB' } : undefined);
      rows.add({ id: 'rss-idle', n, value: med(n, (p) => p.memoryIdle?.rssMiB) }, n === 100_000 ? { max: 300, target: '≤ 300 MiB' } : undefined);
      const idle = at('lbctl', n).flatMap((p) => p.idleCpuMsPerS ?? []);
      if (idle.length) rows.add({ id: 'idle-cpu', n, value: median(idle), note: `the busiest second ${round(Math.max(...idle), 1)} ms` });
    }
  }
  const limit = r.meta.memoryLimitMiB;
  const lb = r.points.filter((p) => p.mode === 'lbctl');
  if (typeof limit === 'number' && lb.length) {
    const worst = Math.max(...lb.map((p) => p.memory?.hwmMiB ?? p.coldHwmMiB ?? 0));
    const kills = Math.max(0, ...r.points.map((p) => p.oomKills ?? 0));
    rows.add({ id: 'memory-limit', value: worst, parts: { oomKills: kills }, note: `the DaemonSet's limit, ${limit} MiB` });
    rows.out[rows.out.length - 1]!.target = 'no OOM kill';
    rows.out[rows.out.length - 1]!.met = kills === 0 && worst <= limit;
  }
}

interface FileLoad { n: number; reps: number; targetMs: number; formats: Record<string, { bytes: number; runsMs: number[]; syncMs: number[] }>; parseMs: Record<string, number[]> }

function fileLoadRows(f: FileLoad, rows: Rows): void {
  for (const [format, x] of Object.entries(f.formats)) {
    rows.add({ id: 'file-load', n: f.n, at: format.toUpperCase(), value: median(x.runsMs), parts: { sync: round(median(x.syncMs)), parse: round(median(f.parseMs[format === 'yaml' ? 'js-yaml' : format] ?? [])) } }, { max: f.targetMs, target: `≤ ${f.targetMs} ms` });
  }
}

function tcRows(r: TcResults, rows: Rows): void {
  for (const p of r.sizes) {
    for (const id of ['a', 'b', 'c', 'd', 'd_egress']) {
      const t = TARGET_NS[id];
      const parts = id === 'a' ? undefined : { wrapper: round(wrapperCost(p)) };
      rows.add({ id: 'np-packet-ns', n: p.n, at: id.replace('_egress', "'"), value: overEmpty(p, id), ...(parts ? { parts } : {}) }, t ? { max: t, target: `≤ ${t} ns` } : undefined);
    }
  }
  const m = r.maglev;
  if (m) {
    rows.add({ id: 'maglev-cold', n: m.services, value: m.maglev.coldMs, parts: { baseline: round(median(m.baseline.map((b) => b.coldMs))) } }, { max: 3000, target: '≤ 3 s' });
    rows.add({ id: 'maglev-change', n: m.services, value: median(m.maglev.changeMs), parts: { baseline: round(median(m.baseline.flatMap((b) => b.changeMs))) } }, { max: 2, target: '≤ 2 ms' });
  }
}

function e2eRows(r: E2eResults, rows: Rows): void {
  const sizes = [...new Set(r.points.map((p) => p.n))];
  const modes = [...new Set(r.points.map((p) => p.mode))];
  const stat = (mode: string, n: number, f: (p: E2eResults['points'][number]) => number): number => median(r.points.filter((p) => p.mode === mode && p.n === n).map(f));
  for (const n of sizes) {
    for (const at of ['local', 'remote'] as const) {
      for (const mode of modes) rows.add({ id: 'np-rps', n, mode: mode === 'lbctl' ? undefined : mode, at, value: stat(mode, n, (p) => p[at].load.rps) });
      // over the routed pod measured beside each mode, round by round (runs before rounds: medians of the points)
      const paired = r.points.some((p) => p.rounds);
      const rps = (m: string): number => (paired ? median(pairedRatios(r, m, n, at, 'rps')) : stat(m, n, (p) => p[at].load.rps));
      const p50 = (m: string): number => (paired ? median(pairedRatios(r, m, n, at, 'p50')) : stat(m, n, (p) => p[at].latency.p50_us) / stat('routed', n, (p) => p[at].latency.p50_us));
      rows.add({ id: 'np-rps-ratio', n, at, value: rps('lbctl') / Math.max(rps('iptables'), rps('nftables')) }, { min: 1.5, target: '≥ 1.5×' });
      rows.add({ id: 'np-p50-ratio', n, at, value: p50('lbctl') }, { max: 1.2, target: '≤ 1.2×' });
    }
    for (const mode of modes) {
      const ps = r.points.filter((p) => p.mode === mode && p.n === n && p.sustained);
      if (ps.length) rows.add({ id: 'np-sustained', n, mode: mode === 'lbctl' ? undefined : mode, at: 'remote', value: median(ps.map((p) => p.sustained!.rps)), parts: { failed: median(ps.map((p) => p.sustained!.failed)) } });
    }
  }
  for (const m of r.search?.modes ?? []) {
    rows.add({ id: 'np-rate-held', n: r.search!.n, mode: m.mode === 'lbctl' ? undefined : m.mode, at: 'remote', value: m.best, ...(m.failedAt !== undefined ? { parts: { failedAt: m.failedAt } } : {}), note: `${r.search!.window} s a rate, the pod closing first` });
  }
}

interface ProbeRow { kind: string; probesPerSecond: number; failures: number; workersProbed: number; minProbesPerWorker: number; allHealthy: boolean; p99ms: number; proberCpuPercent: number }

function probeRows(p: { backends: number; window: number; rows: ProbeRow[] }, rows: Rows): void {
  for (const s of p.rows) {
    rows.add({ id: 'probes', n: p.backends, at: s.kind, value: s.probesPerSecond, parts: { p99ms: s.p99ms, proberCpuPercent: s.proberCpuPercent } });
    const row = rows.out[rows.out.length - 1]!;
    row.target = 'keeps up';
    row.met = s.failures === 0 && s.workersProbed === p.backends && s.minProbesPerWorker >= p.window - 1 && s.allHealthy;
  }
}

function main(): void {
  const o = new Command()
    .option('--out <dir>', "the run's results", path.join(ROOT, 'bench/results'))
    .option('--commit <sha>', 'the commit the run measured (default: results.json\'s, else HEAD)')
    .option('--all', 'take every result file in --out, whatever its date')
    .parse()
    .opts<{ out: string; commit?: string; all?: boolean }>();
  const read = <T>(name: string): T | undefined => (existsSync(path.join(o.out, name)) ? (JSON.parse(readFileSync(path.join(o.out, name), 'utf8')) as T) : undefined);
  const main = read<Results>('results.json');
  if (!main) throw new Error(`${o.out}/results.json: no run to record`);
  const start = Date.parse(String(main.meta.date));
  // A file of this run: written (or started) after results.json's run started, and within three hours of it.
  const ours = (name: string, date: unknown): boolean => {
    const t = typeof date === 'string' ? Date.parse(date) : statSync(path.join(o.out, name)).mtimeMs;
    const ok = o.all || (t >= start && t - start < 3 * 3600_000);
    if (!ok) process.stderr.write(`record: ${name} is from another run (${new Date(t).toISOString()}), left out\n`);
    return ok;
  };
  const rows = new Rows();
  socketRows(main, rows);
  const parts: string[] = [];
  const fl = read<FileLoad & { date: string }>('file-load.json');
  if (fl && ours('file-load.json', fl.date)) fileLoadRows(fl, rows), parts.push('file-load.ts');
  const tc = read<TcResults>('nodeport-tc.json');
  if (tc && ours('nodeport-tc.json', tc.meta.date)) tcRows(tc, rows), parts.push('nodeport-tc.ts');
  const e2e = read<E2eResults>('nodeport-e2e.json');
  if (e2e && ours('nodeport-e2e.json', e2e.meta.date)) e2eRows(e2e, rows), parts.push('nodeport-e2e.ts');
  const pr = read<{ backends: number; window: number; rows: ProbeRow[] }>('probes.json');
  if (pr && ours('probes.json', undefined)) probeRows(pr, rows), parts.push('probes.ts');

  const git = (...args: string[]): string => execFileSync('git', ['-C', ROOT, ...args], { encoding: 'utf8' }).trim();
  const commit = o.commit ?? (typeof main.meta.commit === 'string' ? main.meta.commit : git('rev-parse', '--short=7', 'HEAD'));
  const sizes = [...new Set(main.points.map((p) => p.n))].sort((a, b) => a - b);
  const modes = [...new Set(main.points.map((p) => p.mode))];
  const full = !main.meta.quick && sizes.join() === '1,100,1000,10000,100000' && modes.length === 5 && parts.length === 4;
  const versions = main.meta.versions as Record<string, string> | undefined;
  const record: RunRecord = {
    schema: 1,
    date: String(main.meta.date),
    commit,
    machine: { cpus: Number(main.meta.cpus), cpu: String(main.meta.cpu), kernel: String(main.meta.kernel), ...(versions?.node ? { node: versions.node } : {}) },
    scope: full ? 'make bench' : [`bench/run.ts${main.meta.quick ? ' --quick' : ''} --sizes ${sizes.join(',')} --modes ${modes.join(',')} --reps ${main.meta.reps}`, ...parts].join('; '),
    source: `the run's own result files (${o.out === path.join(ROOT, 'bench/results') ? 'bench/results' : o.out}), by bench/record.ts`,
    results: rows.out,
  };
  const dir = path.join(o.out, 'runs');
  mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `${record.date.slice(0, 10)}-${commit}.json`);
  writeFileSync(file, `${JSON.stringify(record, null, 1)}\n`);
  process.stderr.write(`record: ${file} (${rows.out.length} results)\n`);
}

if (import.meta.url === `file://${process.argv[1]}`) main();
