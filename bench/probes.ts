// make bench (and bench-quick): what probing costs (issue 17, standalone
// mode). 1,000 backends on loopback addresses probed at periodSeconds 1
// with each handler, then with half of them hanging to the 1 s timeout,
// through the agent's own Prober, executors and pool; each for 10 s after a
// 3 s warm-up. Reported: probes a second, probes per worker, latency, what
// was in flight and queued, the prober's and the servers' CPU (share of one
// core), memory; "keeps up" when every worker probed about once a second
// and no probe of a live backend failed. docs/standalone.md quotes it.
// test/unit/prober-scale.ts checks the same behaviour at 200 backends.
//
//   node --expose-gc --import=@tapjs/typescript/import bench/probes.ts [--out DIR] [--backends N] [--window S]
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Command } from 'commander';
import { PROBE_CONCURRENCY } from '../src/base/defaults.js';
import { measureProbes, PROBE_HANDLERS, probeAddr, startProbeServers, type ProbeScaleStats } from '../test/helpers/probe-scale.js';
import { ROOT } from './world.js';

const o = new Command()
  .option('--out <dir>', 'where results go', path.join(ROOT, 'bench/results'))
  .option('--backends <n>', 'backends probed', '1000')
  .option('--window <s>', 'seconds measured per handler', '10')
  .parse()
  .opts<{ out: string; backends: string; window: string }>();
const n = Number(o.backends);
const window = Number(o.window);

const control = mkdtempSync(path.join(os.tmpdir(), 'lbctl-bench-probes-'));
const ports = { http: 18181, tcp: 18182, grpc: 18183 };
const rows: ProbeScaleStats[] = [];
const child = await startProbeServers(n, control, ports);
try {
  const h = PROBE_HANDLERS(ports);
  const pool = { concurrency: PROBE_CONCURRENCY };
  for (const handler of [h.http, h.tcp, h.grpc]) {
    rows.push(await measureProbes(child, n, window, handler, pool));
    console.log(JSON.stringify(rows.at(-1)));
  }
  const down = new Set(Array.from({ length: n / 2 }, (_, i) => probeAddr(2 * i)));
  for (const a of down) writeFileSync(path.join(control, a), '');
  rows.push(await measureProbes(child, n, window, h.http, { ...pool, down }));
  console.log(JSON.stringify(rows.at(-1)));
} finally {
  child.kill('SIGKILL');
  rmSync(control, { recursive: true, force: true });
}

const keepsUp = (s: ProbeScaleStats): boolean => s.failures === 0 && s.workersProbed === n && s.minProbesPerWorker >= window - 1 && s.allHealthy;
const lines = [
  `# Probing ${n} backends at periodSeconds 1 (${new Date().toISOString().slice(0, 10)}, ${os.cpus().length} CPUs, Node ${process.versions.node})`,
  '',
  `Each handler for ${window} s after a 3 s warm-up; the agent's pool (${PROBE_CONCURRENCY} in flight). CPU is a share of one core. "Keeps up": every worker probed at least ${window - 1} times and no probe of a live backend failed.`,
  '',
  '| handler | keeps up | probes/s | per worker | latency p50 / p99 | in flight (queued) at most | prober CPU | servers CPU | RSS growth | heap growth |',
  '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|',
  ...rows.map(
    (s) =>
      `| ${s.kind} | ${keepsUp(s) ? 'yes' : `**no** (${s.failures} failed${s.firstFailure ? `: ${s.firstFailure}` : ''})`} | ${s.probesPerSecond} | ${s.minProbesPerWorker}-${s.maxProbesPerWorker} | ${s.p50ms} / ${s.p99ms} ms | ${s.maxInFlight} (${s.maxQueued}) | ${s.proberCpuPercent}% | ${s.serversCpuPercent}% | ${s.rssGrowthMiB} MiB | ${s.heapGrowthMiB} MiB |`,
  ),
  '',
];
mkdirSync(o.out, { recursive: true });
writeFileSync(path.join(o.out, 'probes.md'), lines.join('\n'));
writeFileSync(path.join(o.out, 'probes.json'), JSON.stringify({ backends: n, window, rows }, null, 2) + '\n');
console.log(lines.join('\n'));
