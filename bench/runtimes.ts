// The scale rows of `make bench` (issue 18's, docs/benchmarks.md "Scale")
// on two Node.js runtimes in one run, alternated: bench/run.ts at 10,000
// and 100,000 services, lbctl and its floors only, once per runtime per
// round (A, B, A, B, ...), each whole run on that runtime: the bench
// process, so its floors (bench/cold-floor.ts, event-floor.ts,
// resync-floor.ts, spawned with process.execPath), and the agent
// (bin/lbctl with LBCTL_NODE). Every run's ratios are to the floors of the
// same run. Writes the runs' results.json under --work and the summary,
// per runtime the median over its runs, to --out as JSON (with the commit)
// and markdown.
//
//   node --import=@tapjs/typescript/import bench/runtimes.ts \
//     --runtime node20=/usr/bin/node --runtime node24=/opt/lbctl/node-v24.22.3/bin/node \
//     [--rounds 3] [--sizes 10000,100000] [--lock /work/bench.lock] [--work DIR] [--out bench/results/runtimes]
//
// --lock FILE: each bench/run.ts runs under flock(1) on FILE, so it never
// overlaps another benchmark (others may run between two of these).
// The datapath and rev-NAT profiles are left out (--no-profiles): they
// switch the kernel's run-time stats of every BPF program on (BPF_ENABLE_STATS), and the scale rows do
// not use them.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Command } from 'commander';
import { median, percentile, type Point, type Results } from './report.js';
import { ROOT } from './world.js';

interface Runtime {
  readonly label: string;
  readonly node: string;
  readonly version: string;
  readonly v8: string;
}

/** The scale rows of one run (one repetition at each size). NaN: not measured. */
export interface ScaleMetrics {
  cold10kMs: number;
  sync10kMs: number;
  floorCold10kMs: number;
  ready10kMs: number;
  hwm10kMiB: number;
  /** After the events at 10,000: VmRSS, its anonymous and file-backed parts, V8's heap and external memory (the agent's /metrics). */
  rss10kMiB: number;
  rssAnon10kMiB: number;
  rssFile10kMiB: number;
  heapTotal10kMiB: number;
  external10kMiB: number;
  resyncCpu10kMs: number;
  resync10kMs: number;
  floorResyncCpu10kMs: number;
  eventP99_10kMs: number;
  eventP50_10kMs: number;
  floorEventP99_10kMs: number;
  floorEventP50_10kMs: number;
  idleCpu10kMsPerS: number;
  cold100kMs: number;
  sync100kMs: number;
  floorCold100kMs: number;
  synced100kMs: number;
  coldHwm100kMiB: number;
  steady100kMiB: number;
  rssAnon100kMiB: number;
  rssFile100kMiB: number;
  idleCpu100kMsPerS: number;
  connectP50Ratio10kLast: number;
  connectP50Ratio100kLast: number;
  oomKills: number;
}

/** lbctl's event → map samples of a point: the EndpointSlice changes, the first add and the adds again (bench/report.ts). */
const eventSamples = (p: Point): number[] => [...(p.eventToMapMs ?? []), ...(p.addEventToMapMs !== undefined ? [p.addEventToMapMs] : []), ...(p.addAgainEventToMapMs ?? [])];

export function scaleMetrics(r: Results): ScaleMetrics {
  const lb = (n: number): Point | undefined => r.points.find((p) => p.mode === 'lbctl' && p.n === n);
  const floor = (n: number): Point | undefined => r.points.find((p) => p.mode === 'floor' && p.n === n);
  const a = lb(10_000);
  const b = lb(100_000);
  const num = (x: number | undefined): number => x ?? NaN;
  const med = (xs: readonly number[] | undefined): number => (xs && xs.length ? median(xs) : NaN);
  const ev = a ? eventSamples(a) : [];
  const fe = a?.floorEventToMapMs ?? [];
  const ccRatio = (n: number): number => {
    const l = lb(n)?.connections.last?.cc.p50_us;
    const f = floor(n)?.connections.pod?.cc.p50_us;
    return l !== undefined && f !== undefined ? l / f : NaN;
  };
  return {
    cold10kMs: num(a?.coldFromListMs),
    sync10kMs: num(a?.coldMs),
    floorCold10kMs: num(a?.floorCold?.fromListMs),
    ready10kMs: num(a?.startToReadyMs),
    hwm10kMiB: num(a?.memory?.hwmMiB),
    rss10kMiB: num(a?.memory?.rssMiB),
    rssAnon10kMiB: num(a?.memory?.rssAnonMiB),
    rssFile10kMiB: num(a?.memory?.rssFileMiB),
    heapTotal10kMiB: num(a?.memory?.heapTotalMiB),
    external10kMiB: num(a?.memory?.externalMiB),
    resyncCpu10kMs: med(a?.resyncCpuMs),
    resync10kMs: med(a?.resyncMs),
    floorResyncCpu10kMs: med(a?.floorResyncCpuMs),
    eventP99_10kMs: ev.length ? percentile(ev, 99) : NaN,
    eventP50_10kMs: ev.length ? percentile(ev, 50) : NaN,
    floorEventP99_10kMs: fe.length ? percentile(fe, 99) : NaN,
    floorEventP50_10kMs: fe.length ? percentile(fe, 50) : NaN,
    idleCpu10kMsPerS: med(a?.idleCpuMsPerS),
    cold100kMs: num(b?.coldFromListMs),
    sync100kMs: num(b?.coldMs),
    floorCold100kMs: num(b?.floorCold?.fromListMs),
    synced100kMs: num(b?.startToSyncedMs),
    coldHwm100kMiB: num(b?.coldHwmMiB),
    steady100kMiB: num(b?.memoryIdle?.rssMiB),
    rssAnon100kMiB: num(b?.memory?.rssAnonMiB),
    rssFile100kMiB: num(b?.memory?.rssFileMiB),
    idleCpu100kMsPerS: med(b?.idleCpuMsPerS),
    connectP50Ratio10kLast: ccRatio(10_000),
    connectP50Ratio100kLast: ccRatio(100_000),
    oomKills: Math.max(0, ...r.points.map((p) => p.oomKills ?? 0)),
  };
}

/** lbctl's value over its floor's, per run, then the median over the runs. */
type Pair = readonly [keyof ScaleMetrics, keyof ScaleMetrics];
const RATIOS: Record<string, Pair> = {
  cold10k: ['cold10kMs', 'floorCold10kMs'],
  resyncCpu10k: ['resyncCpu10kMs', 'floorResyncCpu10kMs'],
  eventP99_10k: ['eventP99_10kMs', 'floorEventP99_10kMs'],
  eventP50_10k: ['eventP50_10kMs', 'floorEventP50_10kMs'],
  cold100k: ['cold100kMs', 'floorCold100kMs'],
};

interface Summary {
  readonly runs: number;
  readonly medians: Record<keyof ScaleMetrics, number>;
  readonly ratios: Record<string, number>;
}

export function summarize(runs: readonly ScaleMetrics[]): Summary {
  const keys = Object.keys(runs[0] ?? {}) as Array<keyof ScaleMetrics>;
  const medians = Object.fromEntries(keys.map((k) => [k, median(runs.map((m) => m[k]).filter((x) => !Number.isNaN(x)))])) as Record<keyof ScaleMetrics, number>;
  const ratios = Object.fromEntries(
    Object.entries(RATIOS).map(([name, [x, f]]) => [name, median(runs.map((m) => m[x] / m[f]).filter((v) => Number.isFinite(v)))]),
  );
  return { runs: runs.length, medians, ratios };
}

const ms = (x: number): string => (Number.isNaN(x) ? '–' : x >= 1000 ? `${(x / 1000).toFixed(2)} s` : `${x.toFixed(x < 10 ? 2 : 0)} ms`);
const mib = (x: number): string => (Number.isNaN(x) ? '–' : `${x.toFixed(0)} MiB`);
const times = (x: number): string => (Number.isNaN(x) ? '–' : `${x.toFixed(2)}×`);

/** The table: one row per scale row, a column per runtime, and B against A. */
export function table(rts: readonly Runtime[], sums: readonly Summary[]): string {
  const [A, B] = sums as [Summary, Summary];
  type Row = [what: string, target: string, show: (s: Summary) => string, value: (s: Summary) => number];
  const m = (k: keyof ScaleMetrics) => (s: Summary): number => s.medians[k];
  const withFloor = (k: keyof ScaleMetrics, f: keyof ScaleMetrics, r: string) => (s: Summary): string => `${ms(s.medians[k])} (floor ${ms(s.medians[f])}, ${times(s.ratios[r]!)})`;
  const rows: Row[] = [
    ['cold sync at 10,000 (first list request → every frontend in the kernel)', '≤ 0.2 s', withFloor('cold10kMs', 'floorCold10kMs', 'cold10k'), m('cold10kMs')],
    ['  the sync itself', '', (s) => ms(s.medians.sync10kMs), m('sync10kMs')],
    ['start → ready at 10,000', '≤ 1.0 s', (s) => ms(s.medians.ready10kMs), m('ready10kMs')],
    ['peak RSS at 10,000 (VmHWM after the events)', '≤ 150 MiB', (s) => mib(s.medians.hwm10kMiB), m('hwm10kMiB')],
    ['  RSS after the events: anonymous + file-backed', '', (s) => `${mib(s.medians.rss10kMiB)}: ${mib(s.medians.rssAnon10kMiB)} + ${mib(s.medians.rssFile10kMiB)}`, m('rss10kMiB')],
    ['  V8 heap (total) and external', '', (s) => `${mib(s.medians.heapTotal10kMiB)}, ${mib(s.medians.external10kMiB)}`, m('heapTotal10kMiB')],
    ['CPU of one periodic resync at 10,000', '≤ 50 ms', withFloor('resyncCpu10kMs', 'floorResyncCpu10kMs', 'resyncCpu10k'), m('resyncCpu10kMs')],
    ['event → datapath p99 at 10,000', '≤ 2 ms', withFloor('eventP99_10kMs', 'floorEventP99_10kMs', 'eventP99_10k'), m('eventP99_10kMs')],
    ['event → datapath p50 at 10,000', '', withFloor('eventP50_10kMs', 'floorEventP50_10kMs', 'eventP50_10k'), m('eventP50_10kMs')],
    ['cold sync at 100,000', '≤ 1.5 s', withFloor('cold100kMs', 'floorCold100kMs', 'cold100k'), m('cold100kMs')],
    ['  the sync itself', '', (s) => ms(s.medians.sync100kMs), m('sync100kMs')],
    ['start → synced at 100,000', '≤ 3 s', (s) => ms(s.medians.synced100kMs), m('synced100kMs')],
    ['peak RSS during the 100,000 cold sync', '≤ 400 MiB', (s) => mib(s.medians.coldHwm100kMiB), m('coldHwm100kMiB')],
    ['steady RSS at 100,000 (idle 15 s)', '≤ 300 MiB', (s) => mib(s.medians.steady100kMiB), m('steady100kMiB')],
    ['  RSS after the events at 100,000: anonymous + file-backed', '', (s) => `${mib(s.medians.rssAnon100kMiB)} + ${mib(s.medians.rssFile100kMiB)}`, m('rssAnon100kMiB')],
    ['idle CPU at 10,000 (ms a second)', '', (s) => ms(s.medians.idleCpu10kMsPerS), m('idleCpu10kMsPerS')],
    ['idle CPU at 100,000 (ms a second)', '', (s) => ms(s.medians.idleCpu100kMsPerS), m('idleCpu100kMsPerS')],
    ['connect+close p50, last of 10,000 (datapath: no Node.js in it)', '≤ 1.03× the floor', (s) => times(s.medians.connectP50Ratio10kLast), m('connectP50Ratio10kLast')],
    ['connect+close p50, last of 100,000', '≤ 1.03× the floor', (s) => times(s.medians.connectP50Ratio100kLast), m('connectP50Ratio100kLast')],
    ['OOM kills under the DaemonSet limit', '0', (s) => String(s.medians.oomKills), m('oomKills')],
  ];
  const out = [
    `| scale row | target | ${rts[0]!.label} (${rts[0]!.version}) | ${rts[1]!.label} (${rts[1]!.version}) | ${rts[1]!.label} / ${rts[0]!.label} |`,
    '|---|---|---|---|---:|',
  ];
  for (const [what, target, show, value] of rows) {
    const r = value(B) / value(A);
    out.push(`| ${what} | ${target} | ${show(A)} | ${show(B)} | ${Number.isFinite(r) ? `${r.toFixed(2)}` : '–'} |`);
  }
  return out.join('\n') + '\n';
}

function commit(): string {
  try {
    const head = execFileSync('git', ['rev-parse', 'HEAD'], { cwd: ROOT, encoding: 'utf8' }).trim();
    const dirty = spawnSync('git', ['diff', '--quiet', 'HEAD', '--'], { cwd: ROOT }).status !== 0;
    return dirty ? `${head}-dirty` : head;
  } catch {
    return 'unknown';
  }
}

function main(): void {
  const o = new Command()
    .option('--runtime <label=node>', 'a runtime: a label and its node binary (twice)', (v: string, acc: string[]) => [...acc, v], [] as string[])
    .option('--rounds <n>', 'runs per runtime, alternated', '3')
    .option('--sizes <list>', 'numbers of services', '10000,100000')
    .option('--lock <file>', 'run each bench/run.ts under flock on this file')
    .option('--work <dir>', "where each run's results go", path.join(os.tmpdir(), `lbctl-bench-runtimes-${process.pid}`))
    .option('--out <prefix>', 'the summary: PREFIX.json and PREFIX.md', path.join(ROOT, 'bench/results/runtimes'))
    .option('--summarize-only', 'do not run: summarize the runs already in --work')
    .parse()
    .opts<{ runtime: string[]; rounds: string; sizes: string; lock?: string; work: string; out: string; summarizeOnly?: boolean }>();
  if (o.runtime.length !== 2) throw new Error('--runtime: name exactly two, e.g. --runtime node20=/usr/bin/node --runtime node24=/opt/lbctl/node-v24.22.3/bin/node');
  const rts: Runtime[] = o.runtime.map((spec) => {
    const [label, node] = spec.split('=') as [string, string];
    const [version, v8] = execFileSync(node, ['-p', 'process.version + " " + process.versions.v8'], { encoding: 'utf8' }).trim().split(' ') as [string, string];
    return { label, node, version, v8 };
  });
  const rounds = Number(o.rounds);
  mkdirSync(o.work, { recursive: true });
  const order: Array<{ round: number; rt: Runtime; dir: string }> = [];
  for (let round = 0; round < rounds; round++) for (const rt of rts) order.push({ round, rt, dir: path.join(o.work, `round${round + 1}-${rt.label}`) });
  for (const { round, rt, dir } of order) {
    if (o.summarizeOnly || existsSync(path.join(dir, 'results.md'))) continue;
    const cmd = [
      'env', `LBCTL_NODE=${rt.node}`, 'TS_NODE_TRANSPILE_ONLY=1',
      rt.node, '--import=@tapjs/typescript/import', path.join(ROOT, 'bench/run.ts'),
      '--sizes', o.sizes, '--modes', 'lbctl', '--reps', '1', '--no-profiles', '--out', dir,
    ];
    const argv = o.lock ? ['flock', o.lock, ...cmd] : cmd;
    mkdirSync(dir, { recursive: true });
    writeFileSync(path.join(dir, 'commit'), `${commit()}\n`);
    process.stderr.write(`runtimes: round ${round + 1}/${rounds}, ${rt.label} (${rt.version}): ${argv.join(' ')}\n`);
    const t0 = Date.now();
    const r = spawnSync(argv[0]!, argv.slice(1), { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
    if (r.status !== 0) throw new Error(`bench/run.ts on ${rt.label} failed (${r.status ?? r.signal})`);
    process.stderr.write(`runtimes: round ${round + 1}, ${rt.label}: ${((Date.now() - t0) / 60_000).toFixed(1)} min\n`);
  }
  const runs = order.map(({ round, rt, dir }) => {
    const r = JSON.parse(readFileSync(path.join(dir, 'results.json'), 'utf8')) as Results;
    if ((r.meta.versions as Record<string, string>).node !== rt.version) throw new Error(`${dir}: ran on ${String((r.meta.versions as Record<string, string>).node)}, not ${rt.version}`);
    const at = existsSync(path.join(dir, 'commit')) ? readFileSync(path.join(dir, 'commit'), 'utf8').trim() : 'unknown';
    return { round: round + 1, runtime: rt.label, node: rt.version, commit: at, date: r.meta.date, metrics: scaleMetrics(r) };
  });
  const sums = rts.map((rt) => summarize(runs.filter((x) => x.runtime === rt.label).map((x) => x.metrics)));
  const doc = {
    what: "the scale rows of make bench (bench/run.ts --sizes 10000,100000 --modes lbctl --reps 1 --no-profiles) on two Node.js runtimes, alternated; each run's floors on the same runtime; per runtime the median over its runs",
    // The checkout that wrote this summary; each run names its own (runs[].commit), and commits lists them.
    summaryCommit: commit(),
    commits: [...new Set(runs.map((x) => x.commit))],
    date: new Date().toISOString(),
    kernel: os.release(),
    cpu: os.cpus()[0]?.model ?? 'unknown',
    cpus: os.cpus().length,
    sizes: o.sizes.split(',').map(Number),
    order: order.map(({ round, rt }) => `${round + 1}:${rt.label}`),
    runtimes: rts.map((rt, i) => ({ ...rt, summary: sums[i] })),
    runs,
  };
  mkdirSync(path.dirname(o.out), { recursive: true });
  writeFileSync(`${o.out}.json`, `${JSON.stringify(doc, null, 1)}\n`);
  const md = [
    `# Node.js ${rts[0]!.version} and ${rts[1]!.version}: make bench's scale rows`,
    '',
    `${doc.date}, ${doc.commits.length === 1 ? `commit ${doc.commits[0]!.slice(0, 12)}` : `commits ${doc.commits.map((c) => c.slice(0, 12)).join(', ')} (per run in the JSON)`}, kernel ${doc.kernel}, ${doc.cpus} × ${doc.cpu}. bench/run.ts at ${doc.sizes.map((n) => n.toLocaleString('en')).join(' and ')} services, lbctl and its floors, ${rounds} runs per runtime in the order ${doc.order.join(', ')}; each whole run (the bench, its floors and the agent) on one runtime; ratios to the floors of the same run; medians over each runtime's runs. Raw per run: ${path.basename(o.out)}.json.`,
    '',
    table(rts, sums),
  ].join('\n');
  writeFileSync(`${o.out}.md`, md);
  process.stdout.write(md);
}

if (import.meta.url === `file://${process.argv[1]}`) main();
