// bench/runtimes.ts: the scale rows read from bench/run.ts's results, the
// ratios to the floors of the same run, the medians over a runtime's runs,
// and the table. (Running the benchmark itself is make bench's.)
import t from 'tap';
import type { Point, Results } from '../../bench/report.js';
import { scaleMetrics, summarize, table, type ScaleMetrics } from '../../bench/runtimes.js';

const conn = (p50: number) => ({ cc: { p50_us: p50, p90_us: 0, p99_us: 0, p999_us: 0, mean_us: 0, failed: 0, count: 1 }, rr: { p50_us: 0, p90_us: 0, p99_us: 0, p999_us: 0, mean_us: 0, failed: 0, count: 1 } });

function run(scale: number): Results {
  const lb10k: Point = {
    mode: 'lbctl', n: 10_000, rep: 0, connections: { first: conn(41), last: conn(42 * scale) },
    coldMs: 700 * scale, coldFromListMs: 1300 * scale, startToReadyMs: 1700, floorCold: { fromListMs: 400, listMs: 200, encodeMs: 120, kernelMs: 60, entries: 89_997 },
    memory: { rssMiB: 100, hwmMiB: 107 }, resyncCpuMs: [40, 47 * scale, 50], resyncMs: [43, 43, 43], floorResyncCpuMs: [27, 27, 28, 27],
    // 100 event samples 1..100 ms: p99 99, p50 50; the floor's 0.5..50.
    eventToMapMs: Array.from({ length: 99 }, (_, i) => (i + 1) * scale), addEventToMapMs: 100 * scale,
    floorEventToMapMs: Array.from({ length: 100 }, (_, i) => (i + 1) / 2),
    idleCpuMsPerS: [1, 1.2, 90], oomKills: 0,
  };
  const lb100k: Point = {
    mode: 'lbctl', n: 100_000, rep: 0, connections: { first: conn(41), last: conn(41) },
    coldMs: 3900, coldFromListMs: 8600 * scale, startToSyncedMs: 9100, coldHwmMiB: 336, floorCold: { fromListMs: 4600, listMs: 2900, encodeMs: 800, kernelMs: 700, entries: 899_997 },
    memoryIdle: { rssMiB: 256 }, idleCpuMsPerS: [1.1], oomKills: 0,
  };
  const floor = (n: number): Point => ({ mode: 'floor', n, rep: 0, connections: { pod: conn(40) }, coldMs: 0 });
  return { meta: { versions: { node: 'v0' } }, points: [floor(10_000), lb10k, floor(100_000), lb100k], skipped: [] };
}

t.test('scaleMetrics reads the scale rows of one run, with its floors', async (t) => {
  const m = scaleMetrics(run(1));
  t.equal(m.cold10kMs, 1300);
  t.equal(m.floorCold10kMs, 400);
  t.equal(m.resyncCpu10kMs, 47, 'the median resync');
  t.equal(m.floorResyncCpu10kMs, 27);
  t.equal(m.eventP99_10kMs, 99, 'p99 of the changes and the adds (nearest rank, as report.ts)');
  t.equal(m.eventP50_10kMs, 50);
  t.equal(m.floorEventP99_10kMs, 49.5);
  t.equal(m.connectP50Ratio10kLast, 42 / 40, 'the datapath ratio to the floor of the same N');
  t.equal(m.cold100kMs, 8600);
  t.equal(m.steady100kMiB, 256);
  t.equal(m.idleCpu10kMsPerS, 1.2);
  t.same(scaleMetrics({ meta: {}, points: [], skipped: [] }).cold10kMs, NaN, 'a size not run: NaN');
});

t.test('summarize: medians over the runs, and the ratio to the floor taken run by run', async (t) => {
  const runs: ScaleMetrics[] = [scaleMetrics(run(1)), scaleMetrics(run(2)), scaleMetrics(run(1.5))];
  const s = summarize(runs);
  t.equal(s.runs, 3);
  t.equal(s.medians.cold10kMs, 1300 * 1.5);
  t.equal(s.ratios.cold10k, (1300 * 1.5) / 400);
  t.equal(s.ratios.eventP99_10k, (99 * 1.5) / 49.5);
});

t.test('the table: both runtimes side by side, the second over the first', async (t) => {
  const a = summarize([scaleMetrics(run(1))]);
  const b = summarize([scaleMetrics(run(0.5))]);
  const rts = [{ label: 'node20', node: '/a', version: 'v20.20.2', v8: '11' }, { label: 'node24', node: '/b', version: 'v24.22.3', v8: '13' }];
  const lines = table(rts, [a, b]).split('\n');
  t.equal(lines[0], '| scale row | target | node20 (v20.20.2) | node24 (v24.22.3) | node24 / node20 |');
  t.equal(lines.find((l) => l.startsWith('| cold sync at 10,000')), '| cold sync at 10,000 (first list request → every frontend in the kernel) | ≤ 0.2 s | 1.30 s (floor 400 ms, 3.25×) | 650 ms (floor 400 ms, 1.63×) | 0.50 |');
  t.equal(lines.find((l) => l.startsWith('| peak RSS at 10,000')), '| peak RSS at 10,000 (VmHWM after the events) | ≤ 150 MiB | 107 MiB | 107 MiB | 1.00 |');
});
