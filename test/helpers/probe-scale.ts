// Probing many backends at periodSeconds 1 (issue 17), shared by the test
// (test/unit/prober-scale.ts: the pool keeps up at a scale no machine
// struggles with) and the benchmark (bench/probes.ts: what 1,000 backends
// cost, in `make bench`). Real servers on loopback addresses
// (probe-backend.mjs in a child process, one address per backend), the
// agent's own Prober and executors in this process; each handler runs for
// `window` seconds after a warm-up.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { GrpcJsHealthClient } from '../../src/probes/grpc-health.js';
import { defaultExecutors } from '../../src/probes/probe-exec.js';
import { Prober } from '../../src/probes/prober.js';
import { PROBE_DEFAULTS, type ProbeHandler, type ProbeTarget } from '../../src/model/probe.js';

const HELPER = path.resolve(path.dirname(new URL(import.meta.url).pathname), 'probe-backend.mjs');
const CLK_TCK = 100;
const WARMUP_S = 3;

/** Backend i's address: 127.1.x.y, one per backend. */
export const probeAddr = (i: number): string => `127.1.${(i + 1) >> 8}.${(i + 1) & 255}`;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function cpuOf(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) / CLK_TCK; // utime + stime, seconds
}

/** The backends' servers for n addresses; `control` is where a file named by an address makes it hang. Kill it when done. */
export async function startProbeServers(n: number, control: string, ports: { http: number; tcp: number; grpc: number }): Promise<ChildProcess> {
  const args = [HELPER, '--control', control, '--echo', '0', '--http', String(ports.http), '--tcp', String(ports.tcp), '--grpc', String(ports.grpc)];
  for (let i = 0; i < n; i++) args.push('--addr', probeAddr(i));
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    child.stdout!.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`probe-backend.mjs exited ${code}`)));
  });
  return child;
}

export interface ProbeScaleStats {
  readonly kind: string;
  readonly backends: number;
  readonly probesPerSecond: number;
  readonly minProbesPerWorker: number;
  readonly maxProbesPerWorker: number;
  /** Failed probes of backends that were not made to hang. */
  readonly failures: number;
  readonly firstFailure: string;
  /** Workers that probed at least once in the window. */
  readonly workersProbed: number;
  /** Every backend ended healthy (a hanging one: quarantined). */
  readonly allHealthy: boolean;
  readonly maxQueued: number;
  readonly maxInFlight: number;
  readonly p50ms: number | undefined;
  readonly p99ms: number | undefined;
  readonly proberCpuPercent: number;
  readonly serversCpuPercent: number;
  readonly rssMiB: number;
  readonly rssGrowthMiB: number;
  readonly heapGrowthMiB: number;
}

/** Probes n backends with `handler` at periodSeconds 1 for `window` seconds after a warm-up. */
export async function measureProbes(
  child: ChildProcess,
  n: number,
  window: number,
  handler: ProbeHandler,
  opts: { concurrency?: number; down?: ReadonlySet<string> } = {},
): Promise<ProbeScaleStats> {
  const down = opts.down ?? new Set<string>();
  const kind = `${handler.kind}${down.size ? ` (${down.size} hanging)` : ''}`;
  const targets: ProbeTarget[] = Array.from({ length: n }, (_, i) => ({ address: probeAddr(i), port: (handler as { port: number }).port, spec: { ...PROBE_DEFAULTS, periodSeconds: 1, timeoutSeconds: 1, handler } }));
  const perKey = new Map<string, number>();
  const latencies: number[] = [];
  let failures = 0;
  let firstFailure = '';
  let counting = false;
  global.gc?.();
  const rss0 = process.memoryUsage().rss;
  const heap0 = process.memoryUsage().heapUsed;
  const prober = new Prober({
    executors: defaultExecutors(new GrpcJsHealthClient()),
    ...(opts.concurrency !== undefined ? { concurrency: opts.concurrency } : {}),
    onResult: (target, r) => {
      if (!counting) return;
      perKey.set(target.key, (perKey.get(target.key) ?? 0) + 1);
      latencies.push(r.latencyMs);
      if (!r.ok && !down.has(target.address)) {
        failures++;
        firstFailure ||= r.reason ?? '';
      }
    },
  });
  prober.setTargets(targets);
  prober.start();
  await sleep(WARMUP_S * 1000);
  counting = true;
  const cpu0 = process.cpuUsage();
  const child0 = cpuOf(child.pid!);
  const t0 = performance.now();
  let maxQueued = 0;
  let maxInFlight = 0;
  const sampler = setInterval(() => {
    const st = prober.status();
    maxQueued = Math.max(maxQueued, st.queued);
    maxInFlight = Math.max(maxInFlight, st.inFlight);
  }, 50);
  await sleep(window * 1000);
  counting = false;
  clearInterval(sampler);
  const secs = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const childCpu = cpuOf(child.pid!) - child0;
  const rss1 = process.memoryUsage().rss;
  const heap1 = process.memoryUsage().heapUsed;
  const states = prober.status().workers.map((w) => (down.has(w.address) ? (w.state === 'quarantined' ? 'healthy' : w.state) : w.state));
  prober.stop();
  latencies.sort((a, b) => a - b);
  const counts = [...perKey.values()];
  const total = latencies.length;
  return {
    kind,
    backends: n,
    probesPerSecond: Math.round(total / secs),
    minProbesPerWorker: counts.length === n ? Math.min(...counts) : 0,
    maxProbesPerWorker: counts.length ? Math.max(...counts) : 0,
    failures,
    firstFailure,
    workersProbed: counts.length,
    allHealthy: states.every((s) => s === 'healthy'),
    maxQueued,
    maxInFlight,
    p50ms: latencies[Math.floor(total * 0.5)],
    p99ms: latencies[Math.floor(total * 0.99)],
    proberCpuPercent: Math.round(((cpu.user + cpu.system) / 1e6 / secs) * 1000) / 10,
    serversCpuPercent: Math.round((childCpu / secs) * 1000) / 10,
    rssMiB: Math.round(rss1 / 2 ** 20),
    rssGrowthMiB: Math.round((rss1 - rss0) / 2 ** 20),
    heapGrowthMiB: Math.round((heap1 - heap0) / 2 ** 20),
  };
}

/** The handlers each run probes, in order: httpGet, tcpSocket, grpc; then httpGet with half the backends hanging. */
export const PROBE_HANDLERS = (ports: { http: number; tcp: number; grpc: number }): { http: ProbeHandler; tcp: ProbeHandler; grpc: ProbeHandler } => ({
  http: { kind: 'httpGet', path: '/healthz', port: ports.http, scheme: 'HTTP', httpHeaders: [] },
  tcp: { kind: 'tcpSocket', port: ports.tcp },
  grpc: { kind: 'grpc', port: ports.grpc, service: '' },
});
