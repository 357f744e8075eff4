// Turns bench results into the markdown tables (with ratios against the
// floor of the same run and the issue's targets) and the plots (gnuplot,
// SVG and PNG).
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { revnatTable, type RevnatProfile } from './revnat.js';
import { sockFloorTable, type SockFloorResult } from './sock-floor.js';

export interface ConnStats {
  p50_us: number;
  p90_us: number;
  p99_us: number;
  p999_us: number;
  mean_us: number;
  failed: number;
  count: number;
}

export interface Point {
  mode: string;
  n: number;
  rep: number;
  /** 'pod' for the floor; 'first' and 'last' service in rule order otherwise. */
  connections: Record<string, { cc: ConnStats; rr: ConnStats }>;
  /** lbctl: lbctl, the minimal socket LB over the same maps and a direct connect, interleaved (bench/sock-floor.ts). */
  sockFloor?: SockFloorResult | undefined;
  coldMs: number;
  startToSyncedMs?: number | undefined;
  /** lbctl: spawning the agent → /readyz 200. */
  startToReadyMs?: number | undefined;
  /** lbctl: the first list (or watch-list) request → the cold sync logged. */
  coldFromListMs?: number | undefined;
  /** lbctl: VmHWM right after the cold sync (MiB). */
  coldHwmMiB?: number | undefined;
  /** lbctl: the memory limit the agent ran under (a cgroup's, MiB), and the OOM kills in it so far. */
  memoryLimitMiB?: number | undefined;
  oomKills?: number | undefined;
  /** lbctl: periodic full resyncs: each one's duration, and the agent's CPU over the period holding it (ms). */
  resyncMs?: number[] | undefined;
  resyncCpuMs?: number[] | undefined;
  /** lbctl: the same maps read through bench/resync-floor.ts (the baseline: a bare process's batch lookups), CPU ms per read. */
  floorResyncCpuMs?: number[] | undefined;
  coldPhasesMs?: Record<string, number> | undefined;
  addMs?: number | undefined;
  addEventToMapMs?: number | undefined;
  addAgainMs?: number[] | undefined;
  addAgainEventToMapMs?: number[] | undefined;
  eventToMapMs?: number[] | undefined;
  /** lbctl: the same EndpointSlice changes through bench/event-floor.ts (the baseline: a bare watcher writing the map). */
  floorEventToMapMs?: number[] | undefined;
  /** lbctl: the same cold start through bench/cold-floor.ts (the baseline: a bare lister writing the entries), first list request → its last write, and its own split (ms). */
  floorCold?: { fromListMs: number; listMs: number; encodeMs: number; kernelMs: number; entries: number } | undefined;
  memory?: { rssMiB: number; hwmMiB: number; rssAnonMiB?: number | undefined; rssFileMiB?: number | undefined; heapUsedMiB?: number | undefined; heapTotalMiB?: number | undefined; externalMiB?: number | undefined } | undefined;
  memoryIdle?: { rssMiB: number; rssAnonMiB?: number | undefined; rssFileMiB?: number | undefined } | undefined;
  /** lbctl: the agent's CPU (every thread) in each second while nothing changes, after it settled, ms. */
  idleCpuMsPerS?: number[] | undefined;
}

export interface Results {
  meta: Record<string, unknown>;
  points: Point[];
  skipped: Array<{ mode: string; n: number; why: string }>;
  /** Per-program run time from the kernel's BPF accounting, per connect through lbctl. */
  revnatProfile?: RevnatProfile;
  datapathProfile?: { n: number; connects: number; p50_us: number; programs: Array<{ program: string; runs: number; avgNs: number; nsPerConnect: number }> };
}

export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** Nearest-rank percentile. */
/** lbctl's event → map samples of one point: the EndpointSlice changes, the first add and the adds again. */
function eventSamples(p: Point): number[] {
  return [...(p.eventToMapMs ?? []), ...(p.addEventToMapMs !== undefined ? [p.addEventToMapMs] : []), ...(p.addAgainEventToMapMs ?? [])];
}

export function percentile(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

const f = (x: number | undefined, digits = 1): string => (x === undefined || Number.isNaN(x) ? '–' : x.toFixed(digits));
const ratio = (x: number, floor: number): string => (Number.isNaN(x) || Number.isNaN(floor) ? '–' : `${(x / floor).toFixed(2)}×`);

export function report(r: Results, out: string): void {
  const sizes = [...new Set(r.points.map((p) => p.n))].sort((a, b) => a - b);
  const modes = [...new Set(r.points.map((p) => p.mode))];
  const at = (mode: string, n: number): Point[] => r.points.filter((p) => p.mode === mode && p.n === n);
  const conn = (mode: string, n: number, which: string, kind: 'cc' | 'rr', stat: 'p50_us' | 'p99_us'): number =>
    median(at(mode, n).map((p) => p.connections[which]?.[kind][stat]).filter((x): x is number => x !== undefined));
  const floor = (n: number, kind: 'cc' | 'rr', stat: 'p50_us' | 'p99_us'): number => conn('floor', n, 'pod', kind, stat);
  const m = r.meta;
  const lines: string[] = [];
  lines.push(`# lbctl benchmark results`, '');
  lines.push(
    `${m.date}, kernel ${m.kernel}, ${m.cpus} × ${m.cpu}. ${m.quick ? 'Quick mode. ' : ''}Every point repeated ${m.reps} times; medians shown. ` +
      `Connection cost: ${m.ccCount} timed connect()+close() and ${m.rrCount} connect+64-byte request/reply+close per point, after 1,000 warm-up ones and 20 sanity connects. ` +
      `Pinning: ${m.pinning}. Ratios are against the floor (a direct connection to the pod address with no rules) measured in the same run.`,
    '',
  );
  const v = m.versions as Record<string, string>;
  lines.push(`Tools: ${Object.entries(v).map(([k, x]) => `${k} ${x}`).join('; ')}.`, '');

  for (const [kind, title] of [['cc', 'connect()+close()'], ['rr', 'connect + 64-byte request/reply + close']] as const) {
    lines.push(`## Connection cost: ${title} (µs)`, '');
    lines.push('| N | mode | service | p50 | p50 / floor | p99 | p99 / floor |', '|---:|---|---|---:|---:|---:|---:|');
    for (const n of sizes) {
      for (const mode of modes) {
        for (const which of mode === 'floor' ? ['pod'] : ['first', 'last']) {
          if (at(mode, n).length === 0) continue;
          const p50 = conn(mode, n, which, kind, 'p50_us');
          const p99 = conn(mode, n, which, kind, 'p99_us');
          lines.push(`| ${n.toLocaleString('en')} | ${mode} | ${which} | ${f(p50, 2)} | ${ratio(p50, floor(n, kind, 'p50_us'))} | ${f(p99, 2)} | ${ratio(p99, floor(n, kind, 'p99_us'))} |`);
        }
      }
    }
    lines.push('');
  }

  const sf = r.points.flatMap((p) => (p.sockFloor ? [p.sockFloor] : []));
  if (sf.length > 0) {
    lines.push('## The socket path against its floor', '');
    lines.push(
      'connect()+close() through the last service: lbctl, the minimal socket LB (bench/sock_floor.c: look up, pick, rewrite; over lbctl\'s maps) and a direct connect to the pod, ' +
        `interleaved in one world (${sf[0]!.rounds} rounds of ${sf[0]!.block} connects per arm and repetition, order rotated); each ratio is the median over every round of the arm\'s p50 over the same round\'s direct p50.`,
      '',
    );
    lines.push(...sockFloorTable(sf), '');
  }

  lines.push('## Control plane (ms)', '');
  lines.push(
    'Cold: programming N services with 3 endpoints each into empty maps / an empty ruleset (lbctl: the agent\'s first sync, from the listed objects to the maps written; kube-proxy modes: the restore command, timed around its process). ' +
      'Add one: one more service on top of N (lbctl: the sync the watch event causes; iptables: `iptables-restore --noflush` of what kube-proxy\'s partial sync writes; nftables: the incremental `nft -f` transaction). ' +
      'For lbctl, "first" is the first change after start (slower than later ones: docs/benchmarks.md says what is known of why) and "again" the median of the same service deleted and added again 5 times in the running agent. ' +
      'Event → map: from the API server sending a change to the kernel map holding it, over the EndpointSlice changes and the adds.',
    '',
  );
  lines.push('| N | mode | cold | add one (lbctl: first) | add one again (lbctl) | lbctl start → synced | event → map p50 | event → map p99 | agent RSS (MiB) | agent RSS, idle 15 s (MiB) | V8 heap used / reserved (MiB) |', '|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const n of sizes) {
    for (const mode of modes.filter((x) => x !== 'floor')) {
      const ps = at(mode, n);
      if (ps.length === 0) continue;
      const events = ps.flatMap(eventSamples);
      const again = ps.flatMap((p) => p.addAgainMs ?? []);
      lines.push(
        `| ${n.toLocaleString('en')} | ${mode} | ${f(median(ps.map((p) => p.coldMs)), 1)} | ${f(median(ps.map((p) => p.addMs ?? NaN)), 2)} | ${again.length ? f(median(again), 2) : ''} | ` +
          `${mode === 'lbctl' ? f(median(ps.map((p) => p.startToSyncedMs ?? NaN)), 0) : ''} | ${events.length ? f(percentile(events, 50), 2) : ''} | ${events.length ? f(percentile(events, 99), 2) : ''} | ` +
          `${mode === 'lbctl' ? f(median(ps.map((p) => p.memory?.rssMiB ?? NaN)), 1) : ''} | ` +
          `${mode === 'lbctl' ? f(median(ps.map((p) => p.memoryIdle?.rssMiB ?? NaN)), 1) : ''} | ` +
          `${mode === 'lbctl' ? `${f(median(ps.map((p) => p.memory?.heapUsedMiB ?? NaN)), 1)} / ${f(median(ps.map((p) => p.memory?.heapTotalMiB ?? NaN)), 1)}` : ''} |`,
      );
    }
  }
  lines.push('');
  // The agent's own split of its cold sync (SyncReport.phasesMs): where the time goes.
  const phased = sizes.filter((n) => at('lbctl', n).some((p) => p.coldPhasesMs));
  if (phased.length) {
    const names = ['model', 'ids', 'plan', 'apply'];
    lines.push(
      "lbctl's cold sync by phase, ms (the agent's own timing, median): model = recomputing the desired state; ids = assigning backend and rev-NAT ids; plan = the ordered writes; apply = encoding, the batched map writes and the realized-state bookkeeping.",
      '',
      `| N | ${names.join(' | ')} | per service (µs) |`,
      `|---:|${names.map(() => '---:|').join('')}---:|`,
    );
    for (const n of phased) {
      const ps = at('lbctl', n).filter((p) => p.coldPhasesMs);
      const cells = names.map((k) => f(median(ps.map((p) => p.coldPhasesMs![k] ?? NaN)), 1));
      lines.push(`| ${n.toLocaleString('en')} | ${cells.join(' | ')} | ${f((median(ps.map((p) => p.coldMs)) * 1000) / n, 1)} |`);
    }
    lines.push('');
  }
  if (r.skipped.length) {
    lines.push('Not measured:', '', ...r.skipped.map((s) => `- ${s.mode} at N=${s.n.toLocaleString('en')}: ${s.why}`), '');
  }

  // Targets (issue 5), each checked against this run.
  const targets: Array<[string, boolean | undefined, string]> = [];
  const lb = (n: number): Point[] => at('lbctl', n);
  for (const n of sizes.filter((x) => lb(x).length)) {
    for (const which of ['first', 'last']) {
      const p50 = conn('lbctl', n, which, 'cc', 'p50_us') / floor(n, 'cc', 'p50_us');
      const p99 = conn('lbctl', n, which, 'cc', 'p99_us') / floor(n, 'cc', 'p99_us');
      targets.push([`connect+close p50 ≤ 1.05× floor, N=${n.toLocaleString('en')} (${which})`, p50 <= 1.05, `${p50.toFixed(3)}×`]);
      targets.push([`connect+close p99 ≤ 1.2× floor, N=${n.toLocaleString('en')} (${which})`, p99 <= 1.2, `${p99.toFixed(3)}×`]);
    }
  }
  const cold = (n: number): number => median(lb(n).map((p) => p.coldMs));
  if (lb(10_000).length) targets.push(['programming 10,000 services cold ≤ 200 ms', cold(10_000) <= 200, `${f(cold(10_000))} ms`]);
  if (lb(100_000).length) targets.push(['programming 100,000 services cold ≤ 2 s', cold(100_000) <= 2000, `${f(cold(100_000))} ms`]);
  if (lb(10_000).length) {
    const add = median(lb(10_000).map((p) => p.addMs ?? NaN));
    targets.push(['adding one service at 10,000 ≤ 1 ms (the first change after start)', add <= 1, `${f(add, 2)} ms`]);
    const again = median(lb(10_000).flatMap((p) => p.addAgainMs ?? []));
    if (!Number.isNaN(again)) targets.push(['adding one service at 10,000 ≤ 1 ms (again, in the running agent)', again <= 1, `${f(again, 2)} ms`]);
    const ev = lb(10_000).flatMap(eventSamples);
    targets.push(['event → datapath p99 ≤ 5 ms at 10,000', percentile(ev, 99) <= 5, `${f(percentile(ev, 99), 2)} ms`]);
    const rss = median(lb(10_000).map((p) => p.memory?.rssMiB ?? NaN));
    targets.push(['agent RSS ≤ 150 MB at 10,000 services (after the events)', rss * 1.048576 <= 150, `${f(rss)} MiB = ${f(rss * 1.048576)} MB`]);
    const idle = median(lb(10_000).map((p) => p.memoryIdle?.rssMiB ?? NaN));
    if (!Number.isNaN(idle)) targets.push(['agent RSS ≤ 150 MB at 10,000 services (idle 15 s)', idle * 1.048576 <= 150, `${f(idle)} MiB = ${f(idle * 1.048576)} MB`]);
  }
  const memSizes = sizes.filter((n) => lb(n).some((p) => p.memory));
  if (memSizes.length >= 2) {
    const lo = memSizes[0]!;
    const hi = memSizes[memSizes.length - 1]!;
    const per = ((median(lb(hi).map((p) => p.memory!.rssMiB)) - median(lb(lo).map((p) => p.memory!.rssMiB))) * 1024 * 1024) / (hi - lo);
    targets.push([`agent memory growth per service (N=${lo}→${hi})`, undefined, `${(per / 1024).toFixed(2)} KiB`]);
  }
  const dp = r.datapathProfile;
  if (dp) {
    lines.push(
      '## Where a connection through lbctl spends its time (BPF programs)',
      '',
      `BPF run-time stats (BPF_ENABLE_STATS) during ${dp.connects.toLocaleString('en')} connect()+close() through a ClusterIP at N=${dp.n.toLocaleString('en')} (a separate run: the accounting adds its own cost; p50 there ${dp.p50_us} µs).`,
      '',
      '| program | runs | average ns per run | ns per connection |',
      '|---|---:|---:|---:|',
      ...dp.programs.map((p) => `| ${p.program} | ${p.runs.toLocaleString('en')} | ${p.avgNs.toFixed(0)} | ${p.nsPerConnect.toFixed(0)} |`),
      `| all | | | ${dp.programs.reduce((a, p) => a + p.nsPerConnect, 0).toFixed(0)} |`,
      '',
    );
  }
  const rv = r.revnatProfile;
  if (rv) {
    lines.push(
      '## The socket rev-NAT write: before and after (BPF programs)',
      '',
      `BPF run-time stats (BPF_ENABLE_STATS), medians of ${rv.reps} alternating measurements of each build, ${rv.count.toLocaleString('en')} operations each (bench/revnat.ts). ` +
        '*before*: sock.c built with -DLB_REVNAT_ALWAYS_WRITE=1 (the entry rewritten on every connect and datagram); *after*: what lbctl loads (a UDP socket\'s entry is looked up and written only when missing or different).',
      '',
      ...revnatTable(rv),
      '',
    );
  }
  lines.push(...scaleTargets(r, sizes, lb, conn, floor));
  lines.push('## Targets', '', '| target | result | measured |', '|---|---|---:|');
  for (const [what, ok, val] of targets) lines.push(`| ${what} | ${ok === undefined ? 'reported' : ok ? 'met' : '**missed**'} | ${val} |`);
  lines.push('', '![connection cost](connect.svg)', '', '![programming cost](program.svg)', '');
  writeFileSync(path.join(out, 'results.md'), `${lines.join('\n')}\n`);
  plot(r, out, sizes, modes, conn, at);
}

/**
 * Issue 18's table: each row with its target beside it and the verdict of
 * this run. A row whose N was not run says so rather than passing.
 */
function scaleTargets(
  r: Results,
  sizes: readonly number[],
  lb: (n: number) => Point[],
  conn: (mode: string, n: number, which: string, kind: 'cc' | 'rr', stat: 'p50_us' | 'p99_us') => number,
  floor: (n: number, kind: 'cc' | 'rr', stat: 'p50_us' | 'p99_us') => number,
): string[] {
  type Row = [what: string, target: string, measured: string, ok: boolean | undefined];
  const rows: Row[] = [];
  const med = (n: number, get: (p: Point) => number | undefined): number => median(lb(n).map((p) => get(p) ?? NaN).filter((x) => !Number.isNaN(x)));
  const ms = (x: number): string => (Number.isNaN(x) ? 'not measured' : x >= 1000 ? `${(x / 1000).toFixed(2)} s` : `${x.toFixed(x < 10 ? 2 : 0)} ms`);
  const mib = (x: number): string => (Number.isNaN(x) ? 'not measured' : `${x.toFixed(0)} MiB`);
  const row = (what: string, target: string, x: number, limit: number, show: (x: number) => string): void => {
    rows.push([what, target, show(x), Number.isNaN(x) ? undefined : x <= limit]);
  };
  const has = (n: number): boolean => lb(n).length > 0;
  const notRun = (what: string, target: string, n: number): void => {
    rows.push([what, target, `N=${n.toLocaleString('en')} not run`, undefined]);
  };
  // The cold floor of the same N (bench/cold-floor.ts): its time, lbctl's as a multiple of it, and the floor's own split.
  const coldVsFloor = (n: number, x: number): string => {
    const f = med(n, (p) => p.floorCold?.fromListMs);
    if (Number.isNaN(f)) return '';
    const part = (k: 'listMs' | 'encodeMs' | 'kernelMs'): string => ms(med(n, (p) => p.floorCold?.[k]));
    return `; the floor, a bare lister writing the same entries on the same CPU: ${ms(f)}, lbctl ${(x / f).toFixed(1)}× it; the floor's lists ${part('listMs')}, encoding ${part('encodeMs')}, kernel ${part('kernelMs')}`;
  };
  // 10,000
  if (has(10_000)) {
    const fromList = med(10_000, (p) => p.coldFromListMs);
    row('cold sync at 10,000 (first list request → every frontend in the kernel)', '≤ 0.2 s', fromList, 200, (x) => `${ms(x)} (the sync itself: ${ms(med(10_000, (p) => p.coldMs))}${coldVsFloor(10_000, x)})`);
    row('start → ready at 10,000 (/readyz 200)', '≤ 1.0 s', med(10_000, (p) => p.startToReadyMs), 1000, ms);
    row('peak RSS at 10,000 (VmHWM, after the events)', '≤ 150 MiB', med(10_000, (p) => p.memory?.hwmMiB), 150, mib);
    const rf = lb(10_000).flatMap((p) => p.floorResyncCpuMs ?? []);
    const resyncFloor = rf.length ? `; the floor, a bare process reading the same maps on the same CPU: ${ms(median(rf))} of CPU a read` : '';
    row('CPU of one periodic full resync at 10,000 (every thread, over its period)', '≤ 50 ms', median(lb(10_000).flatMap((p) => p.resyncCpuMs ?? [])), 50, (x) => `${ms(x)} (the resync's own duration: ${ms(median(lb(10_000).flatMap((p) => p.resyncMs ?? [])))}${resyncFloor})`);
    const ev = lb(10_000).flatMap(eventSamples);
    const fl = lb(10_000).flatMap((p) => p.floorEventToMapMs ?? []);
    const vsFloor = fl.length ? `; the floor, a bare watcher writing the map on the same CPU: p99 ${ms(percentile(fl, 99))}, p50 ${ms(percentile(fl, 50))}` : '';
    row('event → datapath p99 at 10,000 (API server sends → kernel map holds it)', '≤ 2 ms', ev.length ? percentile(ev, 99) : NaN, 2, (x) => `${ms(x)} (p50 ${ms(percentile(ev, 50))}, ${ev.length} events${vsFloor})`);
  } else {
    for (const [w, t] of [['cold sync at 10,000', '≤ 0.2 s'], ['start → ready at 10,000', '≤ 1.0 s'], ['peak RSS at 10,000', '≤ 150 MiB'], ['CPU of one periodic full resync at 10,000', '≤ 50 ms'], ['event → datapath p99 at 10,000', '≤ 2 ms']] as const) notRun(w, t, 10_000);
  }
  // 100,000
  if (has(100_000)) {
    row('cold sync at 100,000 (first list request → every frontend in the kernel)', '≤ 1.5 s', med(100_000, (p) => p.coldFromListMs), 1500, (x) => `${ms(x)} (the sync itself: ${ms(med(100_000, (p) => p.coldMs))}${coldVsFloor(100_000, x)})`);
    row('start → synced at 100,000', '≤ 3 s', med(100_000, (p) => p.startToSyncedMs), 3000, ms);
    row('peak RSS during the 100,000 cold sync (VmHWM right after it)', '≤ 400 MiB', med(100_000, (p) => p.coldHwmMiB), 400, mib);
    row('steady RSS at 100,000 (idle 15 s)', '≤ 300 MiB', med(100_000, (p) => p.memoryIdle?.rssMiB), 300, mib);
  } else {
    for (const [w, t] of [['cold sync at 100,000', '≤ 1.5 s'], ['start → synced at 100,000', '≤ 3 s'], ['peak RSS during the 100,000 cold sync', '≤ 400 MiB'], ['steady RSS at 100,000', '≤ 300 MiB']] as const) notRun(w, t, 100_000);
  }
  // The datapath, at every point.
  for (const n of sizes.filter(has)) {
    for (const which of ['first', 'last']) {
      const x = conn('lbctl', n, which, 'cc', 'p50_us') / floor(n, 'cc', 'p50_us');
      row(`connect+close p50 through the ${which} of ${n.toLocaleString('en')} services`, '≤ 1.03× the floor', x, 1.03, (v) => `${v.toFixed(3)}×`);
    }
  }
  // The memory limit, at every point.
  const limit = r.meta.memoryLimitMiB;
  if (typeof limit === 'number') {
    const worst = Math.max(...sizes.filter(has).flatMap((n) => lb(n).map((p) => p.memory?.hwmMiB ?? p.coldHwmMiB ?? 0)));
    const kills = Math.max(0, ...r.points.map((p) => p.oomKills ?? 0));
    rows.push([`every point within the DaemonSet's memory limit (${limit.toFixed(0)} MiB, a cgroup's)`, 'no OOM kill', `largest peak ${mib(worst)}; ${kills} OOM kills`, kills === 0 && worst <= limit]);
  } else {
    rows.push(["every point within the DaemonSet's memory limit", 'no OOM kill', 'not measured (no memory controller, or --memory-limit 0)', undefined]);
  }
  const out = [
    '## Scale targets (issue 18)',
    '',
    'Each row beside its target, from this run (medians over the repetitions; the datapath rows are ratios to the floor of the same N). The API server is the local one of the tests (test/helpers/fake-apiserver.ts), not a kube-apiserver.',
    '',
    '| what | target | this run | verdict |',
    '|---|---|---|---|',
  ];
  for (const [what, target, measured, ok] of rows) out.push(`| ${what} | ${target} | ${measured} | ${ok === undefined ? 'not measured' : ok ? 'met' : '**missed**'} |`);
  out.push('');
  // Not a target of the issue, but what every node pays while nothing happens.
  const idle = sizes
    .filter(has)
    .map((n) => [n, lb(n).flatMap((p) => p.idleCpuMsPerS ?? [])] as const)
    .filter(([, xs]) => xs.length > 0);
  if (idle.length) {
    const each = ([n, xs]: readonly [number, number[]]): string => `${median(xs).toFixed(2)} ms a second at ${n.toLocaleString('en')} (the busiest second ${Math.max(...xs).toFixed(1)} ms)`;
    out.push(`The agent's CPU while nothing changes (every thread; the median of one-second samples over 10 s, after 5 s to settle; no target): ${idle.map(each).join(', ')}.`, '');
  }
  return out;
}

function plot(
  r: Results,
  out: string,
  sizes: number[],
  modes: string[],
  conn: (mode: string, n: number, which: string, kind: 'cc' | 'rr', stat: 'p50_us' | 'p99_us') => number,
  at: (mode: string, n: number) => Point[],
): void {
  const cols = modes.flatMap((mode) => (mode === 'floor' ? [['floor', 'pod']] : [[mode, 'first'], [mode, 'last']]));
  const connData = sizes.map((n) => [n, ...cols.map(([mode, which]) => conn(mode!, n, which!, 'cc', 'p50_us'))].map((x) => (Number.isNaN(x) ? 'NaN' : String(x))).join(' '));
  writeFileSync(path.join(out, 'connect.dat'), `${connData.join('\n')}\n`);
  const progModes = modes.filter((m) => m !== 'floor');
  const progData = sizes.map((n) => [n, ...progModes.map((m) => median(at(m, n).map((p) => p.coldMs)))].map((x) => (Number.isNaN(x) ? 'NaN' : String(x))).join(' '));
  writeFileSync(path.join(out, 'program.dat'), `${progData.join('\n')}\n`);
  const title = `${r.meta.kernel}, ${r.meta.reps} reps, medians`;
  for (const [term, ext] of [['svg size 900,520 dynamic font "sans,12"', 'svg'], ['pngcairo size 900,520 font "sans,11"', 'png']] as const) {
    const script = [
      `set terminal ${term}`,
      'set logscale x',
      'set grid',
      'set key outside right',
      'set xlabel "services (N)"',
      `set output "${path.join(out, `connect.${ext}`)}"`,
      `set title "connect()+close() p50 (µs) — ${title}"`,
      'set ylabel "µs"',
      'set yrange [0:*]',
      `plot ${cols.map(([mode, which], i) => `"${path.join(out, 'connect.dat')}" using 1:${i + 2} with linespoints title "${mode}${mode === 'floor' ? '' : ` (${which})`}"`).join(', ')}`,
      `set output "${path.join(out, `program.${ext}`)}"`,
      'set logscale y',
      'set yrange [*:*]',
      `set title "programming N services from cold (ms) — ${title}"`,
      'set ylabel "ms"',
      `plot ${progModes.map((m, i) => `"${path.join(out, 'program.dat')}" using 1:${i + 2} with linespoints title "${m}"`).join(', ')}`,
    ].join('\n');
    execFileSync('gnuplot', [], { input: script, stdio: ['pipe', 'ignore', 'inherit'] });
  }
}
